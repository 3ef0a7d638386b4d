"""Exact action values of a policy on an env small enough to enumerate, to score estimators by.

The advantage estimators of :mod:`agentgym.algorithms.advantage` guess, from a few sampled
trajectories, how much better an action was than the policy's average from the same state.
On an env whose reachable states can be listed (Corridor; small Sokoban rooms) that quantity
is known exactly: ``A(s, a) = Q(s, a) - V(s)`` for the policy that sampled them, with

    Q(s, a) = r(s, a) + gamma * (1 - done(s, a)) * V(s')        V(s) = sum_a pi(a | s) Q(s, a)

This module builds the env's real state graph under a policy (:class:`StateGraph`: expanded
with ``env.unwrapped.snapshot()`` / ``restore()``, a node per distinct ``info["state_key"]``,
and per time step as well when the env has a step cap, because the same room with one step
left is worth less than with ten), solves those equations by dynamic programming
(:func:`exact_values`), samples episodes from the same graph (:meth:`StateGraph.sample`, no env
calls: the sampled rows and the exact values describe the very same process) and scores an
estimator's per-row advantages against the exact ones (:func:`score_advantages`).

Conventions, matching what the estimators see:

* ``done`` is ``terminated or truncated``: after the cap's last step the return stops (no
  bootstrap), as it does in a sampled trajectory; with a cap, node ``(key, t)`` only reaches
  ``(key', t + 1)``, so the graph is a DAG solved backwards in time; without one it may have
  cycles and ``V`` solves the linear system ``(I - gamma P_pi) V = r_pi`` (``gamma < 1``, or an
  env where every policy path ends).
* A policy is a function of the node (:class:`PolicyState`: its ``state_key``, time, the
  admissible actions and the observation of the first path that reached it), so that it is a
  Markov policy on the graph the values are computed on. A language model reading only the
  current observation is one when the observation is a function of the state; where two paths
  reach a state with different text (Corridor's "You walk back." prefix), the model is read
  on the first text, and the sampled episodes use that same distribution.
* Transitions are deterministic (one ``restore()`` + ``step()`` per node and action), as
  Corridor's and Sokoban's are given their snapshot.
* Rewards are the env's: the estimators' invalid-action penalty is a training-side charge,
  absent here (policies over admissible actions never pay it).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "ExactValues",
    "Node",
    "Policy",
    "PolicyState",
    "StateGraph",
    "Transition",
    "exact_values",
    "model_policy",
    "score_advantages",
    "softmax_policy",
    "uniform_policy",
]


@dataclass(frozen=True)
class PolicyState:
    """What a policy is given at a node of the state graph."""

    state_key: Hashable
    """``info["state_key"]`` of the state"""
    time: int
    """steps taken since the reset (0 at the reset)"""
    observation: str
    """the observation of the first path that reached the node (see the module docstring)"""
    admissible_actions: tuple[str, ...]
    """``info["admissible_actions"]`` (empty where the env lists none)"""
    info: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    """the env's info dict at the node"""


Policy = Callable[[PolicyState], Mapping[str, float]]
"""``policy(state) -> {action: probability}``; probabilities > 0 and summing to 1 (checked)."""


def uniform_policy(state: PolicyState) -> dict[str, float]:
    """Uniform over the admissible actions."""
    if not state.admissible_actions:
        raise ValueError(f"no admissible actions listed at {state.state_key!r}")
    p = 1.0 / len(state.admissible_actions)
    return dict.fromkeys(state.admissible_actions, p)


def softmax_policy(score: Callable[[PolicyState, str], float], temperature: float = 1.0) -> Policy:
    """``pi(a | s) = softmax_a(score(s, a) / temperature)`` over the admissible actions."""
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

    def policy(state: PolicyState) -> dict[str, float]:
        actions = state.admissible_actions
        if not actions:
            raise ValueError(f"no admissible actions listed at {state.state_key!r}")
        logits = np.array([score(state, a) for a in actions], dtype=np.float64) / temperature
        return dict(zip(actions, _softmax(logits).tolist(), strict=True))

    return policy


