"""Step caps: one cap in force (the registry entry's ``max_episode_steps``, or the one
``gym.make`` is given), enforced by the env itself, so a larger cap lets episodes run longer,
wherever agentgym builds envs for the caller, and a step after truncation changes nothing.

Episodes are played with an action no family understands: invalid steps change nothing and
never end an episode, so only the step cap can end it.
"""

from __future__ import annotations

import importlib

import gymnasium as gym
import numpy as np
import pytest

import agentgym
from agentgym.vector import GroupVectorEnv
from agentgym.vector.snapshot import restore_env

NONSENSE = "xyzzy plugh"
ids = pytest.mark.parametrize("env_id", agentgym.env_ids())


def steps_until_done(env: gym.Env, limit: int = 500) -> tuple[int, bool, bool]:
    """``(steps taken, terminated, truncated)`` playing :data:`NONSENSE` from ``reset(seed=0)``."""
    env.reset(seed=0)
    for n in range(1, limit + 1):
        _, _, terminated, truncated, info = env.step(NONSENSE)
        assert info["action_valid"] is False
        if terminated or truncated:
            return n, bool(terminated), bool(truncated)
    return limit, False, False


def registered_cap(env_id: str) -> int:
    cap = gym.spec(env_id).max_episode_steps
    assert isinstance(cap, int) and cap > 0, f"{env_id} registers no step cap"
    return cap


@ids
def test_default_cap_is_registered_reported_and_enforced_once(env_id, make):
    env = make(env_id)
    cap = registered_cap(env_id)
    assert env.spec.max_episode_steps == cap
    assert env.unwrapped.max_episode_steps == cap  # the env enforces the registry's cap
    assert not any(isinstance(w, gym.wrappers.TimeLimit) for w in _chain(env))  # and only it
    assert steps_until_done(env) == (cap, False, True)
    env.close()
    # The registry holds the only copy of the cap: the env class built directly has none.
    e = agentgym.entry(env_id)
    module, cls = e.entry_point.split(":")
    direct = getattr(importlib.import_module(module), cls)(**e.kwargs)
    assert direct.max_episode_steps is None
    direct.close()


def _chain(env: gym.Env) -> list[gym.Env]:
    chain = [env]
    while isinstance(chain[-1], gym.Wrapper):
        chain.append(chain[-1].env)
    return chain


@ids
def test_gym_make_cap_lengthens_and_shortens_episodes(env_id, make):
    make(env_id).close()  # real data located (or the id skipped) as for every registry test
    cap = registered_cap(env_id)
    for asked in (cap + 3, 2):
        env = gym.make(env_id, max_episode_steps=asked)
        assert env.spec.max_episode_steps == asked
        assert steps_until_done(env) == (asked, False, True)
        env.close()


@ids
def test_make_vec_cap_lengthens_episodes(env_id, make):
    make(env_id).close()
    asked = registered_cap(env_id) + 2
    venv = gym.make_vec(env_id, num_envs=2, max_episode_steps=asked)
    try:
        venv.reset(seed=0)
        for n in range(1, asked + 1):
            _, _, terminated, truncated, _ = venv.step([NONSENSE, NONSENSE])
            assert not terminated.any()
            assert truncated.all() == (n == asked), f"step {n}: truncated {truncated}"
    finally:
        venv.close()


def test_default_make_vec_keeps_the_registered_cap():
    venv = gym.make_vec("AgentGym/Corridor-v0", num_envs=1)
    try:
        assert venv.spec.max_episode_steps == 12
        venv.reset(seed=0)
        truncated = [bool(venv.step([NONSENSE])[3][0]) for _ in range(12)]
        assert truncated == [False] * 11 + [True]
    finally:
        venv.close()


@pytest.mark.parametrize("backend", ["inprocess", "process"])
def test_group_vector_env_cap_from_env_kwargs(backend):
    venv = GroupVectorEnv(
        "AgentGym/Sokoban-v0",
        num_groups=1,
        group_size=2,
        backend=backend,
        num_workers=1,
        env_kwargs={"max_episode_steps": 40},
    )
    try:
        venv.reset(seed=0)
        steps = 0
        while venv.active.any():
            venv.step([NONSENSE] * 2)
            steps += 1
        assert steps == 40
        assert all(t.truncated and len(t.steps) == 40 for t in venv.trajectories())
    finally:
        venv.close()


def test_a_restored_snapshot_counts_steps_from_where_it_was_taken():
    """The cap counts the steps since reset, across a GroupVectorEnv snapshot and restore."""
    venv = GroupVectorEnv(
        "AgentGym/Corridor-v0", num_groups=1, group_size=1, env_kwargs={"max_episode_steps": 20}
    )
    try:
        venv.reset(seed=0)
        for _ in range(15):
            venv.step([NONSENSE])
        snap = venv.snapshot(0)
        venv.reset(seed=1)
        venv.reset_to([snap])
        truncated = [bool(venv.step([NONSENSE])[3][0]) for _ in range(5)]
        assert truncated == [False] * 4 + [True]
    finally:
        venv.close()


