"""Rollout collection: group envs played by the engine's lockstep rounds -> one training row per step.

Uses only agentgym's public API: :class:`agentgym.vector.GroupVectorEnv` runs
``num_groups x group_size`` envs (each group on one task), each wrapped by
:func:`agentgym.wrappers.llm.make_llm_env` (prompt rendering with the last ``history_length``
steps, parsing of the model text into an env action). Every turn is played by the engine
(:mod:`agentgym.engine.lockstep`): each round, the prompts of the envs still running are
generated in one batch and every env is stepped with the raw model text. What is the trainer's
own is the shape of a rollout (flat, tree, stepwise: branching between rounds) and its rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.engine import Policy, PolicyOutput, SamplingParams
from agentgym.engine.lockstep import play_episodes, play_round
from agentgym.vector import GroupVectorEnv, Trajectory
from agentgym.wrappers.llm import PromptTemplate, make_llm_env
from trainers.gigpo.scored import ACTIONS_TEMPLATE

#: The observation (and the recent history) only: no role text, no admissible-action list, no
#: format instruction. For tiny models trained from scratch, whose every prompt token costs
#: update time on a CPU and carries nothing they can read.
COMPACT_TEMPLATE = PromptTemplate(first="{observation}", later="{history}\n{observation}")

#: Prompt templates the trainer adds to ``agentgym.wrappers.llm.PROMPT_TEMPLATES``, by name.
TRAINER_TEMPLATES: dict[str, PromptTemplate] = {
    "compact": COMPACT_TEMPLATE,
    "actions": ACTIONS_TEMPLATE,
}


@dataclass
class RolloutBatch:
    """The rows of one rollout, one per (trajectory, step), trajectories in env order.

    ``N`` rows. Token lists are ragged (one list per row); the arrays are aligned with them.
    """

    prompt_ids: list[list[int]]
    """(N,) chat-templated prompt token ids"""
    response_ids: list[list[int]]
    """(N,) sampled response token ids"""
    sample_logprobs: list[list[float]]
    """(N,) log-probs the generation backend reported for the response tokens"""
    rewards: np.ndarray
    """(N,) float32 env reward of the step"""
    group_ids: np.ndarray
    """(N,) int64 group (task) of the row"""
    traj_ids: np.ndarray
    """(N,) int64 trajectory of the row, unique within the batch"""
    step_ids: np.ndarray
    """(N,) int64 step index within its trajectory, from 0"""
    state_keys: list[Hashable]
    """(N,) ``state_key`` of the state the action was taken from (GiGPO's anchor state)"""
    invalid: np.ndarray
    """(N,) bool: the action was invalid (unparseable or inapplicable)"""
    trajectories: list[Trajectory]
    """the episodes themselves (for success rates, returns, task types)"""
    timings: dict[str, float] = field(default_factory=dict)
    """seconds spent in ``generate`` and ``env`` (reset + step)"""
    branch_ids: np.ndarray | None = None
    """(N,) int64, tree rollouts only: the branch group of a row taken at a branch point (its
    siblings act from the same state), -1 elsewhere; what ``compute_advantage("slate")`` reads"""
    env_ids: np.ndarray | None = None
    """(N,) int64, runs over several envs only: the env (index in the run's env list) of a row"""
    traj_env_ids: np.ndarray | None = None
    """(len(trajectories),) int64, runs over several envs only: the env of each episode"""
    row_start: np.ndarray | None = None
    """(T,) int64, tree rollouts only: the first own step of each trajectory (its shared prefix,
    copied from the source, is not repeated in the rows)"""

    def __len__(self) -> int:
        return len(self.response_ids)


def make_group_env(
    env_id: str,
    *,
    num_groups: int,
    group_size: int,
    fmt: str | None = None,
    history_length: int = 2,
    template: str | PromptTemplate | None = None,
    env_kwargs: dict[str, Any] | None = None,
    backend: str = "inprocess",
    num_workers: int | None = None,
    llm_env: Callable[..., Any] = make_llm_env,
    prompt_wrappers: list[tuple[Callable[..., Any], dict[str, Any]]] | None = None,
) -> GroupVectorEnv:
    """A :class:`GroupVectorEnv` whose envs take raw model text and return rendered prompts.

    ``template``: a name in ``agentgym.wrappers.llm.PROMPT_TEMPLATES``, ``"compact"``
    (:data:`COMPACT_TEMPLATE`), ``"actions"`` (the scored-action policy's short prompt,
    ``trainers.gigpo.scored.ACTIONS_TEMPLATE``), a ``PromptTemplate``, or None for the env
    family's template. ``llm_env``: the wrapper that makes each env take model text
    (:func:`~agentgym.wrappers.llm.make_llm_env`, or the same with HiPER's subgoals:
    :func:`trainers.gigpo.subgoals.make_subgoal_llm_env`). ``prompt_wrappers``: (wrapper,
    kwargs) applied over the rendered prompts, e.g. SLEA-RL's
    :class:`~agentgym.algorithms.slea_library.ExperiencePrompt`.
    """
    llm_kwargs: dict[str, Any] = {"history_length": history_length}
    if template is not None:
        llm_kwargs["template"] = TRAINER_TEMPLATES.get(template, template)
    if fmt is not None:
        llm_kwargs["fmt"] = fmt
    return GroupVectorEnv(
        env_id,
        num_groups=num_groups,
        group_size=group_size,
        backend=backend,
        num_workers=num_workers,
        env_kwargs=env_kwargs,
        wrappers=[(llm_env, llm_kwargs), *(prompt_wrappers or [])],
    )


def collect(
    venv: GroupVectorEnv,
    policy: Policy,
    params: SamplingParams,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> RolloutBatch:
    """Play one episode in every env of ``venv`` and return its training rows.

    Episodes end by the env's own termination or step cap (set ``max_episode_steps`` through the
    env kwargs); finished envs drop out of the generation batch.
    """
    outputs, timings = play_episodes([venv], policy, params, seeds=[seed], options=[options])
    return rows_from(venv.trajectories(), outputs[0], timings)


def rows_from(
    trajectories: list[Trajectory], gens: list[list[PolicyOutput]], timings: dict[str, float]
) -> RolloutBatch:
    """Flatten trajectories and the policy's answers (same order, one per step) into rows: the
    ids trained are the ids sampled."""
    lengths = np.array([len(t.steps) for t in trajectories], dtype=np.int64)
    if any(len(g) != n for g, n in zip(gens, lengths, strict=True)):
        raise RuntimeError("a trajectory's step count differs from its number of generations")
    steps = [s for t in trajectories for s in t.steps]
    flat = [g for per_env in gens for g in per_env]
    return RolloutBatch(
        prompt_ids=[g.prompt_ids for g in flat],
        response_ids=[g.token_ids for g in flat],
        sample_logprobs=[g.logprobs for g in flat],
        rewards=np.array([s.reward for s in steps], dtype=np.float32),
        group_ids=np.repeat([t.group_id for t in trajectories], lengths).astype(np.int64),
        traj_ids=np.repeat([t.traj_id for t in trajectories], lengths).astype(np.int64),
        step_ids=np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
        if len(lengths)
        else np.zeros(0, np.int64),
        state_keys=[s.state_key for s in steps],
        invalid=np.array([not s.action_valid for s in steps], dtype=bool),
        trajectories=trajectories,
        timings=timings,
    )


def collect_tree(
    venv: GroupVectorEnv,
    policy: Policy,
    params: SamplingParams,
    *,
    branch_points: int,
    continuations: int,
    branch_span: int = 3,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> RolloutBatch:
    """Play a tree of episodes in every group, as many episodes as :func:`collect` plays.

    Each group of ``K = group_size`` envs starts ``K / continuations**branch_points`` roots from
    the reset state; the other envs wait. At each of ``branch_points`` branch steps (per group,
    the gaps between them drawn uniformly from ``1..branch_span``), every root or branch still
    running is copied into ``continuations - 1`` waiting envs (``GroupVectorEnv.branch``), so
    the ``continuations`` siblings share the prefix and act from one state. Waiting envs left
    when the group's tree has ended (episodes that finished before a branch step) play from
    the reset state as extra roots. The result is K complete episodes per group.

    Rows: a trajectory's own steps only (a branch's copied prefix is its source's rows);
    ``branch_ids`` marks each row taken at a branch point (the roots' first steps share one
    group: they act from the reset state).
    """
    group_size = venv.group_size
    width = continuations**branch_points
    if continuations < 2 or branch_points < 1 or group_size % width:
        raise ValueError(
            f"a tree rollout needs continuations >= 2, branch_points >= 1 and group_size a "
            f"multiple of continuations**branch_points = {width}; got group_size {group_size}"
        )
    rng = np.random.default_rng(seed)
    num_groups = venv.num_envs // group_size
    timings = {"generate": 0.0, "env": 0.0}
    t0 = time.perf_counter()
    obs, _ = venv.reset(seed=seed, options=options)
    timings["env"] += time.perf_counter() - t0
    roots = group_size // width
    waiting = [list(range(g * group_size + roots, (g + 1) * group_size)) for g in range(num_groups)]
    in_tree = np.zeros(venv.num_envs, dtype=bool)
    for g in range(num_groups):
        in_tree[g * group_size : g * group_size + roots] = True
        venv.active[waiting[g]] = False  # parked: not stepped until branched into or released
    # Branch rounds of each group: cumulative gaps in 1..branch_span.
    branch_round = np.cumsum(rng.integers(1, branch_span + 1, size=(num_groups, branch_points)), 1)
    level = np.zeros(num_groups, dtype=np.int64)
    gens: list[list[PolicyOutput]] = [[] for _ in range(venv.num_envs)]
    obs = list(obs)
    round_index = 0
    while venv.active.any() or any(waiting):
        t0 = time.perf_counter()
        for g in range(num_groups):
            members = np.arange(g * group_size, (g + 1) * group_size)
            live_tree = members[in_tree[members] & venv.active[members]]
            if level[g] < branch_points and round_index == branch_round[g, level[g]]:
                level[g] += 1
                for source in live_tree:
                    targets = [waiting[g].pop() for _ in range(continuations - 1)]
                    new_obs, _ = venv.branch(int(source), targets)
                    for t, o in zip(targets, new_obs, strict=True):
                        obs[t], in_tree[t], gens[t] = o, True, []
            elif waiting[g] and (not live_tree.size or level[g] == branch_points):
                venv.active[waiting[g]] = True  # the tree ended early: extra roots
                waiting[g] = []
        timings["env"] += time.perf_counter() - t0
        if not venv.active.any():
            round_index += 1
            continue
        holder = [obs]
        for i, gen in play_round([venv], policy, params, holder, timings)[0].items():
            gens[i].append(gen)
        obs = holder[0]
        round_index += 1
    return tree_rows(venv.trajectories(), gens, timings)


def collect_stepwise(
    venv: GroupVectorEnv,
    policy: Policy,
    params: SamplingParams,
    judge: Any,
    *,
    selection_temperature: float = 0.7,
    epsilon: float = 1e-6,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> RolloutBatch:
    """SLATE's truncated step-level sampling (arXiv 2602.23440, Algorithm 1), one episode per group.

    The ``K = group_size`` envs of a group always stand in the same state. Every round each of
    them samples a candidate next action from that shared prefix and plays it (one step, never
    rolled out further): the K candidates are one branch group. A candidate's dense reward is
    ``r = env reward + judge score of the round`` (the paper's judge rewards; here any
    :class:`~agentgym.algorithms.judges.Judge`, rule or LLM, through ``judge.score_last``), its
    advantage ``A = (r - mean) / (std + epsilon)`` within the K (the paper's Eq. 5, which
    ``compute_advantage("slate", norm="mean_std_norm")`` computes from these rows), and the
    winner is drawn with probability ``softmax(A / selection_temperature)`` (the paper's
    reward-weighted selection, eta = 0.7). The other K - 1 envs become copies of the winner
    (``GroupVectorEnv.branch``) and the next round samples from there, until the winner's
    episode ends (its own termination or step cap).

    Equal samples: a group of K generates K candidates per round, as K full trajectories
    generate K steps per round.

    Rows: one per candidate, each its own one-step trajectory (``traj_ids`` unique, ``step_ids``
    the round), ``rewards`` the dense reward, ``branch_ids`` the (group, round) branch group.
    ``trajectories`` are the winners' episodes, one per group (what success rates count).
    """
    group_size = venv.group_size
    if group_size < 2:
        raise ValueError(f"a stepwise rollout needs group_size >= 2 candidates, got {group_size}")
    if selection_temperature <= 0:
        raise ValueError(f"selection_temperature must be > 0, got {selection_temperature}")
    rng = np.random.default_rng(seed)
    num_groups = venv.num_envs // group_size
    timings = {"generate": 0.0, "env": 0.0, "judge": 0.0}
    t0 = time.perf_counter()
    obs, _ = venv.reset(seed=seed, options=options)
    obs = list(obs)
    timings["env"] += time.perf_counter() - t0
    rows: list[tuple[PolicyOutput, Any, int, int, float]] = []  # gen, step, group, round, reward
    winners = [g * group_size for g in range(num_groups)]
    finished: list[Trajectory | None] = [None] * num_groups
    round_index = 0
    while venv.active.any():
        live = np.flatnonzero(venv.active)
        holder = [obs]
        played = play_round([venv], policy, params, holder, timings)[0]
        obs, out = holder[0], [played[int(i)] for i in live]
        trajs = venv.trajectories()
        t0 = time.perf_counter()
        judged = judge.score_last([trajs[i] for i in live])
        timings["judge"] += time.perf_counter() - t0
        dense = {
            int(i): trajs[i].steps[-1].reward + float(j) for i, j in zip(live, judged, strict=True)
        }
        for i, gen in zip(live, out, strict=True):
            rows.append((gen, trajs[i].steps[-1], int(i) // group_size, round_index, dense[int(i)]))
        t0 = time.perf_counter()
        for g in np.unique(live // group_size):
            members = [int(i) for i in live if i // group_size == g]
            r = np.array([dense[i] for i in members])
            spread = r.std(ddof=1) if len(r) > 1 else 0.0
            a = (r - r.mean()) / (spread + epsilon)
            p = np.exp((a - a.max()) / selection_temperature)
            winner = members[int(rng.choice(len(members), p=p / p.sum()))]
            winners[g] = winner
            others = [i for i in range(g * group_size, (g + 1) * group_size) if i != winner]
            if trajs[winner].done:
                finished[g] = trajs[winner]
                venv.active[others] = False  # the group's episode is over
                continue
            new_obs, _ = venv.branch(winner, others)
            for t, o in zip(others, new_obs, strict=True):
                obs[t] = o
        timings["env"] += time.perf_counter() - t0
        round_index += 1
    trajs = venv.trajectories()
    episodes = [f if f is not None else trajs[w] for f, w in zip(finished, winners, strict=True)]
    n = len(rows)
    return RolloutBatch(
        prompt_ids=[r[0].prompt_ids for r in rows],
        response_ids=[r[0].token_ids for r in rows],
        sample_logprobs=[r[0].logprobs for r in rows],
        rewards=np.array([r[4] for r in rows], dtype=np.float32),
        group_ids=np.array([r[2] for r in rows], dtype=np.int64),
        traj_ids=np.arange(n, dtype=np.int64),
        step_ids=np.array([r[3] for r in rows], dtype=np.int64),
        state_keys=[r[1].state_key for r in rows],
        invalid=np.array([not r[1].action_valid for r in rows], dtype=bool),
        trajectories=episodes,
        timings=timings,
        branch_ids=np.array([r[2] * (round_index + 1) + r[3] for r in rows], dtype=np.int64),
    )


def branch_groups(trajectories: Sequence[Trajectory]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each trajectory's first own step, and the branch group of each of its own steps.

    Siblings are the trajectories with equal ``(branch_of, branch_step)`` plus their source
    (the trajectory named by ``branch_of``), whose step at ``branch_step`` acted from the same
    state; the roots of a group (no ``branch_of``) share their first step's group. Returns
    ``(start (T,), [int64 (len(steps) - start,) per trajectory, -1 = not a branch step])``.
    """
    codes: dict[Hashable, int] = {}
    sources = {(t.branch_of, t.branch_step) for t in trajectories if t.branch_of is not None}
    starts, ids = [], []
    for traj in trajectories:
        start = traj.branch_step if traj.branch_of is not None else 0
        own = np.full(len(traj.steps) - start, -1, dtype=np.int64)
        me = (traj.group_id, traj.traj_id)
        for s in range(start, len(traj.steps)):
            if traj.branch_of is None and s == 0:
                key: Hashable = ("root", traj.group_id)
            elif traj.branch_of is not None and s == start:
                key = (traj.branch_of, s)
            elif (me, s) in sources:
                key = (me, s)
            else:
                continue
            own[s - start] = codes.setdefault(key, len(codes))
        starts.append(start)
        ids.append(own)
    return np.asarray(starts, dtype=np.int64), ids


def tree_rows(
    trajectories: list[Trajectory], gens: list[list[PolicyOutput]], timings: dict[str, float]
) -> RolloutBatch:
    """Rows of a tree rollout: own steps of each trajectory, with their branch groups."""
    start, ids = branch_groups(trajectories)
    own = [
        Trajectory(t.group_id, t.traj_id, t.task_id, t.steps[s:])
        for t, s in zip(trajectories, start.tolist(), strict=True)
    ]
    batch = rows_from(own, gens, timings)
    # Step ids continue the prefix (their order is what the estimators read).
    batch.step_ids = batch.step_ids + np.repeat(start, [len(t.steps) for t in own])
    batch.trajectories = trajectories
    batch.branch_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    batch.row_start = start
    return batch
