"""ALFWorld's ``info["goal_progress"]``: the fraction of goal facts that hold, 1.0 iff won.

The expert plays one synthetic game of every task type; progress must rise exactly at the
steps that make a goal fact true. An independent reference (a join of the goal's static
literals plus every subset of its goal facts against the live facts) checks the precomputed
groundings on every visited state. Real games (../shared/data) are checked when present.
"""

from __future__ import annotations

import json
import pickle
import random
import re
from functools import cache
from itertools import combinations
from pathlib import Path

import gymnasium as gym
import pytest

import agentgym  # noqa: F401 - registers the ids
from agentgym.core import InvalidAction
from agentgym.envs.alfworld import TASK_TYPES, ALFWorldEnv
from agentgym.envs.alfworld.data import task_type_of
from agentgym.envs.alfworld.engine import Game, World, _codegen, _compile_plan

pytest.importorskip("textworld")

PLACE = ("move ", "put ")  # the synthetic grammar says "move X to Y", the released one "put"


@pytest.fixture(scope="module")
def env() -> ALFWorldEnv:
    return gym.make("AgentGym/ALFWorld-Synthetic-v0", max_episode_steps=80).unwrapped


@pytest.fixture(scope="module")
def task_by_type(env) -> dict[str, int]:
    """The first synthetic train game of every task type, by index."""
    picked: dict[str, int] = {}
    for i, tid in enumerate(env.task_ids):
        picked.setdefault(task_type_of(tid), i)
    assert set(picked) == set(TASK_TYPES.values())
    return picked


def _expert_episode(env: ALFWorldEnv, task) -> tuple[list[str], list[dict]]:
    """Play the oracle to the end: the actions and the infos (reset's first)."""
    _, info = env.reset(options={"task": task})
    actions, infos = [], [info]
    while (action := env.expert_action()) is not None:
        _, _, terminated, truncated, info = env.step(action)
        actions.append(action)
        infos.append(info)
        if terminated or truncated:
            break
    return actions, infos


def _rises(actions: list[str], progress: list[float]) -> list[tuple[str, float]]:
    """(action, progress after it) of every step that changed the progress."""
    return [
        (actions[i], progress[i + 1]) for i in range(len(actions)) if progress[i + 1] != progress[i]
    ]


# ---------------------------------------------------------------------------------------------
# A reference: the largest subset of goal facts satisfiable together with the static literals
# ---------------------------------------------------------------------------------------------
@cache
def _subset_solvers(game: Game, pred: str) -> list[list[tuple[int, int, list]]]:
    """Per rule of axiom ``pred``: (k, n goal facts, solvers of static + each k-subset)."""
    fluent = game.domain.fluent
    out = []
    for params, literals in game.goal.rules[pred]:
        facts = [lit for lit in literals if lit[1] in fluent]
        static = [lit for lit in literals if lit[1] not in fluent]
        levels = []
        for k in range(len(facts), -1, -1):
            solvers = [
                _codegen(_compile_plan(static + list(sub), list(params), (), {}), 0, True)
                for sub in combinations(facts, k)
            ]
            levels.append((k, len(facts), solvers))
        out.append(levels)
    return out


def _reference_progress(world: World) -> float:
    game = world.game
    values = []
    for positive, pred, args in game.goal.literals:
        if not positive or pred not in game.goal.rules or args:
            values.append(float(world._literal_true(positive, pred, args)))
            continue
        best = 0.0
        for levels in _subset_solvers(game, pred):
            for k, n, solvers in levels:
                found = any(
                    solve(world._lookup, world.holds, game.type_sets, game.type_objects, None)
                    for solve in solvers
                )
                if found:
                    best = max(best, k / n if n else 1.0)
                    break
        values.append(best)
    return sum(values) / len(values)


