"""The `agentgym` command, run as a user runs it (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import agentgym

ROOT = Path(__file__).resolve().parents[1]


def agentgym_cmd(
    *args: str, stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentgym.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_list_shows_every_id_with_family():
    out = agentgym_cmd("list")
    assert out.returncode == 0, out.stderr
    for e in agentgym.ENTRIES:
        line = next(line for line in out.stdout.splitlines() if line.startswith(e.id))
        assert e.family in line


def test_rollout_reports_consistent_figures(tmp_path):
    path = tmp_path / "r.json"
    out = agentgym_cmd(
        "rollout", "AgentGym/Corridor-v0", "--groups", "3", "--group-size", "4", "--json", str(path)
    )
    assert out.returncode == 0, out.stderr
    assert "Corridor-v0" in out.stdout and "shared-state steps" in out.stdout
    (report,) = json.loads(path.read_text())["reports"]
    assert report["episodes"] == 12
    assert 0.0 <= report["success_rate"] <= 1.0
    assert report["steps"] == report["state_groups"]["num_steps"] > 0
    assert report["steps_per_second"] > 0
    # a seeded rollout is reproducible
    again = tmp_path / "r2.json"
    agentgym_cmd(
        "rollout", "Corridor-v0", "--groups", "3", "--group-size", "4", "--json", str(again)
    )
    (report2,) = json.loads(again.read_text())["reports"]
    assert report2["mean_return"] == report["mean_return"] and report2["steps"] == report["steps"]


def test_bench_writes_json(tmp_path):
    path = tmp_path / "b.json"
    out = agentgym_cmd(
        "bench", "Corridor-v0", "--steps", "2000", "--repeats", "3", "--quiet", "--json", str(path)
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(path.read_text())
    assert len(result["steps_per_second_runs"]) == 3
    assert result["steps_per_second_median"] == sorted(result["steps_per_second_runs"])[1]


def test_play_in_terminal_accepts_numbers_names_and_nonsense():
    out = agentgym_cmd("play", "Corridor-v0", "--seed", "0", stdin="0\nnonsense\n:reset\n:quit\n")
    assert out.returncode == 0, out.stderr
    assert "invalid action" in out.stdout
    assert out.stdout.count("actions:") >= 3


def test_unknown_id_says_what_exists():
    out = agentgym_cmd("bench", "NoSuchEnv-v9")
    assert out.returncode != 0
    assert "unknown env id" in out.stderr and "AgentGym/Corridor-v0" in out.stderr


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = next(line for line in ci.splitlines() if "python -m pytest" in line)
    assert test_cmd in readme, "the README's test command and .ci/run must be the same command"


def test_bad_arguments_are_refused_before_any_work(tmp_path):
    cases = [
        (("rollout", "Corridor-v0", "--groups", "0"), "--groups: must be >= 1"),
        (("rollout", "Corridor-v0", "--group-size", "-2"), "--group-size: must be >= 1"),
        (("bench", "Corridor-v0", "--steps", "0"), "--steps: must be >= 1"),
        (("bench", "Corridor-v0", "--repeats", "x"), "expected a whole number"),
        (("bench", "Corridor-v0", "--json", str(tmp_path / "no" / "b.json")), "does not exist"),
        (("rollout", "Corridor-v0", "--json", str(tmp_path)), "is a folder"),
        (("--bogus",), "unrecognized arguments: --bogus"),
        ((), "choose a command"),
    ]
    for args, message in cases:
        out = agentgym_cmd(*args, timeout=60)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert message in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr


def test_rollout_backends_and_split_are_accepted():
    from agentgym.cli import build_parser

    for backend in ("inprocess", "process", "ray"):  # every backend the README lists
        args = build_parser().parse_args(["rollout", "Corridor-v0", "--backend", backend])
        assert args.backend == backend
    out = agentgym_cmd(
        "rollout", "Corridor-v0", "--groups", "2", "--group-size", "2", "--split", "valid"
    )
    assert out.returncode == 0, out.stderr
    out = agentgym_cmd("rollout", "Corridor-v0", "--split", "nonsense")
    assert out.returncode == 1 and "unknown split" in out.stderr


def test_missing_data_is_one_line_not_a_traceback(tmp_path):
    import os

    env = dict(os.environ, ALFWORLD_DATA=str(tmp_path))
    for args in (("play", "ALFWorld-v0"), ("rollout", "ALFWorld-v0")):
        out = subprocess.run(
            [sys.executable, "-m", "agentgym.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env=env,
            input="",
        )
        assert out.returncode != 0
        assert "Traceback" not in out.stderr
        assert "ALFWORLD_DATA" in out.stderr
    # an all-failed rollout says so instead of printing an empty table
    assert "no rollout finished" in out.stderr and "episodes" not in out.stdout


def test_play_meta_commands_cost_no_step_and_final_board_prints_once():
    out = agentgym_cmd("play", "Sokoban-v0", "--seed", "0", stdin="help\n:legend\n?\nup\n:quit\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("[reward") == 1  # only 'up' was a step
    assert "cost no step" in out.stdout
    assert "√ box on target" in out.stdout and "S player on target" in out.stdout
    # the corridor with its hint is won by following the light; the goal text shows once
    script = []
    from agentgym.envs.corridor import CorridorEnv

    env = CorridorEnv()
    obs, info = env.reset(seed=3)
    while True:
        door = obs.split("Light comes through the ")[1].split()[0]
        script.append(door)
        obs, _, terminated, _, info = env.step(door)
        if terminated:
            break
    out = agentgym_cmd(
        "play", "Corridor-v0", "--seed", "3", stdin="\n".join(script + ["up"]) + "\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("You reach the goal!") == 1
    assert "Episode over: won" in out.stdout and "The episode is over" in out.stdout


def test_rollout_of_a_free_text_family_draws_from_suggested_actions(tmp_path):
    # SearchQA lists no admissible actions (queries are free text); the random policy plays its
    # suggested searches and answers instead of an invalid placeholder
    pytest.importorskip("bm25s")
    path = tmp_path / "r.json"
    out = agentgym_cmd(
        "rollout",
        "SearchQA-Synthetic-v0",
        "--groups",
        "4",
        "--group-size",
        "4",
        "--json",
        str(path),
    )
    assert out.returncode == 0, out.stderr
    (report,) = json.loads(path.read_text())["reports"]
    assert report["invalid_fraction"] == 0.0
    assert report["mean_length"] < 4  # answers end episodes before the 4-turn cap
