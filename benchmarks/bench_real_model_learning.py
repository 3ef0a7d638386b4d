"""GiGPO against GRPO on a real pretrained model, several seeds, on CPU; resumable.

The model is SmolLM2-135M-Instruct (``agentgym.models.model_path("smollm2-135m")``) with its own
BPE tokenizer and ChatML template. Zero-shot it writes no valid free-text action, so both methods
use the scored-action policy (``--policy scored``): the model chooses among the env's admissible
actions with probability softmax(summed token log-probs / action temperature), and the chosen
action's tokens are what GiGPO/GRPO train. The env is the corridor with its hint ("Light comes
through the blue door"), 2 rooms of 4 doors, a step cap of 6: a wrong door leads to a dead end
that ``back`` leaves, so an episode can take up to two wrong turns and still win. No step cost,
gamma 0.95: a detour only delays the goal reward, which is where step-level credit (GiGPO's
anchor states: the same room, another door) differs from episode-level credit (GRPO rewards the
detour with the rest of a winning episode).

The held-out layouts are held out in text (``disjoint_splits``: each room's right door in the
test split is one the train split never lights in that room), so no test prompt occurs in
training. That leaves few of them: 4 distinct test layouts and 4 distinct test room texts
(12 test observations with the walk-back and dead-end variants), written to the JSON as
``held_out``; the evaluation episodes replay those 4 layouts (greedy, so success is a weighted
count of the layouts won).

Runs: every method x seed, the same seeds for both methods, interleaved (a seed's runs of all
methods run at the same time, ``--jobs`` processes at once, one CPU thread each). Cost on CPU
is the update (forward and backward of every row's tokens), so LoRA adapts only the top
``--lora-layers`` decoder layers: the backward pass stops there.

**Resumable.** Each run checkpoints every ``--checkpoint-every`` iterations and on Ctrl-C; the
same command again resumes every unfinished run from its latest checkpoint and skips finished
ones, and ``--budget-minutes`` stops the study (Ctrl-C to every run) when the time is spent.
The report compares the seeds whose runs finished for every method, and says which did not.

Writes ``benchmarks/results/real_model_learning.json`` (per method and seed: held-out success
per evaluation, rollout success, return and the steps of won episodes per iteration; per method:
area under the held-out curve, the first iteration at 0.9 and the detours per won episode) and
``real_model_learning.png``.

    python benchmarks/bench_real_model_learning.py                       # 3 seeds, ~90 min on 2 cores
    python benchmarks/bench_real_model_learning.py --budget-minutes 30   # stop; rerun to continue
    python benchmarks/bench_real_model_learning.py --seeds 0 --iterations 2   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ENV = "AgentGym/Corridor-v0"


def train_args(args: argparse.Namespace, method: str, seed: int, out_dir: Path) -> list[str]:
    """The trainer's command line for one new run (what ``benchmarks/README.md`` quotes)."""
    return [
        sys.executable, "-m", "trainers.gigpo.train",
        "--env", ENV,
        "--model", args.model,
        "--policy", "scored",
        "--action-temperature", str(args.action_temperature),
        "--advantage", method,
        "--gamma", str(args.gamma),
        "--env-kwargs", json.dumps(env_kwargs(args)),
        "--max-episode-steps", str(args.max_episode_steps),
        "--history-length", "0",
        "--num-groups", str(args.num_groups),
        "--group-size", str(args.group_size),
        "--iterations", str(args.iterations),
        "--lora-rank", str(args.lora_rank),
        "--lora-layers", str(args.lora_layers),
        "--lr", str(args.lr),
        "--mini-batch-size", str(args.mini_batch_size),
        "--micro-batch-size", "64",
        "--kl-coef", "0",
        "--eval-every", str(args.eval_every),
        "--eval-groups", str(args.eval_groups),
        "--checkpoint-every", str(args.checkpoint_every),
        "--cpu-threads", str(args.threads),
        "--seed", str(seed),
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


def run_dir(args: argparse.Namespace, method: str, seed: int) -> Path:
    return args.runs_dir / f"{method}-seed{seed}"


def finished(args: argparse.Namespace, history: list[dict]) -> bool:
    """The run reached its last iteration and, if it evaluates, its final evaluation."""
    done = any(
        r.get("iteration") == args.iterations and "rollout/success_rate" in r for r in history
    )
    evaluated = args.eval_every == 0 or any(
        r.get("iteration") == args.iterations and "eval/success_rate" in r for r in history
    )
    return done and evaluated


def has_checkpoint(folder: Path) -> bool:
    return any(p.is_dir() for p in folder.glob("checkpoint-*"))


def command(args: argparse.Namespace, method: str, seed: int) -> list[str]:
    """A new run, or the run resumed from its latest complete checkpoint."""
    folder = run_dir(args, method, seed)
    if has_checkpoint(folder):
        return [sys.executable, "-m", "trainers.gigpo.train", "--resume", str(folder)]
    return train_args(args, method, seed, folder)


def curves(history: list[dict]) -> dict:
    rollouts = [r for r in history if "rollout/success_rate" in r]
    evals = [r for r in history if "eval/success_rate" in r]
    keys = {
        "success_rate": "rollout/success_rate",
        "return": "rollout/return",
        "episode_length": "rollout/episode_length",
        "won_episode_length": "rollout/won_episode_length",
        "invalid_rate": "rollout/invalid_rate",
        "seconds_update": "time/update",
        "seconds_iteration": "time/iteration",
    }
    return {
        "iteration": [r["iteration"] for r in rollouts],
        **{name: [r.get(key) for r in rollouts] for name, key in keys.items()},
        "eval_iteration": [r["iteration"] for r in evals],
        "eval_success_rate": [r["eval/success_rate"] for r in evals],
    }


def summarise(c: dict, args: argparse.Namespace) -> dict:
    """Area under the held-out curve (its mean over the evaluations: 1 is perfect from the
    start), the first evaluated iteration at >= 0.9, and detours per won episode (each wrong
    door costs a door and a ``back``: (steps - rooms) / 2), over all iterations and the last
    quarter."""
    episodes = args.num_groups * args.group_size

    def detours(lo: int) -> float | None:
        pairs = [
            (length, rate * episodes)
            for i, length, rate in zip(
                c["iteration"], c["won_episode_length"], c["success_rate"], strict=True
            )
            if i > lo and length is not None and rate
        ]
        wins = sum(w for _, w in pairs)
        if not wins:
            return None
        return (sum(length * w for length, w in pairs) / wins - args.length) / 2

    evals = c["eval_success_rate"]
    first = next((i for i, v in zip(c["eval_iteration"], evals, strict=True) if v >= 0.9), None)
    last_quarter = args.iterations - max(1, args.iterations // 4)
    return {
        "auc_held_out": statistics.mean(evals) if evals else None,
        "auc_rollout": statistics.mean(c["success_rate"]) if c["success_rate"] else None,
        "first_iteration_at_0_9": first,
        "final_held_out": evals[-1] if evals else None,
        "detours_per_win": detours(0),
        "detours_per_win_last_quarter": detours(last_quarter),
        "wins": round(sum(r * episodes for r in c["success_rate"])),
        "update_seconds": sum(x or 0.0 for x in c["seconds_update"]),
        "iteration_seconds": sum(x or 0.0 for x in c["seconds_iteration"]),
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    colours = {"gigpo": "tab:blue", "grpo": "tab:orange"}
    for method, runs in results["runs"].items():
        colour = colours.get(method)
        for seed, run in runs.items():
            c = run["curves"]
            label = f"{method} seed {seed}"
            axes[0].plot(c["eval_iteration"], c["eval_success_rate"], marker="o", ms=3,
                         color=colour, alpha=0.7, label=label)  # fmt: skip
            axes[1].plot(c["iteration"], c["success_rate"], color=colour, alpha=0.6, label=label)
            won = [(i, (x - results["config"]["length"]) / 2)
                   for i, x in zip(c["iteration"], c["won_episode_length"], strict=True)
                   if x is not None]  # fmt: skip
            axes[2].plot([i for i, _ in won], [d for _, d in won], ".", color=colour, alpha=0.6)
    held = results["held_out"]
    axes[0].set_title(f"held-out success (greedy; {held['distinct_test_layouts']} unseen layouts)",
                      fontsize=9)  # fmt: skip
    axes[1].set_title("rollout success (sampled)", fontsize=9)
    axes[2].set_title("detours per won episode (rollouts)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.05, 1.05)
    axes[1].set_ylim(-0.05, 1.05)
    axes[0].legend(fontsize=7)
    cfg = results["config"]
    fig.suptitle(
        f"SmolLM2-135M-Instruct, scored actions, LoRA r{cfg['lora_rank']} on the top "
        f"{cfg['lora_layers']} layers, corridor of {cfg['length']} rooms: "
        f"{cfg['num_groups']}x{cfg['group_size']} episodes per iteration, CPU",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_all(args: argparse.Namespace) -> bool:
    """Run (or resume) every unfinished run, ``--jobs`` at a time, seed by seed; True if the
    budget stopped the study."""
    queue = [
        (method, seed)
        for seed in args.seeds
        for method in args.methods
        if not finished(args, read_history(run_dir(args, method, seed) / "metrics.jsonl"))
    ]
    if not queue:
        print("every run has finished: reporting", flush=True)
        return False
    print(f"{len(queue)} runs to go: " + ", ".join(f"{m} seed {s}" for m, s in queue), flush=True)
    running: dict[tuple[str, int], tuple[subprocess.Popen, object]] = {}
    t0 = time.perf_counter()
    stopped = False
    try:
        while queue or running:
            while queue and len(running) < args.jobs and not stopped:
                method, seed = queue.pop(0)
                cmd = command(args, method, seed)
                log = (args.runs_dir / f"{method}-seed{seed}.log").open("a")
                print(" ".join(cmd), flush=True)
                running[method, seed] = (
                    subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT),
                    log,
                )
            time.sleep(10)
            for key, (proc, log) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[key]
                if proc.returncode == 130:  # stopped by a Ctrl-C (it checkpointed first)
                    print(f"{key[0]} seed {key[1]} was stopped: rerun to continue", flush=True)
                    stopped, queue = True, []
                elif proc.returncode:
                    sys.exit(f"{key[0]} seed {key[1]} failed (exit {proc.returncode}); see "
                             f"{args.runs_dir / f'{key[0]}-seed{key[1]}.log'}")  # fmt: skip
            over = args.budget_minutes and time.perf_counter() - t0 > 60 * args.budget_minutes
            if over and not stopped:
                # Ctrl-C: each run checkpoints and exits; the same command resumes them.
                print(f"budget of {args.budget_minutes} min spent: stopping", flush=True)
                for proc, _ in running.values():
                    proc.send_signal(signal.SIGINT)
                stopped, queue = True, []
            status = []
            for method, seed in running:
                done = [r for r in read_history(run_dir(args, method, seed) / "metrics.jsonl")
                        if "rollout/success_rate" in r]  # fmt: skip
                last = f"{done[-1]['rollout/success_rate']:.2f}" if done else "-"
                status.append(f"{method} seed {seed} {len(done)}/{args.iterations} ({last})")
            if status:
                print(f"[{time.perf_counter() - t0:6.0f}s] " + ", ".join(status), flush=True)
    except KeyboardInterrupt:  # the runs got the Ctrl-C too: let them checkpoint
        for proc, _ in running.values():
            proc.wait()
        sys.exit("interrupted: the same command resumes every unfinished run")
    return stopped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M)")
    parser.add_argument("--methods", nargs="+", default=["gigpo", "grpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--num-groups", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--length", type=int, default=2, help="rooms in the corridor")
    parser.add_argument(
        "--num-doors", type=int, default=4, help="doors per room (half of them held out per room)"
    )
    parser.add_argument("--max-episode-steps", type=int, default=6, help="rooms + two detours")
    parser.add_argument("--gamma", type=float, default=0.95)
    parser.add_argument(
        "--action-temperature",
        type=float,
        default=3.0,
        help="rollout softmax temperature over the actions' summed log-probs (zero-shot the "
        "model puts 0.05-0.13 on the hinted door: without exploration no episode wins)",
    )
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-layers", type=int, default=8, help="adapt the top N layers")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--mini-batch-size", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-groups", type=int, default=16)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (one per core)")
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="stop every run (Ctrl-C: each checkpoints) when this much wall clock is spent; "
        "the same command continues the study",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="train nothing: report the runs in --runs-dir"
    )
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/bench_real_model"))
    parser.add_argument("--out", type=Path, default=RESULTS / "real_model_learning.json")
    args = parser.parse_args()
    if args.model is None:
        from agentgym.models import model_path

        args.model = str(model_path("smollm2-135m"))

    args.runs_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    stopped = False if args.report_only else run_all(args)

    config = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"
    }
    config["model"] = "SmolLM2-135M-Instruct (agentgym.models, smollm2-135m)"
    results: dict = {
        "benchmark": "real_model_learning",
        "env": ENV,
        "policy": "scored",
        "config": config,
        "command": " ".join(train_args(args, "<method>", 0, Path("<out>"))[1:])
        .replace(args.model, "<SmolLM2 folder>")
        .replace("--seed 0", "--seed <seed>"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "note": f"CPU only; {args.jobs} runs at once, {args.threads} thread each",
        },
        "held_out": held_out(args),
        "wall_seconds_of_this_call": time.perf_counter() - t0,
        "stopped_by_budget": stopped,
        "runs": {m: {} for m in args.methods},
    }
    complete = []
    for seed in args.seeds:
        histories = {
            m: read_history(run_dir(args, m, seed) / "metrics.jsonl") for m in args.methods
        }
        if all(finished(args, h) for h in histories.values()):
            complete.append(seed)
        for method, history in histories.items():
            if history:
                c = curves(history)
                results["runs"][method][str(seed)] = {
                    "finished": finished(args, history),
                    "curves": c,
                    **summarise(c, args),
                }
    results["seeds_finished"] = complete
    summary = {}
    for method in args.methods:
        runs = [results["runs"][method][str(s)] for s in complete]
        if not runs:
            continue

        def median(key: str, runs: list = runs) -> float | None:
            values = [r[key] for r in runs if r[key] is not None]
            return statistics.median(values) if values else None

        summary[method] = {
            "seeds": complete,
            "auc_held_out_median": median("auc_held_out"),
            "auc_rollout_median": median("auc_rollout"),
            "first_iteration_at_0_9": [r["first_iteration_at_0_9"] for r in runs],
            "seeds_reaching_0_9": sum(r["first_iteration_at_0_9"] is not None for r in runs),
            "final_held_out": [r["final_held_out"] for r in runs],
            "detours_per_win_median": median("detours_per_win"),
            "detours_per_win_last_quarter_median": median("detours_per_win_last_quarter"),
        }
    results["summary"] = summary
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out} (seeds finished by every method: {complete or 'none'})")
    try:
        png = args.out.with_suffix(".png")
        plot(results, png)
        print(f"wrote {png}")
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    for method, row in summary.items():
        print(
            f"{method}: held-out AUC {row['auc_held_out_median']}, rollout AUC "
            f"{row['auc_rollout_median']}, first at 0.9 {row['first_iteration_at_0_9']}, "
            f"detours per win {row['detours_per_win_median']}"
        )


if __name__ == "__main__":
    main()
