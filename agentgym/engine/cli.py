"""``agentgym eval`` and ``agentgym models``: real language models against the envs.

agentgym eval AgentGym/Sokoban-v0 --model smollm2-135m --tasks 4 --group-size 2 --max-episode-steps 8
agentgym eval Sokoban-v0 ALFWorld-Synthetic-v0 --base-url http://127.0.0.1:8000 --temperature 0
agentgym eval Corridor-v0 --llama-server ~/llama.cpp/build/bin/llama-server --group-size 4 --temperature 1
agentgym eval ALFWorld-Synthetic-v0 --model smollm2-135m --policy scored
agentgym models get smollm2-135m

Each env id plays ``--group-size`` episodes on each task of the task set, all from the same
initial state, with the family's LLM prompt and action format; it prints a table per env and
writes ``results.json`` (summaries and settings, atomically) and ``trajectories.jsonl`` (every
turn of every episode, appended as each episode finishes) to ``--out-dir``, created when the first
result is written (a run that fails to start leaves nothing behind). A folder that already holds
a run is refused unless ``--overwrite`` (which replaces both files). Ctrl-C stops the run and
writes what has finished.

``--model`` runs torch on ``--threads`` CPU threads (default: the cores this process may use, or
``$OMP_NUM_THREADS`` when set); on a machine other work keeps busy, pass fewer: decoding with
more threads than free cores is many times slower than with one.

``--llama-server PATH`` starts that llama.cpp ``llama-server`` on 127.0.0.1 with a GGUF model
(``--gguf``, default the suite's SmolLM2-135M-Instruct), evaluates against it and stops it.

Exit status: 0 when the model answered; 1 when nothing useful ran (no episode played a turn, or
every turn failed: the server was down or refused every request); 2 for a setup error (bad
arguments, no env id that can run, a server that refuses the first request: a wrong
``--served-model``, path or key); 130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from agentgym.cli_args import add_max_episode_steps, int_at_least, resolve_env_id
from agentgym.engine.policies.base import Messages, Policy, PolicyOutput, SamplingParams
from agentgym.io import atomic_write_json

if TYPE_CHECKING:  # pragma: no cover - typing only
    from agentgym.engine.llama_server import LlamaServer
    from agentgym.engine.runner import EpisodeRecord

__all__ = [
    "add_parser",
    "cmd_eval",
    "cmd_models",
    "cpu_cores",
    "default_threads",
    "main",
    "set_compute_threads",
]


_positive_int = int_at_least(1)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _seconds(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected seconds > 0")
    return value


def _top_p(text: str) -> float:
    value = _non_negative_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"top-p is in (0, 1], got {text}")
    return value


def _task_ids(text: str) -> list[int | str]:
    """``0,3,7`` or ``corridor-train-0,corridor-train-1``: indices stay ints, ids stay strings."""
    out: list[int | str] = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(int(part) if part.isdigit() else part)
    if not out:
        raise argparse.ArgumentTypeError("expected comma-separated task indices or ids")
    return out


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def default_threads(cores: int, workers: int = 0) -> int:
    """Compute threads per process when a command runs ``1 + workers`` busy processes on
    ``cores`` cores: ``cores // (1 + workers)``, at least 1, so that together they never ask
    for more threads than there are cores (an oversubscribed torch decode is many times slower:
    its threads spin at every barrier waiting for a thread that is not running)."""
    if cores < 1 or workers < 0:
        raise ValueError(f"need cores >= 1 and workers >= 0, got {cores} and {workers}")
    return max(1, cores // (1 + workers))


def set_compute_threads(threads: int | None, workers: int = 0) -> int:
    """Choose and apply the compute threads of this command; the number chosen.

    ``threads`` (``--threads``) wins; else ``$OMP_NUM_THREADS`` when set to a positive integer;
    else :func:`default_threads` of :func:`cpu_cores` and ``workers`` (the processes the
    command starts besides this one). Sets ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` for the
    processes started from here on, and torch's intra- and inter-op threads when torch has
    been imported (torch reads the variables when it is imported later).
    """
    if threads is None:
        from_env = os.environ.get("OMP_NUM_THREADS", "")
        threads = (
            int(from_env)
            if from_env.isdigit() and int(from_env) > 0
            else default_threads(cpu_cores(), workers)
        )
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # settable once, before any inter-op work: keep what is in force
            pass
    return threads


def _say(message: str) -> None:
    print(f"agentgym eval: {message}", file=sys.stderr, flush=True)


def _model_folder(name_or_path: str) -> str:
    """A known model name (``smollm2-135m``) through :mod:`agentgym.models`, else a path/hub id."""
    from agentgym.models import KNOWN_MODELS, model_path

    if name_or_path in KNOWN_MODELS:
        return str(model_path(name_or_path))
    return name_or_path


def _build_policy(args: argparse.Namespace):
    """The policy the arguments ask for (``--llama-server`` has been started: ``base_url``)."""
    from agentgym.engine.policies import (
        OpenAIChatPolicy,
        OpenAICompletionsScorer,
        ScoredActionPolicy,
        TransformersPolicy,
    )

    if args.stream and (args.model is not None or args.policy == "scored"):
        raise ValueError(
            "--stream streams chat replies from a server: use it with --base-url or "
            "--llama-server and the free policy"
        )
    if args.model is not None:
        folder = _model_folder(args.model)
        threads = set_compute_threads(args.threads)
        _say(f"loading {folder} on {args.device} ({threads} CPU thread{'s' * (threads > 1)})")
        local = TransformersPolicy(folder, device=args.device, seed=args.seed)
        set_compute_threads(threads)  # again: torch is imported now
        return (
            ScoredActionPolicy(local, reduce=args.reduce, seed=args.seed)
            if args.policy == "scored"
            else local
        )
    if args.policy == "scored":
        tokenizer = args.tokenizer or args.served_model
        if tokenizer is None:
            raise ValueError(
                "--policy scored with --base-url applies the chat template here: pass --tokenizer "
                "(a folder or hub name of the served model's tokenizer)"
            )
        scorer = OpenAICompletionsScorer(
            args.base_url,
            _model_folder(tokenizer),
            args.api_key,
            args.served_model,
            timeout=args.timeout,
            retries=args.retries,
        )
        return ScoredActionPolicy(scorer, reduce=args.reduce, seed=args.seed)
    return OpenAIChatPolicy(
        args.base_url,
        args.api_key,
        args.served_model,
        timeout=args.timeout,
        retries=args.retries,
        stream=args.stream,
    )


def _start_llama_server(args: argparse.Namespace) -> LlamaServer:
    """Start ``--llama-server`` and point ``--base-url`` at it; the server, to stop later."""
    from agentgym.engine.llama_server import LlamaServer

    server = LlamaServer(
        args.llama_server,
        args.gguf,
        slots=args.llama_slots or args.concurrency,
        threads=args.llama_threads,
        ctx_per_slot=args.llama_ctx,
        extra_args=args.llama_arg,
    )
    _say(f"starting {server.binary} with {server.model_file.name}")
    server.start()
    _say(f"llama-server ready at {server.base_url} in {server.start_s:.1f} s")
    args.base_url, args.served_model = server.base_url, server.model
    return server


class _Progress(Policy):
    """Wraps a policy to show turns, tokens and failed turns on the progress bar as each turn
    comes back (a long episode otherwise shows nothing until it ends)."""

    def __init__(self, inner: Policy, bar: Any):
        self.inner = inner
        self.plain_actions = inner.plain_actions
        self.bar = bar
        self.turns = self.tokens = self.failed = 0
        self._shown = 0.0

    async def act(
        self, messages: Messages, params: SamplingParams, info: dict[str, Any] | None = None
    ) -> PolicyOutput:
        out = await self.inner.act(messages, params, info)
        self.turns += 1
        self.failed += out.error is not None
        self.tokens += out.completion_tokens or len(out.token_ids or ())
        now = time.monotonic()
        if now - self._shown > 0.5:  # redrawing on every turn would cost more than the turn
            self._shown = now
            postfix = {"turns": self.turns, "tokens": self.tokens}
            if self.failed:
                postfix["failed"] = self.failed
            self.bar.set_postfix(postfix)
        return out

    async def aclose(self) -> None:
        await self.inner.aclose()

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


class _CannotWrite(Exception):
    """The output folder could not be created or written."""


class _RunFolder:
    """``--out-dir``: created, and an earlier run's files replaced, only when this run writes its
    first result, so a run that fails to start leaves no folder and no half-replaced run."""

    def __init__(self, path: Path):
        self.path = path
        self.results = path / "results.json"
        self.trajectories = path / "trajectories.jsonl"
        self._file: IO[str] | None = None

    def earlier_run(self) -> list[str]:
        """The files of an earlier run in the folder."""
        return [f.name for f in (self.results, self.trajectories) if f.exists()]

    def writable(self) -> str | None:
        """Why the folder cannot be written (checked on the nearest existing parent), or None."""
        probe = self.path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            return f"{probe} is not a folder"
        if not os.access(probe, os.W_OK | os.X_OK):
            return f"{probe} is not writable"
        return None

    def _open(self) -> IO[str]:
        if self._file is None:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                # --overwrite: the earlier summary goes with the earlier trajectories
                self.results.unlink(missing_ok=True)
                self._file = self.trajectories.open("w")
            except OSError as exc:
                raise _CannotWrite(f"cannot write to {self.path} ({exc.strerror or exc})") from exc
        return self._file

    def add_episode(self, record: dict[str, Any]) -> None:
        """Append one finished episode to ``trajectories.jsonl``."""
        file = self._open()
        file.write(json.dumps(record, default=str) + "\n")
        file.flush()

    def write_results(self, results: dict[str, Any]) -> None:
        """Write ``results.json`` atomically (and an empty ``trajectories.jsonl`` beside it when
        no episode finished)."""
        self._open()
        try:
            atomic_write_json(self.results, results, indent=2, default=str)
        except OSError as exc:
            raise _CannotWrite(f"cannot write {self.results} ({exc.strerror or exc})") from exc

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _problem(runnable: list[str], finished: list[EpisodeRecord]) -> tuple[int, str] | None:
    """(exit status, why) when the run produced nothing to evaluate, else None."""
    from collections import Counter

    if not runnable:
        return 2, "nothing to evaluate: no env id could run (see the lines above)"
    if not finished:
        return 1, "no episode finished"
    turns = [t for r in finished for t in r.turns]
    if not turns:
        ends = Counter(r.end_reason for r in finished)
        first = next((r.error for r in finished if r.error), None)
        return 1, f"no episode played a turn ({dict(ends)})" + (
            f"; first: {first}" if first else ""
        )
    failed = [t for t in turns if t.error is not None]
    if len(failed) == len(turns):
        kinds = dict(Counter(t.error_kind or "error" for t in failed))
        return 1, (
            f"every one of the {len(turns)} turns failed {kinds}, no model answer was recorded; "
            f"the first: {failed[0].error}"
        )
    return None


def _check_env(env_id: str, args: argparse.Namespace, plain: bool) -> str | None:
    """Build the env once (warming its caches) and reset it on the first task: why it cannot
    be evaluated, or None."""
    from agentgym.engine.policies import candidate_actions
    from agentgym.envs import entry
    from agentgym.wrappers.llm import make_llm_env

    try:
        entry(env_id).check_available()
        env = make_llm_env(env_id, fmt="plain" if plain else None)
        options: dict[str, Any] = {}
        if args.split:
            options["split"] = args.split
        first = args.task_ids[0] if args.task_ids else 0
        _, info = env.reset(seed=args.seed, options={**options, "task": first})
        env.close()
    except Exception as exc:  # noqa: BLE001 - one env's problem skips that env only
        return f"{type(exc).__name__}: {exc}"
    if args.policy == "scored" and not candidate_actions(info):
        return "--policy scored needs admissible or suggested actions, and this env lists none"
    return None


def cmd_eval(args: argparse.Namespace) -> int:
    """Run the evaluation; the exit status is in the module's docstring."""
    from agentgym.engine.llama_server import LlamaServerError
    from agentgym.models import ModelNotAvailable

    try:
        env_ids = [resolve_env_id(e) for e in args.env_ids]
    except KeyError as exc:
        _say(f"error: {exc.args[0]}")
        return 2
    out = _RunFolder(
        Path(args.out_dir or time.strftime("agentgym-eval-%Y%m%d-%H%M%S", time.gmtime()))
    )
    problem = out.writable()
    if problem is not None:
        _say(f"error: cannot write to {out.path} ({problem}); pass a writable --out-dir")
        return 2
    earlier = out.earlier_run()
    if earlier and not args.overwrite:
        _say(
            f"error: {out.path} holds an earlier run ({', '.join(earlier)}); pass --overwrite "
            "to replace it, or another --out-dir"
        )
        return 2
    if args.llama_server is not None and args.policy == "scored":
        _say(
            "error: --policy scored needs prompt log-probs (/v1/completions with echo), which "
            "llama-server does not return; use --model smollm2-135m for scored actions"
        )
        return 2
    server = None
    try:
        if args.llama_server is not None:
            server = _start_llama_server(args)
        policy = _build_policy(args)
    except (ModelNotAvailable, LlamaServerError, ValueError, OSError, ImportError) as exc:
        if server is not None:
            server.stop()
        _say(f"error: {exc}")
        return 2
    try:
        return _evaluate(args, env_ids, out, policy, server)
    except _CannotWrite as exc:
        _say(f"error: {exc}; pass a writable --out-dir")
        return 2
    finally:
        out.close()
        if server is not None:
            server.stop()


def _evaluate(
    args: argparse.Namespace,
    env_ids: list[str],
    out: _RunFolder,
    policy: Policy,
    server: LlamaServer | None,
) -> int:
    """Check the envs, play the episodes, write and print the results; the exit status."""
    from agentgym.engine.policies import PolicyUnavailable
    from agentgym.engine.report import format_table, summarize
    from agentgym.engine.runner import RolloutEngine, make_episodes

    skipped: dict[str, str] = {}
    for env_id in env_ids:
        reason = _check_env(env_id, args, policy.plain_actions)
        if reason is not None:
            skipped[env_id] = reason
            _say(f"skipping {env_id}: {reason}")
    runnable = [e for e in env_ids if e not in skipped]
    tasks = args.task_ids if args.task_ids else args.tasks
    cap = None if args.max_episode_steps is None else {"max_episode_steps": args.max_episode_steps}
    specs = make_episodes(
        runnable, tasks, args.group_size, seed=args.seed, split=args.split, env_kwargs=cap
    )

    finished: list[EpisodeRecord] = []
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=len(specs), desc="episodes", unit="ep", file=sys.stderr)
        policy = _Progress(policy, bar)

    def on_episode(record: EpisodeRecord) -> None:
        finished.append(record)
        out.add_episode(record.to_json())
        if bar is not None:
            bar.update(1)

    params = SamplingParams(args.temperature, args.top_p, args.max_tokens)
    engine = RolloutEngine(
        policy,
        params,
        concurrency=args.concurrency,
        policy_version=args.policy_version,
        lockstep=args.lockstep,
        history_length=args.history_length,
        on_episode=on_episode,
    )

    async def run() -> None:
        try:
            await engine.run(specs)
        finally:
            await policy.aclose()

    interrupted = False
    fatal: str | None = None
    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        interrupted = True
    except PolicyUnavailable as exc:
        fatal = str(exc)
    finally:
        if bar is not None:
            bar.close()
        engine.close()

    results: dict[str, Any] = {
        "settings": {
            # never the API key: results files get shared
            **{k: v for k, v in vars(args).items() if k not in ("func", "api_key")},
            "policy_info": policy.describe(),
            **({"server": server.describe()} if server is not None else {}),
            "sampling": vars(params) if hasattr(params, "__dict__") else str(params),
            **(
                {"torch_threads": sys.modules["torch"].get_num_threads()}
                if "torch" in sys.modules
                else {}
            ),
        },
        "complete": not interrupted and fatal is None and len(finished) == len(specs) > 0,
        "episodes_planned": len(specs),
        "episodes_finished": len(finished),
        "skipped": skipped,
        "engine": engine.stats.to_json(),
        "envs": {},
    }
    for env_id in runnable:
        done = [r for r in finished if r.env_id == env_id]
        if not done:
            continue
        summary = summarize(done, group_size=args.group_size, temperature=args.temperature)
        results["envs"][env_id] = summary
        print(format_table(env_id, summary))
        for warning in summary["warnings"]:
            _say(f"warning ({env_id}): {warning}")
    problem = None if interrupted or fatal else _problem(runnable, finished)
    if fatal:
        results["error"] = fatal
    elif problem is not None:
        results["error"] = problem[1]
    results["ok"] = not interrupted and fatal is None and problem is None
    out_dir = out.path
    written = bool(runnable) or args.out_dir is not None  # no folder for a run that never started
    if written:
        out.write_results(results)
    if interrupted:
        _say(
            f"interrupted: wrote the {len(finished)} of {len(specs)} episodes that finished to "
            f"{out_dir}"
        )
        return 130
    if fatal:
        _say(f"error: {fatal}")
        return 2
    if problem is not None:
        _say(f"error: {problem[1]}" + (f" (details in {out.results})" if written else ""))
        return problem[0]
    _say(f"wrote {out.results} and {out.trajectories}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """``agentgym models get NAME``: convert once, print the folder."""
    from agentgym.models import KNOWN_MODELS, ModelNotAvailable, model_path

    if args.models_command == "list":
        for name, source in KNOWN_MODELS.items():
            print(f"{name:<16} {source.description} (package: {source.install})")
        return 0
    try:
        print(model_path(args.name))
    except ModelNotAvailable as exc:
        print(f"agentgym models: error: {exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``eval`` and ``models`` commands to the main parser."""
    p = sub.add_parser(
        "eval",
        help="evaluate a real language model (local or OpenAI-compatible server) on env ids",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "env_ids", nargs="+", help="registered ids, e.g. AgentGym/Sokoban-v0 (or Sokoban-v0)"
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model", help="a local transformers folder or hub name, or smollm2-135m (agentgym models)"
    )
    source.add_argument(
        "--base-url", help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000"
    )
    source.add_argument(
        "--llama-server",
        metavar="PATH",
        help="start this llama.cpp llama-server binary on 127.0.0.1 with --gguf, evaluate "
        "against it, stop it",
    )
    p.add_argument(
        "--gguf",
        default=None,
        help="with --llama-server: a GGUF file or smollm2-135m (default smollm2-135m)",
    )
    p.add_argument(
        "--llama-slots",
        type=_positive_int,
        default=None,
        help="with --llama-server: requests decoded at once (default: --concurrency)",
    )
    p.add_argument(
        "--llama-threads",
        type=_positive_int,
        default=1,
        help="with --llama-server: CPU threads (1; more than free cores is far slower)",
    )
    p.add_argument(
        "--llama-ctx",
        type=int_at_least(64),
        default=2048,
        help="with --llama-server: context tokens per slot (2048)",
    )
    p.add_argument(
        "--llama-arg",
        action="append",
        default=[],
        help="with --llama-server: one more flag for it (repeat; e.g. --llama-arg=--no-warmup)",
    )
    p.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token ($OPENAI_API_KEY)"
    )
    p.add_argument(
        "--served-model", default=None, help="the server's model name (default: its first)"
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="with --base-url --policy scored: the served model's tokenizer",
    )
    p.add_argument(
        "--policy",
        choices=["free", "scored"],
        default="free",
        help="free: the model writes the family's response format; scored: pick among the "
        "admissible actions by the model's log-likelihood (needs logits: --model, or a server "
        "returning prompt log-probs)",
    )
    p.add_argument(
        "--reduce",
        choices=["sum", "mean"],
        default="sum",
        help="scored: action score = sum or mean of token log-probs",
    )
    p.add_argument("--group-size", type=_positive_int, default=1, help="episodes per task (1)")
    tasks = p.add_mutually_exclusive_group()
    tasks.add_argument("--tasks", type=_positive_int, default=4, help="tasks 0..N-1 (4)")
    tasks.add_argument(
        "--task-ids", type=_task_ids, default=None, help="comma-separated task indices or ids"
    )
    p.add_argument("--split", default=None, help="task split, where the family has them")
    p.add_argument("--temperature", type=_non_negative_float, default=0.0, help="0 is greedy (0)")
    p.add_argument("--top-p", type=_top_p, default=1.0)
    p.add_argument(
        "--max-tokens", type=_positive_int, default=256, help="new tokens per turn (256)"
    )
    add_max_episode_steps(
        p, "turns per episode, the env's step cap (default: the id's)", "--max-turns"
    )
    p.add_argument("--concurrency", type=_positive_int, default=8, help="requests in flight (8)")
    p.add_argument(
        "--history-length", type=_non_negative_int, default=2, help="past steps in each prompt (2)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=_seconds, default=120.0, help="seconds per request (120)")
    p.add_argument("--retries", type=_non_negative_int, default=2, help="retries per request (2)")
    p.add_argument(
        "--stream",
        action="store_true",
        help="with --base-url: stream each reply (server-sent events), so a server that stops "
        "generating only for streamed requests (transformers serve) stops when a request is "
        "abandoned at --timeout; the results are the same",
    )
    p.add_argument("--device", default="auto", help="with --model: auto, cpu, cuda:0 ...")
    p.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="with --model: torch's CPU threads (default: $OMP_NUM_THREADS, else the cores "
        "this process may use; fewer on a busy machine: more threads than free cores is far "
        "slower than one)",
    )
    p.add_argument("--policy-version", default="0", help="recorded on every turn")
    p.add_argument(
        "--lockstep", action="store_true", help="generate for all episodes, then step all"
    )
    p.add_argument(
        "--out-dir",
        default=None,
        help="where results.json and trajectories.jsonl go (default: agentgym-eval-<UTC time> "
        "here, created when the first result is written)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run an existing --out-dir holds (both files); without it such a "
        "folder is refused",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)

    m = sub.add_parser("models", help="real models the suite runs with (agentgym models get NAME)")
    msub = m.add_subparsers(dest="models_command", required=True)
    g = msub.add_parser("get", help="convert a known model to a transformers folder once; print it")
    g.add_argument("name", help="e.g. smollm2-135m")
    g.set_defaults(func=cmd_models)
    msub.add_parser("list", help="known models").set_defaults(func=cmd_models)


def main(argv: list[str] | None = None) -> int:
    """``python -m agentgym.engine.cli eval ...`` / ``... models get NAME``: on their own."""
    parser = argparse.ArgumentParser(prog="agentgym")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
