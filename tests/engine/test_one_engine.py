"""Every path that plays episodes against a model plays them through the one engine.

The policy here records, on every call, which module asked it for a turn (the first caller
outside the policy classes). ``agentgym eval``, ``agentgym rollout`` and the trainer's rollouts
(flat, tree, stepwise, several envs, evaluation) must all be asked by
:mod:`agentgym.engine.runner` or :mod:`agentgym.engine.lockstep`, never by a loop of their own.
"""

from __future__ import annotations

import inspect
import json

import pytest

from agentgym.engine import Policy, PolicyOutput

ENGINE = {"agentgym.engine.runner", "agentgym.engine.lockstep"}


# Pass-through layers between a caller and the policy: the base class's batch defaults, the
# event loop, and the trainer's progress bar (which forwards each round as it is).
PASS_THROUGH = ("agentgym.engine.policies.base", "asyncio", "trainers.gigpo.console")


def caller_module() -> str:
    """The module of the first frame outside this file, the pass-through layers and any policy
    that wraps another (``agentgym eval``'s progress counter forwards each turn to the policy it
    wraps: the question is who asked the outermost policy)."""
    for frame in inspect.stack()[2:]:
        name = frame.frame.f_globals.get("__name__", "")
        if name == __name__ or name.startswith(PASS_THROUGH):
            continue
        owner = frame.frame.f_locals.get("self")
        if isinstance(owner, Policy) and isinstance(getattr(owner, "inner", None), Policy):
            continue  # a policy forwarding to the one it wraps
        return name
    return "?"


class WhoCalls(Policy):
    """Answers the first admissible action (in the plain format: the action itself), and
    records the module that asked for each turn."""

    plain_actions = True

    def __init__(self):
        self.callers: list[str] = []

    def _answer(self, info):
        action = ((info or {}).get("admissible_actions") or ["look"])[0]
        return PolicyOutput(action, token_ids=[1], logprobs=[0.0], prompt_ids=[0])

    async def act(self, messages, params, info=None):
        self.callers.append(caller_module())
        return self._answer(info)

    def generate(self, messages, params, infos=None):
        self.callers.append(caller_module())
        return [self._answer(i) for i in infos or [None] * len(messages)]


def test_eval_plays_through_the_engine(tmp_path, monkeypatch):
    import agentgym.engine.cli as eval_cli

    policy = WhoCalls()
    monkeypatch.setattr(eval_cli, "_build_policy", lambda args: policy)
    code = eval_cli.main(
        ["eval", "AgentGym/Corridor-v0", "--base-url", "http://127.0.0.1:9", "--tasks", "2",
         "--max-turns", "3", "--out-dir", str(tmp_path), "--quiet"]
    )  # fmt: skip
    assert code == 0
    episodes = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(episodes) == 2 and all(json.loads(e)["turns"] for e in episodes)
    assert policy.callers and set(policy.callers) <= ENGINE, set(policy.callers)


def test_rollout_plays_through_the_engine():
    from agentgym.rollout import run_group_rollout

    callers: list[str] = []

    def first_admissible(obs, infos, rng):
        callers.append(caller_module())
        return [(i.get("admissible_actions") or ["look"])[0] for i in infos]

    report = run_group_rollout("AgentGym/Corridor-v0", 2, 2, seed=0, policy=first_admissible)
    assert report.episodes == 4 and report.steps > 0
    # the function is called by the engine's policy wrapper, which the engine asked
    assert callers and set(callers) == {"agentgym.rollout"}


def test_rollout_command_asks_the_engine(monkeypatch):
    import agentgym.rollout as rollout

    asked: list[str] = []
    real = rollout.FunctionPolicy.generate

    def generate(self, messages, params, infos=None):
        asked.append(caller_module())
        return real(self, messages, params, infos)

    monkeypatch.setattr(rollout.FunctionPolicy, "generate", generate)
    rollout.run_group_rollout("AgentGym/Corridor-v0", 2, 2, seed=0)
    assert asked and set(asked) == {"agentgym.engine.lockstep"}


@pytest.mark.parametrize("rollout", ["flat", "tree", "stepwise", "several envs"])
def test_trainer_plays_through_the_engine(rollout, monkeypatch, tmp_path):
    import trainers.gigpo.train as train_module
    from trainers.gigpo.config import Config

    policy = WhoCalls()
    monkeypatch.setattr(train_module, "build_policy", lambda *args, **kwargs: policy)
    extra = {
        "flat": {},
        "tree": {"rollout": "tree", "branch_points": 1, "continuations": 2, "advantage": "slate"},
        "stepwise": {"rollout": "stepwise", "advantage": "slate", "judge": "rule"},
        "several envs": {"extra_envs": ["AgentGym/Sokoban-v0"], "num_groups": 2},
    }[rollout]
    config = Config.for_env(
        "AgentGym/Corridor-v0",
        **{
            "iterations": 1, "num_groups": 1, "group_size": 2, "eval_every": 1, "eval_groups": 2,
            "out_dir": str(tmp_path / "run"), "progress": False, "tensorboard": False,
            "plot": False, "quiet": True, "device": "cpu", "save_final": False,
            "checkpoint_every": 0, "max_steps": 3, **extra,
        },
    )  # fmt: skip
    history = train_module.train(config)
    assert any("rollout/success_rate" in r for r in history)
    assert any("eval/success_rate" in r for r in history)  # evaluation too
    assert policy.callers and set(policy.callers) <= ENGINE, set(policy.callers)
    assert "agentgym.engine.lockstep" in policy.callers
