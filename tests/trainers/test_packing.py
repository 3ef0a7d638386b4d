"""Padding-free update forwards: the same log-probs as the padded forward, on CPU.

A real tiny Qwen2 (random weights, built offline); rows of ragged prompt and response lengths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainers.gigpo.packing import auto_token_budget, micro_batches, packed_response_forward
from trainers.gigpo.train import response_forward

VOCAB, PAD = 40, 0


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.2, pad_token_id=PAD, tie_word_embeddings=True,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen2ForCausalLM(config).eval()


def rows(n: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, VOCAB, (int(k),), generator=g).tolist()
               for k in torch.randint(1, 30, (n,), generator=g)]  # fmt: skip
    responses = [torch.randint(1, VOCAB, (int(k),), generator=g).tolist()
                 for k in torch.randint(1, 12, (n,), generator=g)]  # fmt: skip
    return prompts, responses


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_forward_equals_padded_forward(model, temperature):
    prompts, responses = rows(9, 1)
    cpu = torch.device("cpu")
    with torch.no_grad():
        lp, mask, ent = response_forward(
            model, prompts, responses, PAD, cpu, with_entropy=True, temperature=temperature
        )
        plp, pmask, pent = packed_response_forward(
            model, prompts, responses, cpu, with_entropy=True, temperature=temperature
        )
    assert torch.equal(mask, pmask)
    assert lp.shape == plp.shape == (9, max(map(len, responses)))
    real = mask > 0  # the padded forward also scores its padding columns; compare real ones
    assert torch.allclose(plp[real], lp[real], atol=1e-5)
    assert torch.allclose(pent[real], ent[real], atol=1e-5)
    assert (plp[~real] == 0).all()


def test_packed_forward_carries_gradients_like_the_padded_one(model):
    prompts, responses = rows(5, 2)
    cpu = torch.device("cpu")
    grads = []
    for forward in (
        lambda: response_forward(model, prompts, responses, PAD, cpu, with_entropy="grad"),
        lambda: packed_response_forward(model, prompts, responses, cpu, with_entropy="grad"),
    ):
        model.zero_grad()
        lp, mask, ent = forward()
        ((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_length_sorted_micro_batches_match_the_padded_batch(model):
    """Regrouping rows by length under a token budget gives each row the log-probs it has in
    one padded batch of all rows."""
    prompts, responses = rows(12, 3)
    cpu = torch.device("cpu")
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    with torch.no_grad():
        lp, mask, _ = response_forward(model, prompts, responses, PAD, cpu)
        parts = micro_batches(lengths, token_budget=60)
        assert len(parts) > 2
        for idx in parts:
            sub_lp, sub_mask, _ = response_forward(
                model, [prompts[i] for i in idx], [responses[i] for i in idx], PAD, cpu
            )
            for b, i in enumerate(idx):
                assert torch.allclose(sub_lp[b, sub_mask[b] > 0], lp[i, mask[i] > 0], atol=1e-5)


def test_micro_batches_cover_every_row_once_under_the_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 500, size=300)
    parts = micro_batches(lengths, token_budget=2000, max_rows=16)
    assert sorted(np.concatenate(parts).tolist()) == list(range(300))
    for idx in parts:
        assert len(idx) <= 16
        assert len(idx) * lengths[idx].max() <= 2000 or len(idx) == 1
    padded = sum(len(idx) * lengths[idx].max() for idx in parts)
    random_order = [np.arange(300)[i : i + 16] for i in range(0, 300, 16)]
    padded_random = sum(len(idx) * lengths[idx].max() for idx in random_order)
    assert padded < 0.7 * padded_random  # sorting removes most of the padding
    assert micro_batches([5000, 10], token_budget=100) == [[0], [1]]  # too long: on its own


def test_auto_token_budget_follows_the_model_size():
    from trainers.gigpo.tiny import QWEN2_5_1_5B_SHAPE

    big = Qwen2Config(**QWEN2_5_1_5B_SHAPE)
    tiny = Qwen2Config(vocab_size=200, hidden_size=64, num_hidden_layers=2)
    assert 2000 <= auto_token_budget(big) <= 20000
    assert auto_token_budget(tiny) > 100 * auto_token_budget(big)
    assert auto_token_budget(big, inference=True) > auto_token_budget(big)
    assert auto_token_budget(big, device_memory=8 * 2**30) < auto_token_budget(big)
