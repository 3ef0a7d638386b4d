"""The env contract, checked over every registered id (STYLE.md: one parametrised test over the registry).

Ids whose optional packages are missing are skipped; ids that play real benchmark data are
skipped when the data is not on this machine.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Hashable

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym.core import INFO_KEYS, TextEnv

GARBAGE_ACTIONS = [
    "",
    " ",
    "x" * 100_000,
    "héllo wörld ✓ 漢字 🙂",
    "\x00\x01\x1b[2J\x7f\r\n\t",
    "<action>up</action>" * 1000,
    None,
    42,
    3.5,
    b"\xff\xfe bytes",
    ["up"],
]


def rollout(env: gym.Env, seed: int, n_steps: int, action_seed: int = 0):
    """(obs, reward, terminated, truncated, state_key) per step, random admissible actions."""
    rng = np.random.default_rng(action_seed)
    obs, info = env.reset(seed=seed)
    out = [(obs, 0.0, False, False, info["state_key"])]
    for _ in range(n_steps):
        choices = info["admissible_actions"] or ["look"]
        action = choices[int(rng.integers(len(choices)))]
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, reward, terminated, truncated, info["state_key"]))
        if terminated or truncated:
            break
    return out


ids = pytest.mark.parametrize("env_id", agentgym.env_ids())


@ids
def test_check_env(env_id, make):
    env = make(env_id)
    with warnings.catch_warnings():
        # check_env warns that gym.make's env is wrapped; the contract is the unwrapped env's
        warnings.simplefilter("ignore", UserWarning)
        check_env(env.unwrapped, skip_render_check=True)
    assert isinstance(env.unwrapped, TextEnv)
    env.close()


@ids
def test_info_contract_and_spaces(env_id, make):
    env = make(env_id)
    obs, info = env.reset(seed=3)
    for _ in range(30):
        assert env.observation_space.contains(obs), f"observation outside the space: {obs[:200]!r}"
        assert set(INFO_KEYS) <= set(info), f"missing {set(INFO_KEYS) - set(info)}"
        assert isinstance(info["state_key"], Hashable)
        hash(info["state_key"])
        assert isinstance(info["task_id"], str) and info["task_id"]
        assert info["admissible_actions"] is None or all(
            isinstance(a, str) for a in info["admissible_actions"]
        )
        assert isinstance(info["action_valid"], bool)
        assert isinstance(info["won"], bool)
        assert isinstance(info["score"], float)
        choices = info["admissible_actions"] or ["look"]
        obs, reward, terminated, truncated, info = env.step(choices[0])
        assert isinstance(reward, float)
        if terminated or truncated:
            obs, info = env.reset()


@ids
def test_same_seed_same_rollout(env_id, make):
    env_a, env_b = make(env_id), make(env_id)
    for seed in (0, 7):
        a = rollout(env_a, seed, 40, action_seed=seed)
        b = rollout(env_b, seed, 40, action_seed=seed)
        assert a == b
    # and a different seed gives a different start for at least one of a few seeds
    firsts = {rollout(env_a, s, 0)[0][4] for s in range(5)}
    assert len(firsts) > 1, "five seeds gave the same initial state"


@ids
def test_pickle_round_trip(env_id, make):
    env = make(env_id)
    rng = np.random.default_rng(1)
    obs, info = env.reset(seed=11)
    for _ in range(3):
        choices = info["admissible_actions"] or ["look"]
        obs, _, terminated, truncated, info = env.step(choices[int(rng.integers(len(choices)))])
        if terminated or truncated:
            obs, info = env.reset(seed=12)
    clone = pickle.loads(pickle.dumps(env))
    for _ in range(5):
        choices = info["admissible_actions"] or ["look"]
        action = choices[int(rng.integers(len(choices)))]
        a, b = env.step(action), clone.step(action)
        assert a[:4] == b[:4]
        assert a[4]["state_key"] == b[4]["state_key"]
        info = a[4]
        if a[2] or a[3]:
            break


@ids
def test_garbage_actions_never_raise(env_id, make):
    env = make(env_id)
    obs, info = env.reset(seed=5)
    key = info["state_key"]
    for action in GARBAGE_ACTIONS:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_valid"] is False, f"{action!r:.40} was accepted"
        assert info["state_key"] == key, f"{action!r:.40} changed the state"
        assert env.observation_space.contains(obs), (
            f"{action!r:.40} gave an observation outside the space"
        )
        if terminated or truncated:
            obs, info = env.reset(seed=5)
            key = info["state_key"]


@ids
def test_make_vec_gives_group_vector_env(env_id, make):
    make(env_id).close()  # skips like the others when the id cannot be built here
    vec = gym.make_vec(env_id, num_envs=4, group_size=2)
    try:
        assert isinstance(vec, agentgym.GroupVectorEnv)
        obs, infos = vec.reset(seed=0)
        assert len(obs) == 4 and vec.num_groups == 2
        assert infos[0]["state_key"] == infos[1]["state_key"]
        obs, rewards, terminated, truncated, infos = vec.step(
            [(i["admissible_actions"] or ["look"])[0] for i in infos]
        )
        assert rewards.shape == (4,) and terminated.dtype == bool
    finally:
        vec.close()
