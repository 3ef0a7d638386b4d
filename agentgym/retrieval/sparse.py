"""BM25 over a list of texts, with Lucene's exact scoring, through bm25s or pyserini.

Two backends give the same rankings:

* ``"bm25s"`` (the default, and what ``"auto"`` picks): pure Python + numpy, no JVM. Texts are
  analysed by :func:`lucene_tokenize`, a re-implementation of the analyzer pyserini indexes with
  (Anserini's ``DefaultEnglishAnalyzer``), and scored exactly as Lucene's ``BM25Similarity``
  scores: Lucene's idf, float32 arithmetic in Lucene's order, and document lengths rounded to the
  one-byte ``SmallFloat`` norms Lucene keeps. That rounding (exact below 24 terms, 4 significant
  bits above, so up to ~11 % short) moves scores by a few percent: on generated corpora, without
  it a quarter of the top-10 lists come out in a different order, so it is reproduced. The
  per-term scores live in bm25s's eager sparse matrix and its on-disk format (loadable with
  ``bm25s.BM25.load``, memory-mapped by :meth:`BM25Index.load`). With numba installed the top k
  are found by compiled block-max MaxScore (:mod:`agentgym.retrieval.pruned`), which skips
  documents that cannot reach the top k, as Lucene does; without it, by scoring every posting
  with numpy. Both give the same rows and scores.
* ``"pyserini"``: a real Lucene index, built by Anserini's ``SimpleIndexer`` and searched by its
  ``SimpleSearcher`` (the class pyserini's ``LuceneSearcher`` wraps), in-process through pyjnius.
  It needs a Java 21+ virtual machine (see :mod:`agentgym.retrieval.java`), and a JVM does not
  survive ``fork``: create (or load) a pyserini index inside the process that searches it, never
  before forking workers; search it from one thread. Its scores are Anserini's, rounded to 1e-4.
  It is opt-in because the two backends rank alike.

Defaults ``k1=0.9, b=0.4`` are pyserini's ``LuceneSearcher`` defaults, used by Search-R1 and
WebShop.

Lucene's BM25 (``BM25Similarity``, Lucene 8+), for a query term t with ``c`` occurrences in the
query (pyserini's bag-of-words query boosts a term by its count) and a document d::

    idf(t)    = ln(1 + (N - df + 0.5) / (df + 0.5))       N = documents with >= 1 term
    score(d)  = sum_t  c * idf(t) * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))

with ``len(d)`` decoded from its one-byte norm and ``avgdl`` the exact mean length. Only
documents sharing at least one term with the query are returned.

Equal scores come in Anserini's order. ``SimpleSearcher`` (what pyserini's ``LuceneSearcher``
wraps) searches with ``Sort(SortField.FIELD_SCORE, SortField("id", STRING_VAL))``: score
descending (the float Lucene computed, compared bit for bit), then the document id ascending as a
string (UTF-8 bytes, unsigned: code point order, Python's ``str`` order). Its
``ScoreTiesAdjusterReranker`` afterwards only rounds the reported scores to 1e-4 and nudges tied
ones apart by 1e-6; it does not reorder. So an index built with ``ids`` (the documents' ids, e.g.
Search-R1's ``"0"``, ``"1"``, ... or WebShop's asins) breaks ties as Anserini does over an index of
those ids: ``"10"`` before ``"9"``. An index built without ids breaks them by row, as Anserini would
over zero-padded row numbers. Each document's rank in id order is computed once, when the index is
built, and saved with it.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import regex
from tqdm.auto import tqdm

from agentgym.io import replace_dir
from agentgym.retrieval.base import Hit

__all__ = [
    "BACKENDS",
    "LUCENE_ENGLISH_STOP_WORDS",
    "BM25Index",
    "BM25Retriever",
    "lucene_float_scores",
    "lucene_tokenize",
    "porter_stem",
]

BACKENDS = ("bm25s", "pyserini", "auto")
META_FILE = "agentgym_bm25.json"
FORMAT_VERSION = 1
# rank of each row in the order of the documents' ids (int32/int64 ``(n_docs,)``); absent when the
# index was built without ids (ties then go by row)
ID_RANK_FILE = "id_rank.npy"
# bm25s builds analyse and count this many raw tokens at a time (bounds the build's memory)
_BLOCK_TOKENS = 2_000_000
# distinct raw query tokens remembered (with their analysis) before the cache starts over
_QUERY_CACHE_LIMIT = 200_000

# ---------------------------------------------------------------------------------------------
# The analyzer: Anserini's DefaultEnglishAnalyzer, i.e. StandardTokenizer -> EnglishPossessive
# -> LowerCase -> Stop(Lucene English set) -> PorterStem.
# ---------------------------------------------------------------------------------------------

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
LUCENE_ENGLISH_STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)

# Word-break classes of Unicode UAX#29 (the regex module's Word_Break property), as Lucene's
# StandardTokenizer (JFlex) applies them. WB4: format/extend characters cling to what precedes.
_EXT = r"\p{WB=Extend}\p{WB=Format}\p{WB=ZWJ}"
_ALETTER = r"[\p{WB=ALetter}\p{WB=Hebrew_Letter}--\p{Han}--\p{Hiragana}]"
_NUMERIC = r"\p{WB=Numeric}"
_EXTEND_NUM_LET = r"\p{WB=ExtendNumLet}"  # "_" and other connectors join anything
_MID_LETTER = r"[\p{WB=MidLetter}\p{WB=MidNumLet}\p{WB=Single_Quote}]"  # "can't", "u.s.a"
_MID_NUM = r"[\p{WB=MidNum}\p{WB=MidNumLet}\p{WB=Single_Quote}]"  # "3.14", "1,000"
_ALNUM = rf"[{_ALETTER}{_NUMERIC}]"
_ALNUM_EXT = rf"[{_ALETTER}{_NUMERIC}{_EXT}]"
# Letters/digits, with a mid-letter mark kept only between two letters (WB6/7: "can't", "u.s.a")
# and a mid-number mark only between two digits (WB11/12: "3.14", "1,000").
_ALNUM_RUN = (
    rf"{_ALNUM}{_ALNUM_EXT}*"
    rf"(?:(?<={_ALETTER}[{_EXT}]*){_MID_LETTER}(?=[{_EXT}]*{_ALETTER}){_ALNUM_EXT}+"
    rf"|(?<={_NUMERIC}[{_EXT}]*){_MID_NUM}(?=[{_EXT}]*{_NUMERIC}){_ALNUM_EXT}+)*"
)
_KATAKANA_RUN = rf"\p{{WB=Katakana}}[\p{{WB=Katakana}}{_EXT}]*"
_CONNECTOR_RUN = rf"[{_EXTEND_NUM_LET}][{_EXTEND_NUM_LET}{_EXT}]*"
# A word: letter/digit runs and katakana runs, glued by connectors (WB13a/b: "foo_bar", "ア_b");
# connectors alone make no word.
_WORD = (
    rf"(?:{_CONNECTOR_RUN})?(?:{_ALNUM_RUN}|{_KATAKANA_RUN})"
    rf"(?:{_CONNECTOR_RUN}(?:{_ALNUM_RUN}|{_KATAKANA_RUN})?)*"
)
# Unicode's Extended_Pictographic (emoji-data.txt; the regex module's own table is incomplete):
# Lucene emits each pictograph (with its variation selector / skin tone / ZWJ sequence) as a token.
_PICTOGRAPHIC = (
    "\u00a9\u00ae\u203c\u2049\u2122\u2139\u2194-\u2199\u21a9\u21aa\u231a\u231b\u2328\u2388"
    "\u23cf\u23e9-\u23f3\u23f8-\u23fa\u24c2\u25aa\u25ab\u25b6\u25c0\u25fb-\u25fe\u2600-\u2605"
    "\u2607-\u2612\u2614-\u2685\u2690-\u2705\u2708-\u2712\u2714\u2716\u271d\u2721\u2728"
    "\u2733\u2734\u2744\u2747\u274c\u274e\u2753-\u2755\u2757\u2763-\u2767\u2795-\u2797"
    "\u27a1\u27b0\u27bf\u2934\u2935\u2b05-\u2b07\u2b1b\u2b1c\u2b50\u2b55\u3030\u303d\u3297"
    "\u3299\U0001f000-\U0001f0ff\U0001f10d-\U0001f10f\U0001f12f\U0001f16c-\U0001f171"
    "\U0001f17e\U0001f17f\U0001f18e\U0001f191-\U0001f19a\U0001f1ad-\U0001f1e5"
    "\U0001f201-\U0001f20f\U0001f21a\U0001f22f\U0001f232-\U0001f23a\U0001f23c-\U0001f23f"
    "\U0001f249-\U0001f3fa\U0001f400-\U0001f53d\U0001f546-\U0001f64f\U0001f680-\U0001f6ff"
    "\U0001f774-\U0001f77f\U0001f7d5-\U0001f7ff\U0001f80c-\U0001f80f\U0001f848-\U0001f84f"
    "\U0001f85a-\U0001f85f\U0001f888-\U0001f88f\U0001f8ae-\U0001f8ff\U0001f90c-\U0001f93a"
    "\U0001f93c-\U0001f945\U0001f947-\U0001faff\U0001fc00-\U0001fffd"
)
# Skin-tone modifiers stand alone as tokens too; after a character they cling to it (Extend).
_EMOJI_BASE = f"[{_PICTOGRAPHIC}\U0001f3fb-\U0001f3ff]"
_EMOJI = (
    # a pictograph, its selector/skin tone/format characters, ZWJ-joined pictographs, and any
    # trailing format characters (a ZWJ that joins nothing included)
    rf"\u200d*{_EMOJI_BASE}[\p{{WB=Extend}}\p{{WB=Format}}]*"
    rf"(?:\u200d{_EMOJI_BASE}[\p{{WB=Extend}}\p{{WB=Format}}]*)*[{_EXT}]*"
    r"|[#*0-9]\ufe0f?\u20e3"  # keycaps
    r"|[\U0001f1e6-\U0001f1ff]{2}"  # flags: regional-indicator pairs
)
_TOKEN_RE = regex.compile(
    rf"{_EMOJI}"
    rf"|{_WORD}"
    rf"|[\p{{Han}}\p{{Hiragana}}][{_EXT}]*"  # ideographs, hiragana: one token per character
    r"|\p{LB=SA}+",  # South-East Asian scripts (Thai, Lao, ...): whole runs, no dictionary
    flags=regex.V1,
)
# Java's Character.toLowerCase maps code points one to one; str.lower() does not for these.
_JAVA_LOWER_FIX = str.maketrans({"\u0130": "i", "\u03a3": "\u03c3"})
_POSSESSIVE_SUFFIXES = ("'s", "\u2019s", "\uff07s")
# StandardTokenizer cuts longer words into pieces of this many characters.
_MAX_TOKEN_LENGTH = 255


# The same rules restricted to ASCII, for the stdlib engine (several times faster than the full
# Unicode pattern): in ASCII, letters are [a-z] once lower-cased, digits [0-9], "_" the connector,
# ":" / "." / "'" join letters and "," / ";" / "." / "'" join digits.
_ASCII_TOKEN_RE = re.compile(
    r"_*[a-z0-9]\w*(?:(?<=[a-z])[:.'](?=[a-z])\w+|(?<=[0-9])[,;.'](?=[0-9])\w+)*", re.ASCII
)
# Whitespace always breaks words, so a text splits into whitespace-delimited runs that hold
# non-ASCII characters (full pattern) and the ASCII stretches between them (fast pattern).
_NON_ASCII_RUN = re.compile(r"(\S*[^\x00-\x7f]\S*)")


def _raw_tokens(text: str) -> list[str]:
    """Lower-cased StandardTokenizer tokens of ``text`` (before possessive/stop/stem)."""
    if text.isascii():
        tokens = _ASCII_TOKEN_RE.findall(text.lower())
    else:
        text = text.translate(_JAVA_LOWER_FIX).lower()
        tokens = []
        for i, part in enumerate(_NON_ASCII_RUN.split(text)):
            if part:
                tokens += (_TOKEN_RE if i % 2 else _ASCII_TOKEN_RE).findall(part)
    if tokens and max(map(len, tokens)) > _MAX_TOKEN_LENGTH:
        tokens = [
            t[i : i + _MAX_TOKEN_LENGTH]
            for t in tokens
            for i in range(0, len(t), _MAX_TOKEN_LENGTH)
        ]
    return tokens


# Lucene's PorterStemmer is Porter's reference implementation (release 3), which departs from the
# published algorithm (and from Snowball's "porter", e.g. PyStemmer) in step 2: "-bli" -> "-ble"
# (not "-abli" -> "-able") and "-logi" -> "-log". So "technology" -> "technolog" here, as in
# Lucene, where Snowball gives "technologi". This transcription matches Lucene on ~99k words.
_VOWELS = frozenset("aeiou")


def porter_stem(word: str) -> str:
    """Stem one lower-cased word; words of 1-2 characters are returned unchanged."""
    if len(word) <= 2:
        return word
    b = list(word)
    k = len(b) - 1  # last index of the current word
    j = 0  # end of the stem, set by ends()

    def cons(i: int) -> bool:
        ch = b[i]
        if ch in _VOWELS:
            return False
        if ch == "y":
            return True if i == 0 else not cons(i - 1)
        return True

    def measure() -> int:  # number of VC sequences in b[0..j]
        n, i = 0, 0
        while True:
            if i > j:
                return n
            if not cons(i):
                break
            i += 1
        i += 1
        while True:
            while True:
                if i > j:
                    return n
                if cons(i):
                    break
                i += 1
            i += 1
            n += 1
            while True:
                if i > j:
                    return n
                if not cons(i):
                    break
                i += 1
            i += 1

    def vowel_in_stem() -> bool:
        return any(not cons(i) for i in range(j + 1))

    def double_cons(i: int) -> bool:
        return i >= 1 and b[i] == b[i - 1] and cons(i)

    def cvc(i: int) -> bool:
        if i < 2 or not cons(i) or cons(i - 1) or not cons(i - 2):
            return False
        return b[i] not in "wxy"

    def ends(s: str) -> bool:
        nonlocal j
        n = len(s)
        if n > k + 1 or "".join(b[k - n + 1 : k + 1]) != s:
            return False
        j = k - n
        return True

    def set_to(s: str) -> None:
        nonlocal k
        b[j + 1 :] = list(s)
        k = j + len(s)

    def replace_if_measured(s: str) -> None:
        if measure() > 0:
            set_to(s)

    # step 1a/1b: plurals, -ed, -ing
    if b[k] == "s":
        if ends("sses"):
            k -= 2
        elif ends("ies"):
            set_to("i")
        elif b[k - 1] != "s":
            k -= 1
    if ends("eed"):
        if measure() > 0:
            k -= 1
    elif (ends("ed") or ends("ing")) and vowel_in_stem():
        k = j
        if ends("at"):
            set_to("ate")
        elif ends("bl"):
            set_to("ble")
        elif ends("iz"):
            set_to("ize")
        elif double_cons(k):
            if b[k] not in "lsz":
                k -= 1
        elif measure() == 1 and cvc(k):
            set_to("e")
    # step 1c: terminal y -> i when the stem has a vowel
    if ends("y") and vowel_in_stem():
        b[k] = "i"
    # step 2: double suffixes -> single ones
    if k != 0:
        for suffix, repl in _STEP2.get(b[k - 1], ()):
            if ends(suffix):
                replace_if_measured(repl)
                break
    # step 3: -ic-, -full, -ness
    for suffix, repl in _STEP3.get(b[k], ()):
        if ends(suffix):
            replace_if_measured(repl)
            break
    # step 4: -ant, -ence, ... when m > 1
    if k != 0:
        for suffix in _STEP4.get(b[k - 1], ()):
            if ends(suffix):
                if suffix == "ion" and not (j >= 0 and b[j] in "st"):
                    continue
                if measure() > 1:
                    k = j
                break
    # step 5: final -e, -ll
    j = k
    if b[k] == "e":
        m = measure()
        if m > 1 or (m == 1 and not cvc(k - 1)):
            k -= 1
    if b[k] == "l" and double_cons(k) and measure() > 1:
        k -= 1
    return "".join(b[: k + 1])


# Keyed by the penultimate (step 2, 4) or last (step 3) letter, tried in order.
_STEP2 = {
    "a": (("ational", "ate"), ("tional", "tion")),
    "c": (("enci", "ence"), ("anci", "ance")),
    "e": (("izer", "ize"),),
    "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous")),
    "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
    "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous")),
    "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
    "g": (("logi", "log"),),
}
_STEP3 = {
    "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
    "i": (("iciti", "ic"),),
    "l": (("ical", "ic"), ("ful", "")),
    "s": (("ness", ""),),
}
_STEP4 = {
    "a": ("al",),
    "c": ("ance", "ence"),
    "e": ("er",),
    "i": ("ic",),
    "l": ("able", "ible"),
    "n": ("ant", "ement", "ment", "ent"),
    "o": ("ion", "ou"),
    "s": ("ism",),
    "t": ("ate", "iti"),
    "u": ("ous",),
    "v": ("ive",),
    "z": ("ize",),
}


def _terms_of_raw(raw: Sequence[str]) -> list[str | None]:
    """Map lower-cased raw tokens to index terms; ``None`` for stop words."""
    out: list[str | None] = []
    for token in raw:
        if token.endswith(_POSSESSIVE_SUFFIXES):
            token = token[:-2]
        out.append(None if token in LUCENE_ENGLISH_STOP_WORDS else porter_stem(token))
    return out


def lucene_tokenize(text: str) -> list[str]:
    """The terms Anserini's ``DefaultEnglishAnalyzer`` makes of ``text``, in order.

    Lucene's ``StandardTokenizer`` (UAX#29 word breaks; tokens cut at 255 characters), English
    possessive removal, lower-casing (per code point, as Java), Lucene's 33 English stop words,
    then the Porter stemmer. Both BM25 backends index and search these terms.
    """
    return [t for t in _terms_of_raw(_raw_tokens(text)) if t is not None]


class _Vocabulary:
    """Raw token -> term id, with each distinct raw token analysed once (the hot path's cache)."""

    def __init__(self) -> None:
        self.term_ids: dict[str, int] = {}  # stemmed term -> column
        self._raw_ids: dict[str, int] = {}  # raw token -> slot in _raw_to_term
        self._raw_to_term = np.empty(1024, dtype=np.int64)  # slot -> term id, -1 = stop word
        # searches from several threads (a server's thread pool) extend the cache together
        self._lock = threading.Lock()

    def encode(self, raw_tokens: list[str], *, grow: bool) -> np.ndarray:
        """Term ids of ``raw_tokens``; unknown terms (``grow=False``) and stop words are -1."""
        with self._lock:
            if not grow and len(self._raw_ids) > _QUERY_CACHE_LIMIT:
                # queries must not grow the cache without bound in a long-lived server
                self._raw_ids = {}
            return self._encode(raw_tokens, grow=grow)

    def _encode(self, raw_tokens: list[str], *, grow: bool) -> np.ndarray:
        raw_ids = self._raw_ids
        # distinct new tokens in first-seen order (deterministic ids), found at C speed
        new_raw = [t for t in dict.fromkeys(raw_tokens) if t not in raw_ids]
        if new_raw:
            first, end = len(raw_ids), len(raw_ids) + len(new_raw)
            raw_ids.update(zip(new_raw, range(first, end), strict=True))
            if end > len(self._raw_to_term):  # grow by doubling: amortised O(1) per token
                grown = np.empty(max(end, 2 * len(self._raw_to_term)), dtype=np.int64)
                grown[:first] = self._raw_to_term[:first]
                self._raw_to_term = grown
            mapped = self._raw_to_term[first:end]
            mapped.fill(-1)
            for j, term in enumerate(_terms_of_raw(new_raw)):
                if term is None:
                    continue
                tid = self.term_ids.get(term)
                if tid is None and grow:
                    tid = self.term_ids[term] = len(self.term_ids)
                if tid is not None:
                    mapped[j] = tid
        ids = np.fromiter(
            map(raw_ids.__getitem__, raw_tokens), dtype=np.int64, count=len(raw_tokens)
        )
        return self._raw_to_term[ids]


# ---------------------------------------------------------------------------------------------
# Lucene's scoring arithmetic
# ---------------------------------------------------------------------------------------------


def _int_to_byte4(lengths: np.ndarray) -> np.ndarray:
    """Lucene ``SmallFloat.intToByte4``: lengths -> one-byte norms (exact below 24)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    free = 24  # NUM_FREE_VALUES = 255 - longToInt4(Integer.MAX_VALUE)
    x = np.maximum(lengths - free, 0)
    num_bits = np.frexp(x.astype(np.float64))[1].astype(np.int64)  # bit length, exact below 2**53
    shift = np.maximum(num_bits - 4, 0)
    normal = ((x >> shift) & 0x07) | ((shift + 1) << 3)
    int4 = np.where(num_bits < 4, x, normal)
    return np.where(lengths < free, lengths, free + int4).astype(np.uint8)


def _byte4_to_int(norms: np.ndarray) -> np.ndarray:
    """Lucene ``SmallFloat.byte4ToInt``: the length a one-byte norm stands for."""
    i = np.asarray(norms, dtype=np.int64)
    free = 24
    j = np.maximum(i - free, 0)
    bits, shift = j & 0x07, (j >> 3) - 1
    decoded = np.where(shift < 0, bits, (bits | 0x08) << np.maximum(shift, 0))
    return np.where(i < free, i, free + decoded)


_LENGTH_TABLE = _byte4_to_int(np.arange(256))


def _lucene_idf(doc_freq: np.ndarray, doc_count: int) -> np.ndarray:
    """``(float) Math.log(1 + (docCount - docFreq + 0.5) / (docFreq + 0.5))``, float32."""
    df = doc_freq.astype(np.float64)
    return np.log(1.0 + (doc_count - df + 0.5) / (df + 0.5)).astype(np.float32)


def _lucene_norm_inverse(k1: float, b: float, avgdl: np.float32) -> np.ndarray:
    """Lucene's per-norm cache ``1f / (k1 * ((1 - b) + b * LENGTH_TABLE[i] / avgdl))``, float32."""
    f32 = np.float32
    k1, b = f32(k1), f32(b)
    length = _LENGTH_TABLE.astype(np.float32)
    return (f32(1) / (k1 * ((f32(1) - b) + b * length / avgdl))).astype(np.float32)


def _lucene_term_scores(idf: np.ndarray, freq: np.ndarray, norm_inverse: np.ndarray) -> np.ndarray:
    """``weight - weight / (1f + freq * normInverse)`` in float32 (BM25Scorer.score)."""
    f32 = np.float32
    return idf - idf / (f32(1) + freq.astype(np.float32) * norm_inverse)


# ---------------------------------------------------------------------------------------------
# The index
# ---------------------------------------------------------------------------------------------


def _resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown BM25 backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return "bm25s" if backend == "auto" else backend


def _empty_results(n_queries: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.full((n_queries, k), -1, dtype=np.int64),
        np.full((n_queries, k), -np.inf, dtype=np.float32),
    )


def id_rank(ids: Iterable[str]) -> np.ndarray:
    """Each row's position in Anserini's tie order of ``ids``: ``(len(ids),)`` int32 (int64 past
    2**31 rows), a permutation of ``0..n-1``.

    Lucene compares ids as UTF-8 bytes, unsigned (``BytesRef``), which is code point order; rows
    with equal ids keep their row order (Lucene's next key, its internal doc id, follows the
    order documents were added in). One vectorised sort of the encoded ids.
    """
    encoded = [_java_safe(str(i)).encode("utf-8") for i in ids]
    # NumPy's fixed-width bytes compare as unsigned bytes, but ignore trailing NUL bytes: ids that
    # end in "\x00" (never seen in practice) would tie with their stripped form
    keys = np.array(encoded, dtype=bytes) if encoded else np.zeros(0, dtype="S1")
    order = np.argsort(keys, kind="stable")
    rank = np.empty(len(order), dtype=np.int32 if len(order) < 2**31 else np.int64)
    rank[order] = np.arange(len(order), dtype=rank.dtype)
    return rank


class BM25Index:
    """BM25 over a list of texts; row i is the i-th text.

    Build with :meth:`build`, persist with :meth:`save` / :meth:`load`, query with :meth:`search`.
    Both backends score with Lucene's BM25 (see the module docstring) and return the same rows.
    """

    backend: str
    k1: float
    b: float
    path: Path | None
    """the directory the index was opened from (pyserini: always; bm25s: when loaded)"""

    def __init__(self, *, backend: str, k1: float, b: float, n_docs: int) -> None:
        self.backend = backend
        self.k1 = float(k1)
        self.b = float(b)
        self._n_docs = int(n_docs)
        self._bm25: Any = None  # bm25s.BM25 holding the per-term score matrix
        self._vocab: _Vocabulary | None = None
        self._lucene: Any = None  # pyserini backend state
        # row -> rank in the order of the documents' ids (ties), None: by row
        self._id_rank: np.ndarray | None = None
        self._lucene_rows: np.ndarray | None = None  # pyserini: Lucene id (a rank) -> row
        self.path: Path | None = None
        self.pruning: bool = True
        """bm25s: find the top k with compiled block-max MaxScore (:mod:`.pruned`) when numba is
        installed; ``False`` scores every posting with numpy. Both return the same results."""
        self._pruned: Any = None  # the compiled search's arrays, made on the first search
        self._pruned_lock = threading.Lock()

    def __len__(self) -> int:
        return self._n_docs

    def __repr__(self) -> str:
        return f"BM25Index(backend={self.backend!r}, docs={len(self)}, k1={self.k1}, b={self.b})"

    @property
    def ties_by_id(self) -> bool:
        """Whether equal scores are ordered by the documents' ids (built with ``ids``), not rows."""
        return self._id_rank is not None

    def _set_id_rank(self, rank: np.ndarray | None) -> None:
        if rank is not None and len(rank) != len(self):
            raise ValueError(
                f"{len(rank)} ids were given for {len(self)} texts; pass one id per text"
            )
        self._id_rank = rank

    # -- building ---------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        *,
        backend: str = "bm25s",
        k1: float = 0.9,
        b: float = 0.4,
        path: str | Path | None = None,
        show_progress: bool = False,
        ids: Iterable[str] | None = None,
    ) -> BM25Index:
        """Index ``texts`` (row i = i-th text) with the given backend.

        ``path``: where to write the index (saved atomically); required for ``"pyserini"``
        (Lucene indexes live on disk), optional for ``"bm25s"`` (kept in memory otherwise).
        ``show_progress`` shows a tqdm bar over the texts. ``ids``: the documents' ids, one per
        text (converted with ``str``); equal scores then come in Anserini's order of these ids
        (see the module docstring), else in row order.
        """
        backend = _resolve_backend(backend)
        rank = id_rank(ids) if ids is not None else None
        if backend == "pyserini":
            if path is None:
                raise ValueError(
                    "the pyserini backend writes a Lucene index to disk: pass path=DIR to "
                    "BM25Index.build, or use backend='bm25s' for an in-memory index"
                )
            return _lucene_build(
                cls, texts, k1=k1, b=b, path=Path(path), show_progress=show_progress, rank=rank
            )
        index = cls._build_bm25s(texts, k1=k1, b=b, show_progress=show_progress)
        index._set_id_rank(rank)
        if path is not None:
            index.save(path)
        return index

    @classmethod
    def _build_bm25s(
        cls,
        texts: Iterable[str],
        *,
        k1: float,
        b: float,
        show_progress: bool,
        exact_lengths: bool = False,
    ) -> BM25Index:
        """The bm25s backend. ``exact_lengths=True`` skips Lucene's one-byte length rounding
        (textbook BM25; only for measuring what the rounding changes)."""
        import bm25s

        vocab = _Vocabulary()
        block_pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (term, doc, freq)
        block_lengths: list[np.ndarray] = []
        raw_buffer: list[str] = []
        lengths: list[int] = []  # raw tokens per text of the current block
        n_docs = 0
        total = len(texts) if hasattr(texts, "__len__") else None
        bar = tqdm(
            texts,
            total=total,
            desc="BM25 index",
            unit="doc",
            disable=not show_progress,
            mininterval=0.5,
        )

        def flush() -> None:
            # Analyse the block's tokens (distinct raw tokens once), then count (term, doc)
            # pairs with array ops; only the compact pairs outlive the block.
            nonlocal raw_buffer, lengths
            first_doc = n_docs - len(lengths)
            term_ids = vocab.encode(raw_buffer, grow=True)
            local_doc = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
            keep = term_ids >= 0  # drop stop words
            term_ids, local_doc = term_ids[keep], local_doc[keep]
            block_lengths.append(np.bincount(local_doc, minlength=len(lengths)))
            pair, freq = np.unique(term_ids * len(lengths) + local_doc, return_counts=True)
            pair_term, pair_doc = np.divmod(pair, max(len(lengths), 1))
            block_pairs.append(
                (pair_term.astype(np.int32), pair_doc + first_doc, freq.astype(np.int32))
            )
            raw_buffer, lengths = [], []

        for text in bar:
            if not isinstance(text, str):
                raise TypeError(f"BM25Index.build takes strings; row {n_docs} is {type(text)}")
            raw = _raw_tokens(text)
            raw_buffer += raw
            lengths.append(len(raw))
            n_docs += 1
            if len(raw_buffer) >= _BLOCK_TOKENS:
                flush()
        flush()
        bar.close()

        n_terms = len(vocab.term_ids)
        doc_len = np.concatenate(block_lengths)
        pair_term = np.concatenate([p[0] for p in block_pairs])
        pair_doc = np.concatenate([p[1] for p in block_pairs])
        freq = np.concatenate([p[2] for p in block_pairs])
        block_pairs.clear()
        # CSC order (by term, then doc): blocks come in doc order, so a stable sort by term does it
        if len(block_lengths) > 1:
            order = np.argsort(pair_term, kind="stable")
            pair_term, pair_doc, freq = pair_term[order], pair_doc[order], freq[order]
            del order
        doc_freq = np.bincount(pair_term, minlength=n_terms)

        # Lucene's collection statistics count only documents that have the field (>= 1 term)
        doc_count = int(np.count_nonzero(doc_len))
        avgdl = np.float32(doc_len.sum() / doc_count) if doc_count else np.float32(1)
        norm_inverse = _lucene_norm_inverse(k1, b, avgdl)
        idf = _lucene_idf(doc_freq, doc_count)
        if exact_lengths:
            f32 = np.float32
            length = doc_len[pair_doc].astype(np.float32)
            doc_norm_inverse = f32(1) / (f32(k1) * ((f32(1) - f32(b)) + f32(b) * length / avgdl))
        else:
            doc_norm_inverse = norm_inverse[_int_to_byte4(doc_len)[pair_doc]]
        data = _lucene_term_scores(idf[pair_term], freq, doc_norm_inverse)
        indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(doc_freq, out=indptr[1:])

        bm25 = bm25s.BM25(k1=k1, b=b, method="lucene", idf_method="lucene")
        bm25.scores = {
            "data": data.astype(np.float32),
            "indices": pair_doc.astype(np.int32 if n_docs < 2**31 else np.int64),
            "indptr": indptr,
            "num_docs": n_docs,
        }
        bm25.vocab_dict = vocab.term_ids
        bm25.unique_token_ids_set = set(vocab.term_ids.values())
        bm25.nonoccurrence_array = None

        index = cls(backend="bm25s", k1=k1, b=b, n_docs=n_docs)
        index._bm25, index._vocab = bm25, vocab
        return index

    # -- persistence ------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write the index to directory ``path`` (a temp dir first, then ``os.replace``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            if self.backend == "bm25s":
                self._bm25.save(tmp, show_progress=False)
                if self._id_rank is not None:
                    np.save(tmp / ID_RANK_FILE, np.asarray(self._id_rank))
            else:
                if self.path is None or self.path.resolve() == path.resolve():
                    shutil.rmtree(tmp)
                    return
                shutil.rmtree(tmp)
                shutil.copytree(self.path, tmp)
            meta = {
                "format": FORMAT_VERSION,
                "backend": self.backend,
                "k1": self.k1,
                "b": self.b,
                "n_docs": len(self),
            }
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
            replace_dir(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, path: str | Path, mmap: bool = True) -> BM25Index:
        """Open an index written by :meth:`save` or :meth:`build`; the backend comes from its meta.

        ``mmap=True`` memory-maps the bm25s score arrays (read-only, shared by every process that
        maps the same files) instead of reading them into memory.
        """
        path = Path(path)
        meta_path = path / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"no BM25 index at {path} (missing {META_FILE}); build one with "
                "BM25Index.build(texts, path=...)"
            )
        meta = json.loads(meta_path.read_text())
        backend = meta["backend"]
        index = cls(backend=backend, k1=meta["k1"], b=meta["b"], n_docs=meta["n_docs"])
        if (path / ID_RANK_FILE).is_file():
            index._set_id_rank(np.load(path / ID_RANK_FILE, mmap_mode="r" if mmap else None))
        if backend == "pyserini":
            _lucene_open(index, path)
            return index
        import bm25s

        bm25 = bm25s.BM25.load(path, mmap=mmap, load_corpus=False, show_progress=False)
        bm25.scores["num_docs"] = meta["n_docs"]
        vocab = _Vocabulary()
        vocab.term_ids = dict(bm25.vocab_dict)
        index._bm25, index._vocab, index.path = bm25, vocab, path
        return index

    # -- search -----------------------------------------------------------------------------

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows and scores of every query, in one call.

        Returns ``rows`` ``(len(queries), k)`` int64, best first, padded with -1, and ``scores``
        ``(len(queries), k)`` float32, padded with -inf. Only documents sharing a term with the
        query are returned; an empty or all-stop-word query returns padding only.
        """
        if isinstance(queries, str):
            raise TypeError("BM25Index.search takes a sequence of queries; wrap one in a list")
        k = int(k)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if self.backend == "pyserini":
            return _lucene_search(self, queries, k)
        return self._search_bm25s(queries, k)

    def _query_terms(self, queries: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query: its distinct known term ids and their counts (pyserini's clause boosts)."""
        assert self._vocab is not None
        raw = [_raw_tokens(q if isinstance(q, str) else str(q)) for q in queries]
        bounds = np.zeros(len(raw) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in raw], out=bounds[1:])
        term_ids = self._vocab.encode([t for r in raw for t in r], grow=False)
        out = []
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            ids = term_ids[lo:hi]
            out.append(np.unique(ids[ids >= 0], return_counts=True))
        return out

    def _search_bm25s(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        from agentgym.retrieval import pruned

        if self.pruning and pruned.warm_up():  # numpy until the kernels are compiled
            return self._search_pruned(queries, k)
        return self._search_exhaustive(queries, k)

    def _search_pruned(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top k by block-max MaxScore in compiled code: one call for the whole batch."""
        from agentgym.retrieval.pruned import PrunedIndex

        assert self._vocab is not None
        if self._pruned is None:
            with self._pruned_lock:  # once per index, on the first search
                if self._pruned is None:
                    s = self._bm25.scores
                    self._pruned = PrunedIndex(
                        s["data"], s["indices"], s["indptr"], self._id_rank, len(self)
                    )
        raw = [_raw_tokens(q if isinstance(q, str) else str(q)) for q in queries]
        query_ptr = np.fromiter(
            itertools.accumulate(map(len, raw), initial=0), dtype=np.int64, count=len(raw) + 1
        )
        term_ids = self._vocab.encode([t for r in raw for t in r], grow=False)
        return self._pruned.search(query_ptr, term_ids, k)

    def _search_exhaustive(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top k by scoring every posting of the query's terms with numpy."""
        rows, scores = _empty_results(len(queries), k)
        if not len(queries) or not len(self):
            return rows, scores
        s = self._bm25.scores
        data, indices, indptr = s["data"], s["indices"], s["indptr"]
        n_docs = len(self)
        for qi, (term_ids, counts) in enumerate(self._query_terms(queries)):
            if not len(term_ids):
                continue
            starts, ends = indptr[term_ids], indptr[term_ids + 1]
            n_postings = int((ends - starts).sum())
            if n_postings == 0:
                continue
            # one posting list per query term (a column of the docs x terms score matrix),
            # weighted by the term's count; float64 sums of float32 terms, as Lucene sums clauses
            docs = np.concatenate([indices[a:z] for a, z in zip(starts, ends, strict=True)])
            vals = np.concatenate(
                [data[a:z] * float(c) for a, z, c in zip(starts, ends, counts, strict=True)],
                dtype=np.float64,
            )
            if len(term_ids) > 1 and n_postings * 8 > n_docs:
                # dense accumulator, O(postings + docs): select the top k on it directly
                acc = np.bincount(docs, weights=vals, minlength=n_docs).astype(np.float32)
                kth = acc[np.argpartition(acc, n_docs - k)[n_docs - k :]].min() if n_docs > k else 0
                # every document tied with the k-th score, so that ties resolve by id below
                # (comparing first: flatnonzero of a bool mask is ~15x faster than of floats)
                docs = np.flatnonzero(acc >= kth) if kth > 0 else np.flatnonzero(acc > 0)
                vals = acc[docs]
            elif len(term_ids) > 1:  # few postings: sort them instead of touching every document
                docs, inverse = np.unique(docs, return_inverse=True)
                vals = np.bincount(inverse, weights=vals, minlength=len(docs))
            vals = vals.astype(np.float32)
            if len(vals) > k:
                # keep everything tied with the k-th score so that ties resolve by id below
                kth = np.partition(vals, len(vals) - k)[len(vals) - k]
                keep = vals >= kth
                docs, vals = docs[keep], vals[keep]
            # score descending, then Anserini's id order (the row when built without ids)
            tie = docs if self._id_rank is None else self._id_rank[docs]
            order = np.lexsort((tie, -vals))[:k]
            rows[qi, : len(order)] = docs[order]
            scores[qi, : len(order)] = vals[order]
        return rows, scores

    def close(self) -> None:
        """Release the backend's resources (the pyserini searcher; bm25s arrays are freed by GC)."""
        if self._lucene is not None:
            close = getattr(self._lucene, "close", None)
            if close is not None:
                close()
            self._lucene = None


class BM25Retriever:
    """A :class:`~agentgym.retrieval.base.Retriever` over a BM25 index and its documents.

    ``documents`` is any sequence of records (a list, or an on-disk store with ``__getitem__``
    and ``__len__``), row-aligned with ``index``; a hit's ``doc_id`` is ``str(doc[id_field])``.
    Equal scores come in Anserini's order of those ids when ``index`` was built with them
    (:meth:`from_documents` and ``agentgym retrieval index`` do so), else in row order.
    """

    def __init__(self, index: BM25Index, documents: Sequence[dict], id_field: str = "id") -> None:
        if len(documents) != len(index):
            raise ValueError(
                f"the index has {len(index)} rows but {len(documents)} documents were given; "
                "pass the documents the index was built from, in the same order"
            )
        self.index = index
        self.documents = documents
        self.id_field = id_field
        self._owned_dir: Path | None = None  # a temporary index directory that close() removes

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[dict],
        *,
        text_field: str = "contents",
        backend: str = "bm25s",
        k1: float = 0.9,
        b: float = 0.4,
        path: str | Path | None = None,
        show_progress: bool = False,
        id_field: str = "id",
    ) -> BM25Retriever:
        """Index ``doc[text_field]`` of every document and wrap the index as a retriever.

        ``path`` is where the index is written; a pyserini index without one goes to a temporary
        directory that :meth:`close` removes. Equal scores come in Anserini's order of
        ``str(doc[id_field])`` (see the module docstring).
        """
        backend = _resolve_backend(backend)
        owned = None
        if backend == "pyserini" and path is None:
            owned = Path(tempfile.mkdtemp(prefix="agentgym-bm25-lucene-"))
            path = owned / "index"
        texts = (str(doc[text_field]) for doc in documents)
        total = len(documents)

        class _Sized:  # gives the progress bar its total without materialising the texts
            def __len__(self) -> int:
                return total

            def __iter__(self):
                return texts

        try:
            index = BM25Index.build(
                _Sized(),
                backend=backend,
                k1=k1,
                b=b,
                path=path,
                show_progress=show_progress,
                ids=[str(doc[id_field]) for doc in documents],
            )
        except BaseException:
            if owned is not None:
                shutil.rmtree(owned, ignore_errors=True)
            raise
        retriever = cls(index, documents, id_field=id_field)
        retriever._owned_dir = owned
        return retriever

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        """Best-first hits of every query (fewer than ``topk`` when fewer documents match)."""
        if not len(queries):
            return []
        rows, scores = self.index.search(queries, topk)
        out: list[list[Hit]] = []
        for row_ids, row_scores in zip(rows.tolist(), scores.tolist(), strict=True):
            hits = []
            for r, s in zip(row_ids, row_scores, strict=True):
                if r < 0:
                    break
                doc = self.documents[r]
                hits.append(Hit(doc_id=str(doc[self.id_field]), score=float(s), document=doc))
            out.append(hits)
        return out

    def close(self) -> None:
        """Close the index (and remove the temporary index directory this retriever made)."""
        self.index.close()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None


# ---------------------------------------------------------------------------------------------
# The pyserini backend
# ---------------------------------------------------------------------------------------------


# Rows are stored as zero-padded ranks in id order: Anserini breaks score ties by the id string,
# which then orders ties as it would over the real ids (as the bm25s backend does).
_ID_WIDTH = 12
# Java's String.trim() strips code points <= U+0020; such documents are not indexed by Anserini.
_JAVA_BLANK = "".join(map(chr, range(33)))
LUCENE_SUBDIR = "lucene"


def _anserini(name: str) -> Any:
    """An Anserini/Java class through pyjnius, once a Java 21+ JVM runs (see agentgym.retrieval.java)."""
    from agentgym.retrieval.java import ensure_java

    ensure_java()
    from jnius import autoclass

    return autoclass(name)


def _java_safe(text: str) -> str:
    """``text`` without lone surrogates, which cannot cross into Java."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def _lucene_build(
    cls: type[BM25Index],
    texts: Iterable[str],
    *,
    k1: float,
    b: float,
    path: Path,
    show_progress: bool,
    rank: np.ndarray | None,
) -> BM25Index:
    """Index ``texts`` with Anserini's ``SimpleIndexer`` (pyserini's on-the-fly indexer).

    Same settings as ``python -m pyserini.index.lucene --collection JsonCollection`` with its
    defaults: ``DefaultEnglishAnalyzer`` (Porter, stop words removed) and the default document
    generator, one document ``{"id", "contents"}`` per text. The Lucene id of row r is its rank
    in id order (``rank[r]``, or r without ids), zero-padded: Lucene's own tie order on it is
    then Anserini's order of the real ids, and the id maps back to the row through an array.
    """
    indexer_cls = _anserini("io.anserini.index.SimpleIndexer")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        writer = indexer_cls(str(tmp / LUCENE_SUBDIR), False, 1)
        n_docs = 0
        total = len(texts) if hasattr(texts, "__len__") else None
        bar = tqdm(texts, total=total, desc="Lucene index", unit="doc", disable=not show_progress)
        try:
            for text in bar:
                if not isinstance(text, str):
                    raise TypeError(f"BM25Index.build takes strings; row {n_docs} is {type(text)}")
                if text.strip(_JAVA_BLANK):  # Anserini refuses (and logs) empty documents
                    lucene_id = n_docs if rank is None else int(rank[n_docs])
                    doc = {"id": f"{lucene_id:0{_ID_WIDTH}d}", "contents": _java_safe(text)}
                    writer.addRawDocument(json.dumps(doc))
                n_docs += 1
        finally:
            writer.close()
        if rank is not None:
            if len(rank) != n_docs:
                raise ValueError(
                    f"{len(rank)} ids were given for {n_docs} texts; pass one per text"
                )
            np.save(tmp / ID_RANK_FILE, rank)
        meta = {"format": FORMAT_VERSION, "backend": "pyserini", "k1": k1, "b": b, "n_docs": n_docs}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    index = cls(backend="pyserini", k1=k1, b=b, n_docs=n_docs)
    index._set_id_rank(rank)
    _lucene_open(index, path)
    return index


def _lucene_open(index: BM25Index, path: Path) -> None:
    """Open the Lucene index under ``path`` with Anserini's ``SimpleSearcher`` (what pyserini's
    ``LuceneSearcher`` wraps; used directly because importing ``pyserini.search`` pulls in
    pyserini's encoders and their optional dependencies)."""
    searcher = _anserini("io.anserini.search.SimpleSearcher")(str(path / LUCENE_SUBDIR))
    searcher.set_bm25(float(index.k1), float(index.b))
    index._lucene, index.path = searcher, path
    if index._id_rank is not None:  # Lucene ids are ranks: rank -> row
        index._lucene_rows = np.argsort(index._id_rank).astype(np.int64)


