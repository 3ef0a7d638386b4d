"""Dense retrieval side by side: ``agentgym retrieval serve`` over a flat FAISS index against
Search-R1's own ``retrieval_server.py`` in dense mode, the same encoder on both sides.

The peer is Search-R1's code, not a stand-in. Its ``search_r1/search/index_builder.py`` encodes
the corpus and writes its flat inner-product FAISS index with the flags of its
``build_index.sh`` (``--max_length 256 --batch_size 512 --pooling_method mean --faiss_type
Flat``; without ``--use_fp16``, which is for GPUs, and ``--save_embedding``, which only keeps a
copy); its ``retrieval_server.py`` serves it with its ``DenseRetriever`` (its own ``Encoder``:
transformers ``AutoModel``, mean pooling over the attention mask, L2 normalisation; FAISS
``index.search``; documents from a ``datasets`` table), configured as its ``__main__`` block
configures it (``Config(...)``, ``uvicorn.run(app)``) but on 127.0.0.1 and a free port, with
``retrieval_use_fp16=False`` (fp16 is for GPUs; both sides compute in float32) and
``faiss_gpu=False``. Both files are copied from the checkout into a temporary folder and run
there. Their code calls ``.cuda()`` unconditionally (``model.cuda()``, ``inputs.to('cuda')``,
``v.cuda()``); on a machine without CUDA a small shim, loaded before them, makes those calls
return the object unchanged, so the same code runs on the CPU. Nothing else of theirs changes.

Ours: ``agentgym retrieval index --kind flat --encoder DIR --device cpu`` (sentence-transformers,
mean pooling, normalised; FAISS ``IndexFlatIP``) and ``agentgym retrieval serve --threads 1``.

Encoder: all-MiniLM-L6-v2 from ``$AGENTGYM_SHARED_DATA/encoders`` on both sides (no query or
passage prefixes on either: Search-R1 adds them only for ``e5``/``bge`` names, we only for
``e5``; Search-R1's method name here is ``minilm``). Corpus: ``bench_searchqa.py``'s knowledge base
plus ``--corpus-size`` generated passages (small: both sides encode it on the CPU). Queries: the
scripted searcher's, as in ``bench_searchr1.py``. Every process runs one compute thread
(``OMP_NUM_THREADS=1``; ours also ``--threads 1``): on shared cores a multi-threaded encoder
stalls whenever one of its threads is descheduled.

The client is Search-R1's ``batch_search`` (``generation.py``): per turn ONE ``requests.post`` of
``{"queries": <B queries>, "topk": 3, "return_scores": true}`` (a new connection each time) and
``_passages2string`` of the answer; the same call to both servers, the servers' order alternating
turn by turn. Reported per B (queries per turn): per-turn median and p99, the total time of all
turns of a repeat, the servers' CPU time over the repeat (user + system of the server process,
all threads, from /proc), medians over ``--repeats`` and their Search-R1 / ours ratios. Top-k
identity: every query alone, top 3 and top 10, passages in order (ties included) and scores.

    python benchmarks/bench_searchr1_dense.py --search-r1 ~/Search-R1   # ~10 minutes on 2 cores

Writes ``benchmarks/results/searchr1_dense.json``.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_searchr1 import (  # noqa: E402
    CLIENT_FILE,
    SERVER_FILE,
    _commit,
    _free_port,
    _median_ratio,
    build_ours,
    compare_top_k,
    corpus_and_queries,
    cpu_seconds,
    run_header,
    search_r1_batch_search,
    start_ours,
    stop_servers,
    top_k_lists,
    wait_for_retrieve,
    write_report,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "searchr1_dense.json"
BUILDER_FILE = Path("search_r1") / "search" / "index_builder.py"
SHARED_DATA = Path(os.environ.get("AGENTGYM_SHARED_DATA", REPO.parent / "shared" / "data"))
ENCODER = SHARED_DATA / "encoders" / "all-MiniLM-L6-v2"
METHOD = "minilm"  # Search-R1's retrieval_method: names the index file, picks no prefix

# Search-R1's dense code moves the model and every input to CUDA unconditionally; without CUDA
# these calls return their object unchanged, so its code runs as written on the CPU
_CUDA_SHIM = r"""
import torch
import transformers

torch.nn.Module.cuda = lambda self, device=None: self
torch.Tensor.cuda = lambda self, *args, **kwargs: self
_batch_to = transformers.BatchEncoding.to


def _to(self, device=None, *args, **kwargs):
    return self if str(device).startswith("cuda") else _batch_to(self, device, *args, **kwargs)


transformers.BatchEncoding.to = _to
"""

_BUILD_LAUNCHER = (
    _CUDA_SHIM
    + r"""
import runpy
import sys

script = sys.argv[1]
sys.argv = [script, *sys.argv[2:]]
runpy.run_path(script, run_name="__main__")
"""
)

_SERVE_LAUNCHER = (
    _CUDA_SHIM
    + r"""
