"""Group rollouts: ``num_groups x group_size`` envs, every env of a group on the same task.

GRPO-style trainers (GRPO, GiGPO, RLOO...) compare several trajectories that start from the same
task and initial state. :class:`GroupVectorEnv` runs those groups: env ``i`` belongs to group
``i // group_size``; all envs of a group are reset with the same per-group seed (so, for every
agentgym env, the same task and the same initial state), and different groups get different
seeds. Autoreset is off: an env whose episode ended stays done (``active[i] == False``) until the
next :meth:`GroupVectorEnv.reset`, which is what a trainer that collects whole trajectories wants.

Every step is recorded in a :class:`Trajectory` of :class:`Step` records; ``Step.state_key`` is the
state the action was taken *from* (GiGPO's anchor state).

Branching (every backend): :meth:`GroupVectorEnv.snapshot` takes env ``i``'s state (env and
wrappers), :meth:`GroupVectorEnv.reset_to` starts every env from a snapshot (e.g. k copies of
one state, for SLATE's step-level groups), and :meth:`GroupVectorEnv.branch` copies one env
mid-rollout into others. Branched records keep the shared prefix and mark the branch point
(:attr:`Trajectory.branch_step`, :attr:`Trajectory.branch_of`).

Backends (``backend=``):

- ``"inprocess"`` (default): envs live in this process. Text env steps take micro- to milliseconds,
  so inter-process hops cost more than they save for light envs.
- ``"process"``: envs are split over ``num_workers`` worker processes that step their share in
  parallel; for heavy envs (real ALFWorld, WebShop's search engine). Workers are fresh
  interpreters that import only agentgym (and the user's script only when an env or wrapper
  class is defined there), so scripts work without an ``if __name__ == "__main__":`` guard;
  they run in their own process group and ignore SIGINT, so Ctrl-C reaches only the caller.
- ``"ray"``: the same shards as Ray actors, spread over the machines of a Ray cluster.

Faults (``"process"`` and ``"ray"`` alike):

- A worker that dies (killed, out of memory, a segfault in a simulator) or does not answer
  within ``step_timeout`` (one deadline for all workers of a call) ends the episodes it held
  with ``truncated=True`` and ``info["truncation_reason"]`` saying why; a fresh worker starts at
  once and takes those envs at the next reset. Nothing hangs.
- An env that raises ends its own episode the same way; the other envs take their step; then
  :class:`EnvError` names the env (index and group) and the cause. In ``reset``, the error is
  raised after every env has answered, and ``step`` asks for another reset.
- An action that cannot be pickled is an invalid step, as in-process.
- After ``KeyboardInterrupt`` in ``step``, the next call must be ``reset`` (the records no
  longer say which envs stepped); replies of the abandoned call are recognised and dropped.
- After ``close()``, ``reset`` / ``step`` / ``call`` raise ``ClosedEnvironmentError``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from agentgym.core import EnvSnapshot, SnapshotMismatch

__all__ = [
    "Step",
    "Trajectory",
    "GroupVectorEnv",
    "EnvError",
    "GroupEnvSnapshot",
    "EnvFactory",
    "make_group_vector_env",
]

WrapperSpec = tuple[Callable[..., gym.Env], dict[str, Any]]
#: ``info_layout="list"``: one dict per env; ``"gymnasium"``: a dict of arrays and ``_key`` masks
Infos = list[dict[str, Any]] | dict[str, Any]


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
    """One episode of one env of a group.

    A branched episode (:meth:`GroupVectorEnv.branch`, or :meth:`GroupVectorEnv.reset_to` with
    a prefix) starts with a copy of the steps its source took before the branch point (same
    observations, actions, rewards and ``state_key`` s), so every record is a whole episode.
    ``branch_step`` is the index of its first own step and ``branch_of`` the
    ``(group_id, traj_id)`` of the trajectory it was copied from.

    Building groups from branches: the k continuations of one prefix (SLATE's group) are the
    trajectories with equal ``(branch_of, branch_step)``, plus the source itself (the one whose
    ``(group_id, traj_id)`` is ``branch_of``) when it was stepped on as one of them; they differ
    from ``steps[branch_step]`` on. Following ``branch_of`` links from the leaves gives the
    tree of a tree-shaped rollout.
    """

    group_id: int
    traj_id: int
    task_id: str
    steps: list[Step] = field(default_factory=list)
    won: bool = False
    terminated: bool = False
    truncated: bool = False
    truncation_reason: str | None = None
    branch_step: int | None = None
    """index in ``steps`` of the first step taken after the branch point; None: not a branch"""
    branch_of: tuple[int, int] | None = None
    """``(group_id, traj_id)`` of the trajectory the prefix was copied from; None: not a branch"""
    start_info: dict[str, Any] | None = None
    """the info of the state the episode started from (its ``reset``; a branch's is its
    source's), which ``steps[0]`` acted from: what a judge compares the first round with"""

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


@dataclass
class _Failure:
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


class _UnsendableAction:
    """An action that cannot be pickled (a lambda, a lock), as it reaches a worker.

    Not text, so the env treats it exactly as it treats the original in-process (an invalid
    step); its ``repr`` is the original's, so the observation is the same text too.
    """

    __slots__ = ("text",)

    def __init__(self, action: Any):
        self.text = repr(action)

    def __repr__(self) -> str:
        return self.text


def _sendable(action: Any) -> Any:
    if isinstance(action, (str, bytes)):
        return action
    try:
        pickle.dumps(action)
    except Exception:  # noqa: BLE001 - whatever pickle raises, the action cannot travel
        return _UnsendableAction(action)
    return action


class _EnvHost:
    """Holds a shard of envs and answers ("reset" | "step", payload) commands.

    Used as is by the in-process backend, inside each worker process, and as a Ray actor.
    Payloads: reset ``[(local_index, seed, options)]``, step ``[(local_index, action)]``. The
    answer has one entry per request: the env's result, or a :class:`_Failure` if it raised
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
                    out.append(_snapshot_env(self.envs[i], self.last[i]))
                else:
                    out.append(_restore_env(self.envs[i], args[0]))
                    self.last[i] = out[-1]
            except Exception as exc:  # noqa: BLE001 - reported per env, see _Failure
                out.append(
                    _Failure(
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


def _snapshot_env(env: gym.Env, last: tuple[str, dict[str, Any]] | None) -> GroupEnvSnapshot:
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
    return GroupEnvSnapshot(*(getattr(base, name) for name in _BASE_FIELDS), wrapped=wrapped)


def _restore_env(env: gym.Env, snap: EnvSnapshot) -> tuple[str, dict[str, Any]]:
    """Restore ``env`` and its wrappers; returns the (observation, info) they last returned.

    A bare ``EnvSnapshot`` carries no wrapper state: accepted only when the wrappers are
    gymnasium's bookkeeping ones (what ``gym.make`` adds), which are then set as after a reset.
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
        elif isinstance(wrapper, gym.wrappers.TimeLimit):
            wrapper._elapsed_steps = snap.elapsed_steps
    return snap.last_obs, snap.info


_GYM_BOOKKEEPING = (
    gym.wrappers.OrderEnforcing,
    gym.wrappers.TimeLimit,
    gym.wrappers.PassiveEnvChecker,
)
_BASE_FIELDS = tuple(f.name for f in dataclasses.fields(EnvSnapshot))


class _InProcessBackend(_EnvHost):
    def __init__(self, factory: EnvFactory, num_envs: int):
        super().__init__(factory, num_envs)
        self.keep_exceptions = True

    def reset(self, requests: Sequence[tuple[int, int | None, dict | None]]) -> list[Any]:
        return self.run("reset", requests)

    def step(self, requests: Sequence[tuple[int, Any]]) -> list[Any]:
        return self.run("step", requests)

    def call_envs(self, cmd: str, requests: Sequence[tuple]) -> list[Any]:
        """``"snapshot"`` ``[(index,)]`` or ``"restore"`` ``[(index, snapshot)]``, per env."""
        return self.run(cmd, requests)


class WorkerDied(RuntimeError):
    """A worker exited or stopped answering; handled by the sharded backends."""


class _ShardedBackend:
    """Envs split over workers (processes or Ray actors); env ``i`` lives in worker ``owner[i]``.

    Subclasses start, address and kill workers; this class splits requests into shards, sends
    them all before gathering (workers run in parallel), waits for every answer against ONE
    deadline (k hung workers cost one ``timeout``, not k), and turns a lost worker into a
    :class:`_Failure` for each env it held plus a fresh worker, started at once and awaited at
    its next use (its envs are new, so that use is a reset).
    """

    kind = "worker"

    def __init__(self, factory: EnvFactory, num_envs: int, num_workers: int | None, timeout: float):
        num_workers = min(num_workers or os.cpu_count() or 1, num_envs)
        self.factory = factory
        self.timeout = timeout
        # contiguous slices keep a group inside one worker when group_size divides the slice
        bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int)
        self.slices = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        self.owner = np.repeat(np.arange(num_workers), [b - a for a, b in self.slices])
        self.closed = False

    # worker management, per kind of worker
    def _submit(self, w: int, cmd: str, payload: list[tuple]) -> Any:
        """Send ``w`` its share; returns a handle for :meth:`_gather`; raises WorkerDied."""
        raise NotImplementedError

    def _gather(self, handles: dict[int, Any], deadline: float) -> dict[int, Any]:
        """Each worker's answer (a list with one entry per request) or the WorkerDied that
        ended it, waiting for all of them until ``deadline`` (``time.monotonic()``)."""
        raise NotImplementedError

    def _restart(self, w: int) -> None:
        """Kill worker ``w`` if it still runs and start a fresh one (without waiting for it)."""
        raise NotImplementedError

    def _prepare(self, workers: Sequence[int]) -> None:
        """Make sure ``workers`` are up (wait for restarted ones) before they are sent work."""

    def _roundtrip(self, cmd: str, requests: Sequence[tuple]) -> tuple[dict[int, Any], dict]:
        """Send each worker its share, then gather. Returns (results by env, reason by lost worker)."""
        by_worker: dict[int, list[tuple]] = {}
        for req in requests:
            w = int(self.owner[req[0]])
            by_worker.setdefault(w, []).append((req[0] - self.slices[w][0], *req[1:]))
        self._prepare(list(by_worker))
        lost: dict[int, str] = {}
        handles = {}
        for w, payload in by_worker.items():
            try:
                handles[w] = self._submit(w, cmd, payload)
            except WorkerDied as exc:
                lost[w] = str(exc)
        answers = self._gather(handles, time.monotonic() + self.timeout) if handles else {}
        results: dict[int, Any] = {}
        for w, out in answers.items():
            if isinstance(out, WorkerDied):
                lost[w] = str(out)
                continue
            start = self.slices[w][0]
            if isinstance(out, _Failure):  # the worker could not run the request at all
                out = [out] * len(by_worker[w])
            for local, res in zip(by_worker[w], out, strict=True):
                results[local[0] + start] = res
        for w in lost:
            self._restart(w)
        return results, lost

    def reset(self, requests: Sequence[tuple]) -> list[Any]:
        results, lost = self._roundtrip("reset", requests)
        if lost:  # a reset must succeed: ask the fresh workers once more
            retry = [r for r in requests if int(self.owner[r[0]]) in lost]
            again, lost_again = self._roundtrip("reset", retry)
            if lost_again:
                raise RuntimeError(
                    f"env workers keep failing on reset: {'; '.join(lost_again.values())}"
                )
            results.update(again)
        return [results[r[0]] for r in requests]

    def step(self, requests: Sequence[tuple]) -> list[Any]:
        # Convert what cannot be pickled before anything is sent, so that no shard is stepped
        # while another fails to leave (the in-process backend sees the same invalid action).
        requests = [(i, _sendable(a)) for i, a in requests]
        results, lost = self._roundtrip("step", requests)
        for r in requests:
            w = int(self.owner[r[0]])
            if w in lost:
                why = f"{lost[w]}; its envs restart at the next reset"
                results[r[0]] = _Failure(why, raised=False)
        return [results[r[0]] for r in requests]

    def call_envs(self, cmd: str, requests: Sequence[tuple]) -> list[Any]:
        """``"snapshot"`` / ``"restore"`` per env (snapshots travel pickled, so a snapshot of
        one worker's env restores into another's); an env whose worker was lost gets a
        :class:`_Failure` (its worker restarts, so its envs need a reset)."""
        results, lost = self._roundtrip(cmd, requests)
        for r in requests:
            w = int(self.owner[r[0]])
            if w in lost:
                results[r[0]] = _Failure(
                    f"{lost[w]}; its envs restart at the next reset", raised=False
                )
        return [results[r[0]] for r in requests]


#: Set in a worker while it imports the user's ``__main__`` script (only done when the envs
#: need a class defined there); a GroupVectorEnv built at import time then refuses to start
#: workers of its own, instead of spawning without end.
_IMPORTING_MAIN_IN_WORKER = False

# The child imports nothing of the parent's script: its sys.path comes from the parent, then
# it runs _worker_main. SIGINT is ignored from the first instruction (a terminal's Ctrl-C is the
# parent's to handle; workers also run in their own process group so it rarely reaches them).
_WORKER_BOOT = (
    "import signal, sys, json; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "sys.path[:] = json.loads(sys.argv[2]); "
    "from agentgym.wrappers.group import _worker_main; _worker_main(int(sys.argv[1]))"
)


def _worker_main(fd: int) -> None:
    """Worker process loop around an :class:`_EnvHost`.

    Protocol over one socket: the parent sends ``(main_path, factory_bytes, num_envs)``; the
    worker answers ``(0, "ready" | "error" | "bootstrap", detail)``, then answers each ``(seq, cmd, payload)``
    with ``(seq, "ok" | "error", result)``. Echoing ``seq`` lets the parent drop the answers
    of a call it abandoned (an interrupt, a timeout) instead of reading them as the next one's.
    """
    global _IMPORTING_MAIN_IN_WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = mp_connection.Connection(fd)
    try:
        main_path, factory_bytes, num_envs = conn.recv()
        if main_path:  # the envs' classes live in the user's script: import it as spawn does
            from multiprocessing import spawn

            _IMPORTING_MAIN_IN_WORKER = True
            spawn.import_main_path(main_path)
            _IMPORTING_MAIN_IN_WORKER = False
        host = _EnvHost(pickle.loads(factory_bytes), num_envs)
    except BaseException as exc:  # noqa: BLE001 - report construction errors, then exit
        if isinstance(exc, _BootstrapError):
            conn.send((0, "bootstrap", exc.args[0]))
        else:
            conn.send((0, "error", traceback.format_exc()))
        return
    conn.send((0, "ready", None))
    while True:
        try:
            seq, cmd, payload = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if cmd == "close":
            host.close()
            conn.send((seq, "ok", None))
            break
        try:
            out = host.run(cmd, payload)
            conn.send((seq, "ok", out))  # pickled whole before writing: never half-sent
        except Exception:  # noqa: BLE001 - e.g. an info dict that does not pickle
            conn.send((seq, "error", traceback.format_exc()))


class _BootstrapError(RuntimeError):
    """A GroupVectorEnv was built while a worker imported the user's script."""


def _kill_workers(procs: list[subprocess.Popen | None]) -> None:
    """Last resort at exit or garbage collection: no worker outlives its GroupVectorEnv."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
    for proc in procs:
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)


class _ProcessBackend(_ShardedBackend):
    """Worker processes, each a fresh interpreter talking over a socket pair.

    Workers are started with ``subprocess`` rather than ``multiprocessing`` so that they never
    re-run the user's script (a script without an ``if __name__ == "__main__":`` guard works),
    they never receive the terminal's Ctrl-C (their own process group), and they are killed
    when this backend is closed, garbage collected, or the interpreter exits.
    """

    def __init__(self, factory: EnvFactory, num_envs: int, num_workers: int | None, timeout: float):
        if os.name != "posix":
            raise NotImplementedError(
                "backend='process' starts its workers with POSIX facilities (inherited sockets, "
                "process groups); on this system use backend='ray' or 'inprocess'"
            )
        super().__init__(factory, num_envs, num_workers, timeout)
        try:
            self.factory_bytes = pickle.dumps(factory)
        except Exception as exc:  # noqa: BLE001 - pickle raises several types
            raise TypeError(
                "backend='process' sends env_kwargs and wrappers to worker processes, so they "
                f"must pickle (module-level classes and functions, no lambdas): {exc}"
            ) from exc
        main = sys.modules.get("__main__")
        main_path = getattr(main, "__file__", None)
        # Only import the user's script in workers when the envs need something defined there.
        self.main_path = main_path if main_path and b"__main__" in self.factory_bytes else None
        self.procs: list[subprocess.Popen | None] = [None] * len(self.slices)
        self.conns: list[Any] = [None] * len(self.slices)
        self.booting: set[int] = set()  # started, "ready" not read yet
        self.broken: set[int] = set()  # a send or receive was cut short: the stream is unusable
        self.seq = 0
        self._finalizer = weakref.finalize(self, _kill_workers, self.procs)
        for w in range(len(self.slices)):
            self._start(w)
        try:
            self._prepare(range(len(self.slices)), building=True)
        except BaseException:
            self.close()
            raise

    def _start(self, w: int) -> None:
        parent, child = socket.socketpair()
        a, b = self.slices[w]
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _WORKER_BOOT,
                    str(child.fileno()),
                    json.dumps([str(p) for p in sys.path]),
                ],
                pass_fds=(child.fileno(),),
                process_group=0,
                stdin=subprocess.DEVNULL,  # the terminal's input stays the caller's
            )
        finally:
            child.close()
        conn = mp_connection.Connection(parent.detach())
        conn.send((self.main_path, self.factory_bytes, b - a))
        self.procs[w], self.conns[w] = proc, conn
        self.booting.add(w)
        self.broken.discard(w)

    def _prepare(self, workers: Sequence[int], building: bool = False) -> None:
        for w in list(workers):
            if w in self.broken:
                self._restart(w)
        waiting = {w: 0 for w in workers if w in self.booting}
        if not waiting:
            return
        # building envs may load data (ALFWorld games, an index): allow more than a step
        answers = self._wait(waiting, time.monotonic() + max(self.timeout, 600.0))
        errors: dict[str, list[int]] = {}  # what went wrong -> the workers it happened to
        for w, out in answers.items():
            self.booting.discard(w)
            if isinstance(out, WorkerDied):
                errors.setdefault(f"{out.args[0]} while building its envs", []).append(w)
            elif out[1] == "bootstrap":  # one line that says what to change in the script
                errors.setdefault(f"failed to build its envs: {out[2]}", []).append(w)
            elif out[1] != "ready":
                errors.setdefault(f"failed to build its envs:\n{out[2]}", []).append(w)
        if errors:
            if not building:  # leave no dead connection behind: the next reset tries again
                for ws in errors.values():
                    for w in ws:
                        self._restart(w)
            raise RuntimeError(
                "\n".join(
                    f"env worker {ws[0]} {what}"
                    if len(ws) == 1
                    else f"env workers {', '.join(map(str, sorted(ws)))} "
                    + what.replace(" its envs", " their envs")
                    for what, ws in errors.items()
                )
            )

    def _submit(self, w: int, cmd: str, payload: list[tuple]) -> int:
        self.seq += 1
        try:
            self.conns[w].send((self.seq, cmd, payload))
        except (BrokenPipeError, ConnectionError, OSError) as exc:
            raise WorkerDied(f"env worker {w} {self._death(w)}") from exc
        except BaseException:  # interrupted mid-write: the worker may hold half a message
            self.broken.add(w)
            raise
        return self.seq

    def _gather(self, handles: dict[int, int], deadline: float) -> dict[int, Any]:
        answers = self._wait(handles, deadline)
        out: dict[int, Any] = {}
        for w, ans in answers.items():
            if isinstance(ans, WorkerDied):
                ans.args = (f"env worker {w} {ans.args[0]}",)
                out[w] = ans
            elif ans[1] == "error":
                out[w] = _Failure(
                    f"env worker {w} could not run the request", raised=True, traceback=ans[2]
                )
            else:
                out[w] = ans[2]
        return out

    def _wait(self, expected: dict[int, int], deadline: float) -> dict[int, Any]:
        """Read each worker's reply tagged ``expected[w]``, dropping stale ones, until ``deadline``.

        Returns per worker the reply ``(seq, status, payload)`` or a WorkerDied whose message
        (without the "env worker w" prefix) says what happened; a worker that has not answered
        by the deadline is killed.
        """
        pending = dict(expected)
        answers: dict[int, Any] = {}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            by_conn = {self.conns[w]: w for w in pending}
            # wake at least every 0.5 s: a worker whose socket a grandchild still holds open
            # shows its death only through poll()
            ready = mp_connection.wait(list(by_conn), timeout=min(remaining, 0.5))
            for conn in ready:
                w = by_conn[conn]
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    answers[w] = WorkerDied(self._death(w))
                    del pending[w]
                    continue
                except Exception as exc:  # noqa: BLE001 - a garbled stream: the worker is unusable
                    self._kill(w)
                    answers[w] = WorkerDied(f"sent an unreadable reply ({exc!r}); it was stopped")
                    del pending[w]
                    continue
                except BaseException:  # interrupted mid-read
                    self.broken.add(w)
                    raise
                if reply[0] == pending[w]:
                    answers[w] = reply
                    del pending[w]
            if ready:  # a dead worker's socket reads as ready (EOF): check exits only when idle
                continue
            for w in [w for w in pending if self.procs[w].poll() is not None]:
                if not self.conns[w].poll(0):  # nothing left to read: it is gone
                    answers[w] = WorkerDied(self._death(w))
                    del pending[w]
        for w in pending:
            self._kill(w)
            answers[w] = WorkerDied(
                f"(pid {self.procs[w].pid}) did not answer within {self.timeout:g} s; "
                "it was stopped"
            )
        return answers

    def _death(self, w: int) -> str:
        proc = self.procs[w]
        try:
            code = proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return f"(pid {proc.pid}) closed its connection"
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"(pid {proc.pid}) died ({how})"

    def _kill(self, w: int) -> None:
        proc = self.procs[w]
        if proc.poll() is None:
            proc.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    def _restart(self, w: int) -> None:
        self._kill(w)
        self.conns[w].close()
        self.booting.discard(w)
        self._start(w)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        live = {}
        for w, conn in enumerate(self.conns):
            if conn is None or self.procs[w].poll() is not None or w in self.broken:
                continue
            self.seq += 1
            with contextlib.suppress(Exception):
                conn.send((self.seq, "close", None))
                live[w] = self.seq
        with contextlib.suppress(Exception):
            self._wait(live, time.monotonic() + 2.0)  # one grace period for all
        for w, conn in enumerate(self.conns):
            if conn is not None:
                self._kill(w)
                conn.close()
        self._finalizer.detach()


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
        address: str | None = None,
    ):
        try:
            import ray
        except ImportError as exc:
            raise ImportError('backend="ray" needs Ray: pip install "agentgym-envs[ray]"') from exc
        super().__init__(factory, num_envs, num_workers, timeout)
        self.ray = ray
        self.owns_ray = _RaySession.acquire(ray, address)
        self.actor_cls = ray.remote(_EnvHost).options(**{"num_cpus": 1, **(ray_options or {})})
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
                out[w] = _Failure(
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
            if isinstance(out, WorkerDied | _Failure):
                raise RuntimeError(f"env worker {w} failed to build its envs: {out}")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for actor in getattr(self, "actors", ()):
            self.ray.kill(actor, no_restart=True)
        if self.owns_ray:
            _RaySession.release(self.ray)


class _RaySession:
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
        ray.init(
            address=address, include_dashboard=False, log_to_driver=False, configure_logging=False
        )
        cls.users = 1
        return True

    @classmethod
    def release(cls, ray: Any) -> None:
        cls.users = max(cls.users - 1, 0)
        if cls.users == 0:
            ray.shutdown()


# ----------------------------------------------------------------------------------------------
class GroupVectorEnv(gym.vector.VectorEnv):
    """``num_groups x group_size`` copies of one env id; every group's envs share task and state.

    Args:
        env_id: a registered id, e.g. ``"AgentGym/Sokoban-v0"``, or an ``EnvSpec`` (for envs
            registered only in this process: workers rebuild them from the spec's entry point).
        num_groups: how many distinct tasks per reset.
        group_size: trajectories per task (GiGPO / GRPO's group size ``N``).
        backend: ``"inprocess"`` (default), ``"process"`` or ``"ray"``.
        num_workers: worker processes / Ray actors (default: CPU count, at most one per env).
        env_kwargs: keyword arguments for ``gym.make(env_id, ...)``.
        wrappers: ``(wrapper_class, kwargs)`` pairs applied to every env in order (e.g. the LLM
            prompt/parse wrappers); picklable so that workers can build them.
        step_timeout: seconds every worker has to answer one ``reset`` / ``step`` (one deadline
            for all of them); a worker still silent then is killed and its episodes end.
        ray_options: for ``backend="ray"``: actor options (``num_cpus``, ``resources``...).

        ray_address: for ``backend="ray"`` when Ray is not initialised yet: the cluster to join
            (``"auto"``, ``"ray://head:10001"``...; None: ``RAY_ADDRESS`` or a new local Ray).
            A Ray that this env started or joined is shut down (or left) when the last env
            using it closes; a Ray the user initialised stays up.
        info_layout: ``"list"`` (default): infos are a list of per-env dicts, what the trainers
            and :func:`agentgym.rollout.run_group_rollout` read. ``"gymnasium"``: Gymnasium's
            vector layout, a dict of arrays with a boolean ``"_key"`` mask per key, which
            Gymnasium's vector wrappers (``RecordEpisodeStatistics``, ``DictInfoToList``...)
            expect. Either way :attr:`infos_list` gives the list view.

    Batched results are lists / arrays of length ``num_envs = num_groups * group_size``:
    ``reset -> (obs: list[str], infos)`` and
    ``step(actions) -> (obs: list[str], rewards: float32 (num_envs,), terminated: bool (num_envs,),
    truncated: bool (num_envs,), infos)``. Envs that are no longer ``active`` ignore their action
    and report their final observation and reward 0. With ``info_layout="list"`` they also repeat
    their final flags and info. With ``"gymnasium"``, as in Gymnasium's vector envs (autoreset
    disabled), ``terminated`` / ``truncated`` mark only the step an episode ended, and an env that
    did not step has no entry in the infos (its ``_key`` masks are False): so episode statistics
    count each episode once. Text-agent infos hold strings, lists and state keys: in the
    gymnasium layout those are object arrays (``infos["state_key"][i]``).
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
        ray_address: str | None = None,
        info_layout: str = "list",
    ):
        if info_layout not in ("list", "gymnasium"):
            raise ValueError(f"info_layout must be 'list' or 'gymnasium', got {info_layout!r}")
        self.info_layout = info_layout
        if num_groups < 1 or group_size < 1:
            raise ValueError(
                f"num_groups and group_size must be >= 1, got {num_groups}, {group_size}"
            )
        self.env_id = env_id
        self.num_groups = num_groups
        self.group_size = group_size
        self.num_envs = num_groups * group_size
        self.factory = EnvFactory(env_id, dict(env_kwargs or {}), tuple(wrappers))
        if backend == "process" and _IMPORTING_MAIN_IN_WORKER:
            raise _BootstrapError(
                "an env worker imported this script (its envs use a class defined in it) and the "
                "script built a GroupVectorEnv at import time: put the script's code under "
                '`if __name__ == "__main__":`, or define the env and wrapper classes in a module'
            )
        self.closed = False  # before the backend starts: __del__ must see it if that fails
        if backend == "inprocess":
            self._backend: Any = _InProcessBackend(self.factory, self.num_envs)
        elif backend == "process":
            self._backend = _ProcessBackend(self.factory, self.num_envs, num_workers, step_timeout)
        elif backend == "ray":
            self._backend = _RayBackend(
                self.factory, self.num_envs, num_workers, step_timeout, ray_options, ray_address
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
        self.observation_space = _compact(batch_space(self.single_observation_space, self.num_envs))
        self.action_space = _compact(batch_space(self.single_action_space, self.num_envs))
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
        #: why step() needs a reset first (None once a reset succeeded)
        self._reset_needed: str | None = "call reset() before step()"

    # ------------------------------------------------------------------------------------------
    def group_seeds(self, seed: int | None) -> list[int]:
        """The per-group reset seeds: derived from ``seed`` (reproducible) or drawn fresh."""
        if seed is None:
            return [int(s) for s in self._rng.integers(0, 2**31 - 1, size=self.num_groups)]
        self._rng = np.random.default_rng(seed)
        return [int(s) for s in np.random.SeedSequence(seed).generate_state(self.num_groups) >> 1]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[str], Infos]:
        """Start a new episode in every env.

        Args:
            seed: reproducible per-group seeds are derived from it; None draws fresh ones.
            options: passed to every env's reset, except ``options["group_options"]``, a list of
                ``num_groups`` dicts passed to the envs of each group (e.g. ``{"task": 17}``).
        """
        options = dict(options or {})
        if "reset_mask" in options:
            # Gymnasium's partial reset: a group's envs must restart together on one task
            raise ValueError(
                "GroupVectorEnv resets every env at once (the envs of a group share a task), so "
                "options['reset_mask'] is not supported: call reset() without it when all_done"
            )
        group_options = options.pop("group_options", None)
        if group_options is not None and len(group_options) != self.num_groups:
            raise ValueError(
                f"group_options has {len(group_options)} entries, expected {self.num_groups}"
            )
        self._check_open()
        seeds = self.group_seeds(seed)
        requests = []
        for i in range(self.num_envs):
            g = int(self.group_ids[i])
            opts = {**options, **(group_options[g] if group_options else {})}
            requests.append((i, seeds[g], opts or None))
        # Until every env has reset, the records describe no episode: a reset that raises or is
        # interrupted leaves step() asking for another reset, not stepping half-old envs.
        self._reset_needed = "the last reset() did not complete; call reset() again"
        self.active[:] = False
        try:
            results = self._backend.reset(requests)
        except KeyboardInterrupt:
            raise KeyboardInterrupt("GroupVectorEnv.reset() interrupted") from None
        failed = [i for i, res in enumerate(results) if isinstance(res, _Failure)]
        if failed:
            raise self._env_error(failed, [results[i] for i in failed], "reset")

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
                    int(self.group_ids[i]),
                    int(self.traj_ids[i]),
                    str(info.get("task_id", "")),
                    start_info=info,
                )
            )
        self._reset_needed = None
        if self.info_layout == "gymnasium":
            return list(self._obs), self._gymnasium_infos(np.ones(self.num_envs, dtype=bool))
        return list(self._obs), list(self._infos)

    def step(
        self, actions: Sequence[Any]
    ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, Infos]:
        """Step every active env; see the class docstring for shapes.

        An env that raises ends its episode truncated (``truncation_reason`` names the error)
        while every other env takes its step as usual, then :class:`EnvError` names the env
        and the cause; the next ``step`` carries on with the others. An env whose worker died or
        hung ends truncated the same way, without an error. If the call is interrupted
        (KeyboardInterrupt), nothing tells which envs stepped, so the next call must be
        ``reset()``.
        """
        self._check_open()
        if isinstance(actions, (str, bytes)):
            raise TypeError(
                f"step() takes one action per env, a list of {self.num_envs}, not the single "
                f"string {actions!r:.60}; for the same action everywhere pass "
                f"[action] * {self.num_envs}"
            )
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        if self._reset_needed is not None:
            raise gym.error.ResetNeeded(self._reset_needed)
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        live = np.flatnonzero(self.active)
        try:
            results = self._backend.step([(int(i), actions[i]) for i in live])
        except BaseException as exc:
            self._reset_needed = (
                f"the last step() was interrupted ({type(exc).__name__}), so the episode "
                "records no longer match the envs; call reset()"
            )
            if isinstance(exc, KeyboardInterrupt):
                # Ctrl-C: one short traceback ending here, not the backend's internals
                raise KeyboardInterrupt("GroupVectorEnv.step() interrupted") from None
            raise
        raised = []
        for i, res in zip(live, results, strict=True):
            traj = self._trajs[i]
            anchor_obs, anchor_key = self._obs[i], self._infos[i].get("state_key")
            if isinstance(res, _Failure):  # end the episode, keep what was recorded
                if res.raised:
                    raised.append(int(i))
                    reason = f"the env raised {res.reason}"
                else:
                    reason = res.reason
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
        if raised:
            by_env = dict(zip(live.tolist(), results, strict=True))
            raise self._env_error(raised, [by_env[i] for i in raised], "step")
        if self.info_layout == "gymnasium":
            stepped = np.zeros(self.num_envs, dtype=bool)
            stepped[live] = True
            return (
                list(self._obs),
                rewards,
                self._terminated & stepped,
                self._truncated & stepped,
                self._gymnasium_infos(stepped),
            )
        return (
            list(self._obs),
            rewards,
            self._terminated.copy(),
            self._truncated.copy(),
            list(self._infos),
        )

    # ------------------------------------------------------------------------------------------
    # branching: start envs from snapshots, or copy one env's state and record into others
    # ------------------------------------------------------------------------------------------
    def snapshot(self, i: int) -> EnvSnapshot:
        """Env ``i``'s state now (any backend), with its wrappers' state: a
        :class:`GroupEnvSnapshot`, immutable and picklable, for :meth:`reset_to` of this or
        another vector env of the same id, arguments and wrappers."""
        self._check_open()
        i = self._env_index(i, "snapshot(i)")
        if self._reset_needed is not None:
            raise gym.error.ResetNeeded(self._reset_needed)
        (res,) = self._backend.call_envs("snapshot", [(i,)])
        if isinstance(res, _Failure):
            if not res.raised:
                self._end_worker_envs(i, res.reason)
            raise self._env_error([i], [res], "snapshot")
        return res

    def reset_to(
        self,
        snapshots: Sequence[EnvSnapshot],
        prefixes: Sequence[Trajectory | None] | None = None,
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """Start every env from a snapshot: env ``i`` is restored to ``snapshots[i]``.

        Args:
            snapshots: ``num_envs`` snapshots, from :meth:`snapshot` (of this or another vector
                env built alike) or, for envs without wrappers of their own, from
                ``env.unwrapped.snapshot()``. One snapshot may appear many times (k copies).
            prefixes: optional, ``num_envs`` entries: env ``i``'s trajectory record starts as a
                copy of ``prefixes[i].steps`` (the steps that led to ``snapshots[i]``) with
                ``branch_step = len(prefix.steps)`` and ``branch_of`` the prefix's
                ``(group_id, traj_id)``; None entries (or no ``prefixes``) start empty records.

        Returns:
            ``(obs, infos)``: each env's last observation and info at its snapshot (infos in
            the vector env's ``info_layout``, as :meth:`reset` returns them). Envs whose
            snapshot was taken after their episode ended start done (``active[i] == False``);
            group ids are as after :meth:`reset` (env ``i`` in group ``i // group_size``) and
            every env gets a new ``traj_id``.

        Raises:
            ValueError: wrong lengths, or a prefix that does not end in its snapshot's state.
            SnapshotMismatch: a snapshot of another id, variant or wrapper stack; the message
                names the first such env. A failed ``reset_to`` leaves ``step()`` asking for a
                reset (or another ``reset_to``).
        """
        self._check_open()
        if len(snapshots) != self.num_envs:
            raise ValueError(f"reset_to() got {len(snapshots)} snapshots, expected {self.num_envs}")
        if prefixes is not None and len(prefixes) != self.num_envs:
            raise ValueError(f"reset_to() got {len(prefixes)} prefixes, expected {self.num_envs}")
        for i, snap in enumerate(snapshots):
            if not isinstance(snap, EnvSnapshot):
                raise TypeError(
                    f"snapshots[{i}] is a {type(snap).__name__}, not an EnvSnapshot; take "
                    "snapshots with vec.snapshot(i) or env.unwrapped.snapshot()"
                )
            prefix = prefixes[i] if prefixes is not None else None
            if prefix is not None and prefix.steps:
                end = prefix.steps[-1].info.get("state_key", snap.state_key)
                if end != snap.state_key:
                    raise ValueError(
                        f"prefixes[{i}] ends in state {end!r:.80} but snapshots[{i}] holds "
                        f"{snap.state_key!r:.80}: pass the trajectory that led to the snapshot"
                    )
        self._reset_needed = "the last reset_to() did not complete; call reset() or reset_to()"
        self.active[:] = False
        try:
            results = self._backend.call_envs("restore", list(enumerate(snapshots)))
        except KeyboardInterrupt:
            raise KeyboardInterrupt("GroupVectorEnv.reset_to() interrupted") from None
        failed = [i for i, res in enumerate(results) if isinstance(res, _Failure)]
        if failed:
            raise self._restore_error(failed, [results[i] for i in failed], "reset_to")

        self.traj_ids = np.arange(self._next_traj_id, self._next_traj_id + self.num_envs)
        self._next_traj_id += self.num_envs
        self._trajs = []
        for i, (obs, info) in enumerate(results):
            prefix = prefixes[i] if prefixes is not None else None
            traj = Trajectory(
                int(self.group_ids[i]),
                int(self.traj_ids[i]),
                str(info.get("task_id", "")),
                start_info=None if prefix is not None and prefix.steps else info,
            )
            if prefix is not None:
                traj.steps = [copy.copy(step) for step in prefix.steps]
                traj.branch_step = len(prefix.steps)
                traj.branch_of = (prefix.group_id, prefix.traj_id)
                if prefix.steps:
                    traj.start_info = prefix.start_info
            self._set_done(i, traj, snapshots[i].done, info)
            self._obs[i], self._infos[i] = obs, info
            self.step_index[i] = len(traj.steps)
            self._trajs.append(traj)
        self._reset_needed = None
        if self.info_layout == "gymnasium":
            return list(self._obs), self._gymnasium_infos(np.ones(self.num_envs, dtype=bool))
        return list(self._obs), list(self._infos)

    def branch(self, source: int, targets: Sequence[int]) -> tuple[list[str], list[dict[str, Any]]]:
        """Mid-rollout, make every env in ``targets`` a copy of env ``source`` as it is now.

        Each target gets the source's state (env and wrappers, shipped between workers by the
        process and Ray backends) and a new trajectory record: a copy of the source's steps so
        far, with ``branch_step = len(source steps)`` and ``branch_of = (source group_id,
        source traj_id)``; its ``traj_id`` is new, its ``group_id`` stays ``target //
        group_size``. The source carries on unchanged. Targets are active unless the source's
        episode has ended. To draw k continuations of one state, branch the source into k - 1
        targets (the source continues as the k-th) or into k targets; see :class:`Trajectory`
        for how a trainer finds the siblings.

        Returns ``(obs, infos)`` of the targets, in ``targets`` order: lists, one observation
        and one info dict per target, whatever ``info_layout`` is.
        """
        self._check_open()
        source = self._env_index(source, "branch() source")
        targets = [self._env_index(t, "branch() target") for t in targets]
        if source in targets or len(set(targets)) != len(targets):
            raise ValueError(
                f"branch() targets {targets} must be distinct envs other than the source {source}"
            )
        if self._reset_needed is not None:
            raise gym.error.ResetNeeded(self._reset_needed)
        if not targets:
            return [], []
        snap = self.snapshot(source)
        try:
            results = self._backend.call_envs("restore", [(t, snap) for t in targets])
        except BaseException as exc:
            self._reset_needed = (
                f"the last branch() was interrupted ({type(exc).__name__}), so the records of "
                "its targets no longer match the envs; call reset() or reset_to()"
            )
            raise
        src = self._trajs[source]
        failed = []
        for t, res in zip(targets, results, strict=True):
            self.traj_ids[t] = self._next_traj_id
            self._next_traj_id += 1
            if isinstance(res, _Failure):  # the target holds no episode now: it stays done
                failed.append(t)
                reason = f"branch() could not restore it: {res.reason}"
                self._trajs[t] = Trajectory(
                    int(self.group_ids[t]),
                    int(self.traj_ids[t]),
                    src.task_id,
                    truncated=True,
                    truncation_reason=reason,
                )
                self.active[t], self._terminated[t], self._truncated[t] = False, False, True
                self._infos[t] = dict(self._infos[t], truncation_reason=reason)
                continue
            obs, info = res
            traj = Trajectory(
                int(self.group_ids[t]),
                int(self.traj_ids[t]),
                src.task_id,
                [copy.copy(step) for step in src.steps],
                branch_step=len(src.steps),
                branch_of=(src.group_id, src.traj_id),
                start_info=src.start_info if src.steps else info,
            )
            self._set_done(t, traj, snap.done, info)
            traj.truncation_reason = src.truncation_reason
            self._obs[t], self._infos[t] = obs, info
            self.step_index[t] = len(traj.steps)
            self._trajs[t] = traj
        for t in failed:
            if not results[targets.index(t)].raised:
                self._end_worker_envs(t, results[targets.index(t)].reason)
        if failed:
            raise self._restore_error(failed, [results[targets.index(t)] for t in failed], "branch")
        return [self._obs[t] for t in targets], [self._infos[t] for t in targets]

    def _end_worker_envs(self, i: int, reason: str) -> None:
        """Env ``i``'s worker was lost (a fresh one holds new envs): every episode it held ends
        truncated, as a lost worker's episodes do in ``step``."""
        owner = getattr(self._backend, "owner", None)
        held = np.flatnonzero(owner == owner[i]) if owner is not None else [i]
        for j in held:
            if self.active[j]:
                self.active[j], self._truncated[j] = False, True
                self._trajs[j].truncated, self._trajs[j].truncation_reason = True, reason
                self._infos[j] = dict(self._infos[j], truncation_reason=reason)

    def _env_index(self, i: Any, what: str) -> int:
        if not isinstance(i, (int, np.integer)) or not 0 <= i < self.num_envs:
            raise IndexError(f"{what} must be an env index in [0, {self.num_envs}), got {i!r}")
        return int(i)

    def _set_done(
        self, i: int, traj: Trajectory, done: tuple[bool, bool] | None, info: dict[str, Any]
    ) -> None:
        """Env ``i`` (and its record) as the restored episode is: active, or ended."""
        terminated, truncated = done if done is not None else (False, False)
        self.active[i] = done is None
        self._terminated[i], self._truncated[i] = terminated, truncated
        traj.terminated, traj.truncated = bool(terminated), bool(truncated)
        if done is not None:
            traj.won = bool(info.get("won", False))
            if truncated:
                traj.truncation_reason = info.get("truncation_reason", "step limit")

    def _restore_error(self, failed: list[int], failures: list[_Failure], call: str) -> Exception:
        """A refused snapshot is the env's :class:`SnapshotMismatch` (naming the env index);
        anything else an :class:`EnvError`."""
        first, res = failed[0], failures[0]
        if res.reason.startswith(("SnapshotMismatch:", "TypeError:", "ValueError:")):
            more = f" (and {len(failed) - 1} more: envs {failed[1:]})" if len(failed) > 1 else ""
            kind = SnapshotMismatch if res.reason.startswith("SnapshotMismatch") else ValueError
            group = int(self.group_ids[first])
            err = kind(
                f"{call}(): env {first} (group {group}){more} refused its snapshot: {res.reason}"
            )
            err.__cause__ = res.exc
            return err
        return self._env_error(failed, failures, call)

    # ------------------------------------------------------------------------------------------
    @property
    def infos_list(self) -> list[dict[str, Any]]:
        """The latest info of every env as a list of dicts, whatever ``info_layout`` is (an env
        that finished keeps the info of its last step)."""
        return list(self._infos)

    def _gymnasium_infos(self, mask: np.ndarray) -> dict[str, Any]:
        """Gymnasium's dict-of-arrays infos of the envs in ``mask`` (``_key`` masks included)."""
        out: dict[str, Any] = {}
        for i in np.flatnonzero(mask):
            out = self._add_info(out, self._infos[i], int(i))
        return out

    def trajectories(self) -> list[Trajectory]:
        """The current episode of every env, in env order (finished or not)."""
        return list(self._trajs)

    @property
    def all_done(self) -> bool:
        return not self.active.any()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call a method (or read an attribute) of every env; in-process backend only."""
        self._check_open()
        if self.backend != "inprocess":
            raise NotImplementedError("call() needs backend='inprocess'")
        out = []
        for env in self._backend.envs:
            attr = env.get_wrapper_attr(name)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(out)

    def close_extras(self, **kwargs: Any) -> None:
        backend = getattr(self, "_backend", None)  # absent when the constructor failed
        if backend is not None:
            backend.close()

    def _check_open(self) -> None:
        if self.closed:
            raise gym.error.ClosedEnvironmentError(
                f"{self!r} is closed; build a new GroupVectorEnv to run more episodes "
                "(trajectories() still returns the last episodes)"
            )

    def _env_error(self, failed: list[int], failures: list[_Failure], call: str) -> EnvError:
        """One error for the envs that raised in ``call``: the first named, the rest counted."""
        first, res = failed[0], failures[0]
        group = int(self.group_ids[first])
        more = f" (and {len(failed) - 1} more: envs {failed[1:]})" if len(failed) > 1 else ""
        after = {
            "step": "its episode ended truncated; the other envs took their step",
            "snapshot": "no env changed, unless its worker was lost: then its episodes ended",
            "branch": "those targets hold no episode and stay done until the next reset",
            "reset_to": "call reset() or reset_to() again",
        }.get(call, "call reset() again with options every env accepts")
        where = "" if res.exc is not None else f"\nThe env's traceback:\n{res.traceback}"
        err = EnvError(
            f"env {first} (group {group}) raised {res.reason} during {call}(){more}; {after}"
            + where,
            env_index=first,
            group=group,
            failed=failed,
        )
        err.__cause__ = res.exc
        return err

    def __repr__(self) -> str:
        return (
            f"GroupVectorEnv({self.env_id!r}, num_groups={self.num_groups}, "
            f"group_size={self.group_size}, backend={self.backend!r})"
        )


class _BatchedTuple(spaces.Tuple):
    """Gymnasium's batched space for ``n`` copies of one space, printed as ``Tuple(<space> x n)``
    (the full tuple of text spaces would print a kilobyte per env)."""

    def __repr__(self) -> str:
        return f"Tuple({self.spaces[0]!r} x {len(self.spaces)})"


def _compact(space: spaces.Space) -> spaces.Space:
    if type(space) is spaces.Tuple and space.spaces:
        return _BatchedTuple(space.spaces)
    return space


def _as_text(action: Any) -> str:
    return action if isinstance(action, str) else repr(action)


def make_group_vector_env(env_id: str, num_envs: int = 1, **kwargs: Any) -> GroupVectorEnv:
    """``gym.make_vec(env_id, num_envs=N, group_size=k, backend=...)`` lands here.

    ``num_envs`` must be a multiple of ``group_size`` (default 1: independent envs, gymnasium's
    usual meaning). Keyword arguments GroupVectorEnv does not take go to the env constructor.
    """
    group_keys = {
        "group_size",
        "backend",
        "num_workers",
        "wrappers",
        "step_timeout",
        "ray_options",
        "ray_address",
        "info_layout",
    }
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
