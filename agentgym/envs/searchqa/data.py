"""Search-R1-style question files: parquet or JSONL, loaded once per process.

Accepted as Search-R1 writes them (``scripts/data_process/nq_search.py`` and
``qa_search_*_merge.py``, over FlashRAG's datasets): one row per question with

==========================  ======================================================================
``question``                the question text (Search-R1 strips it and appends ``?``); if absent, it
                            is read back from ``prompt[0]["content"]`` after ``Question:``
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
    """unique question ids: ``<data_source>/<id>``"""
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


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
        wanted = [
            c
            for c in ("id", "question", "golden_answers", "data_source", "split", "prompt")
            + ("reward_model", "extra_info")
            if c in schema.names
        ]
        if "question" not in wanted and "prompt" not in wanted:
            raise ValueError(
                f"{path} has no 'question' (or 'prompt') column; columns are {schema.names}. "
                "Write it as Search-R1's scripts/data_process/nq_search.py does."
            )
        if "question" in wanted and "prompt" in wanted:
            wanted.remove("prompt")  # prompts are long; the question column says it all
        return pq.read_table(path, columns=wanted).to_pylist()
    rows = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return json.loads(text)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not a JSON record ({exc.msg})") from None
    return rows


def _question_of(row: dict[str, Any]) -> str | None:
    q = row.get("question")
    if isinstance(q, str) and q.strip():
        return q.strip()
    prompt = row.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        content = str(prompt[-1].get("content", ""))
        if "Question:" in content:
            return content.rsplit("Question:", 1)[1].strip()
    return None


def _answers_of(row: dict[str, Any]) -> list[str]:
    if row.get("golden_answers") is not None:
        return as_answer_list(row["golden_answers"])
    target = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    return as_answer_list(target)


def _split_of(row: dict[str, Any]) -> str | None:
    split = row.get("split")
    if split is None and isinstance(row.get("extra_info"), dict):
        split = row["extra_info"].get("split")
    return str(split) if split is not None else None


def _parse(path: Path, split: str | None, file_is_split: bool) -> QADataset:
    rows = _read_rows(path)
    if split is not None and not file_is_split:
        row_splits = [_split_of(r) for r in rows]
        if all(s is None for s in row_splits):
            raise ValueError(
                f"{path} has no split column (split / extra_info.split), so split={split!r} "
                "cannot select rows; pass split=None to use every row, or a folder holding "
                f"{split}.parquet"
            )
        names = set(_split_names(split))
        rows = [r for r, s in zip(rows, row_splits, strict=True) if s in names]
    ids, questions, answers, sources = [], [], [], []
    for row_number, row in enumerate(rows):
        question = _question_of(row)
        if question is None:
            raise ValueError(f"{path}: row {row_number} has no question text")
        source = str(row.get("data_source") or path.stem)
        raw_id = row.get("id")
        if raw_id is None and isinstance(row.get("extra_info"), dict):
            raw_id = row["extra_info"].get("index")
        ids.append(f"{source}/{raw_id if raw_id is not None else row_number}")
        questions.append(question)
        answers.append(tuple(_answers_of(row)))
        sources.append(source)
    if len(set(ids)) < len(ids):  # merged files can repeat ids across sources: add the row
        ids = [f"{qid}@{i}" for i, qid in enumerate(ids)]
    return QADataset(str(path), split, tuple(ids), tuple(questions), tuple(answers), tuple(sources))


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
