"""Synthetic ALFWorld games: format and layout of the real files, determinism, balance, the
train/unseen scene split, the cache, and solvability under the stock TextWorld engine (alfworld's
own AlfredDemangler + AlfredInfos wrappers on ``textworld.gym``)."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("textworld")
pytest.importorskip("alfworld")

from agentgym.envs.alfworld.synthetic import (  # noqa: E402
    SYNTHETIC_NOTICE,
    TASK_TYPES,
    UNSEEN_SCENES,
    demangled_names,
    ensure_synthetic_data,
    generate_game,
    generate_games,
    play_solution,
    verify_game,
)

REAL_DATA = Path(
    os.environ.get(
        "AGENTGYM_SHARED_DATA", Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    )
)
TASK_DIR = re.compile(
    r"^(?P<task>[a-z_]+)-(?P<obj>[A-Za-z]+)-None-(?P<recep>[A-Za-z]+)-(?P<scene>\d+)$"
)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def one_per_type(tmp_path_factory) -> list[Path]:
    """Six games, one per task type (game i has task type TASK_TYPES[i])."""
    root = tmp_path_factory.mktemp("synthetic")
    return generate_games(root, "train", len(TASK_TYPES), seed=7, progress=False)


# --------------------------------------------------------------------------------------------
# Layout and format
# --------------------------------------------------------------------------------------------


def test_paths_and_files_follow_the_real_layout(one_per_type):
    for i, path in enumerate(one_per_type):
        assert path.name == "game.tw-pddl"
        trial, task, split, top = path.parts[-2], path.parts[-3], path.parts[-4], path.parts[-5]
        assert (top, split) == ("json_2.1.1", "train")
        assert trial.startswith("trial_T")
        m = TASK_DIR.match(task)
        assert m is not None, task
        assert m["task"] == TASK_TYPES[i]
        game = json.loads(path.read_text())
        assert list(game) == ["pddl_domain", "grammar", "pddl_problem", "solvable"]
        assert game["solvable"] is True
        problem = game["pddl_problem"]
        assert problem.startswith(f"\n(define (problem plan_{trial.rsplit('_', 1)[0]})")
        # the goal names the task's object and receptacle (lamp) types
        assert re.search(rf"\(objectType \?o1? {m['obj']}Type\)", problem)
        assert f"{m['recep']}Type)" in problem.split("(:goal", 1)[1]
        # the package's grammar (move X to Y) with the task sentence filled in
        assert "UNKNOWN GOAL" not in game["grammar"]
        assert 'template :: "move {o} to {r}"' in game["grammar"]
        side = json.loads((path.parent / "solution.json").read_text())
        assert side["synthetic"] is True and side["notice"] == SYNTHETIC_NOTICE
        assert side["task_type"] == TASK_TYPES[i]
        assert f"Your task is to: {side['goal']}." in game["grammar"]
        traj = json.loads((path.parent / "traj_data.json").read_text())
        assert traj["task_type"] == TASK_TYPES[i]
        assert traj["pddl_params"]["object_target"] == m["obj"]


def test_every_openable_receptacle_starts_closed_and_no_object_is_changed(one_per_type):
    n_openable = 0
    for path in one_per_type:
        problem = json.loads(path.read_text())["pddl_problem"]
        init = problem.split("(:init", 1)[1].split("(:goal", 1)[0]
        assert "(opened " not in init
        assert "(isHot " not in init and "(isCool " not in init and "(isClean " not in init
        n_openable += len(re.findall(r"\(openable \S+\)", init))
    assert n_openable > 0


def test_demangled_names_follow_alfworld_demangler():
    from alfworld.agents.utils.misc import Demangler

    ids = [
        "Cabinet_bar__minus_00_dot_48_bar__plus_02_dot_05_bar__plus_00_dot_39",
        "Cabinet_bar__plus_01_dot_00_bar__plus_02_dot_05_bar__plus_00_dot_39",
        "Cabinet_bar__minus_02_dot_00_bar__plus_00_dot_05_bar__plus_01_dot_00",
        "Sink_bar__minus_01_dot_11_bar__plus_00_dot_93_bar__plus_00_dot_34_bar_SinkBasin",
        "Sink_bar__minus_01_dot_11_bar__plus_00_dot_93_bar__plus_00_dot_34",
        "Apple_bar__minus_00_dot_14_bar__plus_00_dot_96_bar__plus_02_dot_93",
    ]

    class Info:  # what Demangler reads from TextWorld's entity infos (ids are lowercased)
        def __init__(self, i):
            self.id = i.lower()

    ref = Demangler(game_infos={i: Info(i) for i in ids})
    ours = demangled_names(ids)
    assert {i: ref.demangle_alfred_name(i.lower()).strip() for i in ids} == ours
    assert ours[ids[3]] == "sinkbasin 1" and ours[ids[4]] == "sink 1"


# --------------------------------------------------------------------------------------------
# Determinism, balance, splits
# --------------------------------------------------------------------------------------------


def test_same_seed_gives_byte_identical_files_across_processes(tmp_path):
    generate_games(tmp_path / "a", "valid_seen", 12, seed=3, progress=False)
    # another interpreter with another hash seed: set iteration order must not leak into files
    code = (
        "import sys; from agentgym.envs.alfworld.synthetic import generate_games;"
        "generate_games(sys.argv[1], 'valid_seen', 12, seed=3, progress=False)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "b")], check=True, env=env)
    a, b = _tree_bytes(tmp_path / "a"), _tree_bytes(tmp_path / "b")
    assert len(a) == 12 * 3 and a == b
    generate_games(tmp_path / "c", "valid_seen", 12, seed=4, progress=False)
    c = _tree_bytes(tmp_path / "c")
    assert set(c) != set(a)


def test_generate_game_is_a_pure_function_of_the_rng():
    g1 = generate_game(np.random.default_rng(11), "pick_cool_then_place_in_recep")
    g2 = generate_game(np.random.default_rng(11), "pick_cool_then_place_in_recep")
    g3 = generate_game(np.random.default_rng(12), "pick_cool_then_place_in_recep")
    assert g1.game == g2.game and g1.solution == g2.solution
    assert g1.game["pddl_problem"] != g3.game["pddl_problem"]
    assert any(cmd.startswith("cool ") for cmd in g1.solution)


def test_balanced_over_task_types_with_variety(tmp_path):
    paths = generate_games(tmp_path, "train", 60, seed=0, progress=False)
    tasks = [TASK_DIR.match(p.parts[-3]) for p in paths]
    counts = {t: sum(m["task"] == t for m in tasks) for t in TASK_TYPES}
    assert counts == {t: 10 for t in TASK_TYPES}
    assert len({m["scene"] for m in tasks}) >= 15
    assert len({m["obj"] for m in tasks}) >= 15
    solutions = [json.loads((p.parent / "solution.json").read_text())["solution"] for p in paths]
    # closed receptacles that must be opened, several instances of a type ("apple 2")
    assert sum(any(c.startswith("open ") for c in s) for s in solutions) >= 10
    assert any(re.search(r"^take \w+ [2-9] from", c) for s in solutions for c in s)
    # pick_two carries two distinct objects
    for m, s in zip(tasks, solutions, strict=True):
        if m["task"] == "pick_two_obj_and_place":
            taken = [c.split(" from ")[0] for c in s if c.startswith("take ")]
            assert len(taken) == 2 and len(set(taken)) == 2


def test_valid_unseen_uses_only_held_out_scenes(tmp_path):
    seen = generate_games(tmp_path, "train", 30, seed=1, progress=False)
    unseen = generate_games(tmp_path, "valid_unseen", 12, seed=1, progress=False)
    seen_scenes = {int(TASK_DIR.match(p.parts[-3])["scene"]) for p in seen}
    unseen_scenes = {int(TASK_DIR.match(p.parts[-3])["scene"]) for p in unseen}
    assert unseen_scenes <= set(UNSEEN_SCENES)
    assert not seen_scenes & set(UNSEEN_SCENES)
    assert {TASK_DIR.match(p.parts[-3])["task"] for p in unseen} == set(TASK_TYPES)


def test_an_unwritable_cache_still_plays_with_one_warning_line(tmp_path):
    """AGENTGYM_CACHE under a regular file (no folder can be made there, even by root): the
    games are generated into a private temporary folder, once per process, removed at exit."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    script = (
        "import gymnasium as gym, agentgym\n"
        "env = gym.make('AgentGym/ALFWorld-Synthetic-v0')\n"
        "obs, info = env.reset(seed=0)\n"
        "assert info['task_id'] and obs\n"
        "again = gym.make('AgentGym/ALFWorld-Synthetic-v0').unwrapped\n"
        "assert again.data_root == env.unwrapped.data_root  # generated once per process\n"
        "print(env.unwrapped.data_root)\n"
    )
    environ = dict(os.environ, AGENTGYM_CACHE=str(blocker / "cache"))
    run = subprocess.run(
        [sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    warnings = [line for line in lines if "cache" in line]
    assert len(warnings) == 1 and "AGENTGYM_CACHE" in warnings[0], lines
    assert "Traceback" not in run.stderr and "Errno" not in run.stderr
    data_root = Path(run.stdout.strip().splitlines()[-1])
    assert not data_root.exists()  # the temporary copy went with the process


def test_bad_arguments_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown task type"):
        generate_game(np.random.default_rng(0), "slice_everything")
    with pytest.raises(ValueError, match="can host"):
        generate_game(np.random.default_rng(0), "pick_heat_then_place_in_recep", scene=301)
    with pytest.raises(ValueError, match="unknown split"):
        generate_games(tmp_path, "test", 1, seed=0, progress=False)


# --------------------------------------------------------------------------------------------
# Solvability under the stock engine; a random policy does not win
# --------------------------------------------------------------------------------------------


def test_every_game_is_won_by_its_solution_under_the_stock_engine(one_per_type):
    for path in one_per_type:
        records = play_solution(path)
        # every command admissible when played, and the win comes with the last one (so the
        # goal is not met at the start and a solution cut short does not win)
        assert all(r["admissible"] for r in records[1:]), path
        assert [r["won"] for r in records] == [False] * (len(records) - 1) + [True], path
        assert records[-1]["done"]
    # verify_game is the same check as a bool; a wrong walkthrough fails it
    path = one_per_type[TASK_TYPES.index("pick_and_place_simple")]
    solution = json.loads((path.parent / "solution.json").read_text())["solution"]
    assert not verify_game(path, solution[:-1] + ["look"])


def test_random_policy_rarely_wins(one_per_type):
    """Uniformly random admissible commands for 20 steps, on the two task types with the
    shortest walkthroughs (4-5 commands): no win. (Measured over more games: see the module
    docstring of ``synthetic.py``.)"""
    import textworld
    import textworld.gym
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    rng = np.random.default_rng(0)
    games = [
        one_per_type[TASK_TYPES.index(t)] for t in ("pick_and_place_simple", "look_at_obj_in_light")
    ]
    infos = textworld.EnvInfos(won=True, admissible_commands=True)
    wins = 0
    for path in games:
        env_id = textworld.gym.register_games(
            [str(path)],
            infos,
            batch_size=1,
            asynchronous=False,
            max_episode_steps=20,
            wrappers=[AlfredDemangler(), AlfredInfos],
        )
        env = textworld.gym.make(env_id)
        _, info = env.reset()
        for _ in range(20):
            cmds = info["admissible_commands"][0]
            _, _, done, info = env.step([cmds[rng.integers(len(cmds))]])
            if done[0]:
                break
        wins += bool(info["won"][0])
        env.close()
    assert wins == 0


@pytest.mark.slow
def test_many_generated_games_are_all_solvable(tmp_path):
    for split in ("train", "valid_unseen"):
        generate_games(tmp_path, split, 24, seed=5, verify=True, progress=False)


# --------------------------------------------------------------------------------------------
# The cached default set
# --------------------------------------------------------------------------------------------


def _ensure(cache: str) -> str:
    return str(
        ensure_synthetic_data(cache, n_train=6, n_valid_seen=6, n_valid_unseen=6, progress=False)
    )


def test_ensure_is_idempotent_and_safe_when_raced(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        roots = pool.map(_ensure, [str(tmp_path)] * 2)
    assert roots[0] == roots[1]
    root = Path(roots[0])
    assert (root / "COMPLETE").exists() and SYNTHETIC_NOTICE in (root / "README.txt").read_text()
    games = sorted(root.glob("json_2.1.1/*/*/*/game.tw-pddl"))
    assert [
        len(list(root.glob(f"json_2.1.1/{s}/*/*/game.tw-pddl")))
        for s in ("train", "valid_seen", "valid_unseen")
    ] == [6, 6, 6]
    before = {p: p.stat().st_mtime_ns for p in games}
    # the loser of the race left no temporary folder behind
    assert [p.name for p in tmp_path.iterdir()] == [root.name]
    assert Path(_ensure(str(tmp_path))) == root
    assert {p: p.stat().st_mtime_ns for p in games} == before


# --------------------------------------------------------------------------------------------
# Against the real files (../shared/data)
# --------------------------------------------------------------------------------------------


def _real_games(n: int) -> list[tuple[str, dict]]:
    archive = REAL_DATA / "alfworld" / "json_2.1.1-valid_seen.tar.xz"
    if not archive.exists():
        pytest.skip(f"real ALFWorld data not found at {archive}")
    out = []
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar:
            if member.name.endswith("game.tw-pddl"):
                out.append((member.name, json.load(tar.extractfile(member))))
                if len(out) == n:
                    break
    return out


def _header(problem: str) -> tuple[set[str], ...]:
    head = problem[problem.index("(:objects") : problem.index("(:init")]
    consts = {
        kind: set(re.findall(rf"^\s*(\w+) - {kind}$", head, re.M))
        for kind in ("object", "otype", "rtype")
    }
    return tuple({c for c in consts[k] if "_bar_" not in c} for k in ("object", "otype", "rtype"))


@pytest.mark.realdata
def test_format_matches_the_real_files(one_per_type):
    real = _real_games(5)
    for name, _ in real:
        parts = Path(name).parts
        assert parts[0] == "json_2.1.1" and len(parts) == 5 and TASK_DIR.match(parts[2])
    real_preds = set()
    for _, game in real:
        real_preds |= set(
            re.findall(
                r"^\s*\((\w+) ", game["pddl_problem"].split("(:init")[1].split("(:goal")[0], re.M
            )
        )
    for path in one_per_type:
        ours = json.loads(path.read_text())
        assert list(ours) == list(real[0][1])
        assert _header(ours["pddl_problem"]) == _header(real[0][1]["pddl_problem"])
        init = ours["pddl_problem"].split("(:init")[1].split("(:goal")[0]
        assert set(re.findall(r"^\s*\((\w+) ", init, re.M)) <= real_preds
