"""``agentgym retrieval index|serve`` run as a user runs them (real subprocesses)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym.retrieval.synthetic import synthetic_queries, write_corpus

ROOT = Path(__file__).resolve().parents[2]


def agentgym_cmd(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentgym.cli", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("cli") / "corpus.jsonl.gz", 400, seed=4)


def test_index_then_refuse_then_force(corpus, tmp_path):
    out = tmp_path / "idx"
    args = ["retrieval", "index", "--corpus", str(corpus), "--kind", "bm25", "--out", str(out)]
    first = agentgym_cmd(*args, "--shard-size", "150")
    assert first.returncode == 0, first.stderr
    assert "bm25 index of 400 documents" in first.stdout
    assert "documents/s" in first.stderr  # the progress bar shows a rate
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["kind"], meta["backend"], meta["num_docs"]) == ("bm25", "bm25s", 400)
    assert meta["corpus"] == str(corpus.resolve())

    again = agentgym_cmd(*args)
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "--force" in again.stderr

    forced = agentgym_cmd(*args, "--force", "--quiet")
    assert forced.returncode == 0, forced.stderr
    assert "documents/s" not in forced.stderr


def test_malformed_corpus_is_one_line_naming_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "\\"T\\"\\nx"}\n{"id": 1}\n')
    out = agentgym_cmd(
        "retrieval", "index", "--corpus", str(bad), "--kind", "bm25", "--out", str(tmp_path / "o")
    )
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith("bad.jsonl:2: record lacks 'contents' (has 'id')")
    )


def test_missing_encoder_folder_is_one_line(corpus, tmp_path):
    out = agentgym_cmd(
        "retrieval", "index", "--corpus", str(corpus), "--kind", "flat",
        "--encoder", str(tmp_path / "no-model"), "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert out.returncode == 2 and "encoder folder" in out.stderr and "not found" in out.stderr


def test_unknown_kind_is_a_usage_error(corpus, tmp_path):
    out = agentgym_cmd("retrieval", "index", "--corpus", str(corpus), "--kind", "lsh", "--out", "o")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_serve_unfinished_index_fails_fast(tmp_path):
    out = agentgym_cmd("retrieval", "serve", "--index", str(tmp_path))
    assert out.returncode == 2 and "agentgym retrieval index" in out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_answers_over_http(corpus, tmp_path):
    server = pytest.importorskip("agentgym.retrieval.server")
    if not hasattr(server, "serve"):
        pytest.skip("agentgym.retrieval.server.serve not available")
    from agentgym.retrieval import open_retriever
    from agentgym.retrieval.client import RetrievalClient

    out = tmp_path / "idx"
    built = agentgym_cmd(
        "retrieval", "index", "--corpus", str(corpus), "--kind", "bm25", "--out", str(out)
    )
    assert built.returncode == 0, built.stderr
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentgym.cli", "retrieval", "serve", "--index", str(out),
         "--port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        client = open_retriever(f"http://127.0.0.1:{port}")
        assert isinstance(client, RetrievalClient)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.health()
                break
            except Exception:  # noqa: BLE001 - not up yet: any transport error means "retry"
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(proc.stderr.read().decode()[-2000:]) from None
                time.sleep(0.1)
        questions = [q["question"] for q in synthetic_queries(400, 8, seed=4)]
        remote = client.search(questions, topk=3)
        local = open_retriever(out).search(questions, topk=3)
        assert [[h.doc_id for h in hs] for hs in remote] == [[h.doc_id for h in hs] for hs in local]
        assert remote[0][0].document == local[0][0].document
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
