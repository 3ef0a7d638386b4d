"""WebShop: agentgym's WebShopEnv, timed and checked against stock WebShop's own text env.

Measures (medians over ``--repeats`` runs; ratios against stock measured in the same run).
Step times come as per-call medians and as total-time ratios (all steps, or all resets and
steps, of a repeat summed, stock / ours; median over repeats): a rollout's wall clock follows
the total, which the slow purchase steps weigh on and a median hides.

(a) parity + step time vs stock: stock WebShop's ``WebAgentTextEnv(observation_mode="text")``,
    run from a WebShop checkout (``--webshop-src``) with its own code, templates and a Lucene
    index of its own documents, and ours, on the same goals with the same actions (ours'
    admissible clicks and searches from a pool of goal words; 10% invalid actions). Every
    observation, every ``get_available_actions()``, every purchase reward and the top-50 ranking
    of every search (ours as our engine made it; equal scores in Anserini's asin order) is
    compared; the mismatch count must be 0. Stock's prices are unseeded draws from the global ``random``, so it
    runs after ``random.seed(<our price seed>)``: the same draws our loader makes.
(b) ours alone: random-policy step and reset time (median, p99) on the 1000-product catalogue
    with the bm25s backend, memo of repeated queries included (as in training).
(c) search latency, one query per call, memo bypassed: bm25s and pyserini (median, p99), the
    two backends alternating query by query; per repeat, the total wall and process CPU time of
    each backend's calls and their pyserini / bm25s ratios (median over repeats). pyserini's
    process CPU includes its JVM's JIT and GC threads, charged to whichever call they overlap.
(d) memory: RSS of a fresh process holding 1 env, and 128 envs; verl-agent's layout (one env per
    process, each loading its own catalogue and index) is 128 x the one-env process. Stock's
    one-env process is measured too when it can run.
(e) search latency (bm25s; pyserini with --pyserini-sizes) against catalogue size on generated
    catalogues of 1k, 10k and 100k products, timed as in (c).

Garbage collection: both sides of (a) share one heap, as do the backends of (c) and (e), so a
full collection (mostly of stock's objects) would be paid by whichever call runs when it
triggers. The collector runs between timed sections (each episode, each repeat) and is off
inside them.

Stock WebShop pins Python 3.8-era packages (gym 0.24, Flask 2.1, pyserini 0.17 on Java 11,
spaCy 3.3). It runs here on Python 3.11 with small shims, none of which touch what is measured:
``gym`` is gymnasium, the unused ``cleantext`` / ``rank_bm25`` imports are stubs, its index is
built by pyserini 1.x (Lucene 10, Java 21+) from the documents its conversion script writes, and
spaCy 3.8's ``en_core_web_sm`` stands in for 3.3's (``--spacy-model``, which our reward then
uses too). Without a checkout (and bs4, Flask, thefuzz, torch), part (a) is skipped.

    python benchmarks/bench_webshop.py --webshop-src ~/WebShop --skip vs_stock --repeats 5 \
        --queries 2000                             # parts (b)-(e): writes results/webshop.json
    python benchmarks/bench_webshop.py --webshop-src ~/WebShop --only-stock --episodes 40 \
        --repeats 5 --out benchmarks/results/webshop_vs_stock.json
    python benchmarks/bench_webshop.py --quick --out /tmp/webshop.json     # a smoke run

Part (a)'s totals come in process CPU time too (``time.process_time_ns`` around each call,
stock's JVM threads included). ``python benchmarks/make_tables.py`` regenerates the README tables
from the written results.

A WebShop checkout: ``git clone https://github.com/princeton-nlp/WebShop``.
"""

from __future__ import annotations

import argparse
import gc
import json
import lzma
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

from agentgym.envs import entry
from agentgym.io import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AGENTGYM_SHARED_DATA", REPO / ".." / "shared" / "data"))
INVALID = ["click[nothing here]", "buy[now]", "search[]", "click[search]"]


def _stats(samples_ns: list[int]) -> dict[str, float]:
    a = np.asarray(samples_ns, dtype=np.float64) / 1e6
    return {
        "median_ms": round(float(np.median(a)), 4),
        "p99_ms": round(float(np.percentile(a, 99)), 4),
        "n": len(a),
    }


