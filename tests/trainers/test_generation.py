"""The static-cache decoder against transformers' own ``generate``, on CPU with real tiny models.

Greedy decoding must give ``generate``'s tokens exactly (ragged prompts, rows ending at
different steps, with and without compaction); sampling without compaction must draw
``generate``'s very tokens from the same random state; sampling with compaction (which changes
which rows the random draws go to) must match ``generate``'s per-position token frequencies.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentgym.engine import SamplingParams, TransformersPolicy
from agentgym.engine.decoding import StaticDecoder, sample_next

VOCAB, PAD, EOS = 24, 0, 1


def peaked_model(seed: int) -> Qwen2ForCausalLM:
    """A random Qwen2 whose logits are far from uniform (large init), so greedy decoding ends
    rows at different steps and sampling has a shape worth comparing."""
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.4, pad_token_id=PAD, eos_token_id=EOS, tie_word_embeddings=True,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).eval()
    model.generation_config.pad_token_id = PAD
    model.generation_config.eos_token_id = EOS
    return model


def ragged_prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 14, (n,), generator=g)
    return [torch.randint(2, VOCAB, (int(k),), generator=g).tolist() for k in lengths]


def plain_generate(model, prompts, max_new_tokens, **sampling) -> list[list[int]]:
    """``generate`` on the left-padded batch, each row cut after its first end token."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD)
    attention = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        attention[i, width - len(p) :] = 1
    out = model.generate(
        input_ids=ids, attention_mask=attention, max_new_tokens=max_new_tokens,
        pad_token_id=PAD, eos_token_id=EOS, **sampling,
    )[:, width:].tolist()  # fmt: skip
    return [r[: r.index(EOS) + 1] if EOS in r else r for r in out]


@pytest.mark.parametrize("compact", [False, True])
def test_greedy_equals_generate_on_ragged_prompts_that_end_early(compact):
    for seed in range(2):
        model = peaked_model(seed)
        prompts = ragged_prompts(10, seed)
        expected = plain_generate(model, prompts, 20, do_sample=False)
        decoder = StaticDecoder(model, eos_ids=[EOS], pad_id=PAD, compact=compact, check_every=2)
        got, logprobs = decoder.generate(prompts, max_new_tokens=20, temperature=0)
        assert got == expected
        assert [len(lp) for lp in logprobs] == [len(r) for r in got]
    lengths = {len(r) for r in got}
    assert len(lengths) > 2 and min(lengths) < 20, lengths  # rows did end at different steps


def test_sampling_without_compaction_draws_generates_tokens():
    model = peaked_model(5)
    prompts = ragged_prompts(10, 5)
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
        torch.manual_seed(11)
        expected = plain_generate(
            model, prompts, 16, do_sample=True, temperature=temperature, top_k=0, top_p=top_p
        )
        torch.manual_seed(11)
        got, _ = StaticDecoder(model, eos_ids=[EOS], pad_id=PAD, compact=False).generate(
            prompts, max_new_tokens=16, temperature=temperature, top_p=top_p
        )
        assert got == expected


def test_sampled_log_probs_are_the_tokens_log_probs_at_the_temperature():
    model = peaked_model(2)
    prompts = ragged_prompts(6, 2)
    torch.manual_seed(0)
    got, logprobs = StaticDecoder(model, eos_ids=[EOS], pad_id=PAD, check_every=1).generate(
        prompts, max_new_tokens=8, temperature=0.7
    )
    with torch.no_grad():
        for p, r, lp in zip(prompts, got, logprobs, strict=True):
            logits = model(torch.tensor([p + r])).logits[0, len(p) - 1 : -1] / 0.7
            want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None])[:, 0]
            assert lp == pytest.approx(want.tolist(), abs=1e-4)


