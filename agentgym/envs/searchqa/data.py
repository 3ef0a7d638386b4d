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
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.envs.searchqa.qa import as_answer_list

__all__ = [
    "DATA_ENV",
    "RETRIEVER_ENV",
    "QADataset",
    "data_status",
    "load_questions",
    "resolve_data_file",
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


def _split_names(split: str) -> tuple[str, ...]:
    return _SPLIT_ALIASES.get(split, (split,))


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
            raise KeyError(
                f"no question {question_id!r} in {self.path} (ids look like {example!r})"
            )
        return row


def resolve_data_file(data: str | os.PathLike[str], split: str | None) -> Path:
    """The question file ``data`` names: itself if a file, else ``<data>/<split>.<ext>``."""
    path = Path(data).expanduser()
    if path.is_file():
        return path.resolve()
    if path.is_dir():
        names = _split_names(split or "test")
        for name in names:
            for suffix in _SUFFIXES:
                candidate = path / f"{name}{suffix}"
                if candidate.is_file():
                    return candidate.resolve()
        raise FileNotFoundError(
            f"no question file for split {split or 'test'!r} in {path}: looked for "
            f"{', '.join(n + '.parquet/.jsonl' for n in names)}; pass data= a parquet or JSONL file"
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
