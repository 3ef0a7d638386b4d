"""The real-model study's bookkeeping: which runs resume, which are done, and what it reports.

The study itself trains SmolLM2 for an hour; these tests check the parts a stopped study depends
on (a run with a checkpoint resumes in place, a finished run is skipped) and the figures it
derives from the trainer's metrics, on hand-written histories.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_real_model_learning.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_real_model_learning", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def study_args(tmp_path: Path, **overrides) -> argparse.Namespace:
    base = dict(
        model="/models/smollm2", methods=["gigpo", "grpo"], seeds=[0, 1], iterations=10,
        num_groups=1, group_size=8, length=2, num_doors=4, max_episode_steps=6, gamma=0.95,
        action_temperature=3.0, lora_rank=16, lora_layers=8, lr=3e-4, mini_batch_size=16,
        eval_every=5, eval_groups=16, checkpoint_every=5, threads=1, jobs=2,
        runs_dir=tmp_path / "runs",
    )  # fmt: skip
    return argparse.Namespace(**{**base, **overrides})


def write_history(folder: Path, records: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_detours_per_win_weigh_each_iteration_by_its_wins(bench, tmp_path):
    """Iteration 1: 4 of 8 won in 2 steps (no detour); iteration 2: 2 of 8 won in 4 steps (one
    detour each); iterations 3 and 4: none won. Over all: (4 * 2 + 2 * 4) / 6 steps per win, minus the 2
    rooms, over 2 steps per detour = 1/3. The last quarter (iteration 4 of 4) has no win: None,
    not 0."""
    args = study_args(tmp_path, iterations=4)
    curves = {
        "iteration": [1, 2, 3, 4],
        "success_rate": [0.5, 0.25, 0.0, 0.0],
        "won_episode_length": [2.0, 4.0, None, None],
        "seconds_update": [1.0, 1.0, 1.0, 1.0],
        "seconds_iteration": [2.0, 2.0, 2.0, 2.0],
        "eval_iteration": [0, 5],
        "eval_success_rate": [0.25, 1.0],
    }
    summary = bench.summarise(curves, args)
    assert summary["detours_per_win"] == pytest.approx(1 / 3)
    assert summary["detours_per_win_last_quarter"] is None
    assert summary["wins"] == 6
    assert summary["auc_held_out"] == pytest.approx(0.625)
    assert summary["first_iteration_at_0_9"] == 5


def test_a_stopped_run_resumes_in_place_and_a_finished_one_is_skipped(bench, tmp_path):
    args = study_args(tmp_path)
    done = args.runs_dir / "gigpo-seed0"
    write_history(
        done,
        [{"iteration": 0, "eval/success_rate": 0.0}]
        + [{"iteration": i, "rollout/success_rate": 0.5} for i in range(1, 11)]
        + [{"iteration": 10, "eval/success_rate": 1.0}],
    )
    stopped = args.runs_dir / "grpo-seed0"
    write_history(stopped, [{"iteration": i, "rollout/success_rate": 0.5} for i in range(1, 6)])
    (stopped / "checkpoint-5").mkdir()

    assert bench.finished(args, bench.read_history(done / "metrics.jsonl"))
    assert not bench.finished(args, bench.read_history(stopped / "metrics.jsonl"))
    # trained to the end but stopped before the final evaluation: not finished
    write_history(args.runs_dir / "gigpo-seed1", [{"iteration": 10, "rollout/success_rate": 1.0}])
    assert not bench.finished(
        args, bench.read_history(args.runs_dir / "gigpo-seed1" / "metrics.jsonl")
    )

    resume = bench.command(args, "grpo", 0)
    assert resume == [sys.executable, "-m", "trainers.gigpo.train", "--resume", str(stopped)]
    new = bench.command(args, "grpo", 1)  # nothing there yet: a new run, same seed flag as gigpo's
    assert "--resume" not in new and new[new.index("--seed") + 1] == "1"
    assert new[new.index("--advantage") + 1] == "grpo"
    assert new[new.index("--lora-layers") + 1] == "8"
    gigpo = bench.command(args, "gigpo", 1)
    # the two methods' command lines differ only in the estimator and the run folder
    assert [a for a in gigpo if "seed1" not in a and a not in ("gigpo", "grpo")] == [
        a for a in new if "seed1" not in a and a not in ("gigpo", "grpo")
    ]
