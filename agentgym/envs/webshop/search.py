"""WebShop's product search: BM25 over each product's indexed text, top 50 per query.

WebShop indexes ``Title + Description + first bullet point + option text``, lower-cased
(``search_engine/convert_product_file_format.py``, here :func:`.data.search_text`), with
pyserini's ``DefaultLuceneDocumentGenerator`` and searches it with ``LuceneSearcher`` defaults
(BM25, k1=0.9, b=0.4), keeping the top ``SEARCH_RETURN_N = 50`` asins. We index the same texts
through the shared BM25 layer (:class:`agentgym.retrieval.sparse.BM25Index`): ``"bm25s"`` (the
default; Lucene's scoring without a JVM) or ``"pyserini"`` (a real Lucene index, opt-in).

Ties: stock WebShop's index holds each product under its asin, and Anserini orders equal BM25
scores by that id as a string; both backends here do the same (the index is built with the
asins as ids), so result pages list tied products in stock's order
(``benchmarks/bench_webshop.py`` compares our pages with stock's as they are).

One :class:`ProductSearch` per (catalogue, backend) per process (:func:`product_search`), shared
by every env; its index is built once and kept on disk under
``$AGENTGYM_CACHE/webshop/index-<backend>-<catalogue fingerprint>`` (written atomically), so a
second process maps the saved index instead of rebuilding it. Repeated queries (every env of a
group searches the same words) are answered from a per-process memo.
"""

from __future__ import annotations

import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Literal

import numpy as np

from agentgym.envs.cache import writable_cache_dir
from agentgym.envs.webshop.data import Catalogue, default_cache_dir
from agentgym.retrieval.sparse import BM25Index

__all__ = ["SEARCH_RETURN_N", "ProductSearch", "product_search"]

#: engine.py: how many products a search returns (5 result pages of 10)
SEARCH_RETURN_N = 50
#: bm25s indexes of catalogues smaller than this are rebuilt in memory (a fraction of a second)
#: rather than written to the cache; pyserini's always live on disk.
PERSIST_MIN_PRODUCTS = 5000
_MEMO_SIZE = 4096


class ProductSearch:
    """Top-50 product rows (indices into ``catalogue.products``) for a WebShop query.

    Args:
        catalogue: the loaded catalogue.
        backend: ``"bm25s"`` or ``"pyserini"``.
        cache_dir: where saved indexes live; default ``$AGENTGYM_CACHE/webshop``.
        persist: save/reuse the index on disk; default: for pyserini always, for bm25s when the
            catalogue has at least :data:`PERSIST_MIN_PRODUCTS` products.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        backend: Literal["bm25s", "pyserini"] = "bm25s",
        *,
        cache_dir: str | Path | None = None,
        persist: bool | None = None,
    ) -> None:
        if backend not in ("bm25s", "pyserini"):
            raise ValueError(f"search backend {backend!r}: choose 'bm25s' or 'pyserini'")
        self.catalogue = catalogue
        self.backend = backend
        if persist is None:
            persist = backend == "pyserini" or len(catalogue.products) >= PERSIST_MIN_PRODUCTS
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.path = cache_dir / f"index-{backend}-{catalogue.fingerprint}" if persist else None
        if self.path is not None and not self.path.is_dir():
            if writable_cache_dir(cache_dir, "the WebShop search index") is None:
                # bm25s keeps the index in memory; Lucene needs a folder: a private temporary one
                self.path = (
                    Path(tempfile.mkdtemp(prefix="agentgym-webshop-index-")) / self.path.name
                    if backend == "pyserini"
                    else None
                )
        self.index = self._open_or_build()
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def _open_or_build(self) -> BM25Index:
        if self.path is not None and self.path.is_dir():
            try:
                index = BM25Index.load(self.path, mmap=True)
                # an index saved without the asins would order ties by row: rebuild it
                if len(index) == len(self.catalogue.products) and index.ties_by_id:
                    return index
                index.close()
            except (FileNotFoundError, ValueError, KeyError, OSError):
                pass  # a stale or foreign folder: rebuild over it
        return BM25Index.build(
            self.catalogue.search_texts,
            backend=self.backend,
            path=self.path,
            show_progress=len(self.catalogue.products) >= PERSIST_MIN_PRODUCTS,
            ids=[p["asin"] for p in self.catalogue.products],  # stock's Lucene ids: its tie order
        )

    def search(self, query: str) -> np.ndarray:
        """Rows of the top-50 products for ``query``, best first (read-only int64, may be empty).

        ``query`` is what WebShop's text env passes on: the lower-cased text inside
        ``search[...]`` (WebShop splits it on spaces and joins it back, which changes nothing).
        """
        with self._lock:
            rows = self._memo.get(query)
            if rows is not None:
                self._memo.move_to_end(query)
                return rows
        rows = self.search_many([query])[0]
        with self._lock:
            self._memo[query] = rows
            if len(self._memo) > _MEMO_SIZE:
                self._memo.popitem(last=False)
        return rows

    def search_many(self, queries: list[str]) -> list[np.ndarray]:
        """:meth:`search` for a batch of queries in one index call (no memo)."""
        found, _ = self.index.search(queries, SEARCH_RETURN_N)
        out = []
        for row in found:
            rows = np.ascontiguousarray(row[row >= 0])
            rows.flags.writeable = False
            out.append(rows)
        return out

    def __repr__(self) -> str:
        return f"ProductSearch({self.backend}, {len(self.catalogue.products)} products)"


_SEARCHES: dict[tuple, ProductSearch] = {}
_SEARCHES_LOCK = threading.Lock()


def product_search(
    catalogue: Catalogue, backend: Literal["bm25s", "pyserini"] = "bm25s"
) -> ProductSearch:
    """The process-wide :class:`ProductSearch` of ``catalogue`` with ``backend`` (built once)."""
    key = (catalogue.key, backend)
    with _SEARCHES_LOCK:
        found = _SEARCHES.get(key)
        if found is None:
            found = _SEARCHES[key] = ProductSearch(catalogue, backend)
        return found
