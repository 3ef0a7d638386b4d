"""The env contract, checked over every registered id (STYLE.md: one parametrised test over the registry).

The checks are :mod:`agentgym.testing`'s, the ones a new family's own test runs with
``check_family``; each is one test here so a failure names the rule and the id.

Ids whose optional packages are missing are skipped; ids that play real benchmark data are
skipped when the data is not on this machine.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentgym
from agentgym import testing

ids = pytest.mark.parametrize("env_id", agentgym.env_ids())


@ids
def test_check_env(env_id, make):
    testing.check_gymnasium(env_id, make)


@ids
def test_registration(env_id, make):
    testing.check_registration(env_id, make)


@ids
def test_info_contract_and_spaces(env_id, make):
    testing.check_info_keys(env_id, make)


@ids
def test_same_seed_same_rollout(env_id, make):
    testing.check_determinism(env_id, make)


@ids
def test_pickle_round_trip(env_id, make):
    testing.check_pickle(env_id, make)


@ids
def test_garbage_actions_never_raise(env_id, make):
    testing.check_invalid_actions(env_id, make)


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
