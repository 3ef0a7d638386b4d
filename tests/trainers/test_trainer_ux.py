"""What a user of ``python -m trainers.gigpo.train`` sees: evaluation sized to the run, scored
config errors answered before torch loads, each env of a mixed run with its own response cap,
no foreign deprecation warning at start, and a real model told which tiny-model settings it
runs with."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from trainers.gigpo.config import (
    PRESETS,
    Config,
    command_line,
    parse_args,
    tiny_preset_note,
)
from trainers.gigpo.multienv import env_configs
from trainers.gigpo.train import train

ROOT = Path(__file__).resolve().parents[2]
CORRIDOR, SOKOBAN = "AgentGym/Corridor-v0", "AgentGym/Sokoban-v0"
QUIET = dict(progress=False, tensorboard=False, plot=False, quiet=True, device="cpu", cpu_threads=1)


# --- evaluation size ---------------------------------------------------------------------------
@pytest.mark.parametrize("env", sorted(PRESETS))
def test_evaluation_is_sized_to_the_run_on_every_env(env):
    """The README's promise: unset, an evaluation plays one rollout's worth of episodes
    (``num_groups x group_size``, at most 64), whatever the env's preset."""
    assert Config.for_env(env, num_groups=2, group_size=4).eval_tasks() == 8
    assert Config.for_env(env, num_groups=16, group_size=8).eval_tasks() == 64  # capped
    assert Config.for_env(env, num_groups=2, group_size=4, eval_groups=5).eval_tasks() == 5


def test_a_small_corridor_run_evaluates_a_rollouts_worth_and_the_flag_wins(tmp_path):
    out = ["--out-dir", str(tmp_path / "run")]
    small = parse_args(["--env", CORRIDOR, "--num-groups", "2", "--group-size", "4", *out])
    assert small.eval_groups is None and small.eval_tasks() == 8  # was 64, the preset's
    given = parse_args(["--num-groups", "2", "--group-size", "4", "--eval-groups", "12", *out])
    assert given.eval_tasks() == 12
    assert parse_args(out).eval_tasks() == 64  # the demo: 8 x 8 episodes per rollout


def test_a_mixed_run_evaluates_a_rollouts_worth_over_its_envs(tmp_path):
    from trainers.gigpo.train import make_run_envs

    config = Config.for_env(CORRIDOR, extra_envs=[SOKOBAN], num_groups=2, group_size=3)
    envs = make_run_envs(config, config.eval_tasks(), 1, evaluation=True)
    try:
        assert [v.num_envs for v in envs.venvs] == [3, 3]
    finally:
        envs.close()


