"""Checkpoints that a kill cannot half-write, and finding the one to resume from.

A checkpoint is a folder ``<run>/checkpoint-N`` (N: iterations done) holding the model (HF
format; LoRA: the adapter, plus ``base/`` for the tiny model), the tokenizer, ``trainer_state.pt``
(optimizer, RNG states, config, metric history: tensors and plain data only, loaded with
``torch.load(weights_only=True)``, so that a crafted file cannot run code on resume) and
``checkpoint.json``, a manifest of every file with its size and SHA-256.

Atomicity: everything is written into a hidden temporary folder beside it
(``.checkpoint-N.partial-<pid>``), flushed to disk, then renamed to ``checkpoint-N``. A kill
during a save leaves only the hidden folder (tidied when the run resumes), so a folder named
``checkpoint-N`` is complete. Replacing an existing ``checkpoint-N`` (resuming from an earlier
one rewrites later ones) moves the old folder aside first and deletes it only after the new one
is in place.

A save that fails (a full disk, a quota) removes its hidden folder and raises
:class:`CheckpointSaveError` in one line; the earlier checkpoints are untouched.

Completeness and integrity are still checked on resume (:func:`checkpoint_problem`), because
folders can be copied half-way, have files deleted by hand, or rot on disk: every file of the
manifest must be there with its size and checksum, and a checkpoint without checksums (written
before they existed) must at least hold its trainer state, model weights and tokenizer, none cut
short. Resuming a run folder falls back past a damaged checkpoint to the latest one that
verifies, saying what it skipped.

Trust: a checkpoint folder is data, trusted no more than its weights (the manifest guards against
damage, not against someone who rewrites it). Pickles load with ``weights_only=True`` (a refusal
is one line, :func:`unsafe_pickle_error`); the tokenizer, chat template included, is never taken
from the folder (a template is code that runs at every prompt: a loop of 10^10 steps hangs the
run), and a saved template that differs from the trusted one is refused before anything renders
(:func:`check_chat_templates`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentgym.io import replace_dir

STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "checkpoint.json"
CHECKPOINT_PREFIX = "checkpoint-"
_PARTIAL_MARK = ".partial-"
_OLD_MARK = ".old-"
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")

#: What a run writes into its folder besides its checkpoints (and ``overwrite`` removes).
RUN_FILES = ("metrics.jsonl", "metrics.jsonl.tmp", "tb", "curve.png")

#: Files any checkpoint needs (one name of each group), for folders without a manifest.
_REQUIRED = (
    (STATE_FILE,),
    ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
     "adapter_model.safetensors", "adapter_model.bin"),
    ("tokenizer.json", "tokenizer.model", "vocab.json"),
)  # fmt: skip


class CheckpointError(ValueError):
    """A checkpoint or run folder that cannot be resumed from; the message says what to do."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (e.g. the disk is full); the message is one line saying
    what happened and what to do. The partial save is removed; earlier checkpoints are intact."""


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
        rng_state: ``{"torch_rng": ..., "numpy_rng": ..., "cuda_rng": ...}`` to restore on
            resume (numpy's state tuple is stored as a tensor and numbers, see
            :func:`load_state`).
        save_base: also save the LoRA base model under ``base/`` (the tiny model, which exists
            nowhere else).

    Raises:
        CheckpointSaveError: the checkpoint could not be written (the disk is full...): the
            partial folder is removed and earlier checkpoints are untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.parent / f".{path.name}{_PARTIAL_MARK}{os.getpid()}"
    try:
        _write_checkpoint(
            partial, model, tokenizer, optimizer, config_dict, iteration, history, rng_state,
            save_base,
        )  # fmt: skip
    except BaseException as err:
        # Each writer has its own error type (safetensors, torch's zip writer, tokenizers):
        # whatever it is, this save failed. Said before the cleanup frees the space it took.
        message = _save_failure(path, err) if isinstance(err, Exception) else None
        # Never leave a half-written folder holding the space a full disk needs back.
        shutil.rmtree(partial, ignore_errors=True)
        if message is not None:
            raise CheckpointSaveError(message) from err
        raise  # Ctrl-C: the trainer says where things stand

    # never overwritten in place: an existing one is moved aside, under the name that
    # recover_interrupted_saves knows, until the new one is published
    replace_dir(partial, path, aside=path.parent / f".{path.name}{_OLD_MARK}{os.getpid()}")
    return path


def _write_checkpoint(
    partial: Path,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    config_dict: dict[str, Any],
    iteration: int,
    history: list[dict],
    rng_state: dict[str, Any],
    save_base: bool,
) -> None:
    """Everything of a checkpoint into the hidden folder ``partial``, manifest last, flushed."""
    import torch

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
            **_plain_rng(rng_state),
        },
        partial / STATE_FILE,
    )
    (partial / "trainer_config.json").write_text(json.dumps(config_dict, indent=2))
    # Checksums of the bytes just written (still in the page cache: cheap to read back), so a
    # resume can tell a flipped byte from the checkpoint that was saved.
    files = {
        str(p.relative_to(partial)): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(partial.rglob("*"))
        if p.is_file()
    }
    (partial / MANIFEST_FILE).write_text(
        json.dumps({"iteration": iteration, "files": files}, indent=1)
    )
    _fsync_tree(partial)


def _save_failure(path: Path, err: BaseException) -> str:
    """The one line a failed save prints: what went wrong, and that nothing else was harmed."""
    code = getattr(err, "errno", None)
    if code is None:  # safetensors and torch put the OS error in their message only
        found = re.search(r"os error (\d+)|errno:? ?(\d+)", str(err), re.IGNORECASE)
        code = int(found.group(1) or found.group(2)) if found else None
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    if code in (errno.ENOSPC, errno.EDQUOT) or (
        code is None and free is not None and free < 1 << 20
    ):
        reason = f"no space left on the device holding {path.parent}"
    elif code == errno.EFBIG:
        reason = "a file grew past the size limit of this process or file system"
    elif isinstance(err, OSError) and err.strerror:
        reason = err.strerror
    else:  # torch's zip writer says only "enforce fail at inline_container.cc"
        text = str(err).strip()
        reason = f"{type(err).__name__}: {text.splitlines()[0][:200] if text else 'write failed'}"
    earlier = [c for c in checkpoints(path.parent) if c.name != path.name]
    if earlier:
        after = (
            f"the earlier checkpoints are intact: free some space (or pass another --out-dir), "
            f"then --resume {path.parent}"
        )
    else:
        after = "free some space (or pass another --out-dir) and start the run again"
    return f"could not save {path} ({reason}); the partial save was removed; {after}"


def _sha256(file: Path) -> str:
    with file.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


#: SHA-256 of files already hashed in this process, keyed by (path, size, mtime): resolving a
#: resume checks a checkpoint more than once (command line, validation, load), and a 1.5B
#: model's weights take seconds to hash.
_DIGESTS: dict[tuple[str, int, int], str] = {}


def _cached_sha256(file: Path) -> str:
    stat = file.stat()
    key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = _sha256(file)
    return _DIGESTS[key]


def _plain_rng(rng_state: dict[str, Any]) -> dict[str, Any]:
    """The RNG states as tensors and numbers (numpy's state tuple holds an ndarray, which
    ``torch.load(weights_only=True)`` refuses)."""
    import torch

    out = dict(rng_state)
    numpy_rng = out.get("numpy_rng")
    if isinstance(numpy_rng, tuple):
        name, keys, pos, has_gauss, cached = numpy_rng
        out["numpy_rng"] = {
            "bit_generator": str(name),
            "keys": torch.as_tensor(keys.astype("int64")),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    return out


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete, intact checkpoint (a short phrase), or None if it is one.

    With a manifest: every file listed is there with its size and, where the manifest records
    one, its SHA-256 (hashes are checked last, after every cheap check passed). Without one (a
    checkpoint from before manifests): the trainer state, weights and tokenizer are there and
    neither the state nor the weights are cut short.
    """
    path = Path(path)
    if not path.is_dir():
        return "not a folder"
    manifest = path / MANIFEST_FILE
    if manifest.is_file():
        try:
            files = json.loads(manifest.read_text())["files"]
            expected = {
                name: (entry, None) if isinstance(entry, int) else (entry["size"], entry["sha256"])
                for name, entry in files.items()
            }
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{MANIFEST_FILE} is unreadable"
        for name, (size, _) in expected.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if file.stat().st_size != size:
                return f"{name} is truncated ({file.stat().st_size} of {size} bytes)"
        for name, (_, digest) in expected.items():
            if digest is not None and _cached_sha256(path / name) != digest:
                return f"{name} does not match its checksum (corrupted on disk)"
        if any(digest is not None for _, digest in expected.values()):
            return None
    else:
        for names in _REQUIRED:  # a checkpoint written before manifests existed
            if not any((path / n).is_file() for n in names):
                return f"{names[0]} is missing"
    # No checksums to go by: at least the indexes the loaders read first must be whole.
    for file in [path / STATE_FILE, *sorted(path.glob("*.safetensors"))]:
        if file.is_file() and _cut_short(file):
            return f"{file.name} is truncated or damaged"
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
                ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
            except (ValueError, KeyError, TypeError, AttributeError, IndexError):
                return True  # a damaged header
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


