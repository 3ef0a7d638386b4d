"""The core contract on invalid steps, over every registered id: an invalid step keeps every
info key the family reports (``goal``, ``task_type``, ``boxes_on_target``...), whichever path
made it invalid: a non-text action, an :class:`InvalidAction`, or model text the LLM wrapper
could not parse. Trainers read those keys from the last step of a trajectory.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest

import agentgym
from agentgym import testing
from agentgym.core import INFO_KEYS, InvalidAction

#: keys the LLM wrappers add on top of the env's own
WRAPPER_KEYS = {"parsed_action", "think", "parse_error", "raw_observation"}


def valid_step(env: gym.Env, info: dict[str, Any]) -> dict[str, Any]:
    """The info of one valid step (the first admissible action), or the reset info where the
    family cannot list its actions."""
    admissible = info.get("admissible_actions")
    if not admissible:
        return info
    step_info = env.step(admissible[0])[4]
    assert step_info["action_valid"], f"admissible action {admissible[0]!r} was invalid"
    return step_info


@pytest.mark.parametrize("env_id", agentgym.env_ids(available_only=True))
@pytest.mark.parametrize(
    "invalid", [None, 42, InvalidAction("nothing to do")], ids=["none", "int", "invalid_action"]
)
def test_invalid_core_steps_keep_the_family_info_keys(make, env_id, invalid):
    env = make(env_id)
    _, info = env.reset(seed=0)
    valid = valid_step(env, info)
    _, info = env.reset(seed=0)
    *_, bad = env.step(invalid)
    assert bad["action_valid"] is False
    assert set(valid) <= set(bad), f"invalid step lost {sorted(set(valid) - set(bad))}"
    assert set(INFO_KEYS) <= set(bad)
    for key in set(info) - {"action_valid"}:  # the state did not change: same family facts
        if key in bad and key != "action_effective":
            assert bad[key] == info[key], key
    assert bad.get("action_effective", False) is False  # nothing happened


@pytest.mark.parametrize("env_id", agentgym.env_ids(available_only=True))
def test_unparseable_model_text_keeps_the_family_info_keys(make, env_id):
    # model text is written in the env's own action format (agentgym.testing.model_text), and
    # the unparseable text is one that does not parse in it: for ``plain``, where any text is
    # the action, blank text (agentgym.testing.unparseable_text)
    testing.check_prompt(env_id, make)
