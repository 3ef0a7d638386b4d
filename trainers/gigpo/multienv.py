"""Several envs in one run: each group drawn from one env, advantages within each env's groups.

``--env A --env B [--env-weight 3 --env-weight 1]`` trains on both. The ``num_groups`` groups of
an iteration are split between the envs by weight (every env gets at least one group), each env
runs its own :class:`~agentgym.vector.GroupVectorEnv` with its own preset's env settings (step
cap, action format, prompt template, splits) and response cap (``max_new_tokens``), and every
round the prompts of all envs' running episodes are generated in one batch per response cap. Rows are concatenated env by env with their group and
trajectory ids made unique across envs; advantages are computed on each env's rows alone, so no
statistic ever mixes envs; metrics and evaluation are reported per env as well as overall (names
suffixed by the env's short name: ``rollout/success_rate/Sokoban-v0``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentgym.engine import Policy, PolicyOutput, SamplingParams
from agentgym.engine.lockstep import play_episodes, play_round
from agentgym.vector import GroupVectorEnv
from trainers.gigpo.rollout import RolloutBatch, collect, rows_from

#: Config fields that describe one env; an extra env takes them from its own preset.
ENV_FIELDS = (
    "env_kwargs",
    "max_episode_steps",
    "fmt",
    "history_length",
    "prompt_template",
    "train_split",
    "eval_split",
)


def short_name(env_id: str) -> str:
    """The suffix of an env's metric names: its id without the ``AgentGym/`` namespace."""
    return env_id.split("/", 1)[-1]


def split_groups(num_groups: int, weights: Sequence[float]) -> list[int]:
    """Groups per env: proportional to ``weights`` (largest remainder), at least one each.

    >>> split_groups(8, [1, 1]), split_groups(8, [3, 1]), split_groups(3, [1, 1, 1])
    ([4, 4], [6, 2], [1, 1, 1])
    """
    n = len(weights)
    if num_groups < n:
        raise ValueError(f"{n} envs need at least {n} groups (one each), got {num_groups}")
    w = np.asarray(weights, dtype=float)
    if (w <= 0).any() or not np.isfinite(w).all():
        raise ValueError(f"env weights must be positive numbers, got {list(weights)}")
    spare = num_groups - n  # one group each first, the rest by weight
    share = spare * w / w.sum()
    counts = np.floor(share).astype(int)
    order = np.argsort(-(share - counts), kind="stable")
    counts[order[: spare - counts.sum()]] += 1
    return [int(c) + 1 for c in counts]


@dataclass
class MixedEnvs:
    """One :class:`GroupVectorEnv` per env of the run, stepped together by :func:`collect_mixed`.

    ``options[k]``: the reset options of env k (its split). Quacks like a ``GroupVectorEnv``
    where the trainer only needs ``num_envs`` and ``close``.
    """

    names: list[str]
    """env ids, in row order"""
    venvs: list[GroupVectorEnv]
    options: list[dict[str, Any] | None]
    seeds: list[int] | None = None
    """reset seed of each env, overriding the one :func:`collect_mixed` is given (evaluation:
    each env's own held-out seed)"""
    max_new_tokens: list[int] | None = None
    """response cap of each env's turns, overriding the sampling parameters' ``max_tokens``
    (each env's own: :data:`trainers.gigpo.config.GENERATION_FIELDS`); None: the parameters'"""

    @property
    def num_envs(self) -> int:
        return sum(v.num_envs for v in self.venvs)

    def close(self) -> None:
        for v in self.venvs:
            v.close()


def collect_mixed(
    envs: MixedEnvs,
    policy: Policy,
    params: SamplingParams,
    *,
    seed: int | None = None,
) -> RolloutBatch:
    """Play one episode in every env of every venv; one generation batch per round over all
    envs that share a response cap (the engine's lockstep rounds over several venvs).

    Returns the rows of env 0, then env 1..., with ``env_ids`` (row -> env index) set and group
    and trajectory ids offset so that they are unique across envs.
    """
    seeds = envs.seeds or [seed] * len(envs.venvs)
    caps = envs.max_new_tokens or [params.max_tokens] * len(envs.venvs)
    per_env = [dataclasses.replace(params, max_tokens=cap) for cap in caps]
    outputs, timings = play_per_env(envs.venvs, policy, per_env, seeds, envs.options)
    batches = [rows_from(v.trajectories(), g, {}) for v, g in zip(envs.venvs, outputs, strict=True)]
    merged = merge_batches(batches)
    merged.timings = timings
    return merged


