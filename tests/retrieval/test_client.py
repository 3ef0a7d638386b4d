"""RetrievalClient against a real retrieval server on loopback (uvicorn in a thread, BM25 index
over a generated corpus): same hits as searching directly, one connection, clear errors."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from agentgym.retrieval.base import Hit, Retriever
from agentgym.retrieval.client import RetrievalClient
from agentgym.retrieval.server import create_app, serve_in_thread
from agentgym.retrieval.sparse import BM25Retriever
from agentgym.retrieval.synthetic import synthetic_corpus, synthetic_queries

NUM_PASSAGES = 2000


class SlowOrFailing:
    """Passes searches through to a real retriever, after ``delay_s``; raises on ``fail_on``."""

    def __init__(self, inner: Retriever, delay_s: float = 0.0, fail_on: str | None = None):
        self.inner, self.delay_s, self.fail_on = inner, delay_s, fail_on

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        time.sleep(self.delay_s)
        if self.fail_on is not None and any(self.fail_on in q for q in queries):
            raise ValueError(f"the index cannot search {self.fail_on!r}")
        return self.inner.search(queries, topk)

    def close(self) -> None:
        pass


class RecordClientPorts:
    """ASGI app wrapper recording the client address of every HTTP request (one per socket)."""

    def __init__(self, app) -> None:
        self.app = app
        self.clients: list[tuple[str, int]] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            self.clients.append(tuple(scope["client"]))
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever.from_documents(list(synthetic_corpus(NUM_PASSAGES, seed=0)))


@pytest.fixture(scope="module")
def questions() -> list[str]:
    return [q["question"] for q in synthetic_queries(NUM_PASSAGES, 40, seed=0)]


@pytest.fixture(scope="module")
def recorded(bm25) -> Iterator[tuple[str, RecordClientPorts]]:
    app = RecordClientPorts(create_app(bm25, max_topk=10))
    with serve_in_thread(app) as running:
        yield running.url, app


def test_client_gives_the_hits_a_direct_search_gives(recorded, bm25, questions):
    url, _ = recorded
    with RetrievalClient(url) as client:
        assert isinstance(client, Retriever)
        got = client.search(questions[:10], topk=5)
        want = bm25.search(questions[:10], 5)
        assert got == want  # doc_id and score (Hit compares those)
        assert [[h.document for h in row] for row in got] == [
            [h.document for h in row] for row in want
        ]
        assert all(isinstance(h.score, float) and isinstance(h.doc_id, str) for h in got[0])
        # default depth is the client's topk
        assert [len(row) for row in client.search(questions[:2])] == [3, 3]
    with RetrievalClient(url, topk=1) as client:
        assert client.search(questions[:1]) == bm25.search(questions[:1], 1)


@pytest.mark.parametrize("form", ["base", "base/", "retrieve", "no-scheme"])
def test_client_accepts_base_or_retrieve_url(recorded, bm25, questions, form):
    url, _ = recorded
    given = {
        "base": url,
        "base/": url + "/",
        "retrieve": url + "/retrieve",
        "no-scheme": url.removeprefix("http://"),
    }[form]
    with RetrievalClient(given) as client:
        assert client.retrieve_url == url + "/retrieve"
        assert client.search(questions[:1], 2) == bm25.search(questions[:1], 2)
        assert client.health()["status"] == "ok"


def test_client_reuses_one_connection(recorded, questions):
    url, app = recorded
    before = len(app.clients)
    with RetrievalClient(url) as client:
        for q in questions[:5]:
            client.search([q])
    ports = app.clients[before:]
    assert len(ports) == 5 and len(set(ports)) == 1


def test_client_is_safe_to_share_between_threads(recorded, bm25, questions):
    url, _ = recorded
    results: dict[int, list[list[Hit]]] = {}
    with RetrievalClient(url) as client:

        def work(i: int) -> None:
            results[i] = client.search(questions[4 * i : 4 * i + 4], topk=2)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for i in range(8):
        assert results[i] == bm25.search(questions[4 * i : 4 * i + 4], 2)


def test_client_input_checks_need_no_server():
    client = RetrievalClient("http://127.0.0.1:9")  # nothing listens on the discard port
    assert client.search([]) == []
    with pytest.raises(TypeError, match=r"pass \[query\]"):
        client.search("who wrote hamlet")
    client.close()


def test_client_reports_a_refused_request_with_the_servers_message(recorded):
    url, _ = recorded
    with RetrievalClient(url) as client:
        with pytest.raises(ValueError, match=r"HTTP 422.*'topk' must be between 1 and 10"):
            client.search(["a"], topk=11)
        with pytest.raises(ValueError, match=r"'queries\[0\]' must be a string"):
            client.search([3])  # type: ignore[list-item]
        assert client.search(["a"], topk=2)  # still usable


def test_client_reports_no_server_with_what_to_do():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with RetrievalClient(f"http://127.0.0.1:{port}", timeout=5) as client:
        with pytest.raises(ConnectionError, match="agentgym retrieval serve"):
            client.search(["a"])


def test_client_timeout_and_server_errors(bm25):
    app = create_app(SlowOrFailing(bm25, delay_s=0.5, fail_on="BOOM"), batch_wait_ms=0)
    with serve_in_thread(app) as running:
        with RetrievalClient(running.url, timeout=0.1) as client:
            with pytest.raises(TimeoutError, match="did not answer within 0.1 s"):
                client.search(["a"])
        with RetrievalClient(running.url, timeout=10) as client:
            with pytest.raises(RuntimeError, match=r"HTTP 500.*ValueError.*BOOM"):
                client.search(["BOOM"])
            assert client.search(["a river"], 1) == bm25.search(["a river"], 1)
