"""ALFWorld: agentgym's ALFWorldEnv against stock alfworld (TextWorld's PDDL env wrapped as
alfworld's ``AlfredTWEnv`` wraps it), same games and same commands, in one run.

Measures (medians over ``--repeats``; ratios against stock measured in the same run):

(a) parity + step time: for each of ``--games`` games, one command sequence of ``--steps``
    steps (the oracle expert's command 60%, a random admissible command 30%, an inadmissible
    one 10%), played through both; every observation and admissible list is compared (the
    mismatch count must be 0). Step time is the whole ``step`` call (ours: observation, reward,
    full info dict with ``state_key`` and the admissible list). Steps/s per core = 1 / median.
    Ours is reported twice: on a game just loaded (its per-game caches of operators and texts
    still empty) and over all replays (caches warm, as in training on a fixed game set).
(b) reset time: stock's ``reset`` (it reloads the game file and translates the PDDL problem to
    SAS twice on every reset); ours cold (the game not yet parsed in this process) and warm.
(c) memory: resident set size of a fresh process holding 128 of our envs, each on a different
    game (worst case) and as 16 groups x 8 envs, after 20 random steps each; stock's RSS for
    one env in one process (verl-agent runs one env per process).
(d) group rollouts: ``GroupVectorEnv(num_groups=16, group_size=8)`` with a random policy over
    admissible commands, full episodes (cap 50 steps), in-process and process-pool backends:
    env steps/s.

Step and reset figures come as per-call medians and as total-time ratios (the summed time of
all steps, or of all resets plus steps, stock / ours, per repeat; median over repeats): a
rollout's wall clock follows the total, which slow outliers weigh on and a median hides.
Stock and ours alternate game by game, so load on a shared machine hits both alike.

Data: ``--data DIR`` or ``$ALFWORLD_DATA`` (the folder holding json_2.1.1); without either, the
``--split`` archive from ../shared/data/alfworld (``json_2.1.1-<split>.tar.xz``) is unpacked into
a temporary folder. ``--split valid_train`` gives games our engine was not developed against
(held-out; ALFWorld's valid_unseen archive is not bundled there).

Step and reset totals come in process CPU time too (``time.process_time`` around each call):
the wall ratio moves with whatever else a shared machine runs, the CPU ratio does not.

    python benchmarks/bench_alfworld.py --games 12 --steps 30 --repeats 3 \
        --out benchmarks/results/alfworld.json
    python benchmarks/bench_alfworld.py --split valid_train --games 12 --steps 20 --repeats 5 \
        --skip memory group --out benchmarks/results/alfworld_valid_train.json
    python benchmarks/bench_alfworld.py --quick --out /tmp/alfworld.json     # a smoke run

These write the tracked results; ``python benchmarks/make_tables.py`` then regenerates the
README tables from them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AGENTGYM_SHARED_DATA", REPO / ".." / "shared" / "data"))
GARBAGE = ["put nothing in/on nowhere 1", "Go to bed 1", "look around", "", "jump"]


def _data_root(arg: str | None, split: str) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    if arg or os.environ.get("ALFWORLD_DATA"):
        return Path(arg or os.environ["ALFWORLD_DATA"]), None
    archive = SHARED / "alfworld" / f"json_2.1.1-{split}.tar.xz"
    if not archive.is_file():
        sys.exit("no ALFWorld data: pass --data DIR, set ALFWORLD_DATA, or provide " + str(archive))
    tmp = tempfile.TemporaryDirectory(prefix="alfworld-bench-")
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(tmp.name, filter="data")
    return Path(tmp.name), tmp


def _sequences(root: Path, split: str, n_games: int, n_steps: int) -> list[tuple[str, list[str]]]:
    """(task_id, commands) for n_games games spread over the split."""
    from agentgym.envs.alfworld import ALFWorldEnv

    env = ALFWorldEnv(data_root=root, split=split, max_episode_steps=None)
    stride = max(1, env.num_tasks // n_games)
    out = []
    for g in range(n_games):
        tid = env.task_ids[(g * stride + 3) % env.num_tasks]
        _, info = env.reset(options={"task": tid})
        rng = random.Random(g)
        commands = []
        for _ in range(n_steps):
            r = rng.random()
            if r < 0.6:
                cmd = env.expert_action("oracle") or "look"
            elif r < 0.9:
                cmd = rng.choice(info["admissible_actions"])
            else:
                cmd = rng.choice(GARBAGE)
            commands.append(cmd)
            _, _, terminated, _, info = env.step(cmd)
            if terminated:
                break
        out.append((tid, commands))
    return out


def bench_steps_and_resets(root: Path, split: str, seqs, repeats: int) -> dict:
    from agentgym.envs.alfworld import ALFWorldEnv, list_games
    from agentgym.envs.alfworld.engine import clear_game_cache
    from agentgym.envs.alfworld.reference import StockALFWorld

    env = ALFWorldEnv(data_root=root, split=split, max_episode_steps=None)
    paths = dict(list_games(root, split))
    stock_step, ours_step, stock_reset, cold_reset, warm_reset = [], [], [], [], []
    totals: dict[str, list[float]] = {"step": [], "episode_cold": [], "reset_cold": []}
    # the same sums in process CPU time: what the calls cost, whatever else the cores run
    cpu = {"stock_step": 0.0, "ours_step": 0.0, "stock_reset": 0.0, "ours_reset": 0.0}
    cpu_totals: dict[str, list[float]] = {"step": [], "episode_cold": [], "reset_cold": []}
    cpu_seconds: list[dict[str, float]] = []
    mismatches = compared = 0
    clock, cpu_clock = time.perf_counter, time.process_time
    # both sides share one heap, so a full garbage collection (mostly of stock's objects) would
    # be paid by whichever call runs when it triggers: collect between the timed sections and
    # keep the collector off inside them (the script ends on any exception, so no try/finally)
    gc.disable()
    for r in range(repeats):
        first = (len(stock_step), len(ours_step), len(stock_reset), len(cold_reset))
        cpu = dict.fromkeys(cpu, 0.0)
        for tid, commands in seqs:
            # -- stock (reset reloads and re-translates the game every time)
            gc.collect()
            stock = StockALFWorld(paths[tid])
            t, c = clock(), cpu_clock()
            s_obs, s_info = stock.reset()
            stock_reset.append(clock() - t)
            cpu["stock_reset"] += cpu_clock() - c
            stock_out = [(s_obs, s_info["admissible_commands"])]
            for cmd in commands:
                t, c = clock(), cpu_clock()
                s_obs, _, _, s_info = stock.step(cmd)
                stock_step.append(clock() - t)
                cpu["stock_step"] += cpu_clock() - c
                stock_out.append((s_obs, s_info["admissible_commands"]))
            stock.close()
            # -- ours: cold reset (game not parsed yet), warm reset, then the same steps
            clear_game_cache()
            gc.collect()
            t, c = clock(), cpu_clock()
            obs, info = env.reset(options={"task": tid})
            cold_reset.append(clock() - t)
            cpu["ours_reset"] += cpu_clock() - c
            t = clock()
            obs, info = env.reset(options={"task": tid})
            warm_reset.append(clock() - t)
            ours_out = [(obs, info["admissible_actions"])]
            for cmd in commands:
                t, c = clock(), cpu_clock()
                obs, _, _, _, info = env.step(cmd)
                ours_step.append(clock() - t)
                cpu["ours_step"] += cpu_clock() - c
                ours_out.append((obs, info["admissible_actions"]))
            compared += len(ours_out)
            mismatches += sum(a != b for a, b in zip(ours_out, stock_out, strict=True))
        # total time of this repeat's calls, stock / ours (a rollout's wall clock follows this)
        s_steps, o_steps = sum(stock_step[first[0] :]), sum(ours_step[first[1] :])
        s_resets, o_resets = sum(stock_reset[first[2] :]), sum(cold_reset[first[3] :])
        totals["step"].append(s_steps / o_steps)
        totals["reset_cold"].append(s_resets / o_resets)
        totals["episode_cold"].append((s_steps + s_resets) / (o_steps + o_resets))
        cpu_seconds.append(dict(cpu))
        cpu_totals["step"].append(cpu["stock_step"] / cpu["ours_step"])
        cpu_totals["reset_cold"].append(cpu["stock_reset"] / cpu["ours_reset"])
        cpu_totals["episode_cold"].append(
            (cpu["stock_step"] + cpu["stock_reset"]) / (cpu["ours_step"] + cpu["ours_reset"])
        )
        print(
            f"  repeat {r + 1}/{repeats}: {len(stock_step)} stock steps so far; total-time "
            f"ratios step {totals['step'][-1]:.0f}x (CPU {cpu_totals['step'][-1]:.0f}x), "
            f"reset {totals['reset_cold'][-1]:.0f}x (CPU {cpu_totals['reset_cold'][-1]:.0f}x)",
            flush=True,
        )
    gc.enable()
    fresh_step = list(ours_step)  # steps on a game just loaded: no cached operators/texts yet
    # our steps are cheap: replay them more times for a stable median
    for _ in range(9):
        for tid, commands in seqs:
            env.reset(options={"task": tid})
            for cmd in commands:
                t = time.perf_counter()
                env.step(cmd)
                ours_step.append(time.perf_counter() - t)
    med = statistics.median
    return {
        "games": len(seqs),
        "steps_per_game": [len(c) for _, c in seqs],
        "compared_observations": compared,
        "mismatches": mismatches,
        "stock_step_ms": 1e3 * med(stock_step),
        "ours_step_ms": 1e3 * med(ours_step),
        "ours_step_fresh_game_ms": 1e3 * med(fresh_step),
        "step_speedup_fresh_game": med(stock_step) / med(fresh_step),
        "step_speedup": med(stock_step) / med(ours_step),
        "stock_steps_per_s_per_core": 1 / med(stock_step),
        "ours_steps_per_s_per_core": 1 / med(ours_step),
        "stock_reset_ms": 1e3 * med(stock_reset),
        "ours_reset_cold_ms": 1e3 * med(cold_reset),
        "ours_reset_warm_ms": 1e3 * med(warm_reset),
        "reset_speedup_cold": med(stock_reset) / med(cold_reset),
        "reset_speedup_warm": med(stock_reset) / med(warm_reset),
        # sums over each repeat's interleaved calls (games just loaded), median over repeats
        "step_total_time_ratio": med(totals["step"]),
        "reset_cold_total_time_ratio": med(totals["reset_cold"]),
        "episode_total_time_ratio": med(totals["episode_cold"]),
        "total_time_ratios_per_repeat": totals,
        # the same ratios in process CPU time (time.process_time around each call)
        "step_total_cpu_ratio": med(cpu_totals["step"]),
        "reset_cold_total_cpu_ratio": med(cpu_totals["reset_cold"]),
        "episode_total_cpu_ratio": med(cpu_totals["episode_cold"]),
        "total_cpu_ratios_per_repeat": cpu_totals,
        "cpu_seconds_per_repeat": cpu_seconds,
        "steps_per_repeat": sum(len(c) for _, c in seqs),
        "garbage_collection": "collected between timed sections, disabled inside them",
        "stock_step_p99_ms": 1e3 * _p99(stock_step),
        "ours_step_fresh_game_p99_ms": 1e3 * _p99(fresh_step),
    }


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


_MEMORY_CHILD = r"""
import json, os, random, sys
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
root, split, mode = sys.argv[1], sys.argv[2], sys.argv[3]
base = rss()
rng = random.Random(0)
if mode == "stock":
    from agentgym.envs.alfworld.data import list_games
    from agentgym.envs.alfworld.reference import StockALFWorld
    env = StockALFWorld(list_games(root, split)[0][1])
    obs, info = env.reset()
    for _ in range(20):
        obs, _, _, info = env.step(rng.choice(info["admissible_commands"]))
    print(json.dumps({"rss": rss(), "base": base, "envs": 1}))
    sys.exit()
