"""Top-k BM25 with dynamic pruning (block-max MaxScore), compiled by numba.

The scores are the bm25s backend's per-posting Lucene BM25 terms (:mod:`.sparse`); this module
only finds the top ``k`` of every query faster than scoring every posting, and returns exactly
what exhaustive scoring returns: the same rows, the same float32 scores, ties in Anserini's order
(score descending, then ``tie_rank`` ascending).

Algorithm (MaxScore, Turtle & Flood 1995, with block maxima as in Lucene's
``MaxScoreBulkScorer``), document at a time over doc-sorted posting lists:

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
"""

from __future__ import annotations

import numpy as np

__all__ = ["BLOCK", "PHASE1_POSTINGS", "PrunedIndex", "available", "build_bounds"]

BLOCK = 64
"""postings per block for the block maxima"""
PHASE1_POSTINGS = 4096
"""phase 1 scores the highest-bound terms whose lists hold at most this many postings together
(or 1/64 of the documents, if more)"""

try:
    import numba

    _HAVE_NUMBA = True
except ImportError:  # the numpy path in sparse.py serves
    _HAVE_NUMBA = False


def available() -> bool:
    """Whether numba is installed (``pip install "agentgym-envs[searchqa]"`` brings it)."""
    return _HAVE_NUMBA


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


