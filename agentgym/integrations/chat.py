"""Multi-turn conversations through a tokenizer's chat template, turn by turn, shared by the
TRL and verl adapters.

An agent's episode is a chat: the first observation as a user message, then one assistant
message per action and one user message per later observation. A trainer can hold it in two
ways:

- **episode** (one sequence per episode): the model's sampled tokens and the tokens the template
  puts around each observation are concatenated; turn ``t + 1`` is sampled from exactly the
  tokens trained. This matches the template's own rendering only when the template keeps
  earlier turns unchanged (Qwen2.5, Llama 3.x, Gemma 3, Mistral, Phi-3.5, Qwen3-2507).
- **per_turn** (one sequence per turn): each turn's prompt is the template's rendering of the
  conversation so far and its response is the turn's sampled tokens. Needed for templates that
  re-render earlier turns (Qwen3's thinking template drops earlier ``<think>`` blocks), and
  drift-free by construction: every sequence is trained on the prompt it was sampled from.

:class:`ChatTurns` renders, finds the tokens between turns, and decides which mode a template
needs by rendering a probe conversation once (:attr:`ChatTurns.mode`).

:class:`ChatPolicy` is the adapters' model as the engine (:class:`~agentgym.engine.RolloutEngine`)
plays it: a framework's token-in, token-out generation, each episode one such chat; it turns
the engine's :class:`~agentgym.engine.EpisodeRecord` s into :class:`EpisodeTokens`, the
sequences a trainer trains on.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentgym.engine.chat_template import PROBE_CHAT, probe_turn_end, render_ids
from agentgym.engine.policies import Policy, PolicyOutput, PolicyUnavailable, SamplingParams

if TYPE_CHECKING:  # pragma: no cover - typing only
    from agentgym.engine.runner import EpisodeRecord, EpisodeSpec

__all__ = ["EPISODE", "PER_TURN", "MODES", "ChatTurns", "ChatPolicy", "EpisodeTokens"]

logger = logging.getLogger(__name__)

EPISODE = "episode"
"""one sequence per episode: model turns and observations concatenated"""
PER_TURN = "per_turn"
"""one sequence per turn: the rendered conversation so far as prompt, the turn's tokens as response"""
MODES = (EPISODE, PER_TURN)

# A conversation shaped like an agent's (reasoning, an action, observations), rendered once per
# template to see whether it keeps earlier assistant turns as they were sampled.
_PROBE = (
    {"role": "user", "content": "Task: open the door.\nYou are in a hall. There is a door."},
    {
        "role": "assistant",
        "content": "<think>\nThe door is closed.\n</think>\n<action>open door</action>",
    },
    {"role": "user", "content": "The door is open."},
    {"role": "assistant", "content": "<think>\nGo through.\n</think>\n<action>go north</action>"},
    {"role": "user", "content": "You are in the garden."},
)
_BASE = PROBE_CHAT[:2]


