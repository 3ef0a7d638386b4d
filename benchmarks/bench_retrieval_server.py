"""Retrieval server throughput: micro-batching vs one search per request, at 1-256 clients.

    python benchmarks/bench_retrieval_server.py          # bm25 + flat-tiny; writes results/retrieval_server.json
    python benchmarks/bench_retrieval_server.py --retrievers flat-minilm --modes batched one-at-a-time
    python benchmarks/bench_retrieval_server.py --retrievers bm25 --concurrency 1 256 --repeats 3

Servers run side by side, each in its own process, over the same retriever and corpus (a
generated Search-R1-format corpus, 100k passages by default):

* ``batched``: ``agentgym.retrieval.server.create_app`` with its defaults, as
  ``agentgym retrieval serve`` runs it: a batch goes out as soon as the search thread is free
  (``batch_wait_ms=0``), up to 512 queries, capped lower where the retriever's measured cost per
  call says larger batches gain nothing (``adaptive_batch``: BM25);
* ``batched-fixed``: the same without the adaptive cap (every queued query, up to 512, in one
  search), the server's behaviour before the cap existed;
* ``batched-wait``: the defaults plus a ``--batch-wait-ms`` window (2 ms) that holds a batch
  open for company;
* ``one-at-a-time``: the same server with ``max_batch_queries=1``: every request is its own
  search, which is how Search-R1's rollout calls its server (one request per turn);
* ``stock``: a server shaped like Search-R1's ``retrieval_server.py`` (a synchronous FastAPI
  endpoint run in the thread pool, a pydantic request model, FastAPI's default JSON encoding),
  over the same retriever: the peer approach.

Retrievers: ``bm25`` (bm25s backend, Lucene scoring); ``flat-tiny`` (exact FAISS inner
product, a tiny random 2-layer BERT query encoder built offline); ``flat-minilm`` (the same with
the pretrained all-MiniLM-L6-v2 from ../shared/data/encoders as the query encoder: a real
encoder, whose per-call cost is what batching amortises, as E5 in Search-R1). The dense indexes
hold seeded random unit vectors of the encoder's dimension, NOT encoded passages: the search
cost (an exact inner product over 100k vectors of that dimension, then the top-k) does not
depend on the values, and encoding 100k passages with MiniLM takes hours on a CPU. The
answers are therefore meaningless as retrieval, but the same for every server, and checked so.

The load generator is this process (asyncio): N clients, one keep-alive connection each, send
one query per request (``{"queries": [q], "topk": 3, "return_scores": true}``, Search-R1's
call) in a loop. By default they speak HTTP/1.1 over asyncio streams (:class:`RawConnection`);
``--client httpx`` uses one ``httpx.AsyncClient`` instead, whose connection pool costs so much CPU
at 64+ connections that it, not the server, sets the rate (~60 q/s where the raw client sees
~1,600 against the same server).

Every configuration gets a warm-up, then ``--repeats`` windows of ``--duration`` seconds,
interleaved across the servers so that a change in machine load hits all of them alike.
Reported: median queries/s over the windows (requests answered within the window / its length),
median p50 / p99 latency, mean queries per search (from the servers' /health counters), the
server's CPU time per query (user + system, all its threads, from /proc: on a machine shared
with other work this is the steadier measure of what batching saves, since queries/s also moves
with how much CPU the scheduler hands the server), and the load generator's CPU use.

Each server process gets ``--server-threads`` compute threads (OpenMP, BLAS, torch; default 1).
When the cores are shared (by the servers, the load generator and anything else running), a
multi-threaded single-query search stalls whenever one of its threads is descheduled: one query
through the tiny encoder and FAISS has been measured at 110-150 ms with two threads on two busy
cores, against 2.5 ms with one. One thread per server measures the servers, not the scheduler;
``--server-threads 0`` keeps the libraries' defaults.

A table of response-encoding costs (FastAPI's default encoder vs ``json.dumps`` vs the server's
cached-document encoder) comes with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel

from agentgym.io import atomic_write_text

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SHARED_DATA = Path(os.environ.get("AGENTGYM_SHARED_DATA", HERE.parent.parent / "shared" / "data"))
MINILM_DIR = SHARED_DATA / "encoders" / "all-MiniLM-L6-v2"
RETRIEVERS = ("bm25", "flat-tiny", "flat-minilm")
MODES = ("batched", "batched-fixed", "batched-wait", "one-at-a-time", "stock")
DEFAULT_MODES = ("batched", "batched-fixed", "one-at-a-time", "stock")
JSON_HEADERS = {"content-type": "application/json"}


# ----------------------------------------------------------------------------------------------
# Retrievers: built once into the cache directory, loaded by each server process


def _documents(passages: int) -> list[dict]:
    from agentgym.retrieval.synthetic import synthetic_corpus

    return list(synthetic_corpus(passages, seed=0))


def _tiny_encoder_dir(cache: Path) -> Path:
    """The tests' tiny random BERT (2 layers, 64-d; vocabulary from the corpus), built once."""
    from agentgym.retrieval.synthetic import random_encoder

    out = cache / "tiny-encoder"
    if not (out / "st" / "modules.json").is_file():
        texts = [d["contents"] for d in _documents(2000)]
        random_encoder(out, texts, hidden=64, layers=2)
    return out / "st"


