"""BM25: agentgym's two backends against stock bm25s, on generated corpora, in one run.

Backends measured on the same seeded corpora (1k, 10k, 100k short passages) and queries:

* ``agentgym-bm25s``: :class:`agentgym.retrieval.sparse.BM25Index` with bm25s (Lucene's analyzer
  and Lucene's BM25 arithmetic, one-byte length norms included).
* ``agentgym-pyserini``: the same class on a real Lucene index (Anserini, in-process JVM).
* ``stock-bm25s``: bm25s as its README uses it (``bm25s.tokenize`` with English stop words and
  PyStemmer's Porter, ``BM25(method="lucene")``, ``retrieve``): the peer for speed, and what
  "bm25s instead of pyserini" gives without our analyzer.

Measures, each repeated ``--repeats`` times with the backends alternating within a repeat
(medians reported, and every repeat's ratio against agentgym-bm25s), each in wall clock and in
CPU time: builds in process CPU time (``time.process_time``: pyserini's JVM runs in this process,
so its indexing threads count), searches in the searching thread's CPU time (``time.thread_time``:
every backend searches on the calling thread, pyserini's through JNI, and the process's figure
would also charge a call with whatever JVM background work overlaps it; both are kept). Searches
alternate between the backends batch by batch and query by query, after an untimed warm-up build
and search of each backend, repeated until its CPU time per pass is steady (the JVM's start and
JIT; each repeat's new index is warmed the same way); garbage is collected before each timed
section and kept off inside it:

(a) build: seconds and documents/s.
(b) search latency, k=10: batches of 50 queries per call (mean per-query time, median over
    the batches), and one query per call (mean, median and p99 over the queries).
(c) fidelity against pyserini: share of queries whose top-10 / top-50 rows are identical, share
    that agree up to ties (a row may differ only where it ties the cut-off score within 2e-4,
    Anserini's score rounding), mean overlap@10; for agentgym-bm25s, the same with Lucene's
    length rounding switched off (what the rounding buys); and the largest relative difference
    between agentgym-bm25s scores and Lucene's own float scores (``IndexSearcher``, before
    Anserini rounds them to 1e-4).

Run::

    python benchmarks/bench_bm25.py                 # all sizes, ~10 minutes on 2 cores
    python benchmarks/bench_bm25.py --sizes 1000 10000 --repeats 5

Writes ``benchmarks/results/bm25.json`` and prints a table. pyserini needs Java 21+ (see
:mod:`agentgym.retrieval.java`); without one, ``--no-pyserini`` measures the rest.
"""

from __future__ import annotations

import argparse
import gc
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

import numpy as np

from agentgym.io import atomic_write_text
from agentgym.retrieval import pruned
from agentgym.retrieval.sparse import BM25Index

RESULTS = Path(__file__).resolve().parent / "results" / "bm25.json"

_SYLLABLES = "ka lo mi nu re sa to vi ber con dis tor man ple gra fin sho tra quel pen".split()
_SUFFIXES = ["", "", "", "s", "ing", "ed", "ly", "ation", "ness", "ity", "er", "'s", "ies", "ology"]
_STOP = ["the", "of", "and", "a", "to", "in", "is", "with", "for", "on", "was", "by"]