def model_policy(
    action_logprobs: Callable[[str, Sequence[str]], Sequence[float]], temperature: float = 1.0
) -> Policy:
    """The policy a model defines over the admissible actions, read from its log-probs.

    ``action_logprobs(observation, actions)`` returns one log-probability (or any score, e.g.
    the summed token log-probs of the scored-action policy) per action; the policy is
    ``softmax(logprobs / temperature)`` over the admissible actions (``-inf``: never taken).
    Calls are cached per
    (observation, actions), so a model is read once per distinct text.
    """
    cache: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

    def policy(state: PolicyState) -> dict[str, float]:
        key = (state.observation, state.admissible_actions)
        if key not in cache:
            if not state.admissible_actions:
                raise ValueError(f"no admissible actions listed at {state.state_key!r}")
            lp = np.asarray(action_logprobs(*key), dtype=np.float64)
            if lp.shape != (len(key[1]),) or np.isnan(lp).any() or not (lp < math.inf).all():
                raise ValueError(f"action_logprobs must give one value < inf per action: {lp}")
            if not np.isfinite(lp).any():
                raise ValueError(f"action_logprobs gave every action probability 0: {lp}")
            cache[key] = dict(zip(key[1], _softmax(lp / temperature).tolist(), strict=True))
        return cache[key]

    return policy


@dataclass(frozen=True)
class Transition:
    """One action from a node: what the env did (deterministic)."""

    action: str
    prob: float
    """pi(action | node)"""
    reward: float
    terminated: bool
    truncated: bool
    valid: bool
    """``info["action_valid"]``"""
    child: int
    """index of the next node, -1 when the episode ended"""
    info: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    """the info the step returned"""

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass
class Node:
    """A state of the graph: ``(state_key, time)`` with a step cap, ``state_key`` without."""

    index: int
    state: PolicyState
    transitions: list[Transition] = field(default_factory=list)

    @property
    def probs(self) -> np.ndarray:
        """float64 (num actions,): the policy's distribution, in ``transitions`` order."""
        return np.array([t.prob for t in self.transitions])


