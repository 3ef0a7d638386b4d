"""snapshot() / restore(), checked over every registered id (and so required of every family).

For each id: random action sequences (admissible actions, SearchQA's suggested actions, now and
then an invalid one), a snapshot at a random step, the original played on; then the snapshot is
restored (a) into the same env after it moved on, (b) into a fresh env, (c) pickled, into a
fresh env in another process, and each must replay the original exactly: observations,
rewards, flags, infos, state keys, and the task the next unseeded ``reset()`` draws. Also:
states with equal ``state_key`` reached by different paths behave alike, a snapshot of another
id (or another variant of the same class) is refused without changing the env, and a snapshot
does not change when the env, its infos or a restored copy do.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import pickle
import zlib
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import agentgym
from agentgym.core import EnvSnapshot, InvalidAction, SnapshotMismatch, TextEnv

ids = pytest.mark.parametrize("env_id", agentgym.env_ids())

#: where the families find real data; a child process is given the parent's values
DATA_VARIABLES = ("ALFWORLD_DATA", "WEBSHOP_DATA", "SEARCHQA_DATA", "SEARCHQA_RETRIEVER")

#: families whose observation text is a function of the state key alone. ALFWorld's is not:
#: TextWorld's "Next to it, you see" line remembers facts made false, which the key leaves out.
TEXT_FOLLOWS_STATE_KEY = {"sokoban", "corridor", "webshop", "searchqa"}


def choose(info: dict[str, Any], rng: np.random.Generator, invalid: float = 0.15) -> Any:
    """A random action: mostly one of the admissible (or, for SearchQA, suggested) actions,
    with probability ``invalid`` an unusable one (unknown text or a wrapper's InvalidAction)."""
    u = rng.random()
    if u < invalid * 0.6:
        return "xyzzy plugh"
    if u < invalid:
        return InvalidAction("no <action> tag in the model's text")
    choices = info["admissible_actions"] or info.get("suggested_actions") or ["look"]
    action = choices[int(rng.integers(len(choices)))]
    if action == "search[<your query>]":  # WebShop's search bar: type words of the goal
        words = info["goal"]["instruction_text"].split()
        picked = rng.choice(len(words), size=min(3, len(words)), replace=False)
        action = f"search[{' '.join(words[i] for i in sorted(picked))}]"
    return action


def play(env: TextEnv, actions: list[Any]) -> list[tuple]:
    """Every step's (obs, reward, terminated, truncated, info), then the next unseeded reset."""
    out: list[tuple] = [env.step(a) for a in actions]
    out.append(env.reset())
    return out


def _replay_in_child(env_id: str, environ: dict[str, str], jobs: list[tuple[bytes, list]]):
    """Runs in a spawned process: restore each pickled snapshot into a fresh env and replay."""
    for name in DATA_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(environ)
    out = []
    for blob, actions in jobs:
        env = gym.make(env_id).unwrapped
        env.restore(pickle.loads(blob))
        out.append((env.state_key(), play(env, actions)))
    return out


@pytest.fixture(scope="module")
def child():
    """One spawned worker process (a fresh interpreter: no caches, no shared objects)."""
    with concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        yield pool


def _seed(env_id: str) -> int:
    return zlib.crc32(env_id.encode())


def _random_prefix(env: TextEnv, rng: np.random.Generator, n_steps: int) -> dict[str, Any]:
    _, info = env.reset(seed=int(rng.integers(1 << 16)))
    for _ in range(n_steps):
        info = env.step(choose(info, rng))[4]
    return info


# --------------------------------------------------------------------------------------------
# Restores replay the original exactly
# --------------------------------------------------------------------------------------------


@ids
def test_restore_replays_exactly_in_place_fresh_and_in_another_process(env_id, make, child):
    env = make(env_id).unwrapped
    rng = np.random.default_rng(_seed(env_id))
    jobs, expected = [], []
    # a snapshot right after reset (where branching starts most often), then one mid-episode
    # (the prefix may end the episode: a finished env's snapshot must replay too)
    for n_prefix in (0, int(rng.integers(1, 7))):
        info = _random_prefix(env, rng, n_prefix)
        snap = env.snapshot()
        assert isinstance(snap, EnvSnapshot)
        assert snap.state_key == info["state_key"] == env.state_key()
        assert snap.elapsed_steps == env.elapsed_steps
        actions, original = [], []
        for _ in range(8):
            actions.append(choose(info, rng))
            original.append(env.step(actions[-1]))
            info = original[-1][4]
        original.append(env.reset())  # the random stream was restored too

        env.restore(snap)  # (a) the same env, after it moved on and reset
        assert env.state_key() == snap.state_key and env.elapsed_steps == snap.elapsed_steps
        assert play(env, actions) == original

        fresh = make(env_id).unwrapped  # (b) a fresh env, never reset
        fresh.restore(snap)
        assert fresh.state_key() == snap.state_key
        assert play(fresh, actions) == original

        jobs.append((pickle.dumps(snap), actions))
        expected.append((snap.state_key, original))
    # (c) pickled, into fresh envs of another process
    environ = {k: os.environ[k] for k in DATA_VARIABLES if k in os.environ}
    assert child.submit(_replay_in_child, env_id, environ, jobs).result(timeout=300) == expected


@ids
def test_one_snapshot_restores_any_number_of_times(env_id, make):
    env = make(env_id).unwrapped
    rng = np.random.default_rng(_seed(env_id) + 1)
    info = _random_prefix(env, rng, 2)
    snap = env.snapshot()
    branches = []
    for _ in range(3):  # k continuations of one prefix, as branching rollouts draw them
        env.restore(snap)
        actions = [choose(info, rng, invalid=0.0)]
        for _ in range(4):
            obs, *_, step_info = env.step(actions[-1])
            actions.append(choose(step_info, rng, invalid=0.0))
        branches.append((actions, env.state_key()))
    for actions, key in branches:
        env.restore(snap)
        for a in actions[:-1]:
            env.step(a)
        assert env.state_key() == key


# --------------------------------------------------------------------------------------------
# Equal state keys, different paths
# --------------------------------------------------------------------------------------------


def _same_key_pair(env: TextEnv, rng: np.random.Generator) -> tuple[EnvSnapshot, EnvSnapshot]:
    """Two snapshots of one task with equal state keys reached by different valid actions."""
    seed = int(rng.integers(1 << 16))
    seen: dict[Any, tuple[EnvSnapshot, tuple]] = {}
    for _ in range(40):
        _, info = env.reset(seed=seed)
        history: tuple = ()
        seen.setdefault(info["state_key"], (env.snapshot(), history))
        for _ in range(10):
            action = choose(info, rng, invalid=0.0)
            _, _, terminated, truncated, info = env.step(action)
            if terminated or truncated or not info["action_valid"]:
                break
            history += (action,)
            first = seen.setdefault(info["state_key"], (env.snapshot(), history))
            if first[1] != history:
                return first[0], env.snapshot()
    pytest.fail("no state reached twice by different paths in 40 random episodes")


def assert_same_behaviour(
    env_id: str, make, a: EnvSnapshot, b: EnvSnapshot, rng: np.random.Generator
) -> None:
    """Restored into fresh envs, ``a`` and ``b`` answer the same actions alike (up to the step
    cap, which counts steps since reset and so depends on the path)."""
    assert a.state_key == b.state_key
    env_a, env_b = make(env_id).unwrapped, make(env_id).unwrapped
    env_a.restore(a)
    env_b.restore(b)
    cap = env_a.max_episode_steps
    room = 8 if cap is None else min(8, cap - a.elapsed_steps, cap - b.elapsed_steps)
    info = a.info
    compare_text = agentgym.entry(env_id).family in TEXT_FOLLOWS_STATE_KEY
    for _ in range(room):
        action = choose(info, rng)
        obs_a, r_a, term_a, _, info = env_a.step(action)
        obs_b, r_b, term_b, _, info_b = env_b.step(action)
        assert (r_a, term_a) == (r_b, term_b)
        for key in ("state_key", "action_valid", "won", "score", "admissible_actions"):
            assert info[key] == info_b[key], key
        if compare_text:
            assert obs_a == obs_b
        if term_a:
            break


@ids
def test_equal_state_keys_behave_alike(env_id, make):
    env = make(env_id).unwrapped
    rng = np.random.default_rng(_seed(env_id) + 2)
    a, b = _same_key_pair(env, rng)
    assert_same_behaviour(env_id, make, a, b, rng)


def test_sokoban_moves_that_cancel_out(make):
    env = make("AgentGym/Sokoban-v0").unwrapped
    rng = np.random.default_rng(5)
    for seed in range(50):
        env.reset(seed=seed)
        start = env.snapshot()
        for there, back in (("up", "down"), ("down", "up"), ("left", "right"), ("right", "left")):
            env.restore(start)
            moved = env.step(there)[4]["action_effective"]
            if moved and env.step(back)[4]["state_key"] == start.state_key:
                assert env.elapsed_steps == 2
                assert_same_behaviour("AgentGym/Sokoban-v0", make, start, env.snapshot(), rng)
                return
    pytest.fail("no room with a free move and its way back")


def test_webshop_page_reached_twice(make):
    env = make("AgentGym/WebShop-Synthetic-v0").unwrapped
    _, info = env.reset(seed=7)
    words = " ".join(info["goal"]["instruction_text"].split()[:4])
    info = env.step(f"search[{words}]")[4]
    first = env.snapshot()
    buttons = {"click[back to search]", "click[next >]", "click[< prev]"}
    product = next(a for a in info["admissible_actions"] if a not in buttons)
    assert env.step(product)[4]["page"] == "item"
    assert env.step("click[description]")[4]["page"] == "sub"
    env.step("click[< prev]")
    info = env.step("click[< prev]")[4]  # item page, then back to the same results page
    assert info["page"] == "results"
    assert_same_behaviour(
        "AgentGym/WebShop-Synthetic-v0", make, first, env.snapshot(), np.random.default_rng(1)
    )


def test_searchqa_queries_with_different_words_same_passages(make):
    env_id = "AgentGym/SearchQA-Synthetic-v0"
    env = make(env_id).unwrapped
    _, info = env.reset(seed=1)
    mention = info["suggested_actions"][0].removeprefix("search[").removesuffix("]")
    words = mention.split()
    assert len(words) > 1, "pick a question whose first mention has several words"
    env.step(f"search[{mention}]")
    a = env.snapshot()
    env.reset(seed=1)
    env.step(f"search[the {' '.join(reversed(words)).lower()}]")  # other words, same passages
    b = env.snapshot()
    assert a.last_obs != "" and a.state_key == b.state_key
    assert_same_behaviour(env_id, make, a, b, np.random.default_rng(2))


# --------------------------------------------------------------------------------------------
# Refusals and immutability
# --------------------------------------------------------------------------------------------


@ids
def test_snapshot_of_another_id_is_refused_and_changes_nothing(env_id, make):
    env = make(env_id).unwrapped
    env.reset(seed=4)
    snap = env.snapshot()
    others = [
        other
        for other in agentgym.env_ids(available_only=True)
        if other != env_id and not agentgym.entry(other).real_data
    ]
    for other in others:
        target = make(other).unwrapped
        target.reset(seed=0)
        before = (target.state_key(), target.elapsed_steps, target._last_obs)
        with pytest.raises(SnapshotMismatch, match="same id"):
            target.restore(snap)
        assert (target.state_key(), target.elapsed_steps, target._last_obs) == before


def test_other_variant_and_other_data_are_refused():
    from agentgym.envs.corridor import CorridorEnv
    from agentgym.envs.webshop import WebShopEnv

    env = CorridorEnv(length=4)
    env.reset(seed=0)
    with pytest.raises(SnapshotMismatch, match="other arguments"):
        CorridorEnv(length=5).restore(env.snapshot())
    # the step cap is the restoring env's configuration, not the snapshot's: it stays
    capped = CorridorEnv(length=4, max_episode_steps=30)
    capped.restore(env.snapshot())
    assert capped.max_episode_steps == 30
    shop = WebShopEnv(synthetic=True)
    shop.reset(seed=0)
    with pytest.raises(SnapshotMismatch):  # another catalogue: its fingerprint differs
        WebShopEnv(synthetic=True, num_products=500).restore(shop.snapshot())


@ids
def test_snapshot_is_immutable(env_id, make):
    env = make(env_id).unwrapped
    rng = np.random.default_rng(_seed(env_id) + 3)
    info = _random_prefix(env, rng, 2)
    snap = env.snapshot()
    frozen = pickle.dumps(snap)
    expected = (snap.last_obs, snap.info, snap.state_key)
    assert expected[1] == info
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.elapsed_steps = 0  # type: ignore[misc]

    def scribble(info: dict[str, Any]) -> None:  # what a careless caller might do to an info
        for value in info.values():
            if isinstance(value, list):
                value.append("scribble")
            elif isinstance(value, dict):
                value["scribble"] = 1
        info["scribble"] = True

    scribble(info)
    for _ in range(5):  # the env moves on, and its infos are scribbled on
        scribble(env.step(choose(info, rng))[4])
    env.reset(seed=99)
    restored = make(env_id).unwrapped
    restored.restore(snap)
    scribble(restored._last_info)
    restored.step(choose(expected[1], rng))
    assert pickle.dumps(snap) == frozen
    again = make(env_id).unwrapped
    again.restore(snap)
    assert (again._last_obs, again._last_info, again.state_key()) == expected


@ids
def test_snapshot_is_small(env_id, make):
    """Not a copy of the game: the catalogue, parsed games, rooms' caches and retrievers stay
    behind (pickling sends what a step changed plus the last observation and info)."""
    env = make(env_id).unwrapped
    info = _random_prefix(env, np.random.default_rng(_seed(env_id) + 4), 3)
    size = len(pickle.dumps(env.snapshot()))
    text = len(pickle.dumps((env._last_obs, info)))
    assert size < text + 16_000, f"snapshot pickles to {size} bytes ({text} of them obs + info)"


# --------------------------------------------------------------------------------------------
# The base class
# --------------------------------------------------------------------------------------------


class _NoSnapshotEnv(TextEnv):
    def _reset_task(self, options):
        return "hi", {
            "state_key": 0,
            "task_id": "t",
            "admissible_actions": None,
            "won": False,
            "score": 0.0,
        }


def test_base_class_contract():
    env = _NoSnapshotEnv()
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="_NoSnapshotEnv does not support snapshot"):
        env.snapshot()
    from agentgym.envs.corridor import CorridorEnv

    corridor = CorridorEnv()
    with pytest.raises(RuntimeError, match="reset"):
        corridor.snapshot()
    with pytest.raises(TypeError, match="EnvSnapshot"):
        corridor.restore({"state": 1})  # type: ignore[arg-type]
    corridor.reset(seed=0)
    snap = corridor.snapshot()
    assert "CorridorEnv" in repr(snap) and "step 0" in repr(snap)
    with pytest.raises(SnapshotMismatch, match="CorridorEnv"):
        from agentgym.envs.sokoban import SokobanEnv

        SokobanEnv().restore(snap)
