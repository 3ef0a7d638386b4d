"""The command line checks its config before loading anything: one line, exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainers.gigpo.config import PRESETS, Config, ConfigError, parse_args
from trainers.gigpo.train import main, train

ROOT = Path(__file__).resolve().parents[2]
CORRIDOR = ["--env", "AgentGym/Corridor-v0", "--no-progress", "--no-tensorboard"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--advantage", "gipgo"], "--advantage 'gipgo'.*gigpo, grpo"),
        (["--norm", "std"], "--norm 'std'.*mean_norm, mean_std_norm"),
        (["--dtype", "float8"], "--dtype 'float8'.*auto, bfloat16, float16, float32"),
        (["--num-groups", "0"], "--num-groups must be at least 1, got 0"),
        (["--iterations", "0"], "--iterations must be at least 1, got 0"),
        (["--group-size", "-2"], "--group-size must be at least 1, got -2"),
        (["--resume", "no/such/run"], "--resume no/such/run: no such checkpoint or run folder"),
        (["--model", "no-such-org/no-such-model"], "no-such-org/no-such-model.*offline.*--model"),
        (["--model", "./no/such/folder"], "--model ./no/such/folder: no such folder"),
        (["--num-groups", "two"], "--num-groups: invalid int value: 'two'"),
        (["--prompt-template", "tiny"], "--prompt-template 'tiny'.*compact, "),
        (["--fmt", "json"], "--fmt 'json'.*think_action, search_answer, plain"),
    ],
)
def test_bad_config_is_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys, flags, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub name must be refused without a network
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main([*CORRIDOR, "--out-dir", "run", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("python -m trainers.gigpo.train: error: ")
    import re

    assert re.search(message, err), err
    assert not (tmp_path / "run").exists()  # nothing was loaded or written


def test_validate_is_the_same_check_for_programmatic_use(tmp_path):
    config = Config.for_env("AgentGym/Corridor-v0", num_groups=0, out_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="num_groups must be at least 1"):
        train(config)
    assert not (tmp_path / "run").exists()


def test_cli_error_has_no_traceback():
    """The real entry point, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.gigpo.train", "--env", "AgentGym/Corridor-v0",
         "--advantage", "nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "gigpo, grpo" in proc.stderr


def test_no_env_given_trains_the_corridor_and_says_so(capsys):
    """Without --env a newcomer gets the CPU demo (the corridor preset), told in one line,
    rather than an ALFWorld run that needs a data download and a GPU."""
    config = parse_args(["--iterations", "3"])
    assert config.env == "AgentGym/Corridor-v0" and config.iterations == 3
    assert config.lr == PRESETS["AgentGym/Corridor-v0"]["lr"]  # the preset applies
    err = capsys.readouterr().err
    assert "no --env given" in err and "AgentGym/Corridor-v0" in err and "--env" in err
    parse_args(["--env", "AgentGym/Corridor-v0"])
    assert capsys.readouterr().err == ""
