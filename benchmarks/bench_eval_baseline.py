"""Zero-shot baseline of SmolLM2-135M-Instruct on every family, beside the random policy.

Arms, each on the same tasks of every env id (the engine and summaries behind ``agentgym eval``,
one model load for all arms):

- ``free-greedy``: the model writes the family's response format (``<think>``/``<action>``, or
  ``<search>``/``<answer>`` for QA) at temperature 0 (one episode per task: greedy members of a
  group are identical);
- ``free-sampled``: the same at temperature 1, ``--group-size`` episodes per task (pass@k);
- ``scored``: ``--policy scored``, the admissible (or suggested) action with the highest
  log-likelihood as the reply, greedy;
- ``random``: uniform over the same candidate actions the scored policy chooses among.

Every arm runs at the same turn cap (``--max-turns``) so the rates compare. Real-data ids play
when their data is under ``$AGENTGYM_SHARED_DATA`` (ALFWorld valid_seen, WebShop's 1000-product
catalogue; unpacked into a temporary folder), else they are listed as skipped.

    python benchmarks/bench_eval_baseline.py                # ~15 min on 2 loaded CPU cores
    python benchmarks/bench_eval_baseline.py --quick        # a smoke run

Sizes default to what 2 shared CPU cores finish in about 15 minutes (2 tasks per id, 2 turns,
24 new tokens a turn); raise ``--tasks``, ``--max-turns`` and ``--max-tokens`` on a faster
machine. One arm on one env with the command itself::

    agentgym eval Sokoban-v0 --model smollm2-135m --device cpu --tasks 2 --max-episode-steps 2 \
        --max-tokens 24 --temperature 0 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import lzma
import os
import platform
import random
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AGENTGYM_SHARED_DATA", REPO / ".." / "shared" / "data"))

GENERATED = [
    "AgentGym/Corridor-v0",
    "AgentGym/Sokoban-v0",
    "AgentGym/ALFWorld-Synthetic-v0",
    "AgentGym/WebShop-Synthetic-v0",
    "AgentGym/SearchQA-Synthetic-v0",
]


def _real_data(tmp: Path) -> tuple[dict[str, str | None], dict[str, str]]:
    """Unpack the real data that is present; (split per runnable real id, skipped reasons)."""
    real: dict[str, str | None] = {}
    skipped: dict[str, str] = {}
    archive = SHARED / "alfworld" / "json_2.1.1-valid_seen.tar.xz"
    if archive.is_file():
        root = tmp / "alfworld"
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(root, filter="data")
        os.environ["ALFWORLD_DATA"] = str(root)
        real["AgentGym/ALFWorld-v0"] = "valid_seen"
    else:
        skipped["AgentGym/ALFWorld-v0"] = f"{archive} absent"
    shop = sorted((SHARED / "webshop").glob("*.json.xz"))
    if any(a.name.startswith("items_shuffle_1000") for a in shop):
        root = tmp / "webshop"
        root.mkdir()
        for a in shop:
            (root / a.name[: -len(".xz")]).write_bytes(lzma.decompress(a.read_bytes()))
        os.environ["WEBSHOP_DATA"] = str(root)
        real["AgentGym/WebShop-v0"] = None
    else:
        skipped["AgentGym/WebShop-v0"] = f"{SHARED / 'webshop'}/items_shuffle_1000.json.xz absent"
    skipped["AgentGym/SearchQA-v0"] = "no Search-R1 data or retriever under the shared data"
    return real, skipped


class RandomActionPolicy:
    """Uniform over the scored policy's candidates (admissible or suggested actions)."""

    plain_actions = True

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    async def act(self, messages, params, info=None):
        from agentgym.engine import PolicyOutput, candidate_actions

        actions = candidate_actions(info)
        if not actions:
            return PolicyOutput("", error="no candidate actions", error_kind="no_candidates")
        return PolicyOutput(self.rng.choice(actions))

    async def aclose(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"policy": "random"}


def _candidates_listed(env_id: str, split: str | None, seed: int) -> bool:
    from agentgym.engine import candidate_actions
    from agentgym.wrappers.llm import make_llm_env

    env = make_llm_env(env_id, fmt="plain")
    options: dict[str, Any] = {"task": 0, **({"split": split} if split else {})}
    _, info = env.reset(seed=seed, options=options)
    env.close()
    return bool(candidate_actions(info))


