"""A Ctrl-C that stops a run before its final evaluation does not lose that evaluation.

The interruption is a real SIGINT, delivered to the trainer's own handler at the exact moment:
during the last iteration's update (the trainer finishes the iteration, saves and stops) or
during the final evaluation (it stops at once and saves the state from before it). Resuming
must then run the final evaluation and write what the uninterrupted run writes, instead of
saying that the run is finished.
"""

from __future__ import annotations

import json
import signal

import pytest

import trainers.gigpo.train as train_module
from trainers.gigpo.checkpoint import load_state
from trainers.gigpo.config import Config
from trainers.gigpo.console import TrainingInterrupted
from trainers.gigpo.train import main, train

ITERATIONS = 2
COMMON = dict(
    iterations=ITERATIONS, num_groups=2, group_size=2, eval_every=1, eval_groups=2,
    checkpoint_every=1, env_kwargs={"length": 2}, seed=5, device="cpu", progress=False,
    tensorboard=False, plot=True,
)  # fmt: skip


def corridor(run, **overrides) -> Config:
    return Config.for_env("AgentGym/Corridor-v0", out_dir=str(run), **{**COMMON, **overrides})


def untimed(records):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def final_evals(records):
    return [r for r in records if r["iteration"] == ITERATIONS and "eval/success_rate" in r]


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run that nothing stopped: its history and folder."""
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    return train(corridor(run)), run


def ctrl_c_in_last_update(monkeypatch):
    """SIGINT while the last iteration's update runs (after its first optimizer step)."""
    real = train_module.update_policy

    def update_then_ctrl_c(config, learner, batch, advantages, it, console):
        record = real(config, learner, batch, advantages, it, console)
        if it + 1 == ITERATIONS:
            signal.raise_signal(signal.SIGINT)  # the trainer notes it and finishes the update
        return record

    monkeypatch.setattr(train_module, "update_policy", update_then_ctrl_c)


def ctrl_c_in_final_evaluation(monkeypatch):
    """SIGINT as the final evaluation starts (it stops the run at once)."""
    real = train_module.evaluate

    def ctrl_c_then_evaluate(config, eval_venv, policy, params, phase, iteration, samples):
        if iteration == ITERATIONS:
            signal.raise_signal(signal.SIGINT)
        return real(config, eval_venv, policy, params, phase, iteration, samples)

    monkeypatch.setattr(train_module, "evaluate", ctrl_c_then_evaluate)


@pytest.mark.parametrize("moment", [ctrl_c_in_last_update, ctrl_c_in_final_evaluation])
def test_resume_runs_the_final_evaluation_a_ctrl_c_cut_off(
    tmp_path, monkeypatch, capsys, uninterrupted, moment
):
    full, full_run = uninterrupted
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        moment(patch)
        with pytest.raises(TrainingInterrupted) as stop:
            train(corridor(run))
    saved = run / f"checkpoint-{ITERATIONS}"
    assert stop.value.checkpoint == saved  # the last iteration was saved, without the eval
    assert not final_evals(load_state(saved)["history"]) and not final_evals(metrics(run))

    capsys.readouterr()
    resumed = train(corridor(run, resume=str(run)))
    out = capsys.readouterr().out
    assert "is finished" not in out and "final evaluation" in out, out
    # what the uninterrupted run logged and saved, the final evaluation included
    assert untimed(resumed) == untimed(full)
    assert untimed(metrics(run)) == untimed(metrics(full_run))
    assert untimed(load_state(saved)["history"]) == untimed(full)
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in full_run.iterdir())

    main(["--resume", str(run), "--no-progress"])  # now it is finished, and says so
    assert "is finished" in capsys.readouterr().out
    assert untimed(metrics(run)) == untimed(metrics(full_run))


def test_a_run_without_a_final_save_keeps_its_final_evaluation_in_its_last_checkpoint(tmp_path):
    """``--no-save-final`` with checkpoints every iteration: the last one is written after the
    final evaluation, so resuming the finished run has nothing to redo."""
    run = tmp_path / "run"
    history = train(corridor(run, save_final=False))
    assert final_evals(load_state(run / f"checkpoint-{ITERATIONS}")["history"])
    assert train(corridor(run, save_final=False, resume=str(run))) == history
