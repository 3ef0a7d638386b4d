"""Retrieval-core speed: encoding, index building per kind, exact search on torch vs FAISS.

All corpora are generated (``agentgym.retrieval.synthetic``); encoders are random-weight BERTs
built offline, plus the real pretrained all-MiniLM-L6-v2 from ../shared/data when present.
Every figure is the median over ``--repeats`` runs, and each comes with the peer it is compared
with, measured in the same run:

* encoding: passages/s of the tiny random encoder and of MiniLM (when present);
* ``build_index`` (resumable: doc-store shards, embedding shards, atomic writes, meta.json) vs
  the in-memory build Search-R1's scripts do (encode everything, then one FAISS ``add``; for
  BM25, ``BM25Index.build`` on the texts in memory): documents/s and the overhead ratio;
* FAISS index build rate per kind (flat / hnsw / ivfpq) over the same vectors, vs flat;
* exact search latency: the torch path on the CPU vs FAISS ``IndexFlatIP``, per query batch;
* recall@k of MiniLM dense retrieval beside BM25 on generated questions (when MiniLM is present).

``--gpu``: an E5-base-shaped random encoder (BERT-base: 768-d, 12 layers) encoding on CUDA in
fp16 vs on the CPU, and exact search over a synthetic 1M x 768 index on torch-cuda (and
FAISS-GPU when the installed faiss has it) vs FAISS on the CPU. Skips cleanly without CUDA.

    python benchmarks/bench_retrieval_build.py [--docs 5000] [--repeats 3] [--threads 2]
    python benchmarks/bench_retrieval_build.py --gpu [--gpu-vectors 1000000]

Writes ``benchmarks/results/retrieval_build.json`` (``retrieval_build_gpu.json`` with --gpu).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.io import atomic_write_text
from agentgym.retrieval.build import build_index
from agentgym.retrieval.dense import DenseIndex
from agentgym.retrieval.encoder import Encoder
from agentgym.retrieval.synthetic import (
    random_encoder,
    synthetic_corpus,
    synthetic_queries,
    write_corpus,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MINILM = (
    Path(os.environ.get("AGENTGYM_SHARED_DATA", ROOT / ".." / "shared" / "data"))
    / "encoders"
    / "all-MiniLM-L6-v2"
)


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 0) -> tuple[float, list[float], Any]:
    """(median seconds, all runs, last result) of ``fn`` over ``repeats`` runs."""
    out = None
    for _ in range(warmup):
        out = fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), runs, out


def unit_vectors(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


# ----------------------------------------------------------------------------------------------
def bench_encoding(encoder: Encoder, texts: list[str], repeats: int) -> dict[str, Any]:
    median, runs, _ = timed(lambda: encoder.encode_passages(texts), repeats, warmup=1)
    return {
        "passages": len(texts),
        "batch_size": encoder.batch_size,
        "device": encoder.device,
        "median_s": median,
        "runs_s": runs,
        "passages_per_s": len(texts) / median,
    }


def bench_build(corpus: Path, encoder_dir: Path, work: Path, repeats: int) -> dict[str, Any]:
    """build_index (resumable, on disk) vs the in-memory build, for flat (tiny encoder) and bm25."""
    from agentgym.retrieval.corpus import iter_corpus
    from agentgym.retrieval.sparse import BM25Index

    records = list(iter_corpus(corpus))
    n = len(records)
    encoder = Encoder(encoder_dir, device="cpu", batch_size=128)
    result: dict[str, Any] = {}

    def resumable(kind: str) -> None:
        out = work / f"idx-{kind}"
        shutil.rmtree(out, ignore_errors=True)
        build_index(
            corpus, out, kind, encoder=encoder, shard_size=max(n // 8, 1), show_progress=False
        )

    def in_memory_flat() -> None:
        vectors = encoder.encode_passages([r["contents"] for r in records])
        DenseIndex.build(vectors, "flat")

    def in_memory_bm25() -> None:
        BM25Index.build([r["contents"] for r in records], backend="bm25s")

    for kind, peer in (("flat", in_memory_flat), ("bm25", in_memory_bm25)):
        ours, ours_runs, _ = timed(lambda kind=kind: resumable(kind), repeats)
        base, base_runs, _ = timed(peer, repeats)
        result[kind] = {
            "build_index_median_s": ours,
            "build_index_runs_s": ours_runs,
            "build_index_docs_per_s": n / ours,
            "in_memory_median_s": base,
            "in_memory_runs_s": base_runs,
            "in_memory_docs_per_s": n / base,
            "overhead_ratio": ours / base,
        }
    return result


def bench_index_kinds(vectors: np.ndarray, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("flat", "hnsw", "ivfpq"):
        median, runs, index = timed(lambda kind=kind: DenseIndex.build(vectors, kind), repeats)
        out[kind] = {"median_s": median, "runs_s": runs, "vectors_per_s": len(vectors) / median}
    for kind in out:
        out[kind]["time_vs_flat"] = out[kind]["median_s"] / out["flat"]["median_s"]
    return out


def bench_exact_search(
    vectors: np.ndarray, batches: list[int], k: int, repeats: int, paths: list[str]
) -> dict[str, Any]:
    """Median latency per query batch on each search path; ratios against faiss-cpu."""
    indexes = {p: DenseIndex.build(vectors, "flat", search_path=p) for p in paths}
    out: dict[str, Any] = {"vectors": len(vectors), "dim": vectors.shape[1], "k": k}
    for batch in batches:
        queries = unit_vectors(batch, vectors.shape[1], seed=batch)
        row: dict[str, Any] = {}
        reference = None
        for path, index in indexes.items():
            median, runs, (rows, _) = timed(
                lambda i=index, q=queries: i.search(q, k), repeats, warmup=1
            )
            if reference is None:
                reference = rows
            row[path] = {
                "median_ms": median * 1e3,
                "runs_ms": [r * 1e3 for r in runs],
                "queries_per_s": batch / median,
                # fp16 on GPU may reorder near-ties; on CPU the paths must agree exactly
                "top1_agreement_with_first": float(np.mean(rows[:, 0] == reference[:, 0])),
            }
        base = row["faiss-cpu"]["median_ms"]
        for path in row:
            row[path]["time_vs_faiss_cpu"] = row[path]["median_ms"] / base
        out[f"batch_{batch}"] = row
    return out


def bench_recall(corpus: Path, work: Path, num_docs: int, queries: int) -> dict[str, Any]:
    from agentgym.retrieval import open_retriever

    qs = synthetic_queries(num_docs, queries, seed=0)
    out: dict[str, Any] = {"queries": len(qs)}
    start = time.perf_counter()
    build_index(corpus, work / "minilm", "flat", encoder=MINILM, device="cpu", show_progress=False)
    out["minilm_build_s"] = time.perf_counter() - start
    build_index(corpus, work / "bm25r", "bm25", show_progress=False)
    for name, path in (("minilm_flat", "minilm"), ("bm25", "bm25r")):
        retriever = open_retriever(work / path, device="cpu")
        hits = retriever.search([q["question"] for q in qs], topk=10)
        out[name] = {
            f"recall@{k}": float(
                np.mean(
                    [
                        q["doc_id"] in {h.doc_id for h in hs[:k]}
                        for q, hs in zip(qs, hits, strict=True)
                    ]
                )
            )
            for k in (1, 3, 10)
        }
    return out


# ----------------------------------------------------------------------------------------------
def run_cpu(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    corpus = write_corpus(work / "corpus.jsonl", args.docs, seed=0)
    texts = [r["contents"] for r in synthetic_corpus(args.docs, seed=0)]
    tiny = random_encoder(work / "tiny", texts[:2000], hidden=64, layers=2)
    result: dict[str, Any] = {}

    print(f"encoding {args.docs} passages (tiny random encoder)...", flush=True)
    result["encoding"] = {
        "tiny_random_bert_64d_2l": bench_encoding(Encoder(tiny, device="cpu"), texts, args.repeats)
    }
    if (MINILM / "config.json").is_file():
        subset = texts[: args.minilm_docs]
        print(f"encoding {len(subset)} passages (MiniLM)...", flush=True)
        result["encoding"]["all_minilm_l6_v2"] = bench_encoding(
            Encoder(MINILM, device="cpu"), subset, args.repeats
        )
        tiny_rate = result["encoding"]["tiny_random_bert_64d_2l"]["passages_per_s"]
        result["encoding"]["all_minilm_l6_v2"]["rate_vs_tiny"] = (
            result["encoding"]["all_minilm_l6_v2"]["passages_per_s"] / tiny_rate
        )

    print("build_index vs in-memory build...", flush=True)
    result["build"] = bench_build(corpus, tiny, work, args.repeats)

    print(f"FAISS index build per kind ({args.index_vectors} x {args.dim})...", flush=True)
    vectors = unit_vectors(args.index_vectors, args.dim, seed=1)
    result["index_kinds"] = bench_index_kinds(vectors, args.repeats)

    print(f"exact search ({args.search_vectors} x {args.dim})...", flush=True)
    result["exact_search"] = bench_exact_search(
        unit_vectors(args.search_vectors, args.dim, seed=2),
        [1, 32, 256],
        k=10,
        repeats=max(args.repeats, 5),
        paths=["faiss-cpu", "torch-cpu"],
    )

    if (MINILM / "config.json").is_file():
        n = args.recall_docs
        print(f"recall: MiniLM vs BM25 on {n} generated passages...", flush=True)
        small = write_corpus(work / "recall.jsonl", n, seed=0)
        result["recall"] = bench_recall(small, work, n, args.recall_queries)
    else:
        result["recall"] = {"skipped": f"{MINILM} absent"}
    return result


def run_gpu(args: argparse.Namespace, work: Path) -> dict[str, Any] | None:
    import torch

    from agentgym.retrieval.dense import faiss_has_gpu

    if not torch.cuda.is_available():
        return None
    texts = [r["contents"] for r in synthetic_corpus(args.gpu_docs, seed=0)]
    e5_shape = random_encoder(
        work / "e5-base-shape", texts[:5000], hidden=768, layers=12, heads=12, vocab_size=30522
    )
    gpu_enc = Encoder(e5_shape, device="cuda", batch_size=512)
    cpu_enc = Encoder(e5_shape, device="cpu", batch_size=64)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "faiss_gpu": faiss_has_gpu()}
    print("encoding on GPU (fp16) vs CPU...", flush=True)
    result["encoding"] = {
        "cuda_fp16": bench_encoding(gpu_enc, texts, args.repeats),
        "cpu_fp32": bench_encoding(cpu_enc, texts[: args.cpu_docs], args.repeats),
    }
    result["encoding"]["cuda_fp16"]["speedup_vs_cpu"] = (
        result["encoding"]["cuda_fp16"]["passages_per_s"]
        / result["encoding"]["cpu_fp32"]["passages_per_s"]
    )
    print(f"exact search over {args.gpu_vectors} x 768...", flush=True)
    paths = ["faiss-cpu", "torch-cuda"] + (["faiss-gpu"] if faiss_has_gpu() else [])
    result["exact_search"] = bench_exact_search(
        unit_vectors(args.gpu_vectors, 768, seed=3),
        [1, 64, 512],
        k=10,
        repeats=args.repeats,
        paths=paths,
    )
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=5000, help="generated passages to encode/index")
    p.add_argument("--minilm-docs", type=int, default=1000)
    p.add_argument("--index-vectors", type=int, default=50_000)
    p.add_argument("--search-vectors", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--recall-docs", type=int, default=2000)
    p.add_argument("--recall-queries", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch / FAISS threads")
    p.add_argument("--gpu", action="store_true", help="the GPU benchmark instead")
    p.add_argument("--gpu-docs", type=int, default=20_000)
    p.add_argument("--cpu-docs", type=int, default=500, help="--gpu: passages for the CPU side")
    p.add_argument("--gpu-vectors", type=int, default=1_000_000)
    args = p.parse_args()

    import faiss
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="agentgym-bench-retrieval-"))
    try:
        result = run_gpu(args, work) if args.gpu else run_cpu(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if result is None:
        print("no CUDA device: the --gpu benchmark is skipped")
        return
    payload = {
        "benchmark": "retrieval_build_gpu" if args.gpu else "retrieval_build",
        "command": "python benchmarks/bench_retrieval_build.py " + " ".join(sys.argv[1:]),
        "statistic": f"median over {args.repeats} runs (exact search: at least 5)",
        "cpus": os.cpu_count(),
        "threads": {"torch": torch.get_num_threads(), "faiss": faiss.omp_get_max_threads()},
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "faiss": faiss.__version__,
        },
        **result,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / ("retrieval_build_gpu.json" if args.gpu else "retrieval_build.json")
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")
    print(json.dumps({k: v for k, v in payload.items() if k not in ("machine",)}, indent=1)[:4000])
    print(f"-> {path}")


if __name__ == "__main__":
    main()
