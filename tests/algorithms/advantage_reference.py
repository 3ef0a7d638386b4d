"""Slow reference for the advantage estimators, written straight from the paper's equations.

This module exists to check :mod:`agentgym.algorithms.advantage` (the tests compare the two on
random batches) and to give the benchmark its baseline. It uses plain Python loops, lists and dicts on
purpose: every quantity is computed the way the GiGPO paper (arXiv 2505.10978) writes it, one
trajectory, one group, one row at a time, with no grouping tricks that could share a bug with the
fast version. Do not use it for training.

The conventions it encodes, from the paper and its reference implementation (verl-agent,
``gigpo/core_gigpo.py`` and ``verl/trainer/ppo/ray_trainer.py``):

* discounted return of step t of a trajectory, Eq. 5: ``R_t = r_t + gamma * R_{t+1}``, ``R_T = 0``;
* episode return ``R(tau) = sum_t r_t`` (undiscounted), the outcome every step row of the
  trajectory carries;
* the invalid-action penalty is subtracted from the penalised row's episode score and from its
  discounted return (it is not discounted back into earlier steps);
* episode advantage, Eq. 3: the row's episode score minus the mean of its group (``mean_norm``),
  or that divided by the group's sample std (n - 1) + epsilon (``mean_std_norm``). The statistics
  are over one value per trajectory (its first step's score) or over all step rows of the group.
  A group holding a single value has mean 0 and std 1 (verl's convention);
* step groups, Eq. 6: rows of the same group whose anchor ``state_key`` is equal; step advantage,
  Eq. 7: the row's penalised discounted return normalised within its step group; a group of one
  gets 0;
* Eq. 8: ``A = A_episode + omega * A_step`` (GiGPO); ``A = A_episode`` (GRPO).

CW-GRPO (arXiv 2604.14267, conventions of the authors' ``compute_cw_grpo_advantage``): with
``A_i`` the penalty-free GRPO advantage and R_i = T_i - 1 rounds before the answer round, those
rounds get ``R_i * w_t * A_i`` and the answer round ``A_i`` (each less its own penalty);
``w_t = c_t / max(sum_s c_s, 1e-6)`` over the rounds before the answer (gamma = inf) or
``softmax(gamma * c)`` over them (finite gamma), and ``w_t = 1 / R_i`` whenever ``A_i < 0``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Sample mean and unbiased (n - 1) standard deviation of ``values`` (at least two)."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var)


def reference_advantage(
    name: str,
    *,
    group_ids: Sequence[int],
    traj_ids: Sequence[int],
    step_ids: Sequence[int],
    rewards: Sequence[float],
    state_keys: Sequence[Hashable] | None,
    invalid: Sequence[bool],
    gamma: float = 0.95,
    omega: float = 1.0,
    norm: str = "mean_norm",
    invalid_penalty: float = 0.1,
    episode_stats_over: str = "trajectories",
    epsilon: float = 1e-6,
    branch_ids: Sequence[int] | None = None,
    contributions: Sequence[float] | None = None,
    contribution_gamma: float = math.inf,
) -> dict[str, list[float]]:
    """Loop implementation of ``compute_advantage``; same arguments, one row per (trajectory, step).

    Returns a dict of lists of length N: ``advantages``, ``returns``, ``episode_advantage``,
    ``step_advantage``, and ``step_group_sizes`` (the size of every step group, any order).
    """
    if name not in ("grpo", "gigpo", "rloo", "slate", "cw_grpo"):
        raise ValueError(f"unknown estimator {name!r}")
    n = len(rewards)
    penalty = [invalid_penalty if bool(invalid[i]) else 0.0 for i in range(n)]

    # Trajectories, keyed by (group, trajectory), rows in step order.
    trajectories: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i in range(n):
        trajectories.setdefault((int(group_ids[i]), int(traj_ids[i])), []).append(
            (int(step_ids[i]), i)
        )
    for rows in trajectories.values():
        rows.sort()

    # Discounted returns, Eq. 5, computed backwards through each trajectory.
    returns = [0.0] * n
    episode_return: dict[tuple[int, int], float] = {}
    for key, rows in trajectories.items():
        running = 0.0
        for _, i in reversed(rows):
            running = float(rewards[i]) + gamma * running
            returns[i] = running
        episode_return[key] = sum(float(rewards[i]) for _, i in rows)

    # Per-row episode score: the trajectory's outcome, less this step's invalid-action penalty.
    score = [episode_return[(int(group_ids[i]), int(traj_ids[i]))] - penalty[i] for i in range(n)]

    # Episode-level group statistics (Eq. 3).
    group_values: dict[int, list[float]] = {}
    if episode_stats_over == "steps":
        for i in range(n):
            group_values.setdefault(int(group_ids[i]), []).append(score[i])
    elif episode_stats_over == "trajectories":
        for (g, _), rows in trajectories.items():
            first_row = rows[0][1]
            group_values.setdefault(g, []).append(score[first_row])
    else:
        raise ValueError(f"unknown episode_stats_over {episode_stats_over!r}")
    group_stats: dict[int, tuple[float, float]] = {}
    for g, values in group_values.items():
        group_stats[g] = (0.0, 1.0) if len(values) == 1 else _mean_std(values)

    episode_advantage = [0.0] * n
    for i in range(n):
        mean, std = group_stats[int(group_ids[i])]
        if norm == "mean_norm":
            episode_advantage[i] = score[i] - mean
        elif norm == "mean_std_norm":
            episode_advantage[i] = (score[i] - mean) / (std + epsilon)
        else:
            raise ValueError(f"unknown norm {norm!r}")

    step_advantage = [0.0] * n
    step_group_sizes: list[int] = []
    if state_keys is not None:
        # Anchor-state step groups (Eq. 6) and step advantages (Eq. 7).
        step_groups: dict[tuple[int, Hashable], list[int]] = {}
        for i in range(n):
            step_groups.setdefault((int(group_ids[i]), state_keys[i]), []).append(i)
        for members in step_groups.values():
            step_group_sizes.append(len(members))
            if len(members) == 1:
                continue  # a step group of one has no peer to compare with: advantage 0
            values = [returns[i] - penalty[i] for i in members]
            mean, std = _mean_std(values)
            for i, value in zip(members, values, strict=True):
                if norm == "mean_norm":
                    step_advantage[i] = value - mean
                else:
                    step_advantage[i] = (value - mean) / (std + epsilon)

    if name == "rloo":
        # Leave-one-out: each trajectory's baseline is the mean outcome of the others.
        outcomes: dict[int, dict[tuple[int, int], float]] = {}
        for key in trajectories:
            outcomes.setdefault(key[0], {})[key] = episode_return[key]
        loo: dict[tuple[int, int], float] = {}
        for members_by_key in outcomes.values():
            values = list(members_by_key.values())
            scale = 1.0
            if norm == "mean_std_norm":
                scale = 1.0 / ((_mean_std(values)[1] if len(values) > 1 else 1.0) + epsilon)
            for key, own in members_by_key.items():
                others = [v for k, v in members_by_key.items() if k != key]
                baseline = sum(others) / len(others) if others else 0.0
                loo[key] = (own - baseline) * scale
        advantages = [loo[(int(group_ids[i]), int(traj_ids[i]))] - penalty[i] for i in range(n)]
        episode_advantage, step_advantage = list(advantages), [0.0] * n
    elif name == "slate":
        # Branch groups: the siblings' branch-step rows, compared on their penalised returns.
        if branch_ids is None:
            raise ValueError("slate needs branch_ids")
        branches: dict[int, list[int]] = {}
        for i in range(n):
            if int(branch_ids[i]) >= 0:
                branches.setdefault(int(branch_ids[i]), []).append(i)
        step_advantage = [0.0] * n
        for members in branches.values():
            if len(members) == 1:
                continue
            values = [returns[i] - penalty[i] for i in members]
            mean, std = _mean_std(values)
            for i, value in zip(members, values, strict=True):
                centred = value - mean
                step_advantage[i] = centred if norm == "mean_norm" else centred / (std + epsilon)
        advantages, episode_advantage = list(step_advantage), [0.0] * n
    elif name == "cw_grpo":
        if contributions is None:
            raise ValueError("cw_grpo needs contributions")
        # A_i from the penalty-free outcomes (the GRPO statistics of Eq. 3 without penalties).
        clean = reference_advantage(
            "grpo",
            group_ids=group_ids,
            traj_ids=traj_ids,
            step_ids=step_ids,
            rewards=rewards,
            state_keys=None,
            invalid=[False] * n,
            gamma=gamma,
            norm=norm,
            episode_stats_over=episode_stats_over,
            epsilon=epsilon,
        )["advantages"]
        advantages = [0.0] * n
        for rows in trajectories.values():
            members = [i for _, i in rows]
            a_traj = clean[members[0]]
            *searches, answer = members  # the last round keeps GRPO's advantage
            advantages[answer] = a_traj - penalty[answer]
            if not searches:
                continue
            rounds = len(searches)
            scores = [float(contributions[i]) for i in searches]
            if a_traj < 0:
                weights = [1.0 / rounds] * rounds
            elif math.isinf(contribution_gamma):
                total = max(sum(scores), 1e-6)
                weights = [c / total for c in scores]
            else:
                top = max(scores)
                exps = [math.exp(contribution_gamma * (c - top)) for c in scores]
                weights = [e / sum(exps) for e in exps]
            for i, w in zip(searches, weights, strict=True):
                advantages[i] = rounds * w * a_traj - penalty[i]
        episode_advantage, step_advantage = list(advantages), [0.0] * n
    elif name == "grpo":
        step_advantage = [0.0] * n
        advantages = list(episode_advantage)
    else:
        if state_keys is None:
            raise ValueError("gigpo needs state_keys")
        # Eq. 8.
        advantages = [episode_advantage[i] + omega * step_advantage[i] for i in range(n)]

    return {
        "advantages": advantages,
        "returns": returns,
        "episode_advantage": episode_advantage,
        "step_advantage": step_advantage,
        "step_group_sizes": step_group_sizes,
    }


def taken_by(name: str, kwargs: dict) -> dict:
    """``kwargs`` less the options and per-row inputs that estimator ``name`` does not take.

    The reference accepts every option of every estimator (and ignores those that do not apply);
    ``compute_advantage`` accepts only the estimator's own, so a test drawing one set of options
    for all estimators gives each the part it takes.
    """
    from agentgym.algorithms import ROW_INPUTS, advantage_estimator

    estimator = advantage_estimator(name)
    dropped = (set(ROW_INPUTS[1:]) - set(estimator.inputs)) | (
        _ALL_OPTIONS - set(estimator.option_names())
    )
    return {k: v for k, v in kwargs.items() if k not in dropped}


# Every option name of every estimator (the reference's keyword options).
_ALL_OPTIONS = {
    "gamma",
    "omega",
    "norm",
    "invalid_penalty",
    "episode_stats_over",
    "epsilon",
    "contribution_gamma",
}
