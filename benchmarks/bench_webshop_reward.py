"""WebShop's purchase reward: agentgym's ``webshop_reward`` against WebShop's own ``get_reward``.

Purchases: for each of ``--goals`` goals sampled from WebShop's synthetic goals (seeded), the
goal's own product bought with the goal's options, 3 products of the same category and 3 random
ones bought with the first value of each option, each at its catalogue price: 7 purchases a goal.

Measured, in the same run and on the same purchases:

* **fidelity**: WebShop's ``get_reward(..., verbose=True)`` against ``webshop_reward`` with spaCy
  nouns from the same model: the share of purchases whose total and every verbose part are equal;
* **fallback**: the share of purchases whose reward changes when the title nouns come from
  :class:`FallbackNouns` (or from every whitespace word) instead of the model;
* **speed**: wall and process CPU time per purchase, medians over ``--repeats`` rounds, and each
  round's WebShop / ours ratio in both clocks. A round interleaves the timers ``--chunk``
  purchases at a time (each timer plays a chunk, then the next), so WebShop and ours see the
  same stretch of load. WebShop runs its full spaCy pipeline on both titles at every purchase;
  ours memoises title nouns, so "warm" is the steady state of an env replaying its catalogue and
  "cold" starts every pass over a chunk from an empty noun memo (every title new but for the
  repeats within the chunk; the string caches of the fuzzy match stay warm). Each of our timers
  plays each chunk ``--ours-passes`` times (a cold timer with a new memo each pass) so that its
  share of a round is long enough to time under load. One unrecorded warm-up round precedes the
  timed ones; the garbage collector runs between timers' turns, not inside them.

The stock side needs a WebShop checkout (only ``web_agent_site/engine/goal.py`` and
``normalize.py`` are imported), ``thefuzz`` and ``rich`` installed, and the spaCy model: WebShop
loads ``en_core_web_sm`` by name at import, so the benchmark points that name at ``--spacy-model``
while importing it. Without a checkout only our side is timed.

Data: ``$WEBSHOP_DATA`` (WebShop's ``items_shuffle_1000.json`` and ``items_ins_v2_1000.json``), or
the ``.xz`` copies in ``../shared/data/webshop`` unpacked to a temporary folder. Writes
``benchmarks/results/webshop_reward.json`` and prints a table.

    python benchmarks/bench_webshop_reward.py --webshop PATH/TO/WebShop \\
        --spacy-model PATH/TO/en_core_web_sm-3.8.0 [--goals 200] [--repeats 3] [--seed 0]
        [--ours-passes 20]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import lzma
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from agentgym.envs.webshop.data import CATALOGUE_FILES, load_catalogue
from agentgym.envs.webshop.nouns import FallbackNouns, SpacyNouns
from agentgym.envs.webshop.reward import webshop_reward
from agentgym.io import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results" / "webshop_reward.json"
SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def load_small_catalogue(tmp: Path):
    """WebShop's 1000-product catalogue from $WEBSHOP_DATA, else from the shared .xz copies."""
    product_file, attr_file = CATALOGUE_FILES["small"]
    data_dir = os.environ.get("WEBSHOP_DATA")
    if not data_dir:
        xz_dir = SHARED_DATA / "webshop"
        if not (xz_dir / f"{product_file}.xz").is_file():
            sys.exit(
                "WebShop data not found: set WEBSHOP_DATA to the folder holding "
                f"{product_file} and {attr_file}"
            )
        for name in (product_file, attr_file):
            (tmp / name).write_bytes(lzma.open(xz_dir / f"{name}.xz").read())
        data_dir = str(tmp)
    return load_catalogue(data_dir, catalogue="small", goals="synthetic")


def make_purchases(catalogue, num_goals: int, seed: int) -> list[tuple]:
    """(goal, product, price, options) for the right product, 3 same-category and 3 random."""
    rng = random.Random(seed)
    by_category = defaultdict(list)
    for product in catalogue.products:
        by_category[product["category"]].append(product)
    purchases = []
    for goal in rng.sample(catalogue.goals, min(num_goals, len(catalogue.goals))):
        right = catalogue.product_by_asin[goal["asin"]]
        bought = [(right, dict(goal["goal_options"]))]
        for product in rng.sample(by_category[right["category"]], 3) + rng.sample(
            catalogue.products, 3
        ):
            bought.append((product, {k: v[0] for k, v in product["options"].items() if v}))
        for product, options in bought:
            purchases.append((goal, product, catalogue.product_prices[product["asin"]], options))
    return purchases


