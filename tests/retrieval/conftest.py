"""Fixtures for the retrieval tests: a generated corpus and a tiny encoder, built once per session.

Everything is made offline: the corpus by :mod:`agentgym.retrieval.synthetic`, the encoder as a
randomly initialised 2-layer BERT with a WordPiece vocabulary learnt from that corpus, saved as a
sentence-transformers folder (so tests run the real sentence-transformers loading path).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentgym.retrieval.synthetic import random_encoder, synthetic_corpus, write_corpus

SHARED_DATA = Path(
    os.environ.get(
        "AGENTGYM_SHARED_DATA", Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    )
)
MINILM_DIR = SHARED_DATA / "encoders" / "all-MiniLM-L6-v2"
CORPUS_PASSAGES = 2000


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models and small indexes run fastest on one thread (torch, FAISS's OpenMP), and much
    slower on several when the CPU is shared with other work."""
    import faiss
    import torch

    threads, omp = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(omp)


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory) -> Path:
    """A synthetic wiki-18-format corpus of 2000 passages (JSONL)."""
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", CORPUS_PASSAGES)


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory) -> Path:
    """A sentence-transformers folder: random 2-layer BERT (hidden 64), WordPiece vocabulary from
    the synthetic corpus. Its plain transformers copy is at ``tiny_encoder_dir.parent / "raw"``."""
    texts = [r["contents"] for r in synthetic_corpus(CORPUS_PASSAGES)]
    return random_encoder(tmp_path_factory.mktemp("tiny_encoder"), texts, hidden=64, layers=2)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real pretrained all-MiniLM-L6-v2 from ../shared/data (skips when absent)."""
    if not (MINILM_DIR / "config.json").is_file():
        pytest.skip(f"pretrained encoder {MINILM_DIR} absent")
    return MINILM_DIR
