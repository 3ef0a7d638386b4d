"""Dense indexes: FAISS Flat / HNSW / IVF-PQ, the exact torch search, save/load, the retriever."""

from __future__ import annotations

import os

import numpy as np
import pytest

from agentgym.retrieval.base import Retriever
from agentgym.retrieval.dense import DenseIndex, DenseRetriever, faiss_has_gpu
from agentgym.retrieval.encoder import Encoder


def _unit(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return _unit(3000, 32, seed=0)


@pytest.fixture(scope="module")
def queries(vectors) -> np.ndarray:
    # near-duplicates of known rows plus unrelated queries
    near = vectors[[5, 700, 2999]] + 0.05 * _unit(3, 32, seed=1)
    return np.concatenate([near, _unit(37, 32, seed=2)]).astype(np.float32)


def _exact(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = queries @ vectors.T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return rows, np.take_along_axis(scores, rows, 1)


def test_flat_is_exact(vectors, queries):
    index = DenseIndex.build(vectors, "flat")
    assert index.search_path == "faiss-cpu" and len(index) == 3000 and index.dim == 32
    rows, scores = index.search(queries, 10)
    want_rows, want_scores = _exact(vectors, queries, 10)
    assert rows.dtype == np.int64 and scores.dtype == np.float32 and rows.shape == (40, 10)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    assert rows[:3, 0].tolist() == [5, 700, 2999]


@pytest.mark.parametrize("chunk_elements", [1 << 26, 40 * 1100])  # one chunk; several chunks
def test_torch_cpu_equals_faiss_flat(vectors, queries, chunk_elements):
    faiss_rows, faiss_scores = DenseIndex.build(vectors, "flat").search(queries, 7)
    torch_index = DenseIndex.build(
        vectors, "flat", search_path="torch-cpu", chunk_elements=chunk_elements
    )
    assert torch_index.search_path == "torch-cpu"
    rows, scores = torch_index.search(queries, 7)
    np.testing.assert_array_equal(rows, faiss_rows)
    np.testing.assert_allclose(scores, faiss_scores, atol=1e-5)


@pytest.mark.parametrize("path", ["faiss-cpu", "torch-cpu"])
def test_k_larger_than_index_pads(path):
    index = DenseIndex.build(_unit(4, 8, seed=3), "flat", search_path=path)
    rows, scores = index.search(_unit(2, 8, seed=4), 6)
    assert (rows[:, 4:] == -1).all() and np.isneginf(scores[:, 4:]).all()
    assert sorted(rows[0, :4].tolist()) == [0, 1, 2, 3]
    assert (np.diff(scores[:, :4], axis=1) <= 0).all()


def _recall(rows: np.ndarray, truth: np.ndarray) -> float:
    return np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(rows, truth, strict=True)])


def test_hnsw_high_recall(vectors, queries):
    index = DenseIndex.build(vectors, "hnsw")
    assert index.search_path == "faiss-cpu"
    rows, _ = index.search(queries, 10)
    assert _recall(rows, _exact(vectors, queries, 10)[0]) > 0.9
    assert rows[:3, 0].tolist() == [5, 700, 2999]


def test_ivfpq_recall_and_compression(vectors, queries, tmp_path):
    index = DenseIndex.build(vectors, "ivfpq", nprobe=64)
    rows, _ = index.search(queries, 10)
    truth = _exact(vectors, queries, 10)[0]
    assert _recall(rows[:3, :1], truth[:3, :1]) == 1.0  # near-duplicates found
    # approximate (random 32-d vectors have no structure for PQ to exploit), yet far above the
    # 10/3000 of a random ranking
    assert _recall(rows, truth) > 0.15
    flat, pq = tmp_path / "flat.index", tmp_path / "pq.index"
    DenseIndex.build(vectors, "flat").save(flat)
    index.save(pq)
    assert os.path.getsize(pq) < os.path.getsize(flat) / 2


