"""Sokoban: agentgym's SokobanEnv and room generator against gym-sokoban 0.0.6, in one run.

Measures, each repeated ``--repeats`` times (medians and ratios reported):

(a) steps/s with uniformly random moves on 6x6 / 1-box rooms, ``--step-rooms`` per repeat (each
    side's own generator seeded alike, the steps split evenly among them), ours and theirs
    alternating room by room: with one room per repeat and each side's steps timed in one
    block, the repeats' ratios disagreed by 1.5x.
    Ours returns the text observation and the full info dict; gym-sokoban's
    ``SokobanEnv.step`` with its cheapest observation mode in 0.0.6 (``tiny_rgb_array``, the
    mode verl-agent steps it in), and with its default ``rgb_array``. Resets (to a new room, or
    to the same one after a win) are not timed, for either.
(b) 6x6 / 1-box room generation, rooms/s (gym-sokoban's ``generate_room`` with its env's
    retry-on-failure loop, against our ``generate_room``).
(c) 10x10 / 3-box room generation, rooms/s. gym-sokoban can take seconds per room, so it runs
    in a child process until it has spent ``--budget`` CPU seconds in a repeat, and the rooms it
    finished count (per wall and per CPU second up to the last one).
(d) fidelity: on identical topologies and placements, our reverse-play search and
    gym-sokoban's ``reverse_playing`` pick the same start state (count of identical results).

gym-sokoban lives only in the benchmark's environment (its registration imports old ``gym``,
which needs ``setuptools<81`` and breaks on numpy 2 unless ``SokobanEnv`` is built directly)::

    python -m venv --system-site-packages /tmp/venv-sokoban
    /tmp/venv-sokoban/bin/pip install "setuptools<81" "gym==0.26.2" "gym-sokoban==0.0.6"
    /tmp/venv-sokoban/bin/python benchmarks/bench_sokoban.py

Every rate comes per wall second and per process CPU second of the timed sections (garbage
collected before each measure, collector off while it runs); repeat r runs ours, then theirs, and
each repeat gives its own ratio in both clocks (the CPU-time ratio is what the work costs
whatever else the cores run). Writes ``benchmarks/results/sokoban.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from agentgym.envs.sokoban import SokobanEnv, generate_room
from agentgym.envs.sokoban.generator import (
    WALL,
    place_targets_and_player,
    reverse_play,
    room_topology,
)
from agentgym.io import atomic_write_text

SETUP = """gym-sokoban 0.0.6 is not importable here. It lives only in the benchmark's environment:

    python -m venv --system-site-packages /tmp/venv-sokoban
    /tmp/venv-sokoban/bin/pip install "setuptools<81" "gym==0.26.2" "gym-sokoban==0.0.6"
    /tmp/venv-sokoban/bin/python benchmarks/bench_sokoban.py

(or pass --ours-only to measure agentgym alone)"""

MOVES = ("up", "down", "left", "right")


def import_gym_sokoban():
    """gym-sokoban's SokobanEnv class and room_utils module, or None when not installed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from gym_sokoban.envs import room_utils
            from gym_sokoban.envs.sokoban_env import SokobanEnv as GymSokoban
        except Exception:  # noqa: BLE001 - any import failure means "not set up here"
            return None
    return GymSokoban, room_utils