# ---------------------------------------------------------------------------------------------
# The expert's episode on every task type
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task_type", sorted(TASK_TYPES.values()))
def test_expert_episode_raises_progress_at_the_goal_fact_steps(env, task_by_type, task_type):
    actions, infos = _expert_episode(env, task_by_type[task_type])
    progress = [info["goal_progress"] for info in infos]
    assert all(type(p) is float and 0.0 <= p <= 1.0 for p in progress)
    assert infos[-1]["won"] and progress[-1] == 1.0
    assert progress[0] < 1.0
    for info in infos:
        assert (info["goal_progress"] == 1.0) == info["won"]
    rises = _rises(actions, progress)
    last = actions[-1]
    if task_type == "pick_and_place_simple":
        assert progress[0] == 0.0 and rises == [(last, 1.0)]
        assert last.startswith(PLACE)
    elif task_type in (
        "pick_clean_then_place_in_recep",
        "pick_heat_then_place_in_recep",
        "pick_cool_then_place_in_recep",
    ):
        verb = task_type.split("_")[1]  # clean / heat / cool
        assert progress[0] == 0.0
        assert len(rises) == 2, rises
        assert rises[0][0].startswith(verb + " ") and rises[0][1] == 0.5
        assert rises[1] == (last, 1.0) and last.startswith(PLACE)
    elif task_type == "pick_two_obj_and_place":
        places = [i for i, a in enumerate(actions) if a.startswith(PLACE)]
        assert progress[0] == 0.0 and len(places) == 2
        assert rises == [(actions[places[0]], 0.5), (last, 1.0)]
        assert places[1] == len(actions) - 1
    else:  # look_at_obj_in_light: lamp in its receptacle, agent there, object held, lamp on
        assert progress[0] == 0.25  # the lamp stands in its receptacle from the start
        assert [p for _, p in rises] == [0.5, 0.75, 1.0]
        assert any(a.startswith("take ") for a, _ in rises)
        assert any(a.startswith("go to ") for a, _ in rises)
        assert last.startswith("use ")


@pytest.mark.parametrize("task_type", sorted(TASK_TYPES.values()))
def test_progress_matches_a_join_over_subsets_of_goal_facts(env, task_by_type, task_type):
    """Every state of a walk that mixes the expert with random admissible actions (taking
    things out again, walking away), restarting after each win."""
    rng = random.Random(7)
    task = task_by_type[task_type]
    env.reset(options={"task": task})
    seen = {env._world.goal_progress()}
    for _ in range(60):
        action = env.expert_action() if rng.random() < 0.75 else None
        action = action or rng.choice(env._world.admissible_commands())
        terminated = env.step(action)[2]
        world = env._world
        assert world.goal_progress() == _reference_progress(world)
        assert (world.goal_progress() == 1.0) == world.won() == terminated
        seen.add(world.goal_progress())
        if terminated:
            env.reset(options={"task": task})
    assert len(seen) >= 2  # the walk saw progress change


# ---------------------------------------------------------------------------------------------
# Snapshots, invalid actions
# ---------------------------------------------------------------------------------------------
def test_snapshot_restores_progress_exactly(env, task_by_type):
    task = task_by_type["pick_clean_then_place_in_recep"]
    actions, infos = _expert_episode(env, task)
    mid = next(i for i, a in enumerate(actions) if a.startswith("clean "))
    env.reset(options={"task": task})
    for action in actions[: mid + 1]:
        env.step(action)
    snap = env.snapshot()
    assert env._world.goal_progress() == 0.5
    rest = [env.step(a)[4]["goal_progress"] for a in actions[mid + 1 :]]
    assert rest == [info["goal_progress"] for info in infos[mid + 2 :]] and rest[-1] == 1.0

    fresh = gym.make("AgentGym/ALFWorld-Synthetic-v0", max_episode_steps=80).unwrapped
    for target, snapshot in ((env, snap), (fresh, pickle.loads(pickle.dumps(snap)))):
        target.restore(snapshot)
        assert target._world.goal_progress() == 0.5
        again = [target.step(a)[4]["goal_progress"] for a in actions[mid + 1 :]]
        assert again == rest


def test_world_freeze_thaw_and_dump_keep_progress(env, task_by_type):
    actions, _ = _expert_episode(env, task_by_type["pick_two_obj_and_place"])
    game = env._game
    world = World(game)
    first_place = next(i for i, a in enumerate(actions) if a.startswith(PLACE))
    for action in actions[: first_place + 1]:
        assert world.step(action)[1]
    frozen, dumped = world.freeze(), world.dump()
    assert world.goal_progress() == 0.5
    for action in actions[first_place + 1 :]:
        world.step(action)
    assert world.goal_progress() == 1.0 and world.won()
    world.thaw(frozen)
    assert world.goal_progress() == 0.5 and not world.won()
    other = World(game)
    other.restore(dumped)
    assert other.goal_progress() == 0.5
    other.thaw(pickle.loads(pickle.dumps(world.freeze())))  # derived caches left behind
    assert other.goal_progress() == 0.5