def test_compacted_sampling_matches_generate_in_distribution():
    """Per-position token frequencies over 600 samples of one prompt set: compaction changes
    which random draw each row gets, not the distribution (total variation vs generate's
    frequencies within what two samples of this size differ by)."""
    model = peaked_model(7)
    prompts = ragged_prompts(3, 7) * 200  # 600 rows: 200 samples per prompt
    positions = 6

    def freqs(rows):
        counts = np.zeros((3, positions, VOCAB + 1))
        for i, r in enumerate(rows):
            for t in range(positions):
                counts[i % 3, t, r[t] if t < len(r) else VOCAB] += 1  # VOCAB: ended
        return counts / 200

    torch.manual_seed(3)
    ref = freqs(plain_generate(model, prompts, positions, do_sample=True, top_k=0, top_p=1.0))
    torch.manual_seed(4)
    ref2 = freqs(plain_generate(model, prompts, positions, do_sample=True, top_k=0, top_p=1.0))
    torch.manual_seed(5)
    got, _ = StaticDecoder(model, eos_ids=[EOS], pad_id=PAD, check_every=1).generate(
        prompts[::-1], max_new_tokens=positions, temperature=1.0
    )
    fast = freqs(got[::-1])
    tv = 0.5 * np.abs(fast - ref).sum(-1)  # (prompt, position)
    tv_same = 0.5 * np.abs(ref2 - ref).sum(-1)  # two draws of generate itself
    assert tv.max() < 0.25 and tv.mean() < 2 * tv_same.mean() + 0.02, (tv, tv_same)
    ended = fast[..., VOCAB].sum()
    assert ended > 0  # rows did end early, so compaction ran


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    seen = {int(sample_next(logits, 1.0, 0.8)[0]) for _ in range(200)}
    assert seen == {0, 1}


def test_hf_policy_fast_path_equals_generate_path():
    """The policy's two HF paths give the same greedy responses through the whole stack
    (chat template, length-sorted batches, decoding of the text)."""
    from trainers.gigpo.tiny import build_model, build_tokenizer

    tok = build_tokenizer(["Room 1 of 3 . Light comes through the red door . blue green back"])
    model = build_model(tok, seed=1)
    prompts = ["Room 1 of 3.", "Light comes through the red door. Room 2 of 3.", "back", "red"]
    slow = TransformersPolicy(model, tok, max_batch=3, seed=None, decoder="generate")
    fast = TransformersPolicy(model, tok, max_batch=3, seed=None, decoder="static")
    messages = [[{"role": "user", "content": p}] for p in prompts]
    greedy = SamplingParams(temperature=0, max_tokens=6)
    a, b = slow.generate(messages, greedy), fast.generate(messages, greedy)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.text for g in a] == [g.text for g in b]
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


def compiled_decoder_check(device: str) -> None:
    """The compiled step (CUDA graphs on CUDA), with its power-of-two batches, rounded cache
    widths and filler rows, gives the eager greedy tokens; twice, the second call replaying."""
    model = peaked_model(0).to(device)
    prompts = ragged_prompts(12, 0)  # 12 rows: run as 16, then 8, 4... as rows end
    eager = StaticDecoder(model, eos_ids=[EOS], pad_id=PAD, compile=False, check_every=2)
    expected, _ = eager.generate(prompts, max_new_tokens=24, temperature=0)
    compiled = StaticDecoder(model, eos_ids=[EOS], pad_id=PAD, compile=True, check_every=2)
    for _ in range(2):
        got, _ = compiled.generate(prompts, max_new_tokens=24, temperature=0)
        assert not compiled._compile_failed and got == expected
    assert len({len(r) for r in got}) > 2  # rows ended at different steps: compaction ran


