"""Finding ALFWorld games: the data root, the splits, and alfworld's own game filter.

Layout (as ``alfworld-download`` leaves it, and as the synthetic generator writes it)::

    $ALFWORLD_DATA/json_2.1.1/<split>/<task_type>-<Obj>-<Mrecep>-<Recep>-<scene>/<trial>/game.tw-pddl

The filter is alfworld's ``AlfredTWEnv.collect_game_files``: skip paths containing ``movable``
or ``Sliced``, skip games whose JSON lacks ``"solvable": true``, keep the chosen task types
(read from the task folder's name, which starts with the task type). Listing a split reads
only file tails and is cached twice: in memory per (root, split), and on disk in a small index
(``$AGENTGYM_CACHE/alfworld``, default ``~/.cache/agentgym/alfworld``) keyed by each file's size and mtime, so that constructing an
env on the 3553-game train split costs a directory scan, not 3553 JSON parses.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

from agentgym.core import describe_action
from agentgym.envs.cache import cache_dir, writable_cache_dir
from agentgym.io import atomic_write_json

__all__ = [
    "TASK_TYPES",
    "SPLITS",
    "SPLIT_ALIASES",
    "DataNotFoundError",
    "default_data_root",
    "resolve_data_root",
    "list_games",
    "present_splits",
    "normalize_task_types",
    "task_type_of",
    "data_status",
]

#: alfworld's task types, by the ids its config uses (``env.task_types: [1, ..., 6]``)
TASK_TYPES: dict[int, str] = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}
#: the splits of json_2.1.1: train, in-distribution eval, out-of-distribution eval, and
#: alfworld's held-out sample of training scenes
SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen", "valid_train")
#: other names accepted for a split (DESIGN.md's generic "valid"/"test", alfworld's own names)
SPLIT_ALIASES: dict[str, str] = {
    "valid": "valid_seen",
    "eval_in_distribution": "valid_seen",
    "test": "valid_unseen",
    "eval_out_of_distribution": "valid_unseen",
}
GAME_FILE = "game.tw-pddl"
DATA_DIR = "json_2.1.1"

_PERSIST_MIN = 1000  # smaller splits scan in well under a second: no index file for them
_SOLVABLE_TAIL = re.compile(rb'"solvable"\s*:\s*(true|false)\s*}\s*$')
_MEMORY: dict[tuple[str, str], list[tuple[str, str]]] = {}
_LOCK = threading.Lock()


class DataNotFoundError(FileNotFoundError):
    """ALFWorld's game files are not where agentgym looked."""


def default_data_root() -> Path:
    """``$ALFWORLD_DATA`` if set, else ``~/.cache/alfworld`` (alfworld-download's default)."""
    env = os.environ.get("ALFWORLD_DATA")
    if env:
        return Path(os.path.expandvars(os.path.expanduser(env)))
    return Path.home() / ".cache" / "alfworld"


