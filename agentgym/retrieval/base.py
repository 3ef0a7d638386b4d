"""The retrieval interface shared by search-QA (passages) and WebShop (products).

Everything that searches (BM25 through bm25s or pyserini, dense FAISS / torch indexes, the HTTP
client of a retrieval server) answers the same call::

    retriever.search(["who wrote hamlet", "capital of peru"], topk=3)
    -> [[Hit(doc_id="17", score=12.3, document={"id": "17", "contents": '"Hamlet"\\n...'}), ...],
        [...]]

one list of hits per query, best first. ``document`` is the corpus record exactly as the corpus
holds it (Search-R1's wiki-18 format: ``{"id": ..., "contents": "\\"Title\\"\\ntext"}``), which is
also what the retrieval server sends back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["Hit", "Retriever"]


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: the document's id, its score (higher is better) and its record."""

    doc_id: str
    score: float
    document: dict[str, Any] = field(default_factory=dict, compare=False)


@runtime_checkable
class Retriever(Protocol):
    """Anything that answers a batch of queries with the top-k documents of each.

    ``search(queries, topk)`` returns ``len(queries)`` lists of at most ``topk`` :class:`Hit`,
    best first. Implementations batch internally (one encoder call, one index search for the
    whole list), so callers should pass every query they have at once.
    """

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]: ...

    def close(self) -> None: ...
