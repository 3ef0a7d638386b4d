"""A run folder is trusted no more than its weights when a run resumes from it.

Every test starts from a real run folder written by the trainer (the tiny model, one iteration),
then plants what someone with write access to the folder could: a chat template that loops for
hours or reaches past jinja's sandbox, tokenizer settings of their own, pickled weights that run
code when unpickled. The manifest is rewritten to match each planted file, as its author would
(the manifest guards against damage, not against an attacker). Resuming must refuse in one line
with exit code 2, at once, and run nothing planted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainers.gigpo.checkpoint import MANIFEST_FILE, checkpoint_problem
from trainers.gigpo.config import Config
from trainers.gigpo.train import load_model_and_tokenizer, main, train

ROOT = Path(__file__).resolve().parents[2]

#: 10^10 empty loop steps (jinja's sandbox caps one range at 10^5, not a nest of them): hours.
LOOPING_TEMPLATE = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{{ messages[0]['content'] }}"
)
#: What the sandbox stops when the template renders (SecurityError): a step towards os.system.
ESCAPING_TEMPLATE = "{{ ''.__class__.__mro__[1].__subclasses__() }}"


def run_args(run: Path) -> list[str]:
    return [
        "--env", "AgentGym/Corridor-v0", "--env-kwargs", '{"length": 2}', "--num-groups", "2",
        "--group-size", "2", "--eval-every", "1", "--eval-groups", "2", "--checkpoint-every", "1",
        "--iterations", "1", "--out-dir", str(run), "--no-tensorboard", "--no-progress",
        "--no-plot", "--seed", "4",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A run folder the trainer wrote: one iteration of the tiny model, ``checkpoint-1``."""
    run = tmp_path_factory.mktemp("trusted") / "run"
    main(run_args(run))
    assert checkpoint_problem(run / "checkpoint-1") is None
    return run


@pytest.fixture
def run(finished_run, tmp_path) -> Path:
    """A copy of the finished run to plant files in."""
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def plant(checkpoint: Path, name: str, data: bytes | str, *, replaces: str | None = None) -> None:
    """Write ``name`` into ``checkpoint`` (instead of ``replaces``) and record it in the
    manifest, as whoever crafted it would."""
    file = checkpoint / name
    file.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    file.write_bytes(data)
    manifest = json.loads((checkpoint / MANIFEST_FILE).read_text())
    if replaces is not None:
        (checkpoint / replaces).unlink()
        manifest["files"].pop(replaces)
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert checkpoint_problem(checkpoint) is None  # it verifies: the refusal is the loader's


def with_config_template(checkpoint: Path, template: str) -> str:
    """``tokenizer_config.json`` with a ``chat_template`` key (the older place for it)."""
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    return json.dumps(config)


