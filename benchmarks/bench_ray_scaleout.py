"""Ray scale-out: one actor per env (verl-agent's layout) against GroupVectorEnv's batched actors.

    python benchmarks/bench_ray_scaleout.py                    # 256 envs, writes ray_scaleout.json
    python benchmarks/bench_ray_scaleout.py --envs 64 --repeats 3

Both layouts run the same envs (``--env``, default ALFWorld-Synthetic) through the same dispatch
(``GroupVectorEnv(backend="ray")``) on one local Ray; only the number of actors differs:
``num_workers=envs`` (one actor, so one Python worker process, per env) against
``num_workers=--batched-actors`` (each actor steps a slice of the envs). Per layout and repeat:

- startup: seconds from building the vector env until every actor has built its envs;
- memory: the summed RSS of the actors' worker processes once they are up (every actor is
  its own process, so their memory adds up), and of every Ray worker process on the node;
- steps/s: env steps per second over ``--vec-steps`` batched steps with random admissible
  actions (reset included), the policy not timed.

Actors ask for ``num_cpus=0`` in both layouts so that hundreds of them can be placed on a small
node. Medians over ``--repeats``; ratios are per-env / batched (memory, startup) and batched /
per-env (steps/s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import psutil
import ray
from tqdm import tqdm

import agentgym  # noqa: F401 - registers the ids
from agentgym.io import atomic_write_json
from agentgym.rollout import random_policy
from agentgym.vector import GroupVectorEnv

RESULTS = Path(__file__).resolve().parent / "results"


def _actor_pids(vec: GroupVectorEnv) -> list[int]:
    backend = vec._backend  # the benchmark looks inside on purpose: it measures the actors
    return ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in backend.actors])


def _rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def _ray_worker_pids() -> list[int]:
    """Every Ray worker process on this node (actors and idle pooled workers)."""
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd and cmd[0].startswith("ray::"):
            out.append(proc.info["pid"])
    return out


def run_layout(args: argparse.Namespace, num_workers: int, seed: int) -> dict[str, float]:
    t0 = time.perf_counter()
    vec = GroupVectorEnv(
        args.env,
        num_groups=args.envs // args.group_size,
        group_size=args.group_size,
        backend="ray",
        num_workers=num_workers,
        ray_options={"num_cpus": 0},
    )
    startup = time.perf_counter() - t0
    try:
        actor_rss = _rss(_actor_pids(vec))
        all_rss = _rss(_ray_worker_pids())
        rng = np.random.default_rng(seed)
        elapsed, env_steps = 0.0, 0
        t0 = time.perf_counter()
        obs, infos = vec.reset(seed=seed)
        elapsed += time.perf_counter() - t0
        for _ in range(args.vec_steps):
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
    finally:
        vec.close()
    # the next layout starts from a node without these actors' processes
    deadline = time.monotonic() + 60
    while len(_ray_worker_pids()) > args.idle_workers and time.monotonic() < deadline:
        time.sleep(0.5)
    return {
        "startup_s": startup,
        "actor_rss_mb": actor_rss / 2**20,
        "all_worker_rss_mb": all_rss / 2**20,
        "steps_per_s": env_steps / elapsed,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--env", default="AgentGym/ALFWorld-Synthetic-v0")
    p.add_argument("--envs", type=int, default=256)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batched-actors", type=int, default=os.cpu_count() or 2)
    p.add_argument("--vec-steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 2)
    p.add_argument(
        "--layouts",
        nargs="+",
        choices=["per_env_actors", "batched_actors"],
        default=["per_env_actors", "batched_actors"],
        help="one layout alone gives no ratios (e.g. the batched layout at a size the per-env "
        "layout cannot reach on this node)",
    )
    p.add_argument("--out", default=str(RESULTS / "ray_scaleout.json"))
    args = p.parse_args()
    if args.envs % args.group_size:
        p.error(f"--envs {args.envs} is not a multiple of --group-size {args.group_size}")

    ray.init(
        num_cpus=args.ray_cpus,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        time.sleep(2.0)  # let the prestarted idle workers come up, so they are not counted twice
        args.idle_workers = len(_ray_worker_pids())
        sizes = {"per_env_actors": args.envs, "batched_actors": args.batched_actors}
        layouts = {name: sizes[name] for name in args.layouts}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in layouts}
        bar = tqdm(total=args.repeats * len(layouts), desc="layout runs")
        for r in range(args.repeats):
            for name, workers in layouts.items():  # interleaved: drift hits both alike
                runs[name].append(run_layout(args, workers, seed=r))
                bar.update()
                bar.set_postfix({name: f"{runs[name][-1]['startup_s']:.1f}s"})
        bar.close()
    finally:
        ray.shutdown()

    med = {
        name: {k: statistics.median(run[k] for run in rs) for k in rs[0]}
        for name, rs in runs.items()
    }
    ratios = {}
    if len(med) == 2:
        per, bat = med["per_env_actors"], med["batched_actors"]
        ratios = {
            "memory_per_env_over_batched": per["actor_rss_mb"] / bat["actor_rss_mb"],
            "startup_per_env_over_batched": per["startup_s"] / bat["startup_s"],
            "steps_per_s_batched_over_per_env": bat["steps_per_s"] / per["steps_per_s"],
        }
    result = {
        "env": args.env,
        "num_envs": args.envs,
        "group_size": args.group_size,
        "actors": layouts,
        "vec_steps": args.vec_steps,
        "repeats": args.repeats,
        "ray_num_cpus": args.ray_cpus,
        "idle_ray_workers": args.idle_workers,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "ray": ray.__version__,
        "median": med,
        "runs": runs,
        "ratios": ratios,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, result, indent=2)  # a killed run leaves the previous result intact
    print(json.dumps({"median": med, "ratios": result["ratios"]}, indent=2))


if __name__ == "__main__":
    main()