def import_stock_goal_module(webshop_dir: Path, spacy_model: Path):
    """WebShop's ``web_agent_site.engine.goal`` module, with its module-level ``spacy.load("en_core_web_sm")`` pointed
    at the model folder (the package name is not installable from the package index)."""
    import spacy

    real_load = spacy.load
    spacy.load = lambda name, *a, **kw: real_load(
        str(spacy_model) if name == "en_core_web_sm" else name, *a, **kw
    )
    sys.path.insert(0, str(webshop_dir))
    try:
        goal_module = importlib.import_module("web_agent_site.engine.goal")
    finally:
        spacy.load = real_load
        sys.path.remove(str(webshop_dir))
    return goal_module


class MemoisedPipeline:
    """A spaCy pipeline that returns the same Doc for a repeated text (tagging is deterministic):
    lets the fidelity pass run WebShop's reward on thousands of purchases in seconds."""

    def __init__(self, nlp) -> None:
        self.nlp, self.docs = nlp, {}

    def __call__(self, text: str):
        if text not in self.docs:
            self.docs[text] = self.nlp(text)
        return self.docs[text]


class EveryWord:
    """Every whitespace word is a noun: the trivial extractor the fallback must beat."""

    def __call__(self, text: str) -> tuple[str, ...]:
        return tuple(text.lower().split())


