"""What the trainer shows and how it stops: console lines, progress bars and Ctrl-C.

Nothing here changes training; :mod:`trainers.gigpo.train` calls it at fixed points of the loop.
Ctrl-C stops at once during a rollout or evaluation (nothing has changed yet) and after the
update otherwise (:class:`CtrlC`); :func:`interrupted` then saves what is consistent and says
how to resume in one line.
"""

from __future__ import annotations

import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainers.gigpo import checkpoint
from trainers.gigpo.config import PROG


class Console:
    """Lines to stdout, written above the progress bars while they are shown.

    ``bar`` counts iterations, ``phase`` the current rollout, update or evaluation; both are
    None until :meth:`show_progress` (and without tqdm's bars, lines are plain prints).
    """

    def __init__(self) -> None:
        self.bar: Any = None
        self.phase: Any = None

    def say(self, line: str) -> None:
        """Print one line (through the bar, so that it does not tear it)."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line)
        sys.stdout.flush()

    def show_progress(self, total: int, initial: int, desc: str, num_envs: int) -> None:
        """Open the two bars on stderr: iterations (``initial`` of ``total``) and the phase."""
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=total, initial=initial, desc=desc, unit="it", file=sys.stderr, position=0
        )
        self.phase = tqdm(total=num_envs, leave=False, file=sys.stderr, position=1)

    def iteration_done(self, record: dict[str, Any]) -> None:
        """Advance the iteration bar past ``record``'s iteration."""
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(success=f"{record['rollout/success_rate']:.2f}")

    def update_started(self, steps: int, desc: str) -> None:
        """Point the phase bar at an update of ``steps`` optimizer steps."""
        if self.phase is not None:
            self.phase.reset(total=steps)
            self.phase.set_description(desc)
            self.phase.set_postfix_str("optimizer steps", refresh=False)

    def optimizer_step(self) -> None:
        """One optimizer step of the update done."""
        if self.phase is not None:
            self.phase.update(1)

    def close(self) -> None:
        """Close the bars (the console prints plainly afterwards)."""
        for b in (self.phase, self.bar):
            if b is not None:
                b.close()
        self.bar = self.phase = None


@contextmanager
def peft_deprecation_silenced() -> Iterator[None]:
    """Hide the one warning every LoRA start printed: peft's ``PeftModel.__init__`` (0.21)
    reads ``model.is_gradient_checkpointing`` when it wraps a model, a property transformers 5
    deprecated (FutureWarning, "use is_activation_checkpointing"). It is peft's call, not the
    trainer's, and the user can do nothing about it; every other warning still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training; ``checkpoint`` is the checkpoint it can resume from (None: none
    was written by this run) and ``message`` the one line to show."""

    def __init__(self, message: str, checkpoint: Path | None):
        super().__init__(message)
        self.message = message
        self.checkpoint = checkpoint


class CtrlC:
    """SIGINT while training: stop at once where nothing has changed yet, else at the end of
    the update.

    Rollout, advantage and evaluation change no weights, so a Ctrl-C there abandons the
    iteration (the trainer saves the state from its start). From the first optimizer step until
    the iteration's record and checkpoint are written, the weights and the history disagree, so
    a Ctrl-C there is only noted and the iteration finishes first; a second Ctrl-C stops at
    once, without saving. Installed only in the main thread (the only one signals reach).
    """

    def __init__(self) -> None:
        self.must_finish = False
        self.requested = False
        self._previous: Any = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def restore(self) -> None:
        """Give SIGINT back to the handler it had before :meth:`install`."""
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.must_finish and not self.requested:
            self.requested = True
            return
        raise KeyboardInterrupt


class RolloutProgress:
    """The policy, reporting each generation round (envs still running, tokens) to a bar.

    ``collect`` sees the policy unchanged; every other attribute is the wrapped policy's.
    """

    def __init__(self, policy: Any, bar: Any, num_envs: int, desc: str):
        self.policy, self.bar, self.num_envs = policy, bar, num_envs
        self.rounds = self.tokens = 0
        if bar is not None:
            bar.reset(total=num_envs)
            bar.set_description(desc)

    def generate(self, messages: Any, params: Any, infos: Any = None) -> Any:
        out = self.policy.generate(messages, params, infos)
        self.rounds += 1
        self.tokens += sum(len(g.token_ids or ()) for g in out)
        if self.bar is not None:
            self.bar.n = self.num_envs - len(messages)  # episodes finished before this round
            self.bar.set_postfix(round=self.rounds, running=len(messages), tokens=self.tokens)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


def iteration_line(record: dict[str, Any], iterations: int) -> str:
    """The one line printed per training iteration."""
    t = record
    return (
        f"iteration {t['iteration']}/{iterations}: success {t['rollout/success_rate']:.2f}  "
        f"return {t['rollout/return']:.3f}  invalid {t['rollout/invalid_rate']:.2f}  "
        f"{t['time/tokens_per_s']:,.0f} tok/s | generate {t['time/generate']:.2f}s  "
        f"env {t['time/env']:.2f}s  update {t['time/update']:.2f}s  "
        f"({t['time/iteration']:.2f}s)"
    )


def eval_line(record: dict[str, Any], tasks: int) -> str:
    """The one line printed per evaluation."""
    return (
        f"eval at iteration {record['iteration']}: success {record['eval/success_rate']:.2f} "
        f"on {tasks} held-out tasks  return {record['eval/return']:.3f}  "
        f"({record['time/eval']:.2f}s)"
    )


def summary_lines(history: list[dict[str, Any]], start: int, elapsed: float) -> list[str]:
    """The final summary: what changed over the run (rollout and eval success)."""
    rows = [r for r in history if "rollout/success_rate" in r]
    evals = [r for r in history if "eval/success_rate" in r]
    done = rows[-1]["iteration"] if rows else start
    head = (
        f"finished {done} iteration{'s' if done != 1 else ''} in {_duration(elapsed)}"
        if start == 0
        else f"finished iterations {start + 1}-{done} in {_duration(elapsed)} (resumed at {start})"
    )
    parts = []
    if rows:
        parts.append(
            f"rollout success {rows[0]['rollout/success_rate']:.2f} -> "
            f"{rows[-1]['rollout/success_rate']:.2f}"
        )
    if evals:
        best = max(evals, key=lambda r: r["eval/success_rate"])
        parts.append(
            f"eval success {evals[0]['eval/success_rate']:.2f} -> "
            f"{evals[-1]['eval/success_rate']:.2f} (best {best['eval/success_rate']:.2f} at "
            f"iteration {best['iteration']})"
        )
    return [head + (": " + ", ".join(parts) if parts else "")]


def interrupted(
    consistent: tuple[int, int, dict[str, Any]] | None,
    last_saved: int | None,
    out_dir: Path,
    save: Callable[[int, dict[str, Any], int], Path],
) -> TrainingInterrupted:
    """Save what Ctrl-C left consistent (if anything new) and say how to continue."""
    resume = f"continue with: {PROG} --resume {out_dir}"
    if consistent is None:
        latest = checkpoint.latest_complete(out_dir)
        where = f"the latest checkpoint is {latest}; {resume}" if latest else "no checkpoint"
        return TrainingInterrupted(f"interrupted twice: stopped without saving; {where}", latest)
    done, upto, rng = consistent
    if done == last_saved:
        path = out_dir / f"checkpoint-{done}"
    elif done == 0:
        return TrainingInterrupted(
            "interrupted during the first iteration: nothing to save yet", None
        )
    else:
        path = save(done, rng, upto)
    return TrainingInterrupted(f"interrupted after iteration {done}: saved {path}; {resume}", path)
