"""Top-k BM25 with dynamic pruning (block-max MaxScore), compiled by numba.

The scores are the bm25s backend's per-posting Lucene BM25 terms (:mod:`.sparse`); this module
only finds the top ``k`` of every query faster than scoring every posting, and returns exactly
what exhaustive scoring returns: the same rows, the same float32 scores, ties in Anserini's order
(score descending, then ``tie_rank`` ascending).

Algorithm (MaxScore, Turtle & Flood 1995, with block maxima as in Lucene's
``MaxScoreBulkScorer``), document at a time over doc-sorted posting lists, in two phases: first
only the documents of the highest-bound terms whose lists are short together (at least one term,
see :data:`PHASE1_POSTINGS`), which sets a high k-th score early; then the other terms, leaving
out the documents phase 1 has scored. In each phase:

* each query term has an upper bound, its largest posting score times its count in the query;
  terms are sorted by that bound, and the longest prefix whose bounds sum below the current k-th
  score ``theta`` is *non-essential*: a document matching only those cannot enter the top k;
* candidates come from the essential lists only (their smallest current doc); the non-essential
  terms are then added from the largest bound down, each first checked against ``theta``: if the
  score so far plus the bounds still to add falls below ``theta`` the document is dropped
  without further look-ups; before that, the bound of each non-essential term is tightened to
  the maximum of the block of ``BLOCK`` postings holding the document;
* a document is dropped only when ``float32(bound) < theta``: one that could *tie* the k-th score
  is always scored, so the tie order is exact. A term's score times its count in the query is
  rounded to float32 and the terms are summed in float64, as the exhaustive path does (a sum
  that is exact for the few terms of a query, so its order does not matter), then rounded to
  float32. Bounds are rounded the same way, and rounding is monotone, so they stay bounds.

Posting lists are the columns of bm25s's CSC score matrix (``data`` float32, ``indices`` doc rows
ascending within a column, ``indptr`` int64 ``(n_terms + 1,)``).

The kernels (:mod:`._pruned_kernels`) compile in a background thread that the first search
starts (:func:`warm_up`); until they are ready, searches score every posting with numpy. A
process forked while they compile keeps the numpy path (same results, slower): fork after a
``warm_up(block=True)`` to give workers the compiled search.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from typing import Any

import numpy as np

__all__ = [
    "BLOCK",
    "PHASE1_POSTINGS",
    "PrunedIndex",
    "available",
    "build_bounds",
    "ready",
    "warm_up",
]

BLOCK = 64
"""postings per block for the block maxima"""
PHASE1_POSTINGS = 4096
"""phase 1 scores the highest-bound terms whose lists hold at most this many postings together
(or 1/64 of the documents, if more)"""

_HAVE_NUMBA = importlib.util.find_spec("numba") is not None
_kernels: Any = None  # agentgym.retrieval._pruned_kernels, once compiled
_warm_lock = threading.Lock()
_warm_thread: threading.Thread | None = None
logger = logging.getLogger(__name__)


def available() -> bool:
    """Whether numba is installed (``pip install "agentgym-envs[searchqa]"`` brings it)."""
    return _HAVE_NUMBA


def ready() -> bool:
    """Whether the kernels are compiled and the pruned search can run."""
    return _kernels is not None


def warm_up(block: bool = False) -> bool:
    """Compile the kernels (or load them from numba's on-disk cache) in a background thread,
    started on the first call; return :func:`ready`. ``block=True`` waits for it.

    Loading takes about a second, compiling (once per installation) tens of seconds; searches
    made meanwhile score every posting with numpy, which returns the same results, so the first
    search of a process never waits for the compiler.
    """
    global _warm_thread
    if _kernels is not None or not _HAVE_NUMBA:
        return _kernels is not None
    with _warm_lock:
        if _warm_thread is None:
            _warm_thread = threading.Thread(target=_compile, name="bm25-pruned-jit", daemon=True)
            _warm_thread.start()
    if block:
        _warm_thread.join()
    return _kernels is not None


def _compile() -> None:
    global _kernels
    try:
        from agentgym.retrieval import _pruned_kernels as kernels

        # compile (or load) the one signature every PrunedIndex uses, on a two-document index
        index = PrunedIndex(
            np.array([1.0, 2.0], dtype=np.float32),
            np.array([0, 1], dtype=np.int32),
            np.array([0, 2], dtype=np.int64),
            np.zeros(2, dtype=np.int32),
            2,
        )
        index.search(np.array([0, 1], dtype=np.int64), np.array([0], dtype=np.int64), 1, kernels)
    except Exception as err:  # noqa: BLE001  (any numba failure: stay on the numpy path)
        logger.warning("BM25 pruned search unavailable (%s); scoring every posting instead", err)
        return
    _kernels = kernels


def build_bounds(data: np.ndarray, indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Upper bounds for pruning, computed once per index (vectorised).

    Returns ``term_max`` ``(n_terms,)`` float32 (the largest score of each posting list, 0 for an
    empty one), ``block_max`` ``(n_blocks,)`` float32 (the largest score of each block of
    ``BLOCK`` consecutive postings of a list) and ``block_ptr`` ``(n_terms + 1,)`` int64 (term
    t's blocks are ``block_max[block_ptr[t]:block_ptr[t + 1]]``; its j-th block covers postings
    ``indptr[t] + j * BLOCK ...``).
    """
    data = np.asarray(data, dtype=np.float32)
    indptr = np.asarray(indptr, dtype=np.int64)
    lengths = np.diff(indptr)
    n_blocks = -(-lengths // BLOCK)
    block_ptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(n_blocks, out=block_ptr[1:])
    # the first posting of every block, in list order: reduceat over those starts
    term_of_block = np.repeat(np.arange(len(lengths)), n_blocks)
    j = np.arange(block_ptr[-1], dtype=np.int64) - block_ptr[term_of_block]
    starts = indptr[term_of_block] + j * BLOCK
    block_max = np.maximum.reduceat(data, starts) if len(starts) else np.zeros(0, dtype=np.float32)
    term_max = np.zeros(len(lengths), dtype=np.float32)
    has = n_blocks > 0
    if len(block_max):
        term_max[has] = np.maximum.reduceat(block_max, block_ptr[:-1][has])
    return term_max, block_max.astype(np.float32), block_ptr


def _read_only(array: np.ndarray, dtype: Any) -> np.ndarray:
    view = np.asarray(array, dtype=dtype).view()
    view.flags.writeable = False
    return view


class PrunedIndex:
    """The arrays the compiled search reads, prepared once per index (bounds included).

    ``data`` float32, ``indices`` (doc rows, ascending within a list) and ``indptr`` int64
    ``(n_terms + 1,)``: bm25s's CSC score matrix (memory-mapped arrays stay mapped);
    ``tie_rank`` ``(n_docs,)``: each row's rank in the documents' id order, or ``None`` for row
    order.
    """

    def __init__(
        self,
        data: np.ndarray,
        indices: np.ndarray,
        indptr: np.ndarray,
        tie_rank: np.ndarray | None,
        n_docs: int,
    ) -> None:
        # read-only views throughout: memory-mapped and in-memory indexes then share one
        # compiled signature (numba types read-only arrays apart)
        self.data = _read_only(data, np.float32)
        self.indices = _read_only(indices, None)
        self.indptr = _read_only(indptr, np.int64)
        self.term_max, self.block_max, self.block_ptr = map(
            _read_only, build_bounds(self.data, self.indptr), (None, None, None)
        )
        self.use_rank = tie_rank is not None
        self.tie_rank = _read_only(tie_rank if self.use_rank else np.zeros(1, dtype=np.int32), None)
        self.phase1_postings = max(PHASE1_POSTINGS, n_docs // 64)

    def search(
        self, query_ptr: np.ndarray, term_ids: np.ndarray, k: int, kernels: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` of every query; the same contract as ``BM25Index.search``.

        ``term_ids`` (int64) holds every query's analysed term ids back to back (-1 for unknown
        terms and stop words), query q's at ``term_ids[query_ptr[q]:query_ptr[q + 1]]``. Returns
        ``rows`` ``(n_queries, k)`` int64 padded with -1 and ``scores`` float32 padded with -inf.
        """
        n_queries = len(query_ptr) - 1
        rows = np.full((n_queries, k), -1, dtype=np.int64)
        scores = np.full((n_queries, k), -np.inf, dtype=np.float32)
        if n_queries > 0:
            kernels = kernels or _kernels
            if kernels is None:
                raise RuntimeError("call agentgym.retrieval.pruned.warm_up() first")
            kernels._search_batch(
                self.data, self.indices, self.indptr, self.term_max, self.block_max,
                self.block_ptr, BLOCK, self.tie_rank, self.use_rank, query_ptr, term_ids, k,
                self.phase1_postings, rows, scores,
            )  # fmt: skip
        return rows, scores
