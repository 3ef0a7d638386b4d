"""The retrieval server over real HTTP on loopback: Search-R1's protocol, micro-batching, bad
requests, disconnects and failing searches, and ``agentgym retrieval serve`` as a subprocess.

Every server here is a real uvicorn server (in a thread, or a subprocess for the CLI) serving a
real BM25 index over a generated corpus; the only wrapper is :class:`RecordingRetriever`, which
passes searches through to that index and records them (to count searches), optionally slowed
down or refusing a marked query (to test disconnects and failures).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from agentgym.retrieval.base import Hit
from agentgym.retrieval.server import create_app, serve_in_thread
from agentgym.retrieval.sparse import BM25Retriever
from agentgym.retrieval.synthetic import synthetic_corpus, synthetic_queries

NUM_PASSAGES = 2000


class RecordingRetriever:
    """Passes every search through to ``inner`` and records ``(queries, topk)`` of each call.

    ``delay_s`` sleeps inside each search (a slow index); a search whose queries contain
    ``fail_on`` raises ``ValueError`` (a query the index cannot take).
    """

    def __init__(self, inner: BM25Retriever, delay_s: float = 0.0, fail_on: str | None = None):
        self.inner = inner
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.calls: list[tuple[list[str], int]] = []
        self._lock = threading.Lock()

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        with self._lock:
            self.calls.append((list(queries), topk))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_on is not None:
            for q in queries:
                if self.fail_on in q:
                    raise ValueError(f"the index cannot search {q!r}")
        return self.inner.search(queries, topk)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def documents() -> list[dict]:
    return list(synthetic_corpus(NUM_PASSAGES, seed=0))


@pytest.fixture(scope="module")
def bm25(documents) -> BM25Retriever:
    return BM25Retriever.from_documents(documents)


@pytest.fixture(scope="module")
def questions() -> list[str]:
    return [q["question"] for q in synthetic_queries(NUM_PASSAGES, 96, seed=0)]


@pytest.fixture(scope="module")
def server(bm25) -> Iterator[str]:
    """One shared server with small limits, for the request-validation tests."""
    app = create_app(bm25, max_topk=20, max_queries_per_request=8, max_query_chars=200)
    with serve_in_thread(app) as running:
        yield running.url


def expected_json(retriever, queries: list[str], topk: int, return_scores: bool) -> list:
    """What ``/retrieve`` must answer: a direct search, in Search-R1's response shape."""
    hits = retriever.search(queries, topk)
    if return_scores:
        return [[{"document": h.document, "score": h.score} for h in row] for row in hits]
    return [[h.document for h in row] for row in hits]


async def post_all(url: str, payloads: list[dict], timeout: float = 30.0) -> list[httpx.Response]:
    """Send every payload at the same time, one connection each."""
    limits = httpx.Limits(max_connections=len(payloads))
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        return await asyncio.gather(*(client.post(url + "/retrieve", json=p) for p in payloads))


# ----------------------------------------------------------------------------------------------
# Protocol