def test_a_snapshot_does_not_carry_its_cap_into_an_env_with_another():
    """A snapshot taken under cap 40 restores into an env made with cap 15: the step count comes
    along (episode state), the cap stays the target env's own (configuration)."""
    source = GroupVectorEnv(
        "AgentGym/Corridor-v0", num_groups=1, group_size=1, env_kwargs={"max_episode_steps": 40}
    )
    target = GroupVectorEnv(
        "AgentGym/Corridor-v0", num_groups=1, group_size=1, env_kwargs={"max_episode_steps": 15}
    )
    try:
        source.reset(seed=0)
        for _ in range(10):
            source.step([NONSENSE])
        snap = source.snapshot(0)
        target.reset(seed=1)
        target.reset_to([snap])
        truncated = [bool(target.step([NONSENSE])[3][0]) for _ in range(5)]
        assert truncated == [False] * 4 + [True]  # steps 11..15 of a 15-step cap
    finally:
        source.close()
        target.close()


def test_cap_as_env_argument_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"max_episode_steps=8\)"):
        gym.make("AgentGym/SearchQA-Synthetic-v0", max_turns=8)


def test_trainer_max_episode_steps_reaches_the_envs():
    pytest.importorskip("torch")
    from trainers.gigpo.config import Config
    from trainers.gigpo.train import _env_kwargs

    kwargs = _env_kwargs(Config(env="AgentGym/Corridor-v0", max_episode_steps=30))
    venv = GroupVectorEnv("AgentGym/Corridor-v0", num_groups=1, group_size=1, env_kwargs=kwargs)
    try:
        venv.reset(seed=0)
        steps = 0
        while venv.active.any():
            venv.step([NONSENSE])
            steps += 1
        assert steps == 30  # longer than the registered 12
    finally:
        venv.close()


def test_served_env_takes_the_cap_from_env_kwargs():
    pytest.importorskip("openenv", reason="openenv-core not installed")
    from agentgym.integrations.openenv import AgentGymAction, ServedEnvironment

    served = ServedEnvironment("AgentGym/Corridor-v0", env_kwargs={"max_episode_steps": 25})
    try:
        served.reset(seed=0)
        done = [served.step(AgentGymAction(text=NONSENSE)).done for _ in range(25)]
        assert done == [False] * 24 + [True]
    finally:
        served.close()


def test_llm_envs_of_the_adapters_take_the_cap():
    """verl's agent loop and the LLM-facing wrappers build envs with make_llm_env."""
    from agentgym.wrappers.llm import make_llm_env

    env = make_llm_env("AgentGym/Corridor-v0", env_kwargs={"max_episode_steps": 18}, fmt="plain")
    assert steps_until_done(env) == (18, False, True)
    env.close()


def test_trl_environment_takes_the_cap():
    pytest.importorskip("trl")
    from agentgym.integrations.trl import AgentGymEnvironment

    env = AgentGymEnvironment("AgentGym/Corridor-v0", {"max_episode_steps": 16})
    env.reset(seed=0)
    for _ in range(16):
        env.act(NONSENSE)
    traj = env.trajectory
    assert traj.truncated and len(traj.steps) == 16
    assert np.isclose(env.get_reward(), traj.total_return)


def test_the_spec_of_a_made_env_makes_it_again_with_its_cap():
    env = gym.make("AgentGym/Corridor-v0", max_episode_steps=7)
    again = gym.make(env.spec)
    assert again.spec.max_episode_steps == 7 and again.unwrapped.max_episode_steps == 7
    assert steps_until_done(again) == (7, False, True)


def test_step_cap_around_an_env_gym_make_did_not_make_keeps_its_cap():
    from agentgym.core import StepCap
    from agentgym.envs.corridor import CorridorEnv

    env = StepCap(CorridorEnv(max_episode_steps=5))
    assert env.max_episode_steps == env.unwrapped.max_episode_steps == 5
    assert steps_until_done(env) == (5, False, True) and env.elapsed_steps == 5


def usable_action(info: dict) -> str:
    """An action the family applies from this state (a listed or suggested one)."""
    for key in ("admissible_actions", "suggested_actions"):
        for action in info.get(key) or ():
            if not str(action).startswith("answer["):  # an answer would end the episode
                return str(action)
    raise AssertionError(f"no usable action listed in {sorted(info)}")


def assert_step_after_end_is_a_noop(env: gym.Env, flags: tuple[bool, bool]) -> None:
    """The env's episode has just ended with ``flags``: a step with an action it would apply
    returns the last observation, reward 0, ``action_valid=False``, the same flags, and leaves
    the state as it was (checked twice: stepping a finished episode never resumes it)."""
    last_obs, last_info = env.unwrapped._last_obs, env.unwrapped._last_info
    action = usable_action(last_info)
    for _ in range(2):
        obs, reward, terminated, truncated, info = env.step(action)
        assert (terminated, truncated) == flags
        assert obs == last_obs and reward == 0.0 and info["action_valid"] is False
        assert info["state_key"] == last_info["state_key"] and info["won"] == last_info["won"]