def resolve_data_root(data_root: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding ``json_2.1.1`` (``data_root`` may also name ``json_2.1.1`` itself)."""
    root = Path(data_root).expanduser() if data_root is not None else default_data_root()
    if root.name == DATA_DIR and not (root / DATA_DIR).is_dir():
        root = root.parent
    return root


def normalize_split(split: str) -> str:
    """``train`` / ``valid_seen`` / ``valid_unseen`` / ``valid_train``; also ``valid`` -> ``valid_seen`` and
    ``test`` -> ``valid_unseen`` (see :data:`SPLIT_ALIASES`)."""
    name = SPLIT_ALIASES.get(split, split)
    if name not in SPLITS:
        raise ValueError(
            f"unknown ALFWorld split {describe_action(split)!r}; choose one of {SPLITS} "
            f"(aliases: {', '.join(f'{k}->{v}' for k, v in SPLIT_ALIASES.items())})"
        )
    return name


def normalize_task_types(task_types: Iterable[int | str] | None) -> tuple[str, ...]:
    """Task type names from names or alfworld's ids 1..6; None means all six."""
    if task_types is None:
        return tuple(TASK_TYPES.values())
    if isinstance(task_types, (str, int)):
        task_types = [task_types]
    names = []
    for t in task_types:
        if isinstance(t, int) and not isinstance(t, bool) and t in TASK_TYPES:
            names.append(TASK_TYPES[t])
        elif isinstance(t, str) and t in TASK_TYPES.values():
            names.append(t)
        elif isinstance(t, str) and t.isdigit() and int(t) in TASK_TYPES:
            names.append(TASK_TYPES[int(t)])
        else:
            raise ValueError(
                f"unknown ALFWorld task type {t!r}; use ids 1..6 or names {list(TASK_TYPES.values())}"
            )
    if not names:
        raise ValueError("task_types is empty; pass None for all six task types")
    return tuple(dict.fromkeys(names))


def task_type_of(task_id: str) -> str:
    """The task type of a task id ``<split>/<task folder>/<trial>`` (or of any game path)."""
    parts = Path(task_id).parts
    if parts and parts[-1] == GAME_FILE:
        parts = parts[:-1]
    folder = parts[-2] if len(parts) >= 2 else parts[-1]
    for name in sorted(TASK_TYPES.values(), key=len, reverse=True):
        if folder.startswith(name):
            return name
    return folder.split("-", 1)[0]


def _index_file(split_dir: Path) -> Path:
    digest = hashlib.sha1(str(split_dir.resolve()).encode()).hexdigest()[:16]
    return cache_dir("alfworld") / f"index-{digest}.json"


def _is_solvable(path: str) -> bool:
    """alfworld's check (``"solvable": true`` in the game JSON), from the file's tail when the
    key is last (as in every released game file), else from a full parse."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 64))
        m = _SOLVABLE_TAIL.search(f.read())
        if m is not None:
            return m.group(1) == b"true"
        f.seek(0)
        try:
            return json.load(f).get("solvable") is True
        except (ValueError, AttributeError):
            return False


def _scan_split(split_dir: Path) -> list[tuple[str, str]]:
    """(task folder/trial, absolute path) of every candidate game, sorted, filtered."""
    index_path = _index_file(split_dir)
    try:
        old = json.loads(index_path.read_text())
    except (OSError, ValueError):
        old = {}
    new: dict[str, list] = {}
    found = []
    with os.scandir(split_dir) as tasks:
        task_dirs = sorted(e.name for e in tasks if e.is_dir())
    for task in task_dirs:
        if "movable" in task or "Sliced" in task:
            continue
        with os.scandir(split_dir / task) as trials:
            trial_dirs = sorted(e.name for e in trials if e.is_dir())
        for trial in trial_dirs:
            if "movable" in trial or "Sliced" in trial:
                continue
            path = str(split_dir / task / trial / GAME_FILE)
            try:
                st = os.stat(path)
            except OSError:
                continue  # alfworld skips trials without a game file
            rel = f"{task}/{trial}"
            stamp = [st.st_size, st.st_mtime_ns]
            entry = old.get(rel)
            if entry is not None and entry[:2] == stamp:
                solvable = entry[2]
            else:
                solvable = _is_solvable(path)
            new[rel] = stamp + [solvable]
            if solvable:
                found.append((rel, path))
    # the index is only a cache: an unwritable cache folder costs a warning line, not the env
    if new != old and len(new) >= _PERSIST_MIN:
        if writable_cache_dir(index_path.parent, "the ALFWorld game index") is not None:
            try:
                atomic_write_json(index_path, new)
            except OSError:  # e.g. a full disk after the check: the next run scans again
                pass
    return found


def list_games(
    data_root: str | os.PathLike[str] | None,
    split: str,
    task_types: Iterable[int | str] | None = None,
) -> list[tuple[str, str]]:
    """The playable games of a split: ``[(task_id, path)]`` sorted by task id.

    ``task_id`` is ``<split>/<task folder>/<trial>``. Raises :class:`DataNotFoundError` when
    the split's folder does not exist.
    """
    root = resolve_data_root(data_root)
    split = normalize_split(split)
    split_dir = root / DATA_DIR / split
    if not split_dir.is_dir():
        raise DataNotFoundError(str(split_dir))
    key = (str(split_dir.resolve()), split)
    with _LOCK:
        games = _MEMORY.get(key)
        if games is None:
            games = _MEMORY[key] = [
                (f"{split}/{rel}", path) for rel, path in _scan_split(split_dir)
            ]
    wanted = set(normalize_task_types(task_types))
    if len(wanted) == len(TASK_TYPES):
        return list(games)
    return [(tid, p) for tid, p in games if task_type_of(tid) in wanted]


def present_splits(data_root: str | os.PathLike[str] | None) -> list[str]:
    """The splits of :data:`SPLITS` whose folder exists under ``data_root/json_2.1.1``."""
    base = resolve_data_root(data_root) / DATA_DIR
    return [split for split in SPLITS if (base / split).is_dir()]


def data_status(data_root: str | os.PathLike[str] | None = None) -> str:
    """One line: where ALFWorld data was looked for and how many playable games each split has."""
    root = resolve_data_root(data_root)
    if data_root is not None:
        where = str(root)
    elif os.environ.get("ALFWORLD_DATA"):
        where = f"ALFWORLD_DATA={root}"
    else:  # say which variable to set, not only the default folder
        where = f"ALFWORLD_DATA not set, so {root}"
    parts = []
    for split in SPLITS:
        try:
            parts.append(f"{split} {len(list_games(root, split))}")
        except DataNotFoundError:
            parts.append(f"{split} absent")
    return f"{where}: " + ", ".join(parts)
