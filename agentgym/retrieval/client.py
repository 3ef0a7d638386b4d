"""A :class:`~agentgym.retrieval.base.Retriever` that asks a retrieval server over HTTP.

Works with ``agentgym retrieval serve`` and with Search-R1's own retrieval server (same
``/retrieve`` protocol)::

    client = RetrievalClient("http://127.0.0.1:8000")
    client.search(["who wrote hamlet"], topk=3)   # one POST for the whole batch
    -> [[Hit(doc_id="17", score=12.3, document={"id": "17", "contents": ...}), ...]]
    client.close()

One HTTP connection is kept open and reused for every call (``httpx.Client``, safe to share
between threads). Failures raise built-in exceptions with the reason and what to do:
``ConnectionError`` (no server there), ``TimeoutError`` (no answer within ``timeout``),
``ValueError`` (the server refused the request: 4xx, with the server's message) and
``RuntimeError`` (the server failed: 5xx, or an answer that is not the protocol).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from agentgym.retrieval.base import Hit

__all__ = ["RetrievalClient"]


class RetrievalClient:
    """HTTP client of a ``/retrieve`` server, usable wherever a ``Retriever`` is.

    Args:
        url: the server's base URL (``http://host:port``) or its full ``/retrieve`` URL.
        timeout: seconds to wait for connecting and for each answer.
        topk: the depth :meth:`search` asks for when called without one.
    """

    def __init__(self, url: str, timeout: float = 30.0, topk: int = 3) -> None:
        if "://" not in url:
            url = "http://" + url  # "127.0.0.1:8000" is what people type
        base = url.rstrip("/")
        if base.endswith("/retrieve"):
            base = base[: -len("/retrieve")]
        self.base_url = base
        self.retrieve_url = base + "/retrieve"
        self.timeout = timeout
        self.topk = topk
        self._http = httpx.Client(timeout=timeout)

    def __repr__(self) -> str:
        return f"RetrievalClient({self.retrieve_url!r}, timeout={self.timeout}, topk={self.topk})"

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Hit]]:
        """The top ``topk`` hits of each query, best first: one POST for the whole batch.

        ``doc_id`` is ``str(document["id"])`` (``""`` for servers whose documents carry no id).
        """
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of strings; for one query pass [query]")
        queries = list(queries)
        if not queries:
            return []
        k = self.topk if topk is None else topk
        payload = {"queries": queries, "topk": k, "return_scores": True}
        body = self._post(payload)
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise RuntimeError(
                f"retrieval server at {self.retrieve_url} answered {len(queries)} queries with "
                f"something other than {{'result': [one list per query]}}: {str(body)[:200]}"
            )
        try:
            return [[_hit(item) for item in per_query] for per_query in result]
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise RuntimeError(
                f"retrieval server at {self.retrieve_url} sent a result item that is not "
                f"{{'document': {{...}}, 'score': float}} ({type(e).__name__}: {e})"
            ) from None

    def health(self) -> dict[str, Any]:
        """The server's ``GET /health`` answer (status, limits and batching counters)."""
        try:
            response = self._http.get(self.base_url + "/health")
        except httpx.HTTPError as e:
            raise self._transport_error(e) from e
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        """Close the HTTP connection. Idempotent."""
        self._http.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------
    def _post(self, payload: dict[str, Any]) -> Any:
        try:
            response = self._http.post(self.retrieve_url, json=payload)
        except httpx.HTTPError as e:
            raise self._transport_error(e) from e
        if response.status_code >= 400:
            detail = _detail(response)
            if response.status_code < 500:
                raise ValueError(
                    f"retrieval server at {self.retrieve_url} refused the request "
                    f"(HTTP {response.status_code}): {detail}"
                )
            raise RuntimeError(
                f"retrieval server at {self.retrieve_url} failed (HTTP {response.status_code}): "
                f"{detail}"
            )
        try:
            return response.json()
        except ValueError:
            raise RuntimeError(
                f"retrieval server at {self.retrieve_url} answered with non-JSON: "
                f"{response.text[:200]!r}"
            ) from None

    def _transport_error(self, e: httpx.HTTPError) -> Exception:
        if isinstance(e, httpx.TimeoutException):
            return TimeoutError(
                f"retrieval server at {self.base_url} did not answer within {self.timeout} s "
                f"({type(e).__name__}); it may be overloaded: raise RetrievalClient(timeout=...) "
                "or send smaller batches"
            )
        if isinstance(e, httpx.ConnectError):
            return ConnectionError(
                f"cannot connect to a retrieval server at {self.base_url} ({e}); start one with "
                "`agentgym retrieval serve --index DIR --port PORT` or fix the URL"
            )
        return ConnectionError(
            f"HTTP exchange with the retrieval server at {self.base_url} failed: "
            f"{type(e).__name__}: {e}"
        )


def _hit(item: dict[str, Any]) -> Hit:
    document = item["document"]
    doc_id = document.get("id", "")
    return Hit(doc_id=str(doc_id), score=float(item["score"]), document=document)


def _detail(response: httpx.Response) -> str:
    """The server's error message: FastAPI's ``{"detail": ...}`` when there, else the text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]
