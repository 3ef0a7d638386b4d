"""What the process and Ray backends share: envs split over workers, requests sent to every
worker before any answer is awaited, one deadline for all of them, and a lost worker turned
into a truncated episode for each env it held plus a fresh worker."""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentgym.vector.factory import EnvFactory
from agentgym.vector.failures import Failure, WorkerDied

__all__ = ["ShardedBackend"]


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


class ShardedBackend:
    """Envs split over workers (processes or Ray actors); env ``i`` lives in worker ``owner[i]``.

    Subclasses start, address and kill workers; this class splits requests into shards, sends
    them all before gathering (workers run in parallel), waits for every answer against ONE
    deadline (k hung workers cost one ``timeout``, not k), and turns a lost worker into a
    :class:`Failure` for each env it held plus a fresh worker, started at once and awaited at
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
            if isinstance(out, Failure):  # the worker could not run the request at all
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
                results[r[0]] = Failure(why, raised=False)
        return [results[r[0]] for r in requests]

    def call_envs(self, cmd: str, requests: Sequence[tuple]) -> list[Any]:
        """``"snapshot"`` / ``"restore"`` per env (snapshots travel pickled, so a snapshot of
        one worker's env restores into another's); an env whose worker was lost gets a
        :class:`Failure` (its worker restarts, so its envs need a reset)."""
        results, lost = self._roundtrip(cmd, requests)
        for r in requests:
            w = int(self.owner[r[0]])
            if w in lost:
                results[r[0]] = Failure(
                    f"{lost[w]}; its envs restart at the next reset", raised=False
                )
        return [results[r[0]] for r in requests]