# --- scored config errors before torch ---------------------------------------------------------
#: Runs the training script as ``python -m trainers.gigpo.train ARGS`` does, then reports which
#: heavy modules were imported and the CPU time the answer took (CPU, not wall: a loaded machine
#: stretches wall time many times over, while importing torch costs seconds of CPU anywhere).
AS_SCRIPT = r"""
import runpy, sys, time
start = time.process_time()
sys.argv = ["train", *sys.argv[1:]]
try:
    runpy.run_module("trainers.gigpo.train", run_name="__main__")
finally:
    loaded = [m for m in ("torch", "transformers", "trainers.gigpo.scored") if m in sys.modules]
    print("loaded:", ",".join(loaded) or "-", "seconds:", time.process_time() - start)
"""


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env", "AgentGym/SearchQA-Synthetic-v0"], "lists none; use --policy free"),
        (["--env", CORRIDOR, "--env", "AgentGym/SearchQA-Synthetic-v0"], "lists none"),
        (["--generation-backend", "vllm"], "--generation-backend hf only"),
        (["--rollout", "tree", "--advantage", "slate"], "--rollout flat only"),
        (["--action-temperature", "-1"], "--action-temperature must be at least 0"),
    ],
    ids=["no-actions", "no-actions-extra-env", "vllm", "tree", "temperature"],
)
def test_scored_config_errors_are_answered_before_torch_is_imported(tmp_path, flags, message):
    proc = subprocess.run(
        [sys.executable, "-c", AS_SCRIPT, "--out-dir", str(tmp_path / "run"), "--policy",
         "scored", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    # Neither torch nor the scored policy's module (which needs it) is loaded to say no.
    assert "loaded: -" in proc.stdout, proc.stdout
    seconds = float(proc.stdout.split("seconds:")[1])
    assert seconds < 2  # ~0.6 s of CPU; importing torch and transformers alone costs ~2.5 s
    assert not (tmp_path / "run").exists()


# --- several envs: each its own response cap ---------------------------------------------------
def test_each_env_of_a_mixed_run_takes_its_own_response_cap():
    """The corridor's one-token cap must not reach Sokoban, which answers in tags."""
    mixed = Config.for_env(CORRIDOR, extra_envs=[SOKOBAN])
    caps = {c.env: c.max_new_tokens for c in env_configs(mixed)}
    assert caps == {CORRIDOR: 1, SOKOBAN: Config().max_new_tokens}
    reversed_order = Config.for_env(SOKOBAN, extra_envs=[CORRIDOR])
    assert [c.max_new_tokens for c in env_configs(reversed_order)] == [512, 1]
    # A cap the user gives applies to every env.
    given = Config.for_env(CORRIDOR, extra_envs=[SOKOBAN], max_new_tokens=64)
    assert [c.max_new_tokens for c in env_configs(given)] == [64, 64]
    # A scored answer is the chosen action whatever the cap: one scoring batch for all envs.
    scored = Config.for_env(CORRIDOR, extra_envs=[SOKOBAN], policy="scored")
    assert [c.max_new_tokens for c in env_configs(scored)] == [1, 1]
    # The prompt style was already each env's own: Sokoban keeps its tags and its template.
    sokoban = env_configs(mixed)[1]
    assert (sokoban.fmt, sokoban.prompt_template) == (None, None)


def test_a_mixed_run_says_each_envs_cap_in_one_line(tmp_path):
    _, notes = command_line(["--env", CORRIDOR, "--env", SOKOBAN, "--out-dir", str(tmp_path)])
    assert [n for n in notes if "tokens" in n] == [
        "responses up to Corridor-v0 1, Sokoban-v0 512 tokens (each env's preset; "
        "--max-new-tokens N sets one cap for all)"
    ]
    _, notes = command_line(
        ["--env", CORRIDOR, "--env", SOKOBAN, "--max-new-tokens", "64", "--out-dir", str(tmp_path)]
    )
    assert not [n for n in notes if "tokens" in n]


def test_mixed_training_samples_each_env_up_to_its_own_cap(tmp_path):
    """The real trainer, tiny model, Corridor + Sokoban: corridor turns are one token, Sokoban
    turns run past it up to Sokoban's cap (a preset of 12 here, to keep the test fast)."""
    PRESETS[SOKOBAN] = {**PRESETS[SOKOBAN], "max_new_tokens": 12, "max_episode_steps": 2}
    try:
        config = Config.for_env(
            CORRIDOR, extra_envs=[SOKOBAN], num_groups=2, group_size=2, iterations=1,
            eval_every=0, max_episode_steps=2, env_kwargs={"length": 2}, save_final=False,
            out_dir=str(tmp_path / "run"), **QUIET,
        )  # fmt: skip
        assert [c.max_new_tokens for c in env_configs(config)] == [1, 12]
        history = train(config)
    finally:
        del PRESETS[SOKOBAN]  # the registry's preset again
    (record,) = [r for r in history if "rollout/response_tokens" in r]
    # Corridor turns of one token, Sokoban turns of 1..12 (a random tiny model seldom ends a
    # turn at once): the mean is well above 1 (it was exactly 1: every turn capped at one token).
    assert 1.5 < record["rollout/response_tokens"] <= 12


# --- start-up lines ----------------------------------------------------------------------------
def test_a_lora_start_shows_no_peft_deprecation_warning(tmp_path):
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model;
    that FutureWarning is the user's to ignore, not to see at every start."""
    config = Config.for_env(
        CORRIDOR, lora_rank=2, num_groups=1, group_size=2, iterations=1, eval_every=0,
        max_episode_steps=2, save_final=False, out_dir=str(tmp_path / "run"), **QUIET,
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(config)
    shown = [str(w.message) for w in caught]
    assert not [m for m in shown if "is_gradient_checkpointing" in m], shown


def test_a_real_model_on_the_corridor_is_told_its_tiny_model_settings(tmp_path):
    model = tmp_path / "model"  # a saved model's folder, as far as the command line looks
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = ["--out-dir", str(tmp_path / "run")]
    _, notes = command_line(["--env", CORRIDOR, "--model", str(model), *out])
    assert notes == [
        f"--model {model}: the {CORRIDOR} preset, made for the tiny model, sets "
        "--max-new-tokens 1, --prompt-template compact, --history-length 0, --lr 0.002; pass "
        "those flags to change them"
    ]
    _, notes = command_line(
        ["--env", CORRIDOR, "--model", str(model), "--lr", "3e-4", "--max-new-tokens", "32", *out]
    )
    assert len(notes) == 1 and "--lr" not in notes[0] and "--max-new-tokens" not in notes[0]
    scored = parse_args(["--model", str(model), "--policy", "scored", *out], [])
    assert "--max-new-tokens" not in tiny_preset_note(scored)  # a scored answer is its action
    # The tiny model, and an env whose preset suits any model, get no such line.
    assert command_line(["--env", CORRIDOR, *out])[1] == []
    assert command_line(["--env", SOKOBAN, "--model", str(model), *out])[1] == []
