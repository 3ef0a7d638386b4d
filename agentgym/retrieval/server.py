"""The retrieval HTTP server: any :class:`~agentgym.retrieval.base.Retriever` behind Search-R1's
``/retrieve`` protocol, with dynamic micro-batching.

Protocol (Search-R1's ``search_r1/search/retrieval_server.py``, which its rollout code calls)::

    POST /retrieve  {"queries": ["who wrote hamlet", ...], "topk": 3, "return_scores": true}
    -> 200 {"result": [[{"document": {"id": "17", "contents": "..."}, "score": 12.3}, ...], ...]}

one list per query, best first. With ``"return_scores": false`` each list holds the documents
themselves (``[[{"id": ..., "contents": ...}, ...], ...]``); Search-R1's own server fails on that
path, this one answers it. Defaults are Search-R1's: ``topk`` absent (or ``null``) means the
server's ``default_topk`` (3, Search-R1's ``--topk`` default); ``return_scores`` absent means
``false``.

Security: the server has no authentication. It binds 127.0.0.1 by default; binding any other
address (``--host 0.0.0.0``) lets everyone who can reach the port query it, and the server says
so in one warning line at start-up. Put it behind a firewall or an authenticating proxy there.

Where we are stricter than Search-R1 (its pydantic model coerces and ignores): ``queries`` must be
a non-empty list of strings, ``topk`` an integer in ``1..max_topk`` (``true``, ``3.0``, ``"3"``
and ``0`` are rejected, not coerced), ``return_scores`` a boolean, and **unknown fields are
rejected** so that a typo such as ``"top_k"`` is a 422 naming the field instead of a silent
fallback to the default depth. Every rejection is a 4xx whose JSON body is
``{"detail": "<what is wrong and what to send>"}``:

====  ==========================================================================================
400   the body is not a JSON object (not JSON, bad UTF-8, a list, nested too deep)
408   the body did not arrive within ``client_timeout_s`` (the connection is closed)
413   over the server's limits: the body's size, the number of queries, one query's length, or
      the results asked for (queries x topk)
422   a field has the wrong type or value, is missing, or is unknown
500   the retriever raised while searching; ``detail`` carries its message
====  ==========================================================================================

Limits (arguments of :func:`create_app`, options of ``agentgym retrieval serve``; all in
``/health``): ``max_queries_per_request`` (4096; Search-R1 sends one request per turn holding
every active trajectory's query), ``max_topk`` (100), ``max_results_per_request`` (65536 =
queries x topk: the response's size, about 250 bytes a result, and the server's work for it) and
``max_query_chars`` (4096).

``GET /health`` answers ``{"status": "ok", ...}`` with the retriever's type, the limits and
counters (requests, queries, searches) that show how well batching works.

Dynamic micro-batching: requests that arrive together are merged into ONE
``retriever.search(all_queries, max_topk_of_the_batch)`` call (one encoder call, one index
search), and each request gets its own slice back, cut to its own ``topk``. By default a batch
goes out as soon as the worker thread is free (``batch_wait_ms=0``): whatever queued during the
previous search is the next batch, so batches grow with the load by themselves and a lone client
never waits for company that is not coming. ``batch_wait_ms > 0`` holds a batch open that long
after its first request arrived (or until it holds ``max_batch_queries`` queries).
``max_batch_queries=1`` turns merging off (every request is searched on its own, how Search-R1's
server works, in chunks if it is large). If a merged search raises, each of its requests is retried alone, so one query
that breaks the retriever fails only its own request.

Large requests take turns. A request of more than ``chunk_queries`` queries (or more than the
adaptive batch cap below) is searched in chunks of that many, one chunk per search, and after
each chunk it goes to the back of the queue, behind the requests that arrived meanwhile. So a
small request is searched in the search after the one in progress (unless more than a batch of
requests came before it), never after the whole of a large request. The answer of a chunked request is sent whole once its last chunk is searched. A client that hangs
up is withdrawn: its remaining chunks are never searched.

Batch size follows the retriever's cost (``adaptive_batch=True``, the default). Merging pays
for a retriever with a fixed cost per call (a GPU encoder's launch, a forward pass's setup);
BM25 has almost none, and there a batch of hundreds of queries only makes every request wait for
the slowest and the server answer in bursts: responses go out all at once, the next requests
come back all at once, and server and clients take turns idling. With 256 clients of a 100k
passage BM25 server, merging everything queued answered 0.4-0.7x the queries/s of one search per
request in most runs, on less CPU per query. So the batcher fits ``seconds = fixed + per_query
* n`` to its recent searches and caps a batch where the fixed cost falls to
``_FIXED_COST_SHARE`` of the batch's time (never under ``_MIN_ADAPTIVE_BATCH``, never over
``max_batch_queries``; the cap is in ``/health``): a retriever with a real per-call cost keeps
large batches, BM25 streams small ones, and a long queue goes out as several searches whose
answers leave in turn. A CPU query encoder sits in between: its cost grows with the batch, so
it gets moderate batches.

Slow or silent clients: a connection must deliver a request's head within ``client_timeout_s``
(30 s) of opening or of its previous answer, and the body within as long again, else it is
closed (a body cut short gets a 408 first); idle keep-alive connections close after uvicorn's
``timeout_keep_alive`` (5 s). A search that takes longer never closes its client's connection.
A client must also read its answer within ``client_timeout_s`` of the answer being ready: one
that has not (its answer still sits in the server's send buffer) is disconnected then, which
frees the answer's memory.

Searching and JSON encoding run in one worker thread, never on the event loop, so the server
keeps accepting connections and answering ``/health`` during a long search. Documents are
encoded once and cached (the corpus is read-only), so a response is mostly a join of cached bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from agentgym.net import is_loopback as _is_loopback
from agentgym.retrieval.base import Hit, Retriever

__all__ = [
    "BackgroundServer",
    "create_app",
    "describe_retriever",
    "serve",
    "serve_in_thread",
    "set_compute_threads",
]

logger = logging.getLogger("agentgym.retrieval.server")

_KNOWN_FIELDS = ("queries", "topk", "return_scores")
_JSON = "application/json"


class _BadRequest(Exception):
    """A request the server refuses: ``status`` is the 4xx code, the message says what to fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class _Limits:
    default_topk: int
    max_topk: int
    max_queries_per_request: int
    max_query_chars: int
    max_results_per_request: int

    @property
    def max_body_bytes(self) -> int:
        # the largest body a valid request can have: every query at the length limit, each
        # character escaped as \\uXXXX (6 bytes), plus the fields around them
        return self.max_queries_per_request * (6 * self.max_query_chars + 8) + 4096