def run_arm(name, policy, env_splits, tasks, group_size, params, args) -> dict[str, Any]:
    from agentgym.engine import RolloutEngine, make_episodes, summarize

    specs = []
    for env_id, split in env_splits.items():
        # groups are keyed by (env id, group index) in the summaries, so indices may repeat
        specs += make_episodes(env_id, tasks, group_size, seed=args.seed, split=split)
    engine = RolloutEngine(
        policy, params, concurrency=args.concurrency, max_turns=args.max_turns, history_length=2
    )
    started = time.perf_counter()
    records = asyncio.run(engine.run(specs))
    engine.close()
    wall = time.perf_counter() - started
    out: dict[str, Any] = {
        "policy": policy.describe(),
        "sampling": vars(params),
        "group_size": group_size,
        "wall_s": round(wall, 1),
        "engine": engine.stats.to_json(),
        "load_average_1m_end": os.getloadavg()[0],
        "envs": {},
    }
    for env_id in env_splits:
        done = [r for r in records if r.env_id == env_id]
        out["envs"][env_id] = summarize(done)
    print(f"[{name}] {wall:.0f} s, {engine.stats.turns} turns", file=sys.stderr, flush=True)
    if args.trajectories:
        path = Path(args.trajectories) / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            for r in records:
                f.write(json.dumps(r.to_json(), default=str) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=2, help="tasks per env id (0..N-1)")
    ap.add_argument("--group-size", type=int, default=2, help="episodes per task, sampled arms")
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: see README)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", default="random,free-greedy,scored,free-sampled")
    ap.add_argument("--envs", default=None, help="comma-separated ids (default: all)")
    ap.add_argument("--no-real", action="store_true", help="generated families only")
    ap.add_argument("--quick", action="store_true", help="1 task, 2 turns, 16 tokens")
    ap.add_argument("--trajectories", default=None, help="folder for each arm's JSONL")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "eval_baseline.json"))
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.max_turns, args.max_tokens = 1, 2, 16

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from agentgym.engine import SamplingParams, ScoredActionPolicy, TransformersPolicy
    from agentgym.models import model_path

    tmp = Path(tempfile.mkdtemp(prefix="agentgym-baseline-"))
    env_splits: dict[str, str | None] = {e: None for e in GENERATED}
    skipped: dict[str, str] = {}
    if not args.no_real:
        real, skipped = _real_data(tmp)
        env_splits.update(real)
    if args.envs:
        wanted = set(args.envs.split(","))
        env_splits = {e: s for e, s in env_splits.items() if e in wanted}
    arms = args.arms.split(",")
    load_start = os.getloadavg()[0]

    folder = model_path("smollm2-135m")
    t0 = time.perf_counter()
    local = TransformersPolicy(folder, device="cpu", seed=args.seed) if arms != ["random"] else None
    load_s = time.perf_counter() - t0
    listed = {e: _candidates_listed(e, s, args.seed) for e, s in env_splits.items()}

    results: dict[str, Any] = {}
    out = Path(args.out)
    greedy = SamplingParams(0.0, 1.0, args.max_tokens)
    sampled = SamplingParams(1.0, 1.0, args.max_tokens)
    with_candidates = {e: s for e, s in env_splits.items() if listed[e]}
    for arm in arms:
        if arm == "random":
            results[arm] = run_arm(
                arm,
                RandomActionPolicy(args.seed),
                with_candidates,
                args.tasks,
                args.group_size,
                sampled,
                args,
            )
        elif arm == "free-greedy":
            results[arm] = run_arm(arm, local, env_splits, args.tasks, 1, greedy, args)
        elif arm == "free-sampled":
            results[arm] = run_arm(
                arm, local, env_splits, args.tasks, args.group_size, sampled, args
            )
        elif arm == "scored":
            scored = ScoredActionPolicy(local, reduce="sum", seed=args.seed)
            results[arm] = run_arm(arm, scored, with_candidates, args.tasks, 1, greedy, args)
        else:
            sys.exit(f"unknown arm {arm!r}; choose among random, free-greedy, free-sampled, scored")
        # after every arm, so a run cut short keeps the arms that finished
        _write(out, _report(args, folder, load_s, env_splits, skipped, listed, load_start, results))
    if local is not None:
        local.close()

    report = _report(args, folder, load_s, env_splits, skipped, listed, load_start, results)
    _write(out, report)
    print(table(report))
    print(f"wrote {out}", file=sys.stderr)


def _write(out: Path, report: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(report, indent=2, default=str))
    os.replace(tmp_out, out)


def _report(args, folder, load_s, env_splits, skipped, listed, load_start, results) -> dict:
    import torch

    return {
        "benchmark": "zero-shot baseline, SmolLM2-135M-Instruct (agentgym eval's engine)",
        "command": "python benchmarks/bench_eval_baseline.py " + " ".join(sys.argv[1:]),
        "model": str(folder),
        "device": "cpu",
        "torch_threads": args.threads,
        "model_load_s": round(load_s, 1),
        "sizes": {
            "tasks_per_env": args.tasks,
            "group_size_sampled": args.group_size,
            "max_turns": args.max_turns,
            "max_tokens_per_turn": args.max_tokens,
            "concurrency": args.concurrency,
            "history_length": 2,
        },
        "env_splits": env_splits,
        "skipped": skipped,
        "without_candidates": [e for e, ok in listed.items() if not ok],
        "cpus": os.cpu_count(),
        "load_average_1m_start": load_start,
        "load_average_1m_end": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "arms": results,
        "arms_planned": args.arms.split(","),
    }


def table(report: dict[str, Any]) -> str:
    """One markdown row per (env, arm): success, pass@k, invalid rate, turns, tokens/turn."""
    lines = [
        "| env | policy | episodes | success | pass@k | invalid-action rate | turns | tokens/turn |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    envs = list(report["env_splits"])
    for env in envs:
        for arm, res in report["arms"].items():
            s = res["envs"].get(env)
            if s is None:
                continue
            tok = s.get("completion_tokens")
            pk = f"{s['pass@k']:.2f} (k={s['k']})" if s["k"] > 1 else "-"
            lines.append(
                f"| {env.removeprefix('AgentGym/')} | {arm} | {s['episodes']} | "
                f"{s['success']:.2f} | {pk} | {s['invalid_action_rate']:.2f} | {s['turns']:.1f} | "
                f"{'-' if tok is None else f'{tok:.0f}'} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
