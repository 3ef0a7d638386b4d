"""Checkpoints that a kill cannot half-write, and finding the one to resume from.

A checkpoint is a folder ``<run>/checkpoint-N`` (N: iterations done) holding the model (HF
format; LoRA: the adapter, plus ``base/`` for the tiny model), the tokenizer, ``trainer_state.pt``
(optimizer, RNG states, config, metric history) and ``checkpoint.json``, a manifest of every
file and its size.

Atomicity: everything is written into a hidden temporary folder beside it
(``.checkpoint-N.partial-<pid>``), flushed to disk, then renamed to ``checkpoint-N``. A kill
during a save leaves only the hidden folder (tidied when the run resumes), so a folder named
``checkpoint-N`` is complete. Replacing an existing ``checkpoint-N`` (resuming from an earlier
one rewrites later ones) moves the old folder aside first and deletes it only after the new one
is in place.

Completeness is still checked on resume (:func:`checkpoint_problem`), because folders can be
copied half-way or have files deleted by hand: every file of the manifest must be there with its
size, and a checkpoint without a manifest (written before manifests existed) must at least hold
its trainer state, model weights and tokenizer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "checkpoint.json"
CHECKPOINT_PREFIX = "checkpoint-"
_PARTIAL_MARK = ".partial-"
_OLD_MARK = ".old-"
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")

#: Files any checkpoint needs (one name of each group), for folders without a manifest.
_REQUIRED = (
    (STATE_FILE,),
    ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
     "adapter_model.safetensors", "adapter_model.bin"),
    ("tokenizer.json", "tokenizer.model", "vocab.json"),
)  # fmt: skip


class CheckpointError(ValueError):
    """A checkpoint or run folder that cannot be resumed from; the message says what to do."""


def checkpoint_iteration(path: Path) -> int | None:
    """N for a folder named ``checkpoint-N``, else None."""
    match = _CHECKPOINT_NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers draws a progress bar per save and load: noise for a 1-second checkpoint."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


def _fsync_tree(folder: Path) -> None:
    """Flush every file (and the folder entries) to disk, so the rename publishes whole files
    even after a power cut, not only after a process kill."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    path: Path,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    config_dict: dict[str, Any],
    iteration: int,
    history: list[dict],
    rng_state: dict[str, Any],
    *,
    save_base: bool = False,
) -> Path:
    """Write a complete checkpoint to ``path`` atomically; returns ``path``.

    Args:
        model: a ``transformers`` model or ``peft`` model (``save_pretrained``).
        optimizer: its ``state_dict()`` is saved.
        config_dict: the trainer config (``Config.to_dict()``).
        iteration: the next iteration to run (= iterations done).
        history: the metric records so far (what ``metrics.jsonl`` holds at this point).
        rng_state: ``{"torch_rng": ..., "numpy_rng": ...}`` to restore on resume.
        save_base: also save the LoRA base model under ``base/`` (the tiny model, which exists
            nowhere else).
    """
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.parent / f".{path.name}{_PARTIAL_MARK}{os.getpid()}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    with quiet_transformers():
        model.save_pretrained(partial)
        if save_base:
            model.get_base_model().save_pretrained(partial / "base")
        tokenizer.save_pretrained(partial)
    torch.save(
        {
            "iteration": iteration,
            "optimizer": optimizer.state_dict(),
            "config": config_dict,
            "history": history,
            **rng_state,
        },
        partial / STATE_FILE,
    )
    (partial / "trainer_config.json").write_text(json.dumps(config_dict, indent=2))
    files = {str(p.relative_to(partial)): p.stat().st_size for p in sorted(partial.rglob("*"))}
    files = {name: size for name, size in files.items() if (partial / name).is_file()}
    (partial / MANIFEST_FILE).write_text(
        json.dumps({"iteration": iteration, "files": files}, indent=1)
    )
    _fsync_tree(partial)

    old = None
    if path.exists():  # never overwritten in place: moved aside until the new one is published
        old = path.parent / f".{path.name}{_OLD_MARK}{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
    os.replace(partial, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint (a short phrase), or None if it is one."""
    path = Path(path)
    if not path.is_dir():
        return "not a folder"
    manifest = path / MANIFEST_FILE
    if manifest.is_file():
        try:
            files = json.loads(manifest.read_text())["files"]
        except (ValueError, KeyError):
            return f"{MANIFEST_FILE} is unreadable"
        for name, size in files.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if file.stat().st_size != size:
                return f"{name} is truncated ({file.stat().st_size} of {size} bytes)"
        return None
    for names in _REQUIRED:  # a checkpoint written before manifests existed
        if not any((path / n).is_file() for n in names):
            return f"{names[0]} is missing"
    for file in [path / STATE_FILE, *sorted(path.glob("*.safetensors"))]:
        if _cut_short(file):
            return f"{file.name} is truncated"
    return None


def _cut_short(file: Path) -> bool:
    """Whether a torch zip archive or a safetensors file ends before its own index says it
    should (what a kill during the write leaves), read from its header or trailer only."""
    if file.suffix == ".safetensors":
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return True
            length = int.from_bytes(head, "little")
            if 8 + length > size:
                return True
            try:
                header = json.loads(f.read(length))
            except ValueError:
                return True
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        return 8 + length + max(ends, default=0) > size
    return not zipfile.is_zipfile(file)  # torch.save writes a zip; its index is at the end


def checkpoints(run_dir: Path) -> list[Path]:
    """The ``checkpoint-N`` folders of ``run_dir``, complete or not, in order of N."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir() if p.is_dir() and checkpoint_iteration(p) is not None]
    return sorted(found, key=lambda p: checkpoint_iteration(p) or 0)


def latest_complete(run_dir: Path, below: int | None = None) -> Path | None:
    """The complete checkpoint of ``run_dir`` with the most iterations (fewer than ``below`` if
    given), or None."""
    for path in reversed(checkpoints(run_dir)):
        n = checkpoint_iteration(path)
        if (below is None or (n is not None and n < below)) and checkpoint_problem(path) is None:
            return path
    return None


def resolve_resume(target: str | Path) -> Path:
    """The checkpoint folder to resume from, for ``--resume target``.

    ``target`` is a checkpoint folder (it must be complete) or a run folder (its latest complete
    checkpoint). Raises :class:`CheckpointError` with a one-line message that says what to pass
    instead.
    """
    target = Path(target)
    if not target.exists():
        raise CheckpointError(f"--resume {target}: no such checkpoint or run folder")
    is_checkpoint = (
        checkpoint_iteration(target) is not None
        or (target / STATE_FILE).exists()
        or (target / MANIFEST_FILE).exists()
    )
    if is_checkpoint:
        recover_interrupted_saves(target.parent)
        problem = checkpoint_problem(target)
        if problem is None:
            return target
        n = checkpoint_iteration(target)
        latest = latest_complete(target.parent, below=n)
        hint = (
            f"the latest complete checkpoint is {latest}: --resume {latest}"
            if latest is not None
            else "no complete checkpoint precedes it; start again with --overwrite"
        )
        raise CheckpointError(f"--resume {target}: incomplete checkpoint ({problem}); {hint}")
    recover_interrupted_saves(target)
    latest = latest_complete(target)
    if latest is None:
        found = checkpoints(target)
        detail = f"{len(found)} incomplete" if found else "none"
        raise CheckpointError(
            f"--resume {target}: no complete checkpoint in this folder ({detail}); "
            f"start the run again with --out-dir {target} --overwrite"
        )
    return latest


def recover_interrupted_saves(run_dir: Path) -> int:
    """Tidy what killed saves left in ``run_dir``; returns how many folders were tidied.

    A hidden folder whose ``checkpoint-N`` is missing and which is itself complete (a kill
    between the two renames of a replacement) is renamed into place, the newer (partial) one
    first; every other hidden partial or set-aside folder is deleted.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return 0
    leftovers = [
        p
        for p in run_dir.iterdir()
        if p.is_dir()
        and p.name.startswith(f".{CHECKPOINT_PREFIX}")
        and (_PARTIAL_MARK in p.name or _OLD_MARK in p.name)
    ]
    leftovers.sort(key=lambda p: _OLD_MARK in p.name)  # partial (newer) before set-aside (older)
    for p in leftovers:
        target = run_dir / p.name[1:].split(_PARTIAL_MARK)[0].split(_OLD_MARK)[0]
        published_whole = (p / MANIFEST_FILE).is_file() and checkpoint_problem(p) is None
        if not target.exists() and published_whole:
            os.replace(p, target)
        else:
            shutil.rmtree(p, ignore_errors=True)
    return len(leftovers)


def remove_run(run_dir: Path) -> None:
    """Delete what a run wrote into ``run_dir`` (metrics, events, checkpoints, curve, leftovers
    of killed saves); other files stay."""
    from trainers.gigpo.config import RUN_FILES

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    recover_interrupted_saves(run_dir)
    for path in checkpoints(run_dir) + [run_dir / name for name in RUN_FILES]:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state saved with ``checkpoint`` (optimizer, RNG, config, history)."""
    import torch

    return torch.load(Path(checkpoint) / STATE_FILE, weights_only=False)


def read_config(checkpoint: Path) -> dict[str, Any]:
    """The config a checkpoint was saved with (from ``trainer_config.json``; cheap to read)."""
    return json.loads((Path(checkpoint) / "trainer_config.json").read_text())
