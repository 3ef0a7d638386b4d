"""Group rollouts: ``num_groups x group_size`` envs, every env of a group on the same task.

GRPO-style trainers (GRPO, GiGPO, RLOO...) compare several trajectories that start from the same
task and initial state. :class:`GroupVectorEnv` runs those groups: env ``i`` belongs to group
``i // group_size``; all envs of a group are reset with the same per-group seed (so, for every
agentgym env, the same task and the same initial state), and different groups get different
seeds. Autoreset is off: an env whose episode ended stays done (``active[i] == False``) until the
next :meth:`GroupVectorEnv.reset`, which is what a trainer that collects whole trajectories wants.

Every step is recorded in a :class:`Trajectory` of :class:`Step` records; ``Step.state_key`` is the
state the action was taken *from* (GiGPO's anchor state).

Backends (``backend=``):

- ``"inprocess"`` (default): envs live in this process. Text env steps take micro- to milliseconds,
  so inter-process hops cost more than they save for light envs.
- ``"process"``: envs are split over ``num_workers`` worker processes that step their share in
  parallel; for heavy envs (real ALFWorld, WebShop's search engine).
- ``"ray"``: the same shards as Ray actors, spread over the machines of a Ray cluster.

With ``"process"`` and ``"ray"``, a worker that dies (killed, out of memory, a segfault in a
simulator) is replaced; the episodes it held end with ``truncated=True`` and
``info["truncation_reason"]`` saying why; nothing hangs.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import traceback
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

__all__ = ["Step", "Trajectory", "GroupVectorEnv", "EnvFactory", "make_group_vector_env"]

WrapperSpec = tuple[Callable[..., gym.Env], dict[str, Any]]


@dataclass
class Step:
    """One step of one trajectory."""

    observation: str
    """the observation the action was chosen from (after wrappers: e.g. the rendered prompt)"""
    action: str
    """the action as given to ``step`` (e.g. the raw model text before parsing)"""
    reward: float
    state_key: Hashable
    """``state_key`` of the state the action was taken FROM: the anchor state of GiGPO"""
    action_valid: bool
    info: dict[str, Any]
    """the info returned by this step"""


@dataclass
class Trajectory:
    """One episode of one env of a group."""

    group_id: int
    traj_id: int
    task_id: str
    steps: list[Step] = field(default_factory=list)
    won: bool = False
    terminated: bool = False
    truncated: bool = False
    truncation_reason: str | None = None

    @property
    def total_return(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass(frozen=True)
class EnvFactory:
    """A picklable recipe for one env: ``gym.make(env_id, **env_kwargs)`` then each wrapper."""

    env_id: str | gym.envs.registration.EnvSpec
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    wrappers: tuple[WrapperSpec, ...] = ()

    def __call__(self) -> gym.Env:
        import agentgym  # noqa: F401 - registers the ids inside worker processes

        # The passive checker only inspects the first reset/step; the registry-wide tests run
        # check_env, so vectorised copies skip it.
        env = gym.make(self.env_id, disable_env_checker=True, **self.env_kwargs)
        for wrapper, kwargs in self.wrappers:
            env = wrapper(env, **kwargs)
        return env


# ----------------------------------------------------------------------------------------------
# backends: run reset/step on a subset of envs, return per-env results in the order asked
# ----------------------------------------------------------------------------------------------
ResetResult = tuple[str, dict[str, Any]]
StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class _EnvHost:
    """Holds a shard of envs and answers ("reset" | "step", payload) commands.

    Used as is by the in-process backend, inside each worker process, and as a Ray actor.
    Payloads: reset ``[(local_index, seed, options)]``, step ``[(local_index, action)]``.
    """

    def __init__(self, factory: EnvFactory, num_envs: int):
        self.envs = [factory() for _ in range(num_envs)]

    def run(self, cmd: str, payload: Sequence[tuple]) -> list[Any]:
        if cmd == "reset":
            return [self.envs[i].reset(seed=seed, options=opts) for i, seed, opts in payload]
        if cmd == "step":
            return [self.envs[i].step(a) for i, a in payload]
        raise ValueError(f"unknown command {cmd!r}")

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _InProcessBackend(_EnvHost):
    def reset(self, requests: Sequence[tuple[int, int | None, dict | None]]) -> list[ResetResult]:
        return self.run("reset", requests)

    def step(self, requests: Sequence[tuple[int, Any]]) -> list[StepResult | None]:
        return self.run("step", requests)


def _worker_main(conn, factory: EnvFactory, num_envs: int) -> None:
    """Worker process loop around an :class:`_EnvHost`; replies ("ok" | "error", payload)."""
    try:
        host = _EnvHost(factory, num_envs)
        conn.send(("ready", None))
    except Exception:  # noqa: BLE001 - report construction errors to the parent, then exit
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            cmd, payload = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if cmd == "close":
            host.close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", host.run(cmd, payload)))
        except Exception:  # noqa: BLE001 - an env bug must reach the parent as an error, not a hang
            conn.send(("error", traceback.format_exc()))


class WorkerDied(RuntimeError):
    """A worker exited or stopped answering; handled by the sharded backends."""


class _ShardedBackend:
    """Envs split over workers (processes or Ray actors); env ``i`` lives in worker ``owner[i]``.

    Subclasses start, address and kill workers; this class splits requests into shards, sends
    them all before gathering (workers run in parallel), and turns a dead worker into a fresh
    one plus a reason for the episodes it held.
    """

    def __init__(self, factory: EnvFactory, num_envs: int, num_workers: int | None, timeout: float):
        num_workers = min(num_workers or os.cpu_count() or 1, num_envs)
        self.factory = factory
        self.timeout = timeout
        # contiguous slices keep a group inside one worker when group_size divides the slice
        bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int)
        self.slices = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        self.owner = np.repeat(np.arange(num_workers), [b - a for a, b in self.slices])
        self.last_deaths: dict[int, str] = {}

    # worker management, per kind of worker
    def _submit(self, w: int, cmd: str, payload: list[tuple]) -> Any:
        raise NotImplementedError

    def _collect(self, w: int, handle: Any) -> list[Any]:
        """The worker's answer; raises WorkerDied, or RuntimeError carrying an env's traceback."""
        raise NotImplementedError

    def replace(self, w: int) -> None:
        raise NotImplementedError

    def _roundtrip(
        self, cmd: str, requests: Sequence[tuple]
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Send each worker its share, then gather. Returns (results by env, death reason by worker)."""
        by_worker: dict[int, list[tuple]] = {}
        for req in requests:
            w = int(self.owner[req[0]])
            by_worker.setdefault(w, []).append((req[0] - self.slices[w][0], *req[1:]))
        dead: dict[int, str] = {}
        handles = {}
        for w, payload in by_worker.items():
            try:
                handles[w] = self._submit(w, cmd, payload)
            except WorkerDied as exc:
                dead[w] = str(exc)
        results: dict[int, Any] = {}
        for w, handle in handles.items():
            try:
                out = self._collect(w, handle)
            except WorkerDied as exc:
                dead[w] = str(exc)
                continue
            for local, res in zip(by_worker[w], out, strict=True):
                results[local[0] + self.slices[w][0]] = res
        return results, dead

    def reset(self, requests):
        results, dead = self._roundtrip("reset", requests)
        for w in dead:  # a reset must succeed: replace the worker and ask again, once
            self.replace(w)
        if dead:
            retry = [r for r in requests if int(self.owner[r[0]]) in dead]
            again, dead_again = self._roundtrip("reset", retry)
            if dead_again:
                raise RuntimeError(f"env workers keep dying on reset: {dead_again}")
            results.update(again)
        return [results[r[0]] for r in requests]

    def step(self, requests):
        results, dead = self._roundtrip("step", requests)
        for w in dead:
            self.replace(w)
        self.last_deaths = dead
        return [results.get(r[0]) for r in requests]  # None for envs whose worker died


