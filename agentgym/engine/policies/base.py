"""The policy contract: one turn in, one :class:`PolicyOutput` out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

Messages = list[dict[str, str]]


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
    """the sampled token ids, when the backend gives them"""
    logprobs: list[float] | None = None
    """the log-prob of each sampled token under the sampling distribution, when given"""
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
    prompt_ids: list[int] | None = None
    """the token ids the turn was sampled from (the whole context), when the policy works in
    tokens"""
    end_episode: str | None = None
    """set by a policy that ends the episode here instead of answering (e.g. its token budget
    is spent): the env is not stepped, no turn is recorded, and this is the ``end_reason``"""


class Policy(ABC):
    """A model that answers one turn: chat messages in, text (and tokens) out."""

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

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def describe(self) -> dict[str, Any]:
        """What the results file records about this policy."""
        return {"policy": type(self).__name__}