def generate_corpus(n: int, n_queries: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` short passages (~40 words, log-normal lengths) over a Zipf-distributed vocabulary
    of pseudo-words with English suffixes, stop words, numbers and punctuation; and queries of
    1-6 words drawn from a passage plus a stray word (some repeated, some with punctuation)."""
    rng = np.random.default_rng(seed)
    n_stems = max(3000, n // 10)
    stems = sorted(
        {"".join(rng.choice(_SYLLABLES, size=rng.integers(1, 5))) for _ in range(n_stems)}
    )
    words = [
        s + _SUFFIXES[int(i)]
        for s, i in zip(stems, rng.integers(len(_SUFFIXES), size=len(stems)), strict=True)
    ]
    words += [str(int(x)) for x in rng.integers(0, 5000, size=200)]
    zipf = 1.0 / np.arange(1, len(words) + 1) ** 1.05
    zipf /= zipf.sum()
    lengths = np.clip(rng.lognormal(3.4, 0.6, size=n).astype(int), 3, 250)
    flat = rng.choice(len(words), size=int(lengths.sum()), p=zipf)
    stop_at = rng.random(flat.size) < 0.25
    stop_pick = rng.integers(len(_STOP), size=flat.size)
    passages: list[str] = []
    start = 0
    for length in lengths:
        toks = [
            _STOP[stop_pick[j]] if stop_at[j] else words[flat[j]]
            for j in range(start, start + length)
        ]
        start += length
        toks[0] = toks[0].capitalize()
        passages.append(" ".join(toks) + ".")
    queries = []
    for _ in range(n_queries):
        doc = passages[int(rng.integers(n))].rstrip(".").split()
        size = min(len(doc), int(rng.integers(1, 7)))
        picked = [str(w) for w in rng.choice(doc, size=size, replace=False)]
        picked.append(str(words[int(rng.integers(len(words)))]))
        if rng.random() < 0.2:
            picked.append(picked[0])
        queries.append(" ".join(picked) + str(rng.choice(["", "?", " !"])))
    return passages, queries


# ---------------------------------------------------------------------------------------------
# Backends: build(passages) -> searcher; searcher(queries, k) -> rows (n, k) with -1 padding
# ---------------------------------------------------------------------------------------------

Searcher = Callable[[list[str], int], tuple[np.ndarray, np.ndarray]]  # rows, scores


def build_agentgym(backend: str, workdir: Path) -> Callable[[list[str]], Searcher]:
    def build(passages: list[str]) -> Searcher:
        path = workdir / f"{backend}-{len(passages)}" if backend == "pyserini" else None
        index = BM25Index.build(passages, backend=backend, path=path)
        pruned.warm_up(block=True)  # time the compiled search, not the numpy one it starts with

        def search(queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
            return index.search(queries, k)

        search.index = index  # type: ignore[attr-defined]
        return search

    return build


def build_stock_bm25s(passages: list[str]) -> Searcher:
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("porter")
    tokens = bm25s.tokenize(passages, stopwords="en", stemmer=stemmer, show_progress=False)
    retriever = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    retriever.index(tokens, show_progress=False)

    def search(queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        query_tokens = bm25s.tokenize(queries, stopwords="en", stemmer=stemmer, show_progress=False)
        rows, scores = retriever.retrieve(query_tokens, k=k, show_progress=False)
        # stock bm25s returns zero-score documents too; Lucene returns only matches
        matched = scores > 0
        return np.where(matched, rows, -1).astype(np.int64), np.where(matched, scores, -np.inf)

    return search


# ---------------------------------------------------------------------------------------------
# Measures
# ---------------------------------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> tuple[float, float, float, object]:
    """Wall, process CPU and calling-thread CPU seconds of ``fn()``, and its result.

    Every backend searches on the calling thread (pyserini's through JNI), but the JVM's
    garbage collector runs on its own threads while that thread waits at a safepoint: process
    CPU time counts that work (and any JVM background work overlapping a call, such as JIT
    compilation), thread CPU time only the searching thread's. Builds are reported in process
    CPU time (indexing may use more threads), searches in thread CPU time; the JSON keeps both.
    """
    t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - h0, out


class _no_gc:
    """Collect garbage before a timed section and keep the collector off inside it, so that no
    backend pays for collecting another's objects."""

    def __enter__(self) -> None:
        gc.collect()
        gc.disable()

    def __exit__(self, *exc) -> None:
        gc.enable()


BATCH = 50


def warm_until_steady(
    search: Searcher, queries: list[str], *, tol: float = 0.1, max_passes: int = 40
) -> int:
    """Search ``queries`` (in batches, then one by one) until the last three passes' thread
    CPU times agree within ``tol``, at most ``max_passes`` passes; returns the passes run.

    Lucene's JIT keeps compiling for hundreds of queries: with a fixed three passes the
    pyserini figure still fell by a third over the timed repeats that followed."""
    times: list[float] = []
    for passes in range(1, max_passes + 1):
        t0 = time.thread_time()
        for start in range(0, len(queries), BATCH):
            search(queries[start : start + BATCH], 10)
        for q in queries:
            search([q], 10)
        times.append(time.thread_time() - t0)
        last = times[-3:]
        if len(last) == 3 and max(last) <= (1 + tol) * min(last):
            return passes
    return max_passes


def latency(
    searchers: dict[str, Searcher], queries: list[str], single: list[str]
) -> dict[str, dict[str, float]]:
    """Per backend: mean per-query time in batches of ``BATCH`` queries per call (median over
    the batches, which keeps bursts of load from other processes out), and single-query
    mean/median/p99, in ms, wall clock; the same in process CPU time (``*_cpu_*``) and in the
    searching thread's CPU time (``*_thread_cpu_*``). The backends take turns batch by batch and query by query, so load drift
    falls on all alike. Query costs are skewed (a query of common words touches most
    documents), so compare the batched figure with the single-query mean, not the median."""
    names = list(searchers)
    kinds = ("wall", "cpu", "thread_cpu")
    per_batch = {(name, kind): [] for name in names for kind in kinds}
    per_query = {(name, kind): [] for name in names for kind in kinds}
    with _no_gc():
        for i, start in enumerate(range(0, len(queries) - BATCH + 1, BATCH)):
            batch = queries[start : start + BATCH]
            for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate who leads
                *clocks, _ = timed(lambda f=searchers[name], b=batch: f(b, 10))
                for kind, seconds in zip(kinds, clocks, strict=True):
                    per_batch[name, kind].append(seconds / BATCH)
    with _no_gc():
        for i, q in enumerate(single):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                *clocks, _ = timed(lambda f=searchers[name], q=q: f([q], 10))
                for kind, seconds in zip(kinds, clocks, strict=True):
                    per_query[name, kind].append(seconds)
    out = {}
    for name in names:
        wall = per_query[name, "wall"]
        out[name] = {
            "batched_ms_per_query": 1e3 * statistics.median(per_batch[name, "wall"]),
            "single_mean_ms": 1e3 * statistics.fmean(wall),
            "single_median_ms": 1e3 * statistics.median(wall),
            "single_p99_ms": 1e3 * float(np.percentile(wall, 99)),
        }
        for kind in ("cpu", "thread_cpu"):
            out[name] |= {
                f"batched_{kind}_ms_per_query": 1e3 * statistics.median(per_batch[name, kind]),
                f"single_{kind}_mean_ms": 1e3 * statistics.fmean(per_query[name, kind]),
                f"single_{kind}_median_ms": 1e3 * statistics.median(per_query[name, kind]),
            }
    return out


#: the measures a repeat gives per-repeat ratios for: wall clock, process CPU, thread CPU keys
RATIO_KEYS = {
    "build": ("build_s", "build_cpu_s", None),
    "batched": (
        "batched_ms_per_query",
        "batched_cpu_ms_per_query",
        "batched_thread_cpu_ms_per_query",
    ),
    "single": ("single_median_ms", "single_cpu_median_ms", "single_thread_cpu_median_ms"),
}


def agreement(ref: tuple[np.ndarray, np.ndarray], got: tuple[np.ndarray, np.ndarray], tol=2e-4):
    """Shares of queries whose top-k rows are identical to the reference's, the same up to ties
    (a row may be missing from the other list only if its score is within ``tol`` of that list's
    cut-off score: Anserini rounds to 1e-4), and the mean overlap of the row sets."""
    identical = up_to_ties = 0
    overlap = []
    for ra, sa, rb, sb in zip(*ref, *got, strict=True):
        na, nb = int((ra >= 0).sum()), int((rb >= 0).sum())
        set_a, set_b = set(ra[:na].tolist()), set(rb[:nb].tolist())
        identical += bool((ra == rb).all())
        overlap.append(len(set_a & set_b) / len(set_a) if set_a else float(not set_b))
        ok = na == nb
        for rows, scores, other, n_other, other_scores in (
            (ra[:na], sa[:na], set_b, nb, sb),
            (rb[:nb], sb[:nb], set_a, na, sa),
        ):
            cutoff = other_scores[n_other - 1] if n_other else np.inf
            ok = ok and all(
                r in other or abs(s - cutoff) <= tol
                for r, s in zip(rows.tolist(), scores.tolist(), strict=True)
            )
        up_to_ties += ok
    n_q = len(ref[0])
    return identical / n_q, up_to_ties / n_q, float(np.mean(overlap))


def lucene_exact_gap(lucene_index: BM25Index, ours: BM25Index, queries: list[str]) -> float:
    """Largest relative difference between our scores and Lucene's unrounded float scores."""
    from agentgym.retrieval.sparse import lucene_float_scores

    rows, scores = ours.search(queries, 10)
    worst = 0.0
    for i, exact in enumerate(lucene_float_scores(lucene_index, queries, 10)):
        for r, s in zip(rows[i].tolist(), scores[i].tolist(), strict=True):
            if r in exact:
                worst = max(worst, abs(exact[r] - s) / exact[r])
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--queries", type=int, default=2000, help="queries per corpus")
    parser.add_argument("--single", type=int, default=500, help="queries timed one at a time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-pyserini", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    pruned.warm_up(block=True)  # compile the pruned search once, outside every timed build
    workdir = Path(tempfile.mkdtemp(prefix="bench-bm25-"))
    backends: dict[str, Callable[[list[str]], Searcher]] = {
        "agentgym-bm25s": build_agentgym("bm25s", workdir),
        "stock-bm25s": build_stock_bm25s,
    }
    versions = {}
    if not args.no_pyserini:
        from agentgym.retrieval.java import ensure_java, java_version

        versions["java"] = ".".join(map(str, java_version(ensure_java()) or ()))
        backends["agentgym-pyserini"] = build_agentgym("pyserini", workdir)
    import bm25s

    versions["bm25s"] = bm25s.__version__
    load_before = os.getloadavg()[0]
    results: dict = {
        "command": "python benchmarks/bench_bm25.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if k not in ("out", "no_pyserini")
        )
        + (" --no-pyserini" if args.no_pyserini else ""),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **versions},
        "timing": "backends alternate within each repeat (builds in turn, then searches batch "
        "by batch and query by query); wall clock, process CPU time (*_cpu_*: counts the "
        "in-process JVM's threads, its garbage collector included, for pyserini) and the "
        "searching thread's CPU time (*_thread_cpu_*); garbage collected before each timed "
        "section and off inside it; ratios_per_repeat: peer / agentgym-bm25s per repeat, "
        "medians over repeats; every index is searched untimed until its CPU time per pass is "
        "steady (3 passes within 10%) before it is timed",
        "repeats": args.repeats,
        "sizes": {},
    }
    try:
        # untimed: start the JVM and let the JIT compile the indexer and the searcher on a
        # small corpus of its own, so that no timed build or search pays for either
        warm_passages, warm_queries = generate_corpus(2000, 300, seed=1)
        for name, build in backends.items():
            search = build(warm_passages)
            passes = warm_until_steady(search, warm_queries)
            print(f"warm-up: {name} steady after {passes} passes", flush=True)
            if getattr(search, "index", None) is not None:
                search.index.close()  # type: ignore[attr-defined]
        for n in args.sizes:
            passages, all_queries = generate_corpus(n, args.queries + 100, seed=n)
            # warm-up queries are disjoint from the timed ones (caches, JIT)
            warmup, queries = all_queries[:100], all_queries[100:]
            single = queries[: args.single]
            print(f"\n== {n:,} passages, {len(queries)} queries ==", flush=True)
            per_backend: dict[str, dict] = {}
            searchers: dict[str, Searcher] = {}
            runs: dict[str, list] = {name: [] for name in backends}
            for _ in range(args.repeats):  # interleaved repeats
                builds = {}
                for name, build in backends.items():
                    last = searchers.pop(name, None)  # the last repeat's index goes first
                    if getattr(last, "index", None) is not None:
                        last.index.close()  # type: ignore[union-attr]
                    with _no_gc():
                        build_s, build_cpu_s, _, search = timed(
                            lambda build=build, p=passages: build(p)
                        )
                    warm_until_steady(search, warmup)  # this index's caches, the JIT's
                    builds[name] = {"build_s": build_s, "build_cpu_s": build_cpu_s}
                    searchers[name] = search
                for name, figures in latency(searchers, queries, single).items():
                    runs[name].append({**builds[name], **figures})
            for name, rs in runs.items():
                med = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
                med["build_docs_per_s"] = n / med["build_s"]
                per_backend[name] = med
                print(
                    f"{name:18s} build {med['build_s']:7.2f} s ({med['build_docs_per_s']:9,.0f} "
                    f"docs/s, CPU {med['build_cpu_s']:7.2f} s)  batched "
                    f"{med['batched_ms_per_query']:6.3f} ms/q (CPU "
                    f"{med['batched_cpu_ms_per_query']:6.3f})  single mean "
                    f"{med['single_mean_ms']:6.3f} median {med['single_median_ms']:6.3f} (CPU "
                    f"{med['single_cpu_median_ms']:6.3f}) p99 {med['single_p99_ms']:6.3f} ms",
                    flush=True,
                )
            entry: dict = {"backends": per_backend, "runs": runs}
            # each repeat's ratio peer / ours (the backends alternate within a repeat), in wall
            # clock and in process CPU time; medians over repeats
            per_repeat: dict = {}
            for peer in ("stock-bm25s", "agentgym-pyserini"):
                if peer not in runs:
                    continue
                for measure, keys in RATIO_KEYS.items():
                    for clock, key in zip(("wall", "cpu", "thread_cpu"), keys, strict=True):
                        if key is None:
                            continue
                        ratios = [
                            theirs[key] / ours[key]
                            for theirs, ours in zip(runs[peer], runs["agentgym-bm25s"], strict=True)
                        ]
                        per_repeat.setdefault(peer, {})[f"{measure}_{clock}"] = {
                            "median": statistics.median(ratios),
                            "repeats": ratios,
                        }
            entry["ratios_per_repeat"] = per_repeat
            ours = per_backend["agentgym-bm25s"]
            ratios = {}
            for peer in ("stock-bm25s", "agentgym-pyserini"):
                if peer in per_backend:
                    p = per_backend[peer]
                    ratios[f"vs {peer}"] = {
                        "build_speedup": p["build_s"] / ours["build_s"],
                        "batched_search_speedup": p["batched_ms_per_query"]
                        / ours["batched_ms_per_query"],
                        "single_search_speedup": p["single_median_ms"] / ours["single_median_ms"],
                    }
            entry["ratios"] = ratios
            if "agentgym-pyserini" in searchers:
                lucene_index = searchers["agentgym-pyserini"].index  # type: ignore[attr-defined]
                ours_index = searchers["agentgym-bm25s"].index  # type: ignore[attr-defined]
                exact_len = BM25Index._build_bm25s(
                    passages, k1=0.9, b=0.4, show_progress=False, exact_lengths=True
                )
                fidelity = {}
                for k in (10, 50):
                    ref = lucene_index.search(queries, k)
                    candidates = {
                        "agentgym-bm25s": ours_index.search(queries, k),
                        "agentgym-bm25s, no length rounding": exact_len.search(queries, k),
                        "stock-bm25s": searchers["stock-bm25s"](queries, k),
                    }
                    for name, got in candidates.items():
                        ident, ties, overlap = agreement(ref, got)
                        fidelity.setdefault(name, {})[f"top{k}"] = {
                            "identical": ident,
                            "same_up_to_ties": ties,
                            "mean_overlap": overlap,
                        }
                        print(
                            f"  vs pyserini top-{k}: {name:36s} identical {ident:6.1%}  "
                            f"up to ties {ties:6.1%}  overlap {overlap:6.1%}"
                        )
                gap = lucene_exact_gap(lucene_index, ours_index, queries[:200])
                fidelity["agentgym-bm25s"]["max_rel_score_diff_vs_lucene_float"] = gap
                print(f"  largest relative score difference vs Lucene's float scores: {gap:.2e}")
                entry["fidelity_vs_pyserini"] = fidelity
                for s in searchers.values():
                    index = getattr(s, "index", None)
                    if index is not None:
                        index.close()
            results["sizes"][str(n)] = entry
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["load_average_1min_before_after"] = [load_before, os.getloadavg()[0]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