@dataclass(frozen=True, slots=True)
class _Query:
    """A validated ``/retrieve`` request."""

    queries: list[str]
    topk: int
    return_scores: bool


_JSON_TYPE_NAMES = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def _type_name(value: Any) -> str:
    """What a JSON value is, in JSON's words: 'a string', 'an integer', 'null'."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def parse_request(body: bytes, limits: _Limits) -> _Query:
    """Validate one ``/retrieve`` body; raise :class:`_BadRequest` with a 4xx and a message."""
    example = '{"queries": ["who wrote hamlet"], "topk": 3, "return_scores": true}'
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as e:  # ValueError covers bad JSON and bad UTF-8
        raise _BadRequest(
            400, f"body is not valid JSON ({e}); send a JSON object like {example}"
        ) from None
    if not isinstance(payload, dict):
        raise _BadRequest(
            400, f"body must be a JSON object like {example}, got {_type_name(payload)}"
        )
    unknown = sorted(set(payload) - set(_KNOWN_FIELDS))
    if unknown:
        raise _BadRequest(
            422,
            f"unknown field(s) {', '.join(map(repr, unknown))}; "
            f"the accepted fields are {', '.join(map(repr, _KNOWN_FIELDS))}",
        )

    if "queries" not in payload:
        raise _BadRequest(422, f"missing field 'queries' (a list of strings); e.g. {example}")
    queries = payload["queries"]
    if not isinstance(queries, list):
        raise _BadRequest(422, f"'queries' must be a list of strings, got {_type_name(queries)}")
    if not queries:
        raise _BadRequest(422, "'queries' is empty; send at least one query string")
    if len(queries) > limits.max_queries_per_request:
        raise _BadRequest(
            413,
            f"too many queries: {len(queries)} in one request, this server takes at most "
            f"{limits.max_queries_per_request}; split the batch",
        )
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise _BadRequest(422, f"'queries[{i}]' must be a string, got {_type_name(q)}")
        if len(q) > limits.max_query_chars:
            raise _BadRequest(
                413,
                f"'queries[{i}]' is {len(q)} characters long, this server takes at most "
                f"{limits.max_query_chars}; shorten the query",
            )

    topk = payload.get("topk")
    if topk is None:  # absent or null: the server's default, as Search-R1 does
        topk = limits.default_topk
    elif type(topk) is not int:  # bool is an int subclass: True must not mean topk=1
        raise _BadRequest(422, f"'topk' must be an integer, got {_type_name(topk)} ({topk!r})")
    elif not 1 <= topk <= limits.max_topk:
        raise _BadRequest(
            422, f"'topk' must be between 1 and {limits.max_topk} on this server, got {topk}"
        )
    if len(queries) * topk > limits.max_results_per_request:
        raise _BadRequest(
            413,
            f"too many results: {len(queries)} queries x topk {topk} = {len(queries) * topk} in "
            f"one request, this server returns at most {limits.max_results_per_request}; split "
            "the queries over several requests or ask for a smaller topk",
        )

    return_scores = payload.get("return_scores", False)  # Search-R1's default
    if type(return_scores) is not bool:
        raise _BadRequest(
            422,
            f"'return_scores' must be true or false, got {_type_name(return_scores)} "
            f"({return_scores!r})",
        )
    return _Query(queries=queries, topk=topk, return_scores=return_scores)


# ----------------------------------------------------------------------------------------------
# JSON encoding. A response is mostly documents, and the corpus never changes, so each
# document's JSON is encoded once and reused; the rest is a join of bytes.


def _json_default(value: Any) -> Any:
    # numpy scalars and arrays (ids or metadata some corpora carry) without importing numpy
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot encode a {type(value).__name__} as JSON")


def _float_json(x: float) -> bytes:
    # what json.dumps writes for a float (NaN/Infinity included), without its per-call overhead
    if math.isfinite(x):
        return repr(x).encode()
    return json.dumps(x).encode()


class _DocumentCache:
    """Encoded JSON of documents, keyed by doc id, for documents the corpus hands out unchanged.

    An entry also keeps the document it was made from and is only used for that same object or
    an equal one, so two records that share an id (or a retriever that builds documents afresh)
    never get each other's bytes. Cleared when full: the hot set refills at once.
    """

    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        self._entries: dict[str, tuple[dict[str, Any], bytes]] = {}

    def encode(self, doc_id: str, document: dict[str, Any]) -> bytes:
        entry = self._entries.get(doc_id)
        if entry is not None and (entry[0] is document or entry[0] == document):
            return entry[1]
        data = json.dumps(document, ensure_ascii=False, default=_json_default).encode()
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[doc_id] = (document, data)
        return data


def encode_result(
    hits: Sequence[Sequence[Hit]], return_scores: bool, cache: _DocumentCache
) -> bytes:
    """The ``/retrieve`` response body for ``hits`` (one list per query), as UTF-8 JSON bytes."""
    return _result_body(_encode_rows(hits, return_scores, cache))


def _result_body(rows: Sequence[bytes]) -> bytes:
    return b'{"result":[' + b",".join(rows) + b"]}"


def _encode_rows(
    hits: Sequence[Sequence[Hit]], return_scores: bool, cache: _DocumentCache
) -> list[bytes]:
    """One encoded JSON list per query (a chunked request's answer is the join of its chunks')."""
    rows = []
    for query_hits in hits:
        if return_scores:
            items = [
                b'{"document":'
                + cache.encode(h.doc_id, h.document)
                + b',"score":'
                + _float_json(float(h.score))
                + b"}"
                for h in query_hits
            ]
        else:
            items = [cache.encode(h.doc_id, h.document) for h in query_hits]
        rows.append(b"[" + b",".join(items) + b"]")
    return rows


def _error_body(message: str) -> bytes:
    return json.dumps({"detail": message}).encode()


# ----------------------------------------------------------------------------------------------
# Micro-batching


@dataclass(slots=True, eq=False)
class _Pending:
    """A request in the batcher, searched one chunk at a time."""

    query: _Query
    future: asyncio.Future[tuple[int, bytes]]
    arrived_at: float
    searched: int = 0  # queries handed to a search so far
    rows: list[bytes] = field(default_factory=list)  # encoded result rows of the searched ones

    @property
    def remaining(self) -> int:
        return len(self.query.queries) - self.searched


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Queries ``start:stop`` of a request, searched together (maybe with other chunks)."""

    pending: _Pending
    start: int
    stop: int

    @property
    def queries(self) -> list[str]:
        return self.pending.query.queries[self.start : self.stop]


