"""Streamed chat completions (``OpenAIChatPolicy(stream=True)``, ``agentgym eval --stream``):
the same results as a non-streamed request, and an abandoned request hangs up mid-stream, so a
server that stops generating only when a streamed client leaves stops at the deadline."""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentgym.engine import OpenAIChatPolicy, SamplingParams
from agentgym.engine.policies.http import _merge_stream

#: the reply, token by token: (token id, text, log-prob)
TOKENS = [
    (27, "<", -0.5),
    (11462, "think", -0.125),
    (34, ">go</", -0.25),
    (11462, "think", -1.5),
    (35, "><action>", -0.03125),
    (2266, "red", -2.0),
    (36, "</action>", -0.0625),
]
TEXT = "".join(t for _, t, _ in TOKENS)
USAGE = {"prompt_tokens": 11, "completion_tokens": len(TOKENS), "total_tokens": 11 + len(TOKENS)}
BAD_USAGE = {"prompt_tokens": "many", "completion_tokens": float("nan")}  # json writes NaN


def _entry(form: str, tok: int, text: str, logprob: float) -> dict:
    """One ``logprobs.content`` entry as vLLM (``token_id:<id>``) or llama.cpp (``id``) write it."""
    if form == "vllm":
        return {"token": f"token_id:{tok}", "logprob": logprob, "bytes": None, "top_logprobs": []}
    return {"id": tok, "token": text, "bytes": list(text.encode()), "logprob": logprob}


