"""Retrieval for search-augmented QA (passages) and WebShop (products).

The shared interface is :class:`~agentgym.retrieval.base.Retriever`: ``search(queries, topk)``
returns one best-first list of :class:`~agentgym.retrieval.base.Hit` per query.
"""

from agentgym.retrieval.base import Hit, Retriever

__all__ = ["Hit", "Retriever"]
