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
  actions (reset included), the policy not timed;
- CPU time of startup and of the steps: user + system seconds of this driver and every process
  below it (Ray's GCS and raylet, the worker processes, the actors), read with psutil before and
  after; a process born inside the window counts whole (the driver's random policy is left
  out). Other processes on the machine are not counted, so these ratios hold whatever else the
  cores run, where the wall-clock ones move with the load.

Actors ask for ``num_cpus=0`` in both layouts so that hundreds of them can be placed on a small
node. Medians over ``--repeats``; ratios are per-env / batched (memory, startup) and batched /
per-env (steps/s), as medians of the per-repeat ratios (each repeat runs both layouts, one after
the other).
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


def _tree_cpu() -> dict[int, float]:
    """User + system CPU seconds of this driver and of every process below it (Ray's GCS and
    raylet, its workers and actors), by pid."""
    me = psutil.Process()
    out = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:  # ended between listing and reading
            continue
        out[proc.pid] = times.user + times.system
    return out


def _cpu_since(before: dict[int, float]) -> float:
    """CPU seconds the driver's process tree spent since ``before`` (``_tree_cpu()``); a process
    born since counts whole. A process that ended in between is missed (none does while a
    layout is up: its actors live until ``close()``)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in _tree_cpu().items())


def run_layout(args: argparse.Namespace, num_workers: int, seed: int) -> dict[str, float]:
    cpu0 = _tree_cpu()
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
    startup_cpu = _cpu_since(cpu0)
    try:
        actor_rss = _rss(_actor_pids(vec))
        all_rss = _rss(_ray_worker_pids())
        rng = np.random.default_rng(seed)
        elapsed, env_steps, policy_cpu = 0.0, 0, 0.0
        cpu0 = _tree_cpu()
        t0 = time.perf_counter()
        obs, infos = vec.reset(seed=seed)
        elapsed += time.perf_counter() - t0
        for _ in range(args.vec_steps):
            if vec.all_done:
                t0 = time.perf_counter()
                obs, infos = vec.reset()
                elapsed += time.perf_counter() - t0
            c0 = time.process_time()
            actions = random_policy(obs, infos, rng)
            policy_cpu += time.process_time() - c0
            live = int(vec.active.sum())
            t0 = time.perf_counter()
            obs, _, _, _, infos = vec.step(actions)
            elapsed += time.perf_counter() - t0
            env_steps += live
        steps_cpu = _cpu_since(cpu0) - policy_cpu
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
        "startup_cpu_s": startup_cpu,
        "steps_per_cpu_s": env_steps / steps_cpu,
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

    load_before = os.getloadavg()[0]
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
    ratios: dict[str, float] = {}
    ratios_per_repeat: dict[str, list[float]] = {}
    if len(med) == 2:
        per, bat = runs["per_env_actors"], runs["batched_actors"]
        for name, key, peer_over_ours in (
            ("memory_per_env_over_batched", "actor_rss_mb", True),
            ("startup_per_env_over_batched", "startup_s", True),
            ("startup_cpu_per_env_over_batched", "startup_cpu_s", True),
            ("steps_per_s_batched_over_per_env", "steps_per_s", False),
            ("steps_per_cpu_s_batched_over_per_env", "steps_per_cpu_s", False),
        ):
            # each repeat ran both layouts back to back: a ratio per repeat, then the median
            pairs = [
                (p[key], b[key]) if peer_over_ours else (b[key], p[key])
                for p, b in zip(per, bat, strict=True)
            ]
            ratios_per_repeat[name] = [a / c for a, c in pairs]
            ratios[name] = statistics.median(ratios_per_repeat[name])
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
        "ratios_per_repeat": ratios_per_repeat,
        "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, result, indent=2)  # a killed run leaves the previous result intact
    print(json.dumps({"median": med, "ratios": result["ratios"]}, indent=2))


if __name__ == "__main__":
    main()
