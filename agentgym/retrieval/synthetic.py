"""A synthetic corpus in Search-R1's wiki-18 format, with questions whose answers it holds.

Everything here is generated (synthetic, not Wikipedia): made-up people, towns, rivers and
companies, each with a passage stating a few facts about it, and questions that name the entity
and ask for one of those facts, each labelled with the id of the passage that answers it. It lets
tests and benchmarks measure retrieval (recall@k) with zero downloads, at any size: the same
``(num_passages, seed)`` always gives the same corpus, and ~1M passages take well under a minute.

Records look like wiki-18's: ``{"id": "17", "contents": "\\"Varo Kelin\\"\\nVaro Kelin (born
1874) is a ..."}``; ids are the row numbers as strings, as in wiki-18.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.io import atomic_open

__all__ = ["random_encoder", "synthetic_corpus", "synthetic_queries", "write_corpus"]

_SYLLABLES = (
    "ka ro vel an mir tos lu den sa bri qua zo ne fel ix or ma tul gre vin "
    "pa hol ser di nak bor e sil tam ru cor dra fen io lam pre vos ul gan thi"
).split()  # 40 syllables: 40**4 = 2.56M distinct four-syllable names
_COUNTRIES = (
    "Teleria Ostmark Varland Quessia Dunmore Halvany Brisca Normont Kethia Solvane "
    "Arvenia Mirelle Tovia Zantor Belcrest Ulmara Fenwick Corvath Ilsary Prandor"
).split()
_OCCUPATIONS = (
    "painter composer physicist novelist architect botanist sculptor mathematician poet "
    "astronomer engineer historian cartographer violinist chemist"
).split()
_INDUSTRIES = (
    "shipbuilding textiles glassware railways printing brewing clockmaking porcelain "
    "telegraphy pharmaceuticals"
).split()
_FILLER = (
    "It is mentioned in several regional chronicles of the period.",
    "Records from the time describe it in some detail.",
    "Later accounts disagree on several minor points.",
    "A short entry about it appears in the national gazetteer.",
    "Local archives keep letters and maps that refer to it.",
    "Historians have studied its early years with interest.",
)
_KINDS = ("person", "town", "river", "company")


def _name(code: np.ndarray, title_case_words: bool) -> str:
    s = [_SYLLABLES[int(c)] for c in code]
    if title_case_words:  # people: "Varo Kelin"
        return f"{(s[0] + s[1]).capitalize()} {(s[2] + s[3]).capitalize()}"
    return (s[0] + s[1] + s[2] + s[3]).capitalize()


@dataclass(frozen=True)
class _Facts:
    """Every passage's generated attributes, one array entry per row (vectorised, seeded)."""

    codes: np.ndarray  # (n, 4) syllable indices, distinct rows
    kind: np.ndarray  # (n,) index into _KINDS
    year: np.ndarray  # (n,)
    country: np.ndarray  # (n,)
    number: np.ndarray  # (n,) population / length / employees
    role: np.ndarray  # (n,) occupation or industry
    related: np.ndarray  # (n,) another row: birthplace, tributary, founder
    filler: np.ndarray  # (n, 2)

    @classmethod
    def generate(cls, n: int, seed: int) -> _Facts:
        if n > len(_SYLLABLES) ** 4:
            raise ValueError(f"synthetic corpora hold at most {len(_SYLLABLES) ** 4} passages")
        rng = np.random.default_rng(seed)
        # distinct names: a seeded sample of n codes out of 40**4, written in base 40
        flat = rng.choice(len(_SYLLABLES) ** 4, size=n, replace=False)
        codes = np.stack([(flat // len(_SYLLABLES) ** p) % len(_SYLLABLES) for p in range(4)], 1)
        first = rng.integers(0, len(_FILLER), n)
        second = rng.integers(0, len(_FILLER) - 1, n)
        return cls(
            codes=codes,
            kind=rng.integers(0, len(_KINDS), n),
            year=rng.integers(1650, 2000, n),
            country=rng.integers(0, len(_COUNTRIES), n),
            number=rng.integers(120, 90_000, n),
            role=rng.integers(0, len(_OCCUPATIONS), n),
            # another passage (never itself, when there is another), and two distinct fillers
            related=(np.arange(n) + 1 + rng.integers(0, max(n - 1, 1), n)) % max(n, 1),
            filler=np.stack([first, (first + 1 + second) % len(_FILLER)], 1),
        )

    def title(self, row: int) -> str:
        kind = _KINDS[self.kind[row]]
        name = _name(self.codes[row], title_case_words=kind == "person")
        if kind == "river":
            return f"{name} River"
        if kind == "company":
            return f"{name} Works"
        return name

    def text(self, row: int) -> str:
        t, kind = self.title(row), _KINDS[self.kind[row]]
        year, country = int(self.year[row]), _COUNTRIES[self.country[row]]
        number, other = int(self.number[row]), self.title(int(self.related[row]))
        if kind == "person":
            job = _OCCUPATIONS[self.role[row] % len(_OCCUPATIONS)]
            facts = (
                f"{t} (born {year}) is a {job} from {country}. "
                f"{t} is best known for work that followed a long stay near {other}. "
                f"Over a career of many years, {t} completed {number % 400 + 3} works."
            )
        elif kind == "town":
            facts = (
                f"{t} is a town in {country}, founded in {year}. "
                f"It has a population of {number}. The town lies close to {other}."
            )
        elif kind == "river":
            facts = (
                f"The {t} is a river in {country}. It is {number % 900 + 12} kilometres long "
                f"and was first mapped in {year}. Its best-known tributary rises near {other}."
            )
        else:
            industry = _INDUSTRIES[self.role[row] % len(_INDUSTRIES)]
            facts = (
                f"{t} is a {industry} company based in {country}. It was founded in {year} "
                f"and employs {number} people. Its first director came from {other}."
            )
        a, b = self.filler[row]
        return f"{facts} {_FILLER[a]} {_FILLER[b]}"

    def question(self, row: int, which: int) -> tuple[str, str]:
        """(question, answer) about one fact of passage ``row``; ``which`` picks the fact."""
        t, kind = self.title(row), _KINDS[self.kind[row]]
        country = _COUNTRIES[self.country[row]]
        if which % 2 == 0:
            return f"which country is {t} in?", country
        if kind == "person":
            return f"in what year was {t} born?", str(int(self.year[row]))
        if kind == "town":
            return f"when was the town of {t} founded?", str(int(self.year[row]))
        if kind == "river":
            return f"when was the {t} first mapped?", str(int(self.year[row]))
        return f"in which year was {t} founded?", str(int(self.year[row]))


def synthetic_corpus(num_passages: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Yield ``num_passages`` synthetic wiki-18 records ``{"id", "contents"}`` in row order.

    The title line is quoted as in wiki-18 (``'"Varo Kelin"\\n...'``). Seeded: the same
    arguments always give the same records.
    """
    facts = _Facts.generate(num_passages, seed)
    for row in range(num_passages):
        yield {"id": str(row), "contents": f'"{facts.title(row)}"\n{facts.text(row)}'}


def synthetic_queries(
    num_passages: int, num_queries: int, seed: int = 0, query_seed: int = 1
) -> list[dict[str, Any]]:
    """Questions about the corpus ``synthetic_corpus(num_passages, seed)``, with their answers.

    Each is ``{"question", "answer", "doc_id", "row"}``: ``doc_id`` (and ``row``) is the one
    passage that states the answer, so recall@k is "is ``doc_id`` among the top k hits".
    Distinct passages, chosen with ``query_seed``.
    """
    facts = _Facts.generate(num_passages, seed)
    rng = np.random.default_rng(query_seed)
    rows = rng.choice(num_passages, size=min(num_queries, num_passages), replace=False)
    out = []
    for row in rows.tolist():
        question, answer = facts.question(row, int(rng.integers(0, 2)))
        out.append({"question": question, "answer": answer, "doc_id": str(row), "row": row})
    return out


def write_corpus(path: str | os.PathLike[str], num_passages: int, seed: int = 0) -> Path:
    """Write ``synthetic_corpus(num_passages, seed)`` to a JSONL file (``.gz`` compresses),
    atomically; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as raw:
        out = (
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=5) if path.suffix == ".gz" else raw
        )
        lines: list[str] = []
        for record in synthetic_corpus(num_passages, seed):
            lines.append(json.dumps(record, ensure_ascii=False) + "\n")
            if len(lines) == 10_000:  # bounded memory at any corpus size
                out.write("".join(lines).encode("utf-8"))
                lines = []
        out.write("".join(lines).encode("utf-8"))
        if out is not raw:
            out.close()
    return path


def random_encoder(
    out: str | os.PathLike[str],
    texts: Iterable[str],
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    intermediate: int | None = None,
    vocab_size: int = 2000,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised BERT encoder, built offline, as a sentence-transformers folder.

    Synthetic, untrained: its vectors are deterministic but meaningless, for tests and timings
    (``hidden=768, layers=12, heads=12, vocab_size=30522`` is E5-base's shape). The WordPiece
    vocabulary is learnt from ``texts``; the weights are seeded. Writes ``out/raw`` (a plain
    transformers folder) and ``out/st`` (Transformer -> mean Pooling -> Normalize, E5's
    pipeline); returns ``out/st``.
    """
    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from tokenizers.trainers import WordPieceTrainer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from agentgym.retrieval.encoder import st_modules

    out = Path(out)
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, WordPieceTrainer(vocab_size=vocab_size, special_tokens=special))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    config = BertConfig(
        # the trainer stops early on small texts; the embedding table can be larger than needed
        vocab_size=max(vocab_size, tok.get_vocab_size()),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate or hidden * 4,
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    raw = out / "raw"
    BertModel(config).save_pretrained(raw)
    BertTokenizerFast(tokenizer_object=tok, model_max_length=512).save_pretrained(raw)
    transformer, pooling, normalize = st_modules()
    word = transformer(str(raw), max_seq_length=256)
    model = SentenceTransformer(
        modules=[word, pooling(hidden, pooling_mode="mean"), normalize()], device="cpu"
    )
    model.save(str(out / "st"))
    return out / "st"
