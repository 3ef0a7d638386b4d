"""Task ids round-trip and bad reset options raise one documented exception, over the registry
(the rules are :func:`agentgym.testing.check_reset_options`'s, which a new family's test runs)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentgym
from agentgym import testing
from agentgym.core import ResetOptionError

ids = pytest.mark.parametrize("env_id", agentgym.env_ids())


@ids
def test_reset_option_rules(env_id, make):
    # task ids round-trip in every split; bad options (typos, unknown or path-like splits and
    # tasks, other families' task ids, wrong types) raise ResetOptionError without showing a
    # path; the env works after every refusal
    testing.check_reset_options(env_id, make)


@ids
def test_surrounding_whitespace_never_changes_an_action(env_id, make):
    testing.check_action_whitespace(env_id, make)


def test_env_works_after_its_first_reset_was_refused():
    # a first reset with bad options must not poison the env (gymnasium's passive checker did)
    env = gym.make("AgentGym/Sokoban-v0")
    with pytest.raises(ResetOptionError):
        env.reset(options={"spilt": "train"})
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(info["admissible_actions"][0])
    assert info["action_valid"]


def test_unknown_option_names_are_shown_short_and_printable():
    env = gym.make("AgentGym/Corridor-v0")
    with pytest.raises(ResetOptionError) as info:
        env.reset(options={"x" * 100_000: 1, "\x00\x1b[2J": 2})
    message = str(info.value)
    assert len(message) < 300 and "\x00" not in message and "\x1b" not in message
    assert "it accepts split, task" in message
