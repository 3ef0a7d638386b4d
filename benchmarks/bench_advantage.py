"""Speed of the vectorised GiGPO/GRPO advantages against the loop reference, in one run.

Batch: 16 groups x 8 trajectories, each of a random length in 1..50 steps (the paper's ALFWorld
setting: 16 tasks, group size 8, 50-step cap). Every group walks its own small state graph, so
trajectories meet in shared states, loop back to states they visited, and stay in place on
invalid actions (10% of steps): step groups of every size occur, singletons included. Rewards are
sparse (10 on success at the last step, 0 elsewhere). Rows are shuffled, since the estimators
accept rows in any order.

Timing runs in repeats within one process; a repeat is ``--rounds`` rounds of one reference
call then 8 fast calls, so both sides share the machine's load drift, and each repeat sums the
wall and process CPU time of its calls (garbage collected before the repeat, collector off inside
it). A repeat's speed-up is its mean reference call over its mean warm fast call, in each clock;
the medians over repeats are reported with every repeat's ratio. ``speedup_cold`` uses only the
first fast call of each round (caches just flushed by the reference, as in a trainer that calls it
once per batch after rollout work). Variants:

* ``int_keys``: state keys already int codes (``encode_state_keys`` run once when the rows are
  built); the reference gets the same int keys;
* ``python_keys``: state keys as Python strings, hashed inside ``compute_advantage``; the
  reference gets the same strings;
* ``encode_state_keys`` alone: the hashing cost that moves to row building with int keys;
* scaling: GiGPO with int keys on 64 and 256 groups (about 13k and 52k rows): how the ratio
  moves once the arrays outgrow the caches (shuffled rows make every gather a random access).

Both estimators' outputs are checked against the reference before timing. Writes
``benchmarks/results/advantage.json`` and prints a table.

    python benchmarks/bench_advantage.py [--repeats 5] [--rounds 30] [--seed 0] [--scales 64 256]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from agentgym.algorithms.advantage import compute_advantage, encode_state_keys
from agentgym.io import atomic_write_text

# The loop reference lives with the estimators' tests (tests/algorithms/advantage_reference.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "algorithms"))
from advantage_reference import reference_advantage  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "advantage.json"


def make_batch(
    seed: int,
    num_groups: int = 16,
    group_size: int = 8,
    max_steps: int = 50,
    states_per_group: int = 40,
    invalid_rate: float = 0.1,
) -> dict:
    """Flat rows of a synthetic group rollout; returns compute_advantage's keyword arguments."""
    rng = np.random.default_rng(seed)
    group_ids, traj_ids, step_ids, rewards, keys, invalid = [], [], [], [], [], []
    for g in range(num_groups):
        # A random sparse state graph per group: 3 successor states per state, the goal is the
        # last state. All trajectories of the group start in state 0.
        successors = rng.integers(0, states_per_group, size=(states_per_group, 3))
        for k in range(group_size):
            traj = g * group_size + k
            length = int(rng.integers(1, max_steps + 1))
            state = 0
            for t in range(length):
                bad = bool(rng.random() < invalid_rate)
                group_ids.append(g)
                traj_ids.append(traj)
                step_ids.append(t)
                keys.append(f"task{g}/state{state}")
                invalid.append(bad)
                won = t == length - 1 and rng.random() < 0.4
                rewards.append(10.0 if won else 0.0)
                if not bad:  # an invalid action leaves the state unchanged
                    state = int(successors[state, rng.integers(0, 3)])
    perm = rng.permutation(len(rewards))
    return {
        "group_ids": np.asarray(group_ids)[perm],
        "traj_ids": np.asarray(traj_ids)[perm],
        "step_ids": np.asarray(step_ids)[perm],
        "rewards": np.asarray(rewards)[perm],
        "state_keys": [keys[i] for i in perm],
        "invalid": np.asarray(invalid)[perm],
    }