def resume_refused(target: Path, capsys) -> str:
    """Resume ``target`` through the command line; the one line it must refuse with."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--resume", str(target), "--iterations", "2", "--no-progress"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_looping_chat_template_is_refused_at_once(run):
    """The template that hung ``--resume`` for minutes: refused before anything renders."""
    plant(run / "checkpoint-1", "chat_template.jinja", LOOPING_TEMPLATE)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.gigpo.train", "--resume", str(run), "--iterations", "2",
         "--no-progress"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=200,  # the template alone renders for far longer
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "refused" in err and "chat template" in err and "checkpoint-1" in err, err
    assert elapsed < 200
    assert not (run / "checkpoint-2").exists()


@pytest.mark.parametrize(
    "where",
    ["chat_template.jinja", "tokenizer_config.json", "additional_chat_templates"],
)
def test_a_chat_template_other_than_the_models_is_refused_in_one_line(run, capsys, where):
    """Wherever transformers would read a template from, a planted one is refused, not run
    (rendered, this one raises jinja's SecurityError, a traceback before)."""
    checkpoint = run / "checkpoint-1"
    if where == "tokenizer_config.json":
        plant(checkpoint, where, with_config_template(checkpoint, ESCAPING_TEMPLATE))
    elif where == "additional_chat_templates":
        plant(checkpoint, "additional_chat_templates/tool_use.jinja", ESCAPING_TEMPLATE)
    else:
        plant(checkpoint, where, ESCAPING_TEMPLATE)
    for target in (run, checkpoint):
        err = resume_refused(target, capsys)
        assert "refused" in err and "chat template" in err and "tiny model" in err, err
    assert not (run / "checkpoint-2").exists()


class RunsCode:
    """Unpickling this calls ``os.mkdir(marker)``: what crafted weights could do with
    ``os.system`` instead, made observable."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_pickled_weights_that_run_code_are_refused_in_one_line(run, capsys, tmp_path):
    """``pytorch_model.bin`` instead of safetensors, with a payload: transformers loads it with
    ``weights_only=True``, whose refusal was a traceback with exit code 1."""
    from safetensors.torch import load_file

    checkpoint, marker = run / "checkpoint-1", tmp_path / "code-ran"
    weights = load_file(checkpoint / "model.safetensors")
    weights["payload"] = RunsCode(marker)
    torch.save(weights, tmp_path / "pytorch_model.bin")
    data = (tmp_path / "pytorch_model.bin").read_bytes()
    plant(checkpoint, "pytorch_model.bin", data, replaces="model.safetensors")
    err = resume_refused(run, capsys)
    assert "refused to load its model weights" in err and "posix.mkdir" in err, err
    assert not marker.exists()  # the payload never ran
    assert not (run / "checkpoint-2").exists()


def test_a_run_folders_tokenizer_settings_are_not_used(run, finished_run):
    """Only the tiny model's vocabulary is read from the folder: a normalizer planted in its
    ``tokenizer.json`` (here one that rewrites every action word) changes nothing."""
    checkpoint = run / "checkpoint-1"
    tokenizer_json = json.loads((checkpoint / "tokenizer.json").read_text())
    tokenizer_json["normalizer"] = {
        "type": "Replace",
        "pattern": {"Regex": "\\w+"},
        "content": "up",
    }
    plant(checkpoint, "tokenizer.json", json.dumps(tokenizer_json))
    config = Config.for_env(
        "AgentGym/Corridor-v0", env_kwargs={"length": 2}, resume=str(checkpoint), out_dir=str(run)
    )
    _, tokenizer = load_model_and_tokenizer(config, checkpoint)
    config.resume = str(finished_run / "checkpoint-1")
    _, trusted = load_model_and_tokenizer(config, finished_run / "checkpoint-1")
    words = sorted(trusted.get_vocab(), key=trusted.get_vocab().get)[4:12]  # past the specials
    text = " ".join(words)
    assert tokenizer(text)["input_ids"] == trusted(text)["input_ids"]
    assert tokenizer(text)["input_ids"] == list(range(4, 12))  # not every word rewritten to "up"
    assert tokenizer.chat_template == trusted.chat_template


def test_a_tokenizer_that_is_not_the_tiny_models_is_refused_in_one_line(run, capsys):
    checkpoint = run / "checkpoint-1"
    tokenizer_json = json.loads((checkpoint / "tokenizer.json").read_text())
    tokenizer_json["model"] = {"type": "BPE", "vocab": {}, "merges": []}
    plant(checkpoint, "tokenizer.json", json.dumps(tokenizer_json))
    err = resume_refused(checkpoint, capsys)
    assert "cannot be loaded" in err and "word-level vocabulary" in err, err


def test_a_model_by_path_resumes_with_its_own_tokenizer_and_template(tmp_path, capsys):
    """``--model DIR``: the tokenizer comes from DIR, the base model the run's config names; a
    template planted in the checkpoint is refused, naming DIR."""
    from trainers.gigpo.tiny import build_model, build_tokenizer

    tok = build_tokenizer(["up down left right # _ O X P"])
    base = tmp_path / "saved-model"
    build_model(tok, seed=2).save_pretrained(base)
    tok.save_pretrained(base)
    common = dict(model=str(base), num_groups=2, group_size=2, max_episode_steps=2,
                  max_new_tokens=4, eval_every=0, progress=False, tensorboard=False, plot=False,
                  checkpoint_every=1)  # fmt: skip
    run = tmp_path / "run"
    train(Config.for_env("AgentGym/Sokoban-v0", iterations=1, out_dir=str(run), **common))
    checkpoint = run / "checkpoint-1"
    plant(checkpoint, "tokenizer_config.json", with_config_template(checkpoint, ESCAPING_TEMPLATE))
    err = resume_refused(run, capsys)
    assert "refused" in err and "chat template" in err and str(base) in err, err