class _ProcessBackend(_ShardedBackend):
    """Worker processes talking over pipes."""

    def __init__(self, factory: EnvFactory, num_envs: int, num_workers: int | None, timeout: float):
        super().__init__(factory, num_envs, num_workers, timeout)
        # forkserver/spawn avoid forking a parent that may hold threads (torch, vLLM)
        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        self.ctx = mp.get_context(method)
        self.procs: list[Any] = [None] * len(self.slices)
        self.conns: list[Any] = [None] * len(self.slices)
        for w in range(len(self.slices)):
            self._start(w)
        for w in range(len(self.slices)):
            self._expect_ready(w)

    def _start(self, w: int) -> None:
        parent, child = self.ctx.Pipe()
        a, b = self.slices[w]
        proc = self.ctx.Process(target=_worker_main, args=(child, self.factory, b - a), daemon=True)
        proc.start()
        child.close()
        self.procs[w], self.conns[w] = proc, parent

    def _expect_ready(self, w: int) -> None:
        status, payload = self._recv(w, timeout=max(self.timeout, 600.0))
        if status != "ready":
            raise RuntimeError(f"env worker {w} failed to build its envs:\n{payload}")

    def _recv(self, w: int, timeout: float) -> tuple[str, Any]:
        conn, proc = self.conns[w], self.procs[w]
        # poll in short slices so a dead worker is noticed at once instead of after the timeout
        waited = 0.0
        while not conn.poll(0.05):
            waited += 0.05
            if not proc.is_alive():
                if conn.poll(0):  # it answered just before exiting
                    break
                raise WorkerDied(self._death_reason(w))
            if waited >= timeout:
                proc.kill()
                raise WorkerDied(
                    f"env worker {w} (pid {proc.pid}) did not answer within {timeout:.0f} s"
                )
        try:
            return conn.recv()
        except (EOFError, OSError) as exc:
            raise WorkerDied(self._death_reason(w)) from exc

    def _death_reason(self, w: int) -> str:
        proc = self.procs[w]
        proc.join(timeout=1.0)
        code = proc.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return f"env worker {w} (pid {proc.pid}) died ({how}); it was replaced"

    def _submit(self, w: int, cmd: str, payload: list[tuple]) -> None:
        try:
            self.conns[w].send((cmd, payload))
        except (BrokenPipeError, OSError) as exc:
            raise WorkerDied(self._death_reason(w)) from exc

    def _collect(self, w: int, handle: None) -> list[Any]:
        status, out = self._recv(w, self.timeout)
        if status == "error":
            raise RuntimeError(f"env worker {w} raised:\n{out}")
        return out

    def replace(self, w: int) -> None:
        """Start a fresh worker ``w`` (its envs are new: they need a reset)."""
        old = self.procs[w]
        if old.is_alive():
            old.kill()
        old.join(timeout=5)
        self.conns[w].close()
        self._start(w)
        self._expect_ready(w)

    def close(self) -> None:
        for w, conn in enumerate(self.conns):
            try:
                conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
            self.procs[w].join(timeout=2)
            if self.procs[w].is_alive():
                self.procs[w].kill()
            conn.close()