if _HAVE_NUMBA:

    @numba.njit(cache=True, nogil=True, inline="always")
    def _worse(s_a, r_a, s_b, r_b):
        # entry a ranks below entry b: lower score, or the same score and a later id
        return s_a < s_b or (s_a == s_b and r_a > r_b)

    @numba.njit(cache=True, nogil=True)
    def _sift_down(hs, hr, hd, n, i):
        while True:
            left = 2 * i + 1
            if left >= n:
                return
            worst = left
            right = left + 1
            if right < n and _worse(hs[right], hr[right], hs[left], hr[left]):
                worst = right
            if _worse(hs[worst], hr[worst], hs[i], hr[i]):
                hs[i], hs[worst] = hs[worst], hs[i]
                hr[i], hr[worst] = hr[worst], hr[i]
                hd[i], hd[worst] = hd[worst], hd[i]
                i = worst
            else:
                return

    @numba.njit(cache=True, nogil=True)
    def _sift_up(hs, hr, hd, i):
        while i > 0:
            parent = (i - 1) // 2
            if _worse(hs[i], hr[i], hs[parent], hr[parent]):
                hs[i], hs[parent] = hs[parent], hs[i]
                hr[i], hr[parent] = hr[parent], hr[i]
                hd[i], hd[parent] = hd[parent], hd[i]
                i = parent
            else:
                return

    @numba.njit(cache=True, nogil=True)
    def _advance(indices, pos, end, target):
        """First position in ``indices[pos:end]`` holding a doc >= target (galloping search)."""
        if pos >= end or indices[pos] >= target:
            return pos
        step = 1
        lo = pos
        hi = pos + 1
        while hi < end and indices[hi] < target:
            lo = hi
            step *= 2
            hi = pos + step
        if hi > end:
            hi = end
        # indices[lo] < target; answer in (lo, hi]
        lo += 1
        while lo < hi:
            mid = (lo + hi) >> 1
            if indices[mid] < target:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @numba.njit(cache=True, nogil=True)
    def _daat(
        data, indices, indptr, block_max, block_ptr, tie_rank, use_rank,
        t, c, cum, m, fe_min, skip_t, k, hs, hr, hd, n_heap,
    ):  # fmt: skip
        """One document-at-a-time MaxScore pass over terms ``t[:m]`` (ascending bounds, counts
        ``c``, bound prefix sums ``cum``), candidates from at least ``t[fe_min:m]``, documents of
        the lists ``skip_t`` left out (already scored); updates the heap, returns its size."""
        pos = np.empty(m, dtype=np.int64)
        end = np.empty(m, dtype=np.int64)
        for i in range(m):
            pos[i] = indptr[t[i]]
            end[i] = indptr[t[i] + 1]
        n_skip = len(skip_t)
        sk_pos = np.empty(n_skip, dtype=np.int64)
        sk_end = np.empty(n_skip, dtype=np.int64)
        for i in range(n_skip):
            sk_pos[i] = indptr[skip_t[i]]
            sk_end[i] = indptr[skip_t[i] + 1]
        theta = hs[0] if n_heap == k else np.float32(-np.inf)
        first_essential = fe_min  # terms [0, first_essential) are non-essential
        while first_essential < m and n_heap == k and np.float32(cum[first_essential]) < theta:
            first_essential += 1
        big = np.iinfo(np.int64).max
        while first_essential < m:
            # the next candidate: the smallest current doc of the essential lists
            cand = big
            for i in range(first_essential, m):
                if pos[i] < end[i]:
                    d = indices[pos[i]]
                    if d < cand:
                        cand = d
            if cand == big:
                break
            s = 0.0
            for i in range(first_essential, m):
                p = pos[i]
                if p < end[i] and indices[p] == cand:
                    s += np.float64(data[p] * c[i])
                    pos[i] = p + 1
            skip = False
            for i in range(n_skip):
                p = _advance(indices, sk_pos[i], sk_end[i], cand)
                sk_pos[i] = p
                if p < sk_end[i] and indices[p] == cand:
                    skip = True
            if skip:
                continue
            full = n_heap == k
            dropped = False
            if full and first_essential > 0:
                # tighten the non-essential bounds with the blocks holding cand
                if np.float32(s + cum[first_essential - 1]) < theta:
                    dropped = True
                else:
                    bound = 0.0
                    for i in range(first_essential):
                        p = _advance(indices, pos[i], end[i], cand)
                        pos[i] = p
                        if p < end[i]:
                            j = block_ptr[t[i]] + (p - indptr[t[i]]) // BLOCK
                            # the block holding the first doc >= cand bounds cand's score
                            bound += np.float64(block_max[j] * c[i])
                    if np.float32(s + bound) < theta:
                        dropped = True
            if not dropped:
                # add the non-essential terms, largest bound first, dropping as soon as the
                # remaining bounds cannot reach theta
                for i in range(first_essential - 1, -1, -1):
                    if full and np.float32(s + cum[i]) < theta:
                        dropped = True
                        break
                    p = _advance(indices, pos[i], end[i], cand)
                    pos[i] = p
                    if p < end[i] and indices[p] == cand:
                        s += np.float64(data[p] * c[i])
            if dropped:
                continue
            score = np.float32(s)
            rank = np.int64(tie_rank[cand]) if use_rank else np.int64(cand)
            if not full:
                hs[n_heap] = score
                hr[n_heap] = rank
                hd[n_heap] = cand
                _sift_up(hs, hr, hd, n_heap)
                n_heap += 1
            elif _worse(hs[0], hr[0], score, rank):
                hs[0] = score
                hr[0] = rank
                hd[0] = cand
                _sift_down(hs, hr, hd, n_heap, 0)
            else:
                continue
            if n_heap == k:
                theta = hs[0]
                while first_essential < m and np.float32(cum[first_essential]) < theta:
                    first_essential += 1
        return n_heap

    @numba.njit(cache=True, nogil=True)
    def _search_one(
        data, indices, indptr, term_max, block_max, block_ptr, tie_rank, use_rank,
        terms, counts, k, budget, out_rows, out_scores, hs, hr, hd,
    ):  # fmt: skip
        m = len(terms)
        if m == 0:
            return
        # sort the query's terms by upper bound, ascending
        ub = np.empty(m, dtype=np.float64)
        for i in range(m):
            ub[i] = np.float64(term_max[terms[i]] * counts[i])
        order = np.argsort(ub, kind="mergesort")
        t = np.empty(m, dtype=np.int64)
        c = np.empty(m, dtype=np.float32)
        cum = np.empty(m, dtype=np.float64)  # cum[i] = bounds of terms 0..i
        acc = 0.0
        for i in range(m):
            t[i] = terms[order[i]]
            c[i] = counts[order[i]]
            acc += ub[order[i]]
            cum[i] = acc
        # Phase 1: score every document of the highest-bound terms whose lists are short (at
        # least one term), which sets a high k-th score early. Phase 2: the other terms, leaving
        # out the documents phase 1 scored (all of their terms were counted there).
        first = m - 1
        postings = indptr[t[first] + 1] - indptr[t[first]]
        while first > 0 and postings + indptr[t[first - 1] + 1] - indptr[t[first - 1]] <= budget:
            first -= 1
            postings += indptr[t[first] + 1] - indptr[t[first]]
        n_heap = _daat(
            data, indices, indptr, block_max, block_ptr, tie_rank, use_rank,
            t, c, cum, m, first, t[:0], k, hs, hr, hd, 0,
        )  # fmt: skip
        if first > 0:
            n_heap = _daat(
                data, indices, indptr, block_max, block_ptr, tie_rank, use_rank,
                t, c, cum, first, 0, t[first:], k, hs, hr, hd, n_heap,
            )  # fmt: skip
        # best first: repeatedly take the worst off the heap, filling from the back
        n = n_heap
        while n > 0:
            out_rows[n - 1] = hd[0]
            out_scores[n - 1] = hs[0]
            n -= 1
            hs[0] = hs[n]
            hr[0] = hr[n]
            hd[0] = hd[n]
            _sift_down(hs, hr, hd, n, 0)

    @numba.njit(cache=True, nogil=True)
    def _search_batch(
        data, indices, indptr, term_max, block_max, block_ptr, tie_rank, use_rank,
        query_ptr, term_ids, k, budget, out_rows, out_scores,
    ):  # fmt: skip
        hs = np.empty(k, dtype=np.float32)
        hr = np.empty(k, dtype=np.int64)
        hd = np.empty(k, dtype=np.int64)
        for q in range(len(query_ptr) - 1):
            raw = term_ids[query_ptr[q] : query_ptr[q + 1]]
            # distinct known terms and their counts (the query's clause boosts)
            known = np.sort(raw[raw >= 0])
            n = 0
            for i in range(len(known)):
                if i == 0 or known[i] != known[i - 1]:
                    n += 1
            terms = np.empty(n, dtype=np.int64)
            counts = np.zeros(n, dtype=np.float32)
            j = -1
            for i in range(len(known)):
                if i == 0 or known[i] != known[i - 1]:
                    j += 1
                    terms[j] = known[i]
                counts[j] += 1.0
            _search_one(
                data, indices, indptr, term_max, block_max, block_ptr, tie_rank, use_rank,
                terms, counts, k, budget, out_rows[q], out_scores[q], hs, hr, hd,
            )  # fmt: skip


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
        self.data = np.asarray(data)
        self.indices = np.asarray(indices)
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.term_max, self.block_max, self.block_ptr = build_bounds(self.data, self.indptr)
        self.use_rank = tie_rank is not None
        self.tie_rank = np.asarray(tie_rank) if self.use_rank else np.zeros(1, dtype=np.int32)
        self.phase1_postings = max(PHASE1_POSTINGS, n_docs // 64)

    def search(
        self, query_ptr: np.ndarray, term_ids: np.ndarray, k: int
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
            _search_batch(
                self.data, self.indices, self.indptr, self.term_max, self.block_max,
                self.block_ptr, self.tie_rank, self.use_rank, query_ptr, term_ids, k,
                self.phase1_postings, rows, scores,
            )  # fmt: skip
        return rows, scores
