"""What a chat template puts around a model's turn: the end ids a model may stop on, and the one
token the template closes an assistant turn with.

A model's generation config often lists several end ids, and the first is not always the one its
chat template writes after a reply: Llama 3.x Instruct lists ``<|end_of_text|>`` first and
closes a turn with ``<|eot_id|>``; Gemma 3 lists ``<eos>`` first and closes with
``<end_of_turn>``. A response that is trained (a scored action, a turn cut short by a token
limit) must end with the template's token, the one the model sees after its turns in every later
prompt, so :func:`probe_turn_end` finds it by rendering a fixed chat once.

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["TurnEnd", "end_ids", "probe_turn_end", "render_ids", "turn_end_id"]

Render = Callable[[list[dict[str, Any]], bool], list[int]]

# The fixed chat the probe renders: a user message, a reply, and (for what follows a reply) a
# second user message.
PROBE_CHAT = (
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": "y"},
    {"role": "user", "content": "z"},
)


def end_ids(model: Any, tokenizer: Any) -> list[int]:
    """Ids that end a response: the model's generation config's ``eos_token_id`` (one or a list,
    in its order), then the tokenizer's EOS if not among them. Raises ``ValueError`` when there
    is none at all."""
    ids: list[int] = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.append(configured)
    elif configured:
        ids.extend(int(i) for i in configured)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the tokenizer has no eos token and the model's generation config none")
    return ids


def render_ids(
    tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool, **kwargs: Any
) -> list[int]:
    """``apply_chat_template(messages)`` as a list of token ids."""
    ids = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=generation_prompt,
        tokenize=True,
        return_dict=False,
        **kwargs,
    )
    return list(ids)


@dataclass(frozen=True)
class TurnEnd:
    """What :func:`probe_turn_end` found."""

    end_id: int | None
    """the token the template puts right after an assistant message's text, if it is one of the
    end ids given; else None"""
    head: list[int] | None
    """the probe chat's tokens up to and including that token (what every later render of the
    chat starts with), or None"""
    problem: str = ""
    """why no end token was found ("" when one was)"""


def probe_turn_end(tokenizer: Any, ends: Iterable[int], render: Render | None = None) -> TurnEnd:
    """Find the end-of-turn token the chat template writes after an assistant message.

    Renders ``[user]`` with the generation prompt and ``[user, assistant, user]``; the reply
    starts where the two first differ (the generation prompt may differ from how a rendered reply
    opens: Qwen3's empty think block, a BPE merge across the header), and its end is the first of
    ``ends`` after that. ``render(messages, generation_prompt)`` renders with the template in use
    (default: the tokenizer's own).
    """
    ends = frozenset(ends)
    if render is None:

        def render(messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
            return render_ids(tokenizer, messages, generation_prompt)

    prompt = render(list(PROBE_CHAT[:1]), True)
    full = render(list(PROBE_CHAT), True)
    start = next(
        (i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b), len(prompt)
    )
    end = next((i for i in range(start, len(full)) if full[i] in ends), None)
    if end is None:
        return TurnEnd(None, None, f"no end-of-turn token of {sorted(ends)} after assistant turns")

    def text(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True).strip()

    if text(full[start:end]) != text(tokenizer.encode("y", add_special_tokens=False)):
        return TurnEnd(None, None, "the template renders the first user message differently later")
    return TurnEnd(full[end], full[: end + 1])


def turn_end_id(tokenizer: Any, ends: list[int]) -> int:
    """The token a trained response should end with: the chat template's end of an assistant
    turn (:func:`probe_turn_end`), else (no template, or none of ``ends`` after a reply) the
    first of ``ends``."""
    if getattr(tokenizer, "chat_template", None):
        try:
            found = probe_turn_end(tokenizer, ends).end_id
        except Exception:  # noqa: BLE001 - a template that cannot render the probe chat
            found = None
        if found is not None:
            return found
    return ends[0]
