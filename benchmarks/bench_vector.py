"""GroupVectorEnv scaling: env steps/s for 1..256 envs, in-process vs process pool.

    python benchmarks/bench_vector.py                       # Sokoban, writes results/vector.json
    python benchmarks/bench_vector.py --env AgentGym/ALFWorld-Synthetic-v0 --sizes 8 64 128

Each configuration runs ``--vec-steps`` batched steps with random admissible actions (resetting
when every env is done) and is repeated ``--repeats`` times; the table gives the median env-steps/s
(env steps, i.e. active envs summed over batched steps) and the process/in-process ratio. Only
``vec.step`` and ``vec.reset`` are timed, not the policy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

import agentgym  # noqa: F401
from agentgym.rollout import random_policy
from agentgym.vector import GroupVectorEnv

RESULTS = Path(__file__).resolve().parent / "results"


def measure(vec: GroupVectorEnv, vec_steps: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    elapsed, env_steps = 0.0, 0
    t0 = time.perf_counter()
    obs, infos = vec.reset(seed=seed)
    elapsed += time.perf_counter() - t0
    for _ in range(vec_steps):
        if vec.all_done:
            t0 = time.perf_counter()
            obs, infos = vec.reset()
            elapsed += time.perf_counter() - t0
        actions = random_policy(obs, infos, rng)
        live = int(vec.active.sum())
        t0 = time.perf_counter()
        obs, _, _, _, infos = vec.step(actions)
        elapsed += time.perf_counter() - t0
        env_steps += live
    return env_steps / elapsed


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--env", default="AgentGym/Sokoban-v0")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--vec-steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS / "vector.json"))
    args = p.parse_args()

    rows = []
    for n in args.sizes:
        group_size = min(args.group_size, n)
        fig = {"num_envs": n, "group_size": group_size}
        for backend in ("inprocess", "process"):
            vec = GroupVectorEnv(
                args.env, n // group_size, group_size, backend=backend, num_workers=args.workers
            )
            rates = [measure(vec, args.vec_steps, seed) for seed in range(args.repeats)]
            vec.close()
            fig[backend] = {"median_steps_per_s": statistics.median(rates), "runs": rates}
        fig["process_over_inprocess"] = (
            fig["process"]["median_steps_per_s"] / fig["inprocess"]["median_steps_per_s"]
        )
        rows.append(fig)
        print(
            f"{n:>5} envs  in-process {fig['inprocess']['median_steps_per_s']:>10,.0f} steps/s   "
            f"process x{args.workers} {fig['process']['median_steps_per_s']:>10,.0f} steps/s   "
            f"ratio {fig['process_over_inprocess']:.2f}",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "env": args.env,
                "workers": args.workers,
                "cpu_count": os.cpu_count(),
                "vec_steps": args.vec_steps,
                "repeats": args.repeats,
                "results": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
