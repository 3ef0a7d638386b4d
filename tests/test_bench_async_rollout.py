"""benchmarks/bench_async_rollout.py against a real llama.cpp ``llama-server``: a smoke run with
the compact prompt records token ids and log-probs on every turn, and the server's counters of
prompt tokens processed and reused from a slot's cache.

Needs a built ``llama-server``: set ``AGENTGYM_LLAMA_SERVER`` to its path (skips without it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LLAMA_SERVER = os.environ.get("AGENTGYM_LLAMA_SERVER")


@pytest.mark.skipif(
    not LLAMA_SERVER, reason="set AGENTGYM_LLAMA_SERVER to a llama-server binary to run this"
)
def test_compact_prompt_run_records_logprobs_and_prompt_cache_counters(tmp_path):
    from agentgym.models import ModelNotAvailable, gguf_file

    try:
        gguf_file("smollm2-135m")
    except ModelNotAvailable as exc:
        pytest.skip(str(exc))
    out = tmp_path / "async.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_async_rollout.py")]
    cmd += ["--server", "llama", "--llama-server", LLAMA_SERVER, "--quick"]
    cmd += ["--settings", "varied", "--template", "compact", "--history-length", "0"]
    cmd += ["--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["template"] == "compact" and report["history_length"] == 0
    runs = report["runs"]["varied"]
    assert {r["mode"] for r in runs} == {"async", "lockstep"}
    for run in runs:
        # quick caps 1,3,1,2: 7 turns, each with its sampled token ids and their log-probs
        assert run["turns"] == 7 and run["turns_with_token_ids_and_logprobs"] == 7
        counters = run["server_counters"]
        # every prompt starts with the chat template's preamble: the episodes' later turns
        # find it in their slot's cache (slots are erased before each run, so not from the
        # other arm); processed and cached together are the prompts' tokens, give or take the
        # last token of a fully cached prompt, which is evaluated again
        assert counters["prompt_tokens_cached"] > 0
        total = counters["prompt_tokens"] + counters["prompt_tokens_cached"]
        assert abs(total - run["prompt_tokens"]) <= run["turns"], (counters, run)
        assert counters["tokens_predicted"] >= run["completion_tokens"] > 0
    summary = report["summary"]["varied"]
    assert set(summary["server_counters_median"]) == {"async", "lockstep"}
