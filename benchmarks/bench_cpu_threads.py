"""SmolLM2-135M-Instruct decoding on CPU with one torch thread against more: what
``agentgym eval --threads`` chooses between.

Greedy decoding of ``--tokens`` new tokens after one prompt, each thread count in turn within a
repeat (interleaved, so load that changes during the run falls on every arm alike); per token,
the median wall-clock and CPU time (this process's user + system time) over ``--repeats``. On a
machine whose cores other work keeps busy, more threads than free cores is many times slower:
torch's threads wait for each other at every step.

    nice -n 10 python benchmarks/bench_cpu_threads.py --threads 1 2 --out runs/cpu_threads.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Push the box onto the target. The room is 6x6 and you stand at the left wall."


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts")
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per generation")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "runs" / "cpu_threads.json"))
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.models import model_path

    folder = model_path("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    runs: dict[int, list[tuple[float, float]]] = {n: [] for n in args.threads}
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)  # warm-up, not timed
        for _ in range(args.repeats):
            for n in args.threads:
                torch.set_num_threads(n)
                wall, cpu = time.perf_counter(), _cpu_s()
                model.generate(
                    ids, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False
                )
                runs[n].append(
                    ((time.perf_counter() - wall) / args.tokens, (_cpu_s() - cpu) / args.tokens)
                )
    report = {
        "model": "SmolLM2-135M-Instruct",
        "tokens": args.tokens,
        "repeats": args.repeats,
        "cores": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "per_token": {
            str(n): {
                "wall_s_median": statistics.median(w for w, _ in v),
                "cpu_s_median": statistics.median(c for _, c in v),
                "wall_s": [w for w, _ in v],
                "cpu_s": [c for _, c in v],
            }
            for n, v in runs.items()
        },
    }
    for n, row in report["per_token"].items():
        print(
            f"{n} thread(s): {row['wall_s_median']:.3f} s wall, {row['cpu_s_median']:.3f} s CPU "
            "per token (median)"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