from agentgym.envs.alfworld import ALFWorldEnv
imported = rss()
envs = [ALFWorldEnv(data_root=root, split=split, max_episode_steps=None) for _ in range(128)]
n = envs[0].num_tasks
for i, env in enumerate(envs):
    task = i % n if mode == "distinct" else (i // 8) % n
    env.reset(options={"task": task})
infos = [env._last_info for env in envs]
for _ in range(20):
    infos = [env.step(rng.choice(info["admissible_actions"]))[4] for env, info in zip(envs, infos)]
print(json.dumps({"rss": rss(), "base": base, "imported": imported, "envs": 128,
                  "games": len({env._task_id for env in envs})}))
"""


def bench_memory(root: Path, split: str) -> dict:
    def child(mode: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, str(root), split, mode],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    mib = 2**20
    distinct, grouped, stock = child("distinct"), child("grouped"), child("stock")
    return {
        "ours_128_envs_distinct_games_rss_mib": distinct["rss"] / mib,
        "ours_128_envs_distinct_games": distinct["games"],
        "ours_128_envs_16x8_rss_mib": grouped["rss"] / mib,
        "ours_import_rss_mib": distinct["imported"] / mib,
        "ours_rss_per_env_mib_distinct": (distinct["rss"] - distinct["imported"]) / 128 / mib,
        "stock_one_env_process_rss_mib": stock["rss"] / mib,
        "stock_128_env_processes_rss_mib": 128 * stock["rss"] / mib,
        "memory_ratio_128": 128 * stock["rss"] / distinct["rss"],
    }


def bench_group(root: Path, split: str, repeats: int, backends: list[str]) -> dict:
    import numpy as np

    from agentgym.vector import GroupVectorEnv

    out = {}
    for backend in backends:
        rates = []
        venv = GroupVectorEnv(
            "AgentGym/ALFWorld-v0",
            num_groups=16,
            group_size=8,
            backend=backend,
            env_kwargs={"data_root": str(root), "split": split, "max_episode_steps": 50},
        )
        try:
            for r in range(repeats + 1):  # the first round warms the game caches
                rng = random.Random(r)
                _, infos = venv.reset(seed=r)
                steps = 0
                t = time.perf_counter()
                while venv.active.any():
                    active = venv.active.copy()
                    actions = [
                        rng.choice(info["admissible_actions"]) if a else ""
                        for info, a in zip(infos, active, strict=True)
                    ]
                    _, _, _, _, infos = venv.step(actions)
                    steps += int(np.sum(active))
                dt = time.perf_counter() - t
                if r > 0:
                    rates.append(steps / dt)
        finally:
            venv.close()
        out[backend] = {
            "env_steps_per_s": statistics.median(rates),
            "rounds": repeats,
            "num_workers": None if backend == "inprocess" else os.cpu_count(),
        }
    return out


def main() -> None:
    argv = list(sys.argv)  # textworld's PDDL loader overwrites sys.argv (Fast Downward's options)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", help="folder holding json_2.1.1 (default: $ALFWORLD_DATA)")
    ap.add_argument("--split", default="valid_seen")
    ap.add_argument("--games", type=int, default=6)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "alfworld.json"))
    ap.add_argument("--quick", action="store_true", help="2 games, 8 steps, 1 repeat")
    ap.add_argument("--skip", nargs="*", default=[], choices=["memory", "group"])
    args = ap.parse_args()
    if args.quick:
        args.games, args.steps, args.repeats = 2, 8, 1
    import agentgym  # noqa: F401 - registers the ids

    load_before = os.getloadavg()[0]

    root, tmp = _data_root(args.data, args.split)
    try:
        print(f"ALFWorld benchmark on {root} ({args.split})", flush=True)
        seqs = _sequences(root, args.split, args.games, args.steps)
        print("(a, b) steps and resets, stock vs ours ...", flush=True)
        results = {"steps_resets": bench_steps_and_resets(root, args.split, seqs, args.repeats)}
        if "memory" not in args.skip:
            print("(c) memory ...", flush=True)
            results["memory"] = bench_memory(root, args.split)
        if "group" not in args.skip:
            print("(d) group rollouts 16 x 8 ...", flush=True)
            results["group_rollout_16x8"] = bench_group(
                root, args.split, args.repeats, ["inprocess", "process"]
            )
    finally:
        if tmp is not None:
            tmp.cleanup()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    report = {
        "benchmark": "alfworld",
        "command": "python benchmarks/bench_alfworld.py " + " ".join(argv[1:]),
        "commit": commit,
        "python": platform.python_version(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "note": "shared machine: ratios are measured in the same run; absolute times vary with load",
        "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        "split": args.split,
        "repeats": args.repeats,
        **results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    s = results["steps_resets"]
    print(f"\nALFWorld, medians over {args.repeats} repeats, {s['games']} games ({args.split})")
    print(f"{'':32}{'stock':>12}{'agentgym':>12}{'ratio':>10}")
    print(
        f"{'step (ms)':32}{s['stock_step_ms']:>12.2f}{s['ours_step_ms']:>12.3f}"
        f"{s['step_speedup']:>9.1f}x"
    )
    print(
        f"{'step, game just loaded (ms)':32}{s['stock_step_ms']:>12.2f}"
        f"{s['ours_step_fresh_game_ms']:>12.3f}{s['step_speedup_fresh_game']:>9.1f}x"
    )
    print(
        f"{'steps/s per core':32}{s['stock_steps_per_s_per_core']:>12.1f}"
        f"{s['ours_steps_per_s_per_core']:>12.0f}"
    )
    print(
        f"{'reset, cold game (ms)':32}{s['stock_reset_ms']:>12.1f}{s['ours_reset_cold_ms']:>12.2f}"
        f"{s['reset_speedup_cold']:>9.1f}x"
    )
    print(
        f"{'reset, parsed game (ms)':32}{s['stock_reset_ms']:>12.1f}{s['ours_reset_warm_ms']:>12.3f}"
        f"{s['reset_speedup_warm']:>9.0f}x"
    )
    print(
        f"{'total time, steps':32}{'':>24}{s['step_total_time_ratio']:>9.1f}x\n"
        f"{'total time, cold resets':32}{'':>24}{s['reset_cold_total_time_ratio']:>9.1f}x\n"
        f"{'total time, resets + steps':32}{'':>24}{s['episode_total_time_ratio']:>9.1f}x"
    )
    print(f"{'mismatches / compared':32}{s['mismatches']:>12d}{s['compared_observations']:>12d}")
    if "memory" in results:
        m = results["memory"]
        print(
            f"{'RSS, 128 envs (MiB)':32}{m['stock_128_env_processes_rss_mib']:>12.0f}"
            f"{m['ours_128_envs_distinct_games_rss_mib']:>12.0f}{m['memory_ratio_128']:>9.1f}x"
        )
        print(f"{'RSS, 128 envs as 16x8 (MiB)':32}{'':>12}{m['ours_128_envs_16x8_rss_mib']:>12.0f}")
    if "group_rollout_16x8" in results:
        for backend, g in results["group_rollout_16x8"].items():
            print(
                f"{'group 16x8 ' + backend + ' (steps/s)':32}{'':>12}{g['env_steps_per_s']:>12.0f}"
            )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
