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
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from agentgym.engine.chat_template import PROBE_CHAT, probe_turn_end, render_ids

__all__ = ["EPISODE", "PER_TURN", "MODES", "ChatTurns"]

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
