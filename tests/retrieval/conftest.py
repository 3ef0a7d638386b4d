"""Fixtures for the retrieval tests: a generated corpus and a tiny encoder, built once per session.

Everything is made offline: the corpus by :mod:`agentgym.retrieval.synthetic`, the encoder as a
randomly initialised 2-layer BERT with a WordPiece vocabulary learnt from that corpus, saved as a
sentence-transformers folder (so tests run the real sentence-transformers loading path).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentgym.retrieval.encoder import st_modules
from agentgym.retrieval.synthetic import synthetic_corpus, write_corpus

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


def build_tiny_encoder(out: Path, texts: list[str], hidden: int = 64, layers: int = 2) -> Path:
    """Save a randomly initialised BERT (seeded) with a WordPiece tokenizer trained on ``texts``
    as a sentence-transformers folder (Transformer -> mean Pooling -> Normalize)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from tokenizers.trainers import WordPieceTrainer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, WordPieceTrainer(vocab_size=2000, special_tokens=special))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    hf_tok = BertTokenizerFast(tokenizer_object=tok, model_max_length=512)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=hidden * 2,
        max_position_embeddings=512,
    )
    raw = out / "raw"
    BertModel(config).save_pretrained(raw)
    hf_tok.save_pretrained(raw)
    transformer, pooling, normalize = st_modules()
    word = transformer(str(raw), max_seq_length=256)
    model = SentenceTransformer(
        modules=[word, pooling(hidden, pooling_mode="mean"), normalize()], device="cpu"
    )
    st_dir = out / "st"
    model.save(str(st_dir))
    return st_dir


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory) -> Path:
    """A sentence-transformers folder: random 2-layer BERT (hidden 64), WordPiece vocabulary from
    the synthetic corpus. Its plain transformers copy is at ``tiny_encoder_dir.parent / "raw"``."""
    texts = [r["contents"] for r in synthetic_corpus(CORPUS_PASSAGES)]
    return build_tiny_encoder(tmp_path_factory.mktemp("tiny_encoder"), texts)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real pretrained all-MiniLM-L6-v2 from ../shared/data (skips when absent)."""
    if not (MINILM_DIR / "config.json").is_file():
        pytest.skip(f"pretrained encoder {MINILM_DIR} absent")
    return MINILM_DIR
