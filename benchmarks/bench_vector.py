"""GroupVectorEnv scaling: env steps/s for 1..256 envs, in-process vs process pool.

    python benchmarks/bench_vector.py                       # Sokoban, writes results/vector.json
    python benchmarks/bench_vector.py --env AgentGym/ALFWorld-Synthetic-v0 --sizes 8 64 128 \
        --out benchmarks/results/vector_alfworld_synthetic.json

Each configuration runs at least ``--vec-steps`` batched steps and ``--min-env-steps`` env steps
with random admissible actions (resetting when every env is done); after one untimed run of each
(a worker parses its games once), repeat r runs the in-process env, then the pool, ``--repeats``
times. Only ``vec.step`` and ``vec.reset`` are timed, not the
policy: in wall clock, and in CPU time (the main process's ``time.process_time`` over the timed
calls, plus the pool's workers' CPU time over the repeat, read with psutil: a worker idles between
steps). Garbage is collected before each repeat and the collector is off inside it. The table gives
the median env-steps per wall second and the pool / in-process ratios in CPU time (env steps per
CPU second: below 1 means the pool spends more CPU per step) and in wall clock, per repeat.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np
import psutil

import agentgym  # noqa: F401
from agentgym.io import atomic_write_text
from agentgym.rollout import random_policy
from agentgym.vector import GroupVectorEnv

RESULTS = Path(__file__).resolve().parent / "results"


def worker_cpu_seconds(vec: GroupVectorEnv) -> float:
    """User + system CPU seconds of the process pool's workers so far (0 in-process)."""
    procs = getattr(vec._backend, "procs", [])  # the process backend's worker Popen objects
    total = 0.0
    for proc in procs:
        if proc is not None and proc.poll() is None:
            times = psutil.Process(proc.pid).cpu_times()
            total += times.user + times.system
    return total


def measure(vec: GroupVectorEnv, vec_steps: int, seed: int) -> tuple[float, float]:
    """Env steps per wall second and per CPU second (main process + pool workers)."""
    rng = np.random.default_rng(seed)
    wall = cpu = 0.0
    env_steps = 0
    clock, cpu_clock = time.perf_counter, time.process_time
    gc.collect()
    gc.disable()
    workers0 = worker_cpu_seconds(vec)
    t0, c0 = clock(), cpu_clock()
    obs, infos = vec.reset(seed=seed)
    wall, cpu = clock() - t0, cpu_clock() - c0
    for _ in range(vec_steps):
        if vec.all_done:
            t0, c0 = clock(), cpu_clock()
            obs, infos = vec.reset()
            wall, cpu = wall + clock() - t0, cpu + cpu_clock() - c0
        actions = random_policy(obs, infos, rng)
        live = int(vec.active.sum())
        t0, c0 = clock(), cpu_clock()
        obs, _, _, _, infos = vec.step(actions)
        wall, cpu = wall + clock() - t0, cpu + cpu_clock() - c0
        env_steps += live
    cpu += worker_cpu_seconds(vec) - workers0
    gc.enable()
    return env_steps / wall, env_steps / cpu


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--env", default="AgentGym/Sokoban-v0")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--vec-steps", type=int, default=150, help="batched steps per repeat, at least")
    p.add_argument(
        "--min-env-steps",
        type=int,
        default=20_000,
        help="env steps per repeat, at least (more batched steps for few envs)",
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS / "vector.json"))
    args = p.parse_args()

    load_before = os.getloadavg()[0]
    rows = []
    for n in args.sizes:
        group_size = min(args.group_size, n)
        vec_steps = max(args.vec_steps, math.ceil(args.min_env_steps / n))
        fig: dict = {"num_envs": n, "group_size": group_size, "vec_steps": vec_steps}
        vecs = {
            backend: GroupVectorEnv(
                args.env, n // group_size, group_size, backend=backend, num_workers=args.workers
            )
            for backend in ("inprocess", "process")
        }
        runs: dict[str, list[tuple[float, float]]] = {backend: [] for backend in vecs}
        for vec in vecs.values():  # untimed: workers start, import and parse their games
            measure(vec, vec_steps, args.repeats)
        for seed in range(args.repeats):  # interleaved: load drift falls on both alike
            for backend, vec in vecs.items():
                runs[backend].append(measure(vec, vec_steps, seed))
        for vec in vecs.values():
            vec.close()
        for backend, rates in runs.items():
            fig[backend] = {
                "median_steps_per_s": statistics.median(w for w, _ in rates),
                "median_steps_per_cpu_s": statistics.median(c for _, c in rates),
                "runs": [w for w, _ in rates],
                "runs_cpu": [c for _, c in rates],
            }
        pairs = list(zip(runs["process"], runs["inprocess"], strict=True))
        fig["ratios"] = [p[0] / i[0] for p, i in pairs]
        fig["ratios_cpu"] = [p[1] / i[1] for p, i in pairs]
        fig["process_over_inprocess"] = statistics.median(fig["ratios"])
        fig["process_over_inprocess_cpu"] = statistics.median(fig["ratios_cpu"])
        rows.append(fig)
        print(
            f"{n:>5} envs  in-process {fig['inprocess']['median_steps_per_s']:>10,.0f} steps/s   "
            f"process x{args.workers} {fig['process']['median_steps_per_s']:>10,.0f} steps/s   "
            f"ratio CPU {fig['process_over_inprocess_cpu']:.2f} wall "
            f"{fig['process_over_inprocess']:.2f}",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "env": args.env,
        "command": "python benchmarks/bench_vector.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if k != "out"
        ),
        "workers": args.workers,
        "cpu_count": os.cpu_count(),
        "vec_steps": args.vec_steps,
        "min_env_steps": args.min_env_steps,
        "repeats": args.repeats,
        "timing": "vec.reset + vec.step only; wall clock, and CPU time = the main process's "
        "process_time over those calls + the pool workers' CPU over the repeat (psutil); "
        "in-process and pool alternate repeat by repeat; ratios = pool / in-process per repeat, "
        "medians over repeats",
        "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        "results": rows,
    }
    atomic_write_text(out, json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
