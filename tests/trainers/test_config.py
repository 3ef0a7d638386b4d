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
        (["--lora-layers", "2"], "--lora-layers needs --lora-rank > 0"),
        (["--lora-layers", "-1"], "--lora-layers must be at least 0, got -1"),
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


#: Runs the training script as ``python -m trainers.gigpo.train ARGS`` does, then reports on
#: stdout whether torch was imported and how long the answer took.
AS_SCRIPT = r"""
import runpy, sys, time
start = time.perf_counter()
sys.argv = ["train", *sys.argv[1:]]
try:
    runpy.run_module("trainers.gigpo.train", run_name="__main__")
finally:
    print("torch imported:", "torch" in sys.modules, "seconds:", time.perf_counter() - start)
"""


@pytest.mark.parametrize(
    "flags",
    [
        ["--iterashuns", "3"],  # a mistyped flag
        ["--num-groups", "two"],  # a bad value
        ["--advantage", "nope"],  # a value validation refuses
    ],
    ids=["unknown-flag", "bad-value", "bad-choice"],
)
def test_a_mistyped_flag_is_answered_before_torch_is_imported(tmp_path, flags):
    proc = subprocess.run(
        [sys.executable, "-c", AS_SCRIPT, "--out-dir", str(tmp_path / "run"), *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "torch imported: False" in proc.stdout, proc.stdout
    seconds = float(proc.stdout.split("seconds:")[1])
    print(flags, f"answered in {seconds:.2f} s")
    assert seconds < 10  # ~0.5 s on an idle machine; generous for a busy one
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("env", "variable"),
    [("AgentGym/WebShop-v0", "WEBSHOP_DATA"), ("AgentGym/ALFWorld-v0", "ALFWORLD_DATA")],
)
def test_a_family_without_its_data_is_one_line_before_the_run_folder(
    tmp_path, monkeypatch, capsys, env, variable
):
    """Real-data ids whose data (or packages) are missing: the env's own one-line message,
    exit code 2, no run folder, nothing loaded."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(variable, str(empty))
    monkeypatch.setenv("HOME", str(empty))  # no ~/.cache/alfworld to fall back to
    with pytest.raises(SystemExit) as exit_info:
        main(["--env", env, "--out-dir", str(tmp_path / "run"), "--no-progress"])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"--env {env}: " in err and ("not found" in err or "not installed" in err), err
    assert "run folder" not in out and not (tmp_path / "run").exists()


def test_help_and_the_demo_note_say_what_the_demo_runs(capsys):
    """``--help`` shows, beside each default, the value the demo (no ``--env``) takes, and the
    note the demo prints names its real iteration count."""
    from trainers.gigpo.config import DEFAULT_ENV, build_parser

    demo = parse_args([])
    note = capsys.readouterr().err
    help_text = " ".join(build_parser().format_help().split())
    iterations = help_text.split("--iterations ITERATIONS training", 1)[1].split("--lr", 1)[0]
    assert f"default: {Config().iterations}" in iterations
    assert f"without --env, the demo's: {demo.iterations}" in iterations, iterations
    assert f"{demo.iterations} iterations" in note and DEFAULT_ENV in note
    description = help_text.split("options:", 1)[0]
    assert f"{demo.iterations} iterations" in description and DEFAULT_ENV in description


def test_eval_is_sized_to_the_run():
    """Unset, the evaluation plays as many episodes as one rollout, up to 64."""
    small = Config.for_env("AgentGym/Sokoban-v0", num_groups=4, group_size=4)
    assert small.eval_groups is None and small.eval_tasks() == 16
    assert Config.for_env("AgentGym/Sokoban-v0").eval_tasks() == 64  # 16 x 8, capped
    assert Config.for_env("AgentGym/Sokoban-v0", eval_groups=5).eval_tasks() == 5
    assert Config.for_env("AgentGym/Sokoban-v0", eval_every=0).eval_tasks() == 0
    assert parse_args(["--env", "AgentGym/Sokoban-v0", "--eval-groups", "none"]).eval_tasks() == 64


def test_config_and_checkpoint_do_not_import_each_other():
    """checkpoint.py is the lower layer: config.py uses it, and it imports nothing of the
    trainer's, not even inside a function."""
    import ast

    def trainer_imports(name: str) -> set[str]:
        tree = ast.parse((ROOT / "trainers" / "gigpo" / f"{name}.py").read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        return {m for m in found if m.startswith("trainers.")}

    assert trainer_imports("checkpoint") == set()
    assert "trainers.gigpo.checkpoint" in trainer_imports("config")


def test_validate_runs_each_named_check_in_order(tmp_path):
    from agentgym.algorithms import register_advantage, unregister_advantage
    from trainers.gigpo.config import VALIDATION_CHECKS

    assert all(callable(getattr(Config, name)) for name in VALIDATION_CHECKS)
    assert VALIDATION_CHECKS[-1] == "check_env_data"  # the one that may read data: last
    bad = Config.for_env("AgentGym/Corridor-v0", num_groups=0, norm="nope")
    with pytest.raises(ConfigError, match="norm 'nope' is not known"):
        bad.validate()  # choices come before ranges
    with pytest.raises(ConfigError, match="num_groups must be at least 1"):
        bad.check_ranges()
    Config.for_env("AgentGym/Corridor-v0", num_groups=0).check_choices()

    # the estimator's declared inputs decide, not its name: a new judged estimator is refused
    # for several envs exactly as cw_grpo is
    register_advantage("judged_test", inputs=("contributions",))(lambda batch, config: None)
    try:
        several = Config.for_env(
            "AgentGym/Corridor-v0", extra_envs=["AgentGym/Sokoban-v0"], advantage="judged_test"
        )
        with pytest.raises(ConfigError, match="reads no judge"):
            several.check_envs()
    finally:
        unregister_advantage("judged_test")
