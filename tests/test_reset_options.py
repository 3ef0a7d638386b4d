"""Task ids round-trip and bad reset options raise one documented exception, over the registry."""

from __future__ import annotations

import os
import pickle
import re
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import agentgym
from agentgym.core import ResetOptionError

ids = pytest.mark.parametrize("env_id", agentgym.env_ids())


def _first(env, **reset):
    obs, info = env.reset(**reset)
    return obs, info["task_id"], info["state_key"]


@ids
def test_task_ids_round_trip(env_id, make):
    env, other = make(env_id).unwrapped, make(env_id).unwrapped
    splits = [None]
    for split in ("valid", "test", "valid_seen"):
        try:
            env.reset(seed=0, options={"split": split})
            splits.append(split)
        except (ResetOptionError, FileNotFoundError):  # no such split, or its data is absent
            continue
    for split in splits:
        options = {"split": split} if split else None
        for seed in (0, 1, 2):
            obs, task_id, key = _first(env, seed=seed, options=options)
            # the id alone picks the same task: same first observation and state
            obs2, task_id2, key2 = _first(other, seed=99, options={"task": task_id})
            assert (obs2, task_id2, key2) == (obs, task_id, key), (split, task_id)


@ids
def test_bad_reset_options_raise_one_documented_error(env_id, make):
    env = make(env_id).unwrapped
    env.reset(seed=0)
    foreign = {e.id: None for e in agentgym.ENTRIES if e.family != env.family}
    bad: list = [
        "task 3",  # not a dict
        {"spilt": "train"},  # a typo of an option name
        {"split": "no-such-split"},
        {"task": "no-such-task-id"},
        {"task": -(10**30)},
        {"task": 10**30},
        {"task": 3.5},
        {"task": [1, 2]},
        {"task": {"a": 1}},
    ]
    # task ids of other families (corridor ids, sokoban ids, ...) are not tasks here
    for e in agentgym.ENTRIES:
        if e.family != env.family and e.available() and not e.real_data and e.id in foreign:
            try:
                bad.append({"task": gym.make(e.id).unwrapped.reset(seed=0)[1]["task_id"]})
            except FileNotFoundError:
                pass
    for options in bad:
        with pytest.raises(ResetOptionError) as info:
            env.reset(seed=0, options=options)
        assert str(info.value), options
    # and the env still works after every refusal
    obs, info = env.reset(seed=0)
    assert info["task_id"]


@ids
def test_surrounding_whitespace_never_changes_an_action(env_id, make):
    env = make(env_id).unwrapped
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=4)
    for _ in range(6):
        # free-text families (SearchQA) list no admissible actions but suggest some
        choices = info["admissible_actions"] or info.get("suggested_actions")
        if not choices:
            pytest.skip(f"{env_id} lists no admissible or suggested actions")
        action = choices[int(rng.integers(len(choices)))]
        padded = pickle.loads(pickle.dumps(env))  # the same state, stepped with padding
        plain, spaced = env.step(action), padded.step(f"  {action} \n")
        assert plain[:4] == spaced[:4], action
        assert plain[4]["state_key"] == spaced[4]["state_key"], action
        assert spaced[4]["action_valid"], action
        info = plain[4]
        if plain[2] or plain[3]:
            break


def test_env_works_after_its_first_reset_was_refused():
    # a first reset with bad options must not poison the env (gymnasium's passive checker did)
    env = gym.make("AgentGym/Sokoban-v0")
    with pytest.raises(ResetOptionError):
        env.reset(options={"spilt": "train"})
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(info["admissible_actions"][0])
    assert info["action_valid"]


# Reset options may come from a remote client (``agentgym serve``): a path-like split or task must
# never reach the file system, and the refusal must not reveal where the server keeps its files.
PATH_LIKE = ["../x", "/etc/passwd", "a/b", "..", "../outside/secret", "./test", "test/../test"]
_ABSOLUTE_PATH = re.compile(r"(?<![\w.\-])/[\w.\-]+/")


def _without(text: str, value: str) -> str:
    for shown in (repr(value), value):
        text = text.replace(shown, "<value>")
    return text


@ids
@pytest.mark.parametrize("key", ["split", "task"])
def test_path_like_options_are_refused_without_revealing_paths(env_id, key, make):
    env = make(env_id).unwrapped
    env.reset(seed=0)
    for value in PATH_LIKE:
        with pytest.raises(ResetOptionError) as info:
            env.reset(seed=0, options={key: value})
        message = _without(str(info.value), value)
        assert not _ABSOLUTE_PATH.search(message), (value, str(info.value))
        for secret in (os.getcwd(), str(Path.home()), tempfile.gettempdir()):
            assert secret not in message, (value, str(info.value))
    # the refusals changed nothing
    obs, info = env.reset(seed=0)
    assert info["task_id"]


def test_unknown_option_names_are_shown_short_and_printable():
    env = gym.make("AgentGym/Corridor-v0")
    with pytest.raises(ResetOptionError) as info:
        env.reset(options={"x" * 100_000: 1, "\x00\x1b[2J": 2})
    message = str(info.value)
    assert len(message) < 300 and "\x00" not in message and "\x1b" not in message
    assert "it accepts split, task" in message