def test_invalid_actions_keep_the_key_and_value(env, task_by_type):
    task = task_by_type["pick_heat_then_place_in_recep"]
    actions, _ = _expert_episode(env, task)
    env.reset(options={"task": task})
    heat = next(i for i, a in enumerate(actions) if a.startswith("heat "))
    for action in actions[: heat + 1]:
        env.step(action)
    for bad in ("dance with the fridge", 42, InvalidAction("no <action> tag")):
        info = env.step(bad)[4]
        assert info["action_valid"] is False and info["goal_progress"] == 0.5


# ---------------------------------------------------------------------------------------------
# Goals beyond ALFWorld's six: ground literals, negations, disjunctions, a negated axiom
# ---------------------------------------------------------------------------------------------
def _game_with_goal(env, task_by_type, goal: str) -> tuple[Game, str]:
    """A synthetic clean-task game with its goal replaced by ``goal`` (``{cloth}`` filled)."""
    env.reset(options={"task": task_by_type["pick_clean_then_place_in_recep"]})
    data = json.loads(Path(env._game.path).read_text())
    problem = data["pddl_problem"]
    cloth = sorted(set(re.findall(r"\(objectType (\S+) ClothType\)", problem)) - {"?o"})[0]
    start = problem.index("(:goal")
    data["pddl_problem"] = problem[:start] + goal.format(cloth=cloth) + ")\n"
    return Game(data, None), cloth


@pytest.mark.parametrize(
    ("goal", "start"),
    [
        # three ground literals: the mean of 0/1 (not hot holds from the start)
        ("(:goal (and (isClean {cloth}) (not (isHot {cloth})) (holds agent1 {cloth})))", 1 / 3),
        # a negated goal fact inside an axiom counts when the fact is false
        (
            "(:goal (exists (?o - object) (and (objectType ?o ClothType) (not (isClean ?o)) "
            "(holds agent1 ?o))))",
            1 / 2,
        ),
        # a disjunction: the better of its two rules
        (
            "(:goal (or (exists (?o - object) (and (objectType ?o ClothType) (isClean ?o) "
            "(isHot ?o))) (exists (?o - object) (and (objectType ?o ClothType) (isCool ?o)))))",
            0.0,
        ),
        # a negated axiom scores 1 or 0
        ("(:goal (not (exists (?o - object) (and (objectType ?o ClothType) (isClean ?o)))))", 1.0),
    ],
)
def test_other_goal_shapes(env, task_by_type, goal, start):
    game, cloth = _game_with_goal(env, task_by_type, goal)
    world = World(game)
    assert world.goal_progress() == start
    assert (world.goal_progress() == 1.0) == world.won()
    # the cloth held and clean, set through dump/restore (which drops every cached value)
    facts, negated = world.dump()
    facts.setdefault("holds", []).append(("agent1", cloth.lower()))  # FD lowercases names
    facts.setdefault("isclean", []).append((cloth.lower(),))
    world.restore((facts, negated))
    expected = {1 / 3: 1.0, 1 / 2: 1 / 2, 0.0: 0.5, 1.0: 0.0}[start]
    assert world.goal_progress() == expected
    assert (world.goal_progress() == 1.0) == world.won()
    assert world.goal_progress() == _reference_progress(world)


# ---------------------------------------------------------------------------------------------
# Real games
# ---------------------------------------------------------------------------------------------
def test_real_games_expert_wins_at_exactly_one(alfworld_real_root):
    real = ALFWorldEnv(data_root=alfworld_real_root, split="valid_seen", max_episode_steps=80)
    picked: dict[str, int] = {}
    for i, tid in enumerate(real.task_ids):
        picked.setdefault(task_type_of(tid), i)
    assert set(picked) == set(TASK_TYPES.values())
    for task in picked.values():
        _, infos = _expert_episode(real, task)
        progress = [info["goal_progress"] for info in infos]
        assert infos[-1]["won"] and progress[-1] == 1.0 and progress[0] < 1.0
        assert all(0.0 <= p <= 1.0 for p in progress)
        assert all((info["goal_progress"] == 1.0) == info["won"] for info in infos)
        # spot-check the grounded model against the reference on the states around the win
        assert real._world.goal_progress() == _reference_progress(real._world)