class _RayBackend(_ShardedBackend):
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
    ):
        try:
            import ray
        except ImportError as exc:
            raise ImportError(
                "backend='ray' needs Ray: pip install 'agentgym-envs[ray]' "
                "(in a clone: pip install -e '.[ray]')"
            ) from exc
        super().__init__(factory, num_envs, num_workers, timeout)
        self.ray = ray
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.actor_cls = ray.remote(_EnvHost).options(**{"num_cpus": 1, **(ray_options or {})})
        self.actors = [self._spawn(w) for w in range(len(self.slices))]
        # wait until every actor has built its envs, so construction errors surface here
        for w, actor in enumerate(self.actors):
            try:
                ray.get(actor.run.remote("step", []), timeout=max(timeout, 600.0))
            except ray.exceptions.RayActorError as exc:
                raise RuntimeError(f"env worker {w} failed to build its envs:\n{exc}") from exc

    def _spawn(self, w: int):
        a, b = self.slices[w]
        return self.actor_cls.remote(self.factory, b - a)

    def _submit(self, w: int, cmd: str, payload: list[tuple]):
        return self.actors[w].run.remote(cmd, payload)

    def _collect(self, w: int, handle) -> list[Any]:
        ray = self.ray
        try:
            return ray.get(handle, timeout=self.timeout)
        except ray.exceptions.RayActorError as exc:
            raise WorkerDied(
                f"env worker {w} (Ray actor) died; it was replaced: {type(exc).__name__}"
            ) from exc
        except ray.exceptions.GetTimeoutError as exc:
            ray.kill(self.actors[w])
            raise WorkerDied(
                f"env worker {w} (Ray actor) did not answer within {self.timeout:.0f} s"
            ) from exc
        except ray.exceptions.RayTaskError as exc:
            raise RuntimeError(f"env worker {w} raised:\n{exc}") from exc

    def replace(self, w: int) -> None:
        self.ray.kill(self.actors[w], no_restart=True)
        self.actors[w] = self._spawn(w)

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)