def resolve_resume(target: str | Path, skipped: list[str] | None = None) -> Path:
    """The checkpoint folder to resume from, for ``--resume target``.

    ``target`` is a checkpoint folder (it must be complete and intact) or a run folder (its
    latest checkpoint that is: damaged ones are passed over, and a line naming each, with why,
    is appended to ``skipped``). Raises :class:`CheckpointError` with a one-line message that
    says what to pass instead.
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
        raise CheckpointError(
            f"--resume {target}: incomplete or damaged checkpoint ({problem}); {hint}"
        )
    recover_interrupted_saves(target)
    passed_over = []
    for path in reversed(checkpoints(target)):
        problem = checkpoint_problem(path)
        if problem is None:
            if passed_over and skipped is not None:
                skipped.append(
                    f"--resume {target}: skipped {'; '.join(passed_over)}; resuming from "
                    f"{path.name}"
                )
            return path
        passed_over.append(f"{path.name} ({problem})")
    detail = "; ".join(passed_over) if passed_over else "none"
    raise CheckpointError(
        f"--resume {target}: no complete checkpoint in this folder ({detail}); "
        f"start the run again with --out-dir {target} --overwrite"
    )


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
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    recover_interrupted_saves(run_dir)
    for path in checkpoints(run_dir) + [run_dir / name for name in RUN_FILES]:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


#: numpy's RNG state as older checkpoints stored it (an ndarray): data, not code, so allowed.
_NUMPY_ARRAY_GLOBALS = (
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
    "numpy.ndarray", "numpy.dtype", "numpy.dtypes.UInt32DType",
)  # fmt: skip


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state saved with ``checkpoint`` (optimizer, RNG, config, history).

    Loaded with ``torch.load(weights_only=True)``: tensors, numbers, strings, lists and dicts
    only. A file that asks the unpickler for anything else (a crafted ``__reduce__`` calling
    ``os.system``) is refused before any of it runs. Raises :class:`CheckpointError` (one line)
    for a state that cannot be loaded.
    """
    import pickle

    import torch

    file = Path(checkpoint) / STATE_FILE
    try:
        try:
            state = torch.load(file, weights_only=True)
        except pickle.UnpicklingError:
            unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(file))
            if not unsafe or not unsafe <= set(_NUMPY_ARRAY_GLOBALS):
                raise
            import numpy as np

            core = getattr(np, "_core", None) or np.core  # numpy 2 renamed it
            allowed = [np.ndarray, np.dtype, np.dtypes.UInt32DType, core.multiarray._reconstruct]
            with torch.serialization.safe_globals(allowed):
                state = torch.load(file, weights_only=True)
    except pickle.UnpicklingError as err:
        raise unsafe_pickle_error(checkpoint, STATE_FILE, err) from None
    except (OSError, RuntimeError, ValueError, EOFError) as err:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"--resume {checkpoint}: {STATE_FILE} cannot be read ({first}); resume from an "
            "earlier checkpoint"
        ) from None
    numpy_rng = state.get("numpy_rng")
    if isinstance(numpy_rng, dict):  # stored as plain data by save_checkpoint
        state["numpy_rng"] = (
            numpy_rng["bit_generator"],
            numpy_rng["keys"].numpy().astype("uint32"),
            numpy_rng["pos"],
            numpy_rng["has_gauss"],
            numpy_rng["cached_gaussian"],
        )
    return state