@ids
def test_a_step_after_truncation_changes_nothing(env_id, make):
    """The registered cap (gym.make) and one given to gym.make both end the episode for good."""
    env = make(env_id)
    assert steps_until_done(env) == (registered_cap(env_id), False, True)
    assert_step_after_end_is_a_noop(env, (False, True))
    env.close()
    env = gym.make(env_id, max_episode_steps=2)
    env.reset(seed=0)
    env.step(usable_action(env.unwrapped._last_info))  # a usable action does not end it early
    _, _, terminated, truncated, _ = env.step(NONSENSE)
    assert (terminated, truncated) == (False, True)
    assert_step_after_end_is_a_noop(env, (False, True))
    env.close()


@ids
def test_a_truncated_snapshot_restores_truncated(env_id, make):
    """A GroupVectorEnv snapshot of a truncated episode, restored into a gym.make env of the
    id, is still over (the env holds the step count and the done flags, not a wrapper)."""
    make(env_id).close()
    source = GroupVectorEnv(env_id, num_groups=1, group_size=1, env_kwargs={"max_episode_steps": 2})
    try:
        source.reset(seed=0)
        for _ in range(2):
            source.step([NONSENSE])
        assert not source.active.any() and source.trajectories()[0].truncated
        snap = source.snapshot(0)
    finally:
        source.close()
    for cap in (2, 10):  # a longer cap in the target does not revive the episode
        target = gym.make(env_id, max_episode_steps=cap)
        target.reset(seed=1)
        restore_env(target, snap)
        assert target.unwrapped.elapsed_steps == 2
        assert_step_after_end_is_a_noop(target, (False, True))
        target.close()


# -- one name: max_episode_steps; the old ones still work for one release, with a warning ------
def test_trainer_takes_max_episode_steps_and_its_old_name(capsys):
    pytest.importorskip("torch")
    from trainers.gigpo.config import Config, parse_args

    config = parse_args(["--env", "AgentGym/Corridor-v0", "--max-episode-steps", "30"])
    assert config.max_episode_steps == 30 and capsys.readouterr().err.count("deprecated") == 0
    config = parse_args(["--env", "AgentGym/Corridor-v0", "--max-steps", "31"])
    err = capsys.readouterr().err.strip().splitlines()
    assert config.max_episode_steps == 31
    assert [line for line in err if "deprecated" in line] == [
        "python -m trainers.gigpo.train: warning: --max-steps is deprecated: use "
        "--max-episode-steps"
    ]
    with pytest.warns(DeprecationWarning, match="max_episode_steps"):
        old = Config(env="AgentGym/Corridor-v0", max_steps=7)
    assert old.max_episode_steps == 7
    with pytest.warns(DeprecationWarning, match="max_episode_steps"):
        assert old.max_steps == 7
    with pytest.warns(DeprecationWarning, match="max_episode_steps"):
        assert Config.for_env("AgentGym/Corridor-v0", max_steps=9).max_episode_steps == 9


def _subcommand(add_parser, argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser(prog="agentgym")
    add_parser(parser.add_subparsers())
    return parser.parse_args(argv)


def test_eval_takes_max_episode_steps_and_its_old_name(capsys):
    from agentgym.engine.cli import add_parser

    url = ["--base-url", "http://127.0.0.1:9"]
    args = _subcommand(add_parser, ["eval", "Corridor-v0", *url, "--max-episode-steps", "5"])
    assert args.max_episode_steps == 5 and "deprecated" not in capsys.readouterr().err
    args = _subcommand(add_parser, ["eval", "Corridor-v0", *url, "--max-turns", "6"])
    assert args.max_episode_steps == 6
    err = capsys.readouterr().err.strip()
    assert err == "agentgym eval: warning: --max-turns is deprecated: use --max-episode-steps"
    assert "--max-turns" not in _help(add_parser, "eval")


def test_serve_takes_max_episode_steps():
    from agentgym.integrations.openenv_cli import _with_cap, add_parser

    args = _subcommand(add_parser, ["serve", "Corridor-v0", "--max-episode-steps", "25"])
    assert args.max_episode_steps == 25
    assert _with_cap(args.env_kwargs, args.max_episode_steps) == {"max_episode_steps": 25}
    assert _with_cap({"length": 3, "max_episode_steps": 9}, 25) == {
        "length": 3,
        "max_episode_steps": 25,
    }
    assert _with_cap({"length": 3}, None) == {"length": 3}


def _help(add_parser, command: str) -> str:
    import argparse

    parser = argparse.ArgumentParser(prog="agentgym")
    sub = parser.add_subparsers()
    add_parser(sub)
    return sub.choices[command].format_help()