class _Streaming(BaseHTTPRequestHandler):
    """``/<mode>-<key>/v1/chat/completions``, answering streamed requests with server-sent
    events in chunked transfer encoding (as uvicorn does) and others with one JSON body.

    ``vllm`` and ``llama``: the reply :data:`TOKENS`, one token per chunk with its log-prob in
    that server's form, a final chunk with ``finish_reason`` and, with ``include_usage``, a
    chunk with ``usage``. ``slow``: a chunk every 0.1 s for 30 s, each write's time kept in
    ``chunks`` and the moment the client is seen gone in ``closed``. ``huge``: 6 MB of text,
    streamed in 64 kB pieces or in one body. ``error``: a token, then an ``error`` event.
    ``badusage``: as ``llama`` with usage counts that are not numbers."""

    protocol_version = "HTTP/1.1"
    requests: dict[str, dict] = {}
    chunks: dict[str, list[float]] = {}
    closed: dict[str, float] = {}
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        self._json({"data": [{"id": "streamer"}]})

    def do_POST(self):  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        key = self.path.strip("/").split("/")[0]
        mode = key.split("-")[0]
        with self.lock:
            self.requests[key] = request
            self.chunks[key] = []
        if not request.get("stream"):
            if mode == "huge":
                self._json(_reply("a" * 6_000_000, None))
            else:
                lp = {"content": [_entry(mode, *t) for t in TOKENS]}
                self._json(_reply(TEXT, lp if request.get("logprobs") else None))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if mode == "slow":
                self._slow(key)
            elif mode == "huge":
                for _ in range(100):
                    self._event(_delta("a" * 65536, None))
            elif mode == "error":  # as vLLM and transformers serve report a failure mid-reply
                self._event(_delta("<", None))
                self._event({"error": "CUDA out of memory"})
            else:
                self._event(
                    {
                        **_delta(None, None),
                        "choices": [{"index": 0, "delta": {"role": "assistant"}}],
                    }
                )
                for tok, text, logprob in TOKENS:
                    lp = {"content": [_entry(mode, tok, text, logprob)]}
                    self._event(_delta(text, lp if request.get("logprobs") else None))
                self._event(_delta("", None, finish="stop"))
                if (request.get("stream_options") or {}).get("include_usage"):
                    usage = BAD_USAGE if mode == "badusage" else USAGE
                    self._event(
                        {
                            "id": "c",
                            "object": "chat.completion.chunk",
                            "choices": [],
                            "usage": usage,
                        }
                    )
            self._write(b"data: [DONE]\n\n")
            self._write(b"")  # the last chunk: the body ends
        except (BrokenPipeError, ConnectionResetError):
            with self.lock:
                self.closed.setdefault(key, time.monotonic())
        self.close_connection = True

    def _slow(self, key: str) -> None:
        for _ in range(300):
            # as an ASGI server does: a client that hung up is noticed, the generation stopped
            ready, _, _ = select.select([self.connection], [], [], 0)
            if ready and not self.connection.recv(1, socket.MSG_PEEK):
                with self.lock:
                    self.closed.setdefault(key, time.monotonic())
                return
            self._event(_delta("a", None))
            with self.lock:
                self.chunks[key].append(time.monotonic())
            time.sleep(0.1)

    def _event(self, chunk: dict) -> None:
        self._write(f"data: {json.dumps(chunk)}\n\n".encode())

    def _write(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _json(self, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        try:
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass


def _delta(text: str | None, logprobs: dict | None, finish: str | None = None) -> dict:
    choice = {"index": 0, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": finish}
    return {"id": "c", "object": "chat.completion.chunk", "choices": [choice], "usage": None}


def _reply(text: str, logprobs: dict | None) -> dict:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
    }
    if logprobs is not None:
        choice["logprobs"] = logprobs
    return {"choices": [choice], "usage": USAGE}


@pytest.fixture(scope="module")
def streamer():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Streaming)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _act(url: str, **kw):
    policy = OpenAIChatPolicy(url, model="streamer", **kw)

    async def go():
        try:
            return await policy.act([{"role": "user", "content": "hi"}], SamplingParams())
        finally:
            await policy.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("form", ["vllm", "llama"])
def test_a_streamed_reply_is_the_non_streamed_one(streamer, form):
    plain = _act(f"{streamer}/{form}-plain", retries=0)
    streamed = _act(f"{streamer}/{form}-streamed", retries=0, stream=True)
    sent = _Streaming.requests[f"{form}-streamed"]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert "stream" not in _Streaming.requests[f"{form}-plain"]
    assert streamed.error is None and streamed.text == plain.text == TEXT
    assert streamed.token_ids == plain.token_ids == [t for t, _, _ in TOKENS]
    assert streamed.logprobs == plain.logprobs == [lp for _, _, lp in TOKENS]
    assert streamed.finish_reason == plain.finish_reason == "stop"
    assert streamed.prompt_tokens == plain.prompt_tokens == 11
    assert streamed.completion_tokens == plain.completion_tokens == len(TOKENS)
    assert streamed.attempts == plain.attempts == 1


def test_an_abandoned_stream_is_hung_up_at_the_deadline(streamer):
    started = time.monotonic()
    out = _act(f"{streamer}/slow-deadline", retries=0, timeout=1.0, stream=True)
    deadline = started + 1.0
    assert out.error_kind == "timeout" and "within 1 s" in out.error
    wait_until = time.monotonic() + 3
    while "slow-deadline" not in _Streaming.closed and time.monotonic() < wait_until:
        time.sleep(0.05)
    assert "slow-deadline" in _Streaming.closed, "the server never saw the client leave"
    assert _Streaming.closed["slow-deadline"] - deadline < 1.0
    chunks = _Streaming.chunks["slow-deadline"]
    assert len(chunks) >= 5  # it was streaming before the deadline
    assert sum(t > deadline for t in chunks) <= 2  # and stopped right after it


def test_a_stream_past_the_size_limit_is_cut_and_reported_as_a_body_is(streamer):
    plain = _act(f"{streamer}/huge-plain", retries=2)
    streamed = _act(f"{streamer}/huge-streamed", retries=2, stream=True)
    for out in (plain, streamed):
        assert out.text == "" and out.error_kind == "bad_response" and out.attempts == 1
        assert "larger than 4194304 bytes" in out.error
    assert streamed.error.replace("streamed", "plain") == plain.error


def test_stream_merging_reads_what_servers_send():
    usage = {"prompt_tokens": "many", "completion_tokens": 2}
    raw = (
        b": keep-alive\r\n\r\n"
        b'data: {"choices": [{"index": 0, "delta": {"content": "a\\u2028"}}]}\r\n\r\n'
        b'data: {"choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "length"}]}\n\n'
        b'data: {"choices": [], "usage": ' + json.dumps(usage).encode() + b"}\n\n"
        b"data: [DONE]\n\n"
    )
    body = _merge_stream(raw)
    (choice,) = body["choices"]
    assert choice["message"]["content"] == "a\u2028b" and choice["finish_reason"] == "length"
    assert choice["logprobs"] is None and body["usage"] == usage
    # log-probs for some pieces only would pair them with the wrong tokens: dropped
    part = b'data: {"choices": [{"delta": {"content": "x"}, "logprobs": {"content": [{"id": 1, "logprob": -1}]}}]}\n\n'
    assert _merge_stream(part)["choices"][0]["logprobs"] == {"content": [{"id": 1, "logprob": -1}]}
    none = b'data: {"choices": [{"delta": {"content": "y"}}]}\n\n'
    assert _merge_stream(part + none)["choices"][0]["logprobs"] is None
    assert _merge_stream(b"data: [DONE]\n\n")["choices"] == []


def test_usage_that_is_not_numbers_and_error_events_in_a_stream(streamer):
    out = _act(f"{streamer}/badusage", retries=0, stream=True)
    assert out.error is None and out.text == TEXT and out.token_ids == [t for t, _, _ in TOKENS]
    assert out.prompt_tokens is None and out.completion_tokens is None
    # an error after the 200 status: an unreadable reply, retried, then the turn's failure
    out = _act(f"{streamer}/error", retries=1, backoff=0.01, stream=True)
    assert out.text == "" and out.error_kind == "bad_response" and out.attempts == 2
    assert "error event" in out.error and "CUDA out of memory" in out.error
    with pytest.raises(json.JSONDecodeError):
        _merge_stream(b"data: {not json\n\n")


def test_eval_stream_end_to_end(streamer, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentgym.cli",
            "eval",
            "Corridor-v0",
            "--base-url",
            f"{streamer}/vllm-cli",
            "--stream",
            "--tasks",
            "1",
            "--group-size",
            "2",
            "--max-episode-steps",
            "2",
            "--out-dir",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert _Streaming.requests["vllm-cli"]["stream"] is True
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and results["episodes_finished"] == 2
    corridor = results["envs"]["AgentGym/Corridor-v0"]
    assert corridor["policy_errors"] == {} and corridor["completion_tokens"] is not None
    rows = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["turns"] and all(t["action"] == "red" for t in row["turns"])
        assert all(t["token_ids"] == [t_ for t_, _, _ in TOKENS] for t in row["turns"])
        assert all(t["logprobs"] == [lp for _, _, lp in TOKENS] for t in row["turns"])
        assert all(t["finish_reason"] == "stop" and t["error"] is None for t in row["turns"])


def test_stream_is_refused_where_nothing_is_streamed(tmp_path, capsys):
    from agentgym.cli import main

    argv = ["eval", "Corridor-v0", "--base-url", "http://127.0.0.1:9", "--stream"]
    argv += ["--policy", "scored", "--tokenizer", "x", "--out-dir", str(tmp_path)]
    assert main(argv) == 2
    assert "--stream" in capsys.readouterr().err


def test_transformers_serve_streams_the_reply_it_gives_unstreamed(smollm2_server):
    msgs = [{"role": "user", "content": "Say hello in three words."}]
    params = SamplingParams(temperature=0, max_tokens=8)

    async def both():
        outs = []
        for stream in (False, True):
            policy = OpenAIChatPolicy(smollm2_server, retries=0, timeout=120, stream=stream)
            try:
                outs.append(await policy.act(msgs, params))
            finally:
                await policy.aclose()
        return outs

    plain, streamed = asyncio.run(both())
    assert plain.error is None and streamed.error is None, (plain.error, streamed.error)
    assert streamed.text == plain.text and streamed.text
    assert streamed.finish_reason == plain.finish_reason
    assert streamed.prompt_tokens == plain.prompt_tokens is not None
    assert streamed.completion_tokens == plain.completion_tokens is not None
