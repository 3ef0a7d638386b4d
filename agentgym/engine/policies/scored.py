"""Scored admissible actions: pick among the candidates by the model's log-likelihood, locally or
over HTTP; one implementation for evaluation, rollouts and training."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from typing import Any

from agentgym.engine.policies.base import (
    Infos,
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

    A small instruct model rarely writes a valid action as free text, so every trajectory of a
    group fails alike and group RL gets no signal. With the env's actions listed, the policy can
    instead be the model's distribution *restricted to those actions*, as GLAM (Carta et al.,
    2023) did for online RL of LLMs in text worlds::

        score(a) = sum_j log p(a_j | prompt, a_<j)     (the action's tokens, end of turn included)
        pi(a | prompt) = softmax_a(score(a) / temperature)

    Each candidate's score is the sum (``reduce="sum"``) or the mean (``reduce="mean"``) of the
    log-probs of its tokens and the token the chat template ends a reply with (without it a
    short action that prefixes a longer one, "go" vs "go north", would score higher for free);
    the policy picks the best at temperature 0, else samples from the softmax. Candidates are
    :func:`candidate_actions` of the turn's info; the prompt should list them and ask for one
    (the engine renders it with the family template in the ``plain`` format). The reply text is
    the chosen action itself.

    :meth:`generate` (a lockstep round, local scorer only) scores every episode's candidates in
    batched forward passes and returns the chosen action's token ids and per-token log-probs
    (at ``token_temperature``) as the response, exactly as a sampled free-text response: what
    a trainer trains.

    Args:
        scorer: a :class:`TransformersPolicy` (local logits) or an
            :class:`OpenAICompletionsScorer` (a server returning prompt log-probs).
        seed: the choice's own random generator (None: torch's global generator, which a
            trainer seeds and checkpoints).
        token_temperature: divides the logits of the per-token log-probs in :meth:`generate`
            (a trainer's sampling temperature, so its forward pass scores the same distribution).
        token_budget: padded prompt tokens per scoring forward pass in :meth:`generate`.
    """

    plain_actions = True

    def __init__(
        self,
        scorer: TransformersPolicy | OpenAICompletionsScorer,
        *,
        reduce: str = "sum",
        seed: int | None = 0,
        token_temperature: float = 1.0,
        token_budget: int = 4096,
    ):
        if reduce not in ("sum", "mean"):
            raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
        self.scorer = scorer
        self.reduce = reduce
        self.rng = random.Random(seed) if seed is not None else None
        self.token_temperature = token_temperature
        self.token_budget = token_budget

    def _prompt(
        self, messages: Messages, info: dict[str, Any] | None
    ) -> tuple[Messages, list[str]]:
        """The messages to score against and the candidates."""
        actions = candidate_actions(info)
        listed = info.get("admissible_actions") if info else None
        if actions and (listed is None or list(listed) != actions):
            # The prompt lists the env's admissible actions, or none (SearchQA): name the
            # candidates scored, so the model is asked for one of them.
            shown = ", ".join(repr(a) for a in actions)
            messages = [
                *messages[:-1],
                {**messages[-1], "content": f"{messages[-1]['content']}Choose one of: {shown}\n"},
            ]
        return messages, actions

    def _choose(self, values: list[float], temperature: float) -> int:
        if self.rng is None:  # torch's global generator (a trainer's, seeded and checkpointed)
            import torch

            from agentgym.engine.decoding import choose

            return choose(torch.tensor(values), temperature)
        if temperature <= 0:
            return max(range(len(values)), key=values.__getitem__)
        top = max(values)
        weights = [math.exp((v - top) / temperature) for v in values]
        return self.rng.choices(range(len(values)), weights=weights)[0]

    def _reduced(self, total: float, n: int) -> float:
        return total if self.reduce == "sum" else total / max(n, 1)

    async def act(
        self, messages: Messages, params: SamplingParams, info: dict[str, Any] | None = None
    ) -> PolicyOutput:
        started = time.perf_counter()
        messages, actions = self._prompt(messages, info)
        if not actions:
            return _no_candidates()
        scored, error, kind = await self.scorer.score(messages, actions)
        latency = time.perf_counter() - started
        if scored is None:
            return PolicyOutput(
                "", latency_s=latency, error=error, error_kind=kind, messages=messages
            )
        values = [self._reduced(s, n) for s, n in scored]
        choice = self._choose(values, params.temperature)
        return PolicyOutput(
            actions[choice],
            completion_tokens=scored[choice][1],
            latency_s=latency,
            action_scores=dict(zip(actions, values, strict=True)),
            messages=messages,
        )

    def generate(
        self, messages: Sequence[Messages], params: SamplingParams, infos: Infos = None
    ) -> list[PolicyOutput]:
        """Every episode's choice in batched forward passes (a local scorer only)."""
        if not isinstance(self.scorer, TransformersPolicy):
            return super().generate(messages, params, infos)
        started = time.perf_counter()
        infos = list(infos) if infos is not None else [None] * len(messages)
        asked = [self._prompt(m, i) for m, i in zip(messages, infos, strict=True)]
        live = [k for k, (_, actions) in enumerate(asked) if actions]
        prompt_ids = [self.scorer.prompt_ids(asked[k][0]) for k in live]
        candidates = [[self.scorer.action_ids(a) for a in asked[k][1]] for k in live]
        scored = self.scorer.score_candidates(
            prompt_ids, candidates, self.token_temperature, self.token_budget
        )
        latency = time.perf_counter() - started
        out = [_no_candidates() for _ in messages]
        for row, k in enumerate(live):
            sent, actions = asked[k]
            values = [self._reduced(sum(lp), len(lp)) for lp in scored[row]]
            choice = self._choose(values, params.temperature)
            ids = candidates[row][choice]
            out[k] = PolicyOutput(
                actions[choice],
                token_ids=ids,
                logprobs=scored[row][choice],
                prompt_ids=prompt_ids[row],
                prompt_tokens=len(prompt_ids[row]),
                completion_tokens=len(ids),
                latency_s=latency,
                action_scores=dict(zip(actions, values, strict=True)),
                messages=sent,
            )
        return out

    def sync_weights(self, model: Any) -> None:
        if isinstance(self.scorer, TransformersPolicy):
            self.scorer.sync_weights(model)

    async def aclose(self) -> None:
        await self.scorer.aclose()

    def describe(self) -> dict[str, Any]:
        inner = (
            self.scorer.describe()
            if isinstance(self.scorer, TransformersPolicy)
            else {"base_url": self.scorer.http.base_url}
        )
        return {**inner, "policy": "scored", "reduce": self.reduce}


def _no_candidates() -> PolicyOutput:
    return PolicyOutput(
        "",
        latency_s=0.0,
        error="the env lists no admissible or suggested actions to score",
        error_kind="no_candidates",
    )