def time_passes(
    make_fn: Callable[[], Callable[[tuple], object]], purchases: list[tuple], passes: int
) -> tuple[float, float]:
    """Total (wall s, process CPU s) of ``passes`` passes over ``purchases``, each pass with a
    fresh ``make_fn()`` (built before its clock starts: a cold timer's new memo). The collector
    runs before the passes and is off during them, so no timer pays for another's garbage."""
    wall = cpu = 0.0
    gc.collect()
    gc.disable()
    for _ in range(passes):
        fn = make_fn()
        t, c = time.perf_counter(), time.process_time()
        for purchase in purchases:
            fn(purchase)
        wall += time.perf_counter() - t
        cpu += time.process_time() - c
    gc.enable()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--goals", type=int, default=100, help="goals in the timed purchases")
    parser.add_argument(
        "--fidelity-goals", type=int, default=1000, help="goals in the compared purchases"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--chunk",
        type=int,
        default=70,
        help="purchases a timer plays before the next timer takes over (a multiple of 7 keeps "
        "each goal's purchases together)",
    )
    parser.add_argument(
        "--ours-passes",
        type=int,
        default=20,
        help="passes over the purchases per round for each of our timers (WebShop's: one)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--webshop", type=Path, help="a WebShop checkout (the stock reward)")
    parser.add_argument(
        "--spacy-model",
        type=Path,
        default=os.environ.get("WEBSHOP_SPACY_MODEL")
        or SHARED_DATA / "spacy" / "en_core_web_sm-3.8.0",
        help="spaCy model folder (default $WEBSHOP_SPACY_MODEL or ../shared/data's copy)",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        catalogue = load_small_catalogue(Path(tmp))
    purchases = make_purchases(catalogue, args.goals, args.seed)
    compared = make_purchases(catalogue, args.fidelity_goals, args.seed)
    n = len(purchases)

    model = SpacyNouns(args.spacy_model) if args.spacy_model.is_dir() else None
    goal_module = (
        import_stock_goal_module(args.webshop, args.spacy_model) if args.webshop and model else None
    )
    stock = goal_module.get_reward if goal_module else None

    def ours(extractor):
        return lambda p: webshop_reward(p[1], p[0], p[2], p[3], noun_extractor=extractor)

    result: dict = {
        "benchmark": "webshop_reward",
        "command": "python benchmarks/bench_webshop_reward.py"
        + (" --webshop WEBSHOP" if stock else "")
        + f" --goals {args.goals} --fidelity-goals {args.fidelity_goals}"
        + f" --repeats {args.repeats} --chunk {args.chunk} --ours-passes {args.ours_passes}"
        + f" --seed {args.seed}",
        "timed_purchases": n,
        "compared_purchases": len(compared),
        "purchases_per_goal": "the goal's product with its options, 3 same category, 3 random",
        "python": platform.python_version(),
        "machine": f"{os.cpu_count()} cores, shared",
    }

    # FIDELITY ------------------------------------------------------------------------------
    fallback, every_word = FallbackNouns(), EveryWord()
    if model is not None:
        model_rewards = [ours(model)(p)[0] for p in compared]
        result["reward_changed_vs_model"] = {
            name: sum(ours(ex)(p)[0] != r for p, r in zip(compared, model_rewards, strict=True))
            / len(compared)
            for name, ex in (("fallback", fallback), ("every_word", every_word))
        }
        result["spacy_model"] = args.spacy_model.name
    if stock is not None:
        import thefuzz

        equal_total = equal_parts = 0
        timed_nlp, goal_module.nlp = goal_module.nlp, MemoisedPipeline(goal_module.nlp)
        for purchase in tqdm(compared, desc="WebShop vs ours", unit=" purchases"):
            goal, product, price, options = purchase
            stock_total, stock_info = stock(
                product, goal, price=price, options=options, verbose=True
            )
            total, info = ours(model)(purchase)
            equal_total += stock_total == total
            equal_parts += all(info[k] == float(v) for k, v in stock_info.items())
        goal_module.nlp = timed_nlp  # timing runs WebShop's pipeline as it is
        result["fidelity_vs_webshop"] = {
            "equal_total": equal_total / len(compared),
            "equal_verbose_parts": equal_parts / len(compared),
            "thefuzz": thefuzz.__version__,
        }

    # SPEED ---------------------------------------------------------------------------------
    k = args.ours_passes
    timers: dict[str, Callable[[list[tuple]], tuple[float, float]]] = {
        "ours_fallback_warm": lambda ps: time_passes(lambda: ours(fallback), ps, k),
        "ours_fallback_cold": lambda ps: time_passes(lambda: ours(FallbackNouns()), ps, k),
    }
    if model is not None:
        timers["ours_spacy_warm"] = lambda ps: time_passes(lambda: ours(model), ps, k)
        timers["ours_spacy_cold"] = lambda ps: time_passes(
            lambda: ours(SpacyNouns(args.spacy_model)), ps, 1
        )  # ~2.5 ms a purchase: one pass is long enough
    if stock is not None:
        timers["webshop_get_reward"] = lambda ps: time_passes(
            lambda: lambda p: stock(p[1], p[0], price=p[2], options=p[3]), ps, 1
        )
    passes = {
        name: 1 if name in ("ours_spacy_cold", "webshop_get_reward") else k for name in timers
    }
    chunks = [purchases[i : i + args.chunk] for i in range(0, n, args.chunk)]

    def timing_round() -> dict[str, tuple[float, float]]:
        # interleaved chunk by chunk: every timer of a round sees the same stretch of load
        spent = {name: [0.0, 0.0] for name in timers}
        for chunk in chunks:
            for name, timer in timers.items():
                wall, cpu = timer(chunk)
                spent[name][0] += wall
                spent[name][1] += cpu
        return {
            name: (w / (passes[name] * n), c / (passes[name] * n)) for name, (w, c) in spent.items()
        }

    seconds: dict[str, list[float]] = {name: [] for name in timers}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in timers}
    timing_round()  # warm-up round, not recorded
    for _ in tqdm(range(args.repeats), desc="timing rounds"):
        for name, (wall, cpu) in timing_round().items():
            seconds[name].append(wall)
            cpu_seconds[name].append(cpu)
    speed = {name: statistics.median(values) * 1e6 for name, values in seconds.items()}
    result["us_per_purchase_median"] = speed
    result["cpu_us_per_purchase_median"] = {
        name: statistics.median(values) * 1e6 for name, values in cpu_seconds.items()
    }
    result["us_per_purchase_per_round"] = {n: [v * 1e6 for v in s] for n, s in seconds.items()}
    result["cpu_us_per_purchase_per_round"] = {
        n: [v * 1e6 for v in s] for n, s in cpu_seconds.items()
    }
    if "webshop_get_reward" in speed:
        ours_names = [name for name in speed if name != "webshop_get_reward"]

        def per_round(clock: dict[str, list[float]]) -> dict[str, list[float]]:
            # each round's WebShop / ours: the two ran back to back, under the same load
            stock_rounds = clock["webshop_get_reward"]
            return {
                n: [s / o for s, o in zip(stock_rounds, clock[n], strict=True)] for n in ours_names
            }

        wall_ratios, cpu_ratios = per_round(seconds), per_round(cpu_seconds)
        result["speedup_vs_webshop"] = {n: statistics.median(wall_ratios[n]) for n in ours_names}
        result["speedup_vs_webshop_per_round"] = wall_ratios
        result["cpu_speedup_vs_webshop"] = {n: statistics.median(cpu_ratios[n]) for n in ours_names}
        result["cpu_speedup_vs_webshop_per_round"] = cpu_ratios
    result["load_average_1min_after"] = os.getloadavg()[0]

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS, json.dumps(result, indent=2) + "\n")

    print(f"\n{len(compared)} compared purchases, {n} timed")
    for key in ("fidelity_vs_webshop", "reward_changed_vs_model"):
        if key in result:
            print(f"{key}: {result[key]}")
    print(f"{'measure':<22}{'us/purchase':>14}{'CPU us':>10}{'vs WebShop wall / CPU':>24}")
    for name, value in speed.items():
        ratio = result.get("speedup_vs_webshop", {}).get(name)
        cpu_ratio = result.get("cpu_speedup_vs_webshop", {}).get(name)
        both = f"{ratio:.0f}x / {cpu_ratio:.0f}x" if ratio else ""
        cpu = result["cpu_us_per_purchase_median"][name]
        print(f"{name:<22}{value:>14.1f}{cpu:>10.1f}{both:>24}")


if __name__ == "__main__":
    main()