def check_equal(batch: dict, name: str) -> None:
    for norm in ("mean_norm", "mean_std_norm"):
        for over in ("trajectories", "steps"):
            fast = compute_advantage(name, norm=norm, episode_stats_over=over, **batch)
            ref = reference_advantage(name, norm=norm, episode_stats_over=over, **batch)
            for field in ("returns", "episode_advantage", "step_advantage"):
                np.testing.assert_allclose(
                    getattr(fast, field), ref[field], rtol=1e-9, atol=1e-9, err_msg=field
                )
            np.testing.assert_allclose(fast.advantages, ref["advantages"], rtol=1e-6, atol=1e-6)


class Clock:
    """Summed wall and process CPU seconds of the sections timed with ``with clock:``."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.calls = 0

    def __enter__(self) -> Clock:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall += time.perf_counter() - self._wall
        self.cpu += time.process_time() - self._cpu
        self.calls += 1


def timed_repeats(fns: dict, repeats: int, rounds: int) -> list[dict[str, Clock]]:
    """Per repeat, one :class:`Clock` per function, calls interleaved round-robin ``rounds``
    times; garbage collected before each repeat, collector off inside it."""
    for fn in fns.values():  # warm-up
        fn()
    out = []
    for _ in range(repeats):
        clocks = {key: Clock() for key in fns}
        gc.collect()
        gc.disable()
        for _ in range(rounds):
            for key, fn in fns.items():
                with clocks[key]:
                    fn()
        gc.enable()
        out.append(clocks)
    return out


def compare(name: str, batch: dict, repeats: int, rounds: int, block: int = 8) -> dict:
    """Reference vs fast on one batch: ``repeats`` repeats of ``rounds`` rounds, each one
    reference call then ``block`` fast calls.

    Rounds share the machine's load drift. The first fast call of a round runs right after the
    reference has churned the caches ("cold", like a trainer calling it once per batch after
    rollout work); the others run warm. A repeat's speed-up is its mean reference call over its
    mean warm fast call, in wall and in process CPU time; the medians over repeats are reported.
    """
    reference_advantage(name, **batch)  # warm-up
    compute_advantage(name, **batch)
    per_repeat = []
    for _ in range(repeats):
        ref, cold, warm = Clock(), Clock(), Clock()
        gc.collect()
        gc.disable()
        for _ in range(rounds):
            with ref:
                reference_advantage(name, **batch)
            for i in range(block):
                with cold if i == 0 else warm:
                    compute_advantage(name, **batch)
        gc.enable()
        per_repeat.append((ref, cold, warm))

    def ms(pick, clock: str) -> float:
        return statistics.median(1e3 * getattr(pick(r), clock) / pick(r).calls for r in per_repeat)

    def ratios(fast: int, clock: str) -> list[float]:
        return [
            (getattr(r[0], clock) / r[0].calls) / (getattr(r[fast], clock) / r[fast].calls)
            for r in per_repeat
        ]

    wall, cpu, cold_wall = ratios(2, "wall"), ratios(2, "cpu"), ratios(1, "wall")
    return {
        "reference_ms": ms(lambda r: r[0], "wall"),
        "fast_ms": ms(lambda r: r[2], "wall"),
        "reference_cpu_ms": ms(lambda r: r[0], "cpu"),
        "fast_cpu_ms": ms(lambda r: r[2], "cpu"),
        "speedup": statistics.median(wall),
        "speedup_cpu": statistics.median(cpu),
        "speedups": wall,
        "speedups_cpu": cpu,
        "fast_cold_ms": ms(lambda r: r[1], "wall"),
        "speedup_cold": statistics.median(cold_wall),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats, medians reported")
    parser.add_argument(
        "--rounds", type=int, default=30, help="rounds of 1 reference + 8 fast calls per repeat"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scales",
        type=int,
        nargs="*",
        default=[64, 256],
        help="also time gigpo (int keys) on batches of this many groups (8 x 1..50 each)",
    )
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    batch = make_batch(args.seed)
    int_batch = dict(batch, state_keys=encode_state_keys(batch["state_keys"]))
    n = len(batch["rewards"])
    rows = []
    for name in ("gigpo", "grpo"):
        check_equal(batch, name)
        check_equal(int_batch, name)
        for keys, b in (("int_keys", int_batch), ("python_keys", batch)):
            rows.append(
                {
                    "estimator": name,
                    "state_keys": keys,
                    "rows": n,
                    **compare(name, b, args.repeats, args.rounds),
                }
            )
    encode = timed_repeats(
        {"encode": lambda: encode_state_keys(batch["state_keys"])}, args.repeats, 8 * args.rounds
    )
    scaling = []
    for groups in args.scales:
        big = make_batch(args.seed, num_groups=groups)
        big = dict(big, state_keys=encode_state_keys(big["state_keys"]))
        rounds = max(2, args.rounds * 16 // groups)  # a repeat costs about the same at any scale
        scaling.append(
            {
                "groups": groups,
                "rows": len(big["rewards"]),
                **compare("gigpo", big, args.repeats, rounds),
            }
        )
    stats = compute_advantage("gigpo", **batch).stats

    result = {
        "benchmark": "advantage",
        "command": "python benchmarks/bench_advantage.py "
        f"--repeats {args.repeats} --rounds {args.rounds} --seed {args.seed} "
        f"--scales {' '.join(map(str, args.scales))}",
        "batch": {
            "groups": 16,
            "group_size": 8,
            "max_steps": 50,
            "rows": n,
            "row_order": "shuffled",
        },
        "defaults": {
            "gamma": 0.95,
            "omega": 1.0,
            "norm": "mean_norm",
            "invalid_penalty": 0.1,
            "episode_stats_over": "trajectories",
        },
        "timing": "one process; a repeat is `rounds` rounds of 1 reference call + 8 fast calls, "
        "garbage collected before it, collector off inside; a repeat's speedup = its mean "
        "reference call / its mean warm fast call, in wall (speedups) and process CPU time "
        "(speedups_cpu); speedup, speedup_cpu = medians over repeats; speedup_cold uses the first "
        "fast call after each reference call (caches flushed by the reference)",
        "repeats": args.repeats,
        "rounds": args.rounds,
        "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "results": rows,
        "encode_state_keys_ms": statistics.median(
            1e3 * r["encode"].wall / r["encode"].calls for r in encode
        ),
        "scaling_gigpo_int_keys": scaling,
        "step_group_stats": stats,
        "machine": {"python": platform.python_version(), "numpy": np.__version__},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS, json.dumps(result, indent=2) + "\n")

    print(
        f"advantage benchmark: {n} rows (16 groups x 8 trajectories x 1..50 steps), shuffled; "
        f"load average {result['load_average_1m']:.1f} on {result['cpus']} CPUs"
    )
    header = (
        f"{'estimator':<9} {'keys':<12} {'rows':>6} {'ref ms':>8} {'fast ms':>8} "
        f"{'speed-up':>9} {'CPU':>6} {'cold ms':>8} {'cold':>6}"
    )
    print(header)
    for row in rows + [dict(r, estimator="gigpo", state_keys="int_keys") for r in scaling]:
        print(
            f"{row['estimator']:<9} {row['state_keys']:<12} {row['rows']:>6} "
            f"{row['reference_ms']:>8.2f} {row['fast_ms']:>8.3f} {row['speedup']:>8.0f}x "
            f"{row['speedup_cpu']:>5.0f}x {row['fast_cold_ms']:>8.3f} {row['speedup_cold']:>5.0f}x"
        )
    print(f"encode_state_keys alone ({n} keys): {result['encode_state_keys_ms']:.3f} ms")
    print("step groups:", ", ".join(f"{k}={v:.3g}" for k, v in stats.items()))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
