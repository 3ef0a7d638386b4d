"""The update's forward pass: per-token log-probs of rollout rows under a model.

Rows are ``prompt + response`` token lists; a forward lays every row's response out
right-aligned in a ``(B, T)`` tensor (T the longest response in the micro-batch), so the loss,
the old/reference log-probs and the advantages broadcast column for column. Padded
(:func:`response_forward`) and padding-free (``packing.packed_response_forward``) forwards give
the same layout and values; :func:`rows_forward` picks one.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch

from trainers.gigpo.loss import entropy_from_logits, token_logprobs
from trainers.gigpo.packing import micro_batches, packed_response_forward
from trainers.gigpo.rollout import RolloutBatch


def autocast_for(device: torch.device, dtype: torch.dtype) -> Callable[[], AbstractContextManager]:
    """A factory of autocast contexts: fp32 master weights, ``dtype`` compute (CPU autocast
    too, when asked for); a no-op context for fp32."""

    def autocast() -> AbstractContextManager:
        if dtype != torch.float32:
            return torch.autocast(device.type, dtype=dtype)
        return nullcontext()

    return autocast


def response_forward(
    model: Any,
    prompts: list[list[int]],
    responses: list[list[int]],
    pad_id: int,
    device: torch.device,
    with_entropy: bool | str = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probs of each row's response tokens under ``model``.

    Sequences ``prompt + response`` are left-padded to a common length S so that every response
    ends at the last position; only the last ``T + 1`` positions' logits are computed
    (``logits_to_keep``), T being the longest response, which avoids a (B, S, V) logits tensor.
    Logits are divided by the sampling ``temperature`` (as verl does), so that the ratio is taken
    against the distribution the tokens were actually drawn from.

    ``with_entropy``: False, True (computed without gradient, for logging) or ``"grad"`` (for an
    entropy bonus).

    Returns:
        logprobs (B, T), response_mask (B, T) float, entropy (B, T) or None. Row b's response
        occupies the last ``len(responses[b])`` of the T columns.
    """
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in seqs)
    t_max = max(len(r) for r in responses)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), t_max))
    for b, (s, r) in enumerate(zip(seqs, responses, strict=True)):
        input_ids[b, width - len(s) :] = torch.tensor(s)
        attention[b, width - len(s) :] = 1
        mask[b, t_max - len(r) :] = 1.0
    input_ids, attention, mask = input_ids.to(device), attention.to(device), mask.to(device)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        logits_to_keep=t_max + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1]  # (B, T, V): position j predicts token S - T + j
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logprobs = token_logprobs(logits, input_ids[:, width - t_max :])
    entropy = None
    if with_entropy == "grad":
        entropy = entropy_from_logits(logits)
    elif with_entropy:  # for logging only: no autograd graph over the (B, T, V) softmax
        with torch.no_grad():
            entropy = entropy_from_logits(logits)
    return logprobs, mask, entropy


@torch.no_grad()
def batched_logprobs(
    model: Any,
    batch: RolloutBatch,
    rows: np.ndarray,
    micro: int,
    pad_id: int,
    device: torch.device,
    autocast: Any,
    temperature: float = 1.0,
    token_budget: int | None = None,
    packed: bool = False,
) -> list[torch.Tensor]:
    """Per-row response log-probs (a 1-D tensor per row) under ``model``, without gradients.

    Rows go ``micro`` at a time in ``rows`` order, or with ``token_budget`` in length-sorted
    micro-batches under it (``packed``: each packed into one sequence, no padding).
    """
    out: list[torch.Tensor] = [torch.empty(0)] * len(batch)
    model.eval()
    if token_budget is None:
        groups = [rows[start : start + micro] for start in range(0, len(rows), micro)]
    else:
        groups = [rows[g] for g in micro_batches(row_lengths(batch, rows), token_budget)]
    for idx in groups:
        with autocast():
            lp, mask, _ = rows_forward(
                model,
                [batch.prompt_ids[i] for i in idx],
                [batch.response_ids[i] for i in idx],
                pad_id,
                device,
                temperature=temperature,
                packed=packed,
            )
        for b, i in enumerate(idx):
            out[i] = lp[b, mask[b] > 0].float().cpu()
    model.train()
    return out


def rows_forward(
    model: Any,
    prompts: list[list[int]],
    responses: list[list[int]],
    pad_id: int,
    device: torch.device,
    with_entropy: bool | str = False,
    temperature: float = 1.0,
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`response_forward`, or with ``packed`` its padding-free equivalent
    (``trainers.gigpo.packing.packed_response_forward``; same layout, same values)."""
    if packed:
        return packed_response_forward(model, prompts, responses, device, with_entropy, temperature)
    return response_forward(model, prompts, responses, pad_id, device, with_entropy, temperature)


def row_lengths(batch: RolloutBatch, rows: np.ndarray) -> np.ndarray:
    """(len(rows),) prompt + response tokens of each of ``rows``."""
    return np.fromiter(
        (len(batch.prompt_ids[i]) + len(batch.response_ids[i]) for i in rows),
        dtype=np.int64,
        count=len(rows),
    )


def pad_right_aligned(rows: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    """Stack 1-D tensors into (B, width), each right-aligned (as ``response_forward`` lays out)."""
    out = torch.zeros((len(rows), width))
    for b, r in enumerate(rows):
        if len(r):
            out[b, width - len(r) :] = r
    return out.to(device)


def micro_groups(
    batch: RolloutBatch, mini: np.ndarray, token_budget: int | None, micro_size: int
) -> list[np.ndarray]:
    """A mini-batch's rows as micro-batches (the loss weighs each by its token share):
    ``micro_size`` rows at a time, or with ``token_budget`` length-sorted groups under it (at
    most ``micro_size`` rows each)."""
    if token_budget is None:
        return [mini[i : i + micro_size] for i in range(0, len(mini), micro_size)]
    parts = micro_batches(row_lengths(batch, mini), token_budget, micro_size)
    return [mini[p] for p in parts]
