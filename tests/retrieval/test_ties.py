"""Equal BM25 scores come in Anserini's order: score descending, then the document id as a string.

The reference is stock Anserini itself: a Lucene index of ``{"id": <the real id>, "contents": ...}``
(how Search-R1 and WebShop index their documents) searched by ``SimpleSearcher``, whose sort is
``(score, id as STRING_VAL)``. Every backend (bm25s, pyserini) and every user (SearchQA passages,
WebShop result pages, the built index a retrieval server opens) must list tied documents the same
way, including ties that straddle the top-k cut.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from agentgym.retrieval.sparse import BM25Index, BM25Retriever, id_rank

BACKENDS = ["bm25s", "pyserini"]

# ids whose string order is not their row order: "10" < "100" < "2" < "9", upper case first
TIED_IDS = ["9", "10", "100", "2", "b", "B", "é", "a"]


@pytest.fixture(scope="module")
def jvm():
    from agentgym.retrieval.java import JavaUnavailableError, ensure_java

    pytest.importorskip("pyserini", reason="pyserini is not installed")
    try:
        return ensure_java()
    except JavaUnavailableError as err:
        pytest.skip(f"no Java 21+ JVM can start here: {err}")


def _build(texts, ids, backend, tmp_path, request):
    if backend == "pyserini":
        request.getfixturevalue("jvm")
        index = BM25Index.build(texts, backend=backend, path=tmp_path / "idx", ids=ids)
        request.addfinalizer(index.close)
        return index
    return BM25Index.build(texts, ids=ids)


def test_id_rank_is_code_point_order_stable_on_duplicates():
    ids = ["9", "10", "100", "2", "b", "B", "é", "a", "10"]
    rank = id_rank(ids)
    expected = sorted(range(len(ids)), key=lambda r: (ids[r], r))
    assert np.argsort(rank).tolist() == expected
    assert id_rank([]).shape == (0,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bit_equal_scores_come_in_id_string_order(backend, tmp_path, request):
    # identical texts score bit for bit alike; one more relevant document goes first
    texts = ["red apple pie"] * len(TIED_IDS) + ["red red apple apple pie"]
    ids = [*TIED_IDS, "zz"]
    index = _build(texts, ids, backend, tmp_path, request)
    assert index.ties_by_id
    rows, scores = index.search(["apple pie"], len(texts))
    got = [ids[r] for r in rows[0].tolist()]
    assert got == ["zz", *sorted(TIED_IDS)]  # ["zz", "10", "100", "2", "9", "B", "a", "b", "é"]
    if backend == "bm25s":
        assert len(set(scores[0, 1:].tolist())) == 1  # the ties are exact


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_tie_straddling_the_top_k_cut_keeps_the_smallest_ids(backend, k, tmp_path, request):
    # the tied group starts at position 1 and runs past k: the cut keeps the smallest ids,
    # whatever rows they sit in (the smallest, "10", is the last tied row)
    tied = ["9", "2", "100", "10"]
    texts = ["apple pie", *["apple tart"] * len(tied), "pear"]
    ids = ["0", *tied, "p"]
    index = _build(texts, ids, backend, tmp_path, request)
    rows, _ = index.search(["apple pie"], k)
    got = [ids[r] for r in rows[0].tolist() if r >= 0]
    assert got == ["0", *sorted(tied)][:k]


def test_index_without_ids_breaks_ties_by_row():
    index = BM25Index.build(["apple"] * 4)
    assert not index.ties_by_id
    assert index.search(["apple"], 4)[0][0].tolist() == [0, 1, 2, 3]


def test_ids_must_match_the_texts():
    with pytest.raises(ValueError, match="one id per text"):
        BM25Index.build(["a", "b"], ids=["1"])


def test_id_order_survives_save_and_load(tmp_path):
    texts = ["apple"] * len(TIED_IDS)
    BM25Index.build(texts, ids=TIED_IDS, path=tmp_path / "i")
    for mmap in (True, False):
        loaded = BM25Index.load(tmp_path / "i", mmap=mmap)
        assert loaded.ties_by_id
        got = [TIED_IDS[r] for r in loaded.search(["apple"], 3)[0][0].tolist()]
        assert got == sorted(TIED_IDS)[:3]


# ---------------------------------------------------------------------------------------------
# Against stock Anserini, on a tie-heavy corpus
# ---------------------------------------------------------------------------------------------


def tie_heavy_corpus(n: int, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """Short documents over 40 words (many exact duplicates and equal lengths, so many bit-equal
    scores), numeric-looking ids in shuffled order, and 200 queries of 1-3 words."""
    rng = random.Random(seed)
    words = [f"w{i}x" for i in range(40)]
    texts = [
        " ".join(rng.choices(words[: rng.randint(5, 40)], k=rng.randint(1, 4))) for _ in range(n)
    ]
    ids = [str(i) for i in rng.sample(range(10 * n), n)]
    queries = [" ".join(rng.sample(words, rng.randint(1, 3))) for _ in range(200)]
    return texts, ids, queries


class StockAnserini:
    """Anserini as the peers run it: their ids in Lucene's ``id`` field, ``SimpleSearcher``."""

    def __init__(self, path: Path, texts: list[str], ids: list[str]) -> None:
        from jnius import autoclass

        writer = autoclass("io.anserini.index.SimpleIndexer")(str(path), False, 1)
        for doc_id, text in zip(ids, texts, strict=True):
            writer.addRawDocument(json.dumps({"id": doc_id, "contents": text}))
        writer.close()
        self.searcher = autoclass("io.anserini.search.SimpleSearcher")(str(path))
        self.searcher.set_bm25(0.9, 0.4)

    def search(self, query: str, k: int) -> list[str]:
        return [h.docid for h in self.searcher.search(query, k)]

    def close(self) -> None:
        self.searcher.close()


