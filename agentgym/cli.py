"""The ``agentgym`` command: list, play, rollout, bench, eval, models, retrieval, serve.

agentgym list                       ids, family, whether their packages and data are here
agentgym play AgentGym/Sokoban-v0   play in the terminal
agentgym rollout                    random-policy group rollout over every family (the main job)
agentgym rollout AgentGym/Sokoban-v0 --groups 16 --group-size 8
agentgym bench AgentGym/Sokoban-v0 --steps 20000 --json out.json
agentgym eval AgentGym/Sokoban-v0 --model smollm2-135m              a language model on an env
agentgym models get smollm2-135m                                     the suite's real test model
agentgym retrieval index --corpus wiki.jsonl --kind bm25 --out idx   build a search index
agentgym retrieval serve --index idx --port 8000                     serve it over HTTP
agentgym serve AgentGym/Sokoban-v0 --port 8000                       an env over OpenEnv's protocol
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np

import agentgym
from agentgym.cli_args import int_at_least, resolve_env_id
from agentgym.envs import ENTRIES, install_hint
from agentgym.extras import MissingExtra, missing_extra
from agentgym.io import atomic_write_json

_positive_int = int_at_least(1)


def _writable_file(text: str) -> str:
    """argparse type: a file path we can write (its folder exists and is writable), checked up
    front so that a long run does not fail at its last line."""
    path = os.path.abspath(text)
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: permission denied")
    return text


def _make_env(env_id: str) -> gym.Env:
    """gym.make, turning missing data or packages into one line for the user, not a traceback."""
    try:
        return gym.make(env_id)
    except FileNotFoundError as exc:
        sys.exit(f"agentgym: {env_id}: {exc.args[-1] if exc.args else exc}")
    except ImportError as exc:
        sys.exit(f"agentgym: {env_id}: {exc}")


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


# ----------------------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    rows = []
    for e in ENTRIES:
        packages = "yes" if e.available() else "missing: " + ", ".join(e.needs)
        data = e.describe_data() if e.available() else "-"
        rows.append([e.id, e.family, packages, data])
    print(_table(rows, ["id", "family", "packages", "data"]))
    return 0


def _play_help(has_legend: bool) -> str:
    """The meta commands of ``agentgym play``: all start with ':' (or are '?'), so that no
    family's own action (ALFWorld's ``help``) is taken for one."""
    lines = ["commands (they cost no step):", "  :help, ?         this help"]
    if has_legend:
        lines.append("  :legend          what the symbols mean")
    lines += [
        "  :reset           a new episode",
        "  :quit, :q        leave (or end of input)",
        "anything else is an action: its text, or its number in the list shown",
    ]
    return "\n".join(lines)


def _listed_actions(info: dict[str, Any]) -> tuple[str, list[str]]:
    """The numbered list ``play`` shows: the admissible actions, else the family's suggestions
    (free-text families such as SearchQA list none)."""
    if info.get("admissible_actions"):
        return "actions", list(info["admissible_actions"])
    return "suggested", list(info.get("suggested_actions") or [])


def cmd_play(args: argparse.Namespace) -> int:
    try:  # line editing and history for input(); absent on some platforms
        import readline  # noqa: F401
    except ImportError:
        pass
    env_id = resolve_env_id(args.env_id)
    # some ids load data or build indexes for seconds: say so before the wait
    print(f"loading {env_id} ...", file=sys.stderr, flush=True)
    env = _make_env(env_id)
    options = {"split": args.split} if args.split else None
    try:
        obs, info = env.reset(seed=args.seed, options=options)
    except (FileNotFoundError, ImportError, ValueError) as exc:
        sys.exit(f"agentgym: {env_id}: {exc}")
    legend = getattr(env.unwrapped, "legend", None)
    syntax = getattr(env.unwrapped, "action_syntax", "")
    total, done, show = 0.0, False, True
    print(f"{env_id}  task {info['task_id']}")
    if syntax:
        print(f"actions: {syntax}")
    if legend:
        print(f"legend: {legend}")
    print("type an action or its number in the list; ':help' for commands (they cost no step)")
    print()
    while True:
        kind, choices = _listed_actions(info)
        if show and not done:  # after a step or a reset, not after a meta command
            show = False
            print(obs)
            if choices:
                print(f"\n{kind}: " + "  ".join(f"[{i}] {a}" for i, a in enumerate(choices)))
        try:
            text = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            break
        if text in (":q", ":quit"):
            break
        if text in (":help", "?"):
            print(_play_help(bool(legend)))
            continue
        if text == ":legend" and legend:
            print(f"legend: {legend}")
            continue
        if text == ":reset":
            obs, info = env.reset(options=options)
            total, done, show = 0.0, False, True
            print(f"\ntask {info['task_id']}\n")
            continue
        if text.startswith(":"):
            print(f"no command {text!r}: ':help' lists them (they start with ':')")
            continue
        if done:
            print("The episode is over: ':reset' for a new one, ':quit' to leave.")
            continue
        if (
            text.isascii() and text.isdigit() and text not in choices
        ):  # a number picks from the list, never a step
            if int(text) >= len(choices):
                print(
                    f"no action [{text}]: the list has [0] to [{len(choices) - 1}]"
                    if choices
                    else f"no action [{text}]: this env lists no actions; {syntax}"
                )
                continue
            text = choices[int(text)]
        obs, reward, terminated, truncated, info = env.step(text)
        show = True
        total += float(reward)
        print(
            f"\n[reward {reward:+.2f}, return {total:+.2f}{'' if info['action_valid'] else ', invalid action'}]"
        )
        if terminated or truncated:
            done = True
            print(obs)  # the final board, once
            print(
                f"\nEpisode over: {'won' if info['won'] else 'truncated' if truncated else 'lost'}, "
                f"return {total:+.2f}. ':reset' for a new one, ':quit' to leave."
            )
    env.close()
    return 0


def _rollout_ids(requested: list[str], include_real: bool) -> tuple[list[str], list[str]]:
    if requested and requested != ["all"]:
        return [resolve_env_id(i) for i in requested], []
    ids, skipped = [], []
    for e in ENTRIES:
        if not e.available():
            skipped.append(
                f"{e.id}: packages missing ({', '.join(e.missing())}); "
                + install_hint(e.extra or "cpu")
            )
        elif e.real_data and not include_real:
            skipped.append(
                f"{e.id}: real data (add --include-real to play it: {e.describe_data()})"
            )
        else:
            ids.append(e.id)
    return ids, skipped


def _split_problem(env_id: str, split: str, seed: int) -> str | None:
    """Why ``env_id`` cannot play ``split`` (one line), or None: checked on one env before a
    rollout builds a whole group of them."""
    try:
        env = gym.make(env_id)
        env.reset(seed=seed, options={"split": split})
    except (FileNotFoundError, ImportError, ValueError) as exc:  # ResetOptionError is a ValueError
        return str(exc.args[-1] if exc.args else exc)
    env.close()
    return None


def cmd_rollout(args: argparse.Namespace) -> int:
    from agentgym.engine.cli import set_compute_threads
    from agentgym.rollout import run_group_rollout

    # the process and Ray backends start one worker per core, at most one per env
    workers = (
        0
        if args.backend == "inprocess"
        else min(os.cpu_count() or 1, args.groups * args.group_size)
    )
    set_compute_threads(args.threads, workers)
    ids, skipped = _rollout_ids(args.env_ids, args.include_real)
    rows, reports, failed = [], [], []
    reported: set[str] = set()  # failures already printed as they happened
    for env_id in ids:
        if args.split:
            # building the env may load data for seconds: say so before the wait
            print(f"loading {env_id} ...", file=sys.stderr, flush=True)
            problem = _split_problem(env_id, args.split, args.seed)
            if problem:  # one line now, not one per env of the rollout
                print(f"agentgym: {env_id}: {problem}", file=sys.stderr, flush=True)
                failed.append(f"{env_id}: {problem}")
                reported.add(failed[-1])
                continue
        print(
            f"rolling out {env_id}: {args.groups} groups x {args.group_size} ...",
            file=sys.stderr,
            flush=True,
        )
        try:
            rep = run_group_rollout(
                env_id,
                args.groups,
                args.group_size,
                seed=args.seed,
                backend=args.backend,
                reset_options={"split": args.split} if args.split else None,
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
    if not rows:
        for s in skipped:
            print(f"skipped {s}")
        for s in failed:
            if s not in reported:
                print(f"FAILED {s}", file=sys.stderr)
        print(
            "agentgym: no rollout finished: every requested env failed or was skipped (see above)",
            file=sys.stderr,
        )
        return 1
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
        if s not in reported:
            print(f"FAILED {s}", file=sys.stderr)
    if args.json:
        atomic_write_json(
            args.json,
            {"reports": reports, "skipped": skipped, "failed": failed},
            indent=2,
            default=str,
        )
    return 1 if failed else 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Env throughput with random admissible actions.

    One rate is reported, everywhere (progress bar, printout, JSON): env steps per second of time
    spent inside ``env.step`` and ``env.reset`` (the random choice of action is not timed).
    """
    from tqdm import tqdm

    env_id = resolve_env_id(args.env_id)
    env = _make_env(env_id)
    env = env.unwrapped  # time the env, not gymnasium's checker wrappers
    rng = np.random.default_rng(args.seed)
    rates, step_ms, resets = [], [], []
    for rep in range(args.repeats):
        t0 = time.perf_counter()
        obs, info = env.reset(seed=args.seed + rep)
        env_seconds = time.perf_counter() - t0
        steps, step_seconds, reset_times = 0, 0.0, []
        with tqdm(
            total=args.steps,
            desc=f"{env_id} run {rep + 1}/{args.repeats}",
            unit="step",
            disable=args.quiet,
            leave=False,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}",
        ) as bar:
            while steps < args.steps:
                choices = info.get("admissible_actions") or ["look"]
                action = choices[int(rng.integers(len(choices)))]
                t0 = time.perf_counter()
                obs, _, terminated, truncated, info = env.step(action)
                dt = time.perf_counter() - t0
                step_seconds += dt
                env_seconds += dt
                steps += 1
                if terminated or truncated:
                    t0 = time.perf_counter()
                    obs, info = env.reset()
                    dt = time.perf_counter() - t0
                    reset_times.append(dt)
                    env_seconds += dt
                if steps % 256 == 0:
                    bar.update(256)
                    bar.set_postfix_str(f"{steps / env_seconds:,.0f} steps/s")
        rates.append(steps / env_seconds)
        step_ms.append(1e3 * step_seconds / steps)
        resets.append(statistics.median(reset_times) if reset_times else float("nan"))
    env.close()
    result: dict[str, Any] = {
        "env_id": env_id,
        "what": "env steps per second of time inside env.step and env.reset, "
        "random admissible actions (choosing them is not timed)",
        "steps_per_run": args.steps,
        "repeats": args.repeats,
        "steps_per_second_median": statistics.median(rates),
        "steps_per_second_runs": rates,
        "step_ms_median": statistics.median(step_ms),
        "reset_seconds_median": statistics.median(resets),
    }
    print(
        f"{env_id}: {result['steps_per_second_median']:,.0f} steps/s (median of {args.repeats} runs; "
        f"time inside step and reset), step {result['step_ms_median']:.3f} ms, "
        f"reset {result['reset_seconds_median'] * 1e3:.2f} ms (medians); random admissible actions"
    )
    if args.json:
        atomic_write_json(args.json, result, indent=2, default=str)
    return 0


