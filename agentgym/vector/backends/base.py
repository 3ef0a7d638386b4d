"""The :class:`Backend` protocol: what :class:`~agentgym.vector.GroupVectorEnv` asks of the
thing that holds its envs (in this process, in a pool of worker processes, in Ray actors)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Backend",
    "BackendName",
    "EnvCommand",
    "ResetRequest",
    "ResetResult",
    "StepRequest",
    "StepResult",
]

BackendName = Literal["inprocess", "process", "ray"]
"""the ``backend=`` argument of :class:`~agentgym.vector.GroupVectorEnv`"""

ResetRequest = tuple[int, int | None, dict[str, Any] | None]
"""``(env index, seed, options)``: one env's ``reset(seed=seed, options=options)``"""
StepRequest = tuple[int, Any]
"""``(env index, action)``: one env's ``step(action)``"""
ResetResult = tuple[str, dict[str, Any]]
"""``(observation, info)``, as the env's ``reset`` returned it"""
StepResult = tuple[str, float, bool, bool, dict[str, Any]]
"""``(observation, reward, terminated, truncated, info)``, as the env's ``step`` returned it"""
EnvCommand = Literal["snapshot", "restore"]
"""per-env commands of :meth:`Backend.call_envs`"""


@runtime_checkable
class Backend(Protocol):
    """Runs ``reset`` / ``step`` / snapshot / restore on any subset of a vector env's envs.

    Env indices are the vector env's (``0 <= i < num_envs``). Every method takes one request per
    env and returns one entry per request, in the order asked: the env's result, or a
    :class:`~agentgym.vector.failures.Failure` when that env raised (``raised=True``) or its
    worker was lost (``raised=False``, and the worker is replaced: its envs are new and need a
    reset). One env's failure never keeps the other envs from answering.
    """

    @property
    def owner(self) -> np.ndarray | None:
        """``(num_envs,)`` int: the worker that holds env ``i``, whose loss ends all its
        episodes; None when every env lives in this process."""
        ...

    def reset(self, requests: Sequence[ResetRequest]) -> list[Any]:
        """Reset each requested env; returns ``ResetResult | Failure`` per request. A lost
        worker is retried once on a fresh one (a reset must succeed), then raises
        ``RuntimeError``."""
        ...

    def step(self, requests: Sequence[StepRequest]) -> list[Any]:
        """Step each requested env; returns ``StepResult | Failure`` per request. An action that
        cannot be sent to a worker is passed on as an invalid action, as in-process."""
        ...

    def call_envs(self, cmd: EnvCommand, requests: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``"snapshot"`` with requests ``(index,)`` returns a
        :class:`~agentgym.vector.snapshot.GroupEnvSnapshot` per env; ``"restore"`` with
        ``(index, snapshot)`` returns the restored ``ResetResult``; either may be a ``Failure``."""
        ...

    def close(self) -> None:
        """Close every env and stop every worker; idempotent."""
        ...