@dataclass(slots=True)
class _Stats:
    requests: int = 0
    queries: int = 0
    searches: int = 0
    largest_batch_queries: int = 0
    batch_cap: int = 0  # the adaptive cap on queries per search now in force
    failed_requests: int = 0
    search_seconds: float = 0.0  # wall time inside retriever.search: how busy the server is
    started_at: float = field(default_factory=time.time)


# A batch is capped where the search's fixed cost per call is this share of the batch's time;
# larger batches would save at most this much more per query while delaying every answer.
_FIXED_COST_SHARE = 0.1
_MIN_ADAPTIVE_BATCH = 8  # streaming below this saves nothing measurable and costs per-call work


class _SearchCost:
    """``seconds ~= fixed + per_query * n`` for a search of ``n`` queries, fitted by exponentially
    weighted least squares to the recent searches (old ones fade by ``decay`` per search), so it
    follows a retriever whose cost drifts (caches warming, the machine's load)."""

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self._w = self._n = self._t = self._nn = self._nt = 0.0

    def add(self, n: int, seconds: float) -> None:
        d = self.decay
        self._w = d * self._w + 1.0
        self._n = d * self._n + n
        self._t = d * self._t + seconds
        self._nn = d * self._nn + n * n
        self._nt = d * self._nt + n * seconds

    def fit(self) -> tuple[float, float] | None:
        """``(fixed_s, per_query_s)``, or None until the searches seen differ enough in size."""
        if self._w < 4:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var_n = self._nn / self._w - mean_n * mean_n
        if var_n < 1.0:  # (nearly) all one size: the slope is not identifiable
            return None
        per_query = (self._nt / self._w - mean_n * mean_t) / var_n
        if per_query <= 0:
            return None
        return max(mean_t - per_query * mean_n, 0.0), per_query

    def batch_cap(self, max_batch_queries: int) -> int | None:
        """The batch size at which the fixed cost is ``_FIXED_COST_SHARE`` of the search, or None
        while the fit is not identifiable (then the caller keeps the cap it has: under a
        steady load every batch is at the cap, which says nothing new about the cost)."""
        fitted = self.fit()
        if fitted is None:
            return None
        fixed, per_query = fitted
        best = fixed * (1 - _FIXED_COST_SHARE) / (_FIXED_COST_SHARE * per_query)
        return int(min(max(best, _MIN_ADAPTIVE_BATCH), max_batch_queries))


