"""Corpora in Search-R1's format, and a row-addressable document store on disk.

The corpus format is Search-R1's wiki-18 (``wiki-18.jsonl``): one JSON object per line,
``{"id": "0", "contents": "\\"Title\\"\\nPassage text ..."}``. The first line of ``contents`` is the
title, kept with its quotes; the rest is the passage text (:func:`split_title`).

:class:`DocStore` holds the documents of an index so that any row can be read without loading the
corpus: JSONL shard files plus one int64 offsets array that is memory-mapped, so processes that
open the same store share the operating system's page cache instead of each holding a copy.
:class:`DocStoreWriter` writes it shard by shard, each shard atomically, so a killed build resumes
from its last finished shard.

Layout of a store directory::

    docs-00000.jsonl ...    the records, one JSON object per line, in row order
    docs-00000.offsets.npy  while building: that shard's line starts, int64 (rows + 1,)
    offsets.npy             when finished: all shards' line starts, int64 (num_docs + num_shards,)
    docstore.json           written last: {"version", "num_docs", "shards": [{file, num_docs}]}
"""

from __future__ import annotations

import gzip
import json
import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, overload

import numpy as np

from agentgym.io import atomic_save_npy, atomic_write_bytes, atomic_write_text

__all__ = [
    "CorpusFormatError",
    "DocStore",
    "DocStoreWriter",
    "count_records",
    "iter_corpus",
    "split_title",
]

DOCSTORE_VERSION = 1
MANIFEST = "docstore.json"
OFFSETS = "offsets.npy"


class CorpusFormatError(ValueError):
    """A corpus line that is not a JSON object with the required fields."""


# ------------------------------------------------------------------------------------------------
# Reading a corpus


def _open_binary(path: Path) -> BinaryIO:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")  # noqa: SIM115 - closed by the caller's `with`


def _iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line) for every non-blank line of a plain or gzipped file.

    Bytes, not text: ``json.loads`` reads UTF-8 bytes itself, and skipping or counting lines
    then costs no decoding (a resumed build skips millions of them)."""
    with _open_binary(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.isspace() and line:
                yield lineno, line


def iter_corpus(
    path: str | os.PathLike[str],
    *,
    start: int = 0,
    required: Sequence[str] = ("id", "contents"),
) -> Iterator[dict[str, Any]]:
    """Stream the records of a JSONL corpus (plain or ``.gz``), one dict per non-blank line.

    The file is read line by line, never whole. ``start`` skips that many records without parsing
    them (how a resumed build seeks to its first unfinished shard). Every record must be a JSON
    object holding the ``required`` fields (Search-R1's ``id`` and ``contents`` by default; pass
    ``()`` to accept any object); otherwise :class:`CorpusFormatError` names the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus {path} not found; pass a JSONL file with one "
            '{"id": ..., "contents": "\\"Title\\"\\ntext"} per line (plain or .gz)'
        )
    for i, (lineno, line) in enumerate(_iter_lines(path)):
        if i < start:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusFormatError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        except UnicodeDecodeError:
            raise CorpusFormatError(f"{path}:{lineno}: not UTF-8 text") from None
        if not isinstance(record, dict):
            raise CorpusFormatError(
                f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}"
            )
        missing = [k for k in required if k not in record]
        if missing:
            raise CorpusFormatError(
                f"{path}:{lineno}: record lacks {', '.join(map(repr, missing))} "
                f"(has {', '.join(map(repr, record)) or 'no fields'})"
            )
        yield record


def count_records(path: str | os.PathLike[str]) -> int:
    """Number of records (non-blank lines) in a corpus, without parsing them."""
    return sum(1 for _ in _iter_lines(Path(path)))


def split_title(contents: str) -> tuple[str, str]:
    """Split a wiki-18 ``contents`` string into ``(title, text)`` exactly as Search-R1 does.

    The title is everything before the first newline, quotes kept (``'"Hamlet"'``); the text is
    everything after it (further newlines kept), or ``""`` when there is no newline. Search-R1
    shows a hit to the policy as ``f"Doc {i}(Title: {title}) {text}"``.
    """
    title, _, text = contents.partition("\n")
    return title, text


# ------------------------------------------------------------------------------------------------
# Writing a doc store


def _shard_name(index: int) -> str:
    return f"docs-{index:05d}.jsonl"


