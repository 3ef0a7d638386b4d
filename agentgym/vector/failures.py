"""The failure model of the vector env: what stands in for an env's result when the env raised
or its worker was lost, and the errors the caller sees."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BootstrapError", "EnvError", "Failure", "WorkerDied"]


@dataclass
class Failure:
    """Stands in for one env's result when that env raised or its worker was lost.

    ``raised``: the env itself raised (a bug or bad input, reported to the caller as
    :class:`EnvError`); otherwise its worker died or hung, and the episode just ends truncated.
    """

    reason: str
    """one line: ``"ValueError: bad task"`` or ``"env worker 1 (pid 7) died (...)"``"""
    raised: bool
    traceback: str = ""
    """the env's traceback, formatted where it happened (workers send text, not exceptions)"""
    exc: BaseException | None = field(default=None, repr=False, compare=False)
    """the exception itself, in-process only (it may not pickle)"""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "exc": None}


class EnvError(RuntimeError):
    """An env raised inside ``reset`` or ``step``; says which env (index, group) and why.

    ``env_index`` / ``group`` name the first env that failed, ``failed`` lists every one.
    """

    def __init__(self, message: str, env_index: int, group: int, failed: list[int]):
        super().__init__(message)
        self.env_index, self.group, self.failed = env_index, group, failed


class WorkerDied(RuntimeError):
    """A worker exited or stopped answering; handled by the sharded backends."""


class BootstrapError(RuntimeError):
    """A GroupVectorEnv was built while a worker imported the user's script."""