class StateGraph:
    """The states a policy can reach from one reset, and its transitions between them.

    Built by :meth:`build`; ``nodes[root]`` is the reset state. ``timed`` says whether a node is
    a (state_key, time) pair (the env has a step cap) or a state_key.
    """

    def __init__(self, nodes: list[Node], timed: bool, start_info: Mapping[str, Any]) -> None:
        self.nodes = nodes
        self.root = 0
        self.timed = timed
        self.start_info = start_info
        """the reset's info"""

    def __len__(self) -> int:
        return len(self.nodes)

    @classmethod
    def build(
        cls,
        env: Any,
        policy: Policy,
        *,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        max_nodes: int = 200_000,
    ) -> StateGraph:
        """Expand every state ``policy`` can reach from ``env.reset(seed=seed, options=options)``.

        ``env``: an agentgym env (or a wrapper of one); its ``unwrapped`` TextEnv is reset,
        snapshotted and stepped, and its own step cap (``max_episode_steps``) is the cap.
        Breadth-first: each node is expanded once, from a snapshot of the first path reaching
        it, by restoring it and stepping each action of the policy's support. Raises
        ValueError past ``max_nodes`` nodes (the env is too large to enumerate).
        """
        base = env.unwrapped
        cap = getattr(base, "max_episode_steps", None)
        timed = cap is not None
        obs, info = base.reset(seed=seed, options=dict(options or {}))
        start_info = dict(info)

        def make_node(index: int, obs: str, info: Mapping[str, Any], t: int) -> Node:
            state = PolicyState(
                state_key=info["state_key"],
                time=t,
                observation=obs,
                admissible_actions=tuple(info.get("admissible_actions") or ()),
                info=info,
            )
            return Node(index, state)

        nodes = [make_node(0, obs, info, 0)]
        ids: dict[Hashable, int] = {cls._id(info["state_key"], 0, timed): 0}
        snapshots = [base.snapshot()]
        queue = deque([0])
        while queue:
            node = nodes[queue.popleft()]
            dist = _checked(policy(node.state), node.state)
            snap = snapshots[node.index]
            for action, prob in dist.items():
                base.restore(snap)
                obs, reward, term, trunc, info = base.step(action)
                child = -1
                if not (term or trunc):
                    t = node.state.time + 1
                    key = cls._id(info["state_key"], t, timed)
                    child = ids.get(key, -1)
                    if child < 0:
                        if len(nodes) >= max_nodes:
                            raise ValueError(
                                f"more than {max_nodes} states reachable: the env is too large "
                                "to enumerate (a smaller room, fewer rooms, or a lower step cap)"
                            )
                        child = ids[key] = len(nodes)
                        nodes.append(make_node(child, obs, info, t))
                        snapshots.append(base.snapshot())
                        queue.append(child)
                node.transitions.append(
                    Transition(
                        action=action,
                        prob=prob,
                        reward=float(reward),
                        terminated=bool(term),
                        truncated=bool(trunc),
                        valid=bool(info.get("action_valid", True)),
                        child=child,
                        info=info,
                    )
                )
        return cls(nodes, timed, start_info)

    @staticmethod
    def _id(key: Hashable, t: int, timed: bool) -> Hashable:
        return (key, t) if timed else key

    def sample(self, rng: np.random.Generator, start: int | None = None) -> list[tuple[int, int]]:
        """One episode drawn from the policy: ``[(node, transition index), ...]`` until done,
        from ``start`` (default the root)."""
        out = []
        node = self.root if start is None else start
        while node >= 0:
            n = self.nodes[node]
            i = int(rng.choice(len(n.transitions), p=n.probs))
            out.append((node, i))
            node = n.transitions[i].child
        return out


@dataclass(frozen=True)
class ExactValues:
    """``V`` per node and ``Q`` per (node, transition) of a :class:`StateGraph`, exact."""

    v: np.ndarray
    """float64 (num nodes,)"""
    q: list[np.ndarray]
    """per node, float64 (num actions,) in ``transitions`` order"""
    gamma: float

    def advantage(self, node: int, transition: int) -> float:
        """``A = Q(s, a) - V(s)``."""
        return float(self.q[node][transition] - self.v[node])