def test_torch_needs_flat(vectors):
    with pytest.raises(ValueError, match="flat"):
        DenseIndex.build(vectors[:500], "hnsw", search_path="torch-cpu")


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
@pytest.mark.parametrize("mmap", [False, True])
def test_save_load_roundtrip(vectors, queries, tmp_path, kind, mmap):
    index = DenseIndex.build(vectors, kind)
    path = tmp_path / f"{kind}.index"
    index.save(path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind
    loaded = DenseIndex.load(path, mmap=mmap)
    assert loaded.kind == kind and len(loaded) == len(index)
    a, b = index.search(queries, 5), loaded.search(queries, 5)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_allclose(a[1], b[1], atol=1e-6)


def test_mmap_load_feeds_torch_path(vectors, queries, tmp_path):
    path = tmp_path / "flat.index"
    DenseIndex.build(vectors, "flat").save(path)
    index = DenseIndex.load(path, mmap=True, search_path="torch-cpu")
    np.testing.assert_array_equal(index.search(queries, 5)[0], _exact(vectors, queries, 5)[0])


def test_bad_inputs(vectors, tmp_path):
    index = DenseIndex.build(vectors[:100], "flat")
    with pytest.raises(ValueError, match=r"\(n, 32\)"):
        index.search(np.zeros((2, 31), dtype=np.float32), 3)
    with pytest.raises(ValueError, match="k must be"):
        index.search(vectors[:1], 0)
    with pytest.raises(ValueError, match="unknown search_path"):
        DenseIndex.build(vectors[:10], "flat", search_path="tpu")
    with pytest.raises(ValueError, match="unknown dense index kind"):
        DenseIndex.build(vectors[:10], "lsh")
    with pytest.raises(FileNotFoundError, match="agentgym retrieval index"):
        DenseIndex.load(tmp_path / "none.index")


@pytest.mark.skipif(faiss_has_gpu(), reason="this faiss has GPU support")
def test_faiss_gpu_refused_without_gpu_build(vectors):
    with pytest.raises(RuntimeError, match="torch-cuda"):
        DenseIndex.build(vectors[:10], "flat", search_path="faiss-gpu")


@pytest.mark.gpu
def test_gpu_paths_equal_cpu(vectors, queries):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    want_rows, want_scores = DenseIndex.build(vectors, "flat").search(queries, 10)
    index = DenseIndex.build(vectors, "flat", device="cuda")
    assert index.search_path == ("faiss-gpu" if faiss_has_gpu() else "torch-cuda")
    for path in ["torch-cuda"] + (["faiss-gpu"] if faiss_has_gpu() else []):
        rows, scores = DenseIndex.build(vectors, "flat", search_path=path).search(queries, 10)
        # fp16 vectors: scores within fp16 error, the top hit of the near-duplicates unchanged
        np.testing.assert_allclose(scores, want_scores, atol=5e-3)
        assert rows[:3, 0].tolist() == want_rows[:3, 0].tolist()
        assert _recall(rows, want_rows) > 0.95


# ------------------------------------------------------------------------------------------------
# DenseRetriever


@pytest.fixture(scope="module")
def passages() -> list[dict]:
    from agentgym.retrieval.synthetic import synthetic_corpus

    return list(synthetic_corpus(300, seed=5))


def test_dense_retriever_contract(tiny_encoder_dir, passages):
    encoder = Encoder(tiny_encoder_dir, device="cpu")
    index = DenseIndex.build(encoder.encode_passages([p["contents"] for p in passages]), "flat")
    retriever = DenseRetriever(index, encoder, passages)
    assert isinstance(retriever, Retriever)
    # a passage's own text as the query: with no prefixes the vectors are identical -> rank 1
    queries = [passages[i]["contents"] for i in (3, 150, 299)]
    hits = retriever.search(queries, topk=4)
    assert [h[0].doc_id for h in hits] == ["3", "150", "299"]
    assert all(len(h) == 4 for h in hits)
    assert hits[0][0].document == passages[3]
    assert all(a.score >= b.score for h in hits for a, b in zip(h, h[1:], strict=False))
    assert retriever.search([], topk=3) == []
    assert [len(h) for h in retriever.search(["x"], topk=1000)] == [300]


def test_dense_retriever_checks_alignment(tiny_encoder_dir, passages):
    encoder = Encoder(tiny_encoder_dir, device="cpu")
    index = DenseIndex.build(_unit(10, encoder.dim, 0), "flat")
    with pytest.raises(ValueError, match="same order"):
        DenseRetriever(index, encoder, passages)
    with pytest.raises(ValueError, match="encoder the index was built with"):
        DenseRetriever(DenseIndex.build(_unit(300, 8, 0), "flat"), encoder, passages)
