"""The envs of one shard and the commands they answer: the in-process backend, each worker
process and each Ray actor all hold one :class:`EnvHost`."""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any

from agentgym.vector.factory import EnvFactory
from agentgym.vector.failures import Failure
from agentgym.vector.snapshot import restore_env, snapshot_env

__all__ = ["EnvHost", "bootstrap_worker"]


def bootstrap_worker() -> None:
    """What a fresh worker (a process of the pool, a Ray actor) does before it builds envs:
    register agentgym's ids with gymnasium, so that ``gym.make(id)`` finds them there."""
    import agentgym  # noqa: F401 - importing the package registers every id


class EnvHost:
    """Holds a shard of envs and answers ("reset" | "step", payload) commands.

    The in-process backend is one; each worker process holds one, and so does each Ray actor.
    Payloads: reset ``[(local_index, seed, options)]``, step ``[(local_index, action)]``. The
    answer has one entry per request: the env's result, or a :class:`Failure` if it raised
    (the other envs of the shard still run, so one bad env never desynchronises the rest).
    """

    def __init__(self, factory: EnvFactory, num_envs: int):
        self.envs = [factory() for _ in range(num_envs)]
        self.keep_exceptions = False  # in-process: keep the exception object for chaining
        # each env's last (observation, info) as its wrappers returned them, for snapshots
        self.last: list[tuple[str, dict[str, Any]] | None] = [None] * num_envs

    def run(self, cmd: str, payload: Sequence[tuple]) -> list[Any]:
        if cmd not in ("reset", "step", "snapshot", "restore"):
            raise ValueError(f"unknown command {cmd!r}")
        out: list[Any] = []
        for i, *args in payload:
            try:
                if cmd == "reset":
                    out.append(self.envs[i].reset(seed=args[0], options=args[1]))
                    self.last[i] = out[-1]
                elif cmd == "step":
                    out.append(self.envs[i].step(args[0]))
                    self.last[i] = (out[-1][0], out[-1][4])
                elif cmd == "snapshot":
                    out.append(snapshot_env(self.envs[i], self.last[i]))
                else:
                    out.append(restore_env(self.envs[i], args[0]))
                    self.last[i] = out[-1]
            except Exception as exc:  # noqa: BLE001 - reported per env, see Failure
                out.append(
                    Failure(
                        f"{type(exc).__name__}: {exc}".splitlines()[0][:500],
                        raised=True,
                        traceback=traceback.format_exc(),
                        exc=exc if self.keep_exceptions else None,
                    )
                )
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()
