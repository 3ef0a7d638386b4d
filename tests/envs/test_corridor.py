"""CorridorEnv: contract, dynamics, determinism, splits, state keys."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym  # noqa: F401 - registers the ids
from agentgym.core import InvalidAction, SnapshotMismatch
from agentgym.envs.corridor import CorridorEnv


def right_doors(env: CorridorEnv) -> list[str]:
    info = env.unwrapped._last_info
    return [env.doors[d] for d in env.layout(info["layout"], info["state_key"][1])]


def test_check_env_and_registry():
    env = gym.make("AgentGym/Corridor-v0")
    check_env(env.unwrapped)
    assert env.unwrapped.family == "corridor"


def test_optimal_path_wins_with_goal_reward():
    env = CorridorEnv(length=5, num_doors=3)
    obs, info = env.reset(seed=1)
    assert info["admissible_actions"] == ["red", "blue", "green"]
    total = 0.0
    for i, door in enumerate(right_doors(env)):
        assert f"Room {i + 1} of 5" in obs
        assert f"Light comes through the {door} door" in obs
        obs, r, term, trunc, info = env.step(door)
        total += r
    assert term and not trunc and info["won"] and info["score"] == 1.0
    assert total == 10.0


def test_wrong_turn_is_recoverable_and_costs_two_steps():
    env = CorridorEnv(length=2, num_doors=2)
    env.reset(seed=0)
    first, second = right_doors(env)
    wrong = next(d for d in env.doors if d != first)
    start_key = env.state_key()
    obs, r, term, trunc, info = env.step(wrong)
    assert "Dead end" in obs and info["state_key"] != start_key and info["action_valid"]
    assert info["admissible_actions"] == ["back"]
    obs, r, term, trunc, info = env.step("BACK ")  # case and whitespace do not matter
    assert info["state_key"] == start_key and "Room 1" in obs
    env.step(first)
    obs, r, term, trunc, info = env.step(second)
    assert term and info["won"] and r == 10.0 and env.elapsed_steps == 4


@pytest.mark.parametrize("action", ["", "back", "open the door", "purple", None, 3])
def test_invalid_actions_change_nothing_but_count(action):
    env = CorridorEnv(length=3)
    _, info0 = env.reset(seed=2)
    obs, r, term, trunc, info = env.step(action)
    assert info["action_valid"] is False and r == 0.0 and not term
    assert info["state_key"] == info0["state_key"]
    assert env.elapsed_steps == 1
    obs, r, term, trunc, info = env.step(InvalidAction("no <action> tag found"))
    assert "no <action> tag" in obs and info["action_valid"] is False


def test_door_in_dead_end_is_invalid():
    env = CorridorEnv(length=3, num_doors=2)
    env.reset(seed=4)
    wrong = next(d for d in env.doors if d != right_doors(env)[0])
    _, _, _, _, info_dead = env.step(wrong)
    _, _, _, _, info = env.step(right_doors(env)[0])
    assert info["action_valid"] is False and info["state_key"] == info_dead["state_key"]


def test_truncation_at_the_cap_given():
    assert CorridorEnv(length=3).max_episode_steps is None  # the registry holds the default
    env = CorridorEnv(length=3, max_episode_steps=10)
    env.reset(seed=0)
    for _ in range(10):
        _, _, term, trunc, info = env.step("nothing")
        assert not term
    assert trunc and not info["won"]


def test_step_cost():
    env = CorridorEnv(length=1, step_cost=0.5)
    env.reset(seed=0)
    wrong = next(d for d in env.doors if d != right_doors(env)[0])
    assert env.step(wrong)[1] == -0.5
    env.step("back")
    assert env.step(right_doors(env)[0])[1] == 9.5


def test_same_seed_same_task_and_splits_disjoint():
    env = CorridorEnv(length=6)
    a = env.reset(seed=7)
    b = env.reset(seed=7)
    assert a == b
    c = env.reset(options={"task": 5, "split": "train"})[1]
    d = env.reset(options={"task": 5, "split": "test"})[1]
    assert c["task_id"] != d["task_id"] and c["state_key"] != d["state_key"]
    # the task id round-trips through options
    e = env.reset(options={"task": c["task_id"]})[1]
    assert e["state_key"] == c["state_key"]
    with pytest.raises(ValueError, match="unknown split"):
        env.reset(options={"split": "dev"})


def test_num_layouts_bounds_tasks():
    env = CorridorEnv(num_layouts=3)
    ids = {env.reset(seed=s)[1]["task_id"] for s in range(40)}
    assert ids <= {"corridor-train-0", "corridor-train-1", "corridor-train-2"} and len(ids) > 1


def test_state_key_independent_of_path():
    env = CorridorEnv(length=3, num_doors=3)
    env.reset(seed=11)
    right = right_doors(env)
    wrong = next(d for d in env.doors if d != right[0])
    env.step(right[0])
    direct = env.state_key()
    env.reset(seed=11)
    for a in (wrong, "back", "zzz", right[0]):
        env.step(a)
    assert env.state_key() == direct


def test_random_play_rarely_wins_optimal_always_does():
    """The env separates good policies from bad ones (what the trainer tests rely on)."""
    env = CorridorEnv(length=4, num_doors=3, max_episode_steps=12)  # the registered cap
    rng = np.random.default_rng(0)
    wins = 0
    for ep in range(300):
        _, info = env.reset(seed=ep)
        done = False
        while not done:
            _, _, term, trunc, info = env.step(rng.choice(info["admissible_actions"]))
            done = term or trunc
        wins += info["won"]
    assert wins / 300 < 0.5


def test_pickle_roundtrip_keeps_state():
    env = CorridorEnv(length=3)
    env.reset(seed=3)
    env.step(right_doors(env)[0])
    clone = pickle.loads(pickle.dumps(env))
    assert clone.state_key() == env.state_key()
    assert clone.step("back")[4]["action_valid"] == env.step("back")[4]["action_valid"]


def test_list_doors_off_keeps_hint_and_admissible():
    env = CorridorEnv(length=2, list_doors=False)
    obs, info = env.reset(seed=5)
    assert "Doors" not in obs and "Light comes through the" in obs
    assert info["admissible_actions"] == ["red", "blue", "green"]


def _prompts(split: str, episodes: int, history_length: int) -> tuple[set[str], set[str]]:
    """(every prompt, the first prompts) of random play (admissible and invalid actions) on the
    trainer preset's corridor, through the LLM wrapper."""
    from agentgym.envs.corridor import FAMILY
    from agentgym.wrappers.llm import make_llm_env

    env = make_llm_env(
        "AgentGym/Corridor-v0",
        fmt="plain",
        history_length=history_length,
        env_kwargs=FAMILY.trainer_defaults["env_kwargs"],
    )
    rng = np.random.default_rng(0)
    prompts, first = set(), set()
    for ep in range(episodes):
        obs, info = env.reset(seed=ep, options={"split": split})
        first.add(obs)
        done = False
        while not done:
            prompts.add(obs)
            choices = [*info["admissible_actions"], "purple", "back", "red"]
            obs, _, term, trunc, info = env.step(str(rng.choice(choices)))
            done = term or trunc
    return prompts, first


