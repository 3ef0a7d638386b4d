"""Several envs in one run (``--env A --env B``): groups per env, advantages within each env."""

from __future__ import annotations

import random

import numpy as np
import pytest

from agentgym.engine import Policy, PolicyOutput, SamplingParams
from trainers.gigpo.advantage import compute_advantage
from trainers.gigpo.config import Config, ConfigError, parse_args
from trainers.gigpo.multienv import (
    MixedEnvs,
    advantages_per_env,
    collect_mixed,
    env_configs,
    split_groups,
)
from trainers.gigpo.rollout import make_group_env
from trainers.gigpo.train import train

CORRIDOR, SOKOBAN = "AgentGym/Corridor-v0", "AgentGym/Sokoban-v0"


class RandomAdmissible(Policy):
    """Picks a random admissible action (no model: these tests are about the envs' rows)."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    async def act(self, messages, params, info=None):
        return self.generate([messages], params, [info])[0]

    def generate(self, messages, params, infos=None):
        return [
            PolicyOutput(
                self.rng.choice(info["admissible_actions"]),
                token_ids=[1],
                logprobs=[0.0],
                prompt_ids=[0],
            )
            for info in infos
        ]


def test_split_groups():
    assert split_groups(8, [1, 1]) == [4, 4]
    assert split_groups(8, [3, 1]) == [6, 2]
    assert split_groups(3, [1, 1, 1]) == [1, 1, 1]
    assert split_groups(5, [100, 1]) == [4, 1]  # every env keeps a group
    assert sum(split_groups(7, [0.2, 0.5, 0.3])) == 7
    with pytest.raises(ValueError):
        split_groups(1, [1, 1])


def test_command_line_takes_repeated_env_and_weights(tmp_path):
    config = parse_args(
        ["--env", CORRIDOR, "--env", SOKOBAN, "--env-weight", "3", "--env-weight", "1",
         "--out-dir", str(tmp_path / "r")]
    )  # fmt: skip
    assert (config.env, config.extra_envs, config.env_weights) == (CORRIDOR, [SOKOBAN], [3.0, 1.0])
    config.validate(cli=True)
    # The extra env runs with its own preset's env settings, the first with the config's.
    corridor, sokoban = env_configs(config)
    assert corridor.env_kwargs == {
        "length": 3,
        "num_doors": 4,
        "list_doors": False,
        "disjoint_splits": True,
    }
    assert (sokoban.env, sokoban.env_kwargs, sokoban.fmt) == (SOKOBAN, {}, None)
    bad = Config.for_env(CORRIDOR, extra_envs=[SOKOBAN], env_weights=[1.0])
    with pytest.raises(ConfigError, match="one positive weight per env"):
        bad.validate()
    with pytest.raises(ConfigError, match="twice"):
        Config.for_env(CORRIDOR, extra_envs=[CORRIDOR]).validate()
    with pytest.raises(ConfigError, match="flat"):
        Config.for_env(CORRIDOR, extra_envs=[SOKOBAN], advantage="cw_grpo").validate()
    # HiPER's segment starts are read per trajectory, which the per-env row split does not carry
    with pytest.raises(ConfigError, match="subgoal segments"):
        Config.for_env(CORRIDOR, extra_envs=[SOKOBAN], advantage="hiper").validate()


def mixed(weights=(2, 1), group_size=3) -> MixedEnvs:
    counts = split_groups(3, list(weights))
    kwargs = {CORRIDOR: {"length": 2, "max_episode_steps": 5}, SOKOBAN: {"max_episode_steps": 4}}
    venvs = [
        make_group_env(
            e,
            num_groups=n,
            group_size=group_size,
            fmt="plain",
            template="actions",
            env_kwargs=kwargs[e],
        )  # fmt: skip
        for e, n in zip((CORRIDOR, SOKOBAN), counts, strict=True)
    ]
    return MixedEnvs([CORRIDOR, SOKOBAN], venvs, [{"split": "train"}, None])


def test_each_group_is_one_env_and_advantages_stay_within_env():
    envs = mixed()
    batch = collect_mixed(envs, RandomAdmissible(), SamplingParams(), seed=5)
    envs.close()
    assert set(batch.env_ids.tolist()) == {0, 1}
    for g in np.unique(batch.group_ids):  # a group's rows all come from one env
        assert len(set(batch.env_ids[batch.group_ids == g].tolist())) == 1
    assert len(np.unique(batch.group_ids)) == 3
    assert len(np.unique(batch.traj_ids)) == 9  # 3 groups x 3 trajectories, ids unique
    families = {t.steps[0].info["task_type"] for t, k in
                zip(batch.trajectories, batch.traj_env_ids, strict=True) if k == 0}  # fmt: skip
    assert families == {"corridor"}

    def gigpo(b):
        return compute_advantage(
            "gigpo", group_ids=b.group_ids, traj_ids=b.traj_ids, step_ids=b.step_ids,
            rewards=b.rewards, state_keys=b.state_keys, invalid=b.invalid,
        )  # fmt: skip

    per_env, stats = advantages_per_env(batch, gigpo)
    assert any(k.endswith("#0") for k in stats) and any(k.endswith("#1") for k in stats)
    # An env's advantages do not move when the other env's rewards change.
    changed = batch
    changed.rewards = batch.rewards.copy()
    sokoban_rows = batch.env_ids == 1
    changed.rewards[sokoban_rows] += 100.0
    again, _ = advantages_per_env(changed, gigpo)
    np.testing.assert_allclose(again[~sokoban_rows], per_env[~sokoban_rows])
    assert np.abs(per_env).sum() > 0


def test_train_two_envs_reports_each(tmp_path):
    config = Config.for_env(
        CORRIDOR,
        extra_envs=[SOKOBAN],
        env_weights=[2.0, 1.0],
        policy="scored",
        num_groups=3,
        group_size=2,
        iterations=2,
        eval_every=2,
        eval_groups=2,
        max_episode_steps=3,
        out_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
        plot=False,
        quiet=True,
    )
    history = train(config)
    rollouts = [r for r in history if "rollout/success_rate" in r]
    evals = [r for r in history if "eval/success_rate" in r]
    assert len(rollouts) == 2 and evals
    for r in rollouts:
        for env in ("Corridor-v0", "Sokoban-v0"):
            assert f"rollout/success_rate/{env}" in r
            assert f"rollout/return/{env}" in r
            assert r[f"rollout/invalid_rate/{env}"] == 0.0  # scored actions are admissible
        assert r["samples"] % 6 == 0
    for r in evals:
        assert "eval/success_rate/Corridor-v0" in r and "eval/success_rate/Sokoban-v0" in r
