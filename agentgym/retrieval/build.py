"""Build a search index from a corpus, resumably; open a finished one.

``build_index(corpus, out, kind=...)`` (the code behind ``agentgym retrieval index``) streams the
corpus in shards of ``shard_size`` records. For each shard it writes the documents into the
index's :class:`~agentgym.retrieval.corpus.DocStore` and, for dense kinds, the shard's passage
embeddings as ``.npy``, each file atomically. A killed build, rerun with the same settings,
continues from its first unfinished shard. Then it builds the index proper (FAISS from the
embedding shards, or BM25 over the stored contents) and writes ``meta.json`` last: an index
directory with ``meta.json`` is finished, one without it is a build in progress.

Layout of an index directory::

    build.json      the build's settings, written first (a resumed build must match them)
    docs/           the DocStore: the corpus records, row-addressable
    embeddings/     dense kinds, while building: emb-00000.npy ... (float32, (rows, dim))
    dense.index     dense kinds: the FAISS index (flat, hnsw or ivfpq)
    bm25/           kind bm25: the BM25 index (bm25s or pyserini backend)
    meta.json       written last: kind, backend, encoder, num_docs, dim, corpus, version
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agentgym.io import atomic_save_npy, atomic_write_text
from agentgym.retrieval.corpus import (
    DocStore,
    DocStoreWriter,
    count_records,
    iter_corpus,
)

if TYPE_CHECKING:
    from agentgym.retrieval.base import Retriever
    from agentgym.retrieval.encoder import Encoder

__all__ = [
    "INDEX_KINDS",
    "IndexExistsError",
    "IndexMeta",
    "build_index",
    "open_index",
    "read_meta",
]

logger = logging.getLogger(__name__)

INDEX_KINDS = ("flat", "hnsw", "ivfpq", "bm25")
INDEX_VERSION = 1
META = "meta.json"
BUILD = "build.json"
# everything a build writes; --force removes these and nothing else
_OWNED = (META, BUILD, "docs", "embeddings", "dense.index", "bm25")
# IVF-PQ trains its codebooks on this many vectors at most (FAISS: ~39-256 per centroid)
IVFPQ_TRAIN_SIZE = 256 * 39 * 4


class IndexExistsError(FileExistsError):
    """The output directory already holds a finished index (rebuild with ``force=True``)."""


class BuildMismatchError(ValueError):
    """An unfinished build in the output directory was started with other settings."""


@dataclass(frozen=True)
class IndexMeta:
    """What ``meta.json`` records about a finished index."""

    kind: str
    """flat, hnsw, ivfpq (dense, FAISS) or bm25"""
    num_docs: int
    corpus: str
    """absolute path of the corpus it was built from"""
    backend: str | None = None
    """bm25 only: bm25s or pyserini"""
    encoder: str | None = None
    """dense only: the encoder's name or absolute folder path"""
    dim: int | None = None
    """dense only: embedding length"""
    query_prefix: str | None = None
    passage_prefix: str | None = None
    max_length: int | None = None
    version: int = INDEX_VERSION

    @property
    def dense(self) -> bool:
        return self.kind != "bm25"


def read_meta(index_dir: str | os.PathLike[str]) -> IndexMeta:
    """The :class:`IndexMeta` of a finished index directory."""
    path = Path(index_dir) / META
    if not path.is_file():
        hint = (
            "its build did not finish; rerun the same `agentgym retrieval index` command to "
            "resume it"
            if (Path(index_dir) / BUILD).is_file()
            else "build one with `agentgym retrieval index --corpus FILE --kind bm25 --out DIR`"
        )
        raise FileNotFoundError(f"{index_dir} is not a finished index ({META} missing): {hint}")
    raw = json.loads(path.read_text())
    if raw.get("version") != INDEX_VERSION:
        raise ValueError(
            f"{path}: index version {raw.get('version')!r}; this agentgym reads version "
            f"{INDEX_VERSION}: rebuild the index with --force"
        )
    known = {f.name for f in dataclasses.fields(IndexMeta)}
    return IndexMeta(**{k: v for k, v in raw.items() if k in known})


