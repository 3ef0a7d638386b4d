"""Corpus reading (Search-R1's wiki-18 JSONL), title splitting, and the on-disk doc store."""

from __future__ import annotations

import gzip
import json
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agentgym.retrieval.corpus import (
    CorpusFormatError,
    DocStore,
    DocStoreWriter,
    count_records,
    iter_corpus,
    split_title,
)
from agentgym.retrieval.synthetic import synthetic_corpus, synthetic_queries, write_corpus


def test_importing_the_package_loads_no_heavy_module():
    code = (
        "import sys, agentgym.retrieval as r; r.open_retriever; r.DocStore; r.split_title; "
        "print(sorted(m for m in ('torch', 'faiss', 'sentence_transformers', 'transformers') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _search_r1_split(content: str) -> tuple[str, str]:
    # Search-R1's own expression (llm_agent/generation.py, _passages2string), as the reference
    return content.split("\n")[0], "\n".join(content.split("\n")[1:])


@pytest.mark.parametrize(
    "contents",
    ['"Hamlet"\nA tragedy by Shakespeare.', '"A"\nline one\nline two\n', '"No text"', "", "\n\n"],
)
def test_split_title_matches_search_r1(contents):
    assert split_title(contents) == _search_r1_split(contents)


def test_split_title_keeps_quotes():
    title, text = split_title('"Hamlet"\nA tragedy.')
    assert title == '"Hamlet"' and text == "A tragedy."


def test_iter_corpus_plain_and_gzip_agree(tmp_path):
    plain = write_corpus(tmp_path / "c.jsonl", 300, seed=3)
    packed = write_corpus(tmp_path / "c.jsonl.gz", 300, seed=3)
    assert gzip.open(packed).read() == plain.read_bytes()
    records = list(iter_corpus(plain))
    assert records == list(iter_corpus(packed)) == list(synthetic_corpus(300, seed=3))
    assert count_records(plain) == count_records(packed) == 300
    assert list(iter_corpus(plain, start=290)) == records[290:]


def test_iter_corpus_streams(tmp_path):
    # a generator: the first record arrives before a later malformed line is ever read
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "contents": "\\"T\\"\\nx"}\n{broken\n')
    it = iter_corpus(path)
    assert next(it)["id"] == "0"
    with pytest.raises(CorpusFormatError):
        next(it)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"id": "9"}', "lacks 'contents'"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"id": "0", "contents": '"T"\ntext'})
    path.write_text(f"{good}\n\n{good}\n{line}\n")  # the blank line still counts as a line
    with pytest.raises(CorpusFormatError, match=rf"bad\.jsonl:4: .*{message}"):
        list(iter_corpus(path))


def test_non_utf8_line_is_a_format_error(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "0", "contents": "caf\xe9"}\n')
    with pytest.raises(CorpusFormatError, match=r"latin1\.jsonl:1: "):
        list(iter_corpus(path))


def test_missing_corpus_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="JSONL file"):
        list(iter_corpus(tmp_path / "nope.jsonl"))


# ------------------------------------------------------------------------------------------------
# DocStore


@pytest.fixture(scope="module")
def records() -> list[dict]:
    recs = list(synthetic_corpus(1000, seed=1))
    recs[5] = {"id": "5", "contents": '"Ünïcødé ☃"\nnon-ASCII text, "quotes" and\nnewlines'}
    return recs


@pytest.fixture(scope="module")
def store(records, tmp_path_factory) -> DocStore:
    return DocStoreWriter.from_records(tmp_path_factory.mktemp("ds"), records, shard_size=128)


def test_docstore_rows_equal_records(store, records):
    assert len(store) == len(records)
    assert store.directory.joinpath("docs-00007.jsonl").is_file()  # 1000 / 128 -> 8 shards
    assert list(store) == records
    for row in (0, 5, 127, 128, 129, 999, -1, -1000):
        assert store[row] == records[row]
    assert store[10:300:7] == records[10:300:7]


def test_docstore_get_many_any_order(store, records):
    rng = random.Random(0)
    rows = [rng.randrange(len(records)) for _ in range(500)] + [0, 0, 999]
    assert store.get_many(rows) == [records[r] for r in rows]
    assert store.get_many(np.array(rows, dtype=np.int32)) == [records[r] for r in rows]
    assert store.get_many([]) == []


def test_docstore_out_of_range(store):
    with pytest.raises(IndexError, match="out of range"):
        store[1000]
    with pytest.raises(IndexError):
        store.get_many([3, -1001])
    with pytest.raises(TypeError):
        store["3"]


def test_docstore_is_a_sequence_and_pickles(store, records):
    from collections.abc import Sequence

    assert isinstance(store, Sequence)
    clone = pickle.loads(pickle.dumps(store))
    assert clone[999] == records[999] and len(pickle.dumps(store)) < 500
    assert store.index(records[17]) == 17  # Sequence mixins work over the store


def test_docstore_offsets_are_memory_mapped(store):
    assert isinstance(store._offsets, np.memmap)
    assert store._offsets.dtype == np.int64


def test_docstore_writer_resumes_after_last_whole_shard(tmp_path, records):
    directory = tmp_path / "ds"
    writer = DocStoreWriter(directory)
    writer.write_shard(records[:100])
    writer.write_shard(records[100:200])
    # a kill mid-way through shard 2 leaves at most a temporary file, never a finished shard
    (directory / ".docs-00002.jsonl.123.tmp").write_bytes(b'{"id": "half')
    resumed = DocStoreWriter(directory)
    assert (resumed.num_shards, resumed.num_docs) == (2, 200)
    resumed.write_shard(records[200:])
    store = resumed.close()
    assert list(store) == records
    with pytest.raises(FileExistsError, match="finished doc store"):
        DocStoreWriter(directory)


def test_docstore_without_manifest_says_how_to_build(tmp_path):
    with pytest.raises(FileNotFoundError, match="agentgym retrieval index"):
        DocStore(tmp_path)


def test_empty_store(tmp_path):
    store = DocStoreWriter.from_records(tmp_path / "ds", [])
    assert len(store) == 0 and list(store) == [] and store.get_many([]) == []


# ------------------------------------------------------------------------------------------------
# synthetic corpus


def test_synthetic_is_seeded_and_wiki18_shaped():
    a, b = list(synthetic_corpus(200, seed=7)), list(synthetic_corpus(200, seed=7))
    assert a == b and a != list(synthetic_corpus(200, seed=8))
    assert [r["id"] for r in a] == [str(i) for i in range(200)]
    titles = [split_title(r["contents"])[0] for r in a]
    assert all(t.startswith('"') and t.endswith('"') for t in titles)
    assert len(set(titles)) == 200  # distinct entities


def test_synthetic_queries_point_at_their_answer():
    records = list(synthetic_corpus(500, seed=2))
    queries = synthetic_queries(500, 50, seed=2)
    assert len({q["doc_id"] for q in queries}) == 50
    for q in queries:
        title, text = split_title(records[q["row"]]["contents"])
        assert q["doc_id"] == records[q["row"]]["id"]
        assert title.strip('"') in q["question"]
        assert q["answer"] in text


def test_write_corpus_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "c.jsonl"
    write_corpus(path, 10)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr("agentgym.retrieval.synthetic.json.dumps", boom)
    with pytest.raises(RuntimeError):
        write_corpus(path, 10, seed=5)
    assert path.read_bytes() == before
    assert [p.name for p in Path(tmp_path).iterdir()] == ["c.jsonl"]
