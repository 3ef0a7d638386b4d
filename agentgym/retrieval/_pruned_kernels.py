"""The numba kernels of :mod:`agentgym.retrieval.pruned` (imported, and compiled or loaded from
numba's on-disk cache, by :func:`agentgym.retrieval.pruned.warm_up`, off the searching thread).
Standalone: the block size of the block maxima comes in as the ``block`` argument."""

from __future__ import annotations

import numba
import numpy as np


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
    data, indices, indptr, block_max, block_ptr, block, tie_rank, use_rank,
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
                        j = block_ptr[t[i]] + (p - indptr[t[i]]) // block
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
    data, indices, indptr, term_max, block_max, block_ptr, block, tie_rank, use_rank,
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
        data, indices, indptr, block_max, block_ptr, block, tie_rank, use_rank,
        t, c, cum, m, first, t[:0], k, hs, hr, hd, 0,
    )  # fmt: skip
    if first > 0:
        n_heap = _daat(
            data, indices, indptr, block_max, block_ptr, block, tie_rank, use_rank,
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
    data, indices, indptr, term_max, block_max, block_ptr, block, tie_rank, use_rank,
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
            data, indices, indptr, term_max, block_max, block_ptr, block, tie_rank, use_rank,
            terms, counts, k, budget, out_rows[q], out_scores[q], hs, hr, hd,
        )  # fmt: skip