# ----------------------------------------------------------------------------------------------
# `agentgym -h`: plain text (the module docstring is reStructuredText for the API docs)
_DESCRIPTION = """text environments for training LLM agents with reinforcement learning

  agentgym list                        ids, family, whether their packages and data are here
  agentgym play Sokoban-v0             play an env in the terminal
  agentgym rollout                     random-policy group rollout over every family
  agentgym rollout Sokoban-v0 --groups 16 --group-size 8
  agentgym bench Sokoban-v0 --steps 20000 --json out.json
  agentgym eval Sokoban-v0 --model smollm2-135m      a language model on an env (or --base-url)
  agentgym models get smollm2-135m                   the suite's real test model, as a folder
  agentgym retrieval index --corpus wiki.jsonl --kind bm25 --out idx   build a search index
  agentgym retrieval serve --index idx --port 8000                     serve it over HTTP
  agentgym serve Sokoban-v0 --port 8000                 an env over OpenEnv's protocol

'agentgym COMMAND -h' shows a command's options and their defaults."""


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, where it has one worth showing (not None, False or [])."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentgym",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"agentgym {agentgym.__version__}")
    # not required=True: argparse would then report a missing command before an unknown flag
    sub = p.add_subparsers(
        dest="command", metavar="{list,play,rollout,bench,eval,models,retrieval,serve}"
    )

    sub.add_parser("list", help="registered ids, their family, packages and data").set_defaults(
        func=cmd_list
    )

    sp = sub.add_parser(
        "play", help="play an env in the terminal", formatter_class=_DefaultsFormatter
    )
    sp.add_argument(
        "env_id", help="an id from 'agentgym list' (the AgentGym/ prefix may be left out)"
    )
    sp.add_argument("--seed", type=int, default=None, help="seed of the first task (none: random)")
    sp.add_argument("--split", default=None, help="task split, where the family has them")
    sp.set_defaults(func=cmd_play)

    sr = sub.add_parser(
        "rollout",
        help="group rollout with a policy; prints success, return, steps/s and state-group stats",
        formatter_class=_DefaultsFormatter,
    )
    sr.add_argument(
        "env_ids",
        nargs="*",
        default=[],
        help="ids to roll out (default: every family with no data to download)",
    )
    sr.add_argument("--groups", type=_positive_int, default=4, help="tasks per rollout")
    sr.add_argument("--group-size", type=_positive_int, default=8, help="trajectories per task")
    sr.add_argument("--split", default=None, help="task split, where the family has them")
    sr.add_argument(
        "--policy",
        choices=["random"],
        default="random",
        help="random: uniform over admissible actions",
    )
    sr.add_argument("--seed", type=int, default=0, help="seed of the tasks and the policy")
    sr.add_argument(
        "--backend",
        choices=["inprocess", "process", "ray"],
        default="inprocess",
        help="where the envs run: this process, a worker pool, or Ray actors",
    )
    sr.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="compute threads per process (default: $OMP_NUM_THREADS, else the cores shared "
        "by this process and the backend's workers)",
    )
    sr.add_argument(
        "--include-real",
        action="store_true",
        help="also roll out ids that play real benchmark data",
    )
    sr.add_argument(
        "--json", type=_writable_file, default=None, help="write the reports to this file"
    )
    sr.set_defaults(func=cmd_rollout)

    sb = sub.add_parser(
        "bench",
        help="steps/s of one env with random admissible actions",
        formatter_class=_DefaultsFormatter,
    )
    sb.add_argument("env_id", help="an id from 'agentgym list'")
    sb.add_argument("--steps", type=_positive_int, default=20000, help="steps per repeat")
    sb.add_argument("--repeats", type=_positive_int, default=5, help="runs; the median is reported")
    sb.add_argument("--seed", type=int, default=0, help="seed of the first reset and the actions")
    sb.add_argument(
        "--json", type=_writable_file, default=None, help="write the figures to this file"
    )
    sb.add_argument("--quiet", action="store_true", help="no progress bar")
    sb.set_defaults(func=cmd_bench)

    # `agentgym retrieval index|serve`: the retrieval stack owns its own sub-commands
    from agentgym.retrieval.cli import add_parser as add_retrieval_parser

    add_retrieval_parser(sub)

    # `agentgym serve`: an env over OpenEnv's protocol (openenv-core is imported only when run)
    from agentgym.integrations.openenv_cli import add_parser as add_serve_parser

    add_serve_parser(sub)
    from agentgym.engine.cli import add_parser as add_eval_parser  # `agentgym eval`, `models`

    add_eval_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error(
            "choose a command: list, play, rollout, bench, retrieval or serve ('agentgym -h')"
        )
    try:
        return int(args.func(args) or 0)
    except KeyError as exc:  # unknown ids from the registry
        sys.exit(f"agentgym: {exc.args[0]}")
    except MissingExtra as exc:  # an optional package the command needs: the extra to install
        print(f"agentgym {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # one imported without a guard of its own
        extra = extra_of(exc.name, args.command)
        if extra is None:
            raise
        what, module = f"agentgym {args.command}", (exc.name or "").split(".")[0]
        print(f"{what}: error: {missing_extra(what, module, extra)}", file=sys.stderr)
        return 2


#: The extra of pyproject.toml that installs each optional package a command may import.
_EXTRA_OF_MODULE = {
    "torch": "train", "transformers": "train", "tokenizers": "train", "peft": "train",
    "safetensors": "train", "httpx": "eval", "faiss": "retrieval",
    "sentence_transformers": "retrieval", "bm25s": "searchqa", "pyarrow": "searchqa",
    "numba": "searchqa", "pyserini": "pyserini", "rapidfuzz": "webshop", "spacy": "spacy",
    "ray": "ray", "vllm": "vllm", "trl": "trl", "openenv": "openenv", "websockets": "openenv",
    "textworld": "alfworld", "alfworld": "alfworld",
}  # fmt: skip
#: Servers' packages, installed by more than one extra: the one of the command that needs them.
_SERVER_MODULES = ("fastapi", "uvicorn", "pydantic", "starlette")
_EXTRA_OF_COMMAND = {"serve": "openenv", "retrieval": "retrieval", "eval": "eval"}


def extra_of(module: str | None, command: str) -> str | None:
    """The extra that installs ``module`` (a missing import of ``agentgym command``), or None
    for a module no extra installs (a genuine bug, left to raise)."""
    top = (module or "").split(".")[0]
    if top in _SERVER_MODULES:
        return _EXTRA_OF_COMMAND.get(command)
    return _EXTRA_OF_MODULE.get(top)


if __name__ == "__main__":
    sys.exit(main())