def _emb_name(shard: int) -> str:
    return f"emb-{shard:05d}.npy"


def _finished_prefix(directory: Path, name: Any) -> int:
    """How many consecutive files ``name(0), name(1), ...`` exist in ``directory``."""
    n = 0
    while (directory / name(n)).is_file():
        n += 1
    return n


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _shards(records: Iterator[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    shard: list[dict[str, Any]] = []
    for record in records:
        shard.append(record)
        if len(shard) == size:
            yield shard
            shard = []
    if shard:
        yield shard


def build_index(
    corpus: str | os.PathLike[str],
    out: str | os.PathLike[str],
    kind: str = "flat",
    *,
    encoder: str | os.PathLike[str] | Encoder | None = None,
    backend: str = "bm25s",
    shard_size: int = 50_000,
    force: bool = False,
    device: str | None = None,
    batch_size: int = 256,
    seed: int = 0,
    show_progress: bool = True,
) -> IndexMeta:
    """Build (or resume building) an index of ``corpus`` in the directory ``out``.

    ``kind``: ``flat`` / ``hnsw`` / ``ivfpq`` (dense: needs ``encoder``, a name, folder or
    :class:`~agentgym.retrieval.encoder.Encoder`; default ``intfloat/e5-base-v2``) or ``bm25``
    (``backend`` ``bm25s`` or ``pyserini``). A finished index in ``out`` raises
    :class:`IndexExistsError` unless ``force`` (which deletes what a build writes there, nothing
    else). An unfinished one is resumed when its settings match, else :class:`BuildMismatchError`.
    ``show_progress`` shows progress bars and, on stderr, a line before each slow step (loading
    the encoder, counting the corpus, building the index). Returns the finished index's
    :class:`IndexMeta`.
    """
    if kind not in INDEX_KINDS:
        raise ValueError(f"unknown index kind {kind!r}; choose one of {', '.join(INDEX_KINDS)}")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    corpus = Path(corpus).resolve()
    out = Path(out)
    if (out / META).is_file():
        if not force:
            raise IndexExistsError(
                f"{out} already holds a finished index; pass --force to rebuild it, or choose "
                "another --out"
            )
    if force:
        for name in _OWNED:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
    if not corpus.is_file():
        raise FileNotFoundError(
            f"corpus {corpus} not found; pass a JSONL file with one "
            '{"id": ..., "contents": "\\"Title\\"\\ntext"} per line (plain or .gz)'
        )
    out.mkdir(parents=True, exist_ok=True)

    def step(message: str) -> None:
        # said before the work, which can take minutes on a large corpus (the encoder's
        # imports and weights alone take 10-60 s)
        if show_progress:
            _log(message)

    dense = kind != "bm25"
    enc = None
    if dense:
        from agentgym.retrieval.encoder import DEFAULT_ENCODER, Encoder

        if not isinstance(encoder, Encoder):
            step(f"loading the encoder {os.fspath(encoder or DEFAULT_ENCODER)}")
        enc = _open_encoder(encoder, device, batch_size)
    settings = {
        "kind": kind,
        "corpus": str(corpus),
        "shard_size": shard_size,
        "backend": None if dense else backend,
        "encoder": _encoder_id(enc) if enc is not None else None,
        "prefixes": [enc.query_prefix, enc.passage_prefix] if enc is not None else None,
        "max_length": enc.max_length if enc is not None else None,
        "seed": seed,
    }
    _check_or_write_settings(out, settings)

    # DOCUMENTS (+ EMBEDDINGS): shard by shard, each file atomic, resumable
    docs_dir, emb_dir = out / "docs", out / "embeddings"
    store_done = (docs_dir / "docstore.json").is_file()
    # the documents' ids, kept while the store is written from its first shard: reading them
    # back from the store parses every record's JSON once more (1 s of a 7 s 100k build)
    ids: list[str] | None = None
    if not store_done or dense:
        step(f"counting the documents in {corpus}")
        total = count_records(corpus)
        if total == 0:
            raise ValueError(f"corpus {corpus} holds no records; nothing to index")
        writer = None if store_done else DocStoreWriter(docs_dir)
        docs_shards = (
            -(-total // shard_size) if store_done else writer.num_shards  # type: ignore[union-attr]
        )
        if dense:
            emb_dir.mkdir(exist_ok=True)
        emb_shards = _finished_prefix(emb_dir, _emb_name) if dense else docs_shards
        start = min(docs_shards, emb_shards)
        if start:
            _log(f"resuming at shard {start} ({start * shard_size} of {total} documents done)")
        shard_index = start
        if writer is not None and start == 0 and not dense:
            ids = []
        with _progress(total, min(start * shard_size, total), "documents", show_progress) as bar:
            for shard in _shards(iter_corpus(corpus, start=start * shard_size), shard_size):
                if writer is not None and shard_index >= writer.num_shards:
                    writer.write_shard(shard)
                if ids is not None:
                    ids.extend(str(record["id"]) for record in shard)
                if dense and shard_index >= emb_shards:
                    texts = [r["contents"] for r in shard]
                    vectors = enc.encode_passages(texts)  # type: ignore[union-attr]
                    atomic_save_npy(emb_dir / _emb_name(shard_index), vectors)
                shard_index += 1
                bar.update(len(shard))
        if writer is not None:
            writer.close()
    store = DocStore(docs_dir)

    # INDEX: from the embedding shards (dense) or the stored contents (bm25)
    started = time.perf_counter()
    step(f"building the {kind} index over {len(store)} documents")
    if dense:
        dim = _build_dense(kind, emb_dir, out / "dense.index", len(store), seed, show_progress)
    else:
        from agentgym.retrieval.sparse import BM25Index

        dim = None
        BM25Index.build(
            _SizedTexts(store),
            backend=backend,
            path=out / "bm25",
            show_progress=show_progress,
            # equal scores in Anserini's id order
            ids=ids if ids is not None else (str(record["id"]) for record in store),
        )
    _log(f"{kind} index over {len(store)} documents built in {time.perf_counter() - started:.1f}s")

    meta = IndexMeta(
        kind=kind,
        num_docs=len(store),
        corpus=str(corpus),
        backend=None if dense else backend,
        encoder=settings["encoder"],
        dim=dim,
        query_prefix=enc.query_prefix if enc is not None else None,
        passage_prefix=enc.passage_prefix if enc is not None else None,
        max_length=enc.max_length if enc is not None else None,
    )
    atomic_write_text(out / META, json.dumps(dataclasses.asdict(meta), indent=1) + "\n")
    if dense:  # the FAISS index holds the vectors now
        shutil.rmtree(emb_dir, ignore_errors=True)
    return meta


class _SizedTexts:
    """The stored ``contents`` in row order, with a length (for the BM25 progress bar)."""

    def __init__(self, store: DocStore) -> None:
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    def __iter__(self) -> Iterator[str]:
        for record in self.store:
            yield record["contents"]


def _progress(total: int, initial: int, unit: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit=" " + unit,
        unit_scale=True,
        smoothing=0.1,
        disable=not enabled,
        desc="indexing",
    )


def _open_encoder(
    encoder: str | os.PathLike[str] | Encoder | None, device: str | None, batch_size: int
) -> Encoder:
    from agentgym.retrieval.encoder import DEFAULT_ENCODER, Encoder

    if isinstance(encoder, Encoder):
        return encoder
    return Encoder(encoder or DEFAULT_ENCODER, device=device, batch_size=batch_size)


def _encoder_id(encoder: Encoder) -> str:
    # a local folder is recorded as an absolute path so the index opens from any directory
    path = Path(encoder.name).expanduser()
    return str(path.resolve()) if path.is_dir() else encoder.name


def _check_or_write_settings(out: Path, settings: dict[str, Any]) -> None:
    path = out / BUILD
    if path.is_file():
        previous = json.loads(path.read_text())
        changed = sorted(k for k in settings if previous.get(k) != settings[k])
        if changed:
            detail = ", ".join(f"{k}: {previous.get(k)!r} -> {settings[k]!r}" for k in changed)
            raise BuildMismatchError(
                f"{out} holds an unfinished build with other settings ({detail}); rerun with the "
                "same settings to resume it, or pass --force to start over"
            )
        return
    atomic_write_text(path, json.dumps(settings, indent=1) + "\n")


def _build_dense(
    kind: str, emb_dir: Path, path: Path, num_docs: int, seed: int, show_progress: bool
) -> int:
    """Build the FAISS index from the embedding shards; return the dimension."""
    from agentgym.retrieval.dense import DenseIndex

    shard_files = [emb_dir / _emb_name(i) for i in range(_finished_prefix(emb_dir, _emb_name))]
    shards = [np.load(f, mmap_mode="r") for f in shard_files]
    if sum(len(s) for s in shards) != num_docs:
        raise RuntimeError(
            f"{emb_dir} holds {sum(len(s) for s in shards)} embeddings for {num_docs} documents; "
            "rebuild with --force"
        )
    dim = int(shards[0].shape[1]) if shards else 0
    train = None
    if kind == "ivfpq":
        # a seeded sample across all shards, read shard by shard (never all vectors at once)
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(num_docs, size=min(num_docs, IVFPQ_TRAIN_SIZE), replace=False))
        bounds = np.cumsum([0] + [len(s) for s in shards])
        train = np.concatenate(
            [
                np.asarray(s[rows[(rows >= lo) & (rows < hi)] - lo])
                for s, lo, hi in zip(shards, bounds[:-1], bounds[1:], strict=True)
            ]
        )
    index = DenseIndex.new(kind, dim, train_vectors=train, search_path="faiss-cpu")
    with _progress(num_docs, 0, "vectors", show_progress) as bar:
        for shard in shards:
            index.add(np.asarray(shard))
            bar.update(len(shard))
    index.save(path)
    return dim


def open_index(
    index_dir: str | os.PathLike[str],
    *,
    encoder: str | os.PathLike[str] | Encoder | None = None,
    device: str | None = None,
    mmap: bool = True,
    search_path: str | None = None,
    **kwargs: Any,
) -> Retriever:
    """A :class:`Retriever` over a finished index directory (see :func:`open_retriever`).

    Dense indexes encode queries with ``encoder`` (default: the one recorded in ``meta.json``,
    with the same prefixes and max length) and search on ``device`` (default: CUDA when
    available) along ``search_path`` (default: chosen by :class:`DenseIndex`).
    """
    index_dir = Path(index_dir)
    meta = read_meta(index_dir)
    # each slow step is logged (INFO, "agentgym.retrieval.build") before it starts, so a server
    # that takes a minute to come up says what it is loading
    logger.info("opening the document store %s (%d documents)", index_dir / "docs", meta.num_docs)
    store = DocStore(index_dir / "docs")
    if not meta.dense:
        from agentgym.retrieval.sparse import BM25Index, BM25Retriever

        logger.info("loading the %s BM25 index %s", meta.backend, index_dir / "bm25")
        return BM25Retriever(BM25Index.load(index_dir / "bm25", mmap=mmap), store, **kwargs)

    from agentgym.retrieval.dense import DenseIndex, DenseRetriever
    from agentgym.retrieval.encoder import Encoder

    if not isinstance(encoder, Encoder):
        logger.info("loading the query encoder %s", os.fspath(encoder or meta.encoder))
        prefixes = (meta.query_prefix or "", meta.passage_prefix or "")
        encoder = Encoder(
            encoder or meta.encoder,
            device=device,
            max_length=meta.max_length or 256,
            prefixes=prefixes if encoder is None else None,
        )
    index_path = index_dir / "dense.index"
    logger.info(
        "loading the %s index %s (%.0f MB%s)",
        meta.kind,
        index_path,
        index_path.stat().st_size / 1e6 if index_path.is_file() else 0,
        ", memory-mapped" if mmap and meta.kind != "ivfpq" else "",  # IVF lists are read
    )
    index = DenseIndex.load(
        index_path, meta.kind, mmap=mmap, device=device, search_path=search_path
    )
    return DenseRetriever(index, encoder, store, **kwargs)
