"""Lockstep rounds over group envs: every live episode's turn generated in one batch, then every
env stepped.

This is the engine's synchronous mode, for callers that own their envs as
:class:`~agentgym.vector.GroupVectorEnv` s (the bundled trainer, ``agentgym rollout``): a round
renders nothing itself (the envs' LLM wrappers return rendered prompts as observations), asks
the policy for all running episodes at once (:meth:`~agentgym.engine.policies.Policy.generate`,
one batched forward for an in-process model), tags each answer with the policy version in force
when the round was sent, and steps every env with its answer. Branching (snapshots,
``GroupVectorEnv.branch``) stays with the caller, between rounds.

Example (a random-admissible policy on two Sokoban groups)::

    from agentgym.engine.lockstep import play_episodes
    from agentgym.engine.policies import SamplingParams
    from agentgym.vector import GroupVectorEnv

    venv = GroupVectorEnv("AgentGym/Sokoban-v0", num_groups=2, group_size=2)
    outputs, timings = play_episodes([venv], policy, SamplingParams(), seeds=[0])
    # outputs[0][i]: env i's PolicyOutput per step, aligned with venv.trajectories()[i].steps
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentgym.core import InvalidAction
from agentgym.engine.policies.base import Policy, PolicyOutput, SamplingParams

__all__ = ["play_episodes", "play_round"]


def play_round(
    venvs: Sequence[Any],
    policy: Policy,
    params: SamplingParams,
    obs: list[list[str]],
    timings: dict[str, float],
    *,
    policy_version: int | str | None = None,
) -> list[dict[int, PolicyOutput]]:
    """One lockstep round over every running env of every venv in ``venvs``.

    Args:
        venvs: group vector envs (``GroupVectorEnv`` or any with ``active``, ``infos_list``,
            ``step`` and ``num_envs``) whose envs return rendered prompts.
        obs: ``obs[k][i]``: the current prompt of env i of venv k; replaced by the new ones.
        timings: ``"generate"`` and ``"env"`` seconds are added to it.
        policy_version: tagged on every answer (the version in force when the round is sent).

    Returns:
        per venv, ``{env index: PolicyOutput}`` for the envs that played this round.
    """
    where: list[tuple[int, int]] = []
    messages: list[list[dict[str, str]]] = []
    infos: list[dict[str, Any]] = []
    for k, venv in enumerate(venvs):
        live = np.flatnonzero(venv.active)
        if not live.size:
            continue
        latest = venv.infos_list
        for i in live:
            where.append((k, int(i)))
            messages.append([{"role": "user", "content": obs[k][i]}])
            infos.append(latest[i])
    t0 = time.perf_counter()
    outputs = policy.generate(messages, params, infos)
    timings["generate"] = timings.get("generate", 0.0) + time.perf_counter() - t0
    played: list[dict[int, PolicyOutput]] = [{} for _ in venvs]
    actions: list[list[Any]] = [[""] * venv.num_envs for venv in venvs]
    for (k, i), out in zip(where, outputs, strict=True):
        out.policy_version = policy_version
        played[k][i] = out
        actions[k][i] = (
            out.text
            if out.error is None
            else InvalidAction(f"No response from the model: {out.error}")
        )
    t0 = time.perf_counter()
    for k, venv in enumerate(venvs):
        if played[k]:
            obs[k] = list(venv.step(actions[k])[0])
    timings["env"] = timings.get("env", 0.0) + time.perf_counter() - t0
    return played


def play_episodes(
    venvs: Sequence[Any],
    policy: Policy,
    params: SamplingParams,
    *,
    seeds: Sequence[int | None],
    options: Sequence[dict[str, Any] | None] | None = None,
    policy_version: int | str | None = None,
) -> tuple[list[list[list[PolicyOutput]]], dict[str, float]]:
    """Reset every venv (``seeds[k]``, ``options[k]``) and play one episode in each of its envs,
    round after round, until none is running (an env's own termination or step cap ends it).

    Returns ``(outputs, timings)``: ``outputs[k][i]`` the answers env i of venv k stepped with,
    one per step of its trajectory; ``timings`` the seconds in ``"generate"`` and ``"env"``.
    """
    options = list(options) if options is not None else [None] * len(venvs)
    timings = {"generate": 0.0, "env": 0.0}
    t0 = time.perf_counter()
    obs = [
        list(v.reset(seed=s, options=o)[0]) for v, s, o in zip(venvs, seeds, options, strict=True)
    ]
    timings["env"] += time.perf_counter() - t0
    outputs: list[list[list[PolicyOutput]]] = [[[] for _ in range(v.num_envs)] for v in venvs]
    while any(v.active.any() for v in venvs):
        played = play_round(venvs, policy, params, obs, timings, policy_version=policy_version)
        for k, answers in enumerate(played):
            for i, out in answers.items():
                outputs[k][i].append(out)
    return outputs, timings