class _Batcher:
    """Merges concurrent requests into one ``retriever.search`` per batch, and splits large
    requests into chunks that take turns with the others (see the module docstring).

    Runs as one task on the server's event loop; the searches (and the encoding of their
    responses) run one at a time in a single worker thread, so the retriever is never called
    concurrently and needs no locking of its own.
    """

    def __init__(
        self,
        retriever: Retriever,
        max_batch_queries: int,
        batch_wait_s: float,
        stats: _Stats,
        adaptive: bool = True,
        chunk_queries: int = 64,
    ) -> None:
        self.retriever = retriever
        self.max_batch_queries = max_batch_queries
        # the current cap on queries per search: max_batch_queries, or less where the retriever's
        # measured cost says larger batches gain nothing (see the module docstring)
        self.batch_cap = max_batch_queries
        self.adaptive = adaptive and max_batch_queries > _MIN_ADAPTIVE_BATCH
        self.cost = _SearchCost()
        self.chunk_queries = chunk_queries
        self.batch_wait_s = batch_wait_s
        self.stats = stats
        self.cache = _DocumentCache()
        # requests with queries still to search, in turn order; a request whose chunk is being
        # searched is not here (it comes back at the end if it has more)
        self._queue: deque[_Pending] = deque()
        self._queued_queries = 0
        self._in_search: list[_Chunk] = []
        # wakes the dispatcher: set by the first request into an empty queue, by the request
        # that fills a batch, and by the batch window's timer; not by every arrival
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval-search")
        self._task: asyncio.Task[None] | None = None

    @property
    def chunk_limit(self) -> int:
        """The most queries of one request in one search: ``chunk_queries``, and no more than
        the adaptive cap (a cheap-per-call retriever streams large requests in small chunks)."""
        return min(self.chunk_queries, self.batch_cap) if self.adaptive else self.chunk_queries

    @property
    def waiting_requests(self) -> int:
        """Requests accepted and not answered yet (queued, or in the search now running)."""
        waiting = [*self._queue, *(c.pending for c in self._in_search)]
        return sum(1 for p in waiting if not p.future.done())

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="retrieval-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        shutting_down = (503, _error_body("the server is shutting down; retry"))
        for p in [*self._queue, *(c.pending for c in self._in_search)]:
            if not p.future.done():
                p.future.set_result(shutting_down)
        self._queue.clear()
        self._in_search = []
        self._executor.shutdown(wait=True)

    def submit(self, query: _Query) -> asyncio.Future[tuple[int, bytes]]:
        """Queue ``query``; the future gets its (HTTP status, JSON body). Cancelling the future
        withdraws the request: its chunks not searched yet never are."""
        loop = asyncio.get_running_loop()
        pending = _Pending(query, loop.create_future(), loop.time())
        self._enqueue(pending)
        return pending.future

    def _enqueue(self, pending: _Pending) -> None:
        self._queue.append(pending)
        self._queued_queries += pending.remaining
        if len(self._queue) == 1 or self._queued_queries >= self.batch_cap:
            self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            # the batch window opens when its first request arrived: a queue that built up
            # during the previous search goes out at once
            deadline = self._queue[0].arrived_at + self.batch_wait_s
            if self._queued_queries < self.batch_cap and deadline > loop.time():
                self._wake.clear()
                timer = loop.call_at(deadline, self._wake.set)
                try:
                    await self._wake.wait()  # the window ends, or a request fills the batch
                finally:
                    timer.cancel()
            batch = self._take_batch()
            if not batch:
                continue
            self._in_search = batch
            try:
                answers = await loop.run_in_executor(self._executor, self._answer, batch)
            except Exception as e:  # noqa: BLE001 - a failed batch must not stop the server
                logger.exception("retrieval batch failed")
                failed = (500, _error_body(f"search failed: {type(e).__name__}: {e}"))
                answers = [failed] * len(batch)
            self._in_search = []
            for chunk, answer in zip(batch, answers, strict=True):
                p = chunk.pending
                if p.future.done():  # its client has gone away meanwhile
                    continue
                if answer is None:
                    # more chunks to search: back of the queue, behind whoever came meanwhile
                    self._enqueue(p)
                else:
                    p.future.set_result(answer)

    def _take_batch(self) -> list[_Chunk]:
        """The next search's work: each queued request in turn gives its next chunk (at most
        ``chunk_limit`` queries) while the batch stays within ``batch_cap`` queries (it holds at
        least one chunk). A request gives one chunk per search."""
        limit = self.chunk_limit
        batch: list[_Chunk] = []
        n = 0
        while self._queue:
            p = self._queue[0]
            if p.future.done():  # withdrawn while queued: nobody is waiting for it
                self._queue.popleft()
                self._queued_queries -= p.remaining
                continue
            size = min(p.remaining, limit)
            if batch and n + size > self.batch_cap:
                break
            self._queue.popleft()
            self._queued_queries -= p.remaining
            batch.append(_Chunk(p, p.searched, p.searched + size))
            p.searched += size
            n += size
        return batch

    # -- worker thread ---------------------------------------------------------------------
    def _search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        t0 = time.perf_counter()
        try:
            hits = self.retriever.search(queries, topk)
        finally:
            seconds = time.perf_counter() - t0
            self.stats.search_seconds += seconds
        if self.adaptive:
            self.cost.add(len(queries), seconds)
            cap = self.cost.batch_cap(self.max_batch_queries)
            if cap is not None:
                self.batch_cap = self.stats.batch_cap = cap
        if len(hits) != len(queries):
            raise RuntimeError(
                f"{type(self.retriever).__name__}.search returned {len(hits)} result lists "
                f"for {len(queries)} queries"
            )
        self.stats.searches += 1
        return hits

    def _answer(self, batch: list[_Chunk]) -> list[tuple[int, bytes] | None]:
        """Search the whole batch at once; per chunk, its request's answer if that was its last
        chunk, else None (its rows are kept until the rest is searched)."""
        queries = [q for c in batch for q in c.queries]
        topk = max(c.pending.query.topk for c in batch)
        self.stats.requests += sum(1 for c in batch if c.start == 0)
        self.stats.queries += len(queries)
        self.stats.largest_batch_queries = max(self.stats.largest_batch_queries, len(queries))
        try:
            hits = self._search(queries, topk)
        except Exception as e:  # noqa: BLE001 - answered as a 500 below
            if len(batch) == 1:
                return [self._failed(e)]
            # one bad query must not fail its neighbours: search each chunk alone
            return [self._answer_alone(c) for c in batch]
        answers = []
        start = 0
        for c in batch:
            n = c.stop - c.start
            answers.append(self._keep(c, hits[start : start + n]))
            start += n
        return answers

    def _answer_alone(self, c: _Chunk) -> tuple[int, bytes] | None:
        try:
            hits = self._search(c.queries, c.pending.query.topk)
        except Exception as e:  # noqa: BLE001 - answered as a 500
            return self._failed(e)
        return self._keep(c, hits)

    def _keep(self, c: _Chunk, hits: list[list[Hit]]) -> tuple[int, bytes] | None:
        """Encode a chunk's rows into its request; the whole answer once the last chunk is in."""
        p = c.pending
        topk = p.query.topk
        p.rows.extend(_encode_rows([h[:topk] for h in hits], p.query.return_scores, self.cache))
        if c.stop < len(p.query.queries):
            return None
        body = _result_body(p.rows)
        p.rows = []
        return 200, body

    def _failed(self, e: Exception) -> tuple[int, bytes]:
        self.stats.failed_requests += 1
        logger.warning("search failed: %s: %s", type(e).__name__, e)
        return 500, _error_body(f"search failed: {type(e).__name__}: {e}")


