"""The ``agentgym`` command: list, play, rollout, bench.

agentgym list                       ids, family, whether their packages and data are here
agentgym play AgentGym/Sokoban-v0   play in the terminal
agentgym rollout                    random-policy group rollout over every family (the main job)
agentgym rollout AgentGym/Sokoban-v0 --groups 16 --group-size 8
agentgym bench AgentGym/Sokoban-v0 --steps 20000 --json out.json
agentgym retrieval index --corpus wiki.jsonl --kind bm25 --out idx   build a search index
agentgym retrieval serve --index idx --port 8000                     serve it over HTTP
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np

import agentgym
from agentgym.envs import ENTRIES


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _resolve(env_id: str) -> str:
    """Accept ``Sokoban-v0`` or a full id; exit with the known ids on a typo."""
    ids = [e.id for e in ENTRIES]
    if env_id in ids:
        return env_id
    if f"AgentGym/{env_id}" in ids:
        return f"AgentGym/{env_id}"
    sys.exit(f"agentgym: unknown env id {env_id!r}. Registered ids:\n  " + "\n  ".join(ids))


# ----------------------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    rows = []
    for e in ENTRIES:
        packages = "yes" if e.available() else "missing: " + ", ".join(e.needs)
        data = e.describe_data() if e.available() else "-"
        rows.append([e.id, e.family, packages, data])
    print(_table(rows, ["id", "family", "packages", "data"]))
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    env_id = _resolve(args.env_id)
    env = gym.make(env_id)
    obs, info = env.reset(seed=args.seed)
    total = 0.0
    print(
        f"{env_id}  task {info['task_id']}  (type an action, a number from the list, "
        "':reset' or ':quit')\n"
    )
    while True:
        print(obs)
        choices = info.get("admissible_actions") or []
        if choices:
            print("\nactions: " + "  ".join(f"[{i}] {a}" for i, a in enumerate(choices)))
        try:
            text = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            break
        if text in (":q", ":quit", "quit"):
            break
        if text == ":reset":
            obs, info = env.reset()
            total = 0.0
            continue
        if text.isdigit() and int(text) < len(choices):
            text = choices[int(text)]
        obs, reward, terminated, truncated, info = env.step(text)
        total += float(reward)
        print(
            f"\n[reward {reward:+.2f}, return {total:+.2f}{'' if info['action_valid'] else ', invalid action'}]"
        )
        if terminated or truncated:
            print(obs)
            print(
                f"\nEpisode over: {'won' if info['won'] else 'truncated' if truncated else 'lost'}, "
                f"return {total:+.2f}. ':reset' for a new one, ':quit' to leave."
            )
    env.close()
    return 0


def _rollout_ids(requested: list[str], include_real: bool) -> tuple[list[str], list[str]]:
    if requested and requested != ["all"]:
        return [_resolve(i) for i in requested], []
    ids, skipped = [], []
    for e in ENTRIES:
        if not e.available():
            skipped.append(
                f"{e.id}: packages missing ({', '.join(e.needs)}); pip install 'agentgym[cpu]'"
            )
        elif e.real_data and not include_real:
            skipped.append(
                f"{e.id}: real data (add --include-real to play it: {e.describe_data()})"
            )
        else:
            ids.append(e.id)
    return ids, skipped


def cmd_rollout(args: argparse.Namespace) -> int:
    from agentgym.rollout import run_group_rollout

    ids, skipped = _rollout_ids(args.env_ids, args.include_real)
    rows, reports, failed = [], [], []
    for env_id in ids:
        print(
            f"rolling out {env_id}: {args.groups} groups x {args.group_size} ...",
            file=sys.stderr,
            flush=True,
        )
        try:
            rep = run_group_rollout(
                env_id, args.groups, args.group_size, seed=args.seed, backend=args.backend
            )
        except Exception as exc:  # noqa: BLE001 - report every family, then fail at the end
            failed.append(f"{env_id}: {type(exc).__name__}: {exc}")
            continue
        reports.append(rep.as_dict())
        sg = rep.state_groups
        rows.append(
            [
                env_id.removeprefix("AgentGym/"),
                f"{rep.episodes}",
                f"{rep.success_rate:.1%}",
                f"{rep.mean_return:+.2f}",
                f"{rep.mean_length:.1f}",
                f"{rep.steps_per_second:,.0f}",
                f"{sg.shared_fraction:.1%}",
                f"{sg.num_step_groups}",
                f"{sg.mean_group_size:.2f}",
                f"{sg.singleton_fraction:.1%}",
            ]
        )
    print(
        _table(
            rows,
            [
                "env",
                "episodes",
                "success",
                "return",
                "length",
                "steps/s",
                "shared-state steps",
                "step groups",
                "mean size",
                "singletons",
            ],
        )
    )
    print(
        f"\npolicy: {args.policy}; seed {args.seed}; backend {args.backend}. 'shared-state steps': "
        "steps whose canonical state another trajectory of the same group also visited."
    )
    for s in skipped:
        print(f"skipped {s}")
    for s in failed:
        print(f"FAILED {s}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"reports": reports, "skipped": skipped, "failed": failed}, f, indent=2, default=str
            )
    return 1 if failed else 0


def cmd_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    env_id = _resolve(args.env_id)
    env = gym.make(env_id, disable_env_checker=True)
    rng = np.random.default_rng(args.seed)
    rates, resets = [], []
    for rep in range(args.repeats):
        obs, info = env.reset(seed=args.seed + rep)
        steps, reset_times, seconds = 0, [], 0.0
        with tqdm(
            total=args.steps,
            desc=f"{env_id} run {rep + 1}/{args.repeats}",
            unit="step",
            disable=args.quiet,
            leave=False,
        ) as bar:
            while steps < args.steps:
                choices = info.get("admissible_actions") or ["look"]
                action = choices[int(rng.integers(len(choices)))]
                t0 = time.perf_counter()
                obs, _, terminated, truncated, info = env.step(action)
                seconds += time.perf_counter() - t0
                steps += 1
                if steps % 256 == 0:
                    bar.update(256)
                if terminated or truncated:
                    t0 = time.perf_counter()
                    obs, info = env.reset()
                    reset_times.append(time.perf_counter() - t0)
        rates.append(steps / seconds)
        resets.append(statistics.median(reset_times) if reset_times else float("nan"))
    env.close()
    result: dict[str, Any] = {
        "env_id": env_id,
        "steps_per_run": args.steps,
        "repeats": args.repeats,
        "steps_per_second_median": statistics.median(rates),
        "steps_per_second_runs": rates,
        "reset_seconds_median": statistics.median(resets),
    }
    print(
        f"{env_id}: {result['steps_per_second_median']:,.0f} steps/s (median of {args.repeats}), "
        f"reset {result['reset_seconds_median'] * 1e3:.2f} ms (median); random admissible actions"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


# ----------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentgym", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"agentgym {agentgym.__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="registered ids, their family, packages and data").set_defaults(
        func=cmd_list
    )

    sp = sub.add_parser("play", help="play an env in the terminal")
    sp.add_argument("env_id")
    sp.add_argument("--seed", type=int, default=None)
    sp.set_defaults(func=cmd_play)

    sr = sub.add_parser(
        "rollout",
        help="group rollout with a policy; prints success, return, steps/s and state-group stats",
    )
    sr.add_argument(
        "env_ids",
        nargs="*",
        default=[],
        help="ids to roll out (default: every family with no data to download)",
    )
    sr.add_argument("--groups", type=int, default=4, help="tasks per rollout")
    sr.add_argument("--group-size", type=int, default=8, help="trajectories per task")
    sr.add_argument(
        "--policy",
        choices=["random"],
        default="random",
        help="random: uniform over admissible actions",
    )
    sr.add_argument("--seed", type=int, default=0)
    sr.add_argument("--backend", choices=["inprocess", "process"], default="inprocess")
    sr.add_argument(
        "--include-real",
        action="store_true",
        help="also roll out ids that play real benchmark data",
    )
    sr.add_argument("--json", default=None, help="write the reports to this file")
    sr.set_defaults(func=cmd_rollout)

    sb = sub.add_parser("bench", help="steps/s of one env with random admissible actions")
    sb.add_argument("env_id")
    sb.add_argument("--steps", type=int, default=20000, help="steps per repeat")
    sb.add_argument("--repeats", type=int, default=5)
    sb.add_argument("--seed", type=int, default=0)
    sb.add_argument("--json", default=None, help="write the figures to this file")
    sb.add_argument("--quiet", action="store_true", help="no progress bar")
    sb.set_defaults(func=cmd_bench)

    # `agentgym retrieval index|serve`: the retrieval stack owns its own sub-commands
    from agentgym.retrieval.cli import add_parser as add_retrieval_parser

    add_retrieval_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyError as exc:  # unknown ids from the registry
        sys.exit(f"agentgym: {exc.args[0]}")


if __name__ == "__main__":
    sys.exit(main())
