"""Search-R1-style question files: parquet or JSONL, loaded once per process.

Accepted as Search-R1 writes them (``scripts/data_process/nq_search.py`` and
``qa_search_*_merge.py``, over FlashRAG's datasets): one row per question with

==========================  ======================================================================
``question``                the question text (Search-R1 strips it and appends ``?``); if absent, it
                            is read back from the prompt's last message, after ``Question:``
``golden_answers``          a string or a list of strings; if absent,
                            ``reward_model.ground_truth.target``
``data_source``             nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle...
                            (default: the file's stem)
``id``                      optional; else ``extra_info.index``; else the row number
``split``                   optional; else ``extra_info.split``: filters rows when ``split=`` is given
==========================  ======================================================================

Other columns (``prompt``, ``ability``, ...) are ignored. ``data`` may name a file or a folder; a
folder is searched for ``<split>.parquet`` / ``<split>.jsonl`` (``split`` defaults to ``test``),
the layout ``nq_search.py`` writes (``train.parquet``, ``test.parquet``).

:func:`load_questions` caches each (file, split) in the process, so 128 envs share one copy.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.core import ResetOptionError
from agentgym.envs.searchqa.qa import as_answer_list

__all__ = [
    "DATA_ENV",
    "RETRIEVER_ENV",
    "QADataset",
    "UnknownSplitError",
    "data_status",
    "load_questions",
    "check_split_name",
    "resolve_data_file",
    "split_files",
]

#: environment variables the real-data id reads when ``data=`` / ``retriever=`` are not given
DATA_ENV = "SEARCHQA_DATA"
RETRIEVER_ENV = "SEARCHQA_RETRIEVER"

_SUFFIXES = (".parquet", ".jsonl", ".json")
# What Search-R1 / FlashRAG call each of our split names, in the order we look for them.
_SPLIT_ALIASES = {
    "train": ("train",),
    "valid": ("valid", "dev", "validation", "val"),
    "test": ("test",),
}


# A split is the stem of a question file directly inside the data folder: one path component.
_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class UnknownSplitError(ResetOptionError, FileNotFoundError):
    """A split that the question data does not hold (or a name that cannot be a split).

    A :class:`~agentgym.core.ResetOptionError` for ``reset(options={"split": ...})`` and a
    ``FileNotFoundError`` for code that expects one from the constructor. The message names the
    splits present and never a path on this machine: reset options may come from a remote client.
    """


def _split_names(split: str) -> tuple[str, ...]:
    return _SPLIT_ALIASES.get(split, (split,))


def split_files(folder: str | os.PathLike[str]) -> dict[str, Path]:
    """Split name -> question file, for the ``<split>.parquet|.jsonl|.json`` files directly in
    ``folder`` (parquet preferred where a stem has several)."""
    found: dict[str, tuple[int, Path]] = {}
    with os.scandir(folder) as entries:
        for e in entries:
            stem, dot, ext = e.name.rpartition(".")
            suffix = dot + ext
            if not dot or suffix not in _SUFFIXES or not _SPLIT_NAME.match(stem):
                continue
            rank = _SUFFIXES.index(suffix)
            if (stem not in found or rank < found[stem][0]) and e.is_file():
                found[stem] = (rank, Path(e.path))
    return {stem: path for stem, (_, path) in sorted(found.items())}


def check_split_name(split: object) -> str:
    """``split`` if it can name a split (text, one file-name component, no ``..``), else
    :class:`UnknownSplitError`; says nothing about which files exist."""
    if not isinstance(split, str) or not _SPLIT_NAME.match(split) or ".." in split:
        shown = repr(split) if isinstance(split, str) else type(split).__name__
        raise UnknownSplitError(
            f"split {shown[:80]} is not a split name: use a name such as 'train' or 'test' "
            "(letters, digits, '_', '-', '.'; no path)"
        )
    return split


@dataclass(frozen=True)
class QADataset:
    """Questions of one file (and split), column-wise; read-only and shared by every env."""

    path: str
    split: str | None
    ids: tuple[str, ...]
    """unique question ids: ``<data_source>/<id>`` (``@<row>`` added where a merged file repeats
    an id)"""
    questions: tuple[str, ...]
    golden_answers: tuple[tuple[str, ...], ...]
    data_sources: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_row_of", {qid: i for i, qid in enumerate(self.ids)})

    def __len__(self) -> int:
        return len(self.ids)

    def index_of(self, question_id: str) -> int:
        """Row of ``question_id``; raises KeyError naming an example id if unknown."""
        row = self._row_of.get(question_id)  # type: ignore[attr-defined]
        if row is None:
            example = self.ids[0] if self.ids else "(none)"
            # the file's name only: reset options (and so this message) may come from a client
            raise KeyError(
                f"no question {str(question_id)[:80]!r} in {Path(self.path).name} "
                f"(ids look like {example!r})"
            )
        return row


def resolve_data_file(data: str | os.PathLike[str], split: str | None) -> Path:
    """The question file ``data`` names: itself if a file, else the folder's file for ``split``.

    In a folder, ``split`` is looked up among the question files the folder holds
    (:func:`split_files`), never joined onto the path: a split such as ``../other/file`` or
    ``/etc/passwd`` is refused with :class:`UnknownSplitError`, as is a split with no file (the
    message lists the splits present, and no path).
    """
    path = Path(data).expanduser()
    if path.is_file():
        return path.resolve()
    if path.is_dir():
        split = check_split_name(split or "test")
        files = split_files(path)
        for name in _split_names(split):
            if name in files:
                return files[name].resolve()
        raise UnknownSplitError(
            f"no question file for split {split!r}: the data folder holds "
            f"{', '.join(map(repr, files)) or 'no .parquet/.jsonl/.json files'}"
        )
    raise FileNotFoundError(f"question file {path} not found; pass data= a parquet or JSONL file")


def _parquet_columns(path: Path) -> dict[str, list[Any] | None]:
    """Column-wise read: pyarrow converts whole columns in C, with no per-row dicts."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    if "question" not in names and "prompt" not in names:
        raise ValueError(
            f"{path} has no 'question' (or 'prompt') column; columns are {names}. "
            "Write it as Search-R1's scripts/data_process/nq_search.py does."
        )
    wanted = ["question" if "question" in names else "prompt"]
    wanted += [c for c in ("golden_answers", "data_source", "id", "split") if c in names]
    if "golden_answers" not in names and "reward_model" in names:
        wanted.append("reward_model")
    if "extra_info" in names:
        wanted.append("extra_info")
    table = pq.read_table(path, columns=wanted)

    def field(column: str, *path_: str) -> list[Any] | None:
        if column not in table.column_names:
            return None
        array = table.column(column)
        try:
            for name in path_:
                array = pc.struct_field(array, name)
        except (KeyError, ValueError, TypeError):  # pyarrow.ArrowInvalid is a ValueError
            return None
        return array.to_pylist()

    return {
        "question": field("question"),
        "prompt": field("prompt"),
        "golden_answers": field("golden_answers"),
        "target": field("reward_model", "ground_truth", "target"),
        "data_source": field("data_source"),
        "id": field("id"),
        "index": field("extra_info", "index"),
        "split": field("split") or field("extra_info", "split"),
    }


