"""Fixtures for the adapter tests: which engine run plays an adapter's episodes."""

from __future__ import annotations

import contextvars

import pytest

from agentgym.engine import RolloutEngine


class EngineRuns:
    """The ``RolloutEngine.run`` calls of a test: :attr:`runs` holds ``(engine, records)`` of
    each once it returns; :meth:`current` is the engine whose run the caller is inside (None
    outside any), for the policy and server doubles to record who called them."""

    def __init__(self) -> None:
        self.runs: list[tuple[RolloutEngine, list]] = []
        self._running: contextvars.ContextVar[RolloutEngine | None] = contextvars.ContextVar(
            "running_engine", default=None
        )

    def current(self) -> RolloutEngine | None:
        return self._running.get()


@pytest.fixture
def engine_runs(monkeypatch) -> EngineRuns:
    """Watch every ``RolloutEngine.run`` of the test (the real run, wrapped): while it runs, the
    engine is set in a context variable, which the episode tasks it starts inherit."""
    watched = EngineRuns()
    real_run = RolloutEngine.run

    async def run(self, specs):
        token = watched._running.set(self)
        try:
            records = await real_run(self, specs)
        finally:
            watched._running.reset(token)
        watched.runs.append((self, records))
        return records

    monkeypatch.setattr(RolloutEngine, "run", run)
    return watched