def create_app(
    retriever: Retriever,
    *,
    max_batch_queries: int = 512,
    batch_wait_ms: float = 0.0,
    max_topk: int = 100,
    default_topk: int = 3,
    max_queries_per_request: int = 4096,
    max_query_chars: int = 4096,
    max_results_per_request: int = 65_536,
    adaptive_batch: bool = True,
    chunk_queries: int = 64,
    client_timeout_s: float | None = 30.0,
) -> FastAPI:
    """A FastAPI app serving ``retriever`` with Search-R1's ``/retrieve`` protocol.

    Args:
        retriever: answers ``search(queries, topk)``; the app does not close it.
        max_batch_queries: the most queries merged from several requests into one search;
            ``1`` searches every request on its own (no merging).
        batch_wait_ms: how long a batch stays open after its first request arrives, waiting
            for more; ``0`` (the default) sends whatever has queued up as soon as the worker is
            free, which under load already makes large batches without delaying a lone client.
        max_topk: the largest ``topk`` a request may ask for.
        default_topk: ``topk`` for requests that leave it out (Search-R1's default, 3).
        max_queries_per_request: more queries in one request is a 413.
        max_query_chars: a longer query string is a 413.
        max_results_per_request: a request whose queries x topk is larger is a 413.
        adaptive_batch: cap batches below ``max_batch_queries`` where the retriever's measured
            cost per call says larger ones gain nothing (BM25); ``False`` always merges up to
            ``max_batch_queries``.
        chunk_queries: a request with more queries is searched in chunks of this many (fewer
            where the adaptive cap is lower), which take turns with other requests.
        client_timeout_s: how long a connection may take to send a request's head (from
            opening, or from its previous answer) and then its body; a slower one is closed.
            ``None``: no limit. The head's limit lives in the HTTP protocol that :func:`serve`
            and :func:`serve_in_thread` give uvicorn; another ASGI server enforces only the
            body's.

    The micro-batcher starts and stops with the app's lifespan (uvicorn runs it).
    """
    if max_batch_queries < 1:
        raise ValueError(f"max_batch_queries must be >= 1, got {max_batch_queries}")
    if batch_wait_ms < 0:
        raise ValueError(f"batch_wait_ms must be >= 0, got {batch_wait_ms}")
    if not 1 <= default_topk <= max_topk:
        raise ValueError(f"default_topk must be in 1..max_topk={max_topk}, got {default_topk}")
    for name, value in (
        ("max_queries_per_request", max_queries_per_request),
        ("max_query_chars", max_query_chars),
        ("max_results_per_request", max_results_per_request),
        ("chunk_queries", chunk_queries),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if client_timeout_s is not None and client_timeout_s <= 0:
        raise ValueError(f"client_timeout_s must be > 0 (or None), got {client_timeout_s}")
    limits = _Limits(
        default_topk, max_topk, max_queries_per_request, max_query_chars, max_results_per_request
    )
    stats = _Stats(batch_cap=max_batch_queries)
    state: dict[str, _Batcher] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher = _Batcher(
            retriever,
            max_batch_queries,
            batch_wait_ms / 1000.0,
            stats,
            adaptive=adaptive_batch,
            chunk_queries=chunk_queries,
        )
        batcher.start()
        state["batcher"] = batcher
        try:
            yield
        finally:
            await batcher.stop()

    async def retrieve(scope: Scope, receive: Receive, send: Send) -> None:
        # The body is read and checked by hand (not a pydantic model) so that every mistake
        # gets one plain message and no value is silently coerced.
        try:
            body = await _receive_body(scope, receive, limits.max_body_bytes, client_timeout_s)
            query = parse_request(body, limits)
        except _BadRequest as e:
            status, payload = e.status, _error_body(str(e))
        except _ClientGone:
            return
        else:
            answer = await _answer_unless_gone(state["batcher"].submit(query), receive)
            if answer is None:
                return
            status, payload = answer
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(payload)),
        ]
        if status == 408:  # the rest of a late body may still come: do not read it as a request
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    app = _RetrievalApp(
        retrieve,
        client_timeout_s=client_timeout_s,
        title="agentgym retrieval server",
        lifespan=lifespan,
    )
    description = describe_retriever(retriever)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "retriever": type(retriever).__name__,
                "serving": description,
                "max_batch_queries": max_batch_queries,
                "batch_wait_ms": batch_wait_ms,
                "adaptive_batch": adaptive_batch,
                "batch_cap": stats.batch_cap,
                "default_topk": default_topk,
                "max_topk": max_topk,
                "max_queries_per_request": max_queries_per_request,
                "max_query_chars": max_query_chars,
                "max_results_per_request": max_results_per_request,
                "chunk_queries": chunk_queries,
                "client_timeout_s": client_timeout_s,
                "waiting_requests": state["batcher"].waiting_requests if state else 0,
                "requests": stats.requests,
                "queries": stats.queries,
                "searches": stats.searches,
                "largest_batch_queries": stats.largest_batch_queries,
                "failed_requests": stats.failed_requests,
                "search_seconds": round(stats.search_seconds, 3),
                "uptime_s": round(time.time() - stats.started_at, 3),
            }
        )

    return app


