"""Pinned results: fixed-seed runs of the trainer give exactly these metrics and final weights.

A change to how episodes are played (the engine, the policies, the collection code) must not
change a user's numbers: the same config and seed give the same sampled tokens, the same
rewards, the same update and so the same weights. Each run here is small (seconds) and its
logged metrics (wall-clock timings aside) and a sha256 digest of its final weights are compared
with constants recorded from a known-good run.

The constants (``pinned_results.json`` beside this file) hold for this CPU build of torch
(float32 kernels on one thread); another torch version or BLAS may round differently. To record
them again after a change that is meant to alter the numbers, run
``PINNED_WRITE=1 python -m pytest tests/trainers/test_pinned_results.py`` and commit the file
with the reason in the message.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from trainers.gigpo.config import Config
from trainers.gigpo.train import train


def weights_digest(model_dir) -> str:
    """sha256 over the saved weights: every tensor's name, dtype, shape and bytes, by name."""
    from safetensors.torch import load_file

    state = load_file(str(model_dir / "model.safetensors"))
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def untimed(history: list[dict]) -> list[dict]:
    """The logged records without their wall-clock fields (the only ones two runs may differ in)."""
    records = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in history]
    return json.loads(json.dumps(records))  # as metrics.jsonl holds them


def run(config: Config, tmp_path) -> tuple[list[dict], str]:
    history = train(config)
    on_disk = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert untimed(on_disk) == untimed(history)
    final = tmp_path / "run" / f"checkpoint-{config.iterations}"
    return untimed(history), weights_digest(final)


PINNED = Path(__file__).with_name("pinned_results.json")


def check(name: str, got: tuple[list[dict], str]) -> None:
    """``got`` (records, weights digest) equals the pinned run ``name``; with ``PINNED_WRITE``
    set, records it instead."""
    pinned = json.loads(PINNED.read_text()) if PINNED.exists() else {}
    records, digest = got
    if os.environ.get("PINNED_WRITE"):
        pinned[name] = {"records": records, "weights_sha256": digest}
        PINNED.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")
    assert name in pinned, f"no pinned results for {name} in {PINNED}"
    want_records, want_digest = pinned[name]["records"], pinned[name]["weights_sha256"]
    assert len(records) == len(want_records)
    for have, want in zip(records, want_records, strict=True):
        assert have == want, {k: (have.get(k), want.get(k)) for k in set(have) | set(want)
                              if have.get(k) != want.get(k)}  # fmt: skip
    assert digest == want_digest


def tiny(tmp_path, **overrides) -> Config:
    """The corridor demo (tiny random model, word-level tokenizer), at a few iterations."""
    base = dict(
        out_dir=str(tmp_path / "run"), progress=False, tensorboard=False, plot=False, quiet=True,
        device="cpu", cpu_threads=1, seed=0, checkpoint_every=0,
    )  # fmt: skip
    return Config.for_env("AgentGym/Corridor-v0", **{**base, **overrides})


def test_demo_three_iterations(tmp_path):
    """The demo's own sizes (8 x 8 episodes, held-out evaluation every iteration) for 3 iterations."""
    config = tiny(tmp_path, iterations=3, eval_every=1)
    check("DEMO", run(config, tmp_path))


def test_tree_rollout(tmp_path):
    config = tiny(
        tmp_path, iterations=2, num_groups=2, group_size=4, rollout="tree", branch_points=1,
        continuations=2, advantage="slate", eval_every=0,
    )  # fmt: skip
    check("TREE", run(config, tmp_path))


def test_stepwise_rollout(tmp_path):
    config = tiny(
        tmp_path, iterations=2, num_groups=2, group_size=4, rollout="stepwise", advantage="slate",
        judge="rule", eval_every=0,
    )  # fmt: skip
    check("STEPWISE", run(config, tmp_path))


@pytest.mark.realmodel
@pytest.mark.timeout(900)
def test_smollm2_scored_two_iterations(smollm2_path, tmp_path):
    """SmolLM2-135M-Instruct choosing among admissible actions, 2 iterations of 2 x 2 episodes."""
    config = Config.for_env(
        "AgentGym/Corridor-v0", model=str(smollm2_path), policy="scored", num_groups=2,
        group_size=2, max_steps=2, history_length=0, iterations=2, lr=1e-4, kl_coef=0.0,
        entropy_coef=0.01, eval_every=0, cpu_threads=1, seed=0, device="cpu",
        checkpoint_every=0, out_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
        plot=False, quiet=True,
    )  # fmt: skip
    records, digest = run(config, tmp_path)
    check("SMOLLM2_SCORED", (records, digest))
    # What the pin stands for: the scorer's log-probs are the trainer's forward pass per token,
    # the update reached the weights, and they moved from the user's model.
    for record in records:
        if "rollout/success_rate" in record:
            assert record["rollout/logprob_diff"] < 1e-3 and record["update/grad_norm"] > 0
    from safetensors.torch import load_file

    before = load_file(str(smollm2_path / "model.safetensors"))
    after = load_file(
        str(tmp_path / "run" / f"checkpoint-{config.iterations}" / "model.safetensors")
    )
    shared = sorted(set(before) & set(after))
    changed = [k for k in shared if not torch.equal(before[k], after[k])]
    assert shared and len(changed) > len(shared) // 2, (len(changed), len(shared))
