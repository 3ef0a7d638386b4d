"""SearchQA: env step and reset times with in-process BM25, against Search-R1's way of retrieving
(one HTTP request per query to a retrieval server), in one run.

Measured, each repeated ``--repeats`` times (medians over repeats reported, and ratios):

(a) ``AgentGym/SearchQA-Synthetic-v0`` (its ~300 generated passages, in-process BM25): the
    scripted searcher plays every test question; per-step wall time of search steps and of
    answer steps (median and p99 within a repeat), and reset time.
(b) The same questions through the real-data path (Search-R1 parquet written by
    ``write_search_r1_files``) over a bigger corpus: the generated passages plus
    ``--corpus-size`` distractor passages from ``agentgym.retrieval.synthetic_corpus``, one
    in-process bm25s index. Same per-step figures.
(c) Peer: the queries of (b), answered by a retrieval server in a separate process holding the
    same index (``agentgym.retrieval.server`` with cross-request batching off, as Search-R1's
    server works), called
    - Search-R1's way: ``requests.post(url, json={"queries": [q], "topk": 3,
      "return_scores": True}).json()`` per query (a new connection each time, as its
      ``_batch_search`` does), then the passages formatted;
    - through the env with ``retriever=URL`` (our ``RetrievalClient``: one kept-alive
      connection), a whole search step.
    Ratios are HTTP time / in-process time, per search, medians.

Writes ``benchmarks/results/searchqa.json`` and prints a table. The machine may be shared: keep
``--repeats`` small and compare only figures from one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from agentgym.envs import entry
from agentgym.io import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results" / "searchqa.json"


#: the registered SearchQA ids' step cap: the episodes play as `gym.make` would play them
CAP = entry("AgentGym/SearchQA-v0").max_episode_steps


def _corpus(corpus_size: int) -> list[dict]:
    """The KB's passages plus ``corpus_size`` distractors (ids shifted past the KB's)."""
    from agentgym.envs.searchqa.synthetic import knowledge_base
    from agentgym.retrieval.synthetic import synthetic_corpus

    docs = list(knowledge_base(0).passages)
    offset = len(docs)
    for doc in synthetic_corpus(corpus_size, seed=0):
        docs.append({"id": str(int(doc["id"]) + offset), "contents": doc["contents"]})
    return docs


def _serve_child(corpus_size: int, url_queue, stop_event) -> None:
    """Child process: build the same index and serve it until told to stop."""
    from agentgym.retrieval.server import create_app, serve_in_thread
    from agentgym.retrieval.sparse import BM25Retriever

    retriever = BM25Retriever.from_documents(_corpus(corpus_size))
    # max_batch_queries=1: every request searched alone, as Search-R1's server does
    with serve_in_thread(create_app(retriever, max_batch_queries=1)) as server:
        url_queue.put(server.url)
        stop_event.wait()


def _percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def play_timed(env, questions: int) -> dict[str, list[float]]:
    """Scripted episodes over the first ``questions`` tasks; per-call wall times in ms."""
    from agentgym.envs.searchqa import ScriptedSearchPolicy

    policy = ScriptedSearchPolicy()
    times: dict[str, list[float]] = {"reset": [], "search": [], "answer": [], "won": []}
    queries: list[str] = []
    for task in range(questions):
        t0 = time.perf_counter()
        obs, info = env.reset(options={"task": task})
        times["reset"].append((time.perf_counter() - t0) * 1e3)
        done = False
        while not done:
            action = policy([obs], [info])[0]
            t0 = time.perf_counter()
            obs, _, terminated, truncated, info = env.step(action)
            dt = (time.perf_counter() - t0) * 1e3
            kind = action.split("[", 1)[0]
            times[kind].append(dt)
            if kind == "search":
                queries.append(action[len("search[") : -1])
            done = terminated or truncated
        times["won"].append(float(info["won"]))
    times["queries"] = queries  # type: ignore[assignment]
    return times


def summarise(runs: list[dict[str, list[float]]]) -> dict[str, float]:
    """Per repeat: median and p99 of each step kind; then the median over repeats."""
    out: dict[str, float] = {}
    for kind in ("search", "answer", "reset"):
        out[f"{kind}_median_ms"] = statistics.median(statistics.median(r[kind]) for r in runs)
        out[f"{kind}_p99_ms"] = statistics.median(_percentile(r[kind], 99) for r in runs)
    out["steps_per_repeat"] = len(runs[0]["search"]) + len(runs[0]["answer"])
    out["em"] = float(np.mean(runs[0]["won"]))
    return out


def search_r1_request(url: str, query: str, topk: int = 3) -> str:
    """Search-R1's per-turn retrieval: a fresh ``requests.post``, then ``_passages2string``."""
    import requests

    from agentgym.envs.searchqa import passages_to_string
    from agentgym.retrieval.base import Hit

    payload = {"queries": [query], "topk": topk, "return_scores": True}
    result = requests.post(url, json=payload, timeout=30).json()["result"][0]
    hits = [Hit(str(r["document"].get("id", "")), r["score"], r["document"]) for r in result]
    return passages_to_string(hits)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--corpus-size", type=int, default=50_000, help="distractor passages in (b)")
    p.add_argument("--questions", type=int, default=None, help="test questions (default: all)")
    p.add_argument("--no-server", action="store_true", help="skip the HTTP peer comparison (c)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()

    import agentgym
    from agentgym.envs.searchqa import SearchQAEnv, passages_to_string
    from agentgym.envs.searchqa.synthetic import write_search_r1_files
    from agentgym.retrieval.sparse import BM25Retriever

    results: dict[str, object] = {}
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-searchqa-"))
    write_search_r1_files(tmp)

    # start the server child first: it builds its index while we build ours
    server = None
    if not args.no_server:
        ctx = mp.get_context("spawn")
        url_queue, stop_event = ctx.Queue(), ctx.Event()
        server = ctx.Process(
            target=_serve_child, args=(args.corpus_size, url_queue, stop_event), daemon=True
        )
        server.start()

    # -- build everything before timing anything (the server child builds its index meanwhile;
    # two cores: timing while it builds would measure the contention, not the env)
    t0 = time.perf_counter()
    env = SearchQAEnv(synthetic=True, split="test", max_episode_steps=CAP)
    first_env_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    docs = _corpus(args.corpus_size)
    big = BM25Retriever.from_documents(docs)
    index_s = time.perf_counter() - t0
    env_b = SearchQAEnv(data=tmp / "test.parquet", retriever=big, max_episode_steps=CAP)
    url = url_queue.get(timeout=600) + "/retrieve" if server is not None else None
    n_questions = min(env.num_tasks, args.questions or env.num_tasks)

    # -- (a) synthetic env ------------------------------------------------------------------------
    runs = [play_timed(env, n_questions) for _ in range(args.repeats)]
    results["synthetic_inprocess"] = {
        **summarise(runs),
        "passages": len(env._retriever.documents),
        "first_env_build_s": first_env_s,
    }

    # -- (b) real-data path over a bigger in-process index ------------------------------------
    runs_b = [play_timed(env_b, n_questions) for _ in range(args.repeats)]
    results["bigcorpus_inprocess"] = {
        **summarise(runs_b),
        "passages": len(docs),
        "index_build_s": index_s,
    }
    queries = runs_b[0]["queries"]

    # -- (c) peer: one HTTP request per query to a server -------------------------------------
    if server is not None:
        from agentgym.retrieval.client import RetrievalClient

        client = RetrievalClient(url)
        # The three ways of getting one query's formatted passages, interleaved query by query
        # so that load on the machine hits them alike.
        ways = {
            "search_r1_request": lambda q: search_r1_request(url, q),
            "client_request": lambda q: passages_to_string(client.search([q], 3)[0]),
            "inprocess": lambda q: passages_to_string(big.search([q], 3)[0]),
        }
        per_query: dict[str, list[float]] = {k: [] for k in ways}
        try:
            for _ in range(args.repeats):
                times: dict[str, list[float]] = {k: [] for k in ways}
                for q in queries:
                    for name, way in ways.items():
                        times[name].append(_time_ms(lambda way=way, q=q: way(q)))
                for name in ways:
                    per_query[name].append(statistics.median(times[name]))
            env_c = SearchQAEnv(data=tmp / "test.parquet", retriever=url, max_episode_steps=CAP)
            runs_c = [play_timed(env_c, n_questions) for _ in range(args.repeats)]
            assert runs_c[0]["queries"] == queries  # same index, same episodes
        finally:
            client.close()
            stop_event.set()
            server.join(timeout=30)
        med = {name: statistics.median(v) for name, v in per_query.items()}
        http_env = summarise(runs_c)
        inproc_step = results["bigcorpus_inprocess"]["search_median_ms"]  # type: ignore[index]
        results["http_server"] = {
            "per_query_median_ms": med,
            "ratio_search_r1_request_vs_inprocess": med["search_r1_request"] / med["inprocess"],
            "ratio_client_request_vs_inprocess": med["client_request"] / med["inprocess"],
            "env_step_via_client": http_env,
            "ratio_env_http_step_vs_inprocess_step": http_env["search_median_ms"] / inproc_step,
            "queries": len(queries),
            "note": "server in a separate process on loopback, cross-request batching off; "
            "per-query ways interleaved; env steps over HTTP measured after them",
        }
    else:
        results["http_server"] = "skipped (--no-server)"

    import bm25s

    report = {
        "benchmark": "searchqa",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            # other work on the machine shows up in p99 (preemption), not in medians
            "load_average_1min_before_after": [load_before[0], os.getloadavg()[0]],
        },
        "versions": {"agentgym": agentgym.__version__, "bm25s": bm25s.__version__},
        "settings": {
            "repeats": args.repeats,
            "corpus_size": args.corpus_size,
            "questions": n_questions,
            "topk": 3,
            "max_episode_steps": CAP,
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(report, indent=1) + "\n")
    _print_table(results)
    return 0


def _time_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _print_table(results: dict) -> None:
    print(f"{'scenario':<24}{'search med':>11}{'p99':>8}{'answer med':>11}{'p99':>8}"
          f"{'reset med':>10}{'EM':>6}")  # fmt: skip
    rows = [("synthetic (in-process)", results["synthetic_inprocess"])]
    rows.append(("big corpus (in-process)", results["bigcorpus_inprocess"]))
    if isinstance(results["http_server"], dict):
        rows.append(("big corpus (HTTP env)", results["http_server"]["env_step_via_client"]))
    for name, r in rows:
        print(
            f"{name:<24}{r['search_median_ms']:>9.3f}ms{r['search_p99_ms']:>6.2f}ms"
            f"{r['answer_median_ms']:>9.3f}ms{r['answer_p99_ms']:>6.2f}ms"
            f"{r['reset_median_ms']:>8.3f}ms{r['em']:>6.2f}"
        )
    if isinstance(results["http_server"], dict):
        h = results["http_server"]
        m = h["per_query_median_ms"]
        print(
            f"per query: Search-R1's requests.post {m['search_r1_request']:.3f} ms, "
            f"RetrievalClient {m['client_request']:.3f} ms, in-process {m['inprocess']:.3f} ms "
            f"(x{h['ratio_search_r1_request_vs_inprocess']:.1f} / "
            f"x{h['ratio_client_request_vs_inprocess']:.1f}); env step over HTTP "
            f"x{h['ratio_env_http_step_vs_inprocess_step']:.1f} an in-process one"
        )


if __name__ == "__main__":
    raise SystemExit(main())
