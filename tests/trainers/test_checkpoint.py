"""Checkpoints survive kills: saves are atomic, resume finds the latest complete checkpoint.

Faults are real: a training subprocess is SIGKILLed in the middle of writing a checkpoint's
largest file (``torch.save`` in that subprocess writes half the bytes, then waits to be
killed), then the run is resumed through the command-line entry point.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainers.gigpo.checkpoint import STATE_FILE, checkpoint_problem, latest_complete
from trainers.gigpo.config import Config
from trainers.gigpo.train import main, train

ROOT = Path(__file__).resolve().parents[2]

#: The training CLI in a subprocess whose ``torch.save`` call number ``KILL_AT_SAVE`` writes
#: half of its bytes, says SAVING on stdout and waits to be killed.
KILLED_DURING_SAVE = r"""
import io, os, sys, time
import torch

real_save, calls = torch.save, []

def save_half_then_wait(obj, f, *args, **kwargs):
    calls.append(f)
    if len(calls) < int(os.environ["KILL_AT_SAVE"]):
        return real_save(obj, f, *args, **kwargs)
    buffer = io.BytesIO()
    real_save(obj, buffer)
    data = buffer.getvalue()
    with open(f, "wb") as out:
        out.write(data[: len(data) // 2])
    print("SAVING", flush=True)
    time.sleep(120)

torch.save = save_half_then_wait
from trainers.gigpo.train import main
main(sys.argv[1:])
"""


def cli_args(run: Path, iterations: int) -> list[str]:
    return [
        "--env", "AgentGym/Corridor-v0", "--env-kwargs", '{"length": 2}', "--num-groups", "2",
        "--group-size", "2", "--eval-every", "0", "--checkpoint-every", "1", "--iterations",
        str(iterations), "--out-dir", str(run), "--no-tensorboard", "--no-progress", "--seed", "4",
    ]  # fmt: skip


def kill_during_save(args: list[str], save_number: int) -> None:
    """Run the CLI with ``args``; SIGKILL it while it writes its ``save_number``-th state file."""
    env = {**os.environ, "KILL_AT_SAVE": str(save_number), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_DURING_SAVE, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stdout:
            if line.strip() == "SAVING":
                proc.send_signal(signal.SIGKILL)
                break
        else:
            pytest.fail(f"the run ended before save {save_number}: {proc.stderr.read()[-2000:]}")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def iterations_logged(run: Path) -> list[int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["iteration"] for x in lines]


def test_kill_during_a_save_leaves_the_last_complete_checkpoint_and_resume_finds_it(tmp_path):
    run = tmp_path / "run"
    kill_during_save(cli_args(run, iterations=3), save_number=2)

    # The killed save left no checkpoint-2 folder: only complete checkpoints carry the name.
    assert not (run / "checkpoint-2").exists()
    assert checkpoint_problem(run / "checkpoint-1") is None
    assert latest_complete(run) == run / "checkpoint-1"

    # --resume RUN_DIR picks checkpoint-1, takes the run's own config and finishes it.
    main(["--resume", str(run), "--no-progress"])
    assert latest_complete(run) == run / "checkpoint-3"
    assert iterations_logged(run) == [1, 2, 3]  # no duplicate records from the killed run
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []  # no leftovers


def test_kill_while_replacing_a_checkpoint_keeps_the_old_one(tmp_path):
    """Resuming from an earlier checkpoint rewrites later ones; a kill then must not destroy
    the complete checkpoint that was there."""
    run = tmp_path / "run"
    main(cli_args(run, iterations=2))
    before = (run / "checkpoint-2" / STATE_FILE).read_bytes()

    kill_during_save(cli_args(run, 2) + ["--resume", str(run / "checkpoint-1")], save_number=1)
    assert checkpoint_problem(run / "checkpoint-2") is None
    assert (run / "checkpoint-2" / STATE_FILE).read_bytes() == before
    state = torch.load(run / "checkpoint-2" / STATE_FILE, weights_only=False)
    assert state["iteration"] == 2


def test_a_kill_between_the_two_renames_of_a_replacement_is_recovered(tmp_path):
    """Replacing checkpoint-N moves the old one aside, then renames the new one in; a kill
    between the two leaves no checkpoint-N but two complete hidden folders. Resume publishes
    the newer one and tidies the rest."""
    import shutil

    from trainers.gigpo.checkpoint import resolve_resume

    run = tmp_path / "run"
    main(cli_args(run, iterations=2))
    os.replace(run / "checkpoint-2", run / ".checkpoint-2.old-101")  # what the kill left
    shutil.copytree(run / ".checkpoint-2.old-101", run / ".checkpoint-2.partial-101")
    (run / ".checkpoint-3.partial-101").mkdir()  # and a save killed before its manifest
    assert latest_complete(run) == run / "checkpoint-1"

    assert resolve_resume(run) == run / "checkpoint-2"
    assert checkpoint_problem(run / "checkpoint-2") is None
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


def test_incomplete_checkpoint_is_refused_in_one_line_naming_the_latest_complete(tmp_path, capsys):
    """A checkpoint whose tokenizer is gone does not resume with a rebuilt 5-token tokenizer."""
    run = tmp_path / "run"
    main(cli_args(run, iterations=2))
    (run / "checkpoint-2" / "tokenizer.json").unlink()
    assert "tokenizer.json" in checkpoint_problem(run / "checkpoint-2")
    capsys.readouterr()

    with pytest.raises(SystemExit) as exit_info:
        main(["--resume", str(run / "checkpoint-2")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "checkpoint-2" in err and "tokenizer.json" in err
    assert f"--resume {run / 'checkpoint-1'}" in err

    config = Config.for_env(
        "AgentGym/Corridor-v0", out_dir=str(run), resume=str(run / "checkpoint-2"), progress=False
    )
    with pytest.raises(ValueError, match="tokenizer.json"):
        train(config)  # the programmatic entry point refuses it too

    # The run folder resumes from its latest complete checkpoint, which is checkpoint-1.
    main(["--resume", str(run), "--no-progress"])
    assert checkpoint_problem(run / "checkpoint-2") is None
    assert iterations_logged(run) == [1, 2]


def untimed_metrics(run: Path) -> list[dict]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_signals_at_random_moments_then_resume_give_the_uninterrupted_run(tmp_path, sig):
    """Soak: 8 runs, each stopped by ``sig`` at a random moment (any phase, saves included),
    then resumed from the run folder; every resumed run's metrics equal the uninterrupted run's.
    """
    import random
    import time

    reference = tmp_path / "reference"
    main(cli_args(reference, iterations=6) + ["--eval-every", "2", "--no-plot"])
    expected = untimed_metrics(reference)
    rng = random.Random(int(sig))
    outcomes = []
    for trial in range(8):
        run = tmp_path / f"run{trial}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainers.gigpo.train",
             *cli_args(run, iterations=6), "--eval-every", "2", "--no-plot"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for line in proc.stdout:  # start the clock once the model is built
            if line.startswith(("eval at iteration 0", "iteration 1/")):
                break
        time.sleep(rng.uniform(0.0, 0.8))
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        if sig == signal.SIGINT and proc.returncode == 130:
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        saved = latest_complete(run)
        outcomes.append((proc.returncode, saved.name if saved else None))
        if saved is None:
            main(cli_args(run, iterations=6) + ["--eval-every", "2", "--no-plot", "--overwrite"])
        else:
            main(["--resume", str(run), "--no-progress"])
        assert untimed_metrics(run) == expected, (trial, outcomes[-1])
    print(outcomes)
    assert any(code != 0 for code, _ in outcomes)  # the signals did land during runs


# ----------------------------------------------------------------------------------------------
# hostile and damaged checkpoints, a full disk
# ----------------------------------------------------------------------------------------------
class RunsCode:
    """Unpickling this calls ``os.mkdir(marker)``: what a crafted ``trainer_state.pt`` could do
    with ``os.system`` instead, made observable."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def rewrite_manifest(checkpoint: Path, name: str) -> None:
    """Record ``name``'s current size and checksum in the manifest, as someone who crafted the
    file would (the manifest guards against damage, not against an attacker)."""
    import hashlib

    manifest = json.loads((checkpoint / "checkpoint.json").read_text())
    data = (checkpoint / name).read_bytes()
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "checkpoint.json").write_text(json.dumps(manifest))


def test_a_crafted_trainer_state_is_refused_and_runs_nothing(tmp_path, capsys):
    run, marker = tmp_path / "run", tmp_path / "code-ran"
    main(cli_args(run, iterations=1))
    checkpoint = run / "checkpoint-1"
    torch.save({"iteration": 1, "payload": RunsCode(marker)}, checkpoint / STATE_FILE)
    rewrite_manifest(checkpoint, STATE_FILE)
    assert checkpoint_problem(checkpoint) is None  # it verifies: the refusal is the loader's
    capsys.readouterr()

    for target in (checkpoint, run):
        with pytest.raises(SystemExit) as exit_info:
            main(["--resume", str(target), "--iterations", "2", "--no-progress"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert "refused to load trainer_state.pt" in err and "could run code" in err, err
        assert not marker.exists()  # the payload never ran
    assert not (run / "checkpoint-2").exists()


def test_the_trainer_state_is_plain_data(tmp_path):
    """What a checkpoint stores loads under ``weights_only=True``, RNG states included."""
    import numpy as np

    from trainers.gigpo.checkpoint import load_state

    run = tmp_path / "run"
    main(cli_args(run, iterations=1))
    raw = torch.load(run / "checkpoint-1" / STATE_FILE, weights_only=True)
    assert raw["iteration"] == 1 and isinstance(raw["torch_rng"], torch.Tensor)
    state = load_state(run / "checkpoint-1")
    name, keys, *_ = state["numpy_rng"]
    assert name == "MT19937" and keys.dtype == np.uint32 and keys.shape == (624,)
    np.random.set_state(state["numpy_rng"])
    assert np.random.get_state()[1].tolist() == keys.tolist()


def flip(file: Path, offset: int, count: int = 1) -> None:
    """Invert ``count`` bytes of ``file`` from ``offset`` (negative: from the end); same size."""
    data = bytearray(file.read_bytes())
    start = offset % len(data)
    for i in range(start, start + count):
        data[i] ^= 0xFF
    file.write_bytes(bytes(data))


def safetensors_data_offset(file: Path) -> int:
    return 8 + int.from_bytes(file.read_bytes()[:8], "little")


CORRUPTIONS = {
    # the zip's end-of-central-directory record: torch.load cannot find the archive's index
    "state zip trailer": lambda c: flip(c / STATE_FILE, -12, 4),
    # inside the JSON header that says where each tensor lies
    "safetensors header": lambda c: flip(c / "model.safetensors", 12, 4),
    "tokenizer bytes": lambda c: flip(c / "tokenizer.json", 200, 8),
    # 64 bytes of weights, same size: loads fine, with wrong weights
    "64 weight bytes": lambda c: flip(
        c / "model.safetensors", safetensors_data_offset(c / "model.safetensors") + 512, 64
    ),
}
CORRUPTED_FILE = {
    "state zip trailer": STATE_FILE,
    "safetensors header": "model.safetensors",
    "tokenizer bytes": "tokenizer.json",
    "64 weight bytes": "model.safetensors",
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_damaged_latest_checkpoint_falls_back_to_the_latest_intact_one(
    tmp_path, capsys, corruption
):
    """Resuming the run folder skips the damaged checkpoint-2 in one line, resumes from
    checkpoint-1, and ends with the uninterrupted run's weights."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    main(cli_args(run, iterations=2))
    # Copied out: load_file may map the file, whose bytes are about to be flipped.
    intact = {
        k: v.clone() for k, v in load_file(run / "checkpoint-2" / "model.safetensors").items()
    }
    size = {p.name: p.stat().st_size for p in (run / "checkpoint-2").iterdir()}
    CORRUPTIONS[corruption](run / "checkpoint-2")
    assert {p.name: p.stat().st_size for p in (run / "checkpoint-2").iterdir()} == size
    name = CORRUPTED_FILE[corruption]
    assert f"{name} does not match its checksum" in checkpoint_problem(run / "checkpoint-2")
    capsys.readouterr()

    # Naming the damaged checkpoint itself: refused in one line naming the intact one.
    with pytest.raises(SystemExit) as exit_info:
        main(["--resume", str(run / "checkpoint-2"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert name in err and f"--resume {run / 'checkpoint-1'}" in err

    main(["--resume", str(run), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"skipped checkpoint-2 ({name} does not match its checksum" in err
    assert "resuming from checkpoint-1" in err
    assert iterations_logged(run) == [1, 2]
    resumed = load_file(run / "checkpoint-2" / "model.safetensors")
    assert resumed.keys() == intact.keys()
    assert all(torch.equal(resumed[k], intact[k]) for k in intact)  # not the damaged weights
    assert checkpoint_problem(run / "checkpoint-2") is None


def test_a_checkpoint_from_before_checksums_still_resumes(tmp_path):
    """A manifest of sizes only (as checkpoints were written before checksums) is checked by
    size and by the files' own indexes."""
    run = tmp_path / "run"
    main(cli_args(run, iterations=2))
    manifest_file = run / "checkpoint-2" / "checkpoint.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["files"] = {name: entry["size"] for name, entry in manifest["files"].items()}
    manifest_file.write_text(json.dumps(manifest))
    assert checkpoint_problem(run / "checkpoint-2") is None
    flip(run / "checkpoint-2" / "model.safetensors", 12, 4)  # a damaged header is still seen
    assert "model.safetensors" in checkpoint_problem(run / "checkpoint-2")


FULL_DISK_RUN = r"""
import resource, signal, sys
limit = int(sys.argv[1])
# Writes past the limit fail with EFBIG (SIGXFSZ ignored): the path a full disk takes.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = ["train", *sys.argv[2:]]
import runpy
runpy.run_module("trainers.gigpo.train", run_name="__main__")
"""


def assert_failed_save_left_things_tidy(run: Path, proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 1, proc.stderr[-3000:]
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "could not save" in err and "checkpoint-2" in err and "earlier checkpoints" in err
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []  # space freed
    assert not (run / "checkpoint-2").exists()
    assert checkpoint_problem(run / "checkpoint-1") is None


def test_a_write_that_fails_during_a_save_is_one_line_and_removes_the_partial_save(tmp_path):
    """RLIMIT_FSIZE makes the save's writes fail as a full disk does (EFBIG instead of
    ENOSPC, through the same writers)."""
    run = tmp_path / "run"
    main(cli_args(run, iterations=1))
    limit = (run / "metrics.jsonl").stat().st_size * 4 + 4096  # metrics fit, weights do not
    assert (run / "checkpoint-1" / "model.safetensors").stat().st_size > limit
    proc = subprocess.run(
        [sys.executable, "-c", FULL_DISK_RUN, str(limit), "--resume", str(run),
         "--iterations", "2", "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert_failed_save_left_things_tidy(run, proc)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A folder on a tmpfs of a given size (needs root; skips where mounting is not allowed)."""
    mounted = []

    def make(size_bytes: int) -> Path:
        folder = tmp_path / f"tmpfs{len(mounted)}"
        folder.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(folder)],
            capture_output=True, text=True,
        )  # fmt: skip
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_full_disk_during_a_save_is_one_line_and_keeps_earlier_checkpoints(tmp_path, small_tmpfs):
    """A real full disk: a tmpfs with room for one checkpoint and a half."""
    probe = tmp_path / "probe"
    main(cli_args(probe, iterations=1))
    used = sum(p.stat().st_size for p in probe.rglob("*") if p.is_file())
    run = small_tmpfs(used * 3 // 2) / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.gigpo.train", *cli_args(run, iterations=2)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert_failed_save_left_things_tidy(run, proc)
    assert "no space left" in proc.stderr
