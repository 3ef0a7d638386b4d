"""Summaries of evaluated episodes: success, pass@k, return, invalid actions, failed turns,
tokens, and whether the group members really differ."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from agentgym.engine.runner import EpisodeRecord

__all__ = ["format_table", "summarize"]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _groups(episodes: Sequence[EpisodeRecord]) -> dict[tuple, list[EpisodeRecord]]:
    """Episodes by group: (env id, group index)."""
    by_group: dict[tuple, list[EpisodeRecord]] = defaultdict(list)
    for ep in episodes:
        by_group[(ep.env_id, ep.group)].append(ep)
    return by_group


def _rates(episodes: Sequence[EpisodeRecord], group_size: int | None = None) -> dict[str, Any]:
    """Success, pass@1 and pass@k over ``episodes``; k is ``group_size`` (default: the largest
    group seen). pass@k counts complete groups only (all k members finished): a group cut
    short by an interrupted run has had fewer than k tries, and counting it would understate
    pass@k. pass@1 averages each group's own success rate, an unbiased estimate however many
    members finished."""
    by_group = _groups(episodes)
    k = group_size or max((len(g) for g in by_group.values()), default=0)
    complete = [g for g in by_group.values() if len(g) >= k]
    return {
        "episodes": len(episodes),
        "tasks": len(by_group),
        "success": _mean([float(ep.won) for ep in episodes]),
        # pass@1: the chance one sample solves a task, averaged over tasks (unbiased estimator)
        "pass@1": _mean([_mean([float(ep.won) for ep in g]) for g in by_group.values()]),
        # pass@k with k = the group size: a task counts when any of its k samples solved it
        "pass@k": _mean([float(any(ep.won for ep in g)) for g in complete]),
        "k": k,
        "groups_complete": len(complete),
        "groups_incomplete": len(by_group) - len(complete),
    }


def _identical_groups(episodes: Sequence[EpisodeRecord]) -> tuple[int, int]:
    """(groups whose members all wrote the same texts on every turn, groups compared). Only
    groups with two or more members that got at least one model answer are compared."""
    compared = identical = 0
    for members in _groups(episodes).values():
        texts = [
            tuple(t.text for t in ep.turns)
            for ep in members
            if any(t.error is None for t in ep.turns)
        ]
        if len(texts) < 2:
            continue
        compared += 1
        identical += len(set(texts)) == 1
    return identical, compared


def summarize(
    episodes: Sequence[EpisodeRecord],
    *,
    group_size: int | None = None,
    temperature: float | None = None,
) -> dict[str, Any]:
    """One summary over ``episodes`` (call it per env id).

    Args:
        episodes: finished episodes of one env id.
        group_size: the planned episodes per group (k of pass@k); default the largest group seen.
        temperature: the sampling temperature of the run; above 0, groups whose members are
            identical are counted and, when every compared group is, ``warnings`` says the
            server is not sampling (pass@k is then pass@1).

    Keys: episodes, tasks, success, pass@1, pass@k (complete groups only), k,
    groups_complete, groups_incomplete, mean_return, mean_score, turns (mean per episode),
    answered_turns, invalid_action_rate (invalid actions / turns the model answered),
    failed_turn_rate (turns without a model answer / turns), timeout_rate (turns that timed
    out / turns), policy_errors (failed turns by kind), end_reasons (episodes by how they
    ended), completion_tokens (mean per turn, where known), prompt_tokens (mean per turn),
    latency_s (mean per turn), identical_groups and groups_compared (with a temperature > 0),
    warnings (list of text), and by_task_type (the rates per ``info["task_type"]`` where the
    family reports one).
    """
    turns = [t for ep in episodes for t in ep.turns]
    answered = [t for t in turns if t.error is None]
    completion = [t.completion_tokens for t in turns if t.completion_tokens is not None]
    prompt = [t.prompt_tokens for t in turns if t.prompt_tokens is not None]
    summary = _rates(episodes, group_size)
    summary.update(
        mean_return=_mean([ep.total_reward for ep in episodes]),
        mean_score=_mean([ep.score for ep in episodes]),
        turns=_mean([len(ep.turns) for ep in episodes]),
        answered_turns=len(answered),
        invalid_action_rate=_mean([0.0 if t.action_valid else 1.0 for t in answered]),
        failed_turn_rate=_mean([0.0 if t.error is None else 1.0 for t in turns]),
        timeout_rate=_mean([1.0 if t.error_kind == "timeout" else 0.0 for t in turns]),
        policy_errors=dict(Counter(t.error_kind or "error" for t in turns if t.error is not None)),
        end_reasons=dict(Counter(ep.end_reason or "unknown" for ep in episodes)),
        completion_tokens=_mean(completion) if completion else None,
        prompt_tokens=_mean(prompt) if prompt else None,
        latency_s=_mean([t.latency_s for t in turns]),
    )
    warnings: list[str] = []
    if summary["groups_incomplete"]:
        warnings.append(
            f"pass@{summary['k']} counts the {summary['groups_complete']} complete groups only; "
            f"{summary['groups_incomplete']} had fewer than {summary['k']} finished episodes"
        )
    if temperature and temperature > 0:
        identical, compared = _identical_groups(episodes)
        summary.update(identical_groups=identical, groups_compared=compared)
        if compared and identical == compared:
            warnings.append(
                f"every group's episodes are identical at temperature {temperature:g}: the "
                "server is not sampling (transformers serve --continuous-batching applies the "
                "first request's settings to all), so pass@k is pass@1 here; serve without "
                "--continuous-batching, or with llama.cpp (--llama-server)"
            )
    summary["warnings"] = warnings
    types = sorted({ep.task_type for ep in episodes if ep.task_type})
    if types:
        summary["by_task_type"] = {
            kind: _rates([ep for ep in episodes if ep.task_type == kind], group_size)
            for kind in types
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
        f"  {'failed-turn rate':<22}{summary.get('failed_turn_rate', 0.0):.3f}",
        f"  {'turns / episode':<22}{summary['turns']:.2f}",
        f"  {'tokens / turn':<22}{'n/a' if tokens is None else f'{tokens:.1f}'}",
        f"  {'policy errors':<22}"
        + (", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none"),
        f"  {'ended':<22}"
        + ", ".join(f"{k} {v}" for k, v in sorted(summary["end_reasons"].items())),
    ]
    if summary["k"] > 1:  # with one episode per task pass@k is pass@1
        groups = summary.get("groups_complete", summary["tasks"])
        lines.insert(
            4, f"  {'pass@' + str(summary['k']):<22}{summary['pass@k']:.3f} ({groups} groups)"
        )
    for kind, rates in (summary.get("by_task_type") or {}).items():
        lines.append(
            f"  task type {kind:<30} success {rates['success']:.3f}  "
            f"pass@{rates['k']} {rates['pass@k']:.3f}  ({rates['episodes']} episodes)"
        )
    lines.extend(f"  warning: {w}" for w in summary.get("warnings") or ())
    return "\n".join(lines)