# -- timing ----------------------------------------------------------------------------------
class Clock:
    """Wall and process CPU seconds of the timed sections only (``with clock:`` around each)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> Clock:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall += time.perf_counter() - self._wall
        self.cpu += time.process_time() - self._cpu

    def rates(self, n: int) -> tuple[float, float]:
        """``n`` per wall second and per CPU second."""
        return n / self.wall, n / self.cpu


def no_gc(fn):
    """``fn`` with garbage collected before it and the collector off while it runs: a full
    collection would be paid by whichever side runs when it triggers."""

    def run(*args, **kwargs):
        gc.collect()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return run


# -- (a) steps/s -------------------------------------------------------------------------------
def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (i < n % parts) for i in range(parts)]


def _ours_room_steps(env: SokobanEnv, room_seed: int, moves: list[str], clock: Clock) -> None:
    env.reset(seed=room_seed)
    step, it = env.step, iter(moves)
    while True:  # a win ends the section: the reset to the same room is not timed
        with clock:
            for a in it:
                if step(a)[2]:
                    break
            else:
                return
        env.reset(seed=room_seed)


def _theirs_room_steps(env, room_seed: int, moves: list[int], mode: str, clock: Clock) -> None:
    random.seed(room_seed)
    np.random.seed(room_seed)
    with _quiet():
        env.reset()
    saved = (env.room_state.copy(), env.player_position.copy())
    step, it = env.step, iter(moves)
    while True:  # solved: restore the start, untimed
        with clock:
            for a in it:
                if step(a, observation_mode=mode)[2]:
                    break
            else:
                return
        env.room_state, env.player_position = saved[0].copy(), saved[1].copy()
        env.boxes_on_target = 0


@no_gc
def steps_per_s(
    GymSokoban, seed: int, rooms: int, n_ours: int, n_theirs: dict[str, int]
) -> tuple[tuple[float, float], dict[str, tuple[float, float]]]:
    """Ours, then gym-sokoban in each observation mode of ``n_theirs``, room by room over
    ``rooms`` rooms (room seeds ``seed * rooms + i``; each side its own generator's room), so
    a slow moment of the machine falls on every side alike. Returns (ours' (wall, CPU) steps
    per second, theirs' per mode)."""
    rng = np.random.default_rng(seed)
    ours_env = SokobanEnv(max_episode_steps=None)
    ours_clock = Clock()
    theirs_env = None
    if GymSokoban is not None:
        theirs_env = GymSokoban(dim_room=(6, 6), num_boxes=1, max_steps=10**12, reset=False)
    theirs_clocks = {mode: Clock() for mode in n_theirs}
    splits = {mode: _split(n, rooms) for mode, n in n_theirs.items()}
    for room, steps in enumerate(_split(n_ours, rooms)):
        room_seed = seed * rooms + room
        moves = [MOVES[i] for i in rng.integers(4, size=steps).tolist()]
        _ours_room_steps(ours_env, room_seed, moves, ours_clock)
        if theirs_env is None:
            continue
        for mode, clock in theirs_clocks.items():
            # 1..4: push (or move) up/down/left/right
            their_moves = (rng.integers(4, size=splits[mode][room]) + 1).tolist()
            _theirs_room_steps(theirs_env, room_seed, their_moves, mode, clock)
    theirs = {mode: theirs_clocks[mode].rates(n) for mode, n in n_theirs.items()}
    return ours_clock.rates(n_ours), theirs


# -- (b), (c) generation -----------------------------------------------------------------------
@no_gc
def ours_rooms_per_s(dim, num_boxes: int, n: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    with Clock() as clock:
        for _ in range(n):
            generate_room(rng, dim, num_boxes)
    return clock.rates(n)


class _quiet:
    """Silence gym-sokoban's "[SOKOBAN] Retry . . ." prints."""

    def __enter__(self):
        self._stdout = sys.stdout
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115

    def __exit__(self, *exc):
        sys.stdout.close()
        sys.stdout = self._stdout


def _theirs_room(room_utils, dim, num_boxes: int) -> None:
    # what gym-sokoban's SokobanEnv.reset does, minus rendering: retry until a room comes out
    while True:
        try:
            room_utils.generate_room(dim=dim, num_steps=int(1.7 * sum(dim)), num_boxes=num_boxes)
            return
        except (RuntimeError, RuntimeWarning):
            continue


@no_gc
def theirs_rooms_per_s(room_utils, dim, num_boxes: int, n: int, seed: int) -> tuple[float, float]:
    random.seed(seed)
    np.random.seed(seed)
    with Clock() as clock:
        for _ in range(n):
            _theirs_room(room_utils, dim, num_boxes)
    return clock.rates(n)


def _theirs_room_loop(dim, num_boxes: int, seed: int, budget_cpu: float, done, stamps) -> None:
    """Child process: rooms until ``budget_cpu`` CPU seconds are spent; after each room,
    ``done`` counts it and ``stamps`` holds the wall and CPU seconds spent so far."""
    _, room_utils = import_gym_sokoban()
    random.seed(seed)
    np.random.seed(seed)
    gc.disable()  # the loop allocates little; keep collections out of a room's time, as ours
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.process_time() - cpu0 < budget_cpu:
        _theirs_room(room_utils, dim, num_boxes)
        with done.get_lock():
            stamps[0], stamps[1] = time.perf_counter() - wall0, time.process_time() - cpu0
            done.value += 1


def theirs_rooms_per_s_bounded(
    dim, num_boxes: int, budget_cpu: float, seed: int
) -> tuple[float, float]:
    """Rooms gym-sokoban finishes in ``budget_cpu`` CPU seconds (a child process, killed after
    at most 4x the budget in wall time), per wall and per CPU second up to the last finished
    room; 0 rooms gives rates of 0."""
    ctx = mp.get_context("fork")
    done, stamps = ctx.Value("i", 0), ctx.Array("d", 2)
    proc = ctx.Process(
        target=_theirs_room_loop, args=(dim, num_boxes, seed, budget_cpu, done, stamps)
    )
    proc.start()
    proc.join(4 * budget_cpu)
    proc.kill()
    proc.join()
    with done.get_lock():
        n, wall, cpu = done.value, stamps[0], stamps[1]
    return (n / wall, n / cpu) if n else (0.0, 0.0)


# -- (d) fidelity ------------------------------------------------------------------------------
def fidelity(room_utils, dim, num_boxes: int, n: int, seed: int) -> dict:
    """Run both reverse-play searches on the same rooms; count identical start states."""
    rng = np.random.default_rng(seed)
    same = total = 0
    h, w = dim
    while total < n:
        topo = room_topology(rng, dim, int(1.7 * (h + w)))
        placed = place_targets_and_player(rng, topo, num_boxes)
        if placed is None:
            continue
        player, targets = placed
        score, start, boxes = reverse_play(topo == WALL, targets, player)
        room = topo.astype(np.int64)
        room.flat[targets] = 2
        structure = room.copy()
        state = room.copy()
        state[state == 2] = 4
        state.flat[player] = 5
        best, their_score, mapping = room_utils.reverse_playing(state, structure)
        their_start = int(np.flatnonzero(best.reshape(-1) == 5)[0])
        their_boxes = tuple(
            int(r) * w + int(c) for r, c in (mapping[(t // w, t % w)] for t in targets)
        )
        same += (score, start, boxes) == (their_score, their_start, their_boxes)
        total += 1
    return {"dim": list(dim), "num_boxes": num_boxes, "rooms": total, "identical": same}


# -- main --------------------------------------------------------------------------------------
def summarise(ours: list[tuple[float, float]], theirs: list[tuple[float, float]] | None) -> dict:
    """Medians of the (wall, CPU) rates and the per-repeat ratios ours / theirs in each clock
    (repeats in which theirs finished nothing have no ratio); ``ratio`` and ``ratio_cpu`` are the
    medians of the per-repeat ratios."""
    out: dict = {"ours": [w for w, _ in ours], "ours_cpu": [c for _, c in ours]}
    out["ours_median"] = statistics.median(out["ours"])
    out["ours_cpu_median"] = statistics.median(out["ours_cpu"])
    if theirs is not None:
        out["theirs"] = [w for w, _ in theirs]
        out["theirs_cpu"] = [c for _, c in theirs]
        out["theirs_median"] = statistics.median(out["theirs"])
        out["theirs_cpu_median"] = statistics.median(out["theirs_cpu"])
        for key, i in (("ratios", 0), ("ratios_cpu", 1)):
            out[key] = [o[i] / t[i] for o, t in zip(ours, theirs, strict=True) if t[i] > 0]
        out["ratio"] = statistics.median(out["ratios"]) if out["ratios"] else None
        out["ratio_cpu"] = statistics.median(out["ratios_cpu"]) if out["ratios_cpu"] else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100_000, help="ours, steps per repeat")
    parser.add_argument(
        "--steps-theirs", type=int, default=20_000, help="tiny_rgb_array, per repeat"
    )
    parser.add_argument("--rgb-steps", type=int, default=600, help="rgb_array, steps per repeat")
    parser.add_argument(
        "--step-rooms", type=int, default=20, help="rooms the steps of a repeat are spread over"
    )
    parser.add_argument("--rooms-small", type=int, default=5000, help="ours, 6x6/1 per repeat")
    parser.add_argument("--rooms-small-theirs", type=int, default=200)
    parser.add_argument("--rooms-large", type=int, default=40, help="ours, 10x10/3 per repeat")
    parser.add_argument(
        "--budget", type=float, default=60.0, help="CPU s per repeat, theirs 10x10/3"
    )
    parser.add_argument("--fidelity-rooms", type=int, default=100)
    parser.add_argument("--ours-only", action="store_true")
    parser.add_argument(
        "--out", default=str(Path(__file__).resolve().parent / "results" / "sokoban.json")
    )
    args = parser.parse_args()
    peer = None if args.ours_only else import_gym_sokoban()
    if peer is None and not args.ours_only:
        print(SETUP, file=sys.stderr)
        raise SystemExit(2)
    GymSokoban, room_utils = peer if peer else (None, None)
    R = args.repeats
    load_before = os.getloadavg()[0]
    results: dict[str, dict] = {}
    from tqdm.auto import tqdm

    def paired(label, ours_fn, **theirs_fns):
        """Repeat r runs ours, then each of theirs, interleaved, so that load on a shared
        machine falls on both alike; one summary per entry of ``theirs_fns``."""
        ours: list = []
        theirs: dict[str, list] = {key: [] for key in theirs_fns}
        for r in tqdm(range(R), desc=label, leave=False):
            ours.append(ours_fn(r))
            if peer:
                for key, fn in theirs_fns.items():
                    theirs[key].append(fn(r))
        return {key: summarise(ours, theirs[key] if peer else None) for key in theirs_fns}

    # (a) steps: ours and theirs interleaved room by room inside each repeat
    modes = {"tiny_rgb_array": args.steps_theirs, "rgb_array": args.rgb_steps}
    ours_steps: list = []
    theirs_steps: dict[str, list] = {mode: [] for mode in modes}
    for r in tqdm(range(R), desc="steps/s", leave=False):
        ours_rate, theirs_rates = steps_per_s(
            GymSokoban, r, args.step_rooms, args.steps, modes if peer else {}
        )
        ours_steps.append(ours_rate)
        for mode, rate in theirs_rates.items():
            theirs_steps[mode].append(rate)
    results["steps_per_s"] = summarise(ours_steps, theirs_steps["tiny_rgb_array"] if peer else None)
    results["steps_per_s_vs_rgb_array"] = summarise(
        ours_steps, theirs_steps["rgb_array"] if peer else None
    )
    if not peer:
        del results["steps_per_s_vs_rgb_array"]
    results.update(
        paired(
            "6x6/1 rooms/s",
            lambda r: ours_rooms_per_s((6, 6), 1, args.rooms_small, r),
            rooms_per_s_6x6_1box=lambda r: theirs_rooms_per_s(
                room_utils, (6, 6), 1, args.rooms_small_theirs, r
            ),
        )
    )
    results.update(
        paired(
            "10x10/3 rooms/s",
            lambda r: ours_rooms_per_s((10, 10), 3, args.rooms_large, r),
            rooms_per_s_10x10_3box=lambda r: theirs_rooms_per_s_bounded(
                (10, 10), 3, args.budget, r
            ),
        )
    )
    fid = []
    if peer:
        with _quiet():
            fid = [
                fidelity(room_utils, (6, 6), 1, args.fidelity_rooms, 0),
                fidelity(room_utils, (8, 8), 2, max(args.fidelity_rooms // 5, 1), 1),
            ]

    import agentgym

    report = {
        "benchmark": "sokoban",
        "command": " ".join([sys.executable, *sys.argv]),
        "python": platform.python_version(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "versions": {
            "agentgym": agentgym.__version__,
            "numpy": np.__version__,
            "gym_sokoban": _version("gym_sokoban") if peer else None,
            "gym": _version("gym") if peer else None,
        },
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "timing": "rates per wall second and per process CPU second of the timed sections "
        "(garbage collected before each measure, collector off while it runs); gym-sokoban's "
        "10x10 rooms run in a child process and count its own CPU time",
        "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        "notes": {
            "steps_per_s": "ours: SokobanEnv.step (text observation + info) vs gym-sokoban "
            "SokobanEnv.step(observation_mode='tiny_rgb_array'), 6x6/1 box, random moves",
            "steps_per_s_vs_rgb_array": "gym-sokoban with its default rgb_array observation",
            "rooms_per_s_10x10_3box": f"gym-sokoban bounded to {args.budget} CPU s per repeat",
        },
        "results": results,
        "fidelity_reverse_play": fid,
        "targets": {
            "steps_per_s_ratio>=20": _met(results["steps_per_s"], 20),
            "rooms_per_s_6x6_1box_ratio>=10": _met(results["rooms_per_s_6x6_1box"], 10),
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps(report, indent=2) + "\n")

    print(f"\nSokoban, medians of {R} repeats ({platform.python_version()}, {os.cpu_count()} CPUs)")
    print(
        f"{'measure (per wall s)':<34}{'agentgym':>14}{'gym-sokoban':>14}{'CPU ratio':>11}{'wall':>9}"
    )
    for name, r in results.items():
        theirs = f"{r['theirs_median']:14.1f}" if "theirs_median" in r else f"{'-':>14}"
        cpu = f"{r['ratio_cpu']:10.1f}x" if r.get("ratio_cpu") else f"{'-':>11}"
        ratio = f"{r['ratio']:8.1f}x" if r.get("ratio") else f"{'-':>9}"
        print(f"{name:<34}{r['ours_median']:14.1f}{theirs}{cpu}{ratio}")
    for f in fid:
        print(
            f"reverse play identical to gym-sokoban, {f['dim'][0]}x{f['dim'][1]}/{f['num_boxes']}: "
            f"{f['identical']}/{f['rooms']}"
        )
    print(f"wrote {args.out}")


def _met(r: dict, target: float) -> bool | None:
    return None if r.get("ratio") is None else bool(r["ratio"] >= target)


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist.replace("_", "-"))
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