def play_per_env(
    venvs: Sequence[GroupVectorEnv],
    policy: Policy,
    params: Sequence[SamplingParams],
    seeds: Sequence[int | None],
    options: Sequence[dict[str, Any] | None],
) -> tuple[list[list[list[PolicyOutput]]], dict[str, float]]:
    """:func:`~agentgym.engine.lockstep.play_episodes` with sampling parameters per venv
    (``params[k]`` for venv k): each round, the venvs that share parameters are played by one
    :func:`~agentgym.engine.lockstep.play_round` (one generation batch), in venv order.

    Returns ``(outputs, timings)`` as ``play_episodes`` does: ``outputs[k][i]`` the answers env
    i of venv k stepped with; with one set of parameters for all, it is ``play_episodes``.
    """
    if all(p == params[0] for p in params):
        return play_episodes(venvs, policy, params[0], seeds=seeds, options=options)
    timings = {"generate": 0.0, "env": 0.0}
    t0 = time.perf_counter()
    obs = [
        list(v.reset(seed=s, options=o)[0]) for v, s, o in zip(venvs, seeds, options, strict=True)
    ]
    timings["env"] += time.perf_counter() - t0
    outputs: list[list[list[PolicyOutput]]] = [[[] for _ in range(v.num_envs)] for v in venvs]
    sharing: list[list[int]] = []  # venv indices by distinct parameters, in first-seen order
    for k, p in enumerate(params):
        same = next((ks for ks in sharing if params[ks[0]] == p), None)
        if same is None:
            sharing.append([k])
        else:
            same.append(k)
    while any(v.active.any() for v in venvs):
        for ks in sharing:
            if not any(venvs[k].active.any() for k in ks):
                continue
            group_obs = [obs[k] for k in ks]
            played = play_round([venvs[k] for k in ks], policy, params[ks[0]], group_obs, timings)
            for k, k_obs, answers in zip(ks, group_obs, played, strict=True):
                obs[k] = k_obs
                for i, out in answers.items():
                    outputs[k][i].append(out)
    return outputs, timings