def _median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(r["median_ms"] for r in runs), 4),
        "p99_ms": round(statistics.median(r["p99_ms"] for r in runs), 4),
        "n": runs[0]["n"],
        "repeats": len(runs),
    }


def _data_dir(arg: str | None, tmp: Path) -> Path:
    if arg or os.environ.get("WEBSHOP_DATA"):
        return Path(arg or os.environ["WEBSHOP_DATA"])
    archives = sorted((SHARED / "webshop").glob("*.json.xz"))
    tmp.mkdir(parents=True, exist_ok=True)
    if not archives:
        sys.exit("no WebShop data: pass --data DIR, set WEBSHOP_DATA, or provide " + str(SHARED))
    for a in archives:
        (tmp / a.name[:-3]).write_bytes(lzma.decompress(a.read_bytes()))
    return tmp


# -- stock WebShop, from a checkout ----------------------------------------------------------------
def load_stock_env(src: Path, data_dir: Path, work: Path, price_seed: int, spacy_model: str | None):
    """Stock ``WebAgentTextEnv`` on the small catalogue (see the module docstring's shims)."""
    import gymnasium

    sys.modules.setdefault("gym", gymnasium)
    sys.modules.setdefault("cleantext", types.ModuleType("cleantext"))
    rank_bm25 = types.ModuleType("rank_bm25")
    rank_bm25.BM25Okapi = None
    sys.modules.setdefault("rank_bm25", rank_bm25)
    if spacy_model:
        import spacy

        load = spacy.load
        spacy.load = lambda name, *a, **k: load(
            spacy_model if name == "en_core_web_sm" else name, *a, **k
        )
    # pyserini.search imports its OpenAI encoder, whose module builds an API client at import
    openai_stub = types.ModuleType("pyserini.encode._openai")
    openai_stub.OpenAiDocumentEncoder = openai_stub.OpenAiQueryEncoder = None
    openai_stub.OPENAI_API_RETRY_DELAY = 0
    sys.modules.setdefault("pyserini.encode._openai", openai_stub)
    sys.path.insert(0, str(src))
    envs_pkg = types.ModuleType("web_agent_site.envs")  # skip its selenium env and gym registry
    envs_pkg.__path__ = [str(src / "web_agent_site" / "envs")]
    sys.modules["web_agent_site.envs"] = envs_pkg

    from agentgym.retrieval.java import ensure_java

    ensure_java()
    import web_agent_site.engine.engine as engine
    from pyserini.index.lucene import LuceneIndexer
    from pyserini.search.lucene import LuceneSearcher

    from agentgym.envs.webshop.data import search_text

    work = work / "stock"  # (not beside the data: an items_human_ins.json there means human goals)
    work.mkdir(parents=True, exist_ok=True)
    human = work / "items_human_ins.json"  # load_products opens it even for synthetic goals
    human.write_text("{}")
    engine.DEFAULT_ATTR_PATH = str(data_dir / "items_ins_v2_1000.json")
    engine.HUMAN_ATTR_PATH = str(human)
    product_file = str(data_dir / "items_shuffle_1000.json")
    index_dir = work / "stock_index"
    if not index_dir.is_dir():  # convert_product_file_format.py + run_indexing.sh
        products, *_ = engine.load_products(product_file, human_goals=False)
        flags = ["-index", str(index_dir), "-storePositions", "-storeDocvectors", "-storeRaw"]
        indexer = LuceneIndexer(args=flags, threads=1)
        for p in products:
            indexer.add_doc_dict({"id": p["asin"], "contents": search_text(p)})
        indexer.close()
    import web_agent_site.envs.web_agent_text_env as wte

    wte.init_search_engine = lambda num_products=None: LuceneSearcher(str(index_dir))
    random.seed(price_seed)  # stock draws its prices from the global random right after this
    return wte.WebAgentTextEnv(
        observation_mode="text", file_path=product_file, num_products=None, human_goals=False
    )


