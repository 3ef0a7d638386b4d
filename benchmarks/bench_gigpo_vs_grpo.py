"""GiGPO vs GRPO at equal samples on the corridor env, over several seeds.

Both methods run the same train script (``trainers.gigpo.train``) with the same tiny random
model, the same rollout budget (groups x group size x iterations) and the same seeds; only the
advantage estimator differs. The corridor (``AgentGym/Corridor-v0``) is built so that step-level
credit matters: a wrong door can be undone with ``back`` and the episode still won, so GRPO's
episode-level advantage rewards wrong turns inside winning trajectories, while GiGPO's
anchor-state groups compare the wrong door with the right one taken from the same room.

Writes ``benchmarks/results/gigpo_vs_grpo.json`` (held-out success per evaluation point, per
method and seed, plus medians) and ``gigpo_vs_grpo.png`` (matplotlib if installed, else drawn
with Pillow).

    python benchmarks/bench_gigpo_vs_grpo.py --jobs 2        # 5 seeds; ~5 min on 2 idle cores
    python benchmarks/bench_gigpo_vs_grpo.py --seeds 0 1 2 3 4 --iterations 60
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

# The reference trainer is not installed with the package: run from a clone, import it from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers.gigpo.config import Config  # noqa: E402
from trainers.gigpo.train import train  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def run(method: str, seed: int, args: argparse.Namespace, out: Path, **options: object) -> dict:
    """One training run of ``method`` (the advantage estimator unless ``options`` set the
    trainer's options) on the corridor; its evaluation curve and per-iteration rollout stats."""
    if args.jobs > 1:
        torch.set_num_threads(1)  # the jobs share the cores
    config = Config.for_env(
        "AgentGym/Corridor-v0",
        seed=seed,
        iterations=args.iterations,
        eval_every=args.eval_every,
        out_dir=str(out / f"{method}-{seed}"),
        progress=False,
        tensorboard=False,
        save_final=False,
        quiet=True,
        plot=False,
        **({"advantage": method} | options),
    )
    t0 = time.perf_counter()
    history = train(config)
    evals = [r for r in history if "eval/success_rate" in r]
    rollouts = [r for r in history if "rollout/success_rate" in r]
    print(f"{method:6s} seed {seed}: eval {[round(r['eval/success_rate'], 3) for r in evals]} "
          f"({time.perf_counter() - t0:.0f}s)", flush=True)  # fmt: skip
    return {
        "method": method,
        "seed": seed,
        "eval_iterations": [r["iteration"] for r in evals],
        "eval_samples": [r["samples"] for r in evals],
        "eval_success": [r["eval/success_rate"] for r in evals],
        "rollout_success": [r["rollout/success_rate"] for r in rollouts],
        "actions_per_iteration": [r["rollout/actions"] for r in rollouts],
        "seconds": time.perf_counter() - t0,
        "config": config.to_dict(),
    }


def run_all(fn: Callable[..., dict], jobs: list[tuple[str, int]], n_jobs: int, *args) -> list:
    """``fn(method, seed, *args)`` for every job, in ``n_jobs`` spawned processes when > 1
    (each run's torch then uses one thread), with a progress bar; results in job order."""
    if n_jobs > 1:
        with multiprocessing.get_context("spawn").Pool(n_jobs) as pool:
            pending = [pool.apply_async(fn, (m, s, *args)) for m, s in jobs]
            return [p.get() for p in tqdm(pending, desc="training runs")]
    return [fn(m, s, *args) for m, s in tqdm(jobs, desc="training runs")]


def curve_summary(runs: list[dict]) -> dict:
    """One method's learning curve over its seeds' runs (each with ``eval_iterations``,
    ``eval_samples`` and ``eval_success``): the median and min-max per evaluation point, the
    final success (median and per seed) and the median area under the curve."""
    columns = list(zip(*(r["eval_success"] for r in runs), strict=True))
    return {
        "iterations": runs[0]["eval_iterations"],
        "samples": runs[0]["eval_samples"],
        "median": [statistics.median(c) for c in columns],
        "min": [min(c) for c in columns],
        "max": [max(c) for c in columns],
        "final_median": statistics.median(r["eval_success"][-1] for r in runs),
        "final_per_seed": [r["eval_success"][-1] for r in runs],
        "auc_median": statistics.median(
            sum(r["eval_success"]) / len(r["eval_success"]) for r in runs
        ),
    }


def reach(run_result: dict, level: float) -> int | None:
    """First evaluated iteration whose held-out success is at least ``level`` (None: never)."""
    for it, v in zip(run_result["eval_iterations"], run_result["eval_success"], strict=True):
        if v >= level:
            return it
    return None


def plot(summary: dict, path: Path) -> str:
    """Median held-out success vs iteration per method (min-max band over seeds)."""
    colors = {"gigpo": (31, 119, 180), "grpo": (214, 39, 40)}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for m, s in summary["methods"].items():
            c = tuple(v / 255 for v in colors.get(m, (0, 0, 0)))
            ax.plot(s["iterations"], s["median"], label=m.upper(), color=c)
            ax.fill_between(s["iterations"], s["min"], s["max"], color=c, alpha=0.2)
        ax.set_xlabel("iteration (equal samples per iteration)")
        ax.set_ylabel("held-out success rate")
        ax.set_ylim(0, 1)
        ax.set_title("Corridor: GiGPO vs GRPO, median over seeds")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        return "matplotlib"
    except ImportError:
        pass
    from PIL import Image, ImageDraw

    w, h, left, bottom, top, right = 640, 420, 60, 50, 40, 20
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    x_max = max(max(s["iterations"]) for s in summary["methods"].values()) or 1

    def xy(it: float, y: float) -> tuple[float, float]:
        return (left + (w - left - right) * it / x_max, h - bottom - (h - bottom - top) * y)

    d.rectangle([xy(0, 0)[0], xy(0, 1)[1], xy(x_max, 0)[0], xy(0, 0)[1]], outline="black")
    for y in (0.0, 0.25, 0.5, 0.75, 1.0):
        d.line([xy(0, y), xy(x_max, y)], fill=(220, 220, 220))
        d.text((8, xy(0, y)[1] - 6), f"{y:.2f}", fill="black")
    for it in summary["methods"][next(iter(summary["methods"]))]["iterations"]:
        d.text((xy(it, 0)[0] - 6, h - bottom + 6), str(it), fill="black")
    # Bands first, translucent, so that overlapping bands stay visible; median lines on top.
    for m, s in summary["methods"].items():
        c = colors.get(m, (0, 0, 0))
        band = [xy(i, v) for i, v in zip(s["iterations"], s["max"], strict=True)]
        band += [xy(i, v) for i, v in reversed(list(zip(s["iterations"], s["min"], strict=True)))]
        layer = Image.new("RGBA", (w, h), (0, 0, 0, 0))
        ImageDraw.Draw(layer).polygon(band, fill=(*c, 60))
        img = Image.alpha_composite(img.convert("RGBA"), layer).convert("RGB")
    d = ImageDraw.Draw(img)
    for k, (m, s) in enumerate(summary["methods"].items()):
        c = colors.get(m, (0, 0, 0))
        d.line(
            [xy(i, v) for i, v in zip(s["iterations"], s["median"], strict=True)], fill=c, width=3
        )
        d.text((left + 10, top + 8 + 16 * k), f"{m.upper()} (median, min-max over seeds)", fill=c)
    d.text((w // 2 - 120, 10), "Corridor: held-out success vs iteration", fill="black")
    d.text((w // 2 - 60, h - 22), "iteration (equal samples)", fill="black")
    img.save(path)
    return "pillow (matplotlib not installed)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--iterations", type=int, default=Config.for_env("AgentGym/Corridor-v0").iterations
    )
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--methods", nargs="+", default=["gigpo", "grpo"])
    parser.add_argument("--out", type=Path, default=RESULTS / "gigpo_vs_grpo.json")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    args = parser.parse_args()

    t0 = time.perf_counter()
    jobs = [(m, seed) for seed in args.seeds for m in args.methods]
    with tempfile.TemporaryDirectory() as tmp:
        runs = run_all(run, jobs, args.jobs, args, Path(tmp))
    summary: dict = {"methods": {}}
    for method in args.methods:
        mine = [r for r in runs if r["method"] == method]
        summary["methods"][method] = {
            **curve_summary(mine),
            "iteration_reaching_0.9_per_seed": [reach(r, 0.9) for r in mine],
            "seeds_reaching_0.9": sum(reach(r, 0.9) is not None for r in mine),
        }
    if {"gigpo", "grpo"} <= set(summary["methods"]):
        g, r = summary["methods"]["gigpo"], summary["methods"]["grpo"]
        summary["final_ratio_gigpo_over_grpo"] = (
            g["final_median"] / r["final_median"] if r["final_median"] else None
        )
        summary["auc_ratio_gigpo_over_grpo"] = (
            g["auc_median"] / r["auc_median"] if r["auc_median"] else None
        )
    png = args.out.with_suffix(".png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary["plot"] = {"path": png.name, "drawn_with": plot(summary, png)}
    result = {
        "benchmark": "GiGPO vs GRPO at equal samples, AgentGym/Corridor-v0, tiny random Qwen2 on CPU",
        "metric": "held-out (split 'test') greedy success rate, 64 layouts, per evaluation point",
        "seeds": args.seeds,
        "total_seconds": time.perf_counter() - t0,
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "cpus": torch.get_num_threads(), "note": "timings depend on the machine and its load"},
        "summary": summary,
        "runs": runs,
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    for m, s in summary["methods"].items():
        print(
            f"{m}: final median {s['final_median']:.3f}, per seed {s['final_per_seed']}, AUC median {s['auc_median']:.3f}"
        )
    print(f"wrote {args.out} and {png} ({summary['plot']['drawn_with']})")


if __name__ == "__main__":
    main()