class ChatTurns:
    """A tokenizer's chat template applied to an agent's conversation, turn by turn.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        chat_template: a template to use instead of the tokenizer's own.
        template_kwargs: extra keyword arguments of ``apply_chat_template`` (e.g.
            ``{"enable_thinking": False}``).
        end_ids: token ids that end an assistant turn besides the tokenizer's EOS (a
            generation config's ``eos_token_id`` list, e.g. Phi-3.5's ``<|end|>``).

    Attributes:
        prefix_preserving: whether the template renders earlier assistant turns as they were
            when last (checked once on a probe conversation).
        mode: :data:`EPISODE` when ``prefix_preserving``, else :data:`PER_TURN`.
        turn_end_id: the end-of-turn token the template puts after an assistant message (None
            when the template puts none of ``end_ids`` there).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        end_ids: Iterable[int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})
        eos = tokenizer.eos_token_id
        self.end_ids = frozenset(({eos} if eos is not None else set()) | set(end_ids or ()))
        # Tokens that close an assistant turn and open the next depend only on the template:
        # locate them once on a fixed chat (load time); each observation then costs one render.
        found = probe_turn_end(tokenizer, self.end_ids, self.render)
        self._head, self.turn_end_id, self._no_head = found.head, found.end_id, found.problem
        self.prefix_preserving, self.reason = self._probe()
        self.mode = EPISODE if self.prefix_preserving else PER_TURN
        logger.info(
            "chat template %s: %s mode (%s)",
            "keeps earlier turns" if self.prefix_preserving else "re-renders earlier turns",
            self.mode,
            self.reason,
        )

    # -- rendering -------------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        """``apply_chat_template(messages)`` as a list of token ids."""
        kwargs = dict(self.template_kwargs)
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        return render_ids(self.tokenizer, messages, generation_prompt, **kwargs)

    def observation_ids(self, text: str) -> list[int]:
        """Tokens that follow a finished assistant turn (after its end-of-turn token): ``text``
        as a user message, then the assistant header.

        Found as the difference between renders of a fixed chat with and without the user
        message, so any template works whose assistant turns end with one of ``end_ids``.
        """
        if self._head is None:
            raise ValueError(
                f"this chat template cannot be played as one sequence per episode: {self._no_head}"
                "; train it per turn (mode='per_turn'), or pass the model's end-of-turn token "
                "ids as end_ids"
            )
        full = self.render([*_BASE, {"role": "user", "content": text}], generation_prompt=True)
        if full[: len(self._head)] != self._head:
            raise ValueError(
                "the chat template renders an assistant turn differently depending on the user "
                "message after it; train this template per turn (mode='per_turn')"
            )
        return full[len(self._head) :]

    def close_turn(self, sampled: list[int]) -> list[int]:
        """The end-of-turn token a turn cut short (by a token limit) still needs, or ``[]``."""
        if sampled and sampled[-1] in self.end_ids:
            return []
        end = self.turn_end_id if self.turn_end_id is not None else self.tokenizer.eos_token_id
        return [end]

    # -- the probe -------------------------------------------------------------------------------
    def _end_after(self, ids: list[int], start: int) -> int | None:
        return next((i for i in range(start, len(ids)) if ids[i] in self.end_ids), None)

    def _last_turn_ids(self, messages: list[dict[str, Any]]) -> list[int] | None:
        """The tokens the template puts for the last (assistant) message when it is last: what a
        model trained on this template samples for it, end-of-turn token included."""
        prompt = self.render(messages[:-1], generation_prompt=True)
        rendered = self.render(messages, generation_prompt=False)
        if rendered[: len(prompt)] != prompt:
            return None
        end = self._end_after(rendered, len(prompt))
        return None if end is None else rendered[len(prompt) : end + 1]

    def _probe(self) -> tuple[bool, str]:
        """Whether playing the probe chat turn by turn (sampled turns and observation tokens
        concatenated) gives the template's own rendering of the whole chat."""
        if self._head is None:
            return False, self._no_head
        messages = list(_PROBE)
        concat = self.render(messages[:1], generation_prompt=True)
        for k in range(1, len(messages), 2):
            turn = self._last_turn_ids(messages[: k + 1])
            if turn is None:
                return False, "the generation prompt is not how the template opens a reply"
            try:
                concat += turn + self.observation_ids(messages[k + 1]["content"])
            except ValueError:
                return False, "a turn renders differently depending on the message after it"
        if concat != self.render(messages, generation_prompt=True):
            return False, "earlier assistant turns are rendered differently once a turn follows"
        return True, "rendering the conversation so far equals its turns concatenated"


