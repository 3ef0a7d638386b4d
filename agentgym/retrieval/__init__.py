"""Retrieval for search-augmented QA (passages) and WebShop (products).

The shared interface is :class:`~agentgym.retrieval.base.Retriever`: ``search(queries, topk)``
returns one best-first list of :class:`~agentgym.retrieval.base.Hit` per query. Behind it:

- :class:`BM25Retriever` (``sparse``): BM25 through bm25s (in-process) or pyserini (Lucene);
- :class:`DenseRetriever` (``dense``): an :class:`Encoder` (E5 conventions) plus a FAISS index
  (Flat, HNSW, IVF-PQ) or an exact torch search;
- :class:`RetrievalClient` (``client``): a retrieval server over HTTP.

:func:`open_retriever` opens any of them from an index directory built by
``agentgym retrieval index`` (or :func:`build_index`) or from a server's URL.

Names are exported lazily: ``import agentgym.retrieval`` loads neither torch, FAISS nor
sentence-transformers; each loads when the name that needs it is first used.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.retrieval.base import Hit, Retriever

# faiss's loader logs at INFO which CPU build it tries, e.g. "Could not load library with AVX512
# support due to: ModuleNotFoundError(...)", which reads like an error on every machine without
# that build. Every faiss import in agentgym comes through this package, so it is quieted here,
# once, before faiss is first imported; its warnings still show.
logging.getLogger("faiss.loader").setLevel(logging.WARNING)

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time these load on first use
    from agentgym.retrieval.build import IndexMeta, build_index, read_meta
    from agentgym.retrieval.client import RetrievalClient
    from agentgym.retrieval.corpus import (
        CorpusFormatError,
        DocStore,
        DocStoreWriter,
        iter_corpus,
        split_title,
    )
    from agentgym.retrieval.dense import DenseIndex, DenseRetriever
    from agentgym.retrieval.encoder import Encoder
    from agentgym.retrieval.sparse import BM25Index, BM25Retriever
    from agentgym.retrieval.synthetic import synthetic_corpus, synthetic_queries, write_corpus

_LAZY = {
    "CorpusFormatError": "corpus",
    "DocStore": "corpus",
    "DocStoreWriter": "corpus",
    "iter_corpus": "corpus",
    "split_title": "corpus",
    "synthetic_corpus": "synthetic",
    "synthetic_queries": "synthetic",
    "write_corpus": "synthetic",
    "Encoder": "encoder",
    "DenseIndex": "dense",
    "DenseRetriever": "dense",
    "BM25Index": "sparse",
    "BM25Retriever": "sparse",
    "IndexMeta": "build",
    "build_index": "build",
    "read_meta": "build",
    "RetrievalClient": "client",
}

__all__ = [
    "BM25Index",
    "BM25Retriever",
    "CorpusFormatError",
    "DenseIndex",
    "DenseRetriever",
    "DocStore",
    "DocStoreWriter",
    "Encoder",
    "Hit",
    "IndexMeta",
    "RetrievalClient",
    "Retriever",
    "build_index",
    "iter_corpus",
    "open_retriever",
    "read_meta",
    "split_title",
    "synthetic_corpus",
    "synthetic_queries",
    "write_corpus",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentgym.retrieval' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"agentgym.retrieval.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def open_retriever(source: str | os.PathLike[str], **kwargs: Any) -> Retriever:
    """A :class:`Retriever` over an index directory or a retrieval server.

    ``source`` is either a directory written by ``agentgym retrieval index`` (its ``meta.json``
    says which kind: BM25 gives a :class:`BM25Retriever`, flat/hnsw/ivfpq a
    :class:`DenseRetriever`, both over the directory's :class:`DocStore`), or an ``http://`` /
    ``https://`` URL of ``agentgym retrieval serve`` (gives a :class:`RetrievalClient`).
    ``kwargs`` go to the retriever's opener: for dense indexes ``encoder`` (a name, folder or
    :class:`Encoder`; default: the one the index was built with), ``device``, ``mmap``,
    ``search_path``; for URLs ``timeout``.
    """
    text = os.fspath(source)
    if text.startswith(("http://", "https://")):
        from agentgym.retrieval.client import RetrievalClient

        return RetrievalClient(text, **kwargs)
    from agentgym.retrieval.build import open_index

    return open_index(Path(text), **kwargs)