def _encoder_path(name: str, cache: Path) -> Path:
    if name == "flat-tiny":
        return _tiny_encoder_dir(cache)
    if not MINILM_DIR.is_dir():
        sys.exit(f"{MINILM_DIR} not found: flat-minilm needs the all-MiniLM-L6-v2 folder there")
    return MINILM_DIR


def prepare(name: str, passages: int, cache: Path) -> Path:
    """Build what the ``name`` retriever's servers load (index or passage vectors), once."""
    if name == "bm25":
        from agentgym.retrieval.sparse import BM25Retriever

        path = cache / f"bm25-{passages}"
        if not path.is_dir():  # saved atomically: a directory there is a whole index
            t0 = time.perf_counter()
            BM25Retriever.from_documents(_documents(passages), show_progress=True).index.save(path)
            print(f"bm25: indexed {passages:,} passages in {time.perf_counter() - t0:.1f} s")
        return path
    from agentgym.io import atomic_save_npy
    from agentgym.retrieval.encoder import Encoder

    dim = Encoder(_encoder_path(name, cache), device="cpu").dim
    path = cache / f"random-unit-{dim}d-{passages}.npy"
    if not path.is_file():
        # stand-in passage vectors: the search cost is the same as for encoded passages
        vectors = np.random.default_rng(0).standard_normal((passages, dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        atomic_save_npy(path, vectors)
    return path


def load_retriever(name: str, passages: int, cache: Path):
    documents = _documents(passages)
    if name == "bm25":
        from agentgym.retrieval.sparse import BM25Index, BM25Retriever

        return BM25Retriever(BM25Index.load(cache / f"bm25-{passages}"), documents)
    from agentgym.retrieval.dense import DenseIndex, DenseRetriever
    from agentgym.retrieval.encoder import Encoder

    encoder = Encoder(_encoder_path(name, cache), device="cpu")
    vectors = np.load(cache / f"random-unit-{encoder.dim}d-{passages}.npy")
    index = DenseIndex.build(vectors, "flat", device="cpu")
    return DenseRetriever(index, encoder, documents)


# ----------------------------------------------------------------------------------------------
# The stock peer: Search-R1's serving shape (our code, written after its retrieval_server.py)


class QueryRequest(BaseModel):
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def stock_app(retriever: Any, default_topk: int = 3) -> FastAPI:
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict:  # sync: FastAPI runs it in its thread pool
        hits = retriever.search(request.queries, request.topk or default_topk)
        if request.return_scores:
            result = [[{"document": h.document, "score": h.score} for h in row] for row in hits]
        else:
            result = [[h.document for h in row] for row in hits]
        return {"result": result}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


def run_server(spec: dict) -> None:
    """Entry point of a server process (``--_serve SPEC``)."""
    import uvicorn

    from agentgym.retrieval.server import create_app

    if os.environ.get("OMP_NUM_THREADS") and spec["retriever"] != "bm25":
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    retriever = load_retriever(spec["retriever"], spec["passages"], Path(spec["cache"]))
    if spec["mode"] == "stock":
        app = stock_app(retriever)
    else:
        mode = spec["mode"]
        app = create_app(
            retriever,
            max_batch_queries=1 if mode == "one-at-a-time" else 512,
            batch_wait_ms=spec["batch_wait_ms"] if mode == "batched-wait" else 0.0,
            adaptive_batch=mode != "batched-fixed",
        )
    uvicorn.run(app, host="127.0.0.1", port=spec["port"], log_level="warning", access_log=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def servers(name: str, args: argparse.Namespace) -> Iterator[tuple[dict[str, str], dict[str, int]]]:
    """Start one server process per mode over retriever ``name``; yield the base URL and the
    process id of each mode's server."""
    procs: dict[str, subprocess.Popen] = {}
    urls: dict[str, str] = {}
    try:
        for mode in args.modes:
            port = _free_port()
            spec = {
                "retriever": name,
                "mode": mode,
                "port": port,
                "passages": args.passages,
                "cache": str(args.cache_dir),
                "batch_wait_ms": args.batch_wait_ms,
            }
            env = dict(os.environ)
            if args.server_threads:
                for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                    env[var] = str(args.server_threads)
            procs[mode] = subprocess.Popen(
                [sys.executable, __file__, "--_serve", json.dumps(spec)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            urls[mode] = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        for mode, url in urls.items():
            while True:
                if procs[mode].poll() is not None:
                    raise RuntimeError(f"{mode} server exited:\n{procs[mode].stderr.read()}")
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{mode} server did not start within 300 s")
                time.sleep(0.25)
        yield urls, {mode: proc.pid for mode, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)


# ----------------------------------------------------------------------------------------------
# Load generation


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid``, all threads (Linux ``/proc``; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RawConnection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON bodies and reads whole responses.

    The load generator shares the CPU with the server: httpx spends about a millisecond of CPU
    per request, enough to make the client the bottleneck at a few hundred requests per second.
    This client writes prebuilt request bytes and parses only the status line and Content-Length
    (the servers here always send one), so nearly all the CPU goes to the server being measured.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    @staticmethod
    def request_bytes(host: str, path: str, body: bytes) -> bytes:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def connect(self) -> None:
        """Open the connection now (else the first ``send`` opens it)."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def send(self, request: bytes) -> tuple[int, bytes]:
        reused = self._writer is not None
        try:
            return await self._exchange(request)
        except (asyncio.IncompleteReadError, ConnectionError):
            if not reused:
                raise
            # the server closed a keep-alive connection that sat idle (uvicorn: after 5 s)
            await self.close()
            return await self._exchange(request)

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self._reader.readexactly(length)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
            self._writer = None


class Clients:
    """``concurrency`` load clients of one server: raw connections, or one shared httpx client."""

    def __init__(self, url: str, bodies: list[bytes], concurrency: int, kind: str) -> None:
        self.url = url + "/retrieve"
        self.concurrency = concurrency
        self.kind = kind
        host, port = url.removeprefix("http://").split(":")
        if kind == "raw":
            self.raw = [RawConnection(host, int(port)) for _ in range(concurrency)]
            self.requests = [RawConnection.request_bytes(host, "/retrieve", b) for b in bodies]
        else:
            limits = httpx.Limits(
                max_connections=concurrency, max_keepalive_connections=concurrency
            )
            self.httpx = httpx.AsyncClient(timeout=120, limits=limits)
            self.requests = bodies

    async def post(self, i: int, j: int) -> tuple[int, bytes]:
        """Client ``i`` sends request ``j`` (cycling through the queries)."""
        request = self.requests[j % len(self.requests)]
        if self.kind == "raw":
            return await self.raw[i].send(request)
        r = await self.httpx.post(self.url, content=request, headers=JSON_HEADERS)
        return r.status_code, r.content

    async def close(self) -> None:
        if self.kind == "raw":
            for c in self.raw:
                await c.close()
        else:
            await self.httpx.aclose()


async def window(clients: Clients, duration: float) -> dict[str, float]:
    """Every client in a request loop for ``duration`` s; counts the requests answered in time.

    Latencies are of every request sent in the window, those answered after its end too: with
    a slow server, many clients' requests are still queued at the deadline, and leaving them
    out would report the latency of the lucky ones only.
    """
    latencies: list[float] = []
    in_time = 0  # answered before the deadline: the queries/s
    answered = 0  # all requests, those finishing after the deadline too (for CPU per query)
    start = time.perf_counter()
    deadline = start + duration
    cpu0 = time.process_time()
    concurrency = clients.concurrency

    async def one_client(i: int) -> None:
        nonlocal answered, in_time
        j = i
        while (t0 := time.perf_counter()) < deadline:
            status, body = await clients.post(i, j)
            t1 = time.perf_counter()
            if status != 200:
                raise RuntimeError(f"{clients.url} answered {status}: {body[:200]!r}")
            latencies.append(t1 - t0)
            in_time += t1 <= deadline
            answered += 1
            j += concurrency

    await asyncio.gather(*(one_client(i) for i in range(concurrency)))
    wall = time.perf_counter() - start
    lat_ms = np.asarray(latencies) * 1000.0
    return {
        "qps": in_time / duration,
        "p50_ms": float(np.percentile(lat_ms, 50)) if len(lat_ms) else float("nan"),
        "p99_ms": float(np.percentile(lat_ms, 99)) if len(lat_ms) else float("nan"),
        "loadgen_cpu": (time.process_time() - cpu0) / wall,
        "answered": answered,
    }


async def measure_concurrency(
    urls: dict[str, str],
    pids: dict[str, int],
    bodies: list[bytes],
    concurrency: int,
    args: argparse.Namespace,
) -> dict[str, list[dict[str, float]]]:
    clients = {m: Clients(url, bodies, concurrency, args.client) for m, url in urls.items()}
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in urls}
    try:
        for mode in urls:  # warm-up: open the connections, warm the caches
            await window(clients[mode], args.warmup)
        for _ in range(args.repeats):
            for mode, url in urls.items():
                before = httpx.get(url + "/health").json()
                cpu_before = cpu_seconds(pids[mode])
                run = await window(clients[mode], args.duration)
                run["server_cpu_ms_per_query"] = (
                    (cpu_seconds(pids[mode]) - cpu_before) * 1000 / max(run["answered"], 1)
                )
                after = httpx.get(url + "/health").json()
                if "batch_cap" in after:
                    run["batch_cap"] = after["batch_cap"]
                if "searches" in after:
                    searches = after["searches"] - before["searches"]
                    run["queries_per_search"] = (after["queries"] - before["queries"]) / max(
                        searches, 1
                    )
                runs[mode].append(run)
    finally:
        for c in clients.values():
            await c.close()
    return runs


def check_same_answers(urls: dict[str, str], queries: list[str]) -> None:
    """Every server must answer the same hits: the modes differ in how, never in what."""
    answers = {}
    for mode, url in urls.items():
        answers[mode] = [
            [
                item["document"]["id"]
                for item in httpx.post(
                    url + "/retrieve", json={"queries": [q], "topk": 3, "return_scores": True}
                ).json()["result"][0]
            ]
            for q in queries
        ]
    first = next(iter(answers.values()))
    for mode, got in answers.items():
        if got != first:
            raise AssertionError(f"{mode} answers differ from {next(iter(answers))}'s")


# ----------------------------------------------------------------------------------------------
# Response encoding


def encoding_costs(retriever: Any, queries: list[str]) -> list[dict[str, Any]]:
    """Microseconds to encode one /retrieve response: FastAPI default vs json.dumps vs ours."""
    from fastapi.encoders import jsonable_encoder
    from fastapi.responses import JSONResponse

    from agentgym.retrieval.server import _DocumentCache, encode_result

    rows = []
    for n, k in ((1, 3), (256, 3), (256, 10)):
        hits = retriever.search(queries[:n], k)

        def as_dict(hits=hits) -> dict:
            return {
                "result": [[{"document": h.document, "score": h.score} for h in r] for r in hits]
            }

        cache = _DocumentCache()
        ways = {
            "fastapi_default": lambda d=as_dict: JSONResponse(jsonable_encoder(d())).body,
            "json_dumps": lambda d=as_dict: json.dumps(d(), ensure_ascii=False).encode(),
            "cached_documents": lambda h=hits, c=cache: encode_result(h, True, c),
        }
        outputs = {name: json.loads(f()) for name, f in ways.items()}
        assert all(o == outputs["json_dumps"] for o in outputs.values())
        number = max(1, 1000 // n)
        us = {
            name: min(timeit.repeat(f, number=number, repeat=5)) / number * 1e6
            for name, f in ways.items()
        }
        rows.append(
            {
                "queries": n,
                "topk": k,
                **{f"{name}_us": round(v, 1) for name, v in us.items()},
                "speedup_vs_fastapi": round(us["fastapi_default"] / us["cached_documents"], 2),
                "speedup_vs_json_dumps": round(us["json_dumps"] / us["cached_documents"], 2),
            }
        )
    return rows


# ----------------------------------------------------------------------------------------------


def _median(runs: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in runs if key in r]
    return float(statistics.median(values)) if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--retrievers", nargs="+", choices=RETRIEVERS, default=["bm25", "flat-tiny"])
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(DEFAULT_MODES))
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 256])
    p.add_argument("--duration", type=float, default=2.0, help="seconds per measured window")
    p.add_argument("--repeats", type=int, default=3, help="measured windows per configuration")
    p.add_argument("--warmup", type=float, default=0.5, help="seconds of warm-up per config")
    p.add_argument("--batch-wait-ms", type=float, default=2.0, help="the batched-wait window")
    p.add_argument(
        "--server-threads",
        type=int,
        default=1,
        help="compute threads (OpenMP/BLAS/torch) per server process; 0 = the libraries' default",
    )
    p.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="load client: raw asyncio HTTP/1.1 (cheap) or httpx.AsyncClient",
    )
    p.add_argument("--queries", type=int, default=2048, help="distinct queries the clients cycle")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "agentgym"
        / "bench_retrieval_server",
        help="where the built indexes and passage vectors are kept between runs",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "retrieval_server.json")
    p.add_argument("--_serve", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._serve:
        run_server(json.loads(args._serve))
        return
    if "batched" not in args.modes or len(args.modes) < 2:
        p.error("--modes needs 'batched' and at least one mode to compare it with")

    from agentgym.retrieval.synthetic import synthetic_queries

    args.cache_dir.mkdir(parents=True, exist_ok=True)
    queries = [q["question"] for q in synthetic_queries(args.passages, args.queries, seed=7)]
    bodies = [
        json.dumps({"queries": [q], "topk": 3, "return_scores": True}).encode() for q in queries
    ]
    load_start = os.getloadavg()
    t_start = time.perf_counter()
    results: list[dict[str, Any]] = []
    encoding: dict[str, list] = {}
    for name in args.retrievers:
        prepare(name, args.passages, args.cache_dir)
        with servers(name, args) as (urls, pids):
            check_same_answers(urls, queries[:32])
            for c in args.concurrency:
                runs = asyncio.run(measure_concurrency(urls, pids, bodies, c, args))
                for mode, mode_runs in runs.items():
                    row = {
                        "retriever": name,
                        "mode": mode,
                        "concurrency": c,
                        "qps": round(_median(mode_runs, "qps"), 1),
                        "p50_ms": round(_median(mode_runs, "p50_ms"), 2),
                        "p99_ms": round(_median(mode_runs, "p99_ms"), 2),
                        "queries_per_search": round(_median(mode_runs, "queries_per_search"), 1),
                        "server_cpu_ms_per_query": round(
                            _median(mode_runs, "server_cpu_ms_per_query"), 3
                        ),
                        "loadgen_cpu": round(_median(mode_runs, "loadgen_cpu"), 2),
                        "batch_cap": mode_runs[-1].get("batch_cap"),
                        "qps_runs": [round(r["qps"], 1) for r in mode_runs],
                    }
                    results.append(row)
                    print(
                        f"{name:11s} {mode:14s} c={c:<4d} {row['qps']:9.1f} q/s  "
                        f"p50 {row['p50_ms']:8.2f} ms  p99 {row['p99_ms']:8.2f} ms  "
                        f"batch {row['queries_per_search']:6.1f}  "
                        f"server cpu {row['server_cpu_ms_per_query']:6.3f} ms/q  "
                        f"client cpu {row['loadgen_cpu']:.2f}",
                        flush=True,
                    )
        if name in ("bm25", "flat-tiny"):
            encoding[name] = encoding_costs(
                load_retriever(name, args.passages, args.cache_dir), queries
            )

    def value(name: str, mode: str, c: int, key: str) -> float | None:
        for r in results:
            if (r["retriever"], r["mode"], r["concurrency"]) == (name, mode, c):
                return r[key] if r[key] == r[key] and r[key] > 0 else None  # NaN/0 -> None
        return None

    # qps_*: batched queries/s over the other mode's; cpu_*: the other mode's server CPU per
    # query over batched's (how many times less CPU a query costs batched)
    ratios = []
    for name in args.retrievers:
        for c in args.concurrency:
            row: dict[str, Any] = {"retriever": name, "concurrency": c}
            for other in args.modes:
                if other == "batched":
                    continue
                key = other.replace("-", "_")
                ours, theirs = value(name, "batched", c, "qps"), value(name, other, c, "qps")
                if ours and theirs:
                    row[f"qps_batched_vs_{key}"] = round(ours / theirs, 2)
                ours = value(name, "batched", c, "server_cpu_ms_per_query")
                theirs = value(name, other, c, "server_cpu_ms_per_query")
                if ours and theirs:
                    row[f"cpu_batched_vs_{key}"] = round(theirs / ours, 2)
            ratios.append(row)

    report = {
        "benchmark": "retrieval server queries/s, micro-batching vs one search per request",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "config": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("_serve", "out", "cache_dir")
        },
        "request": {"queries": ["<one query>"], "topk": 3, "return_scores": True},
        "dense_passage_vectors": "seeded random unit vectors of the encoder's dimension, not "
        "encoded passages: the exact FAISS search costs the same for any values",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in load_start],
        },
        "wall_s": round(time.perf_counter() - t_start, 1),
        "results": results,
        "ratios": ratios,
        "response_encoding_us": encoding,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")

    print("\nbatched queries/s over each other mode's:")
    for r in ratios:
        rest = "  ".join(
            f"{k.removeprefix('qps_batched_vs_')}={v}x"
            for k, v in r.items()
            if k.startswith("qps_batched_vs")
        )
        print(f"  {r['retriever']:11s} c={r['concurrency']:<4d} {rest}")
    print("\nserver CPU per query of each other mode over batched's:")
    for r in ratios:
        rest = "  ".join(
            f"{k.removeprefix('cpu_batched_vs_')}={v}x"
            for k, v in r.items()
            if k.startswith("cpu_batched_vs")
        )
        print(f"  {r['retriever']:11s} c={r['concurrency']:<4d} {rest}")
    for name, rows in encoding.items():
        print(f"\nresponse encoding ({name}), microseconds per response:")
        for r in rows:
            print(
                f"  {r['queries']:4d} queries x top-{r['topk']:<3d} fastapi {r['fastapi_default_us']:9.1f}"
                f"  json.dumps {r['json_dumps_us']:9.1f}  cached {r['cached_documents_us']:9.1f}"
                f"  ({r['speedup_vs_fastapi']}x, {r['speedup_vs_json_dumps']}x)"
            )
    print(f"\nwrote {args.out} ({report['wall_s']} s)")


if __name__ == "__main__":
    main()