def _jsonl_columns(path: Path) -> dict[str, list[Any] | None]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.suffix == ".json" and text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not a JSON record ({exc.msg})") from None
    extra = [r.get("extra_info") if isinstance(r.get("extra_info"), dict) else {} for r in rows]
    truth = [((r.get("reward_model") or {}).get("ground_truth") or {}) for r in rows]
    cols: dict[str, list[Any] | None] = {
        "question": [r.get("question") for r in rows],
        "prompt": [r.get("prompt") for r in rows],
        "golden_answers": [r.get("golden_answers") for r in rows],
        "target": [t.get("target") for t in truth],
        "data_source": [r.get("data_source") for r in rows],
        "id": [r.get("id") for r in rows],
        "index": [e.get("index") for e in extra],
        "split": [r.get("split", e.get("split")) for r, e in zip(rows, extra, strict=True)],
    }
    return {k: (v if any(x is not None for x in v) else None) for k, v in cols.items()}


def _question_from_prompt(prompt: Any) -> str | None:
    """The question at the end of Search-R1's prompt (``... Question: <question>\n``)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        content = str(prompt[-1].get("content", ""))
        if "Question:" in content:
            return content.rsplit("Question:", 1)[1].strip()
    return None


def _answer_tuple(golden: Any) -> tuple[str, ...]:
    if type(golden) is list and all(type(a) is str for a in golden):
        return tuple(golden)  # the common case, from a list column: no conversion needed
    return tuple(as_answer_list(golden))


def _parse(path: Path, split: str | None, file_is_split: bool) -> QADataset:
    cols = _parquet_columns(path) if path.suffix == ".parquet" else _jsonl_columns(path)
    n = len(next(v for v in cols.values() if v is not None)) if any(cols.values()) else 0
    keep = range(n)
    if split is not None and not file_is_split:
        if cols["split"] is None:
            raise ValueError(
                f"{path} has no split column (split / extra_info.split), so split={split!r} "
                "cannot select rows; pass split=None to use every row, or a folder holding "
                f"{split}.parquet"
            )
        names = set(_split_names(split))
        keep = [i for i, s in enumerate(cols["split"]) if s is not None and str(s) in names]

    def column(name: str) -> list[Any]:
        values = cols[name]
        return [None] * len(keep) if values is None else [values[i] for i in keep]

    questions = column("question")
    if any(q is None or not str(q).strip() for q in questions):
        prompts = column("prompt")
        questions = [
            q if q is not None and str(q).strip() else _question_from_prompt(p)
            for q, p in zip(questions, prompts, strict=True)
        ]
    for row, q in zip(keep, questions, strict=True):
        if q is None:
            raise ValueError(f"{path}: row {row} has no question text (question or prompt)")
    golden = column("golden_answers") if cols["golden_answers"] is not None else column("target")
    default_source = path.stem
    sources = [str(s) if s else default_source for s in column("data_source")]
    raw_ids = [
        i if i is not None else (x if x is not None else row)
        for i, x, row in zip(column("id"), column("index"), keep, strict=True)
    ]
    ids = [f"{s}/{i}" for s, i in zip(sources, raw_ids, strict=True)]
    if len(set(ids)) < len(ids):  # merged files can repeat ids across sources: add the row
        ids = [f"{qid}@{row}" for qid, row in zip(ids, keep, strict=True)]
    return QADataset(
        path=str(path),
        split=split,
        ids=tuple(ids),
        questions=tuple(str(q).strip() for q in questions),
        golden_answers=tuple(map(_answer_tuple, golden)),
        data_sources=tuple(sources),
    )


_CACHE: dict[tuple[str, int, str | None], QADataset] = {}
_LOCK = threading.Lock()


def load_questions(data: str | os.PathLike[str], split: str | None = None) -> QADataset:
    """The questions of ``data`` (a file or a folder, see the module docstring) for ``split``.

    Cached per process by (file, modification time, split): every env of a process shares one
    read-only copy. Raises FileNotFoundError if there is no such file, ValueError if the file is
    not in Search-R1's format (the message says what is missing).
    """
    if split is not None:
        check_split_name(split)
    path = resolve_data_file(data, split)
    file_is_split = Path(data).expanduser().is_dir()
    key = (str(path), path.stat().st_mtime_ns, None if file_is_split else split)
    with _LOCK:
        ds = _CACHE.get(key)
        if ds is None:
            ds = _CACHE[key] = _parse(path, split, file_is_split)
    return ds


def data_status() -> str:
    """One line on what ``AgentGym/SearchQA-v0`` finds in ``$SEARCHQA_DATA`` / ``$SEARCHQA_RETRIEVER``."""
    data, retriever = os.environ.get(DATA_ENV), os.environ.get(RETRIEVER_ENV)
    if not data and not retriever:
        return (
            f"no data: set {DATA_ENV} (Search-R1 parquet/JSONL) and {RETRIEVER_ENV} (index dir or "
            "http://host:port/retrieve); AgentGym/SearchQA-Synthetic-v0 needs none"
        )
    parts = []
    if data:
        try:
            path = resolve_data_file(data, None)
            if path.suffix == ".parquet":
                import pyarrow.parquet as pq

                rows = f"{pq.ParquetFile(path).metadata.num_rows} questions"
            else:
                with open(path, "rb") as f:
                    rows = f"{sum(1 for line in f if line.strip())} questions"
            parts.append(f"{DATA_ENV}={path} ({rows})")
        except (OSError, ValueError) as exc:
            parts.append(f"{DATA_ENV}={data} unusable ({exc})")
    else:
        parts.append(f"{DATA_ENV} not set")
    if not retriever:
        parts.append(f"{RETRIEVER_ENV} not set")
    elif retriever.startswith(("http://", "https://")):
        parts.append(f"{RETRIEVER_ENV}={retriever} (server, not contacted)")
    elif Path(retriever).expanduser().is_dir():
        parts.append(f"{RETRIEVER_ENV}={retriever} (index dir)")
    else:
        parts.append(f"{RETRIEVER_ENV}={retriever} missing")
    return "; ".join(parts)