import sys

sys.path.insert(0, sys.argv[1])
import uvicorn
import retrieval_server as rs

# what retrieval_server.py's __main__ does, for a dense index on the CPU, on loopback
rs.config = rs.Config(
    retrieval_method=sys.argv[2], index_path=sys.argv[3], corpus_path=sys.argv[4],
    retrieval_topk=3, faiss_gpu=False, retrieval_model_path=sys.argv[5],
    retrieval_pooling_method="mean", retrieval_query_max_length=256,
    retrieval_use_fp16=False, retrieval_batch_size=512,
)
rs.retriever = rs.get_retriever(rs.config)
uvicorn.run(rs.app, host="127.0.0.1", port=int(sys.argv[6]))
"""
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(fn, *args) -> dict[str, float]:
    """Run ``fn(*args)`` (which runs a child process to its end): its wall and CPU seconds."""
    wall0, cpu0 = time.perf_counter(), _children_cpu()
    fn(*args)
    return {"wall_s": time.perf_counter() - wall0, "cpu_s": _children_cpu() - cpu0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--search-r1",
        type=Path,
        default=os.environ.get("SEARCH_R1_SRC"),
        help="a Search-R1 checkout (git clone https://github.com/PeterGriffinJin/Search-R1)",
    )
    p.add_argument("--encoder", type=Path, default=ENCODER, help="the encoder of both sides")
    p.add_argument("--corpus-size", type=int, default=5000, help="generated passages")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="untimed passes over the queries")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    checkout = args.search_r1
    if checkout is None or not all(
        (checkout / f).is_file() for f in (SERVER_FILE, BUILDER_FILE, CLIENT_FILE)
    ):
        sys.exit(
            f"pass --search-r1 PATH, a Search-R1 checkout holding {SERVER_FILE} and "
            f"{BUILDER_FILE} (git clone https://github.com/PeterGriffinJin/Search-R1)"
        )
    if not (args.encoder / "config.json").is_file():
        sys.exit(f"{args.encoder} holds no transformers model; pass --encoder DIR")

    import requests

    import agentgym

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-searchr1-dense-"))
    log = open(work / "servers.log", "w")  # noqa: SIM115 - closed in finally
    # one compute thread everywhere; offline: no process may wait on the Hugging Face hub
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(work / "hf-datasets")}  # fmt: skip
    procs: dict[str, subprocess.Popen] = {}
    try:
        docs, corpus, queries = corpus_and_queries(work, args.corpus_size, "corpus.jsonl")
        theirs_dir = work / "search_r1"  # outside the repository, deleted afterwards
        theirs_dir.mkdir()
        for name in (SERVER_FILE, BUILDER_FILE):
            shutil.copy(checkout / name, theirs_dir / name.name)
        (theirs_dir / "build.py").write_text(_BUILD_LAUNCHER)
        (theirs_dir / "serve.py").write_text(_SERVE_LAUNCHER)
        print(f"{len(docs):,} passages, {len(queries)} queries; encoding them twice", flush=True)

        # INDEXES: each side's own builder, the same corpus file and encoder
        flags = ["--retrieval_method", METHOD, "--model_path", str(args.encoder),
                 "--corpus_path", str(corpus), "--save_dir", str(work / "search_r1_index"),
                 "--max_length", "256", "--batch_size", "512", "--pooling_method", "mean",
                 "--faiss_type", "Flat"]  # fmt: skip
        builds = {
            "search_r1": _timed(
                functools.partial(
                    subprocess.run, check=True, env=env, stdout=log, stderr=subprocess.STDOUT
                ),
                [
                    sys.executable,
                    str(theirs_dir / "build.py"),
                    str(theirs_dir / "index_builder.py"),
                    *flags,
                ],
            ),  # fmt: skip
        }
        print(f"  Search-R1's index_builder.py: {builds['search_r1']}", flush=True)
        builds["ours"] = _timed(
            build_ours, corpus, work / "ours_flat", log, env,
            "--kind", "flat", "--encoder", str(args.encoder), "--device", "cpu",
        )  # fmt: skip
        print(f"  agentgym retrieval index: {builds['ours']}", flush=True)
        index_file = work / "search_r1_index" / f"{METHOD}_Flat.index"
        if not index_file.is_file():
            raise RuntimeError(f"Search-R1's index_builder.py wrote no {index_file}")

        # SERVERS
        port = _free_port()
        procs["search_r1"] = subprocess.Popen(
            [sys.executable, str(theirs_dir / "serve.py"), str(theirs_dir), METHOD,
             str(index_file), str(corpus), str(args.encoder), str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        urls = {"search_r1": f"http://127.0.0.1:{port}/retrieve"}
        wait_for_retrieve(procs["search_r1"], urls["search_r1"], "Search-R1's server", log.name)
        procs["ours"], urls["ours"] = start_ours(work / "ours_flat", log, env, ("--threads", "1"))
        pids = {n: proc.pid for n, proc in procs.items()}
        names = list(urls)

        # TOP-K IDENTITY: every query alone, top 3 and top 10
        same_top_k = {}
        for k in (3, 10):
            lists = {name: top_k_lists(url, queries, k) for name, url in urls.items()}
            same_top_k[str(k)] = compare_top_k(lists["search_r1"], lists["ours"], tol=1e-4)
            print(f"  top-{k}: {same_top_k[str(k)]}", flush=True)

        # TURNS: Search-R1's batch_search, one POST of B queries per turn, interleaved
        def turn(name: str, batch: list[str]) -> None:
            search_r1_batch_search(requests.post, urls[name], batch)

        for _ in range(args.warmup):
            for name in names:
                for q in queries:
                    turn(name, [q])
        by_batch: dict[str, dict] = {}
        for batch_size in args.batch_sizes:
            n_turns = -(-len(queries) // batch_size)
            turns = [
                [queries[(t * batch_size + i) % len(queries)] for i in range(batch_size)]
                for t in range(n_turns)
            ]
            per_turn: dict[str, list[float]] = {n: [] for n in names}
            totals: dict[str, list[float]] = {n: [] for n in names}
            server_cpu: dict[str, list[float]] = {n: [] for n in names}
            for repeat in range(args.repeats):
                spent = dict.fromkeys(names, 0.0)
                cpu0 = {n: cpu_seconds(pids[n]) for n in names}  # idle between its own turns
                for t, batch in enumerate(turns):
                    for name in names if (t + repeat) % 2 == 0 else names[::-1]:
                        t0 = time.perf_counter()
                        turn(name, batch)
                        dt = time.perf_counter() - t0
                        per_turn[name].append(dt * 1e3)
                        spent[name] += dt
                for n in names:
                    totals[n].append(spent[n])
                    server_cpu[n].append(cpu_seconds(pids[n]) - cpu0[n])
            med = {n: statistics.median(per_turn[n]) for n in names}
            row = {
                "turns_per_repeat": n_turns,
                "per_turn_ms_median": med,
                "per_turn_ms_p99": {n: float(np.percentile(per_turn[n], 99)) for n in names},
                "total_s_median": {n: statistics.median(totals[n]) for n in names},
                "server_cpu_s_median": {n: statistics.median(server_cpu[n]) for n in names},
                "server_cpu_ms_per_query_median": {
                    n: statistics.median(server_cpu[n]) * 1e3 / (n_turns * batch_size)
                    for n in names
                },
                "ratio_median_turn": med["search_r1"] / med["ours"],
                "ratio_total_time": _median_ratio(totals["search_r1"], totals["ours"]),
                "ratio_server_cpu": _median_ratio(server_cpu["search_r1"], server_cpu["ours"]),
                "runs": {"total_s": totals, "server_cpu_s": server_cpu},
            }
            by_batch[str(batch_size)] = row
            print(
                f"  B={batch_size:>3}: per turn Search-R1 {med['search_r1']:.1f} ms / ours "
                f"{med['ours']:.1f} ms; total {row['total_s_median']['search_r1']:.2f} / "
                f"{row['total_s_median']['ours']:.2f} s ({row['ratio_total_time']:.2f}x); "
                f"server CPU {row['server_cpu_s_median']['search_r1']:.2f} / "
                f"{row['server_cpu_s_median']['ours']:.2f} s ({row['ratio_server_cpu']:.2f}x)",
                flush=True,
            )
    finally:
        server_log = stop_servers(procs, log, work)

    import faiss
    import sentence_transformers
    import torch
    import transformers

    report = {
        "benchmark": "searchr1_dense",
        **run_header(load_before),
        "versions": {
            "agentgym": agentgym.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "faiss": faiss.__version__,
            "search_r1_commit": _commit(checkout),
        },
        "settings": {
            "passages": len(docs),
            "queries": len(queries),
            "encoder": args.encoder.name,
            "repeats": args.repeats,
            "topk": 3,
            "compute_threads_per_process": 1,
            "search_r1_index": f"{BUILDER_FILE} {' '.join(flags[:2] + flags[8:])}",
            "search_r1_server": f"{SERVER_FILE} (DenseRetriever, its Encoder, FAISS Flat; "
            "fp16 off, faiss_gpu off, .cuda() calls made no-ops)",
            "ours_index": "agentgym retrieval index --kind flat --device cpu",
            "ours_server": "agentgym retrieval serve --threads 1",
            "client": f"{CLIENT_FILE} batch_search: one requests.post of B queries per turn",
        },
        "index_build": builds,
        "same_top_k": same_top_k,
        "by_batch_size": by_batch,
        "servers_log_tail": server_log[-500:],
    }
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
