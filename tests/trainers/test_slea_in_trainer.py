"""SLEA-RL in the reference trainer: its experience library reaches the prompts and evolves from
the rollouts (``--advantage slea_rl``); the real tiny model and real envs, nothing mocked."""

from __future__ import annotations

import pytest

from agentgym.algorithms.slea_library import ExperienceLibrary
from trainers.gigpo.config import Config, ConfigError
from trainers.gigpo.train import make_run_envs, train

CORRIDOR = "AgentGym/Corridor-v0"


def corridor(tmp_path, **overrides) -> Config:
    base = dict(
        out_dir=str(tmp_path / "run"), progress=False, tensorboard=False, plot=False, quiet=True
    )
    return Config.for_env(CORRIDOR, **{**base, "advantage": "slea_rl", **overrides})


def test_the_experiences_of_a_state_start_its_prompts(tmp_path):
    """An experience stored at a state is put before the prompt of every env standing there,
    and only there: the same library object serves every env of the run."""
    config = corridor(tmp_path, num_groups=1, group_size=2)
    library = ExperienceLibrary(warmup_updates=0, min_library_size=1, fallback=False)
    venv = make_run_envs(config, 1, 2, evaluation=False, library=library)
    try:
        obs, infos = venv.reset(seed=0)
        assert not any(o.startswith("[Tips:") for o in obs)  # nothing stored yet
        start = infos[0]["state_key"]
        library.admit("red then blue", "golden", "method", 1.0, start)
        obs, infos = venv.reset(seed=0)  # the same layout: the same start state
        assert all(o.startswith("[Tips: red then blue]") for o in obs), obs
        assert all(info["experience_uids"] for info in infos)
    finally:
        venv.close()


def test_slea_rl_trains_and_its_library_evolves_from_the_rollouts(tmp_path):
    history = train(corridor(tmp_path, num_groups=2, group_size=2, iterations=2, eval_every=0))
    rows = [r for r in history if "rollout/success_rate" in r]
    assert len(rows) == 2
    # Every rollout is read: each failure yields warnings, each success strategies.
    for row in rows:
        assert row["slea/successes"] + row["slea/failures"] == 4
        assert row["slea/warnings_added"] + row["slea/strategies_added"] >= 1
    assert rows[1]["slea/experiences"] >= rows[0]["slea/experiences"] > 0


def test_the_library_needs_the_trainers_process(tmp_path):
    config = corridor(tmp_path, env_backend="process")
    with pytest.raises(ConfigError, match="env_backend inprocess"):
        config.validate()
    corridor(
        tmp_path, env_backend="process", experience_library=False
    ).validate()  # the advantage alone