class DocStoreWriter:
    """Write a :class:`DocStore` shard by shard; resume a killed write where it stopped.

    ``DocStoreWriter(dir)`` opens (or creates) the directory and finds the shards already
    finished there: ``num_docs`` records in ``num_shards`` shards. A shard is finished when its
    offsets file exists; both of its files are written atomically, the JSONL first, so a kill at
    any point leaves only whole shards (and stray temporary files, ignored and overwritten).

    Call :meth:`write_shard` once per shard, in row order, then :meth:`close`, which writes the
    combined offsets and the manifest (the mark of a finished store) and returns the store.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if (self.directory / MANIFEST).is_file():
            raise FileExistsError(
                f"{self.directory} already holds a finished doc store; open it with "
                "DocStore(dir), or delete the directory to write a new one"
            )
        self.shard_sizes: list[int] = []
        # shards are contiguous from 0: anything after the first gap is a leftover and is redone
        while (self.directory / _offsets_name(len(self.shard_sizes))).is_file():
            offsets = np.load(self.directory / _offsets_name(len(self.shard_sizes)))
            self.shard_sizes.append(len(offsets) - 1)

    @property
    def num_shards(self) -> int:
        """Shards finished so far."""
        return len(self.shard_sizes)

    @property
    def num_docs(self) -> int:
        """Records in the finished shards."""
        return sum(self.shard_sizes)

    def write_shard(self, records: Iterable[dict[str, Any]]) -> int:
        """Write the next shard (its records in row order) atomically; return its index."""
        lines = [
            json.dumps(r, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
            for r in records
        ]
        index = self.num_shards
        lengths = np.fromiter((len(b) for b in lines), dtype=np.int64, count=len(lines))
        offsets = np.zeros(len(lines) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        atomic_write_bytes(self.directory / _shard_name(index), b"".join(lines))
        atomic_save_npy(self.directory / _offsets_name(index), offsets)  # marks the shard done
        self.shard_sizes.append(len(lines))
        return index

    def close(self) -> DocStore:
        """Combine the shards' offsets, write the manifest, and return the finished store."""
        parts = [np.load(self.directory / _offsets_name(i)) for i in range(self.num_shards)]
        combined = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        atomic_save_npy(self.directory / OFFSETS, combined.astype(np.int64, copy=False))
        manifest = {
            "version": DOCSTORE_VERSION,
            "num_docs": self.num_docs,
            "shards": [
                {"file": _shard_name(i), "num_docs": n} for i, n in enumerate(self.shard_sizes)
            ],
        }
        atomic_write_text(self.directory / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        for i in range(self.num_shards):  # the combined array replaces them
            (self.directory / _offsets_name(i)).unlink(missing_ok=True)
        return DocStore(self.directory)

    @classmethod
    def from_records(
        cls,
        directory: str | os.PathLike[str],
        records: Iterable[dict[str, Any]],
        shard_size: int = 100_000,
    ) -> DocStore:
        """Write every record into a new store at ``directory`` (no resumption) and open it."""
        writer = cls(directory)
        shard: list[dict[str, Any]] = []
        for record in records:
            shard.append(record)
            if len(shard) == shard_size:
                writer.write_shard(shard)
                shard = []
        if shard or writer.num_shards == 0:
            writer.write_shard(shard)
        return writer.close()


def _offsets_name(index: int) -> str:
    return f"docs-{index:05d}.offsets.npy"


# ------------------------------------------------------------------------------------------------
# Reading a doc store


class DocStore(Sequence[dict[str, Any]]):
    """The documents of an index, read row by row from disk; a read-only ``Sequence[dict]``.

    ``store[row]`` parses one record (negative rows count from the end); ``store.get_many(rows)``
    reads many. Shard files are memory-mapped, so reading is a slice of the page cache plus one
    ``json.loads``; nothing is loaded up front beyond the manifest. Thread-safe for reading;
    pickles as its path (workers reopen the same files).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        manifest_path = self.directory / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(
                f"{self.directory} holds no finished doc store ({MANIFEST} missing); build one "
                "with `agentgym retrieval index --corpus FILE --out DIR`"
            )
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("version") != DOCSTORE_VERSION:
            raise ValueError(
                f"{manifest_path}: doc store version {manifest.get('version')!r}, this agentgym "
                f"reads version {DOCSTORE_VERSION}; rebuild the index"
            )
        sizes = np.array([s["num_docs"] for s in manifest["shards"]], dtype=np.int64)
        self._files = [self.directory / s["file"] for s in manifest["shards"]]
        self._num_docs = int(manifest["num_docs"])
        # row_starts[s] = first row of shard s; row r of shard s has its line start at
        # offsets[r + s] and its end at offsets[r + s + 1] (each shard carries one extra end)
        self._row_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._offsets = np.load(self.directory / OFFSETS, mmap_mode="r")
        self._maps: list[mmap.mmap | None] = [None] * len(self._files)

    def __reduce__(self) -> tuple[type[DocStore], tuple[Path]]:
        return (DocStore, (self.directory,))

    def _map(self, shard: int) -> mmap.mmap | bytes:
        m = self._maps[shard]
        if m is None:
            with open(self._files[shard], "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return b""
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[shard] = m
        return m

    def __len__(self) -> int:
        return self._num_docs

    def _locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shard, byte start and byte end of each row (rows already checked to be in range)."""
        shards = np.searchsorted(self._row_starts, rows, side="right") - 1
        idx = rows + shards
        return shards, np.asarray(self._offsets[idx]), np.asarray(self._offsets[idx + 1])

    def _check(self, rows: np.ndarray) -> np.ndarray:
        rows = np.where(rows < 0, rows + self._num_docs, rows)
        bad = (rows < 0) | (rows >= self._num_docs)
        if bad.any():
            raise IndexError(
                f"row {int(rows[bad][0])} out of range for a doc store of {self._num_docs} docs"
            )
        return rows

    @overload
    def __getitem__(self, row: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, row: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, row: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(row, slice):
            return self.get_many(range(*row.indices(self._num_docs)))
        if not isinstance(row, int | np.integer):
            raise TypeError(f"doc store rows are integers or slices, not {type(row).__name__}")
        return self.get_many([int(row)])[0]

    def get_many(self, rows: Iterable[int] | np.ndarray) -> list[dict[str, Any]]:
        """The records at ``rows`` (any int sequence or array, any order, repeats allowed)."""
        rows = np.asarray(rows if isinstance(rows, np.ndarray) else list(rows), dtype=np.int64)
        if rows.size == 0:
            return []
        shards, starts, ends = self._locate(self._check(rows.reshape(-1)))
        return [
            json.loads(self._map(s)[b:e])
            for s, b, e in zip(shards.tolist(), starts.tolist(), ends.tolist(), strict=True)
        ]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for path in self._files:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    yield json.loads(line)

    def close(self) -> None:
        """Unmap the shard files (the store reopens them on the next read)."""
        for i, m in enumerate(self._maps):
            if m is not None:
                m.close()
                self._maps[i] = None

    def __repr__(self) -> str:
        return f"DocStore({str(self.directory)!r}, num_docs={self._num_docs})"
