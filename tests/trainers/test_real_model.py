"""The reference trainer on a real pretrained model: SmolLM2-135M-Instruct, its BPE tokenizer and
its ChatML chat template, on CPU (full fine-tuning and LoRA).

Tiny sizes (one group of 2 one-step episodes, a few tokens: a 135M model's forward and backward
on CPU cost about 5 ms of a core per token), but every check is one that must hold at any size: the weights moved, the importance ratio is 1 before the first update, the
trainer's log-probs equal the sampler's per token, and the ids trained are the ids sampled.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from trainers.gigpo.config import Config
from trainers.gigpo.train import train

# A 135M model's update on CPU: seconds on idle cores, minutes on busy ones.
pytestmark = [pytest.mark.realmodel, pytest.mark.timeout(1800)]


def real_config(model, tmp_path, **overrides) -> Config:
    base = dict(
        model=str(model),
        num_groups=1,
        group_size=2,
        max_episode_steps=1,
        history_length=0,
        iterations=2,
        max_new_tokens=4,
        lr=1e-4,
        # Two epochs: the "old" log-probs come from their own forward pass (not the loss's),
        # so the ratio-is-1 check compares two different passes.
        ppo_epochs=2,
        kl_coef=0.0,
        # In 2 tiny iterations every episode may end alike (no win), making every advantage 0;
        # the entropy bonus keeps the gradient nonzero so that the update path is exercised.
        entropy_coef=0.01,
        eval_every=0,
        cpu_threads=None,  # torch's default: every core, or one each under `-n N`
        out_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
        plot=False,
        quiet=True,
    )
    return Config.for_env("AgentGym/Corridor-v0", **{**base, **overrides})


def check_history(history: list[dict]) -> None:
    records = [r for r in history if "rollout/success_rate" in r]
    assert len(records) == 2
    for r in records:
        # sampler (static-cache decoder or scorer) and trainer forward agree per token
        assert r["rollout/logprob_diff"] < 1e-3, r["rollout/logprob_diff"]
        # before the first optimizer step the recomputed old log-probs are the policy's own
        assert r["update/first_ratio_dev"] < 1e-4, r["update/first_ratio_dev"]
        assert r["rollout/response_tokens"] >= 1
        assert np.isfinite(r["update/loss"])
    assert any(r["update/grad_norm"] > 0 for r in records)


def test_full_finetune_changes_weights(smollm2_path, tmp_path):
    """Free text (the default), the model's own tokenizer and template. Scored actions on the
    same model are trained in tests/trainers/test_pinned_results.py (log-probs, weights moved)."""
    from safetensors.torch import load_file

    config = real_config(smollm2_path, tmp_path)
    history = train(config)
    check_history(history)
    before = load_file(str(smollm2_path / "model.safetensors"))
    after = load_file(str(tmp_path / "run" / "checkpoint-2" / "model.safetensors"))
    shared = sorted(set(before) & set(after))
    assert shared
    changed = [k for k in shared if not torch.equal(before[k], after[k])]
    # Full fine-tuning moves every layer's weights (a few norms may stay put in two steps).
    assert len(changed) > len(shared) // 2, (len(changed), len(shared))


def test_lora_changes_adapter_only(smollm2_path, tmp_path):
    from safetensors.torch import load_file

    config = real_config(smollm2_path, tmp_path, lora_rank=4, lr=1e-3)
    history = train(config)
    check_history(history)
    folder = tmp_path / "run" / "checkpoint-2"
    adapter = load_file(str(folder / "adapter_model.safetensors"))
    lora_b = {k: v for k, v in adapter.items() if "lora_B" in k}
    assert lora_b
    # LoRA's B matrices start at zero: nonzero means the update reached the adapter.
    assert sum(int(v.abs().sum() > 0) for v in lora_b.values()) > len(lora_b) // 2
    saved = json.loads((folder / "adapter_config.json").read_text())
    assert saved["r"] == 4
    assert not (folder / "model.safetensors").exists()  # the base model stays the user's own


def test_ids_trained_are_ids_sampled(smollm2_path):
    """Rows carry the sampled ids (end-of-turn included), never a re-tokenisation of the text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.engine import SamplingParams, TransformersPolicy, chat_prompt_ids
    from trainers.gigpo.rollout import collect, make_group_env

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    policy = TransformersPolicy(model, tokenizer, seed=None, decoder="static")
    seen = []

    class Recording:
        def generate(self, messages, params, infos=None):
            out = policy.generate(messages, params, infos)
            seen.append(([m[-1]["content"] for m in messages], out))
            return out

    venv = make_group_env(
        "AgentGym/Corridor-v0",
        num_groups=2,
        group_size=2,
        fmt="plain",
        history_length=1,
        env_kwargs={"length": 2, "max_episode_steps": 2},
    )
    torch.manual_seed(0)
    batch = collect(venv, Recording(), SamplingParams(max_tokens=8), seed=3)
    venv.close()
    # Rows are in trajectory order; rounds in env order: rebuild the per-env sequence.
    per_env: list[list] = [[] for _ in range(4)]
    for prompts, gens in seen:
        live = [i for i in range(4) if len(per_env[i]) < len(batch.trajectories[i].steps)]
        for i, prompt, gen in zip(live, prompts, gens, strict=True):
            per_env[i].append((prompt, gen))
    flat = [pg for env in per_env for pg in env]
    assert len(flat) == len(batch)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for row, (prompt, gen) in enumerate(flat):
        assert batch.response_ids[row] == gen.token_ids
        assert batch.prompt_ids[row] == chat_prompt_ids(tokenizer, prompt)
        assert batch.sample_logprobs[row] == gen.logprobs
        assert len(gen.logprobs) == len(gen.token_ids)
        # ChatML: the prompt ends by opening the assistant turn
        assert tokenizer.decode(batch.prompt_ids[row][-3:]).endswith("assistant\n")
        # a response that ended by itself ends with the model's end-of-turn token
        ids = batch.response_ids[row]
        assert len(ids) == 8 or ids[-1] == eos
    # The env was stepped with the decoded sampled text.
    steps = [s for t in batch.trajectories for s in t.steps]
    for step, (_, gen) in zip(steps, flat, strict=True):
        assert step.action == gen.text