@pytest.mark.parametrize("history_length", [0, 2])
def test_preset_test_prompts_never_occur_in_training(history_length):
    """The trainer preset's held-out layouts are held out in text: no prompt of a test episode
    (whatever was played, invalid actions included) is a prompt of a train episode."""
    train, _ = _prompts("train", 150, history_length)
    test, first = _prompts("test", 150, history_length)
    assert train and test
    assert not train & test, sorted(train & test)[:3]
    if history_length == 0:
        # What the benchmarks README states: 2 first prompts (room 1's two held-out lights).
        assert len(first) == 2


def test_disjoint_splits_texts_and_layouts():
    # a built env has no cap of its own (the registry's is the only one): give it one, so the
    # random episodes below end
    env = CorridorEnv(
        length=3, num_doors=4, list_doors=False, disjoint_splits=True, max_episode_steps=10
    )
    train, test = env.split_texts("train"), env.split_texts("test")
    assert len(train) == len(test) == 18 and not train & test
    assert env.split_texts("valid") == test  # valid and test draw from the held-out half
    layouts = {s: {env.layout(i, s) for i in range(300)} for s in ("train", "test")}
    assert len(layouts["train"]) == len(layouts["test"]) == 8
    assert not layouts["train"] & layouts["test"]
    # Every door word is a right door somewhere in training (only the room is new).
    assert {d for lay in layouts["train"] for d in lay} == set(range(4))
    # Every observation a played test episode shows is one split_texts lists (up to the
    # invalid action's echo).
    rng = np.random.default_rng(1)
    for ep in range(40):
        obs, info = env.reset(seed=ep, options={"split": "test"})
        while True:
            invalid = obs.startswith("Invalid action")
            assert (obs.split(". ", 2)[-1] if invalid else obs) in test, obs
            obs, _, term, trunc, info = env.step(str(rng.choice(["red", "gold", "back", "zz"])))
            if term or trunc:
                break
    with pytest.raises(ValueError, match="needs hint=True"):
        CorridorEnv(hint=False, disjoint_splits=True)
    made = gym.make("AgentGym/Corridor-v0", num_doors=4, list_doors=False, disjoint_splits=True)
    check_env(made.unwrapped)
    # the option changes the task, so it is part of the snapshot identity
    env.reset(seed=0)
    with pytest.raises(SnapshotMismatch):
        CorridorEnv(length=3, num_doors=4, list_doors=False).restore(env.snapshot())