# ----------------------------------------------------------------------------------------------
# the adapters' policy: a framework's generation, played by the engine, one chat per episode
# ----------------------------------------------------------------------------------------------
@dataclass
class EpisodeTokens:
    """One played episode as token sequences.

    ``response_ids`` follow ``prompt_ids``: in ``"episode"`` mode the model's turns
    (``response_mask`` 1) interleaved with the tokens between turns (0: the end-of-turn token a
    cut turn needed, the next observation as a user message, the assistant header); in
    ``"per_turn"`` mode the turns' tokens back to back, turn ``t`` sampled from
    ``turn_prompt_ids[t]``. ``turn_spans[t] = (start, end)``: turn ``t``'s tokens in
    ``response_ids``, end exclusive. ``state_keys[t]``: the ``info["state_key"]`` turn ``t``
    acted from (as the env gave it). ``response_logprobs``: the sampling log-prob of each model
    token, 0.0 on the others; None when a turn came without them.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    turn_spans: list[tuple[int, int]]
    state_keys: list[Hashable]
    mode: str = EPISODE
    turn_prompt_ids: list[list[int]] | None = None
    """per_turn mode: the prompt each turn was sampled from"""

    def sequences(self) -> list[dict[str, Any]]:
        """The training sequences: ``prompt_ids``, ``response_ids``, ``response_mask`` and
        ``response_logprobs`` (None when not given); one per episode in ``"episode"`` mode, one
        per turn in ``"per_turn"`` mode, where every sequence is exactly a prompt the model saw
        and the tokens it sampled from it."""
        if self.mode == EPISODE:
            spans = [(0, len(self.response_ids))]
            prompts = [self.prompt_ids]
        else:
            spans, prompts = self.turn_spans, self.turn_prompt_ids or []
        logps = self.response_logprobs
        return [
            {
                "prompt_ids": list(prompt),
                "response_ids": self.response_ids[start:end],
                "response_mask": self.response_mask[start:end],
                "response_logprobs": None if logps is None else logps[start:end],
            }
            for prompt, (start, end) in zip(prompts, spans, strict=True)
        ]


class ChatPolicy(Policy):
    """A token-in, token-out model for the engine, each episode one chat through ``chat``.

    The engine (:class:`~agentgym.engine.RolloutEngine`) plays the episodes: it resets and steps
    the envs and records every turn. The policy it asks for each episode (:meth:`for_episode`)
    builds that turn's prompt ids and asks :meth:`sample` for the new tokens:

    - ``"episode"`` mode: turn 0's prompt is the template's rendering of :meth:`first_messages`
      (cut from the left to ``prompt_length``); turn ``t + 1``'s is turn ``t``'s prompt, its
      sampled ids, the end-of-turn token if sampling cut it, and
      :meth:`ChatTurns.observation_ids` of :meth:`observation_text`. Each turn is sampled from
      exactly the sequence trained.
    - ``"per_turn"`` mode: turn ``t``'s prompt is the template's rendering of the conversation so
      far (earlier turns as their decoded text).

    The response (everything after turn 0's prompt; each turn's own in ``"per_turn"`` mode)
    holds at most ``response_length`` tokens; a turn takes at most ``params.max_tokens`` of
    them. When the next observation's tokens leave no room for another turn, the episode ends
    there (``end_reason="response_length"``), keeping the observation tokens that fit when
    ``keep_cut_reply``.

    The text the env steps is the turn's tokens decoded without special tokens. A failed
    :meth:`sample` raises :class:`~agentgym.engine.PolicyUnavailable` out of the engine's run:
    a training batch is not made of failed turns. :meth:`tokens` turns a played episode's record
    into :class:`EpisodeTokens`.
    """

    def __init__(
        self,
        chat: ChatTurns,
        *,
        response_length: int,
        mode: str = EPISODE,
        prompt_length: int | None = None,
        keep_cut_reply: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.chat = chat
        self.mode = mode
        self.response_length = response_length
        self.prompt_length = prompt_length
        self.keep_cut_reply = keep_cut_reply
        self.conversations: dict[tuple[int, int], _Conversation] = {}
        """each episode's conversation, by ``(group, member)`` of its spec"""

    @abstractmethod
    async def sample(
        self, prompt_ids: list[int], max_tokens: int
    ) -> tuple[list[int], list[float] | None]:
        """The new token ids sampled from ``prompt_ids`` (at most ``max_tokens``, up to and
        including the end-of-turn token) and their log-probs (None when not given)."""

    def first_messages(
        self, spec: EpisodeSpec, observation: str, info: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The chat turn 0 is sampled from: by default the first observation as a user message."""
        return [{"role": "user", "content": self.observation_text(observation, info)}]

    def observation_text(self, observation: str, info: dict[str, Any]) -> str:
        """An observation as the user message that shows it."""
        return observation

    def for_episode(self, spec: EpisodeSpec) -> Policy:
        key = (spec.group, spec.member)
        if key in self.conversations:
            raise ValueError(f"two episodes of one run share (group, member) {key}")
        self.conversations[key] = conversation = _Conversation(self, spec)
        return conversation

    async def act(self, *args: Any, **kwargs: Any) -> PolicyOutput:
        raise TypeError("a ChatPolicy plays episodes through for_episode(spec), one chat each")

    def tokens(self, record: EpisodeRecord) -> EpisodeTokens:
        """The token sequences of a played episode (see :class:`EpisodeTokens`).

        Raises:
            RuntimeError: the episode's env failed (its error is named), or a turn was not
                sampled from the sequence built so far (never, unless the record was altered).
        """
        if record.end_reason == "env_error":
            raise RuntimeError(f"{record.env_id} task {record.task!r}: {record.error}")
        conversation = self.conversations[(record.group, record.member)]
        turns = record.turns
        with_logprobs = all(t.logprobs is not None for t in turns)
        response: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        spans: list[tuple[int, int]] = []
        prompt = conversation.prompt_ids
        for turn in turns:
            if turn.token_ids is None or turn.prompt_ids is None:
                raise RuntimeError(f"turn {turn.index} has no tokens: {turn.error}")
            if self.mode == EPISODE:
                seen = len(prompt) + len(response)
                if turn.prompt_ids[:seen] != prompt + response:
                    raise RuntimeError(
                        f"turn {turn.index} was not sampled from the episode's sequence"
                    )
                between = turn.prompt_ids[seen:]
                response += between
                mask += [0] * len(between)
                logprobs += [0.0] * len(between)
            start = len(response)
            response += turn.token_ids
            mask += [1] * len(turn.token_ids)
            logprobs += turn.logprobs or []
            spans.append((start, len(response)))
        response += conversation.cut_reply
        mask += [0] * len(conversation.cut_reply)
        logprobs += [0.0] * len(conversation.cut_reply)
        return EpisodeTokens(
            prompt_ids=list(prompt),
            response_ids=response,
            response_mask=mask,
            response_logprobs=logprobs if with_logprobs else None,
            turn_spans=spans,
            state_keys=list(conversation.state_keys),
            mode=self.mode,
            turn_prompt_ids=[t.prompt_ids for t in turns] if self.mode == PER_TURN else None,  # type: ignore[misc]
        )


class _Conversation(Policy):
    """One episode's chat as :class:`ChatPolicy` plays it: the sequence so far and what the
    engine's record cannot hold (the raw ``state_key`` s, the observation tokens cut at the end)."""

    def __init__(self, root: ChatPolicy, spec: EpisodeSpec) -> None:
        self.root = root
        self.spec = spec
        self.prompt_ids: list[int] = []
        """turn 0's prompt"""
        self.sequence: list[int] = []
        """episode mode: the prompt and the response so far"""
        self.messages: list[dict[str, Any]] = []
        """per_turn mode: the conversation so far"""
        self.last_ids: list[int] | None = None
        self.last_text = ""
        self.state_keys: list[Hashable] = []
        self.cut_reply: list[int] = []

    async def act(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        info: dict[str, Any] | None = None,
    ) -> PolicyOutput:
        root, chat = self.root, self.root.chat
        info = info or {}
        observation = messages[-1]["content"]
        room = root.response_length
        if self.last_ids is None:
            self.messages = root.first_messages(self.spec, observation, info)
            prompt = chat.render(self.messages, generation_prompt=True)
            if root.prompt_length is not None and len(prompt) > root.prompt_length:
                logger.warning(
                    "%s seed %s: first prompt of %d tokens exceeds prompt_length=%d; "
                    "left-truncating",
                    self.spec.env_id, self.spec.seed, len(prompt), root.prompt_length,
                )  # fmt: skip
                prompt = prompt[-root.prompt_length :]
            self.prompt_ids = prompt
            self.sequence = list(prompt)
        elif root.mode == PER_TURN:
            self.messages = [
                *self.messages,
                {"role": "assistant", "content": self.last_text},
                {"role": "user", "content": root.observation_text(observation, info)},
            ]
            prompt = chat.render(self.messages, generation_prompt=True)
            if root.prompt_length is not None:
                prompt = prompt[-root.prompt_length :]
        else:
            # The env's reply; a turn cut by the token limit gets its end-of-turn token here.
            reply = chat.close_turn(self.last_ids)
            reply += chat.observation_ids(root.observation_text(observation, info))
            room -= len(self.sequence) - len(self.prompt_ids)
            if len(reply) >= room:  # no room for another turn
                self.cut_reply = reply[:room] if root.keep_cut_reply else []
                return PolicyOutput("", end_episode="response_length")
            self.sequence += reply
            room -= len(reply)
            prompt = self.sequence
        max_tokens = min(params.max_tokens, room)
        prompt_ids = list(prompt)
        try:
            ids, logprobs = await root.sample(list(prompt_ids), max_tokens)
        except Exception as exc:
            raise PolicyUnavailable(f"generation failed: {type(exc).__name__}: {exc}") from exc
        ids = list(ids)[:max_tokens]
        logprobs = None if logprobs is None else [float(x) for x in logprobs][: len(ids)]
        if root.mode == EPISODE:
            self.sequence += ids
        self.state_keys.append(info.get("state_key"))
        self.last_ids = ids
        self.last_text = chat.tokenizer.decode(ids, skip_special_tokens=True)
        return PolicyOutput(
            self.last_text,
            token_ids=ids,
            logprobs=logprobs,
            prompt_ids=prompt_ids,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(ids),
            finish_reason="stop" if ids and ids[-1] in chat.end_ids else "length",
        )
