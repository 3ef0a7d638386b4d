"""Does the reference trainer teach a real pretrained model? GiGPO vs GRPO on SmolLM2-135M, CPU.

The model is SmolLM2-135M-Instruct (``agentgym.models.model_path("smollm2-135m")``) with its own
BPE tokenizer and ChatML template. Zero-shot it writes no valid free-text action, so both methods
use the scored-action policy (``--policy scored``): the model chooses among the env's admissible
actions with probability softmax(summed token log-probs), and the chosen action's tokens are
what GiGPO/GRPO train. The env is the corridor with its hint ("Light comes through the blue
door"): the policy can win every layout by reading the hint, which the model does not do zero-shot.

The held-out layouts are held out in text: 2 rooms, 4 doors and ``disjoint_splits`` (each
room's right door in the test split is one the train split never lights in that room), so no
test prompt occurs in training. That leaves few of them: 4 distinct test layouts and 4
distinct test room texts (12 test observations with the walk-back and dead-end variants),
written to the JSON as ``held_out``; the 16 evaluation episodes replay those 4 layouts.

Both methods run the same train script with the same seed, model, prompts and rollout budget
(groups x group size x iterations); only the advantage estimator differs. They run at the same
time, one CPU thread each, so that load from other work on the machine hits both alike.

Writes ``benchmarks/results/real_model_learning.json`` (per iteration: rollout success, return,
invalid rate, episode length, update and iteration seconds; per evaluation: held-out success,
greedy over the test split's layouts, iteration 0 being the zero-shot model) and
``real_model_learning.png``.

    python benchmarks/bench_real_model_learning.py                  # ~35 min on 2 busy cores
    python benchmarks/bench_real_model_learning.py --iterations 2   # a quick check of the setup
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ENV = "AgentGym/Corridor-v0"


def train_args(args: argparse.Namespace, method: str, out_dir: Path) -> list[str]:
    """The trainer's command line for one method (what ``benchmarks/README.md`` quotes)."""
    return [
        sys.executable, "-m", "trainers.gigpo.train",
        "--env", ENV,
        "--model", args.model,
        "--policy", "scored",
        "--action-temperature", str(args.action_temperature),
        "--advantage", method,
        "--env-kwargs", json.dumps(env_kwargs(args)),
        "--max-episode-steps", str(args.max_episode_steps),
        "--history-length", "0",
        "--num-groups", str(args.num_groups),
        "--group-size", str(args.group_size),
        "--iterations", str(args.iterations),
        "--lora-rank", str(args.lora_rank),
        "--lr", str(args.lr),
        "--mini-batch-size", str(args.mini_batch_size),
        "--micro-batch-size", "64",
        "--kl-coef", "0",
        "--eval-every", str(args.eval_every),
        "--eval-groups", str(args.eval_groups),
        "--cpu-threads", str(args.threads),
        "--seed", str(args.seed),
        "--out-dir", str(out_dir),
        "--overwrite",
        "--no-progress",
        "--no-tensorboard",
        "--no-plot",
    ]  # fmt: skip


def env_kwargs(args: argparse.Namespace) -> dict:
    """The corridor's settings: held-out layouts whose texts never occur in training."""
    return {
        "length": args.length,
        "num_doors": args.num_doors,
        "list_doors": False,
        "disjoint_splits": True,
    }


def held_out(args: argparse.Namespace) -> dict:
    """How much is held out: distinct test layouts and texts, and that none occurs in training."""
    from agentgym.envs.corridor import CorridorEnv

    env = CorridorEnv(**env_kwargs(args))
    train, test = env.split_texts("train"), env.split_texts("test")
    rooms = {t for t in test if t.startswith("Room")}
    return {
        "distinct_test_layouts": len({env.layout(i, "test") for i in range(10 * args.eval_groups)}),
        "distinct_test_room_texts": len(rooms),
        "distinct_test_observations": len(test),
        "test_texts_in_training": len(train & test),
    }