# ----------------------------------------------------------------------------------------------
class GroupVectorEnv(gym.vector.VectorEnv):
    """``num_groups x group_size`` copies of one env id; every group's envs share task and state.

    Args:
        env_id: a registered id, e.g. ``"AgentGym/Sokoban-v0"``, or an ``EnvSpec`` (for envs
            registered only in this process: workers rebuild them from the spec's entry point).
        num_groups: how many distinct tasks per reset.
        group_size: trajectories per task (GiGPO / GRPO's group size ``N``).
        backend: ``"inprocess"`` (default) or ``"process"``.
        num_workers: worker processes for ``backend="process"`` (default: CPU count).
        env_kwargs: keyword arguments for ``gym.make(env_id, ...)``.
        wrappers: ``(wrapper_class, kwargs)`` pairs applied to every env in order (e.g. the LLM
            prompt/parse wrappers); picklable so that workers can build them.
        step_timeout: seconds a worker may take to answer before it is declared dead.
        ray_options: for ``backend="ray"``: actor options (``num_cpus``, ``resources``...).

    Batched results are lists / arrays of length ``num_envs = num_groups * group_size``:
    ``reset -> (obs: list[str], infos: list[dict])`` and
    ``step(actions) -> (obs: list[str], rewards: float32 (num_envs,), terminated: bool (num_envs,),
    truncated: bool (num_envs,), infos: list[dict])``. Infos are a list of per-env dicts (not
    gymnasium's dict of arrays): text-agent infos hold strings, lists and state keys. Envs that
    are no longer ``active`` ignore their action and report their final observation, reward 0
    and their final flags again.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.DISABLED}

    def __init__(
        self,
        env_id: str | gym.envs.registration.EnvSpec,
        num_groups: int = 1,
        group_size: int = 8,
        backend: str = "inprocess",
        num_workers: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[WrapperSpec] = (),
        step_timeout: float = 300.0,
        ray_options: dict[str, Any] | None = None,
    ):
        if num_groups < 1 or group_size < 1:
            raise ValueError(
                f"num_groups and group_size must be >= 1, got {num_groups}, {group_size}"
            )
        self.env_id = env_id
        self.num_groups = num_groups
        self.group_size = group_size
        self.num_envs = num_groups * group_size
        self.factory = EnvFactory(env_id, dict(env_kwargs or {}), tuple(wrappers))
        if backend == "inprocess":
            self._backend: Any = _InProcessBackend(self.factory, self.num_envs)
        elif backend == "process":
            self._backend = _ProcessBackend(self.factory, self.num_envs, num_workers, step_timeout)
        elif backend == "ray":
            self._backend = _RayBackend(
                self.factory, self.num_envs, num_workers, step_timeout, ray_options
            )
        else:
            raise ValueError(f"unknown backend {backend!r}; use 'inprocess', 'process' or 'ray'")
        self.backend = backend

        probe = self.factory() if backend != "inprocess" else self._backend.envs[0]
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        self.spec = probe.spec
        if backend != "inprocess":
            probe.close()
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        assert isinstance(self.observation_space, spaces.Tuple)

        self.group_ids = np.repeat(np.arange(num_groups), group_size)
        self.traj_ids = np.full(self.num_envs, -1, dtype=np.int64)
        self.step_index = np.zeros(self.num_envs, dtype=np.int64)
        self.active = np.zeros(self.num_envs, dtype=bool)
        self._terminated = np.zeros(self.num_envs, dtype=bool)
        self._truncated = np.zeros(self.num_envs, dtype=bool)
        self._next_traj_id = 0
        self._rng = np.random.default_rng()
        self._obs: list[str] = [""] * self.num_envs
        self._infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._trajs: list[Trajectory] = []
        self.closed = False

    # ------------------------------------------------------------------------------------------
    def group_seeds(self, seed: int | None) -> list[int]:
        """The per-group reset seeds: derived from ``seed`` (reproducible) or drawn fresh."""
        if seed is None:
            return [int(s) for s in self._rng.integers(0, 2**31 - 1, size=self.num_groups)]
        self._rng = np.random.default_rng(seed)
        return [int(s) for s in np.random.SeedSequence(seed).generate_state(self.num_groups) >> 1]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """Start a new episode in every env.

        Args:
            seed: reproducible per-group seeds are derived from it; None draws fresh ones.
            options: passed to every env's reset, except ``options["group_options"]``, a list of
                ``num_groups`` dicts passed to the envs of each group (e.g. ``{"task": 17}``).
        """
        options = dict(options or {})
        group_options = options.pop("group_options", None)
        if group_options is not None and len(group_options) != self.num_groups:
            raise ValueError(
                f"group_options has {len(group_options)} entries, expected {self.num_groups}"
            )
        seeds = self.group_seeds(seed)
        requests = []
        for i in range(self.num_envs):
            g = int(self.group_ids[i])
            opts = {**options, **(group_options[g] if group_options else {})}
            requests.append((i, seeds[g], opts or None))
        results = self._backend.reset(requests)

        self.traj_ids = np.arange(self._next_traj_id, self._next_traj_id + self.num_envs)
        self._next_traj_id += self.num_envs
        self.step_index[:] = 0
        self.active[:] = True
        self._terminated[:] = False
        self._truncated[:] = False
        self._trajs = []
        for i, (obs, info) in enumerate(results):
            self._obs[i], self._infos[i] = obs, info
            self._trajs.append(
                Trajectory(
                    int(self.group_ids[i]), int(self.traj_ids[i]), str(info.get("task_id", ""))
                )
            )
        return list(self._obs), list(self._infos)

    def step(
        self, actions: Sequence[Any]
    ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        if not self._trajs:
            raise gym.error.ResetNeeded("call reset() before step()")
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        live = np.flatnonzero(self.active)
        results = self._backend.step([(int(i), actions[i]) for i in live])
        deaths = getattr(self._backend, "last_deaths", {})
        for i, res in zip(live, results, strict=True):
            traj = self._trajs[i]
            anchor_obs, anchor_key = self._obs[i], self._infos[i].get("state_key")
            if res is None:  # its worker died: end the episode, keep what was recorded
                reason = deaths.get(int(self._backend.owner[i]), "env worker died")
                info = dict(self._infos[i], truncation_reason=reason, action_valid=False)
                self._infos[i] = info
                self._truncated[i] = True
                self.active[i] = False
                traj.truncated, traj.truncation_reason = True, reason
                continue
            obs, reward, terminated, truncated, info = res
            rewards[i] = reward
            self.step_index[i] += 1
            self._obs[i], self._infos[i] = obs, info
            traj.steps.append(
                Step(
                    anchor_obs,
                    _as_text(actions[i]),
                    float(reward),
                    anchor_key,
                    bool(info.get("action_valid", True)),
                    info,
                )
            )
            if terminated or truncated:
                self.active[i] = False
                self._terminated[i], self._truncated[i] = terminated, truncated
                traj.terminated, traj.truncated = bool(terminated), bool(truncated)
                traj.won = bool(info.get("won", False))
                if truncated:
                    traj.truncation_reason = info.get("truncation_reason", "step limit")
        return (
            list(self._obs),
            rewards,
            self._terminated.copy(),
            self._truncated.copy(),
            list(self._infos),
        )

    # ------------------------------------------------------------------------------------------
    def trajectories(self) -> list[Trajectory]:
        """The current episode of every env, in env order (finished or not)."""
        return list(self._trajs)

    @property
    def all_done(self) -> bool:
        return not self.active.any()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call a method (or read an attribute) of every env; in-process backend only."""
        if self.backend != "inprocess":
            raise NotImplementedError("call() needs backend='inprocess'")
        out = []
        for env in self._backend.envs:
            attr = env.get_wrapper_attr(name)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(out)

    def close_extras(self, **kwargs: Any) -> None:
        self._backend.close()

    def __repr__(self) -> str:
        return (
            f"GroupVectorEnv({self.env_id!r}, num_groups={self.num_groups}, "
            f"group_size={self.group_size}, backend={self.backend!r})"
        )


def _as_text(action: Any) -> str:
    return action if isinstance(action, str) else repr(action)


def make_group_vector_env(env_id: str, num_envs: int = 1, **kwargs: Any) -> GroupVectorEnv:
    """``gym.make_vec(env_id, num_envs=N, group_size=k, backend=...)`` lands here.

    ``num_envs`` must be a multiple of ``group_size`` (default 1: independent envs, gymnasium's
    usual meaning). Keyword arguments GroupVectorEnv does not take go to the env constructor.
    """
    group_keys = {"group_size", "backend", "num_workers", "wrappers", "step_timeout", "ray_options"}
    group_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in group_keys}
    group_size = int(group_kwargs.pop("group_size", 1))
    if num_envs % group_size:
        raise ValueError(f"num_envs={num_envs} is not a multiple of group_size={group_size}")
    return GroupVectorEnv(
        env_id,
        num_groups=num_envs // group_size,
        group_size=group_size,
        env_kwargs=kwargs,
        **group_kwargs,
    )


def vector_entry_point(env_id: str) -> Callable[..., GroupVectorEnv]:
    """The ``vector_entry_point`` registered for ``env_id`` (make_vec does not pass the id)."""
    return functools.partial(make_group_vector_env, env_id)