def exact_values(graph: StateGraph, gamma: float) -> ExactValues:
    """Solve ``Q(s, a) = r + gamma (1 - done) V(s')`` and ``V(s) = sum_a pi(a|s) Q(s, a)`` exactly.

    Timed graphs (a step cap) are DAGs in time: one backward pass. Untimed ones are solved as
    the linear system ``(I - gamma P_pi) V = r_pi`` (dense; raises ValueError if singular,
    e.g. ``gamma = 1`` with a policy that can loop forever).
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    nodes = graph.nodes
    n = len(nodes)
    v = np.zeros(n)
    if graph.timed:
        for index in sorted(range(n), key=lambda i: -nodes[i].state.time):
            node = nodes[index]
            q = _q(node, v, gamma)
            v[index] = float(node.probs @ q)
    else:
        p = np.zeros((n, n))
        r = np.zeros(n)
        for node in nodes:
            for t in node.transitions:
                r[node.index] += t.prob * t.reward
                if t.child >= 0:
                    p[node.index, t.child] += t.prob
        try:
            v = np.linalg.solve(np.eye(n) - gamma * p, r)
        except np.linalg.LinAlgError as err:
            raise ValueError(
                f"V is not defined for gamma={gamma}: the policy can loop forever without a step "
                "cap (use gamma < 1 or an env with max_episode_steps)"
            ) from err
    return ExactValues(v=v, q=[_q(node, v, gamma) for node in nodes], gamma=gamma)


def score_advantages(estimate: Any, exact: Any, *, atol: float = 1e-9) -> dict[str, float]:
    """How well an estimator's advantages match the exact ones, over the same rows.

    Args:
        estimate: float (M,): the estimator's advantage of each scored row.
        exact: float (M,): ``Q(s, a) - V(s)`` of each row's state and action.
        atol: an exact advantage within ``atol`` of 0 has no sign (a state with one action).

    Returns:
        ``spearman``: rank correlation (average ranks for ties; NaN if either side is
        constant); ``sign_agreement``: share of rows with a nonzero exact advantage whose
        estimate has the same sign (an estimate of 0 disagrees); ``mae_raw``:
        ``mean |est - A|``, the estimates as the estimator scales them (its own normalisation;
        comparable to A's reward units under ``mean_norm``); ``scale``: ``c = mean |A| /
        mean |est|`` (0 for an estimate that is all 0), the factor that gives the estimates the
        exact advantages' mean magnitude, since estimators scale differently (GRPO's episode
        advantage is in undiscounted-return units, GiGPO adds a step term, ``mean_std_norm``
        has none); ``mae_scaled``: ``mean |c est - A|``, the error in shape once magnitudes
        agree (0 when ``est`` is a positive multiple of ``A``; ``mean |A|`` for an estimate of
        all 0; about ``1.4 mean |A|`` for Gaussian noise independent of A);
        ``mean_abs_exact``: ``mean |A|``, the error of predicting 0; ``rows``.
    """
    est = np.asarray(estimate, dtype=np.float64)
    a = np.asarray(exact, dtype=np.float64)
    if est.shape != a.shape or est.ndim != 1:
        raise ValueError(f"estimate and exact must be (M,) alike, got {est.shape} and {a.shape}")
    m = est.shape[0]
    if m == 0:
        return dict.fromkeys(
            ("spearman", "sign_agreement", "scale", "mae_scaled", "mae_raw", "mean_abs_exact"),
            math.nan,
        ) | {"rows": 0.0}
    signed = np.abs(a) > atol
    sign_agree = (
        float(np.mean(np.sign(est[signed]) == np.sign(a[signed]))) if signed.any() else math.nan
    )
    mean_est = float(np.mean(np.abs(est)))
    scale = float(np.mean(np.abs(a))) / mean_est if mean_est > 0 else 0.0
    return {
        "spearman": _spearman(est, a),
        "sign_agreement": sign_agree,
        "scale": scale,
        "mae_scaled": float(np.mean(np.abs(scale * est - a))),
        "mae_raw": float(np.mean(np.abs(est - a))),
        "mean_abs_exact": float(np.mean(np.abs(a))),
        "rows": float(m),
    }


# ---------------------------------------------------------------------------------------------


def _q(node: Node, v: np.ndarray, gamma: float) -> np.ndarray:
    return np.array(
        [t.reward + (gamma * v[t.child] if t.child >= 0 else 0.0) for t in node.transitions]
    )


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _checked(dist: Mapping[str, float], state: PolicyState) -> dict[str, float]:
    out = {str(a): float(p) for a, p in dist.items() if p > 0.0}
    total = sum(out.values())
    if not out or abs(total - 1.0) > 1e-6 or any(not math.isfinite(p) for p in out.values()):
        raise ValueError(
            f"the policy must give probabilities summing to 1 at {state.state_key!r}; got {dist}"
        )
    return out


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), float64 (M,)."""
    order = np.argsort(x, kind="mergesort")
    sx = x[order]
    starts = np.flatnonzero(np.r_[True, sx[1:] != sx[:-1]])
    ends = np.r_[starts[1:], sx.shape[0]]
    avg = (starts + ends - 1) / 2.0
    ranks = np.empty(x.shape[0])
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = _ranks(x), _ranks(y)
    rx -= rx.mean()
    ry -= ry.mean()
    denom = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / denom if denom > 0 else math.nan
