"""Snapshot / restore cost per env family, against what branching costs without it.

For every id measured (the generated variants always; the real-data ids when their data
variables are set, e.g. ``WEBSHOP_DATA``), the env is reset and played a few random admissible
steps, then each measure is timed over ``--calls`` calls and repeated ``--repeats`` times,
interleaved; each call is timed alone and the median call of each batch kept (the machine may
be shared), the batch's process CPU time per call beside it (garbage collected before each batch,
collector off inside), and the medians over repeats are reported. The deepcopy / (snapshot +
restore) ratio comes from a separate run per repeat in which the three alternate in small blocks
(10 snapshots, 10 restores, 1 deepcopy), each block timed in wall clock and process CPU time, so
that both sides meet the same moments of load; every repeat's ratio is reported:

- ``snapshot``: ``env.unwrapped.snapshot()``.
- ``restore``: ``restore(snapshot)`` into the env it came from (the state changed in between),
  and ``restore_other_task``: alternating two snapshots of different tasks, so every restore
  also switches room / game / goal.
- ``pickle``: ``pickle.dumps`` + ``pickle.loads`` of the snapshot (what a process or Ray
  backend ships), and its size.
- ``step_after_restore`` against ``step``: the first step after a restore costs what any step
  costs (ALFWorld's admissible actions come back with the snapshot in-process).

Two ways to branch without a snapshot API, measured in the same run:

- ``replay``: ``reset(seed)`` and replay the action prefix (how peers without state restore
  reach a mid-episode state; grows with the prefix).
- ``deepcopy``: ``copy.deepcopy(env.unwrapped)`` (Python's generic copy; the families'
  ``__getstate__`` already keeps catalogues, games and retrievers out of it).

Writes ``benchmarks/results/snapshot.json`` and prints a table::

    python benchmarks/bench_snapshot.py                      # ~1-2 minutes
    WEBSHOP_DATA=... ALFWORLD_DATA=... python benchmarks/bench_snapshot.py
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import pickle
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm import tqdm

import agentgym
from agentgym.io import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results" / "snapshot.json"

#: the id each family is reported under, then the real-data ids measured when their data is set
DEFAULT_IDS = (
    "AgentGym/Sokoban-v0",
    "AgentGym/Sokoban-10x10-3box-v0",
    "AgentGym/Corridor-v0",
    "AgentGym/ALFWorld-Synthetic-v0",
    "AgentGym/WebShop-Synthetic-v0",
    "AgentGym/SearchQA-Synthetic-v0",
)
REAL_IDS = {
    "AgentGym/ALFWorld-v0": ("ALFWORLD_DATA",),
    "AgentGym/WebShop-v0": ("WEBSHOP_DATA",),
    "AgentGym/SearchQA-v0": ("SEARCHQA_DATA", "SEARCHQA_RETRIEVER"),
}


def choose(info: dict[str, Any], rng: np.random.Generator) -> str:
    """A random admissible (or, for SearchQA, suggested non-answer) action."""
    choices = info["admissible_actions"] or [
        a for a in info.get("suggested_actions", []) if a.startswith("search[")
    ]
    action = choices[int(rng.integers(len(choices)))]
    if action == "search[<your query>]":  # WebShop's search bar: words of the goal
        action = f"search[{' '.join(info['goal']['instruction_text'].split()[:4])}]"
    if action.startswith("click[buy now]"):  # stay mid-episode
        action = "click[< prev]"
    return action


def play_prefix(env: Any, seed: int, n_steps: int) -> tuple[list[str], dict[str, Any]]:
    """Reset to ``seed`` and play ``n_steps`` random actions that do not end the episode."""
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    actions = []
    for _ in range(n_steps):
        action = choose(info, rng)
        _, _, terminated, truncated, step_info = env.step(action)
        if terminated or truncated:  # keep the episode open: replay without this action
            env.reset(seed=seed)
            for a in actions:
                env.step(a)
            continue
        actions.append(action)
        info = step_info
    return actions, info


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """Median wall time of one ``fn()`` over ``calls`` calls, each timed alone (on a shared
    machine a batch's mean would charge every call for the times the process was descheduled),
    and the mean process CPU time per call over the batch (CPU time does not run while the
    process waits), both in microseconds. Garbage is collected before the batch and the
    collector is off inside it."""
    times = []
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()
    cpu0 = time.process_time_ns()
    for _ in range(calls):
        start = clock()
        fn()
        times.append(clock() - start)
    cpu = time.process_time_ns() - cpu0
    gc.enable()
    return statistics.median(times) / 1e3, cpu / calls / 1e3


def measure(env_id: str, calls: int, repeats: int, prefix: int) -> dict[str, Any]:
    env = gym.make(env_id).unwrapped
    other = gym.make(env_id).unwrapped
    actions, info = play_prefix(env, 11, prefix)
    snap = env.snapshot()
    play_prefix(other, 12, prefix)
    snap_other = other.snapshot()
    next_action = choose(info, np.random.default_rng(0))
    blob = pickle.dumps(snap)

    def restore_in_place():
        env.restore(snap)

    toggle = [snap, snap_other]

    def restore_other_task():
        toggle.reverse()
        env.restore(toggle[0])

    def pickle_round_trip():
        pickle.loads(pickle.dumps(snap))

    def replay():
        env.reset(seed=11)
        for a in actions:
            env.step(a)

    def deepcopy():
        copy.deepcopy(env)

    def timed_step(prepare, n: int) -> float:
        """Median time of ``step(next_action)`` right after ``prepare()`` (untimed)."""
        times = []
        gc.collect()
        gc.disable()
        for _ in range(n):
            prepare()
            start = time.perf_counter_ns()
            env.step(next_action)
            times.append(time.perf_counter_ns() - start)
        gc.enable()
        return statistics.median(times) / 1e3

    def step_after_restore() -> tuple[float, None]:
        return timed_step(restore_in_place, calls), None

    def step() -> tuple[float, None]:  # the same step from the same state, reached by replay
        return timed_step(replay, max(calls // 10, 5)), None

    timed = {
        "snapshot": lambda: per_call_us(env.snapshot, calls),
        "restore": lambda: per_call_us(restore_in_place, calls),
        "restore_other_task": lambda: per_call_us(restore_other_task, calls),
        "pickle_round_trip": lambda: per_call_us(pickle_round_trip, calls),
        "step": step,
        "step_after_restore": step_after_restore,
        "replay": lambda: per_call_us(replay, max(calls // 10, 5)),
        "deepcopy": lambda: per_call_us(deepcopy, max(calls // 10, 5)),
    }
    samples: dict[str, list[float]] = {k: [] for k in timed}
    cpu_samples: dict[str, list[float]] = {k: [] for k, fn in timed.items()}
    for _ in range(repeats):  # interleaved, so load changes hit every measure alike
        for name, fn in timed.items():
            wall, cpu = fn()
            samples[name].append(wall)
            if cpu is not None:
                cpu_samples[name].append(cpu)
    cpu_samples = {k: v for k, v in cpu_samples.items() if v}
    med = {f"{k}_us": round(statistics.median(v), 2) for k, v in samples.items()}
    med.update({f"{k}_cpu_us": round(statistics.median(v), 2) for k, v in cpu_samples.items()})

    def ratios(numerator: str, parts: tuple[str, ...], s: dict[str, list[float]]) -> list[float]:
        """Per repeat: ``numerator``'s time over the summed times of ``parts``."""
        return [round(s[numerator][r] / sum(s[p][r] for p in parts), 2) for r in range(repeats)]

    # deepcopy against snapshot + restore, interleaved block by block (10 snapshots, 10
    # restores, 1 deepcopy per round) so that both sides meet the same moments of load
    deepcopy_wall, deepcopy_cpu = [], []
    for _ in range(repeats):
        spent = {k: [0.0, 0.0] for k in ("snapshot", "restore", "deepcopy")}
        blocks = (("snapshot", env.snapshot, 10), ("restore", restore_in_place, 10))
        blocks += (("deepcopy", deepcopy, 1),)
        gc.collect()
        gc.disable()
        for _ in range(max(calls // 10, 5)):
            for name, fn, n in blocks:
                t, c = time.perf_counter(), time.process_time()
                for _ in range(n):
                    fn()
                spent[name][0] += time.perf_counter() - t
                spent[name][1] += time.process_time() - c
        gc.enable()
        for i, out in ((0, deepcopy_wall), (1, deepcopy_cpu)):
            per_call = spent["deepcopy"][i] / (spent["snapshot"][i] + spent["restore"][i]) * 10
            out.append(round(per_call, 2))
    return {
        **med,
        "prefix_steps": len(actions),
        "pickled_bytes": len(blob),
        "deepcopy_pickled_bytes": len(pickle.dumps(env)),
        # medians of the per-repeat ratios, from the interleaved blocks (means per call)
        "ratio_deepcopy_to_snapshot_plus_restore": statistics.median(deepcopy_wall),
        "ratio_deepcopy_to_snapshot_plus_restore_cpu": statistics.median(deepcopy_cpu),
        "ratios_deepcopy_to_snapshot_plus_restore": deepcopy_wall,
        "ratios_deepcopy_to_snapshot_plus_restore_cpu": deepcopy_cpu,
        "ratio_replay_to_restore": statistics.median(ratios("replay", ("restore",), samples)),
        "ratio_replay_to_restore_cpu": statistics.median(
            ratios("replay", ("restore",), cpu_samples)
        ),
        "samples_us": {k: [round(x, 2) for x in v] for k, v in samples.items()},
        "cpu_samples_us": {k: [round(x, 2) for x in v] for k, v in cpu_samples.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", nargs="*", help="env ids (default: one per family, + real data)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats")
    parser.add_argument("--prefix", type=int, default=4, help="random steps before the snapshot")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    ids = args.ids or [
        *DEFAULT_IDS,
        *(i for i, needs in REAL_IDS.items() if all(os.environ.get(v) for v in needs)),
    ]
    warnings.simplefilter("ignore")  # gymnasium's passive-checker notes on text spaces
    results = {}
    for env_id in tqdm(ids, desc="envs", unit="env"):
        if not agentgym.entry(env_id).available():
            print(f"skipping {env_id}: needs {agentgym.entry(env_id).needs}", file=sys.stderr)
            continue
        results[env_id] = measure(env_id, args.calls, args.repeats, args.prefix)

    out = {
        "benchmark": "snapshot",
        "command": "python benchmarks/bench_snapshot.py "
        + " ".join(f"--{k}={v}" for k, v in vars(args).items() if k not in ("ids", "out")),
        "python": platform.python_version(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
        "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        "versions": {"numpy": np.__version__, "gymnasium": gym.__version__},
        "settings": {"calls": args.calls, "repeats": args.repeats, "prefix": args.prefix},
        "notes": (
            "Medians over interleaved repeats, microseconds per call: *_us the median call of a "
            "repeat's batch in wall clock (each call timed alone), *_cpu_us the batch's process "
            "CPU time per call; garbage collected before each batch, collector off inside. replay = reset(seed) + "
            "the action prefix (branching without state restore); deepcopy = "
            "copy.deepcopy(env.unwrapped). step_after_restore: the step right after a restore."
        ),
        "results": results,
    }
    out["timer_overhead_us"] = round(per_call_us(lambda: None, 10_000)[0], 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(out, indent=2) + "\n")  # a kill leaves no half file

    cols = ("snapshot", "restore", "restore_other_task", "pickle_round_trip", "step")
    cols += ("step_after_restore", "replay", "deepcopy")
    print(f"{'env id':34}" + "".join(f"{c:>14}" for c in cols) + f"{'bytes':>8}")
    for env_id, r in results.items():
        row = "".join(f"{r[c + '_us']:>14.1f}" for c in cols)
        print(f"{env_id:34}{row}{r['pickled_bytes']:>8}")
    print(f"(microseconds per call, medians of {args.repeats}; written to {args.out})")


if __name__ == "__main__":
    main()
