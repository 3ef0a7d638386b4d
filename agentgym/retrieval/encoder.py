"""Text encoders for dense retrieval: any sentence-transformers model, E5's conventions built in.

E5 (``intfloat/e5-base-v2``, the encoder Search-R1 retrieves wiki-18 with) expects:

- a ``"query: "`` prefix on queries and a ``"passage: "`` prefix on passages (Search-R1 encodes
  a passage's whole ``contents``, title line included, as ``"passage: " + contents``);
- mean pooling of the last hidden states over the attention mask (padding excluded);
- L2-normalised embeddings, so inner product = cosine similarity;
- at most 256 tokens (longer texts are truncated).

:class:`Encoder` does all of this for any sentence-transformers model or plain transformers
folder. Prefixes are on by default only for models whose name contains ``e5`` (or whose
sentence-transformers config defines ``query`` / ``passage`` prompts); pass ``prefixes`` to
choose either way. On a GPU the model runs in fp16.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["E5_PREFIXES", "Encoder", "EncoderNotFoundError"]

E5_PREFIXES = ("query: ", "passage: ")
DEFAULT_ENCODER = "intfloat/e5-base-v2"


class EncoderNotFoundError(FileNotFoundError):
    """The encoder is neither a local folder nor a model already in the local Hugging Face cache."""


def _is_e5(name: str) -> bool:
    # the model's own name (last path component), so a folder like /home/e5user/bert is not E5
    return "e5" in Path(name.rstrip("/")).name.lower()


def _resolve_device(device: str | None) -> str:
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def st_modules() -> tuple[Any, Any, Any]:
    """sentence-transformers' ``(Transformer, Pooling, Normalize)`` module classes (they moved
    in sentence-transformers 6; older versions keep them in ``sentence_transformers.models``)."""
    try:
        from sentence_transformers.sentence_transformer.modules import (
            Normalize,
            Pooling,
            Transformer,
        )
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer
    return Transformer, Pooling, Normalize


def _word_dim(word: Any) -> int:
    # renamed in sentence-transformers 6; keep older versions working
    get = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    return int(get())


def _check_source(name: str) -> None:
    """Refuse a folder that does not exist or holds no model (hub names are checked on load)."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not ((path / "modules.json").is_file() or (path / "config.json").is_file()):
            raise EncoderNotFoundError(
                f"{path} is a folder but holds no model (no modules.json or config.json); pass a "
                "sentence-transformers or transformers model folder"
            )
    elif name.startswith((".", "/", "~")) or name.count("/") > 1:  # a path, not "org/model"
        raise EncoderNotFoundError(f"encoder folder {path} not found")


class Encoder:
    """Encode queries and passages into L2-normalised float32 vectors.

    ``name_or_path``: a sentence-transformers folder (``modules.json``), a plain transformers
    folder (``config.json``; gets mean pooling + normalisation), or a Hugging Face hub name that
    is already in the local cache (nothing is downloaded). ``device``: ``"cuda"``, ``"cpu"``, ...;
    default CUDA when available. ``prefixes``: ``None`` = automatic (E5's for ``e5`` models, the
    model's own ``query`` / ``passage`` prompts when it defines them, none otherwise), ``True`` =
    E5's, ``False`` = none, or a ``(query_prefix, passage_prefix)`` pair. ``fp16``: default on
    for CUDA devices.

    ``encode_queries(texts)`` and ``encode_passages(texts)`` return ``(len(texts), dim)``
    float32 arrays of unit rows, computed in batches of ``batch_size``.
    """

    def __init__(
        self,
        name_or_path: str | os.PathLike[str] = DEFAULT_ENCODER,
        device: str | None = None,
        batch_size: int = 128,
        max_length: int = 256,
        prefixes: bool | tuple[str, str] | None = None,
        fp16: bool | None = None,
        show_progress: bool = False,
    ) -> None:
        self.name = os.fspath(name_or_path)
        _check_source(self.name)  # before importing torch: a typo fails in milliseconds
        self.device = _resolve_device(device)
        self.batch_size = batch_size
        self.max_length = max_length
        self.show_progress = show_progress
        self.model = self._load(self.name, self.device, max_length)
        self.model.max_seq_length = max_length
        self.fp16 = self.device.startswith("cuda") if fp16 is None else fp16
        if self.fp16:
            self.model.half()
        self.model.eval()
        self.query_prefix, self.passage_prefix = self._prefixes(prefixes)

    @staticmethod
    def _load(name: str, device: str, max_length: int) -> Any:
        from sentence_transformers import SentenceTransformer

        path = Path(name).expanduser()
        if path.is_dir():
            if (path / "modules.json").is_file():
                return SentenceTransformer(str(path), device=device, local_files_only=True)
            # a plain transformers model: E5's pooling (mean over the mask) + unit norm
            transformer, pooling, normalize = st_modules()
            word = transformer(str(path), max_seq_length=max_length)
            pool = pooling(_word_dim(word), pooling_mode="mean")
            return SentenceTransformer(modules=[word, pool, normalize()], device=device)
        try:
            return SentenceTransformer(name, device=device, local_files_only=True)
        except (OSError, ValueError) as e:
            raise EncoderNotFoundError(
                f"encoder {name!r} is not available offline (it is not a local folder and not in "
                "the Hugging Face cache, and agentgym never downloads weights). Download it where "
                f"you have network access (e.g. `huggingface-cli download {name} --local-dir "
                "DIR`) and pass the local folder DIR instead"
            ) from e

    def _prefixes(self, prefixes: bool | tuple[str, str] | None) -> tuple[str, str]:
        if prefixes is True:
            return E5_PREFIXES
        if prefixes is False:
            return ("", "")
        if prefixes is not None:
            query, passage = prefixes
            return (query, passage)
        # sentence-transformers saves empty query/document prompts by default: only a model that
        # sets a non-empty one has its own convention
        prompts = getattr(self.model, "prompts", None) or {}
        own = (prompts.get("query", ""), prompts.get("passage", prompts.get("document", "")))
        if any(own):
            return own
        return E5_PREFIXES if _is_e5(self.name) else ("", "")

    @property
    def dim(self) -> int:
        """Length of the embedding vectors."""
        model = self.model
        get = (
            getattr(model, "get_embedding_dimension", None)
            or model.get_sentence_embedding_dimension
        )
        return int(get())

    def _encode(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("pass a list of texts, not one string")
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self.model.encode(
            [prefix + t for t in texts],
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,  # idempotent after a Normalize module; needed without one
            show_progress_bar=self.show_progress,
        )
        return np.ascontiguousarray(out, dtype=np.float32)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32 unit vectors of the queries (query prefix added)."""
        return self._encode(texts, self.query_prefix)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32 unit vectors of the passages (passage prefix added).

        For wiki-18 records pass the whole ``contents`` (title line included), as Search-R1's
        index builder does."""
        return self._encode(texts, self.passage_prefix)

    def __repr__(self) -> str:
        return (
            f"Encoder({self.name!r}, device={self.device!r}, dim={self.dim}, fp16={self.fp16}, "
            f"prefixes={(self.query_prefix, self.passage_prefix)!r})"
        )
