"""Summaries of evaluated episodes: success, pass@k, return, invalid actions, tokens, errors."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from agentgym.engine.runner import EpisodeRecord

__all__ = ["format_table", "summarize"]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _rates(episodes: Sequence[EpisodeRecord]) -> dict[str, Any]:
    """Success and pass@k over ``episodes`` (groups are (env, group index))."""
    by_task: dict[tuple, list[bool]] = defaultdict(list)
    for ep in episodes:
        by_task[(ep.env_id, ep.group)].append(ep.won)
    return {
        "episodes": len(episodes),
        "tasks": len(by_task),
        "success": _mean([float(ep.won) for ep in episodes]),
        # pass@1: the chance one sample solves a task, averaged over tasks (unbiased estimator)
        "pass@1": _mean([_mean([float(w) for w in wins]) for wins in by_task.values()]),
        # pass@k with k = the group size: a task counts when any of its k samples solved it
        "pass@k": _mean([float(any(wins)) for wins in by_task.values()]),
        "k": max((len(w) for w in by_task.values()), default=0),
    }


def summarize(episodes: Sequence[EpisodeRecord]) -> dict[str, Any]:
    """One summary over ``episodes`` (call it per env id).

    Keys: episodes, tasks, success, pass@1, pass@k, k, mean_return, mean_score, turns (mean per
    episode), invalid_action_rate (invalid turns / turns), policy_errors (failed turns by kind),
    end_reasons (episodes by how they ended), completion_tokens (mean per turn, where known),
    prompt_tokens (mean per turn), latency_s (mean per turn), and by_task_type (the rates per
    ``info["task_type"]`` where the family reports one).
    """
    turns = [t for ep in episodes for t in ep.turns]
    completion = [t.completion_tokens for t in turns if t.completion_tokens is not None]
    prompt = [t.prompt_tokens for t in turns if t.prompt_tokens is not None]
    summary = _rates(episodes)
    summary.update(
        mean_return=_mean([ep.total_reward for ep in episodes]),
        mean_score=_mean([ep.score for ep in episodes]),
        turns=_mean([len(ep.turns) for ep in episodes]),
        invalid_action_rate=_mean([0.0 if t.action_valid else 1.0 for t in turns]),
        policy_errors=dict(Counter(t.error_kind or "error" for t in turns if t.error is not None)),
        end_reasons=dict(Counter(ep.end_reason or "unknown" for ep in episodes)),
        completion_tokens=_mean(completion) if completion else None,
        prompt_tokens=_mean(prompt) if prompt else None,
        latency_s=_mean([t.latency_s for t in turns]),
    )
    types = sorted({ep.task_type for ep in episodes if ep.task_type})
    if types:
        summary["by_task_type"] = {
            kind: _rates([ep for ep in episodes if ep.task_type == kind]) for kind in types
        }
    return summary


def format_table(env_id: str, summary: dict[str, Any]) -> str:
    """The summary as a few aligned lines for the terminal."""
    tokens = summary.get("completion_tokens")
    errors = summary.get("policy_errors") or {}
    lines = [
        f"{env_id}: {summary['episodes']} episodes over {summary['tasks']} tasks",
        f"  {'success':<22}{summary['success']:.3f}",
        f"  {'pass@1':<22}{summary['pass@1']:.3f}",
        f"  {'mean return':<22}{summary['mean_return']:.3f}",
        f"  {'invalid-action rate':<22}{summary['invalid_action_rate']:.3f}",
        f"  {'turns / episode':<22}{summary['turns']:.2f}",
        f"  {'tokens / turn':<22}{'n/a' if tokens is None else f'{tokens:.1f}'}",
        f"  {'policy errors':<22}"
        + (", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none"),
        f"  {'ended':<22}"
        + ", ".join(f"{k} {v}" for k, v in sorted(summary["end_reasons"].items())),
    ]
    if summary["k"] > 1:  # with one episode per task pass@k is pass@1
        lines.insert(4, f"  {'pass@' + str(summary['k']):<22}{summary['pass@k']:.3f}")
    for kind, rates in (summary.get("by_task_type") or {}).items():
        lines.append(
            f"  task type {kind:<30} success {rates['success']:.3f}  "
            f"pass@{rates['k']} {rates['pass@k']:.3f}  ({rates['episodes']} episodes)"
        )
    return "\n".join(lines)