@pytest.mark.slow
def test_compiled_decode_step_equals_eager_on_cpu():
    compiled_decoder_check("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_decode_step_equals_eager_on_cuda():
    compiled_decoder_check("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_static_decoder_equals_generate_on_cuda():
    model = peaked_model(1).to("cuda")
    prompts = ragged_prompts(10, 1)
    expected = plain_generate_on(model, prompts, 16, "cuda", do_sample=False)
    got, _ = StaticDecoder(model, eos_ids=[EOS], pad_id=PAD, compile=False).generate(
        prompts, max_new_tokens=16, temperature=0
    )
    assert got == expected


def plain_generate_on(model, prompts, max_new_tokens, device, **sampling):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD)
    attention = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        attention[i, width - len(p) :] = 1
    out = model.generate(
        input_ids=ids.to(device), attention_mask=attention.to(device),
        max_new_tokens=max_new_tokens, pad_token_id=PAD, eos_token_id=EOS, **sampling,
    )[:, width:].tolist()  # fmt: skip
    return [r[: r.index(EOS) + 1] if EOS in r else r for r in out]


def test_gpu_iteration_benchmark_compares_both_paths_on_cpu(tmp_path):
    """``bench_gpu_iteration.py --compare`` runs the reference and the fast path in one
    process and writes both sets of figures with their ratios."""
    import json
    import math
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gpu.json"
    subprocess.run(
        [sys.executable, str(root / "benchmarks" / "bench_gpu_iteration.py"), "--compare",
         "--device", "cpu", "--layers", "1", "--hidden", "32", "--max-new-tokens", "3",
         "--num-groups", "2", "--group-size", "2", "--max-episode-steps", "1", "--out", str(out)],
        check=True, cwd=root, capture_output=True,
    )  # fmt: skip
    result = json.loads(out.read_text())
    ref, fast = result["variants"]["reference"], result["variants"]["fast"]
    assert ref["config"]["hf_generation"] == "generate"
    assert ref["config"]["update_batching"] == "rows"
    assert fast["config"]["hf_generation"] == "static"
    for figures in (ref, fast):
        assert figures["rows"] == 4 and figures["generated_tokens"] <= 12
        assert figures["generate_tokens_per_s"] > 0 and figures["update_tokens_per_s"] > 0
        assert math.isfinite(figures["update_loss"]) and figures["peak_gpu_memory_gib"] is None
    ratios = result["ratios"]
    assert ratios["generate_tokens_per_s"] == pytest.approx(
        fast["generate_tokens_per_s"] / ref["generate_tokens_per_s"]
    )
    assert ratios["iteration_speedup"] == pytest.approx(
        ref["time_s"]["iteration"] / fast["time_s"]["iteration"]
    )
    # Same seed, same model: the first round's prompts are the same for both paths.
    assert ref["record"]["rollout/episode_length"] == fast["record"]["rollout/episode_length"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_resumed_run_on_cuda_samples_the_uninterrupted_rollout(tmp_path):
    """Checkpoints carry the CUDA generators: resuming at iteration 2 on a GPU samples the
    third rollout exactly as the run that went on (same weights, same random draws). The
    update after it may differ in the last bits (nondeterministic CUDA reductions)."""
    from trainers.gigpo.config import Config
    from trainers.gigpo.train import STATE_FILE, train

    def corridor(folder, **overrides):
        return Config.for_env(
            "AgentGym/Corridor-v0", out_dir=str(tmp_path / folder), progress=False,
            tensorboard=False, plot=False, iterations=3, num_groups=2, group_size=4,
            eval_every=0, checkpoint_every=1, seed=3, device="cuda", **overrides,
        )  # fmt: skip

    full = train(corridor("a"))
    state = torch.load(tmp_path / "a" / "checkpoint-2" / STATE_FILE, weights_only=False)
    assert state["cuda_rng"] and all(isinstance(s, torch.Tensor) for s in state["cuda_rng"])
    resumed = train(corridor("a", resume=str(tmp_path / "a" / "checkpoint-2")))
    rollout = [k for k in full[2] if k.startswith("rollout/") and k != "rollout/logprob_diff"]
    assert rollout and {k: resumed[2][k] for k in rollout} == {k: full[2][k] for k in rollout}


def test_low_precision_generation_copy_follows_the_trained_weights():
    """With ``generation_dtype`` the policy decodes from a bf16 copy; ``sync_weights`` after
    an update refreshes it in place (a captured decode step keeps its tensor addresses)."""
    from trainers.gigpo.tiny import build_model, build_tokenizer

    tok = build_tokenizer(["Room 1 of 3 . Light comes through the red door . blue green back"])
    model = build_model(tok, seed=2)
    policy = TransformersPolicy(
        model, tok, seed=None, decoder="static", generation_dtype=torch.bfloat16
    )
    copy = policy.generation_model
    assert copy is not model and {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    addresses = [p.data_ptr() for p in copy.parameters()]
    with torch.no_grad():
        for p in model.parameters():  # stands in for an optimizer step
            p.add_(torch.randn_like(p) * 0.1)
    policy.sync_weights(model)
    assert [p.data_ptr() for p in copy.parameters()] == addresses
    for g, t in zip(copy.parameters(), model.parameters(), strict=True):
        assert torch.equal(g, t.to(torch.bfloat16))
    messages = [[{"role": "user", "content": p}] for p in ["Room 1 of 3.", "back"]]
    # the same weights, cast
    fresh = TransformersPolicy(model.to(torch.bfloat16), tok, seed=None, decoder="static")
    greedy = SamplingParams(temperature=0, max_tokens=4)
    assert [g.token_ids for g in policy.generate(messages, greedy)] == [
        g.token_ids for g in fresh.generate(messages, greedy)
    ]