def read_config(checkpoint: Path) -> dict[str, Any]:
    """The config a checkpoint was saved with (from ``trainer_config.json``; cheap to read)."""
    try:
        return json.loads((Path(checkpoint) / "trainer_config.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"--resume {checkpoint}: trainer_config.json cannot be read ({err}); resume from "
            "another checkpoint"
        ) from None


#: How torch's ``weights_only`` unpickler names the global it refused (its own message, and the
#: one transformers passes on from it).
_REFUSED_GLOBAL = re.compile(r"unsupported (?:global: )?GLOBAL ([\w.]+)", re.IGNORECASE)


def unsafe_pickle_error(checkpoint: Path, what: str, err: BaseException) -> CheckpointError:
    """The one-line refusal of a pickle in ``checkpoint`` (``what``: the file, or a phrase such
    as "its model weights") that ``torch.load(weights_only=True)`` would not load."""
    found = _REFUSED_GLOBAL.search(str(err))
    detail = f" ({found.group(1).rstrip('.')})" if found else ""
    return CheckpointError(
        f"--resume {checkpoint}: refused to load {what}: it holds objects other than tensors "
        f"and plain data{detail}, which could run code; resume only from checkpoints this "
        "trainer wrote"
    )


#: Where ``transformers`` reads chat templates from in a tokenizer folder (the single-file
#: format, the named-templates folder, a processor's file, and the older config key).
TEMPLATE_FILE, TEMPLATE_DIR = "chat_template.jinja", "additional_chat_templates"
_TEMPLATE_JSONS = ("tokenizer_config.json", "chat_template.json")


def saved_chat_templates(folder: Path) -> list[tuple[str, str, str]]:
    """The chat templates a tokenizer folder holds: ``(name, text, file)`` for each, wherever
    transformers could read one from (``"default"``: the main template).

    Read as text only, never parsed as Jinja or rendered. Raises :class:`CheckpointError` for a
    file holding templates that cannot be read (it cannot be compared either).
    """
    folder = Path(folder)
    found: list[tuple[str, str, str]] = []
    for name in _TEMPLATE_JSONS:
        file = folder / name
        if not file.is_file():
            continue
        try:
            entry = json.loads(file.read_text()).get("chat_template")
        except (OSError, ValueError, AttributeError) as err:
            raise CheckpointError(
                f"--resume {folder}: {name} cannot be read ({type(err).__name__}); resume from "
                "an earlier checkpoint"
            ) from None
        if isinstance(entry, list):  # [{"name": ..., "template": ...}, ...]
            found += [
                (str(item.get("name")), str(item.get("template")), name)
                if isinstance(item, dict)
                else ("?", str(item), name)
                for item in entry
            ]
        elif entry is not None:
            found.append(("default", str(entry), name))
    named = (
        sorted((folder / TEMPLATE_DIR).glob("*.jinja")) if (folder / TEMPLATE_DIR).is_dir() else []
    )
    for file in [*named, folder / TEMPLATE_FILE]:
        if file.is_file():
            name = "default" if file.name == TEMPLATE_FILE else file.stem
            found.append((name, file.read_text(errors="replace"), str(file.relative_to(folder))))
    return found


def check_chat_templates(
    checkpoint: Path, trusted: str | dict[str, str] | None, source: str
) -> None:
    """Refuse ``checkpoint`` (:class:`CheckpointError`, one line) if any chat template saved in
    it differs from ``trusted``, the template of ``source`` (the base model) that the resumed
    run uses. Only compares text: nothing is rendered, so a hostile template costs nothing."""
    expected = trusted if isinstance(trusted, dict) else {"default": trusted}
    saved = saved_chat_templates(checkpoint)
    differ = sorted({file for name, text, file in saved if text != expected.get(name)})
    if differ:
        raise CheckpointError(
            f"--resume {checkpoint}: refused: its chat template ({', '.join(differ)}) differs "
            f"from {source}'s, which the run was trained with; a template is code that runs at "
            "every prompt, so a checkpoint's own is never used; resume only from checkpoints "
            "this trainer wrote"
        )