class _ClientGone(Exception):
    """The client disconnected before its request body arrived."""


async def _receive_body(
    scope: Scope, receive: Receive, max_bytes: int, timeout_s: float | None = None
) -> bytes:
    """The request body, refused with a 413 as soon as it grows past ``max_bytes`` and with a
    408 if it has not all arrived within ``timeout_s``."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
            raise _BadRequest(
                413, f"body of {value.decode()} bytes is over this server's {max_bytes}"
            )
    chunks = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _ClientGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > max_bytes:
                    raise _BadRequest(413, f"body is over this server's {max_bytes} bytes")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise _BadRequest(
            408,
            f"the request body did not arrive within {timeout_s:g} s ({size} bytes came); "
            "send the whole request at once",
        ) from None


async def _answer_unless_gone(
    answer: asyncio.Future[tuple[int, bytes]], receive: Receive
) -> tuple[int, bytes] | None:
    """The batcher's answer, or None if the client hangs up first (then the request is
    withdrawn, so a large request whose client gave up stops taking turns)."""

    async def hang_up() -> None:
        # the body has been read: the next message is the disconnect, whenever it comes
        while (await receive())["type"] != "http.disconnect":
            pass

    gone = asyncio.ensure_future(hang_up())
    try:
        await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not answer.done():  # the client left, or this handler is being cancelled
            answer.cancel()
    return None if answer.cancelled() else answer.result()


class _RetrievalApp(FastAPI):
    """A FastAPI app that answers ``POST /retrieve`` straight from the ASGI call.

    FastAPI's routing, request and response objects cost more CPU per request than the search
    itself does per query in a large batch, and the server's throughput is bound by that
    per-request work; so ``/retrieve`` skips them (middleware added to the app does not see it).
    Everything else (``/health``, 404s, 405s, the lifespan) goes through FastAPI as usual.
    """

    def __init__(self, retrieve: ASGIApp, *, client_timeout_s: float | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._retrieve = retrieve
        self.client_timeout_s = client_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/retrieve":
            if scope["method"] == "POST":
                await self._retrieve(scope, receive, send)
            else:
                body = _error_body(f"use POST for /retrieve, not {scope['method']}")
                headers = [(b"content-type", b"application/json"), (b"allow", b"POST")]
                await send({"type": "http.response.start", "status": 405, "headers": headers})
                await send({"type": "http.response.body", "body": body})
            return
        await super().__call__(scope, receive, send)


class BackgroundServer:
    """A uvicorn server running an app in a daemon thread of this process; see
    :func:`serve_in_thread`. ``url`` is its base URL (``http://127.0.0.1:PORT``)."""

    def __init__(self, server: Any, thread: threading.Thread, url: str) -> None:
        self._server = server
        self._thread = thread
        self.url = url

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the server to finish (lifespan shutdown runs) and wait for its thread."""
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(
    app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 30.0
) -> BackgroundServer:
    """Run ``app`` with uvicorn in a background thread and return once it accepts connections.

    ``port=0`` picks a free port (read it from ``.url``). For tests, notebooks and trainers that
    want a server inside their own process; ``serve`` is the command-line way. Use it as a
    context manager, or call ``.stop()``.
    """
    import uvicorn

    _warn_if_exposed(host)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, **_uvicorn_options(app)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="retrieval-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(
                f"the retrieval server failed to start on {host}:{port}; see the log"
            )
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the retrieval server did not start within {startup_timeout} s")
        time.sleep(0.005)
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    return BackgroundServer(server, thread, f"http://{host}:{bound_port}")


def _uvicorn_options(app: ASGIApp) -> dict[str, Any]:
    """What uvicorn needs besides the defaults to serve ``app``: for an app with a
    ``client_timeout_s``, an HTTP protocol that closes connections that send no complete request
    head within it."""
    timeout_s = getattr(app, "client_timeout_s", None)
    return {} if timeout_s is None else {"http": _request_deadline_protocol(timeout_s)}


def _request_deadline_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (h11 or httptools, whichever it picks), closing a connection that
    has not sent a whole request head ``timeout_s`` after opening or after its last answer.

    uvicorn's own ``timeout_keep_alive`` starts only after a first answer, so a client that
    connects and sends nothing, or half a head, would hold its socket (and a file descriptor)
    for ever; many such clients exhaust the server. The deadline is not moved by the bytes that
    trickle in, so sending one byte now and then does not keep a connection. Once a head is in,
    the app has the request: its body has the app's own deadline, and a search that takes long
    never closes the connection. Once the answer is handed over, the deadline is armed again: a
    client that has not read all of it by then is disconnected (``abort``: a plain close would
    wait for the client to read the rest, which it may never do).
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class RequestDeadlineProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(timeout_s, self._expire)

        def _expire(self) -> None:
            self._deadline = None
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                return  # a request is in; answering it re-arms the deadline
            if self.transport.get_write_buffer_size():
                # an answer the client has not read within the timeout: close() would wait for
                # it to read every byte (holding the answer's memory and the socket for as long
                # as the client likes), so the connection is dropped at once
                self.transport.abort()
            elif not self.transport.is_closing():
                self.transport.close()

    return RequestDeadlineProtocol


def _warn_if_exposed(host: str) -> None:
    """One warning line when ``host`` is not a loopback address: the server has no
    authentication, so everyone who can reach the port can use it."""
    if not _is_loopback(host):
        logger.warning(
            "serving on %s, which other machines may reach: this server has no authentication, "
            "so anyone who can reach the port can query it; bind 127.0.0.1 (the default) unless "
            "a firewall or an authenticating proxy guards it",
            host,
        )


def describe_retriever(retriever: Retriever) -> list[str]:
    """Lines saying what ``retriever`` searches and how: its documents, index (with the search
    path it runs, e.g. FAISS on CPU or torch on GPU) and encoder, as far as it exposes them."""
    lines = []
    documents = getattr(retriever, "documents", None)
    if documents is not None and hasattr(documents, "__len__"):
        lines.append(f"documents: {len(documents):,}")
    for part in ("index", "encoder"):
        obj = getattr(retriever, part, None)
        if obj is not None:
            lines.append(f"{part}: {obj!r}")
    search_path = getattr(getattr(retriever, "index", None), "search_path", None)
    if search_path is not None:
        lines.append(f"search path: {search_path}")
    return lines or [repr(retriever)]


def set_compute_threads(threads: int) -> None:
    """Use ``threads`` compute threads in torch and FAISS (those already imported or importable).

    Call before the first search: both size their thread pools on first use.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(threads)
    with contextlib.suppress(ImportError):
        import faiss

        faiss.omp_set_num_threads(threads)


def serve(
    index_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    encoder: str | Path | None = None,
    max_batch_queries: int = 512,
    batch_wait_ms: float = 0.0,
    max_topk: int = 100,
    default_topk: int = 3,
    max_queries_per_request: int = 4096,
    max_results_per_request: int = 65_536,
    max_query_chars: int = 4096,
    chunk_queries: int = 64,
    client_timeout_s: float | None = 30.0,
    adaptive_batch: bool = True,
    threads: int | None = None,
    access_log: bool = False,
) -> None:
    """Load the index in ``index_dir`` and serve it over HTTP until interrupted (Ctrl-C).

    Binds ``host``: loopback unless told otherwise, because the server has no authentication
    (another address gets a warning line). The batching, limit and timeout arguments are
    :func:`create_app`'s. ``encoder`` overrides the query encoder a dense index was built with. ``threads`` sets the
    compute threads of torch (the query encoder) and FAISS (``None``: the libraries' defaults,
    one per core); on cores shared with other work, fewer threads keep one search from stalling
    whenever one of its threads is descheduled. Per-request access logs are off by default: at
    thousands of requests per second they cost real throughput.
    """
    import uvicorn

    from agentgym.retrieval import open_retriever

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    _warn_if_exposed(host)  # before the load, which can take minutes
    t0 = time.perf_counter()
    logger.info("loading the index in %s", index_dir)
    if threads is not None:
        set_compute_threads(threads)
    retriever = open_retriever(index_dir, encoder=encoder)
    logger.info(
        "serving %s from %s (loaded in %.1f s)%s",
        type(retriever).__name__,
        index_dir,
        time.perf_counter() - t0,
        "".join(f"\n  {line}" for line in describe_retriever(retriever)),
    )
    logger.info(
        "micro-batching %s (max %d queries per search%s, %.1f ms window); requests of at most "
        "%d queries, topk %d, %d results (queries x topk), larger ones searched %d queries at a "
        "time; POST http://%s:%d/retrieve",
        "off" if max_batch_queries == 1 else "on",
        max_batch_queries,
        ", fewer where the retriever gains nothing" if adaptive_batch else "",
        batch_wait_ms,
        max_queries_per_request,
        max_topk,
        max_results_per_request,
        chunk_queries,
        host,
        port,
    )
    try:
        app = create_app(
            retriever,
            max_batch_queries=max_batch_queries,
            batch_wait_ms=batch_wait_ms,
            max_topk=max_topk,
            default_topk=default_topk,
            max_queries_per_request=max_queries_per_request,
            max_results_per_request=max_results_per_request,
            max_query_chars=max_query_chars,
            chunk_queries=chunk_queries,
            client_timeout_s=client_timeout_s,
            adaptive_batch=adaptive_batch,
        )
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="info",
            access_log=access_log,
            **_uvicorn_options(app),
        )
    finally:
        retriever.close()