def _query_pool(goal: dict, rng: random.Random) -> str:
    words = goal["instruction_text"].lower().replace(",", " ").split()
    choice = rng.random()
    if choice < 0.4:
        return goal["query"]
    if choice < 0.8:
        return " ".join(words[: rng.randint(3, min(12, len(words)))])
    return " ".join(rng.sample(words, min(3, len(words))))


def _expert_action(info: dict) -> str:
    """Walk to the goal's product, choose its options, buy (purchases with real rewards)."""
    goal, page = info["goal"], info["page"]
    clickables = info["available_actions"]["clickables"]
    asin = goal["asin"].lower()
    if page == "search":
        return f"search[{goal['instruction_text'].lower()}]"
    if page == "results":
        if asin in clickables:
            return f"click[{asin}]"
        return "click[next >]" if info["state_key"][3] < 5 else "click[back to search]"
    if page == "item" and info["state_key"][4].lower() == asin:
        chosen = dict(info["state_key"][5])
        for name, value in goal["goal_options"].items():
            if chosen.get(name) != value and value in clickables:
                return f"click[{value}]"
        return "click[buy now]"
    return "click[< prev]"


def _stock_top50(stock, query: str) -> list[str]:
    engine = stock.server.search_engine
    return [json.loads(engine.doc(h.docid).raw())["id"] for h in engine.search(query, k=50)]


