"""One full GiGPO iteration with a Qwen2.5-1.5B-sized model (random weights, no download).

The model has Qwen2.5-1.5B's exact shape (28 layers, hidden 1536, GQA 12/2 heads, MLP 8960,
151,936-token vocabulary, tied embeddings: 1.54B parameters) and random weights; the tokenizer
is the word-level one built offline from the env's own texts (ids past its vocabulary decode
to nothing, so the random model's responses run to ``max_new_tokens``: the worst case for
generation). One iteration of ``python -m trainers.gigpo.train`` runs on the env's preset
(16 groups x 8, Sokoban 15 steps): rollout with the Hugging Face backend under bf16 autocast,
GiGPO advantages, the PPO update with gradient checkpointing.

Reported: generated tokens per second, time per phase (generate / env / advantage / update),
peak GPU memory, and the number of training rows and tokens. Writes JSON to ``--out``
(default ``benchmarks/results/gpu_iteration.json``).

    python benchmarks/bench_gpu_iteration.py [--env AgentGym/Sokoban-v0] [--max-new-tokens 512]

On the workplace's GPU machine (no network; gymnasium is the one package it lacks), see
``benchmarks/README.md``. ``--device cpu --layers 2 --hidden 64`` runs the same code on CPU
with a small model (the tests do that).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from trainers.gigpo.config import Config
from trainers.gigpo.tiny import build_tokenizer, save_random_model
from trainers.gigpo.train import env_texts, train

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_iteration.json"


def run(
    env: str = "AgentGym/Sokoban-v0",
    device: str = "cuda",
    max_new_tokens: int | None = None,
    num_groups: int | None = None,
    group_size: int | None = None,
    max_steps: int | None = None,
    work_dir: Path | None = None,
    **shape: Any,
) -> dict[str, Any]:
    """Build the model, run one iteration, return the figures (see the module docstring)."""
    overrides: dict[str, Any] = {
        "iterations": 1,
        "eval_every": 0,
        "device": device,
        "progress": False,
        "save_final": False,
        "tensorboard": False,
    }
    for key, value in (
        ("max_new_tokens", max_new_tokens),
        ("num_groups", num_groups),
        ("group_size", group_size),
        ("max_steps", max_steps),
    ):
        if value is not None:
            overrides[key] = value
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        model_dir = Path(tmp) / "random-qwen2.5-1.5b-shape"
        config = Config.for_env(
            env, model=str(model_dir), out_dir=str(Path(tmp) / "run"), plot=False, **overrides
        )
        t0 = time.perf_counter()
        tokenizer = build_tokenizer(env_texts(config))
        params = save_random_model(model_dir, tokenizer, device=device, **shape)
        build_s = time.perf_counter() - t0
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        record = train(config)[-1]
        total_s = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None

    rows = record["rollout/episode_length"] * config.num_groups * config.group_size
    tokens = record["rollout/response_tokens"] * rows
    return {
        "benchmark": "gpu_iteration",
        "command": "python benchmarks/bench_gpu_iteration.py " + " ".join(sys.argv[1:]),
        "env": env,
        "model": {
            "shape": "Qwen2.5-1.5B" + (" with overrides" if shape else ""),
            "parameters": params,
            "weights": "random",
            **shape,
        },
        "config": {
            k: getattr(config, k)
            for k in (
                "num_groups",
                "group_size",
                "max_steps",
                "max_new_tokens",
                "micro_batch_size",
                "mini_batch_size",
                "generation_batch_size",
                "generation_backend",
            )
        },  # fmt: skip
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "rows": rows,
        "generated_tokens": tokens,
        "generate_tokens_per_s": tokens / record["time/generate"],
        "time_s": {
            "build_model": build_s,
            "generate": record["time/generate"],
            "env": record["time/env"],
            "advantage": record["time/advantage"],
            "update": record["time/update"],
            "iteration": record["time/iteration"],
            "total_with_load": total_s,
        },
        "peak_gpu_memory_gib": peak,
        "update_loss": record["update/loss"],
        "record": record,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="AgentGym/Sokoban-v0")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the preset's")
    parser.add_argument("--num-groups", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None, help="override the model's depth")
    parser.add_argument(
        "--hidden", type=int, default=None, help="override the width (a multiple of 4)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device: this benchmark is for a GPU (--device cpu runs a smoke test)")
    shape: dict[str, Any] = {}
    if args.layers is not None:
        shape["num_hidden_layers"] = args.layers
    if args.hidden is not None:  # 4 query heads over 2 key/value heads, as in the tests
        shape.update(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                     num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    result = run(
        args.env, args.device, args.max_new_tokens, args.num_groups, args.group_size,
        args.max_steps, **shape,
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    t = result["time_s"]
    peak = result["peak_gpu_memory_gib"]
    print(
        f"{result['model']['parameters'] / 1e9:.2f}B params on {result['device']}: "
        f"{result['rows']:.0f} rows, {result['generated_tokens']:.0f} generated tokens, "
        f"{result['generate_tokens_per_s']:,.0f} tokens/s; generate {t['generate']:.1f} s, "
        f"env {t['env']:.2f} s, advantage {t['advantage'] * 1e3:.1f} ms, update {t['update']:.1f} s, "
        f"iteration {t['iteration']:.1f} s"
        + (f"; peak GPU memory {peak:.1f} GiB" if peak is not None else "")
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
