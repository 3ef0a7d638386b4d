"""GroupVectorEnv scaling: env steps/s for 1..256 envs, in-process vs process pool.

    python benchmarks/bench_vector.py                       # Sokoban, writes results/vector.json
    python benchmarks/bench_vector.py --env AgentGym/ALFWorld-Synthetic-v0 --sizes 8 64 128 \
        --out benchmarks/results/vector_alfworld_synthetic.json

Each configuration runs at least ``--vec-steps`` batched steps and ``--min-env-steps`` env steps
per repeat with random admissible actions (resetting when every env is done). Before timing, every
repeat's work runs once untimed on each backend: workers start and import, ALFWorld games are
parsed and Sokoban rooms generated (both memoised per process). A repeat then plays the same
seeded work on both backends in ``--chunks`` slices that alternate (in-process, pool; then pool,
in-process; ...), so a slow moment of the machine falls on both rather than on whichever ran
then. Only ``vec.step`` and ``vec.reset`` are timed, not the policy: in wall clock, and in CPU
time (the main process's ``time.process_time`` over the timed calls, plus the pool's workers' CPU
time over each slice, read with psutil: a worker idles between steps). Garbage is collected
before each slice and the collector is off inside it. The table gives the median env-steps per
wall second and the pool / in-process ratios in CPU time (env steps per CPU second: below 1 means
the pool spends more CPU per step) and in wall clock, per repeat.
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


class TimedRun:
    """One backend's share of a repeat: seeded random play, timed slice by slice."""

    def __init__(self, vec: GroupVectorEnv, seed: int) -> None:
        self.vec = vec
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.obs: list | None = None
        self.infos: dict | None = None
        self.wall = self.cpu = 0.0
        self.env_steps = 0

    def play(self, vec_steps: int) -> None:
        """``vec_steps`` batched steps (resetting when every env is done), the first call
        starting with ``reset(seed=...)``; adds their wall and CPU seconds and env steps."""
        vec, clock, cpu_clock = self.vec, time.perf_counter, time.process_time
        gc.collect()
        gc.disable()
        workers0 = worker_cpu_seconds(vec)
        wall = cpu = 0.0
        if self.obs is None:
            t0, c0 = clock(), cpu_clock()
            self.obs, self.infos = vec.reset(seed=self.seed)
            wall, cpu = clock() - t0, cpu_clock() - c0
        for _ in range(vec_steps):
            if vec.all_done:
                t0, c0 = clock(), cpu_clock()
                self.obs, self.infos = vec.reset()
                wall, cpu = wall + clock() - t0, cpu + cpu_clock() - c0
            actions = random_policy(self.obs, self.infos, self.rng)
            live = int(vec.active.sum())
            t0, c0 = clock(), cpu_clock()
            self.obs, _, _, _, self.infos = vec.step(actions)
            wall, cpu = wall + clock() - t0, cpu + cpu_clock() - c0
            self.env_steps += live
        cpu += worker_cpu_seconds(vec) - workers0
        gc.enable()
        self.wall += wall
        self.cpu += cpu

    @property
    def rates(self) -> tuple[float, float]:
        """Env steps per wall second and per CPU second (main process + pool workers)."""
        return self.env_steps / self.wall, self.env_steps / self.cpu


def measure_pair(
    vecs: dict[str, GroupVectorEnv], vec_steps: int, seed: int, chunks: int
) -> dict[str, tuple[float, float]]:
    """The same seeded work on every backend, in ``chunks`` slices whose order alternates."""
    runs = {backend: TimedRun(vec, seed) for backend, vec in vecs.items()}
    order = list(runs)
    sizes = [vec_steps // chunks + (i < vec_steps % chunks) for i in range(chunks)]
    for i, size in enumerate(sizes):
        for backend in order if i % 2 == 0 else order[::-1]:
            runs[backend].play(size)
    return {backend: run.rates for backend, run in runs.items()}


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
    p.add_argument(
        "--chunks",
        type=int,
        default=10,
        help="slices per repeat, alternating between the backends",
    )
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
        # untimed: every repeat's work once, so workers have started and imported, ALFWorld
        # games are parsed and Sokoban rooms generated (both memoised per process) before the
        # clock runs. Generating a room costs milliseconds and varies with the seed, so with it
        # timed the in-process side's rate moved 1.4x between repeats while the pool's,
        # bound by the pipe, hardly moved, and the ratio followed the seeds, not the backends.
        for seed in range(args.repeats):
            measure_pair(vecs, vec_steps, seed, 1)
        for seed in range(args.repeats):
            for backend, rates in measure_pair(vecs, vec_steps, seed, args.chunks).items():
                runs[backend].append(rates)
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
        "chunks_per_repeat": args.chunks,
        "warm_up": "every repeat's seeds played once untimed on each backend first (games "
        "parsed, rooms generated and memoised)",
        "timing": "vec.reset + vec.step only; wall clock, and CPU time = the main process's "
        "process_time over those calls + the pool workers' CPU over the repeat (psutil); "
        "in-process and pool alternate slice by slice (--chunks per repeat) over the same "
        "seeded work; ratios = pool / in-process per repeat, "
        "medians over repeats",
        "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        "results": rows,
    }
    atomic_write_text(out, json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