def bench_vs_stock(args, data_dir: Path, work: Path) -> dict:
    from agentgym.envs.webshop import WebShopEnv, parse_action
    from agentgym.envs.webshop.data import DEFAULT_SEED

    stock = load_stock_env(
        Path(args.webshop_src), data_dir, work, DEFAULT_SEED, args.spacy_model or None
    )
    t = time.perf_counter()  # loads the catalogue, its index and its title nouns (once)
    ours = WebShopEnv(data_dir=data_dir, goals="synthetic", max_episode_steps=None)
    ours_load_s = time.perf_counter() - t
    cat = ours.catalogue
    mismatches: list[str] = []
    stock_step, ours_step, stock_reset, ours_reset = [], [], [], []
    stock_buy, ours_buy = [], []  # purchase steps: where the reward (and spaCy) runs
    totals: dict[str, list[float]] = {"steps": [], "episodes": []}
    # the same sums in process CPU time (stock's JVM threads included): what the calls cost,
    # whatever else the cores run
    cpu_totals: dict[str, list[float]] = {"steps": [], "episodes": []}
    cpu_seconds: list[dict[str, float]] = []
    cpu_clock = time.process_time_ns
    compared = purchases = ranking_mismatches = searches = 0
    rewards: list[float] = []
    # each repeat plays other goals and queries (seeded by the repeat), so no memo is warmed by
    # an earlier repeat; stock and ours alternate call by call. Both share one heap: the
    # collector runs between episodes and is off inside them (see the module docstring)
    gc.disable()
    for repeat, episode in ((r, e) for r in range(args.repeats) for e in range(args.episodes)):
        if episode == 0:
            rng = random.Random(repeat)
            first = (len(stock_step), len(ours_step), len(stock_reset), len(ours_reset))
            cpu = {"stock_step": 0, "ours_step": 0, "stock_reset": 0, "ours_reset": 0}
        expert = episode % 3 == 0
        goal_index = rng.randrange(len(cat.goals))
        gc.collect()
        t, c = time.perf_counter_ns(), cpu_clock()
        s_obs, _ = stock.reset(session=goal_index)
        stock_reset.append(time.perf_counter_ns() - t)
        cpu["stock_reset"] += cpu_clock() - c
        t, c = time.perf_counter_ns(), cpu_clock()
        o_obs, info = ours.reset(options={"task": goal_index})
        ours_reset.append(time.perf_counter_ns() - t)
        cpu["ours_reset"] += cpu_clock() - c
        if s_obs != o_obs:
            mismatches.append(f"goal {goal_index} reset: {s_obs[:200]!r} != {o_obs[:200]!r}")
        for _ in range(args.steps):
            valid = True
            if expert:
                action = _expert_action(info)
            elif rng.random() < 0.1:
                action, valid = rng.choice(INVALID), False
            else:
                action = rng.choice(info["admissible_actions"])
                if action.startswith("search["):
                    action = f"search[{_query_pool(info['goal'], rng)}]"
                # lean on buying late, so that most episodes see several pages
                if action == "click[buy now]" and rng.random() < 0.5:
                    action = "click[< prev]"
            t, c = time.perf_counter_ns(), cpu_clock()
            s_obs, s_reward, s_done, _ = stock.step(action)
            stock_step.append(time.perf_counter_ns() - t)
            cpu["stock_step"] += cpu_clock() - c
            t, c = time.perf_counter_ns(), cpu_clock()
            o_obs, _, o_done, _, info = ours.step(action)
            ours_step.append(time.perf_counter_ns() - t)
            cpu["ours_step"] += cpu_clock() - c
            if s_done or o_done:
                stock_buy.append(stock_step[-1])
                ours_buy.append(ours_step[-1])
            compared += 1
            where = f"goal {goal_index} {action!r}"
            if valid and action.startswith("search["):
                query = parse_action(action)[1].lower()
                searches += 1
                # our own order, as the env produced it: Anserini's (score, then asin) order
                stock_rows = [cat.row_of_asin[a] for a in _stock_top50(stock, query)]
                if stock_rows != ours._results.tolist():
                    mismatches.append(f"{where}: ranking {stock_rows} != {ours._results.tolist()}")
                    ranking_mismatches += 1
            if valid and s_obs != o_obs:
                mismatches.append(f"{where}: obs {s_obs[:300]!r} != {o_obs[:300]!r}")
            if valid != info["action_valid"]:
                mismatches.append(f"{where}: valid={info['action_valid']}")
            if not s_done:
                avail = stock.get_available_actions()
                if avail != info["available_actions"]:
                    mismatches.append(f"{where}: available {avail} != {info['available_actions']}")
            if s_done != o_done:
                mismatches.append(f"{where}: done {s_done} != {o_done}")
            if s_done:
                purchases += 1
                rewards.append(s_reward)
                if s_reward != info["score"]:
                    mismatches.append(f"{where}: reward {s_reward} != {info['score']}")
                break
        if episode == args.episodes - 1:
            # total time of this repeat, stock / ours: what a rollout's wall clock follows
            s_steps, o_steps = sum(stock_step[first[0] :]), sum(ours_step[first[1] :])
            s_resets, o_resets = sum(stock_reset[first[2] :]), sum(ours_reset[first[3] :])
            totals["steps"].append(s_steps / o_steps)
            totals["episodes"].append((s_steps + s_resets) / (o_steps + o_resets))
            cpu_seconds.append({k: v / 1e9 for k, v in cpu.items()})
            cpu_totals["steps"].append(cpu["stock_step"] / cpu["ours_step"])
            cpu_totals["episodes"].append(
                (cpu["stock_step"] + cpu["stock_reset"]) / (cpu["ours_step"] + cpu["ours_reset"])
            )
            print(
                f"  repeat {repeat + 1}/{args.repeats}: total-time ratio, steps "
                f"{totals['steps'][-1]:.0f}x (CPU {cpu_totals['steps'][-1]:.0f}x), resets + "
                f"steps {totals['episodes'][-1]:.0f}x (CPU {cpu_totals['episodes'][-1]:.0f}x)",
                flush=True,
            )
    gc.enable()
    s_step, o_step = _stats(stock_step), _stats(ours_step)
    s_reset, o_reset = _stats(stock_reset), _stats(ours_reset)
    s_buy, o_buy = _stats(stock_buy), _stats(ours_buy)
    return {
        "episodes": args.episodes,
        "repeats": args.repeats,
        "steps_compared": compared,
        "purchases_compared": purchases,
        "purchase_rewards_seen": sorted({round(r, 4) for r in rewards}),
        "mismatches": len(mismatches),
        "mismatch_examples": mismatches[:5],
        "searches_compared": searches,
        "searches_with_another_top50": ranking_mismatches,
        "stock_step": s_step,
        "ours_step": o_step,
        "step_speedup_median": round(s_step["median_ms"] / o_step["median_ms"], 1),
        "stock_reset": s_reset,
        "ours_reset": o_reset,
        "reset_speedup_median": round(s_reset["median_ms"] / o_reset["median_ms"], 1),
        "stock_buy_step": {**s_buy, "max_ms": round(max(stock_buy) / 1e6, 3)},
        "ours_buy_step": {**o_buy, "max_ms": round(max(ours_buy) / 1e6, 3)},
        "buy_step_speedup_median": round(s_buy["median_ms"] / o_buy["median_ms"], 1),
        # summed over each repeat's interleaved calls, median over repeats
        "step_total_time_ratio": round(statistics.median(totals["steps"]), 1),
        "episode_total_time_ratio": round(statistics.median(totals["episodes"]), 1),
        "total_time_ratios_per_repeat": totals,
        # the same ratios in process CPU time (time.process_time_ns around each call)
        "step_total_cpu_ratio": round(statistics.median(cpu_totals["steps"]), 1),
        "episode_total_cpu_ratio": round(statistics.median(cpu_totals["episodes"]), 1),
        "total_cpu_ratios_per_repeat": cpu_totals,
        "cpu_seconds_per_repeat": cpu_seconds,
        "ours_env_load_s": round(ours_load_s, 2),
    }


