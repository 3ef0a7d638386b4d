"""The `agentgym` command, run as a user runs it (a real subprocess)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tarfile
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
    out = agentgym_cmd("play", "Sokoban-v0", "--seed", "0", stdin=":help\n:legend\n?\nup\n:quit\n")
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


def test_play_shows_the_action_syntax_and_spends_no_step_on_a_bad_number():
    pytest.importorskip("bm25s")
    out = agentgym_cmd(
        "play", "SearchQA-Synthetic-v0", "--seed", "0", stdin="7\n:legend\n:help\n:quit\n"
    )
    assert out.returncode == 0, out.stderr
    before_prompt = out.stdout.split("> ", 1)[0]
    assert "search[<query>]" in before_prompt and "answer[<answer>]" in before_prompt
    assert "no action [7]" in out.stdout
    assert "[reward" not in out.stdout  # neither the number nor a meta command took a step
    help_text = out.stdout.split(":help, ?", 1)[1]
    assert ":legend" not in help_text  # SearchQA has no symbols to explain
    assert "loading AgentGym/SearchQA-Synthetic-v0" in out.stderr  # said before the wait


def test_play_passes_the_familys_own_help_action_through():
    pytest.importorskip("textworld")
    out = agentgym_cmd("play", "ALFWorld-Synthetic-v0", "--seed", "0", stdin="help\n:quit\n")
    assert out.returncode == 0, out.stderr
    assert "Available commands" in out.stdout  # ALFWorld's own help, as the env answers it
    assert out.stdout.count("[reward") == 1


def test_help_texts_show_defaults_and_every_command():
    top = agentgym_cmd("-h")
    description = top.stdout.split("positional arguments")[0]
    assert "``" not in top.stdout
    for command in ("list", "play", "rollout", "bench", "retrieval", "serve"):
        assert f"agentgym {command}" in description, command
    assert "(default: 4)" in agentgym_cmd("rollout", "-h").stdout
    bench = agentgym_cmd("bench", "-h").stdout
    assert "(default: 20000)" in bench and "(default: 5)" in bench


def test_list_names_the_alfworld_data_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}
    out = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "list"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("AgentGym/ALFWorld-v0 "))
    if "missing" not in line:  # packages here: the data column names the variable to set
        assert "ALFWORLD_DATA" in line, line


def test_a_bad_split_is_one_line_before_the_rollout():
    out = agentgym_cmd("rollout", "Corridor-v0", "--split", "nonsense")
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if "nonsense" in line]
    assert len(lines) == 1 and "unknown split" in lines[0], out.stderr
    assert "more: envs" not in out.stderr and "rolling out" not in out.stderr


@pytest.fixture(scope="module")
def valid_seen_only(tmp_path_factory) -> Path:
    """An ALFWorld data root holding only json_2.1.1/valid_seen, unpacked from its archive."""
    shared = Path(os.environ.get("AGENTGYM_SHARED_DATA", ROOT / ".." / "shared" / "data"))
    archive = shared / "alfworld" / "json_2.1.1-valid_seen.tar.xz"
    if not archive.is_file():
        pytest.skip(f"ALFWorld archive {archive} absent")
    root = tmp_path_factory.mktemp("valid_seen_only")
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(root, filter="data")
    return root


@pytest.mark.realdata
def test_rollout_and_play_the_split_that_is_unpacked(valid_seen_only):
    pytest.importorskip("textworld")
    env = dict(os.environ, ALFWORLD_DATA=str(valid_seen_only))
    run = functools.partial(
        subprocess.run, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env
    )
    cli = [sys.executable, "-m", "agentgym.cli"]
    out = run([*cli, "rollout", "ALFWorld-v0", "--include-real", "--split", "valid_seen",
               "--groups", "2", "--group-size", "2"])  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "ALFWorld-v0" in out.stdout
    out = run([*cli, "play", "ALFWorld-v0", "--split", "valid_seen", "--seed", "0"], input="look\n")
    assert out.returncode == 0, out.stderr
    assert "task valid_seen/" in out.stdout and out.stdout.count("[reward") == 1
    # a split that is not unpacked: one line naming what is
    out = run([*cli, "rollout", "ALFWorld-v0", "--include-real", "--split", "valid_unseen"])
    assert out.returncode == 1 and "present: valid_seen" in out.stderr, out.stderr
