"""``agentgym retrieval index|serve`` run as a user runs them (real subprocesses)."""

from __future__ import annotations

import argparse
import json
import logging
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


# ----------------------------------------------------------------------------------------------
# Help texts and start-up messages


def _retrieval_subparsers() -> dict[str, argparse.ArgumentParser]:
    from agentgym.retrieval.cli import add_parser

    parser = argparse.ArgumentParser(prog="agentgym")
    add_parser(parser.add_subparsers())
    (retrieval,) = (
        a.choices["retrieval"] for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    )
    (sub,) = (a for a in retrieval._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", ["index", "serve"])
def test_help_shows_every_default(command):
    parser = _retrieval_subparsers()[command]
    text = " ".join(parser.format_help().split())  # argparse wraps lines anywhere
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.required:
            continue  # --help, flags, required options: no default to show
        assert action.help and "(default:" in action.help, f"{action.option_strings} hides it"
        if action.default is not None:
            assert f"(default: {action.default})" in text, action.option_strings


def test_index_help_names_the_default_kind():
    out = agentgym_cmd("retrieval", "index", "--help")
    assert out.returncode == 0 and "(default: flat)" in " ".join(out.stdout.split())


def test_serve_defaults_are_the_servers():
    import inspect

    from agentgym.retrieval.server import create_app, serve

    flags = {
        "max_batch_queries": "max_batch",
        "batch_wait_ms": "batch_wait_ms",
        "max_topk": "max_topk",
        "default_topk": "default_topk",
        "max_queries_per_request": "max_queries",
        "max_results_per_request": "max_results",
        "max_query_chars": "max_query_chars",
        "chunk_queries": "chunk_queries",
        "client_timeout_s": "client_timeout_s",
    }
    parser = _retrieval_subparsers()["serve"]
    for function in (create_app, serve):
        params = inspect.signature(function).parameters
        for name, dest in flags.items():
            assert parser.get_default(dest) == params[name].default, (function.__name__, name)
    assert parser.get_default("host") == inspect.signature(serve).parameters["host"].default


def test_dense_build_and_open_say_what_they_load(corpus, tmp_path, tiny_encoder_dir, caplog):
    out = tmp_path / "flat"
    args = ["retrieval", "index", "--corpus", str(corpus), "--kind", "flat", "--out", str(out),
            "--encoder", str(tiny_encoder_dir), "--device", "cpu"]  # fmt: skip
    built = agentgym_cmd(*args)
    assert built.returncode == 0, built.stderr
    lines = built.stderr.splitlines()

    def first(words: str) -> int:
        return next(i for i, line in enumerate(lines) if words in line)

    # a line before each slow step, in the order they run, the encoder first of all
    assert first(f"loading the encoder {tiny_encoder_dir}") == 0
    assert first("counting the documents in") < first("building the flat index over 400")
    quiet = agentgym_cmd(*args, "--quiet", "--force")
    assert quiet.returncode == 0 and "loading" not in quiet.stderr

    from agentgym.retrieval import open_retriever

    with caplog.at_level(logging.INFO, logger="agentgym.retrieval"):
        open_retriever(out, device="cpu").close()
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" ")[:3] for m in said] == [
        ["opening", "the", "document"],
        ["loading", "the", "query"],
        ["loading", "the", "flat"],
    ]
    assert str(tiny_encoder_dir) in said[1] and "MB, memory-mapped" in said[2]


def test_faiss_loader_says_nothing_at_info():
    # faiss logs the CPU builds it tries at INFO ("Could not load library with AVX512 support
    # ..."), which reads like an error; with agentgym's retrieval it stays quiet
    code = (
        "import logging; logging.basicConfig(level=logging.INFO); "
        "from agentgym.retrieval.dense import DenseIndex; DenseIndex.new('flat', 4)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert "faiss" not in out.stderr, out.stderr
