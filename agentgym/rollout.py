"""Group rollouts with a simple policy, and the statistics the CLI and benchmarks report.

``run_group_rollout`` is the main job of the README's quick start: it plays one episode in every
env of a :class:`~agentgym.vector.GroupVectorEnv` through the engine's lockstep rounds
(:mod:`agentgym.engine.lockstep`, the trainer's too), and summarises success, return, throughput and how often trajectories of a group meet in
the same canonical state (what makes GiGPO's step-level groups non-trivial).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from agentgym.engine.lockstep import play_episodes
from agentgym.engine.policies import Policy as EnginePolicy
from agentgym.engine.policies import PolicyOutput, SamplingParams
from agentgym.engine.policies.base import Infos, Messages
from agentgym.vector import GroupVectorEnv, Trajectory

__all__ = [
    "FunctionPolicy",
    "RolloutReport",
    "StateGroupStats",
    "random_policy",
    "run_group_rollout",
    "state_group_stats",
]

Policy = Callable[[list[str], list[dict[str, Any]], np.random.Generator], list[str]]


def random_policy(
    obs: list[str], infos: list[dict[str, Any]], rng: np.random.Generator
) -> list[str]:
    """Uniform over each env's ``info["suggested_actions"]``, else its ``admissible_actions``.

    Families with free-text actions suggest concrete ones: SearchQA lists no admissible actions
    and suggests searches for the question's entities and answers from the titles retrieved so
    far; WebShop's admissible list holds the placeholder ``search[<your query>]`` and its
    suggestions replace it with searches from the instruction. Envs with neither get ``"look"``.
    """
    actions = []
    for info in infos:
        choices = info.get("suggested_actions") or info.get("admissible_actions") or ["look"]
        actions.append(choices[int(rng.integers(len(choices)))])
    return actions


class FunctionPolicy(EnginePolicy):
    """A :data:`Policy` function (no model) as an engine policy.

    With ``venv`` (the group vector env the engine's lockstep rounds play), the function is
    called each round as a vector policy is: with every env's observation and info in env order
    (a finished env: an empty observation and its last info), and its answers for finished envs
    are dropped. So a policy that keeps state per env slot (the scripted SearchQA policy) and the
    random draws of a seed are the same as when the function steps the vector env itself.
    Without ``venv`` it gets only the running envs' turns."""

    def __init__(self, fn: Policy, rng: np.random.Generator, venv: GroupVectorEnv | None = None):
        self.fn, self.rng, self.venv = fn, rng, venv

    def generate(
        self, messages: Sequence[Messages], params: SamplingParams, infos: Infos = None
    ) -> list[PolicyOutput]:
        obs = [m[-1]["content"] for m in messages]
        infos = [i or {} for i in (infos or [None] * len(obs))]
        live = None if self.venv is None else np.flatnonzero(self.venv.active)
        if live is not None and len(live) == len(obs):
            every_obs = [""] * len(self.venv.infos_list)
            every_info = list(self.venv.infos_list)
            for k, i in enumerate(live):
                every_obs[i], every_info[i] = obs[k], infos[k]
            actions = self.fn(every_obs, every_info, self.rng)
            return [PolicyOutput(actions[i]) for i in live]
        return [PolicyOutput(a) for a in self.fn(obs, infos, self.rng)]

    async def act(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        info: dict[str, Any] | None = None,
    ) -> PolicyOutput:
        return self.generate([messages], params, [info])[0]


@dataclass
class StateGroupStats:
    """How the steps of a batch fall into GiGPO step groups (same group, same anchor state)."""

    num_steps: int
    num_step_groups: int
    shared_fraction: float
    """fraction of steps whose anchor state is also visited by ANOTHER trajectory of the group"""
    singleton_fraction: float
    """fraction of step groups with a single step"""
    mean_group_size: float
    max_group_size: int


def state_group_stats(trajectories: Sequence[Trajectory]) -> StateGroupStats:
    """Step-group statistics over trajectories (keys are ``(group_id, anchor state_key)``)."""
    sizes: Counter = Counter()
    trajs_per_key: dict[tuple, set[int]] = {}
    for traj in trajectories:
        for step in traj.steps:
            key = (traj.group_id, step.state_key)
            sizes[key] += 1
            trajs_per_key.setdefault(key, set()).add(traj.traj_id)
    n = sum(sizes.values())
    if n == 0:
        return StateGroupStats(0, 0, 0.0, 0.0, 0.0, 0)
    shared = sum(sizes[k] for k, t in trajs_per_key.items() if len(t) > 1)
    counts = np.fromiter(sizes.values(), dtype=np.int64)
    return StateGroupStats(
        num_steps=n,
        num_step_groups=len(sizes),
        shared_fraction=shared / n,
        singleton_fraction=float(np.mean(counts == 1)),
        mean_group_size=float(counts.mean()),
        max_group_size=int(counts.max()),
    )


@dataclass
class RolloutReport:
    env_id: str
    num_groups: int
    group_size: int
    episodes: int
    success_rate: float
    mean_return: float
    mean_length: float
    invalid_fraction: float
    steps: int
    seconds: float
    steps_per_second: float
    state_groups: StateGroupStats

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_group_rollout(
    env_id: str,
    num_groups: int = 4,
    group_size: int = 8,
    seed: int | None = 0,
    policy: Policy = random_policy,
    backend: str = "inprocess",
    env_kwargs: dict[str, Any] | None = None,
    vec: GroupVectorEnv | None = None,
    reset_options: dict[str, Any] | None = None,
) -> RolloutReport:
    """One episode in each of ``num_groups x group_size`` envs; returns the summary.

    ``policy(observations, infos, rng)`` answers each round with one action per env, in env
    order, as a vector policy does; the answers for envs that already finished are ignored.

    Pass ``vec`` to reuse a built vector env (its shape then overrides num_groups/group_size).
    ``reset_options`` go to every env's reset (e.g. ``{"split": "valid"}``).
    """
    own = vec is None
    if vec is None:
        vec = GroupVectorEnv(env_id, num_groups, group_size, backend=backend, env_kwargs=env_kwargs)
    player = FunctionPolicy(policy, np.random.default_rng(seed), vec)
    try:
        start = time.perf_counter()
        play_episodes([vec], player, SamplingParams(), seeds=[seed], options=[reset_options])
        seconds = time.perf_counter() - start
        trajs = vec.trajectories()
        steps = sum(len(t.steps) for t in trajs)
    finally:
        if own:
            vec.close()
    lengths = np.array([len(t.steps) for t in trajs])
    invalid = sum(not s.action_valid for t in trajs for s in t.steps)
    return RolloutReport(
        env_id=env_id,
        num_groups=vec.num_groups,
        group_size=vec.group_size,
        episodes=len(trajs),
        success_rate=float(np.mean([t.won for t in trajs])),
        mean_return=float(np.mean([t.total_return for t in trajs])),
        mean_length=float(lengths.mean()),
        invalid_fraction=invalid / max(steps, 1),
        steps=steps,
        seconds=seconds,
        steps_per_second=steps / seconds if seconds > 0 else float("inf"),
        state_groups=state_group_stats(trajs),
    )
