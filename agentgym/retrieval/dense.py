"""Dense indexes (FAISS, or an exact torch search) and the dense :class:`Retriever`.

Index kinds (all inner product over L2-normalised vectors, i.e. cosine similarity):

- ``"flat"``: FAISS ``IndexFlatIP``, exact; what Search-R1 ships for wiki-18 (e5_Flat.index).
- ``"hnsw"``: FAISS ``HNSW64`` graph (Search-R1's second index); approximate, fast on CPU.
- ``"ivfpq"``: FAISS ``IVF{nlist},PQ{m}x{bits}``, trained on a sample; approximate, compressed
  (``m`` bytes a vector instead of ``4 * dim``) for corpora too large for a flat index in RAM.

Where a search runs (``DenseIndex.search_path``):

- ``"faiss-cpu"``: FAISS on the CPU (any kind).
- ``"faiss-gpu"``: FAISS's GPU index, fp16, sharded over all visible GPUs, as Search-R1 runs it
  (flat and ivfpq; needs a faiss build with GPU support).
- ``"torch-cuda"``: exact search as one matrix product + top-k per chunk of the index, vectors in
  fp16 on the GPU (flat only; the GPU path when the installed faiss has no GPU support).
- ``"torch-cpu"``: the same exact torch search on the CPU (fp32), mostly to check the torch path
  against FAISS.

By default a CUDA machine gets ``faiss-gpu`` when faiss can, else ``torch-cuda`` for flat indexes;
HNSW always searches on the CPU; a CPU machine gets ``faiss-cpu``. Both exact paths return the
same rows; which is faster depends on the BLAS each links: ``benchmarks/bench_retrieval_build.py``
times them side by side, and where FAISS's BLAS is the slower one, ``search_path="torch-cpu"``
(e.g. ``open_retriever(dir, search_path="torch-cpu")``) answers batches of queries faster.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agentgym.io import atomic_path
from agentgym.retrieval.base import Hit

if TYPE_CHECKING:
    from agentgym.retrieval.encoder import Encoder

__all__ = ["KINDS", "SEARCH_PATHS", "DenseIndex", "DenseRetriever", "faiss_has_gpu"]

KINDS = ("flat", "hnsw", "ivfpq")
SEARCH_PATHS = ("faiss-cpu", "faiss-gpu", "torch-cuda", "torch-cpu")


def faiss_has_gpu() -> bool:
    """Whether the installed faiss was built with GPU support and sees a GPU."""
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _as_matrix(x: np.ndarray, dim: int | None = None) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or (dim is not None and x.shape[1] != dim):
        want = f"(n, {dim})" if dim is not None else "(n, dim)"
        raise ValueError(f"expected a {want} float32 matrix, got shape {x.shape}")
    return x


def _ivfpq_shape(
    n_train: int, dim: int, nlist: int | None, pq_m: int | None
) -> tuple[int, int, int]:
    """(nlist, m, bits) for an IVF-PQ index trained on ``n_train`` vectors.

    FAISS wants ~39 training points per centroid, both for the IVF lists and for each PQ
    codebook (2**bits centroids), so small training sets get fewer lists and smaller codebooks.
    """
    if nlist is None:
        nlist = int(4 * math.sqrt(max(n_train, 1)))
    nlist = max(1, min(nlist, n_train // 39 or 1))
    if pq_m is None:
        pq_m = next(m for m in (dim // 8, dim // 4, dim // 2, dim, 1) if m and dim % m == 0)
    if dim % pq_m:
        raise ValueError(f"pq_m={pq_m} must divide the vector dimension {dim}")
    bits = int(max(1, min(8, math.floor(math.log2(max(n_train / 39, 2))))))
    return nlist, pq_m, bits


class DenseIndex:
    """Inner-product search over unit vectors, through FAISS or an exact torch search.

    Build with :meth:`build` (all vectors at once) or :meth:`new` + :meth:`add` (shard by shard);
    :meth:`save` / :meth:`load` to disk. ``search(queries (m, d) float32, k)`` returns
    ``(rows int64 (m, k), scores float32 (m, k))``, best first, padded with ``-1`` / ``-inf``
    where the index has fewer than ``k`` vectors. ``search_path`` says where searches run (see
    the module docstring); ``nprobe`` (IVF lists visited) and ``ef_search`` (HNSW candidate list)
    trade speed for recall in the approximate kinds.
    """

    def __init__(
        self,
        faiss_index: Any,
        kind: str,
        *,
        device: str | None = None,
        search_path: str | None = None,
        nprobe: int = 32,
        ef_search: int = 128,
        chunk_elements: int = 1 << 26,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown dense index kind {kind!r}; choose one of {KINDS}")
        self.kind = kind
        self.cpu_index = faiss_index
        self.nprobe = nprobe
        self.ef_search = ef_search
        # the torch path's score matrix is (queries, chunk): this many elements at most
        self.chunk_elements = chunk_elements
        self.search_path = self._choose_path(device, search_path)
        self._gpu_index: Any = None
        self._vectors: Any = None  # torch tensor of the flat index's vectors (torch paths)
        self._ready = False
        self._prepare()

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def new(
        cls,
        kind: str,
        dim: int,
        *,
        train_vectors: np.ndarray | None = None,
        hnsw_m: int = 64,
        nlist: int | None = None,
        pq_m: int | None = None,
        **kwargs: Any,
    ) -> DenseIndex:
        """An empty index of ``kind`` for ``dim``-d vectors; ``ivfpq`` needs ``train_vectors``
        (a sample of the corpus's vectors, ideally >= 39 * 256 of them) to learn its codebooks."""
        import faiss

        if kind == "flat":
            index = faiss.IndexFlatIP(dim)
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        elif kind == "ivfpq":
            if train_vectors is None or len(train_vectors) == 0:
                raise ValueError("an ivfpq index is trained: pass train_vectors (a sample)")
            train = _as_matrix(train_vectors, dim)
            nlist, m, bits = _ivfpq_shape(len(train), dim, nlist, pq_m)
            index = faiss.index_factory(dim, f"IVF{nlist},PQ{m}x{bits}", faiss.METRIC_INNER_PRODUCT)
            # polysemous training only serves Hamming-filtered search, which we never use, and
            # costs far more than the k-means itself
            faiss.downcast_index(index).do_polysemous_training = False
            index.train(train)
        else:
            raise ValueError(f"unknown dense index kind {kind!r}; choose one of {KINDS}")
        return cls(index, kind, **kwargs)

    @classmethod
    def build(
        cls, vectors: np.ndarray, kind: str = "flat", *, seed: int = 0, **kwargs: Any
    ) -> DenseIndex:
        """Index ``vectors`` ``(n, d)`` (row i = document i). ``ivfpq`` trains on a seeded
        sample of at most 256 * 39 * 4 of them. Other ``kwargs`` as in :meth:`new`."""
        vectors = _as_matrix(vectors)
        train = None
        if kind == "ivfpq":
            train = sample_rows(vectors, 256 * 39 * 4, seed)
        index = cls.new(kind, vectors.shape[1], train_vectors=train, **kwargs)
        index.add(vectors)
        return index

    def add(self, vectors: np.ndarray) -> None:
        """Append ``vectors`` ``(n, d)``; they get the next ``n`` rows."""
        self.cpu_index.add(_as_matrix(vectors, self.dim))
        # copies for the GPU / torch paths are redone before the next search, not per add
        self._gpu_index = self._vectors = None
        self._ready = False

    # -- persistence -----------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index to ``path`` atomically (a temporary file, then ``os.replace``)."""
        import faiss

        with atomic_path(path) as tmp:
            faiss.write_index(self.cpu_index, str(tmp))

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        kind: str | None = None,
        *,
        mmap: bool = False,
        **kwargs: Any,
    ) -> DenseIndex:
        """Read an index written by :meth:`save` (or any FAISS index file of a known kind).

        ``mmap=True`` maps the vectors of flat and hnsw indexes from the file instead of reading
        them into memory: processes opening the same file share one copy in the page cache.
        (IVF-PQ codes are read into memory; they are the compressed form.) ``kwargs`` as in the constructor (``device``, ``search_path``, ...).
        """
        import faiss

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"dense index {path} not found; build one with "
                "`agentgym retrieval index --kind flat --corpus FILE --out DIR`"
            )
        # IO_FLAG_MMAP_IFC maps flat codes (IndexFlat and HNSW storage); faiss's IO_FLAG_MMAP
        # for inverted lists refuses a path-based reader, so IVF lists are read normally
        flags = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY if mmap else 0
        index = faiss.read_index(str(path), flags)
        if kind is None:
            kind = _kind_of(index)
        return cls(index, kind, **kwargs)

    # -- search ----------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return int(self.cpu_index.d)

    def __len__(self) -> int:
        return int(self.cpu_index.ntotal)

    def _choose_path(self, device: str | None, search_path: str | None) -> str:
        if search_path is not None:
            if search_path == "torch":
                search_path = "torch-cuda" if (device or "").startswith("cuda") else "torch-cpu"
            if search_path not in SEARCH_PATHS:
                raise ValueError(
                    f"unknown search_path {search_path!r}; choose one of {SEARCH_PATHS}"
                )
            if search_path.startswith("torch") and self.kind != "flat":
                raise ValueError(
                    f"the torch search is exact and reads a flat index's vectors; this index is "
                    f"{self.kind!r}: use search_path='faiss-cpu' or build with --kind flat"
                )
            if search_path == "faiss-gpu" and not faiss_has_gpu():
                raise RuntimeError(
                    "search_path='faiss-gpu' needs a faiss build with GPU support and a visible "
                    "GPU; use search_path='torch-cuda' (exact, flat indexes) or 'faiss-cpu'"
                )
            if search_path == "torch-cuda" and not _cuda_available():
                raise RuntimeError("search_path='torch-cuda' needs a CUDA device; use 'torch-cpu'")
            return search_path
        on_gpu = device.startswith("cuda") if device is not None else _cuda_available()
        if on_gpu and self.kind != "hnsw" and faiss_has_gpu():
            return "faiss-gpu"
        if on_gpu and self.kind == "flat":
            return "torch-cuda"
        return "faiss-cpu"

    def _prepare(self) -> None:
        """Move the index where its searches run (at load time, not per search)."""
        self._ready = True
        if self.search_path == "faiss-gpu":
            import faiss

            options = faiss.GpuMultipleClonerOptions()
            options.useFloat16 = True  # Search-R1's settings: fp16 vectors, sharded over GPUs
            options.shard = True
            self._gpu_index = faiss.index_cpu_to_all_gpus(self.cpu_index, co=options)
            if self.kind == "ivfpq":  # GPU shards take nprobe once, not per-call parameters
                faiss.GpuParameterSpace().set_index_parameter(
                    self._gpu_index, "nprobe", self.nprobe
                )
        elif self.search_path.startswith("torch"):
            import faiss
            import torch

            n, d = len(self), self.dim
            # a view of the flat index's own storage (memory-mapped when loaded with mmap)
            flat = (
                faiss.rev_swig_ptr(self.cpu_index.get_xb(), n * d).reshape(n, d)
                if n
                else np.zeros((0, d), dtype=np.float32)
            )
            with warnings.catch_warnings():  # read-only view; the search never writes to it
                warnings.simplefilter("ignore", UserWarning)
                vectors = torch.from_numpy(flat)
            if self.search_path == "torch-cuda":
                # fp16 on the GPU, copied over in slices: host memory never holds a second copy
                on_gpu = torch.empty((n, d), dtype=torch.float16, device="cuda")
                step = max(1, (256 << 20) // max(d * 4, 1))
                for start in range(0, n, step):
                    on_gpu[start : start + step].copy_(vectors[start : start + step])
                vectors = on_gpu
            self._vectors = vectors

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest rows of each query by inner product: ``(rows, scores)``, both
        ``(len(queries), k)``, best first; ``-1`` / ``-inf`` pad missing hits."""
        queries = _as_matrix(queries, self.dim)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not self._ready:
            self._prepare()
        if self.search_path.startswith("torch"):
            rows, scores = self._torch_search(queries, k)
        else:
            index = self._gpu_index if self.search_path == "faiss-gpu" else self.cpu_index
            scores, rows = index.search(queries, k, params=self._params())
            rows = rows.astype(np.int64, copy=False)
            scores = scores.astype(np.float32, copy=False)
        scores[rows < 0] = -np.inf  # FAISS pads with -FLT_MAX for inner product
        return rows, scores

    def _params(self) -> Any:
        import faiss

        # per-call parameters: thread-safe, unlike setting efSearch / nprobe on the index
        if self.kind == "hnsw" and self.search_path == "faiss-cpu":
            return faiss.SearchParametersHNSW(efSearch=self.ef_search)
        if self.kind == "ivfpq" and self.search_path == "faiss-cpu":
            return faiss.SearchParametersIVF(nprobe=self.nprobe)
        return None

    def _torch_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import torch

        vectors = self._vectors
        m, n = len(queries), len(self)
        q = torch.from_numpy(queries).to(vectors.device, dtype=vectors.dtype)
        best_scores = torch.full((m, k), -torch.inf, device=vectors.device)
        best_rows = torch.full((m, k), -1, dtype=torch.int64, device=vectors.device)
        chunk = max(1024, self.chunk_elements // max(m, 1))
        with torch.inference_mode():
            for start in range(0, n, chunk):
                block = vectors[start : start + chunk]
                scores = (q @ block.T).float()  # (m, chunk): the only large temporary
                top_scores, top_rows = scores.topk(min(k, len(block)), dim=1)
                # merge with the best so far: top-k of (k + k) candidates
                cand_scores = torch.cat([best_scores, top_scores], dim=1)
                cand_rows = torch.cat([best_rows, top_rows + start], dim=1)
                best_scores, pick = cand_scores.topk(k, dim=1)
                best_rows = cand_rows.gather(1, pick)
        return best_rows.cpu().numpy(), best_scores.cpu().numpy()

    def close(self) -> None:
        """Release GPU memory held by this index (a later search moves it back)."""
        self._gpu_index = self._vectors = None
        self._ready = False

    def __repr__(self) -> str:
        return (
            f"DenseIndex(kind={self.kind!r}, vectors={len(self)}, dim={self.dim}, "
            f"search_path={self.search_path!r})"
        )


def _kind_of(index: Any) -> str:
    import faiss

    if isinstance(index, faiss.IndexHNSW):
        return "hnsw"
    if isinstance(index, faiss.IndexIVF) or faiss.try_extract_index_ivf(index) is not None:
        return "ivfpq"
    if isinstance(index, faiss.IndexFlat):
        return "flat"
    raise ValueError(
        f"unsupported FAISS index type {type(index).__name__}; agentgym reads flat (IndexFlatIP), "
        "HNSW and IVF-PQ indexes"
    )


def sample_rows(vectors: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
    """At most ``size`` rows of ``vectors``, chosen without replacement (seeded), in row order."""
    if len(vectors) <= size:
        return np.asarray(vectors)
    rows = np.sort(np.random.default_rng(seed).choice(len(vectors), size=size, replace=False))
    return np.asarray(vectors[rows])


class DenseRetriever:
    """A :class:`~agentgym.retrieval.base.Retriever`: an encoder, a dense index, the documents.

    ``documents`` is row-aligned with the index (a :class:`~agentgym.retrieval.corpus.DocStore`
    or any sequence of records); a hit's ``doc_id`` is ``str(doc[id_field])``. ``search``
    encodes every query in one encoder call and searches the index once.
    """

    def __init__(
        self,
        index: DenseIndex,
        encoder: Encoder,
        documents: Sequence[dict[str, Any]],
        id_field: str = "id",
    ) -> None:
        if len(documents) != len(index):
            raise ValueError(
                f"the index has {len(index)} vectors but {len(documents)} documents were given; "
                "pass the documents the index was built from, in the same order"
            )
        if encoder.dim != index.dim:
            raise ValueError(
                f"the encoder makes {encoder.dim}-d vectors but the index holds {index.dim}-d "
                "ones; use the encoder the index was built with"
            )
        self.index = index
        self.encoder = encoder
        self.documents = documents
        self.id_field = id_field

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        """Best-first hits of every query (fewer than ``topk`` only when the index is smaller)."""
        if not len(queries):
            return []
        rows, scores = self.index.search(self.encoder.encode_queries(list(queries)), topk)
        valid = rows >= 0
        get_many = getattr(self.documents, "get_many", None)
        flat_rows = rows[valid].tolist()
        docs = get_many(flat_rows) if get_many else [self.documents[r] for r in flat_rows]
        it = iter(docs)
        out: list[list[Hit]] = []
        for row_valid, row_scores in zip(valid.tolist(), scores.tolist(), strict=True):
            hits = []
            for ok, score in zip(row_valid, row_scores, strict=True):
                if ok:
                    doc = next(it)
                    hits.append(
                        Hit(doc_id=str(doc[self.id_field]), score=float(score), document=doc)
                    )
            out.append(hits)
        return out

    def close(self) -> None:
        self.index.close()