@pytest.fixture(scope="module")
def tie_heavy(tmp_path_factory, jvm):
    texts, ids, queries = tie_heavy_corpus(800)
    stock = StockAnserini(tmp_path_factory.mktemp("stock") / "index", texts, ids)
    yield texts, ids, queries, stock
    stock.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_top_k_as_stock_anserini_on_a_tie_heavy_corpus(tie_heavy, backend, tmp_path):
    texts, ids, queries, stock = tie_heavy
    if backend == "pyserini":
        index = BM25Index.build(texts, backend=backend, path=tmp_path / "idx", ids=ids)
    else:
        index = BM25Index.build(texts, ids=ids)
    straddling = 0
    for k in (1, 3, 10, 50):
        rows, scores = index.search(queries, k + 1)
        # ties at the cut: the k-th and (k+1)-th scores are equal (so the cut picks by id)
        straddling += int(((scores[:, k - 1] == scores[:, k]) & (rows[:, k] >= 0)).sum())
        rows, _ = index.search(queries, k)
        for q, row in zip(queries, rows.tolist(), strict=True):
            assert [ids[r] for r in row if r >= 0] == stock.search(q, k), (q, k)
    if backend == "bm25s":
        assert straddling > 100  # the corpus does exercise ties at the cut
    index.close()


def test_searchqa_retriever_and_built_index_order_ties_like_stock(tie_heavy, tmp_path):
    """SearchQA's retriever (``from_documents``) and the folder a retrieval server opens
    (``agentgym retrieval index``) both hand back stock's top 3."""
    from agentgym.retrieval import open_retriever
    from agentgym.retrieval.build import build_index

    texts, ids, queries, stock = tie_heavy
    docs = [{"id": i, "contents": t} for i, t in zip(ids, texts, strict=True)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    build_index(corpus, tmp_path / "built", "bm25", show_progress=False)
    expected = [stock.search(q, 3) for q in queries]
    for retriever in (BM25Retriever.from_documents(docs), open_retriever(tmp_path / "built")):
        got = [[h.doc_id for h in hits] for hits in retriever.search(queries, 3)]
        assert got == expected
        retriever.close()


# ---------------------------------------------------------------------------------------------
# WebShop's result pages
# ---------------------------------------------------------------------------------------------


def test_webshop_tied_products_come_in_asin_order():
    from agentgym.envs.webshop import load_catalogue
    from agentgym.envs.webshop.search import SEARCH_RETURN_N, ProductSearch

    cat = load_catalogue(synthetic=True, num_products=300)
    search = ProductSearch(cat, "bm25s", persist=False)
    asins = [p["asin"] for p in cat.products]
    queries = sorted({g["query"] for g in cat.goals})[:60]
    ties = 0
    for q, rows in zip(queries, search.search_many(queries), strict=True):
        found, scores = search.index.search([q], SEARCH_RETURN_N)
        n = int((found[0] >= 0).sum())
        key = [(-float(s), asins[r]) for r, s in zip(found[0, :n], scores[0, :n], strict=True)]
        assert key == sorted(key) and rows.tolist() == found[0, :n].tolist()
        ties += len(key) - len({s for s, _ in key})
    assert ties > 0


@pytest.mark.slow
def test_webshop_pages_match_stock_lucene_over_asins(jvm, webshop_real_data, tmp_path):
    """Stock WebShop's index (asins as ids) and ours give the same top 50, ties included."""
    from agentgym.envs.webshop import load_catalogue
    from agentgym.envs.webshop.search import SEARCH_RETURN_N, ProductSearch

    cat = load_catalogue(webshop_real_data)
    asins = [p["asin"] for p in cat.products]
    stock = StockAnserini(tmp_path / "stock", cat.search_texts, asins)
    queries = sorted({g["instruction_text"].lower() for g in cat.goals})[:150]
    queries += sorted({g["query"] for g in cat.goals})[:150]
    expected = [stock.search(q, SEARCH_RETURN_N) for q in queries]
    stock.close()
    for backend in BACKENDS:
        search = ProductSearch(cat, backend, cache_dir=tmp_path / backend, persist=True)
        got = [[asins[r] for r in rows.tolist()] for rows in search.search_many(queries)]
        assert got == expected, backend
        search.index.close()
