"""The index builder: every kind end to end, refusal to overwrite, and real resumption after
a SIGKILL (a subprocess killed mid-build, rerun, compared with an uninterrupted build)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import pytest

from agentgym.retrieval import open_retriever
from agentgym.retrieval.build import (
    BuildMismatchError,
    IndexExistsError,
    build_index,
    read_meta,
)
from agentgym.retrieval.corpus import DocStore, DocStoreWriter, iter_corpus
from agentgym.retrieval.dense import DenseIndex, DenseRetriever
from agentgym.retrieval.encoder import Encoder
from agentgym.retrieval.sparse import BM25Retriever
from agentgym.retrieval.synthetic import synthetic_queries, write_corpus

ROOT = Path(__file__).resolve().parents[2]
N_DOCS = 600


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("c") / "corpus.jsonl", N_DOCS, seed=11)


def _recall_at(retriever, queries: list[dict], k: int) -> float:
    hits = retriever.search([q["question"] for q in queries], topk=k)
    return float(
        np.mean(
            [q["doc_id"] in {h.doc_id for h in hs} for q, hs in zip(queries, hits, strict=True)]
        )
    )


def test_bm25_index_end_to_end(small_corpus, tmp_path):
    out = tmp_path / "bm25"
    meta = build_index(small_corpus, out, "bm25", shard_size=128, show_progress=False)
    assert (meta.kind, meta.backend, meta.num_docs, meta.dim) == ("bm25", "bm25s", N_DOCS, None)
    assert read_meta(out) == meta and json.loads((out / "meta.json").read_text())["version"] == 1
    store = DocStore(out / "docs")
    assert list(store) == list(iter_corpus(small_corpus))
    retriever = open_retriever(out)
    assert isinstance(retriever, BM25Retriever)
    queries = synthetic_queries(N_DOCS, 60, seed=11)
    assert _recall_at(retriever, queries, 3) >= 0.95  # entity names are rare terms


def test_bm25_pyserini_backend_matches_bm25s(small_corpus, tmp_path):
    # the Lucene backend through the same builder: same documents, same top hits
    pytest.importorskip("pyserini")
    build_index(small_corpus, tmp_path / "lucene", "bm25", backend="pyserini", show_progress=False)
    build_index(small_corpus, tmp_path / "bm25s", "bm25", show_progress=False)
    assert read_meta(tmp_path / "lucene").backend == "pyserini"
    questions = [q["question"] for q in synthetic_queries(N_DOCS, 20, seed=11)]
    lucene = open_retriever(tmp_path / "lucene").search(questions, 1)
    bm25s = open_retriever(tmp_path / "bm25s").search(questions, 1)
    assert [h[0].doc_id for h in lucene] == [h[0].doc_id for h in bm25s]
    assert lucene[0][0].document == bm25s[0][0].document


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
def test_dense_index_equals_in_memory_build(small_corpus, tmp_path, tiny_encoder_dir, kind):
    out = tmp_path / kind
    meta = build_index(
        small_corpus, out, kind, encoder=tiny_encoder_dir, shard_size=200, show_progress=False
    )
    assert (meta.kind, meta.num_docs, meta.dim) == (kind, N_DOCS, 64)
    assert meta.encoder == str(tiny_encoder_dir.resolve())
    assert not (out / "embeddings").exists()  # the FAISS index holds the vectors now
    retriever = open_retriever(out, device="cpu")
    assert isinstance(retriever, DenseRetriever) and retriever.index.kind == kind
    # the same search done by hand, in memory
    encoder = Encoder(tiny_encoder_dir, device="cpu")
    records = list(iter_corpus(small_corpus))
    vectors = encoder.encode_passages([r["contents"] for r in records])
    if kind == "flat":
        stored = faiss.rev_swig_ptr(retriever.index.cpu_index.get_xb(), N_DOCS * 64)
        np.testing.assert_allclose(stored.reshape(N_DOCS, 64), vectors, atol=1e-5)
    queries = [q["question"] for q in synthetic_queries(N_DOCS, 20, seed=11)]
    got = [[h.doc_id for h in hs] for hs in retriever.search(queries, topk=5)]
    want_index = DenseIndex.build(vectors, "flat")
    want = [
        [h.doc_id for h in hs]
        for hs in DenseRetriever(want_index, encoder, records).search(queries, 5)
    ]
    overlap = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(got, want, strict=True)])
    if kind == "flat":
        assert overlap == 1.0
    elif kind == "hnsw":  # a 600-node graph searched with efSearch 128 is all but exact
        assert overlap >= 0.9
    else:  # PQ codes of a random-weight encoder's (near-parallel) vectors: only well-formed hits
        assert all(len(set(ids)) == len(ids) == 5 for ids in got)
        assert os.path.getsize(out / "dense.index") < N_DOCS * 64 * 4 / 2


def test_refuses_to_overwrite_without_force(small_corpus, tmp_path):
    out = tmp_path / "idx"
    build_index(small_corpus, out, "bm25", show_progress=False)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(IndexExistsError, match="--force"):
        build_index(small_corpus, out, "bm25", show_progress=False)
    other = write_corpus(tmp_path / "other.jsonl", 50, seed=2)
    meta = build_index(other, out, "bm25", force=True, show_progress=False)
    assert meta.num_docs == 50 and len(DocStore(out / "docs")) == 50
    assert (out / "notes.txt").read_text() == "mine"  # --force removes only what a build writes


def test_unfinished_build_with_other_settings_is_refused(small_corpus, tmp_path):
    out = tmp_path / "idx"
    out.mkdir()
    (out / "build.json").write_text(json.dumps({"kind": "bm25", "shard_size": 7}))
    with pytest.raises(BuildMismatchError, match="shard_size: 7 -> 100"):
        build_index(small_corpus, out, "bm25", shard_size=100, show_progress=False)


def test_bad_arguments(small_corpus, tmp_path):
    with pytest.raises(ValueError, match="unknown index kind"):
        build_index(small_corpus, tmp_path / "x", "lsh")
    with pytest.raises(FileNotFoundError, match="JSONL"):
        build_index(tmp_path / "none.jsonl", tmp_path / "x", "bm25")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no records"):
        build_index(empty, tmp_path / "y", "bm25")
    with pytest.raises(FileNotFoundError, match="not a finished index"):
        open_retriever(tmp_path / "y")


def test_bm25_resumes_from_a_partial_doc_store(small_corpus, tmp_path, capfd):
    # the state a kill leaves: build.json, two finished doc shards, a stray temporary file
    out = tmp_path / "idx"
    build_index(small_corpus, tmp_path / "ref", "bm25", shard_size=100, show_progress=False)
    out.mkdir()
    (out / "build.json").write_text((tmp_path / "ref" / "build.json").read_text())
    records = list(iter_corpus(small_corpus))
    writer = DocStoreWriter(out / "docs")
    writer.write_shard(records[:100])
    writer.write_shard(records[100:200])
    (out / "docs" / ".docs-00002.jsonl.x.tmp").write_text("{half")
    before = (out / "docs" / "docs-00001.jsonl").stat()
    build_index(small_corpus, out, "bm25", shard_size=100, show_progress=False)
    assert "resuming at shard 2" in capfd.readouterr().err
    after = (out / "docs" / "docs-00001.jsonl").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert list(DocStore(out / "docs")) == records
    queries = [q["question"] for q in synthetic_queries(N_DOCS, 10, seed=11)]
    a, b = (
        open_retriever(out).search(queries, 5),
        open_retriever(tmp_path / "ref").search(queries, 5),
    )
    assert a == b and [h.score for hs in a for h in hs] == [h.score for hs in b for h in hs]


KILL_DOCS, KILL_SHARD = 300, 20


def _index_cmd(corpus: Path, out: Path, encoder: Path) -> list[str]:
    return [
        sys.executable, "-m", "agentgym.cli", "retrieval", "index", "--corpus", str(corpus),
        "--kind", "flat", "--encoder", str(encoder), "--out", str(out), "--shard-size", "20",
        "--batch-size", "5", "--device", "cpu", "--quiet",
    ]  # fmt: skip


def test_sigkilled_dense_build_resumes_and_equals_uninterrupted(tmp_path, tiny_encoder_dir, capfd):
    small_corpus = write_corpus(tmp_path / "corpus.jsonl", KILL_DOCS, seed=12)
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        _index_cmd(small_corpus, out, tiny_encoder_dir),
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    # kill once a few shards (doc store + embeddings) are finished, well before the end
    target = out / "embeddings" / "emb-00003.npy"
    deadline = time.monotonic() + 120
    while not target.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not (out / "meta.json").exists()
    done_docs = sorted(p.name for p in (out / "docs").glob("docs-*.offsets.npy"))
    done_emb = sorted(p.name for p in (out / "embeddings").glob("emb-*.npy"))
    assert 4 <= len(done_emb) < KILL_DOCS // KILL_SHARD and len(done_docs) >= 4
    kept = {
        p: (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in (out / "docs").glob("docs-0000[0-3].jsonl")
    }

    # the same command again (in-process here: the resuming code is the same)
    from agentgym.cli import main

    capfd.readouterr()
    assert main(_index_cmd(small_corpus, out, tiny_encoder_dir)[3:]) == 0
    first = min(len(done_docs), len(done_emb))
    err = capfd.readouterr().err
    done = first * KILL_SHARD
    assert f"resuming at shard {first} ({done} of {KILL_DOCS} documents done)" in err
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in kept} == kept  # not rewritten

    ref = tmp_path / "ref"
    build_index(
        small_corpus, ref, "flat", encoder=tiny_encoder_dir, shard_size=KILL_SHARD, batch_size=5,
        device="cpu", show_progress=False,
    )  # fmt: skip
    assert read_meta(out) == read_meta(ref)
    assert list(DocStore(out / "docs")) == list(DocStore(ref / "docs"))
    a = DenseIndex.load(out / "dense.index").cpu_index.reconstruct_n(0, KILL_DOCS)
    b = DenseIndex.load(ref / "dense.index").cpu_index.reconstruct_n(0, KILL_DOCS)
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.realdata
def test_pretrained_encoder_retrieves_beside_bm25(tmp_path, minilm_dir):
    # a real trained encoder (all-MiniLM-L6-v2) must retrieve the passage that answers each
    # generated question about as well as BM25 does; a random ranking would find 3/120
    n = 120
    corpus = write_corpus(tmp_path / "c.jsonl", n, seed=21)
    queries = synthetic_queries(n, 30, seed=21)
    build_index(corpus, tmp_path / "dense", "flat", encoder=minilm_dir, show_progress=False)
    build_index(corpus, tmp_path / "bm25", "bm25", show_progress=False)
    dense = open_retriever(tmp_path / "dense", device="cpu")
    assert dense.encoder.query_prefix == ""  # not an E5 model: no prefixes
    recall = {k: _recall_at(dense, queries, k) for k in (1, 3)}
    bm25 = _recall_at(open_retriever(tmp_path / "bm25"), queries, 3)
    assert recall[3] >= 0.9 and bm25 >= 0.9, (recall, bm25)
    assert recall[1] <= recall[3]
