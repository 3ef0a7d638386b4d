"""The policy contract: one turn in, one :class:`PolicyOutput` out; or every live episode's
turn of a lockstep round in, one output each out."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Messages = list[dict[str, str]]
#: the env infos of a batch of turns, one per conversation (None: none given)
Infos = Sequence[dict[str, Any] | None] | None


class PolicyUnavailable(RuntimeError):
    """The policy cannot work with this backend at all (not a per-request failure)."""


@dataclass(frozen=True)
class SamplingParams:
    """How one turn is sampled."""

    temperature: float = 1.0
    """0 is greedy"""
    top_p: float = 1.0
    max_tokens: int = 256
    """most new tokens per turn"""


@dataclass
class PolicyOutput:
    """One turn's answer from a policy."""

    text: str
    """the model's raw text ("" when there is none, see ``error``)"""
    token_ids: list[int] | None = None
    """the sampled token ids (up to and including the end-of-turn token where one was sampled),
    when the backend gives them: the ids a trainer trains"""
    logprobs: list[float] | None = None
    """the log-prob of each sampled token under the sampling distribution (full distribution at
    the sampling temperature, before top-p), when given"""
    prompt_ids: list[int] | None = None
    """the chat-templated prompt's token ids the answer was sampled after (the whole context),
    when the policy works in tokens (in-process policies, the TRL and verl adapters)"""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float = 0.0
    """wall time from the request to the answer (queueing included)"""
    error: str | None = None
    """why there is no usable answer (timeout, HTTP status, unreadable reply...), else None"""
    error_kind: str | None = None
    """a short class of ``error`` for summaries: timeout, http_status, connection, bad_response,
    no_candidates, model_error"""
    finish_reason: str | None = None
    action_scores: dict[str, float] | None = None
    """scored policy: each candidate action's score"""
    attempts: int = 1
    messages: list[dict[str, str]] | None = None
    """the messages actually sent, where the policy changed the ones it was given"""
    end_episode: str | None = None
    """set by a policy that ends the episode here instead of answering (e.g. its token budget
    is spent): the env is not stepped, no turn is recorded, and this is the ``end_reason``"""
    policy_version: int | str | None = None
    """the policy version in force when the request was sent (set by the engine)"""

    @classmethod
    def sampled(
        cls,
        text: str,
        prompt_ids: list[int],
        token_ids: list[int],
        logprobs: list[float],
        latency_s: float,
        finish_reason: str | None,
    ) -> PolicyOutput:
        """An in-process model's answer: the prompt's and the sampled ids, with the counts."""
        return cls(
            text,
            token_ids=token_ids,
            logprobs=logprobs,
            prompt_ids=prompt_ids,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(token_ids),
            latency_s=latency_s,
            finish_reason=finish_reason,
        )


class Policy(ABC):
    """A model that answers turns: chat messages in, text (and tokens) out.

    Two ways in, one contract: :meth:`act` answers one turn (the engine's per-episode
    coroutines call it); :meth:`act_batch` / :meth:`generate` answer every live episode's turn
    of a lockstep round at once (asynchronously / from synchronous code, as the trainer does).
    The defaults of the batch methods call :meth:`act` concurrently; an in-process model
    overrides :meth:`generate` with one batched forward. :meth:`sync_weights` loads a trainer's
    weights after an update (nothing to do for a policy that samples from the trained model).
    """

    #: whether :meth:`act` wants the plain action format (the reply is an action, not a
    #: ``<think>``/``<action>`` response); the scored policy does
    plain_actions: bool = False

    @abstractmethod
    async def act(
        self,
        messages: Messages,
        params: SamplingParams,
        info: dict[str, Any] | None = None,
    ) -> PolicyOutput:
        """Answer one turn. ``info`` is the env's info of the current state (the scored policy
        reads its candidate actions). Never raises for a model or server failure."""

    def for_episode(self, spec: Any) -> Policy:
        """The policy that plays the episode ``spec`` (an ``EpisodeSpec``); the engine asks once
        per episode and sends that episode's turns to what this returns. Default: ``self``. A
        policy that keeps state per episode (a token context) returns a fresh object."""
        return self

    async def act_batch(
        self, messages: Sequence[Messages], params: SamplingParams, infos: Infos = None
    ) -> list[PolicyOutput]:
        """Answer many turns (one per episode), outputs in the order given."""
        infos = list(infos) if infos is not None else [None] * len(messages)
        return list(
            await asyncio.gather(
                *(self.act(m, params, i) for m, i in zip(messages, infos, strict=True))
            )
        )

    def generate(
        self, messages: Sequence[Messages], params: SamplingParams, infos: Infos = None
    ) -> list[PolicyOutput]:
        """:meth:`act_batch` for synchronous callers (no event loop running in this thread)."""
        return asyncio.run(self.act_batch(messages, params, infos))

    def sync_weights(self, model: Any) -> None:  # noqa: B027 - optional hook
        """Load ``model``'s current weights where the policy samples from a copy of them."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def describe(self) -> dict[str, Any]:
        """What the results file records about this policy."""
        return {"policy": type(self).__name__}
