"""The default backend: every env lives in the caller's process.

Text env steps take micro- to milliseconds, so for light envs inter-process hops cost more
than they save.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentgym.vector.backends.base import EnvCommand, ResetRequest, StepRequest
from agentgym.vector.backends.host import EnvHost
from agentgym.vector.factory import EnvFactory

__all__ = ["InProcessBackend"]


class InProcessBackend(EnvHost):
    """A :class:`~agentgym.vector.backends.base.Backend` whose envs all live in this process;
    an env that raises keeps its exception object (chained to the caller's error)."""

    owner = None  # no worker to lose

    def __init__(self, factory: EnvFactory, num_envs: int):
        super().__init__(factory, num_envs)
        self.keep_exceptions = True

    def reset(self, requests: Sequence[ResetRequest]) -> list[Any]:
        return self.run("reset", requests)

    def step(self, requests: Sequence[StepRequest]) -> list[Any]:
        return self.run("step", requests)

    def call_envs(self, cmd: EnvCommand, requests: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``"snapshot"`` ``[(index,)]`` or ``"restore"`` ``[(index, snapshot)]``, per env."""
        return self.run(cmd, requests)
