"""Scored admissible actions: pick among the candidates by the model's log-likelihood."""

from __future__ import annotations

import math
import random
import time
from typing import Any

from agentgym.engine.policies.base import (
    Messages,
    Policy,
    PolicyOutput,
    SamplingParams,
)
from agentgym.engine.policies.http import OpenAICompletionsScorer
from agentgym.engine.policies.transformers import TransformersPolicy

# ---------------------------------------------------------------------------------------------
# Scored admissible actions
# ---------------------------------------------------------------------------------------------


def candidate_actions(info: dict[str, Any] | None) -> list[str]:
    """The actions a scored policy chooses among: ``info["suggested_actions"]`` where the family
    gives concrete ones (WebShop's searches, SearchQA's queries and answers), else
    ``info["admissible_actions"]``; placeholders such as ``search[<your query>]`` dropped."""
    info = info or {}
    for key in ("suggested_actions", "admissible_actions"):
        actions = info.get(key)
        if actions:
            kept = [a for a in actions if isinstance(a, str) and a.strip() and "<" not in a]
            if kept:
                return list(dict.fromkeys(kept))
    return []


class ScoredActionPolicy(Policy):
    """Pick among the candidate actions by the model's log-likelihood of each as the reply.

    Each candidate's score is the sum (``reduce="sum"``) or the mean (``reduce="mean"``) of the
    log-probs of its tokens and the end-of-turn token, given the chat prompt; the policy picks
    the best at temperature 0, else samples from ``softmax(score / temperature)``. Candidates
    are :func:`candidate_actions` of the turn's info; the prompt should list them and ask for
    one (the engine renders it with the family template in the ``plain`` format). The reply
    text is the chosen action itself.

    Args:
        scorer: a :class:`TransformersPolicy` (local logits) or an
            :class:`OpenAICompletionsScorer` (a server returning prompt log-probs).
    """

    plain_actions = True

    def __init__(
        self,
        scorer: TransformersPolicy | OpenAICompletionsScorer,
        *,
        reduce: str = "sum",
        seed: int | None = 0,
    ):
        if reduce not in ("sum", "mean"):
            raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
        self.scorer = scorer
        self.reduce = reduce
        self.rng = random.Random(seed)

    async def act(
        self, messages: Messages, params: SamplingParams, info: dict[str, Any] | None = None
    ) -> PolicyOutput:
        started = time.perf_counter()
        actions = candidate_actions(info)
        if not actions:
            return PolicyOutput(
                "",
                latency_s=0.0,
                error="the env lists no admissible or suggested actions to score",
                error_kind="no_candidates",
            )
        listed = info.get("admissible_actions") if info else None
        if listed is None or list(listed) != actions:
            # The prompt lists the env's admissible actions, or none (SearchQA): name the
            # candidates scored, so the model is asked for one of them.
            shown = ", ".join(repr(a) for a in actions)
            messages = [
                *messages[:-1],
                {**messages[-1], "content": f"{messages[-1]['content']}Choose one of: {shown}\n"},
            ]
        scored, error, kind = await self.scorer.score(messages, actions)
        latency = time.perf_counter() - started
        if scored is None:
            return PolicyOutput(
                "", latency_s=latency, error=error, error_kind=kind, messages=messages
            )
        values = [s if self.reduce == "sum" else s / max(n, 1) for s, n in scored]
        if params.temperature <= 0:
            choice = max(range(len(actions)), key=values.__getitem__)
        else:
            top = max(values)
            weights = [math.exp((v - top) / params.temperature) for v in values]
            choice = self.rng.choices(range(len(actions)), weights=weights)[0]
        return PolicyOutput(
            actions[choice],
            completion_tokens=scored[choice][1],
            latency_s=latency,
            action_scores=dict(zip(actions, values, strict=True)),
            messages=messages,
        )

    async def aclose(self) -> None:
        await self.scorer.aclose()

    def describe(self) -> dict[str, Any]:
        inner = (
            self.scorer.describe()
            if isinstance(self.scorer, TransformersPolicy)
            else {"base_url": self.scorer.http.base_url}
        )
        return {**inner, "policy": "scored", "reduce": self.reduce}
