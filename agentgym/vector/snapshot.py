"""Snapshots of a wrapped env: the env's own :class:`~agentgym.core.EnvSnapshot` plus the
episode state of the wrappers around it, so that a vector env can branch and restore envs whose
wrappers keep history (a prompt renderer) in any backend."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from agentgym.core import EnvSnapshot, SnapshotMismatch, StepCap

__all__ = ["GroupEnvSnapshot", "restore_env", "snapshot_env"]


# Attributes of gymnasium's own wrappers that are configuration, not episode state.
_WRAPPER_CONFIG = frozenset(
    {
        "env",
        "_action_space",
        "_observation_space",
        "_reward_range",
        "_metadata",
        "_cached_spec",
        "_saved_kwargs",
        "_disable_render_order_enforcing",
    }
)


def _wrapper_chain(env: gym.Env) -> list[gym.Wrapper]:
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append(env)
        env = env.env
    return chain


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class GroupEnvSnapshot(EnvSnapshot):
    """An :class:`~agentgym.core.EnvSnapshot` of one env of a :class:`GroupVectorEnv`, with the
    state of the wrappers around it (:meth:`GroupVectorEnv.snapshot`).

    Wrappers keep their episode state (a prompt renderer's history, gymnasium's
    ``OrderEnforcing`` flag) in underscore attributes; those are carried, pickled, with the
    observation and info the wrappers last returned (so those attributes must pickle). Still an
    ``EnvSnapshot``: it restores into a bare ``env.unwrapped`` as well.
    """

    wrapped: bytes = b""
    """pickled ``(wrapper class names, [each wrapper's underscore attributes], obs, info)``"""


def snapshot_env(env: gym.Env, last: tuple[str, dict[str, Any]] | None) -> GroupEnvSnapshot:
    """Snapshot ``env`` (unwrapped state) and its wrappers' episode state."""
    if last is None:
        raise RuntimeError("this env has not been reset: reset() or reset_to() it first")
    base = env.unwrapped.snapshot()
    chain = _wrapper_chain(env)
    wrapped = pickle.dumps(
        (
            [type(w).__qualname__ for w in chain],
            [
                {k: v for k, v in vars(w).items() if k[0] == "_" and k not in _WRAPPER_CONFIG}
                for w in chain
            ],
            last[0],
            last[1],
        ),
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    # the env counts its steps and ends a capped episode itself (StepCap): its own snapshot
    # holds the step count and the done flags
    fields = {name: getattr(base, name) for name in _BASE_FIELDS}
    return GroupEnvSnapshot(**fields, wrapped=wrapped)


def restore_env(env: gym.Env, snap: EnvSnapshot) -> tuple[str, dict[str, Any]]:
    """Restore ``env`` and its wrappers; returns the (observation, info) they last returned.

    A bare ``EnvSnapshot`` carries no wrapper state: accepted only when the wrappers are
    the bookkeeping ones ``gym.make`` adds (the step cap lives in the env, whose snapshot
    carries the step count), which are then set as after a reset.
    """
    chain = _wrapper_chain(env)
    if isinstance(snap, GroupEnvSnapshot) and snap.wrapped:
        names, states, obs, info = pickle.loads(snap.wrapped)
        if names != [type(w).__qualname__ for w in chain]:
            raise SnapshotMismatch(
                f"the snapshot was taken under the wrappers {names}, this env has "
                f"{[type(w).__qualname__ for w in chain]}; restore it into a GroupVectorEnv "
                "built with the same wrappers"
            )
        env.unwrapped.restore(snap)  # raises SnapshotMismatch before anything changes
        for wrapper, state in zip(chain, states, strict=True):
            vars(wrapper).update(state)
        return obs, info
    if not isinstance(snap, EnvSnapshot):
        raise TypeError(
            f"expected an EnvSnapshot (from vec.snapshot(i) or env.unwrapped.snapshot()), got "
            f"{type(snap).__name__}"
        )
    stateful = [type(w).__qualname__ for w in chain if not isinstance(w, _GYM_BOOKKEEPING)]
    if stateful:
        raise ValueError(
            f"a bare EnvSnapshot holds no state of the wrappers {stateful}: take the snapshot "
            "with GroupVectorEnv.snapshot(i) from a vector env built with the same wrappers"
        )
    env.unwrapped.restore(snap)
    for wrapper in chain:
        if isinstance(wrapper, gym.wrappers.OrderEnforcing):
            wrapper._has_reset = True  # the env holds an episode: stepping it is in order
    return snap.last_obs, snap.info


_GYM_BOOKKEEPING = (gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker, StepCap)
_BASE_FIELDS = tuple(f.name for f in dataclasses.fields(EnvSnapshot))
