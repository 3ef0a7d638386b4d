"""The update's forward passes without compute on padding: token budgets and packed sequences.

Rows of one rollout differ a lot in length (prompts grow with the history, responses end
early), so fixed-size micro-batches of random rows spend much of their compute on padding.
Two remedies, both exact (the same per-token log-probs as the padded forward, to float
rounding; ``tests/trainers/test_packing.py`` checks 1e-5 on CPU):

- :func:`micro_batches`: rows sorted by length and cut into micro-batches under a token
  budget (rows x longest row), so a micro-batch holds many short rows or a few long ones and
  padding is what remains between neighbours in length order. Works with every attention
  implementation. Gradient accumulation weighs each micro-batch by its share of the
  mini-batch's tokens, so regrouping rows does not change the mini-batch's gradient.
- :func:`packed_response_forward`: all rows of a micro-batch concatenated into one sequence
  with position ids restarting at 0 per row and no attention mask. ``transformers`` reads
  the restarts as sequence boundaries: flash-attention kernels run varlen attention over
  ``cu_seqlens`` (no padding anywhere), SDPA and eager attention get a block-diagonal mask
  (no padding in the MLPs and the LM head, but attention over the packed length squared).
  Only the response positions' logits are computed.

:func:`auto_token_budget` sizes micro-batches from the model instead of a fixed row count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from trainers.gigpo.loss import entropy_from_logits, token_logprobs

#: Memory a training micro-batch may take for its logits and activations (bytes), at most; on
#: CUDA also at most :data:`DEVICE_SHARE` of the card. The per-token cost comes from the
#: model's shape (:func:`auto_token_budget`).
TRAIN_BUDGET_BYTES = 24 * 2**30
DEVICE_SHARE = 0.3
#: Forward passes without gradient (old and reference log-probs) keep no activations for a
#: backward pass, so they take this many times the training budget.
INFERENCE_FACTOR = 4


def auto_token_budget(
    model_config: Any, inference: bool = False, device_memory: int | None = None
) -> int:
    """Tokens (rows x longest row) per micro-batch for a model of ``model_config``'s shape.

    Memory per token in a training micro-batch is dominated by the LM head and the loss:
    float32 logits over the vocabulary, their log-softmax for the entropy and the gradient of
    each (about ``6 x 4 x vocab`` bytes), plus the checkpointed activations kept per layer
    (``~4 x 2 x hidden`` bytes per layer in bf16). Only response positions get logits, so
    charging every token the vocabulary cost leaves headroom for the other half of a row.
    :data:`TRAIN_BUDGET_BYTES` (or :data:`DEVICE_SHARE` of ``device_memory``, if smaller)
    divided by that gives about 6,400 tokens for Qwen2.5-1.5B's shape (152k vocabulary), i.e.
    6-7 Sokoban rows of ~950 tokens, and hundreds of thousands for the tiny CPU models (where
    a mini-batch becomes one micro-batch). Without gradients (``inference``) the budget is
    :data:`INFERENCE_FACTOR` times larger. The result is a multiple of 256, at least 1024.
    """
    vocab = int(getattr(model_config, "vocab_size", 32_000))
    hidden = int(getattr(model_config, "hidden_size", 1024))
    layers = int(getattr(model_config, "num_hidden_layers", 12))
    per_token = 6 * 4 * vocab + 8 * hidden * layers
    budget_bytes = TRAIN_BUDGET_BYTES
    if device_memory:
        budget_bytes = min(budget_bytes, int(DEVICE_SHARE * device_memory))
    budget = budget_bytes * (INFERENCE_FACTOR if inference else 1) // per_token
    return max(1024, int(budget) // 256 * 256)


def micro_batches(
    lengths: Sequence[int] | np.ndarray, token_budget: int, max_rows: int | None = None
) -> list[np.ndarray]:
    """Split rows into micro-batches of similar length under ``token_budget``.

    Args:
        lengths: (N,) tokens per row (prompt + response).
        token_budget: the most ``rows x longest row`` a micro-batch may hold; a single row
            longer than the budget gets a micro-batch of its own.
        max_rows: an optional cap on rows per micro-batch.
    Returns:
        Index arrays (into ``lengths``) covering every row once, longest rows first.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    out: list[np.ndarray] = []
    start = 0
    n = len(order)
    while start < n:
        longest = max(int(lengths[order[start]]), 1)  # sorted: the first row is the longest
        rows = max(1, token_budget // longest)
        if max_rows is not None:
            rows = min(rows, max_rows)
        out.append(order[start : start + rows])
        start += rows
    return out


def packed_response_forward(
    model: Any,
    prompts: list[list[int]],
    responses: list[list[int]],
    device: torch.device,
    with_entropy: bool | str = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``response_forward``'s results from one packed sequence (see the module doc).

    Returns the same layout as ``trainers.gigpo.train.response_forward``: ``logprobs (B, T)``,
    ``response_mask (B, T)`` and ``entropy (B, T)`` or None, T the longest response, row b's
    response in the last ``len(responses[b])`` columns.
    """
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    seq_lens = torch.tensor([len(s) for s in seqs])
    resp_lens = torch.tensor([len(r) for r in responses])
    starts = torch.cumsum(seq_lens, 0) - seq_lens  # first packed index of each row
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
    positions = torch.arange(len(ids)) - torch.repeat_interleave(starts, seq_lens)
    # Position j predicts token j + 1: a response's tokens are predicted from the positions
    # one before them (the prompt's last token and the response's own but last).
    rows = torch.repeat_interleave(torch.arange(len(seqs)), resp_lens)
    within = torch.arange(int(resp_lens.sum())) - torch.repeat_interleave(
        torch.cumsum(resp_lens, 0) - resp_lens, resp_lens
    )
    targets = starts[rows] + (seq_lens - resp_lens)[rows] + within  # packed index of the token
    out = model(
        input_ids=ids[None].to(device),
        position_ids=positions[None].to(device),
        logits_to_keep=(targets - 1).to(device),
        use_cache=False,
    )
    logits = out.logits[0]  # (N_response_tokens, V)
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    flat_lp = token_logprobs(logits[None], ids[targets][None].to(device))[0]
    t_max = int(resp_lens.max()) if len(resp_lens) else 0
    cols = (t_max - resp_lens)[rows] + within  # right-aligned column of each token
    rows_d, cols_d = rows.to(device), cols.to(device)
    logprobs = torch.zeros((len(seqs), t_max), dtype=flat_lp.dtype, device=device)
    logprobs = logprobs.index_put((rows_d, cols_d), flat_lp)
    mask = torch.zeros((len(seqs), t_max), device=device)
    mask[rows_d, cols_d] = 1.0
    entropy = None
    if with_entropy:
        if with_entropy == "grad":
            flat_ent = entropy_from_logits(logits)
        else:  # for logging only: no autograd graph over the softmax
            with torch.no_grad():
                flat_ent = entropy_from_logits(logits)
        entropy = torch.zeros((len(seqs), t_max), dtype=flat_ent.dtype, device=device)
        entropy = entropy.index_put((rows_d, cols_d), flat_ent)
    return logprobs, mask, entropy


def supports_varlen(model: Any) -> bool:
    """True when the model's attention runs packed sequences without a dense mask
    (flash-attention kernels); otherwise packing still works but pays attention over the
    packed length squared, and length-sorted micro-batches are the better choice."""
    config = getattr(model, "config", None)
    impl = str(getattr(config, "_attn_implementation", "") or "")
    return "flash" in impl