# -- ours alone --------------------------------------------------------------------------------
def _random_policy_times(env, steps: int, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    step_ns, reset_ns = [], []
    t = time.perf_counter_ns()
    _, info = env.reset(seed=seed)
    reset_ns.append(time.perf_counter_ns() - t)
    for _ in range(steps):
        action = rng.choice(info["admissible_actions"])
        if action.startswith("search["):
            action = f"search[{_query_pool(info['goal'], rng)}]"
        t = time.perf_counter_ns()
        _, _, term, trunc, info = env.step(action)
        step_ns.append(time.perf_counter_ns() - t)
        if term or trunc:
            t = time.perf_counter_ns()
            _, info = env.reset()
            reset_ns.append(time.perf_counter_ns() - t)
    return step_ns, reset_ns


def bench_ours(args, data_dir: Path) -> dict:
    from agentgym.envs.webshop import WebShopEnv

    cap = entry("AgentGym/WebShop-v0").max_episode_steps  # episodes as gym.make plays them
    env = WebShopEnv(data_dir=data_dir, max_episode_steps=cap)
    _random_policy_times(env, 200, seed=99)  # warm-up
    steps, resets = [], []
    for r in range(args.repeats):
        s, z = _random_policy_times(env, args.policy_steps, seed=r)
        steps.append(_stats(s))
        resets.append(_stats(z))
    return {"step": _median_of(steps), "reset": _median_of(resets), "backend": "bm25s"}


def _interleaved_search(searches: dict, queries: list[str], repeats: int) -> dict:
    """Each query through every backend in ``searches`` (one query per ``search_many`` call, so
    the memo is bypassed), the backends' order alternating query by query; ``repeats`` passes.
    Per backend: per-call wall medians and p99 (median over repeats) and each repeat's total
    wall and process CPU seconds; then, per repeat, the first backend's totals over the last's."""
    for search in searches.values():  # warm-up, one query per call: Lucene's JIT needs hundreds
        for q in queries[:500]:
            search.search_many([q])
    names = list(searches)
    wall_clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    totals: dict[str, dict[str, list[float]]] = {n: {"wall_s": [], "cpu_s": []} for n in names}
    for _ in range(repeats):
        times: dict[str, list[int]] = {n: [] for n in names}
        cpu = dict.fromkeys(names, 0)
        gc.collect()
        gc.disable()  # no collection inside the timed calls (see the module docstring)
        for i, q in enumerate(queries):
            for name in names if i % 2 == 0 else names[::-1]:
                t, c = wall_clock(), cpu_clock()
                searches[name].search_many([q])
                times[name].append(wall_clock() - t)
                cpu[name] += cpu_clock() - c
        gc.enable()
        for name in names:
            runs[name].append(_stats(times[name]))
            totals[name]["wall_s"].append(sum(times[name]) / 1e9)
            totals[name]["cpu_s"].append(cpu[name] / 1e9)
    out: dict = {n: {**_median_of(runs[n]), "total_s_per_repeat": totals[n]} for n in names}
    if len(names) == 2:
        peer, ours = (totals[n] for n in names)
        wall = [a / b for a, b in zip(peer["wall_s"], ours["wall_s"], strict=True)]
        cpu_r = [a / b for a, b in zip(peer["cpu_s"], ours["cpu_s"], strict=True)]
        out[f"{names[0]}_over_{names[1]}_median"] = round(
            out[names[0]]["median_ms"] / out[names[1]]["median_ms"], 2
        )
        out["total_time_ratio"] = round(statistics.median(wall), 2)
        out["total_time_ratios_per_repeat"] = [round(r, 3) for r in wall]
        out["total_cpu_ratio"] = round(statistics.median(cpu_r), 2)
        out["total_cpu_ratios_per_repeat"] = [round(r, 3) for r in cpu_r]
    return out


def bench_search(args, data_dir: Path, work: Path) -> dict:
    from agentgym.envs.webshop import load_catalogue
    from agentgym.envs.webshop.search import ProductSearch

    cat = load_catalogue(data_dir)
    goals = cat.goals  # cycled when --queries is larger
    queries = [goals[i % len(goals)]["instruction_text"].lower() for i in range(args.queries)]
    searches = {
        backend: ProductSearch(cat, backend, cache_dir=work / "indexes", persist=True)
        for backend in ("pyserini", "bm25s")
    }
    return _interleaved_search(searches, queries, args.repeats)


def bench_scaling(args, work: Path) -> dict:
    from agentgym.envs.webshop import load_catalogue
    from agentgym.envs.webshop.search import ProductSearch

    out = {}
    for n in args.sizes:
        cat = load_catalogue(synthetic=True, num_products=n)
        rng = random.Random(n)
        queries = [
            _query_pool(cat.goals[rng.randrange(len(cat.goals))], rng) for _ in range(args.queries)
        ]
        row = {}
        t = time.perf_counter()
        searches = {"bm25s": ProductSearch(cat, "bm25s", persist=False)}
        row["bm25s_build_s"] = round(time.perf_counter() - t, 2)
        if n in args.pyserini_sizes:
            t = time.perf_counter()
            lucene = ProductSearch(cat, "pyserini", cache_dir=work / f"scale{n}", persist=True)
            row["pyserini_build_s"] = round(time.perf_counter() - t, 2)
            searches = {"pyserini": lucene, **searches}
        row.update(_interleaved_search(searches, queries, args.repeats))
        out[str(n)] = row
    return out


# -- memory, in fresh processes ------------------------------------------------------------------
_RSS = """
import json, resource, sys
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
"""


def _run_json(code: str, env: dict | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_memory(args, data_dir: Path, work: Path) -> dict:
    make = (
        "from agentgym.envs.webshop import WebShopEnv\n"
        "from agentgym.envs.webshop.nouns import default_noun_extractor\n"
        "default_noun_extractor()\n"
        "base = rss()\n"
        f"envs = [WebShopEnv(data_dir={str(data_dir)!r}) for _ in range(N)]\n"
        "for i, e in enumerate(envs):\n"
        "    _, info = e.reset(seed=i)\n"
        "    for a in ['search[' + info['goal']['query'] + ']', 'click[next >]']:\n"
        "        e.step(a)\n"
        "print(json.dumps({'base': base, 'after': rss()}))\n"
    )
    env = dict(os.environ, AGENTGYM_CACHE=str(work / "cache"))
    one = _run_json(_RSS + "N = 1\n" + make, env)
    many = _run_json(_RSS + "N = 128\n" + make, env)
    one_mb = one["after"] / 1e6
    out = {
        "one_env_process_rss_mb": round(one_mb, 1),
        "envs_128_process_rss_mb": round(many["after"] / 1e6, 1),
        "one_env_growth_mb": round((one["after"] - one["base"]) / 1e6, 1),
        "envs_128_growth_mb": round((many["after"] - many["base"]) / 1e6, 1),
        "verl_agent_layout_128_processes_rss_mb": round(128 * one_mb, 1),
    }
    out["envs_128_over_one_env_growth"] = round(
        out["envs_128_growth_mb"] / out["one_env_growth_mb"], 3
    )
    out["envs_128_over_one_env_process"] = round(out["envs_128_process_rss_mb"] / one_mb, 3)
    if args.webshop_src:
        stock = _run_json(
            _RSS
            + f"sys.path.insert(0, {str(REPO / 'benchmarks')!r})\n"
            + "from bench_webshop import load_stock_env\n"
            + "import pathlib\n"
            + f"e = load_stock_env(pathlib.Path({args.webshop_src!r}), "
            + f"pathlib.Path({str(data_dir)!r}), pathlib.Path({str(work)!r}), 233, "
            + f"{args.spacy_model or None!r})\n"
            + "e.step('search[tea]')\n"
            + "print(json.dumps({'after': rss()}))\n"
        )
        out["stock_one_env_process_rss_mb"] = round(stock["after"] / 1e6, 1)
        out["stock_layout_128_processes_rss_mb"] = round(128 * stock["after"] / 1e6, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="WebShop data folder (default $WEBSHOP_DATA or ../shared/data)")
    ap.add_argument(
        "--webshop-src",
        default=os.environ.get("WEBSHOP_SRC"),
        help="a WebShop checkout (the folder holding web_agent_site/)",
    )
    ap.add_argument(
        "--spacy-model",
        default=str(SHARED / "spacy" / "en_core_web_sm-3.8.0"),
        help="spaCy model folder for both rewards ('' to leave each its default)",
    )
    ap.add_argument("--episodes", type=int, default=150)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--policy-steps", type=int, default=5000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--pyserini-sizes", type=int, nargs="*", default=[1000, 10000, 100000])
    ap.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["policy", "search", "memory", "scaling", "vs_stock"],
        help="parts not to run (vs_stock: part (a), which --only-stock runs alone)",
    )
    ap.add_argument("--quick", action="store_true", help="a smoke run (small everything)")
    ap.add_argument(
        "--only-stock",
        action="store_true",
        help="only part (a), the side-by-side run against stock WebShop",
    )
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "webshop.json"))
    args = ap.parse_args()  # fmt: skip
    if args.quick:
        args.episodes, args.policy_steps, args.queries, args.repeats = 10, 300, 30, 1
        args.sizes, args.pyserini_sizes = [1000, 10000], [1000]
    if args.spacy_model and Path(args.spacy_model).is_dir():
        os.environ["WEBSHOP_SPACY_MODEL"] = args.spacy_model  # our reward uses the same model
    else:
        args.spacy_model = ""

    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    results: dict = {
        "benchmark": "webshop",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": commit,
        "note": "shared machine: ratios are measured in the same run; absolute times vary with load",
        "load_average_1min_before": os.getloadavg()[0],
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "reward_noun_model": Path(args.spacy_model).name if args.spacy_model else "default",
    }
    with tempfile.TemporaryDirectory(prefix="webshop-bench-") as tmp:
        work = Path(tmp)
        data_dir = _data_dir(args.data, work / "data")
        skip = set(args.skip)
        if args.only_stock:
            skip |= {"policy", "search", "memory", "scaling"}
        if "policy" not in skip:
            print("ours: random policy ...", flush=True)
            results["ours_random_policy"] = bench_ours(args, data_dir)
        if "search" not in skip:
            print("search latency ...", flush=True)
            results["search_latency_small_catalogue"] = bench_search(args, data_dir, work)
        if "memory" not in skip:
            print("memory ...", flush=True)
            results["memory"] = bench_memory(args, data_dir, work)
        if "scaling" not in skip:
            print("scaling ...", flush=True)
            results["search_latency_vs_catalogue_size"] = bench_scaling(args, work)
        if "vs_stock" in skip:
            results["vs_stock"] = "skipped (--skip vs_stock)"
        elif args.webshop_src:
            print("parity and timing vs stock WebShop ...", flush=True)
            results["vs_stock"] = bench_vs_stock(args, data_dir, work)
        else:
            results["vs_stock"] = "skipped: pass --webshop-src (a WebShop checkout)"
        results["load_average_1min_after"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