def test_retrieve_answers_search_r1_shape_with_scores(server, bm25, questions):
    queries = questions[:3]
    r = httpx.post(
        server + "/retrieve", json={"queries": queries, "topk": 5, "return_scores": True}
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    result = r.json()["result"]
    assert result == expected_json(bm25, queries, 5, return_scores=True)
    assert all(1 <= len(row) <= 5 for row in result) and len(result[0]) == 5
    for row in result:
        scores = [item["score"] for item in row]
        assert scores == sorted(scores, reverse=True)
        assert set(row[0]) == {"document", "score"}
        assert set(row[0]["document"]) == {"id", "contents"}


def test_return_scores_false_answers_documents_per_query(server, bm25, questions):
    # Search-R1's own server raises on this path; ours answers a list of documents per query
    queries = questions[3:5]
    r = httpx.post(
        server + "/retrieve", json={"queries": queries, "topk": 2, "return_scores": False}
    )
    assert r.status_code == 200
    assert r.json() == {"result": expected_json(bm25, queries, 2, return_scores=False)}


def test_defaults_are_search_r1s(server, bm25, questions):
    # topk absent or null -> 3 (Search-R1's --topk default); return_scores absent -> false
    q = questions[5:6]
    want = expected_json(bm25, q, 3, return_scores=False)
    for payload in ({"queries": q}, {"queries": q, "topk": None}):
        r = httpx.post(server + "/retrieve", json=payload)
        assert r.status_code == 200, r.text
        assert r.json()["result"] == want


def test_health(server):
    r = httpx.get(server + "/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert body["retriever"] == "BM25Retriever"
    assert body["max_topk"] == 20 and body["default_topk"] == 3


# ----------------------------------------------------------------------------------------------
# Bad requests: a 4xx saying what is wrong, and the server keeps serving

BAD_REQUESTS = [
    # (id, body, status, words the message must contain)
    ("not-json", b"who wrote hamlet", 400, "not valid JSON"),
    ("bad-utf8", b'{"queries": ["\xff\xfe"]}', 400, "not valid JSON"),
    ("truncated-json", b'{"queries": ["a"', 400, "not valid JSON"),
    ("json-list", b'["who wrote hamlet"]', 400, "must be a JSON object"),
    ("json-string", b'"who wrote hamlet"', 400, "must be a JSON object"),
    ("empty-body", b"", 400, "not valid JSON"),
    ("deep-nesting", b"[" * 5000 + b"]" * 5000, 400, "not valid JSON"),
    ("missing-queries", b'{"topk": 3}', 422, "missing field 'queries'"),
    ("queries-a-string", b'{"queries": "who wrote hamlet"}', 422, "'queries' must be a list"),
    ("queries-null", b'{"queries": null}', 422, "'queries' must be a list of strings, got null"),
    ("query-an-int", b'{"queries": ["a", 7]}', 422, "'queries[1]' must be a string"),
    ("query-a-list", b'{"queries": [["a"]]}', 422, "'queries[0]' must be a string"),
    ("empty-queries", b'{"queries": []}', 422, "'queries' is empty"),
    ("topk-a-bool", b'{"queries": ["a"], "topk": true}', 422, "'topk' must be an integer"),
    ("topk-a-float", b'{"queries": ["a"], "topk": 3.0}', 422, "'topk' must be an integer"),
    ("topk-a-string", b'{"queries": ["a"], "topk": "3"}', 422, "'topk' must be an integer"),
    ("topk-zero", b'{"queries": ["a"], "topk": 0}', 422, "between 1 and 20"),
    ("topk-negative", b'{"queries": ["a"], "topk": -2}', 422, "between 1 and 20"),
    ("topk-over-max", b'{"queries": ["a"], "topk": 21}', 422, "between 1 and 20"),
    ("scores-an-int", b'{"queries": ["a"], "return_scores": 1}', 422, "'return_scores' must be"),
    ("scores-a-string", b'{"queries": ["a"], "return_scores": "yes"}', 422, "true or false"),
    ("scores-null", b'{"queries": ["a"], "return_scores": null}', 422, "true or false"),
    ("unknown-field", b'{"queries": ["a"], "top_k": 3}', 422, "unknown field(s) 'top_k'"),
    ("too-many-queries", json.dumps({"queries": ["a"] * 9}).encode(), 413, "at most 8"),
    ("query-too-long", json.dumps({"queries": ["a" * 201]}).encode(), 413, "at most 200"),
]


@pytest.mark.parametrize(
    "body,status,words", [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS]
)
def test_bad_request_gets_4xx_with_message(server, body, status, words):
    r = httpx.post(server + "/retrieve", content=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert words in r.json()["detail"]
    # and the server keeps serving
    ok = httpx.post(server + "/retrieve", json={"queries": ["a river in Teleria"]})
    assert ok.status_code == 200


def test_oversized_body_is_refused_before_it_is_read(server):
    # limits 8 queries x 200 chars: a 50 MB body cannot be a valid request
    r = httpx.post(server + "/retrieve", content=b"x" * 50_000_000)
    assert r.status_code == 413
    assert "over this server's" in r.json()["detail"]
    assert httpx.get(server + "/health").status_code == 200


def test_wrong_method_and_path(server):
    assert httpx.get(server + "/retrieve").status_code == 405
    assert httpx.post(server + "/search", json={"queries": ["a"]}).status_code == 404


def test_create_app_refuses_bad_settings(bm25):
    with pytest.raises(ValueError, match="max_batch_queries"):
        create_app(bm25, max_batch_queries=0)
    with pytest.raises(ValueError, match="batch_wait_ms"):
        create_app(bm25, batch_wait_ms=-1)
    with pytest.raises(ValueError, match="default_topk"):
        create_app(bm25, default_topk=5, max_topk=4)


# ----------------------------------------------------------------------------------------------
# Micro-batching


def test_concurrent_clients_get_their_own_results_from_few_searches(bm25, questions):
    recorder = RecordingRetriever(bm25)
    # a 50 ms window: every request of the burst lands in the first batch or two
    app = create_app(recorder, batch_wait_ms=50)
    # 64 clients at once, with 1-3 queries each, topk 1-5, scores on and off
    payloads = [
        {
            "queries": questions[i : i + 1 + i % 3],
            "topk": 1 + i % 5,
            "return_scores": i % 2 == 0,
        }
        for i in range(64)
    ]
    with serve_in_thread(app) as running:
        responses = asyncio.run(post_all(running.url, payloads))
        health = httpx.get(running.url + "/health").json()
    for p, r in zip(payloads, responses, strict=True):
        assert r.status_code == 200, r.text
        assert r.json()["result"] == expected_json(
            bm25, p["queries"], p["topk"], p["return_scores"]
        )
    # batched: far fewer searches than requests, each at the depth its deepest request asked
    assert len(recorder.calls) < len(payloads) / 4
    assert sum(len(q) for q, _ in recorder.calls) == sum(len(p["queries"]) for p in payloads)
    assert max(topk for _, topk in recorder.calls) == 5
    assert health["requests"] == 64 and health["searches"] == len(recorder.calls)
    assert health["largest_batch_queries"] > 1


def test_max_batch_queries_caps_each_search(bm25, questions):
    recorder = RecordingRetriever(bm25)
    app = create_app(recorder, max_batch_queries=4, batch_wait_ms=50)
    payloads = [{"queries": [q]} for q in questions[:24]]
    with serve_in_thread(app) as running:
        responses = asyncio.run(post_all(running.url, payloads))
    assert all(r.status_code == 200 for r in responses)
    sizes = [len(q) for q, _ in recorder.calls]
    assert max(sizes) <= 4 and sum(sizes) == 24
    assert len(sizes) >= 6


def test_batching_off_searches_every_request_alone(bm25, questions):
    recorder = RecordingRetriever(bm25)
    app = create_app(recorder, max_batch_queries=1)
    payloads = [{"queries": questions[i : i + 2], "topk": 2} for i in range(16)]
    with serve_in_thread(app) as running:
        responses = asyncio.run(post_all(running.url, payloads))
    for p, r in zip(payloads, responses, strict=True):
        assert r.json()["result"] == expected_json(bm25, p["queries"], 2, False)
    # a request larger than max_batch_queries is still one search, never split
    assert sorted(map(tuple, (q for q, _ in recorder.calls))) == sorted(
        tuple(p["queries"]) for p in payloads
    )


def test_search_runs_off_the_event_loop(bm25):
    # while a 1 s search runs, the server still answers /health at once
    app = create_app(RecordingRetriever(bm25, delay_s=1.0), batch_wait_ms=0)
    with serve_in_thread(app) as running:
        slow = threading.Thread(
            target=httpx.post,
            args=(running.url + "/retrieve",),
            kwargs={"json": {"queries": ["a"]}},
        )
        slow.start()
        time.sleep(0.2)
        t0 = time.perf_counter()
        assert httpx.get(running.url + "/health").status_code == 200
        assert time.perf_counter() - t0 < 0.5
        slow.join()
        # and /health counts the time spent searching
        assert httpx.get(running.url + "/health").json()["search_seconds"] >= 1.0


def test_failing_search_answers_500_to_its_request_only(bm25, questions):
    recorder = RecordingRetriever(bm25, fail_on="BOOM")
    app = create_app(recorder, batch_wait_ms=50)
    payloads = [{"queries": [q]} for q in questions[:15]] + [{"queries": ["BOOM river"]}]
    with serve_in_thread(app) as running:
        responses = asyncio.run(post_all(running.url, payloads))
        after = httpx.post(running.url + "/retrieve", json={"queries": questions[:1]})
        alone = httpx.post(running.url + "/retrieve", json={"queries": ["BOOM again"]})
        health = httpx.get(running.url + "/health").json()
    *good, bad = responses
    assert bad.status_code == 500
    assert "ValueError" in bad.json()["detail"] and "BOOM river" in bad.json()["detail"]
    for p, r in zip(payloads, good, strict=False):
        assert r.status_code == 200
        assert r.json()["result"] == expected_json(bm25, p["queries"], 3, False)
    # the merged search failed, then each request was searched alone
    assert any(len(q) > 1 for q, _ in recorder.calls)
    assert after.status_code == 200
    assert alone.status_code == 500 and "BOOM again" in alone.json()["detail"]
    assert health["failed_requests"] == 2


def test_retriever_returning_wrong_shape_is_a_500(bm25):
    class Short(RecordingRetriever):
        def search(self, queries, topk=3):
            return super().search(queries, topk)[:-1]

    with serve_in_thread(create_app(Short(bm25))) as running:
        r = httpx.post(running.url + "/retrieve", json={"queries": ["a", "b"]})
    assert r.status_code == 500
    assert "returned 1 result lists for 2 queries" in r.json()["detail"]


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_client_disconnecting_mid_request_does_not_break_the_batch(bm25, questions):
    app = create_app(RecordingRetriever(bm25, delay_s=0.3), batch_wait_ms=50)
    body = json.dumps({"queries": questions[:1]}).encode()
    with serve_in_thread(app) as running:
        # a raw client that sends a full request and hangs up before the answer
        sock = socket.create_connection(("127.0.0.1", _port(running.url)))
        sock.sendall(
            b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        time.sleep(0.01)
        sock.close()
        # an httpx client that gives up mid-search, and others that wait, in the same batch
        payloads = [{"queries": [q]} for q in questions[1:9]]

        async def run() -> list:
            async with httpx.AsyncClient(timeout=0.1) as impatient:
                quitter = impatient.post(running.url + "/retrieve", json={"queries": ["x"]})
                return await asyncio.gather(
                    quitter, post_all(running.url, payloads), return_exceptions=True
                )

        quitter_result, responses = asyncio.run(run())
        assert isinstance(quitter_result, httpx.TimeoutException)
        for p, r in zip(payloads, responses, strict=True):
            assert r.status_code == 200
            assert r.json()["result"] == expected_json(bm25, p["queries"], 3, False)
        # and later requests are served as usual
        later = httpx.post(running.url + "/retrieve", json={"queries": questions[:1]})
        assert later.json()["result"] == expected_json(bm25, questions[:1], 3, False)


# ----------------------------------------------------------------------------------------------
# `agentgym retrieval serve` as a real subprocess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_serve_answers_over_a_built_bm25_index(tmp_path: Path, corpus_path: Path):
    from agentgym.retrieval import open_retriever

    index_dir = tmp_path / "bm25"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    agentgym = [sys.executable, "-m", "agentgym.cli", "retrieval"]
    subprocess.run(
        [
            *agentgym,
            "index",
            "--corpus",
            str(corpus_path),
            "--kind",
            "bm25",
            "--out",
            str(index_dir),
        ],
        check=True,
        env=env,
        capture_output=True,
        timeout=120,
    )
    port = _free_port()
    proc = subprocess.Popen(
        [
            *agentgym,
            "serve",
            "--index",
            str(index_dir),
            "--port",
            str(port),
            "--max-topk",
            "5",
            "--default-topk",
            "2",
            "--threads",
            "1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"serve exited early:\n{proc.stdout.read()}"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve did not come up within 60 s"
            time.sleep(0.2)
        queries = [q["question"] for q in synthetic_queries(2000, 4, seed=3)]
        r = httpx.post(url + "/retrieve", json={"queries": queries, "return_scores": True})
        assert r.status_code == 200
        direct = open_retriever(index_dir)
        try:  # --default-topk 2 is the depth of a request that leaves topk out
            assert r.json()["result"] == expected_json(direct, queries, 2, return_scores=True)
        finally:
            direct.close()
        too_deep = httpx.post(url + "/retrieve", json={"queries": queries, "topk": 6})
        assert too_deep.status_code == 422 and "between 1 and 5" in too_deep.json()["detail"]
        health = httpx.get(url + "/health").json()
        assert (health["max_topk"], health["default_topk"]) == (5, 2)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode is not None
    assert "BM25" in out  # it logs what it serves


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--default-topk", "7", "--max-topk", "5"], "--default-topk must be between 1 and"),
        (["--max-topk", "0"], "--max-topk must be >= 1"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--batch-wait-ms", "-1"], "--batch-wait-ms must be >= 0"),
    ],
)
def test_cli_serve_refuses_bad_options_in_one_line(tmp_path: Path, corpus_path: Path, flags, words):
    from agentgym.retrieval.build import build_index

    index_dir = tmp_path / "bm25"
    build_index(corpus_path, index_dir, "bm25", show_progress=False)
    r = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "retrieval", "serve", "--index", str(index_dir)]
        + flags,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert words in r.stderr and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------------------------
# Adaptive batch size


def test_search_cost_fit_recovers_fixed_and_per_query_cost():
    from agentgym.retrieval.server import _MIN_ADAPTIVE_BATCH, _SearchCost

    cost = _SearchCost()
    assert cost.batch_cap(512) is None  # nothing seen yet: no opinion
    for n in (1, 1, 1, 1):
        cost.add(n, 0.005)
    assert cost.fit() is None and cost.batch_cap(512) is None  # one size only: no slope
    cost = _SearchCost()
    for n in (1, 4, 16, 64, 2, 32) * 3:
        cost.add(n, 0.010 + 0.0001 * n)
    fixed, per_query = cost.fit()
    assert fixed == pytest.approx(0.010, rel=0.05)
    assert per_query == pytest.approx(0.0001, rel=0.05)
    # fixed cost = 10% of the batch's time at n = 0.010 * 0.9 / (0.1 * 0.0001) = 900
    assert cost.batch_cap(512) == 512 and cost.batch_cap(10_000) == pytest.approx(900, abs=30)

    no_fixed = _SearchCost()
    for n in (1, 4, 16, 64, 2, 32) * 3:
        no_fixed.add(n, 0.0005 * n)
    assert no_fixed.batch_cap(512) == _MIN_ADAPTIVE_BATCH
    for _ in range(400):  # then a long steady load at the cap: the fit fades, the cap stays
        no_fixed.add(_MIN_ADAPTIVE_BATCH, 0.0005 * _MIN_ADAPTIVE_BATCH)
    assert no_fixed.batch_cap(512) is None


class CostedRetriever(RecordingRetriever):
    """A real BM25 search that takes ``fixed_s + per_query_s * len(queries)`` seconds at least
    (an index with, or without, a per-call cost such as a query encoder's forward pass)."""

    def __init__(self, inner: BM25Retriever, fixed_s: float, per_query_s: float) -> None:
        super().__init__(inner)
        self.fixed_s, self.per_query_s = fixed_s, per_query_s

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        time.sleep(self.fixed_s + self.per_query_s * len(queries))
        return super().search(queries, topk)


def _varied_searches(url: str, questions: list[str]) -> None:
    """Requests of 1..16 queries one after another: one search each, of varied sizes."""
    with httpx.Client(timeout=30) as client:
        for n in (1, 4, 16, 2, 8, 1, 16, 4):
            r = client.post(url + "/retrieve", json={"queries": questions[:n]})
            assert r.status_code == 200


def test_adaptive_batch_streams_small_searches_for_a_retriever_without_fixed_cost(bm25, questions):
    recorder = CostedRetriever(bm25, fixed_s=0.0, per_query_s=0.004)
    with serve_in_thread(create_app(recorder)) as running:
        _varied_searches(running.url, questions)
        cap = httpx.get(running.url + "/health").json()["batch_cap"]
        # no fixed cost: nothing to amortise, so batches shrink to the floor (sleep overshoot
        # on a busy machine reads as a little fixed cost, hence the margin)
        assert cap < 64
        recorder.calls.clear()
        payloads = [{"queries": [q], "topk": 3} for q in questions]
        responses = asyncio.run(post_all(running.url, payloads))
    assert [r.json()["result"] for r in responses] == [
        expected_json(bm25, [q], 3, return_scores=False) for q in questions
    ]
    # the burst of 96 is cut into several small searches (the cap follows each search's timing,
    # so it may move a little during the burst)
    assert len(recorder.calls) > 2
    assert max(len(queries) for queries, _ in recorder.calls) < 64


def test_adaptive_batch_keeps_large_batches_where_a_call_has_a_fixed_cost(bm25, questions):
    recorder = CostedRetriever(bm25, fixed_s=0.05, per_query_s=0.0001)
    with serve_in_thread(create_app(recorder)) as running:
        _varied_searches(running.url, questions)
        health = httpx.get(running.url + "/health").json()
    assert health["adaptive_batch"] is True
    assert health["batch_cap"] == 512  # 50 ms a call: batch as large as allowed


def test_fixed_batch_never_caps(bm25, questions):
    recorder = CostedRetriever(bm25, fixed_s=0.0, per_query_s=0.004)
    with serve_in_thread(create_app(recorder, adaptive_batch=False)) as running:
        _varied_searches(running.url, questions)
        health = httpx.get(running.url + "/health").json()
    assert health["adaptive_batch"] is False and health["batch_cap"] == 512
