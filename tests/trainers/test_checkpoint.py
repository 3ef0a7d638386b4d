"""Checkpoints survive kills: saves are atomic, resume finds the latest complete checkpoint.

Faults are real: a training subprocess is SIGKILLed in the middle of writing a checkpoint's
largest file (``torch.save`` in that subprocess writes half the bytes, then waits to be
killed), then the run is resumed through the command-line entry point.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainers.gigpo.checkpoint import STATE_FILE, checkpoint_problem, latest_complete
from trainers.gigpo.config import Config
from trainers.gigpo.train import main, train

ROOT = Path(__file__).resolve().parents[2]

#: The training CLI in a subprocess whose ``torch.save`` call number ``KILL_AT_SAVE`` writes
#: half of its bytes, says SAVING on stdout and waits to be killed.
KILLED_DURING_SAVE = r"""
import io, os, sys, time
import torch

real_save, calls = torch.save, []

def save_half_then_wait(obj, f, *args, **kwargs):
    calls.append(f)
    if len(calls) < int(os.environ["KILL_AT_SAVE"]):
        return real_save(obj, f, *args, **kwargs)
    buffer = io.BytesIO()
    real_save(obj, buffer)
    data = buffer.getvalue()
    with open(f, "wb") as out:
        out.write(data[: len(data) // 2])
    print("SAVING", flush=True)
    time.sleep(120)

torch.save = save_half_then_wait
from trainers.gigpo.train import main
main(sys.argv[1:])
"""


def cli_args(run: Path, iterations: int) -> list[str]:
    return [
        "--env", "AgentGym/Corridor-v0", "--env-kwargs", '{"length": 2}', "--num-groups", "2",
        "--group-size", "2", "--eval-every", "0", "--checkpoint-every", "1", "--iterations",
        str(iterations), "--out-dir", str(run), "--no-tensorboard", "--no-progress", "--seed", "4",
    ]  # fmt: skip


def kill_during_save(args: list[str], save_number: int) -> None:
    """Run the CLI with ``args``; SIGKILL it while it writes its ``save_number``-th state file."""
    env = {**os.environ, "KILL_AT_SAVE": str(save_number), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_DURING_SAVE, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stdout:
            if line.strip() == "SAVING":
                proc.send_signal(signal.SIGKILL)
                break
        else:
            pytest.fail(f"the run ended before save {save_number}: {proc.stderr.read()[-2000:]}")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def iterations_logged(run: Path) -> list[int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["iteration"] for x in lines]


def test_kill_during_a_save_leaves_the_last_complete_checkpoint_and_resume_finds_it(tmp_path):
    run = tmp_path / "run"
    kill_during_save(cli_args(run, iterations=3), save_number=2)

    # The killed save left no checkpoint-2 folder: only complete checkpoints carry the name.
    assert not (run / "checkpoint-2").exists()
    assert checkpoint_problem(run / "checkpoint-1") is None
    assert latest_complete(run) == run / "checkpoint-1"

    # --resume RUN_DIR picks checkpoint-1, takes the run's own config and finishes it.
    main(["--resume", str(run), "--no-progress"])
    assert latest_complete(run) == run / "checkpoint-3"
    assert iterations_logged(run) == [1, 2, 3]  # no duplicate records from the killed run
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []  # no leftovers


def test_kill_while_replacing_a_checkpoint_keeps_the_old_one(tmp_path):
    """Resuming from an earlier checkpoint rewrites later ones; a kill then must not destroy
    the complete checkpoint that was there."""
    run = tmp_path / "run"
    main(cli_args(run, iterations=2))
    before = (run / "checkpoint-2" / STATE_FILE).read_bytes()

    kill_during_save(cli_args(run, 2) + ["--resume", str(run / "checkpoint-1")], save_number=1)
    assert checkpoint_problem(run / "checkpoint-2") is None
    assert (run / "checkpoint-2" / STATE_FILE).read_bytes() == before
    state = torch.load(run / "checkpoint-2" / STATE_FILE, weights_only=False)
    assert state["iteration"] == 2


def test_a_kill_between_the_two_renames_of_a_replacement_is_recovered(tmp_path):
    """Replacing checkpoint-N moves the old one aside, then renames the new one in; a kill
    between the two leaves no checkpoint-N but two complete hidden folders. Resume publishes
    the newer one and tidies the rest."""
    import shutil

    from trainers.gigpo.checkpoint import resolve_resume

    run = tmp_path / "run"
    main(cli_args(run, iterations=2))
    os.replace(run / "checkpoint-2", run / ".checkpoint-2.old-101")  # what the kill left
    shutil.copytree(run / ".checkpoint-2.old-101", run / ".checkpoint-2.partial-101")
    (run / ".checkpoint-3.partial-101").mkdir()  # and a save killed before its manifest
    assert latest_complete(run) == run / "checkpoint-1"

    assert resolve_resume(run) == run / "checkpoint-2"
    assert checkpoint_problem(run / "checkpoint-2") is None
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


def test_incomplete_checkpoint_is_refused_in_one_line_naming_the_latest_complete(tmp_path, capsys):
    """A checkpoint whose tokenizer is gone does not resume with a rebuilt 5-token tokenizer."""
    run = tmp_path / "run"
    main(cli_args(run, iterations=2))
    (run / "checkpoint-2" / "tokenizer.json").unlink()
    assert "tokenizer.json" in checkpoint_problem(run / "checkpoint-2")
    capsys.readouterr()

    with pytest.raises(SystemExit) as exit_info:
        main(["--resume", str(run / "checkpoint-2")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "checkpoint-2" in err and "tokenizer.json" in err
    assert f"--resume {run / 'checkpoint-1'}" in err

    config = Config.for_env(
        "AgentGym/Corridor-v0", out_dir=str(run), resume=str(run / "checkpoint-2"), progress=False
    )
    with pytest.raises(ValueError, match="tokenizer.json"):
        train(config)  # the programmatic entry point refuses it too

    # The run folder resumes from its latest complete checkpoint, which is checkpoint-1.
    main(["--resume", str(run), "--no-progress"])
    assert checkpoint_problem(run / "checkpoint-2") is None
    assert iterations_logged(run) == [1, 2]


def untimed_metrics(run: Path) -> list[dict]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_signals_at_random_moments_then_resume_give_the_uninterrupted_run(tmp_path, sig):
    """Soak: 8 runs, each stopped by ``sig`` at a random moment (any phase, saves included),
    then resumed from the run folder; every resumed run's metrics equal the uninterrupted run's.
    """
    import random
    import time

    reference = tmp_path / "reference"
    main(cli_args(reference, iterations=6) + ["--eval-every", "2", "--no-plot"])
    expected = untimed_metrics(reference)
    rng = random.Random(int(sig))
    outcomes = []
    for trial in range(8):
        run = tmp_path / f"run{trial}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainers.gigpo.train",
             *cli_args(run, iterations=6), "--eval-every", "2", "--no-plot"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for line in proc.stdout:  # start the clock once the model is built
            if line.startswith(("eval at iteration 0", "iteration 1/")):
                break
        time.sleep(rng.uniform(0.0, 0.8))
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        if sig == signal.SIGINT and proc.returncode == 130:
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        saved = latest_complete(run)
        outcomes.append((proc.returncode, saved.name if saved else None))
        if saved is None:
            main(cli_args(run, iterations=6) + ["--eval-every", "2", "--no-plot", "--overwrite"])
        else:
            main(["--resume", str(run), "--no-progress"])
        assert untimed_metrics(run) == expected, (trial, outcomes[-1])
    print(outcomes)
    assert any(code != 0 for code, _ in outcomes)  # the signals did land during runs
