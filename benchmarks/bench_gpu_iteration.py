"""GiGPO iterations with a Qwen2.5-1.5B-sized model (random weights, no download), and with
``--compare`` the reference path and the fast path side by side in one run.

The model has Qwen2.5-1.5B's exact shape (28 layers, hidden 1536, GQA 12/2 heads, MLP 8960,
151,936-token vocabulary, tied embeddings: 1.54B parameters) and random weights; the tokenizer
is the word-level one built offline from the env's own texts (ids past its vocabulary decode
to nothing, so the random model's responses run to ``max_new_tokens``: the worst case for
generation). Iterations of ``python -m trainers.gigpo.train`` run on the env's preset
(16 groups x 8, Sokoban 15 steps): rollout with the Hugging Face backend under bf16 autocast,
GiGPO advantages, the PPO update with gradient checkpointing.

Two paths (``--variant``, or both with ``--compare``):

- ``reference``: transformers' ``generate`` with its dynamic KV cache; the update in
  ``micro_batch_size``-row micro-batches in shuffled order (``--hf-generation generate
  --update-batching rows``);
- ``fast``: the static-KV-cache decoder (CUDA-graph decode step, finished rows dropped) and
  length-sorted micro-batches under a token budget sized from the model (the trainer's
  defaults).

Reported per path: generated tokens/s, update tokens/s (prompt + response tokens of the rows
per second of update), time per phase (generate / env / advantage / update), peak GPU memory;
with ``--compare`` also the ratios fast / reference. Figures are of the last iteration (the
first includes compiling the decode step; it is kept as ``first_iteration``), medians over
``--repeats`` runs of each path, the paths interleaved. JSON goes to ``--out`` (default
``benchmarks/results/gpu_iteration.json``, with ``--compare``
``benchmarks/results/gpu_iteration_compare.json``).

    python benchmarks/bench_gpu_iteration.py --compare --iterations 2 --max-episode-steps 3

fits one 10-minute GPU job at full size (an H100 ran one reference iteration at all 15 steps in
456 s); ``--device cpu --layers 2 --hidden 64`` runs the same code on CPU with a small model
(the tests do that).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# The reference trainer is not installed with the package: run from a clone, import it from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentgym.io import atomic_write_text  # noqa: E402
from trainers.gigpo.config import Config  # noqa: E402
from trainers.gigpo.tiny import build_tokenizer, save_random_model  # noqa: E402
from trainers.gigpo.train import env_texts, train  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_iteration.json"
COMPARE_RESULTS = RESULTS.with_name("gpu_iteration_compare.json")

#: Config overrides of each path.
VARIANTS: dict[str, dict[str, Any]] = {
    "reference": {"hf_generation": "generate", "update_batching": "rows"},
    "fast": {"hf_generation": "static", "update_batching": "auto"},
}
CONFIG_FIELDS = (
    "num_groups", "group_size", "max_episode_steps", "max_new_tokens", "iterations", "micro_batch_size",
    "micro_batch_tokens", "mini_batch_size", "generation_batch_size", "generation_backend",
    "hf_generation", "update_batching",
)  # fmt: skip


def run_variant(config: Config, cuda: bool) -> dict[str, Any]:
    """Train ``config`` once; the last iteration's figures (and the first's timings)."""
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    history = train(config)
    total_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    records = [r for r in history if "rollout/success_rate" in r]
    record, first = records[-1], records[0]
    rows = record["rollout/episode_length"] * config.num_groups * config.group_size
    tokens = record["rollout/response_tokens"] * rows
    return {
        "config": {k: getattr(config, k) for k in CONFIG_FIELDS},
        "rows": rows,
        "generated_tokens": tokens,
        "generate_tokens_per_s": tokens / record["time/generate"],
        "update_tokens_per_s": record["time/update_tokens_per_s"],
        "time_s": {
            "generate": record["time/generate"],
            "env": record["time/env"],
            "advantage": record["time/advantage"],
            "update": record["time/update"],
            "iteration": record["time/iteration"],
            "total_with_load": total_s,
        },
        "first_iteration_s": {
            "generate": first["time/generate"],
            "update": first["time/update"],
            "iteration": first["time/iteration"],
        },
        "peak_gpu_memory_gib": peak,
        "update_loss": record["update/loss"],
        "record": record,
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median iteration time, with every figure replaced by its median."""
    runs = sorted(runs, key=lambda r: r["time_s"]["iteration"])
    out = dict(runs[len(runs) // 2])
    for key in ("generate_tokens_per_s", "update_tokens_per_s"):
        out[key] = statistics.median(r[key] for r in runs)
    out["time_s"] = {k: statistics.median(r["time_s"][k] for r in runs) for k in out["time_s"]}
    if runs[0]["peak_gpu_memory_gib"] is not None:
        out["peak_gpu_memory_gib"] = max(r["peak_gpu_memory_gib"] for r in runs)
    out["repeats"] = len(runs)
    out["iteration_s_each"] = [r["time_s"]["iteration"] for r in runs]
    return out


def run(
    env: str = "AgentGym/Sokoban-v0",
    device: str = "cuda",
    variants: tuple[str, ...] = ("fast",),
    repeats: int = 1,
    work_dir: Path | None = None,
    overrides: dict[str, Any] | None = None,
    **shape: Any,
) -> dict[str, Any]:
    """Build the model once, run each of ``variants`` ``repeats`` times (interleaved), return
    the figures (see the module docstring)."""
    base: dict[str, Any] = {
        "iterations": 1,
        "eval_every": 0,
        "device": device,
        "progress": False,
        "quiet": True,
        "save_final": False,
        "tensorboard": False,
        **{k: v for k, v in (overrides or {}).items() if v is not None},
    }
    cuda = device.startswith("cuda")
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        model_dir = Path(tmp) / "random-qwen2.5-1.5b-shape"
        configs = {
            name: Config.for_env(
                env,
                model=str(model_dir),
                out_dir=str(Path(tmp) / name),
                plot=False,
                overwrite=True,
                **{**base, **VARIANTS[name]},
            )  # fmt: skip
            for name in variants
        }
        t0 = time.perf_counter()
        tokenizer = build_tokenizer(env_texts(next(iter(configs.values()))))
        params = save_random_model(model_dir, tokenizer, device=device, **shape)
        build_s = time.perf_counter() - t0
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for _ in range(repeats):
            for name in variants:
                runs[name].append(run_variant(configs[name], cuda))

    import transformers

    result: dict[str, Any] = {
        "benchmark": "gpu_iteration",
        "command": "python benchmarks/bench_gpu_iteration.py " + " ".join(sys.argv[1:]),
        "env": env,
        "model": {
            "shape": "Qwen2.5-1.5B" + (" with overrides" if shape else ""),
            "parameters": params,
            "weights": "random",
            **shape,
        },
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "build_model_s": build_s,
    }
    figures = {name: median_run(r) for name, r in runs.items()}
    if len(variants) == 1:
        result.update(variant=variants[0], **figures[variants[0]])
        return result
    result["variants"] = figures
    if {"reference", "fast"} <= set(figures):
        ref, fast = figures["reference"], figures["fast"]
        result["ratios"] = {
            "generate_tokens_per_s": fast["generate_tokens_per_s"] / ref["generate_tokens_per_s"],
            "update_tokens_per_s": fast["update_tokens_per_s"] / ref["update_tokens_per_s"],
            "iteration_speedup": ref["time_s"]["iteration"] / fast["time_s"]["iteration"],
            "peak_memory": (
                fast["peak_gpu_memory_gib"] / ref["peak_gpu_memory_gib"] if cuda else None
            ),
        }
    return result


def summary(name: str, r: dict[str, Any]) -> str:
    t = r["time_s"]
    peak = r["peak_gpu_memory_gib"]
    return (
        f"{name}: {r['rows']:.0f} rows, {r['generated_tokens']:.0f} generated tokens, "
        f"generate {r['generate_tokens_per_s']:,.0f} tokens/s ({t['generate']:.1f} s), "
        f"update {r['update_tokens_per_s']:,.0f} tokens/s ({t['update']:.1f} s), "
        f"env {t['env']:.2f} s, iteration {t['iteration']:.1f} s"
        + (f", peak GPU memory {peak:.1f} GiB" if peak is not None else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="AgentGym/Sokoban-v0")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--compare", action="store_true", help="run the reference and the fast path"
    )
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="fast")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each path (median)")
    parser.add_argument(
        "--iterations", type=int, default=1, help="figures are of the last (warm) one"
    )
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the preset's")
    parser.add_argument("--num-groups", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--max-episode-steps", type=int, default=None, help="rounds per episode")
    parser.add_argument("--micro-batch-tokens", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None, help="override the model's depth")
    parser.add_argument(
        "--hidden", type=int, default=None, help="override the width (a multiple of 4)"
    )
    parser.add_argument(
        "--out", type=Path, default=None,
        help=f"default: results/{RESULTS.name}, with --compare results/{COMPARE_RESULTS.name}",
    )  # fmt: skip
    args = parser.parse_args()
    if args.out is None:
        args.out = COMPARE_RESULTS if args.compare else RESULTS
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device: this benchmark is for a GPU (--device cpu runs a smoke test)")
    shape: dict[str, Any] = {}
    if args.layers is not None:
        shape["num_hidden_layers"] = args.layers
    if args.hidden is not None:  # 4 query heads over 2 key/value heads, as in the tests
        shape.update(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                     num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    overrides = {
        "iterations": args.iterations,
        "max_new_tokens": args.max_new_tokens,
        "num_groups": args.num_groups,
        "group_size": args.group_size,
        "max_episode_steps": args.max_episode_steps,
        "micro_batch_tokens": args.micro_batch_tokens,
    }
    variants = ("reference", "fast") if args.compare else (args.variant,)
    result = run(args.env, args.device, variants, args.repeats, overrides=overrides, **shape)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"{result['model']['parameters'] / 1e9:.2f}B params on {result['device']}")
    for name, figures in result.get("variants", {variants[0]: result}).items():
        print(summary(name, figures))
    for key, value in result.get("ratios", {}).items():
        if value is not None:
            print(f"fast / reference {key}: {value:.2f}x")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