def read_history(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def curves(history: list[dict]) -> dict:
    rollouts = [r for r in history if "rollout/success_rate" in r]
    evals = [r for r in history if "eval/success_rate" in r]
    keys = {
        "success_rate": "rollout/success_rate",
        "return": "rollout/return",
        "invalid_rate": "rollout/invalid_rate",
        "episode_length": "rollout/episode_length",
        "first_ratio_dev": "update/first_ratio_dev",
        "logprob_diff": "rollout/logprob_diff",
        "seconds_update": "time/update",
        "seconds_generate": "time/generate",
        "seconds_iteration": "time/iteration",
    }
    return {
        "iteration": [r["iteration"] for r in rollouts],
        "samples": [r["samples"] for r in rollouts],
        **{name: [r.get(key) for r in rollouts] for name, key in keys.items()},
        "eval_iteration": [r["iteration"] for r in evals],
        "eval_success_rate": [r["eval/success_rate"] for r in evals],
        "eval_return": [r["eval/return"] for r in evals],
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for method, run in results["runs"].items():
        c = run["curves"]
        axes[0].plot(c["eval_iteration"], c["eval_success_rate"], marker="o", label=method)
        axes[1].plot(c["iteration"], c["success_rate"], marker=".", label=method)
        axes[2].plot(c["iteration"], c["episode_length"], marker=".", label=method)
    held = results["held_out"]
    axes[0].set_title(
        f"held-out success (greedy, {results['config']['eval_groups']} episodes, "
        f"{held['distinct_test_layouts']} unseen layouts)",
        fontsize=9,
    )
    axes[1].set_title("rollout success (sampled)")
    axes[2].set_title("rollout episode length (steps)")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylim(-0.05, 1.05)
    axes[1].set_ylim(-0.05, 1.05)
    cfg = results["config"]
    fig.suptitle(
        f"SmolLM2-135M-Instruct, scored actions, LoRA r{cfg['lora_rank']}, corridor length "
        f"{cfg['length']}: {cfg['num_groups']}x{cfg['group_size']} episodes/iteration, CPU",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M)")
    parser.add_argument("--methods", nargs="+", default=["gigpo", "grpo"])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--num-groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--length", type=int, default=2, help="rooms in the corridor")
    parser.add_argument(
        "--num-doors", type=int, default=4, help="doors per room (half of them held out per room)"
    )
    parser.add_argument("--max-episode-steps", type=int, default=4)
    parser.add_argument(
        "--action-temperature",
        type=float,
        default=3.0,
        help="rollout softmax temperature over the actions' summed log-probs (zero-shot the "
        "model puts 0.05-0.13 on the hinted door: without exploration no episode wins)",
    )
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--mini-batch-size", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--eval-groups", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per method")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: write the JSON and plot from the runs already in --runs-dir (the "
        "iterations both methods finished)",
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=45.0,
        help="wall-clock budget: both runs are stopped (Ctrl-C) when it is spent, and compared "
        "over the iterations both finished",
    )
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/bench_real_model"))
    parser.add_argument("--out", type=Path, default=RESULTS / "real_model_learning.json")
    args = parser.parse_args()
    if args.model is None:
        from agentgym.models import model_path

        args.model = str(model_path("smollm2-135m"))

    args.runs_dir.mkdir(parents=True, exist_ok=True)
    procs = {}
    t0 = time.perf_counter()
    stopped = False
    for method in [] if args.report_only else args.methods:
        out_dir = args.runs_dir / method
        log = (args.runs_dir / f"{method}.log").open("w")
        cmd = train_args(args, method, out_dir)
        print(" ".join(cmd), flush=True)
        procs[method] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
    while any(p.poll() is None for p, _ in procs.values()):
        time.sleep(20)
        if not stopped and time.perf_counter() - t0 > 60 * args.budget_minutes:
            # Out of time: Ctrl-C both (each saves a checkpoint and exits); the comparison
            # keeps the iterations both reached, so the samples stay equal.
            print(f"budget of {args.budget_minutes} min reached: stopping both runs", flush=True)
            for p, _ in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)
            stopped = True
        status = []
        for method in args.methods:
            history = read_history(args.runs_dir / method / "metrics.jsonl")
            done = [r for r in history if "rollout/success_rate" in r]
            last = f"{done[-1]['rollout/success_rate']:.2f}" if done else "-"
            status.append(f"{method} {len(done)}/{args.iterations} (success {last})")
        print(f"[{time.perf_counter() - t0:6.0f}s] " + ", ".join(status), flush=True)
    for method, (p, log) in procs.items():
        log.close()
        if p.returncode and not (stopped and p.returncode == 130):
            sys.exit(f"{method} failed (exit {p.returncode}); see {args.runs_dir / method}.log")

    config = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"
    }
    config["model"] = "SmolLM2-135M-Instruct (agentgym.models, smollm2-135m)"
    results = {
        "benchmark": "real_model_learning",
        "env": ENV,
        "policy": "scored",
        "config": config,
        "command": " ".join(train_args(args, "<method>", Path("<out>"))[1:]).replace(
            args.model, "<SmolLM2 folder>"
        ),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "note": "CPU only, cores shared with other work; one thread per method",
        },
        "held_out": held_out(args),
        "wall_seconds_of_this_call": time.perf_counter() - t0,
        "runs": {},
    }
    histories = {m: read_history(args.runs_dir / m / "metrics.jsonl") for m in args.methods}
    done = [
        max((r["iteration"] for r in h if "rollout/success_rate" in r), default=0)
        for h in histories.values()
    ]
    common = min(done) if done else 0
    results["iterations_finished"] = dict(zip(args.methods, done, strict=True))
    results["iterations_compared"] = common
    results["stopped_by_budget"] = stopped
    for method in args.methods:
        history = [r for r in histories[method] if r["iteration"] <= common]
        c = curves(history)
        results["runs"][method] = {
            "curves": c,
            "eval_first": c["eval_success_rate"][0] if c["eval_success_rate"] else None,
            "eval_last": c["eval_success_rate"][-1] if c["eval_success_rate"] else None,
            "eval_best": max(c["eval_success_rate"]) if c["eval_success_rate"] else None,
            "rollout_first": c["success_rate"][0] if c["success_rate"] else None,
            "rollout_last": c["success_rate"][-1] if c["success_rate"] else None,
            "seconds": sum(r.get("time/iteration", 0.0) + r.get("time/eval", 0.0) for r in history),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")
    try:
        png = args.out.with_suffix(".png")
        plot(results, png)
        print(f"wrote {png}")
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    for method, run in results["runs"].items():
        print(
            f"{method}: held-out success {run['eval_first']} -> {run['eval_last']} "
            f"(best {run['eval_best']}), rollout success {run['rollout_first']} -> "
            f"{run['rollout_last']}"
        )


if __name__ == "__main__":
    main()
