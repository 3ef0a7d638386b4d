"""``backend="process"``: a pool of worker processes, each a fresh interpreter talking to the
vector env over a socket pair.

For heavy envs (real ALFWorld, WebShop's search engine). Workers import only agentgym (and the
user's script only when an env or wrapper class is defined there), so scripts work without an
``if __name__ == "__main__":`` guard; they run in their own process group and ignore SIGINT,
so Ctrl-C reaches only the caller.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Sequence
from multiprocessing import connection as mp_connection
from typing import Any

from agentgym.vector.backends.host import EnvHost, bootstrap_worker
from agentgym.vector.backends.sharded import ShardedBackend
from agentgym.vector.factory import EnvFactory
from agentgym.vector.failures import BootstrapError, Failure, WorkerDied

__all__ = ["ProcessBackend"]


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
    "from agentgym.vector.backends.process import _worker_main; _worker_main(int(sys.argv[1]))"
)


def _worker_main(fd: int) -> None:
    """Worker process loop around an :class:`EnvHost`.

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
        bootstrap_worker()
        if main_path:  # the envs' classes live in the user's script: import it as spawn does
            from multiprocessing import spawn

            _IMPORTING_MAIN_IN_WORKER = True
            spawn.import_main_path(main_path)
            _IMPORTING_MAIN_IN_WORKER = False
        host = EnvHost(pickle.loads(factory_bytes), num_envs)
    except BaseException as exc:  # noqa: BLE001 - report construction errors, then exit
        if isinstance(exc, BootstrapError):
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


def _kill_workers(procs: list[subprocess.Popen | None]) -> None:
    """Last resort at exit or garbage collection: no worker outlives its GroupVectorEnv."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
    for proc in procs:
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)


class ProcessBackend(ShardedBackend):
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
                out[w] = Failure(
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