def collect_any(
    venv: GroupVectorEnv | MixedEnvs,
    policy: Policy,
    params: SamplingParams,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> RolloutBatch:
    """:func:`collect_mixed` for several envs, :func:`~trainers.gigpo.rollout.collect` for one
    (``options`` applies to the single env; mixed envs carry their own)."""
    if isinstance(venv, MixedEnvs):
        return collect_mixed(venv, policy, params, seed=seed)
    return collect(venv, policy, params, seed=seed, options=options)


def merge_batches(batches: Sequence[RolloutBatch]) -> RolloutBatch:
    """Concatenate per-env batches; ids offset to stay unique, ``env_ids`` marks each row."""
    group_ids, traj_ids, env_ids = [], [], []
    group_offset = traj_offset = 0
    for k, b in enumerate(batches):
        group_ids.append(b.group_ids + group_offset)
        traj_ids.append(b.traj_ids + traj_offset)
        env_ids.append(np.full(len(b), k, dtype=np.int64))
        trajs = b.trajectories
        group_offset += (max((t.group_id for t in trajs), default=-1)) + 1
        traj_offset += (max((t.traj_id for t in trajs), default=-1)) + 1

    def cat(name: str, dtype: Any) -> np.ndarray:
        parts = [getattr(b, name) for b in batches]
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    return RolloutBatch(
        prompt_ids=[p for b in batches for p in b.prompt_ids],
        response_ids=[r for b in batches for r in b.response_ids],
        sample_logprobs=[s for b in batches for s in b.sample_logprobs],
        rewards=cat("rewards", np.float32),
        group_ids=np.concatenate(group_ids).astype(np.int64),
        traj_ids=np.concatenate(traj_ids).astype(np.int64),
        step_ids=cat("step_ids", np.int64),
        state_keys=[s for b in batches for s in b.state_keys],
        invalid=cat("invalid", bool),
        trajectories=[t for b in batches for t in b.trajectories],
        timings={},
        env_ids=np.concatenate(env_ids),
        traj_env_ids=np.concatenate(
            [np.full(len(b.trajectories), k, dtype=np.int64) for k, b in enumerate(batches)]
        ),
    )


def advantages_per_env(
    batch: RolloutBatch, compute: Callable[[RolloutBatch], Any]
) -> tuple[np.ndarray, dict[str, float]]:
    """Advantages computed on each env's rows alone; ``compute(sub_batch)`` returns the
    estimator's result (``.advantages``, ``.stats``) for a batch of one env's rows.

    Returns (N,) advantages in row order and the estimator's stats, suffixed by env index.
    """
    out = np.zeros(len(batch), dtype=np.float32)
    stats: dict[str, float] = {}
    for k in np.unique(batch.env_ids):
        rows = np.flatnonzero(batch.env_ids == k)
        result = compute(subset_rows(batch, rows))
        out[rows] = np.asarray(result.advantages, dtype=np.float32)
        for name, v in (result.stats or {}).items():
            if isinstance(v, (int, float, np.floating, np.integer)):
                stats[f"{name}#{int(k)}"] = float(v)
    return out, stats


def env_metrics(
    prefix: str, batch: RolloutBatch, names: Sequence[str], metrics: Callable[..., dict]
) -> dict[str, float]:
    """``metrics(prefix, sub_batch)`` for each env's episodes, names suffixed by the env."""
    out: dict[str, float] = {}
    if batch.traj_env_ids is None:
        return out
    for k, name in enumerate(names):
        keep = np.flatnonzero(batch.traj_env_ids == k)
        if not len(keep):
            continue
        sub = RolloutBatch([], [], [], np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), [],
                           np.zeros(0, bool), [batch.trajectories[i] for i in keep])  # fmt: skip
        suffix = short_name(name)
        for key, v in metrics(prefix, sub).items():
            if key.count("/") == 1:  # overall metrics only, not per task type
                out[f"{key}/{suffix}"] = v
        if prefix == "rollout" and batch.env_ids is not None:
            rows = batch.env_ids == k
            out[f"rollout/invalid_rate/{suffix}"] = (
                float(batch.invalid[rows].mean()) if rows.any() else 0.0
            )
    return out


def subset_rows(batch: RolloutBatch, rows: np.ndarray) -> RolloutBatch:
    """The rows ``rows`` of ``batch`` as a batch (the episodes are kept whole, unused)."""
    idx = rows.tolist()
    return RolloutBatch(
        prompt_ids=[batch.prompt_ids[i] for i in idx],
        response_ids=[batch.response_ids[i] for i in idx],
        sample_logprobs=[batch.sample_logprobs[i] for i in idx],
        rewards=batch.rewards[rows],
        group_ids=batch.group_ids[rows],
        traj_ids=batch.traj_ids[rows],
        step_ids=batch.step_ids[rows],
        state_keys=[batch.state_keys[i] for i in idx],
        invalid=batch.invalid[rows],
        trajectories=batch.trajectories,
    )


def env_configs(config: Any) -> list[Any]:
    """One config per env of the run: ``config`` itself for its ``env``, and for each of
    ``extra_envs`` a copy whose :data:`ENV_FIELDS` come from that env's own preset (then the
    field defaults; ``--policy scored``'s plain text and action prompt over them) and whose
    generation settings are :func:`~trainers.gigpo.config.generation_per_env`'s (its own
    preset's, unless the user gave one for all)."""
    from trainers.gigpo.config import PRESETS, SCORED_PRESET, generation_per_env

    defaults = type(config)()
    out = [config]
    for env_id, generation in zip(config.extra_envs, generation_per_env(config)[1:], strict=True):
        preset = dict(PRESETS.get(env_id, {}))
        if config.policy == "scored":
            preset.update(SCORED_PRESET)
        fields = {f: preset.get(f, getattr(defaults, f)) for f in ENV_FIELDS}
        out.append(dataclasses.replace(config, env=env_id, extra_envs=[], **fields, **generation))
    return out
