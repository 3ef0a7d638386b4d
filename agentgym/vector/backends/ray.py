"""``backend="ray"``: the same shards as Ray actors, spread over the machines of a Ray cluster,
and the reference count that shuts down a Ray the vector env started itself."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from agentgym.extras import missing_extra
from agentgym.vector.backends.host import EnvHost, bootstrap_worker
from agentgym.vector.backends.sharded import ShardedBackend
from agentgym.vector.factory import EnvFactory
from agentgym.vector.failures import Failure, WorkerDied

__all__ = ["RayBackend", "RaySession"]


class _RayWorker(EnvHost):
    """The Ray actor: a bootstrapped worker process holding one shard of envs."""

    def __init__(self, factory: EnvFactory, num_envs: int):
        bootstrap_worker()
        super().__init__(factory, num_envs)


class RayBackend(ShardedBackend):
    """Ray actors, one per shard, on whatever nodes the Ray cluster has (``ray.init`` first to
    join a cluster; otherwise a local one is started). ``ray_options`` go to ``.options()``
    (e.g. ``{"num_cpus": 1, "resources": {...}}``)."""

    def __init__(
        self,
        factory: EnvFactory,
        num_envs: int,
        num_workers: int | None,
        timeout: float,
        ray_options: dict[str, Any] | None = None,
        address: str | None = None,
    ):
        try:
            import ray
        except ImportError as exc:
            raise missing_extra('backend="ray"', "Ray", "ray") from exc
        super().__init__(factory, num_envs, num_workers, timeout)
        self.ray = ray
        self.owns_ray = RaySession.acquire(ray, address)
        self.actor_cls = ray.remote(_RayWorker).options(**{"num_cpus": 1, **(ray_options or {})})
        self.actors = [self._spawn(w) for w in range(len(self.slices))]
        self.booting: set[int] = set()  # restarted actors not yet known to have built their envs
        # wait until every actor has built its envs, so construction errors surface here
        for w, actor in enumerate(self.actors):
            try:
                ray.get(actor.run.remote("step", []), timeout=max(timeout, 600.0))
            except ray.exceptions.RayActorError as exc:
                self.close()
                raise RuntimeError(f"env worker {w} failed to build its envs:\n{exc}") from exc
            except ray.exceptions.GetTimeoutError as exc:
                self.close()
                cpus = ray.cluster_resources().get("CPU", 0)
                raise RuntimeError(
                    f"Ray did not start env worker {w} of {len(self.actors)} within "
                    f"{max(timeout, 600.0):g} s (the cluster has {cpus:g} CPUs; each worker asks "
                    "for ray_options['num_cpus'], default 1): lower num_workers or num_cpus"
                ) from exc

    def _spawn(self, w: int):
        a, b = self.slices[w]
        return self.actor_cls.remote(self.factory, b - a)

    def _submit(self, w: int, cmd: str, payload: list[tuple]):
        return self.actors[w].run.remote(cmd, payload)

    def _gather(self, handles: dict[int, Any], deadline: float) -> dict[int, Any]:
        ray = self.ray
        refs = list(handles.values())
        ready, _ = ray.wait(
            refs, num_returns=len(refs), timeout=max(deadline - time.monotonic(), 0.0)
        )
        ready_set = set(ready)
        out: dict[int, Any] = {}
        for w, ref in handles.items():
            if ref not in ready_set:
                ray.kill(self.actors[w], no_restart=True)
                out[w] = WorkerDied(
                    f"env worker {w} (Ray actor) did not answer within {self.timeout:g} s; "
                    "it was stopped"
                )
                continue
            try:
                out[w] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                out[w] = WorkerDied(f"env worker {w} (Ray actor) died: {type(exc).__name__}")
            except ray.exceptions.RayError as exc:
                out[w] = Failure(
                    f"env worker {w} could not run the request", raised=True, traceback=str(exc)
                )
        return out

    def _restart(self, w: int) -> None:
        self.ray.kill(self.actors[w], no_restart=True)
        self.actors[w] = self._spawn(w)
        self.booting.add(w)

    def _prepare(self, workers: Sequence[int]) -> None:
        # A restarted actor first starts a process and builds its envs, which can take longer
        # than a step (a loaded machine, data to load): wait for that with the construction
        # allowance, so its first reset is not cut off by the step timeout.
        booting = [w for w in workers if w in self.booting]
        if not booting:
            return
        handles = {w: self._submit(w, "step", []) for w in booting}
        answers = self._gather(handles, time.monotonic() + max(self.timeout, 600.0))
        for w, out in answers.items():
            self.booting.discard(w)
            if isinstance(out, WorkerDied | Failure):
                raise RuntimeError(f"env worker {w} failed to build its envs: {out}")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for actor in getattr(self, "actors", ()):
            self.ray.kill(actor, no_restart=True)
        if self.owns_ray:
            RaySession.release(self.ray)


class RaySession:
    """The Ray that GroupVectorEnv initialised, shared by its Ray backends, shut down with the last.

    A Ray the user initialised before building the env (``ray.init(...)``: a local one or a
    cluster) is theirs and stays up after ``close()``. One that a backend started locally, or
    joined through ``ray_address``, is ended (or disconnected from) when the last env using it
    closes, so that a script leaves no Ray processes behind.
    """

    users = 0
    """open Ray backends using the Ray that GroupVectorEnv initialised (0: none, or the user's)"""

    @classmethod
    def acquire(cls, ray: Any, address: str | None) -> bool:
        """Join the current Ray or initialise one; True when the caller must :meth:`release`."""
        if ray.is_initialized():
            if cls.users == 0:
                return False  # the user's Ray
            cls.users += 1
            return True
        joining = address or os.environ.get("RAY_ADDRESS")
        try:
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        except (ConnectionError, ray.exceptions.AuthenticationError) as exc:
            if not joining:
                raise
            raise ConnectionError(_join_failed(joining, exc)) from exc
        cls.users = 1
        return True

    @classmethod
    def release(cls, ray: Any) -> None:
        cls.users = max(cls.users - 1, 0)
        if cls.users == 0:
            ray.shutdown()


def _join_failed(address: str, exc: BaseException) -> str:
    """Why joining the Ray cluster at ``address`` failed, most likely, and what to do.

    Recent Ray (2.60 among them) authenticates with a token: a cluster started by ``ray.init()``
    turns it on by default, and ``ray start --head`` does when a token file exists. A driver
    joining such a cluster at an explicit address does not turn it on by itself (only ``"auto"``
    does, and only when it finds a token), and the cluster then refuses it after Ray's
    connection retries, with a ``ConnectionError`` that does not say why.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if mode is not None and mode.lower() == "token":
        hint = (
            "RAY_AUTH_MODE=token is set: check that it was set before this process imported "
            "Ray (Ray reads it once), that this machine has the cluster's token (the head "
            "node's ~/.ray/auth_token, as RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN), and that the "
            "address is the cluster's GCS address (head-node-ip:6379)"
        )
    else:
        hint = (
            "if the cluster uses token authentication (a cluster started by ray.init() does by "
            "default in recent Ray, and `ray start --head` does when a token file exists), set "
            "RAY_AUTH_MODE=token on this machine before Ray is imported and give it the "
            "cluster's token (copy the head node's ~/.ray/auth_token here, or set "
            "RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN); "
            "otherwise check that the address is the cluster's GCS address (head-node-ip:6379) "
            "and reachable from here"
        )
    return f"could not join the Ray cluster at {address} ({reason}); {hint}"
