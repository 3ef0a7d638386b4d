"""An offline tiny model and tokenizer, for CPU tests and the corridor benchmark.

No downloads: the tokenizer is a word-level vocabulary built with the ``tokenizers`` library
over texts the env actually produces (so every action word is one token and a randomly
initialised model can emit any action from the first iteration), wrapped as a
``transformers.PreTrainedTokenizerFast`` with a ChatML chat template. The model is a
randomly initialised ``Qwen2ForCausalLM`` of a few layers, the same architecture family as
the real models the trainer targets, so the same code path (chat template, ``generate``,
log-probs, PPO update) runs on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, UNK, BOS, EOS = "<|pad|>", "<|unk|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, BOS, EOS)

#: ChatML, as Qwen uses; words are separated by the tokenizer's pre-tokenizer, so no spaces
#: or newlines are needed around the role names.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(
    texts: Iterable[str], max_vocab: int | None = None, whole_words: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``texts`` (plus the chat roles and the special tokens).

    Words are split by ``tokenizers``' ``Whitespace`` pre-tokenizer (``\\w+`` runs and runs of
    punctuation); unseen words map to ``<|unk|>``. Decoding joins tokens with single spaces,
    which reproduces single-word actions exactly. The vocabulary is sorted by frequency, then
    alphabetically, so the same texts always give the same ids.

    Args:
        texts: env observations / prompts to take the vocabulary from.
        max_vocab: keep only the most frequent words (None: keep all).
        whole_words: strings kept whole as one token each, wherever they occur (added tokens, not
            special: decoding keeps them), e.g. the plan tags of ``trainers.gigpo.subgoals``,
            which the pre-tokenizer would otherwise cut into punctuation runs.
    """
    pre = pre_tokenizers.Whitespace()
    counts: dict[str, int] = {}
    for text in list(texts) + ["system user assistant"]:
        for word, _ in pre.pre_tokenize_str(text):
            counts[word] = counts.get(word, 0) + 1
    words = sorted(counts, key=lambda w: (-counts[w], w))
    if max_vocab is not None:
        words = words[: max(0, max_vocab - len(SPECIAL_TOKENS))]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in words:
        vocab.setdefault(w, len(vocab))
    return tokenizer_from_vocab(vocab, whole_words)


def tokenizer_from_vocab(
    vocab: dict[str, int], whole_words: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """The tiny tokenizer over ``vocab`` (word -> id, the special tokens first, as
    :func:`build_tokenizer` makes it) and the ``whole_words`` after it: everything but those
    strings comes from this module."""
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [BOS, EOS]})
    tokenizer.chat_template = CHAT_TEMPLATE
    if whole_words:
        tokenizer.add_tokens([AddedToken(w, normalized=False) for w in whole_words])
    return tokenizer


def load_tiny_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The tiny tokenizer saved in ``path``, rebuilt from the word -> id table of its
    ``tokenizer.json`` only.

    The table is data; nothing else in the folder is used: the pre-tokenizer, the special
    tokens and the chat template come from this module. A template is code that runs whenever a
    prompt is rendered, and a folder a run wrote is trusted no more than its weights. Raises
    ``ValueError`` when the file holds no vocabulary :func:`build_tokenizer` could have made.
    """
    file = Path(path) / "tokenizer.json"
    try:
        with file.open() as f:
            model_file = json.load(f)
        model = model_file["model"]
        vocab = model["vocab"] if model.get("type") == "WordLevel" else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{file} holds no tokenizer vocabulary ({err})") from None
    well_formed = (
        isinstance(vocab, dict)
        and all(isinstance(w, str) and type(i) is int for w, i in vocab.items())
        and sorted(vocab.values()) == list(range(len(vocab)))
        and [vocab.get(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    )
    if not well_formed:
        raise ValueError(f"{file} is not a tiny model's word-level vocabulary")
    # Whole words (a HiPER run's plan tags) are the file's non-special added tokens: strings,
    # re-added in their id order, so they get the ids the run trained with.
    added = model_file.get("added_tokens") or []
    whole_words = [
        t["content"]
        for t in sorted(added, key=lambda t: t.get("id", 0) if isinstance(t, dict) else 0)
        if isinstance(t, dict) and not t.get("special", True) and isinstance(t.get("content"), str)
    ]
    return tokenizer_from_vocab(vocab, whole_words)


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    max_positions: int = 4096,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM over ``tokenizer``'s vocabulary (seeded)."""
    return _random_qwen2(
        tokenizer,
        seed=seed,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )


def _random_qwen2(
    tokenizer: PreTrainedTokenizerFast,
    *,
    seed: int,
    device: str | torch.device = "cpu",
    **spec: Any,
) -> Qwen2ForCausalLM:
    """A Qwen2 of config ``spec`` with seeded random weights on ``device`` (the global RNG is
    left as it was), its special tokens and generation ids taken from ``tokenizer``."""
    config = Qwen2Config(
        **spec,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


#: Qwen2.5-1.5B's architecture (its config.json) without the weights: 1.54B parameters.
QWEN2_5_1_5B_SHAPE: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def save_random_model(
    path: str | Path,
    tokenizer: PreTrainedTokenizerFast,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    **shape: Any,
) -> int:
    """Save a randomly initialised Qwen2 of :data:`QWEN2_5_1_5B_SHAPE` (``shape`` overrides any
    field) with ``tokenizer`` to ``path``, loadable as ``--model path``; returns its parameter
    count.

    The vocabulary keeps the real model's size (the LM head's cost and memory are part of what
    a full-size run measures); sampled ids past ``tokenizer``'s words decode to nothing. Weights
    are initialised on ``device`` (seconds on a GPU, minutes for 1.5B on a CPU) and saved in
    bf16; the trainer loads them as fp32 master weights.
    """
    spec = {**QWEN2_5_1_5B_SHAPE, **shape}
    spec["vocab_size"] = max(spec["vocab_size"], len(tokenizer))
    model = _random_qwen2(tokenizer, seed=seed, device=device, **spec)
    params = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return params


def load_tokenizer(path: str | Path) -> Any:
    """Load a saved tokenizer: word-level (tiny) ones as-is, anything else with ``AutoTokenizer``.

    ``AutoTokenizer`` next to a ``qwen2`` ``config.json`` builds ``Qwen2Tokenizer``, which wraps
    our word-level vocabulary in Qwen's byte-level BPE pre-tokenizer and silently drops every
    word; a tiny tokenizer is therefore loaded with ``PreTrainedTokenizerFast`` directly.
    """
    from transformers import AutoTokenizer

    file = Path(path) / "tokenizer.json"
    if file.is_file():
        with file.open() as f:
            if json.load(f).get("model", {}).get("type") == "WordLevel":
                return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)
