"""The compiled block-max MaxScore search returns exactly what scoring every posting returns.

Same rows, bit-equal float32 scores, ties in Anserini's order, at several k, on a tie-heavy corpus
(many bit-equal scores, ties across the cut), on varied generated passages (long and short
posting lists, repeated query terms) and on the hand-written corpus of test_sparse.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_sparse import CORPUS, QUERIES, generated_passages
from test_ties import tie_heavy_corpus

from agentgym.retrieval import pruned
from agentgym.retrieval.sparse import BM25Index

pytestmark = pytest.mark.skipif(not pruned.available(), reason="numba is not installed")


@pytest.fixture(autouse=True, scope="module")
def _compiled():
    assert pruned.warm_up(block=True)  # else searches would quietly take the numpy path


def _corpora():
    texts, ids, queries = tie_heavy_corpus(800)
    yield "tie-heavy", texts, ids, queries
    passages, queries = generated_passages(3000)
    ids = [f"doc{(i * 7919) % 3000}" for i in range(len(passages))]
    yield "generated", passages, ids, queries
    yield "hand-written", CORPUS, None, [*QUERIES, "fox fox fox dog", "", "the of"]


@pytest.fixture(scope="module", params=list(_corpora()), ids=lambda c: c[0])
def corpus(request):
    _, texts, ids, queries = request.param
    return BM25Index.build(texts, ids=ids), queries


@pytest.mark.parametrize("k", [1, 3, 10, 50])
def test_pruned_equals_exhaustive(corpus, k):
    index, queries = corpus
    index.pruning = False
    rows_x, scores_x = index.search(queries, k)
    index.pruning = True
    rows_p, scores_p = index.search(queries, k)
    np.testing.assert_array_equal(rows_p, rows_x)
    np.testing.assert_array_equal(scores_p, scores_x)  # bit for bit, padding included
    assert (rows_p >= 0).any()


def test_one_query_at_a_time_equals_the_batch(corpus):
    index, queries = corpus
    batch = index.search(queries[:40], 5)
    for i, q in enumerate(queries[:40]):
        rows, scores = index.search([q], 5)
        np.testing.assert_array_equal(rows[0], batch[0][i])
        np.testing.assert_array_equal(scores[0], batch[1][i])


def test_bounds_are_the_list_and_block_maxima():
    passages, _ = generated_passages(500)
    index = BM25Index.build(passages)
    s = index._bm25.scores
    data, indptr = np.asarray(s["data"]), np.asarray(s["indptr"])
    term_max, block_max, block_ptr = pruned.build_bounds(data, indptr)
    for t in range(0, len(indptr) - 1, 7):
        col = data[indptr[t] : indptr[t + 1]]
        assert term_max[t] == (col.max() if len(col) else 0)
        blocks = [col[j : j + pruned.BLOCK].max() for j in range(0, len(col), pruned.BLOCK)]
        np.testing.assert_array_equal(block_max[block_ptr[t] : block_ptr[t + 1]], blocks)


def test_pruned_search_of_an_empty_index_and_batch():
    index = BM25Index.build([])
    rows, scores = index.search(["anything"], 3)
    assert (rows == -1).all() and np.isneginf(scores).all()
    index = BM25Index.build(["apple"])
    assert index.search([], 3)[0].shape == (0, 3)


def test_one_compiled_signature_serves_every_index(tmp_path):
    """In-memory and memory-mapped indexes, with and without ids, all run the signature compiled
    in the background: no search compiles on the searching thread."""
    from agentgym.retrieval import _pruned_kernels

    texts = ["apple pie", "apple tart", "pear"]
    BM25Index.build(texts, ids=["b", "a", "c"], path=tmp_path / "ids")
    BM25Index.build(texts, path=tmp_path / "rows")
    indexes = [BM25Index.build(texts), BM25Index.build(texts, ids=["b", "a", "c"])]
    indexes += [
        BM25Index.load(tmp_path / name, mmap=m) for name in ("ids", "rows") for m in (False, True)
    ]
    for index in indexes:
        assert index.search(["apple"], 2)[0].tolist()[0][1] in (0, 1)
    assert len(_pruned_kernels._search_batch.signatures) == 1