def lucene_float_scores(
    index: BM25Index, queries: Sequence[str], k: int = 10
) -> list[dict[int, float]]:
    """Lucene's own BM25 float scores of each query's top ``k``, before Anserini rounds them.

    For checking that another backend computes Lucene's arithmetic (not only its ranking):
    ``SimpleSearcher`` rounds scores to 1e-4, so this searches the index's Lucene folder with a
    plain ``IndexSearcher``, ``BM25Similarity(index.k1, index.b)``, Anserini's English analyzer
    and its bag-of-words query, as ``SimpleSearcher`` does.

    Args:
        index: an index built or loaded with ``backend="pyserini"``.
        queries: (Q,) query texts.
        k: hits per query.

    Returns:
        (Q,) dicts ``{row: score}`` of each query's hits (fewer than ``k`` where fewer match).
    """
    if index.backend != "pyserini" or index.path is None:
        raise ValueError(
            "lucene_float_scores reads a Lucene index: build it with backend='pyserini'"
        )
    directory = _anserini("org.apache.lucene.store.FSDirectory").open(
        _anserini("java.io.File")(str(index.path / LUCENE_SUBDIR)).toPath()
    )
    from jnius import cast

    reader = _anserini("org.apache.lucene.index.DirectoryReader").open(directory)
    try:
        searcher = _anserini("org.apache.lucene.search.IndexSearcher")(
            cast("org.apache.lucene.index.IndexReader", reader)
        )
        similarity = _anserini("org.apache.lucene.search.similarities.BM25Similarity")
        searcher.setSimilarity(similarity(float(index.k1), float(index.b)))
        analyzer = _anserini("io.anserini.analysis.DefaultEnglishAnalyzer").newDefaultInstance()
        generator = _anserini("io.anserini.search.query.BagOfWordsQueryGenerator")()
        stored = reader.storedFields()
        out = []
        for query in queries:
            built = generator.buildQuery("contents", analyzer, _java_safe(str(query)))
            top = searcher.search(built, k).scoreDocs
            out.append({int(stored.document(d.doc).get("id")): float(d.score) for d in top})
        return out
    finally:
        reader.close()


def _lucene_search(
    index: BM25Index, queries: Sequence[str], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Search with ``SimpleSearcher``: bag-of-words query, BM25, ties by Lucene id (the rank in
    id order), scores rounded to 1e-4 (with Anserini's 1e-6 nudges between tied scores)."""
    rows, scores = _empty_results(len(queries), k)
    if not len(queries):
        return rows, scores
    texts = [_java_safe(q if isinstance(q, str) else str(q)) for q in queries]
    # One search call per query: Anserini's batch_search (a fresh thread pool per batch) took
    # 4-8x longer per query than this loop on a 2-core machine, at 1k to 100k documents.
    results = [index._lucene.search(q, k) for q in texts]
    for i, hits in enumerate(results):
        for j, hit in enumerate(hits or ()):
            rows[i, j] = int(hit.docid)
            scores[i, j] = hit.score
    if index._lucene_rows is not None:
        rows = np.where(rows >= 0, index._lucene_rows[np.maximum(rows, 0)], -1)
    return rows, scores
