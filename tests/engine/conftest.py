"""Fixtures for the eval tests: a misbehaving HTTP server on loopback, the real SmolLM2 loaded
once in-process, and the real SmolLM2 behind ``transformers serve`` once per session."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def _gzip_bomb(inflated: int) -> bytes:
    """A gzip body that inflates to ``inflated`` zero bytes, compressed chunk by chunk."""
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    chunk = bytes(1 << 20)
    parts = [packer.compress(chunk) for _ in range(inflated >> 20)]
    return b"".join(parts) + packer.flush()


def _llama_cpp_logprobs(pieces: list[tuple[int, str, float]]) -> dict:
    """A chat choice's ``logprobs`` as llama.cpp's server writes it
    (``completion_token_output::probs_vector_to_json``, tools/server/server-task.cpp)."""
    content = []
    for tok, text, logprob in pieces:
        top = [{"id": tok, "token": text, "bytes": list(text.encode()), "logprob": logprob}]
        content.append(
            {
                "id": tok,
                "token": text,
                "bytes": list(text.encode()),
                "logprob": logprob,
                "top_logprobs": top,
            }
        )
    return {"content": content}


class _Faulty(BaseHTTPRequestHandler):
    """``/<mode>[-<key>]/v1/...`` (hits are counted per ``<mode>-<key>``, so a test gets its
    own count): ``500`` answers HTTP 500, ``garbage`` 200 with non-JSON, ``slow`` sleeps past
    any short timeout, ``flaky`` answers 503 on odd hits then a valid reply, ``ok`` a valid chat
    completion carrying vLLM-style token ids and log-probs, ``llama`` one in llama.cpp's form
    (log-probs only when asked with ``top_logprobs`` >= 1, as llama.cpp does), ``model404``
    404 as vLLM does for an unknown model, ``flip`` a valid reply on odd hits and 400 on even
    ones, ``busy`` 429 with ``Retry-After: 1`` on odd hits, ``trickle`` a valid reply at one
    byte per 0.2 s, ``huge`` a valid 10 MB reply, ``gzip`` a 300 MB gzip bomb, ``badusage``
    usage counts that are not numbers, ``hang`` waits until the client closes the connection
    and records that it did (``closed``)."""

    hits: dict[str, int] = {}
    closed: dict[str, float] = {}
    requests: dict[str, dict] = {}
    lock = threading.Lock()
    _bomb: bytes | None = None

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):  # noqa: N802 - http.server's name
        self._reply(200, json.dumps({"data": [{"id": "faulty"}]}).encode())

    def do_POST(self):  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        key = self.path.strip("/").split("/")[0]
        mode = key.split("-")[0]
        with self.lock:
            self.hits[key] = self.hits.get(key, 0) + 1
            count = self.hits[key]
            self.requests[key] = request
        if mode == "hang":
            self._wait_for_close(key)
        elif mode == "model404":
            self._reply(404, b'{"error": {"message": "The model does not exist.", "code": 404}}')
        elif mode == "flip" and count % 2 == 0:
            self._reply(400, b'{"error": "bad request"}')
        elif mode == "busy" and count % 2 == 1:
            self.send_response(429)
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif mode == "trickle":
            body = json.dumps(_chat_reply("slowly", None)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for byte in body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif mode == "huge":
            self._reply(200, json.dumps(_chat_reply("a" * 10_000_000, None)).encode())
        elif mode == "gzip":
            with self.lock:
                if _Faulty._bomb is None:
                    _Faulty._bomb = _gzip_bomb(300 << 20)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(self._bomb)))
            self.end_headers()
            try:
                self.wfile.write(self._bomb)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif mode == "badusage":
            body = _chat_reply("<think>go</think><action>red</action>", None)
            body["usage"] = {"prompt_tokens": "many", "completion_tokens": float("nan")}
            self._reply(200, json.dumps(body).encode())  # NaN: Python's json writes it
        elif mode == "llama":
            pieces = [(27, "<", -0.5), (11462, "think", -0.125)]
            asked = request.get("logprobs") and (request.get("top_logprobs") or 0) > 0
            body = _chat_reply("<think", _llama_cpp_logprobs(pieces) if asked else None)
            self._reply(200, json.dumps(body).encode())
        elif mode == "500":
            self._reply(500, b'{"error": "internal"}')
        elif mode == "garbage":
            self._reply(200, b"<html>this is not json{", "text/html")
        elif mode == "slow":
            time.sleep(3.0)
            self._reply(200, b"{}")
        elif mode == "strict" and "return_tokens_as_token_ids" in request:
            # as transformers serve does with fields it does not know
            self._reply(422, b'{"detail": "Unexpected fields: {\'return_tokens_as_token_ids\'}"}')
        elif mode == "flaky" and count % 2 == 1:
            self._reply(503, b"busy")
        else:  # ok, and the good answers of flaky, flip and busy
            content = [
                {"token": "token_id:60", "logprob": -0.25},
                {"token": "token_id:61", "logprob": -1.5},
            ]
            body = _chat_reply("<think>go</think><action>red</action>", {"content": content})
            self._reply(200, json.dumps(body).encode())

    def _wait_for_close(self, key: str) -> None:
        """Hold the request open until the client hangs up (at most 30 s); note when."""
        import select

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.connection], [], [], 0.05)
            if ready and not self.connection.recv(1, socket.MSG_PEEK):
                with self.lock:
                    self.closed[key] = time.monotonic()
                return


def _chat_reply(text: str, logprobs: dict | None) -> dict:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
    }
    if logprobs is not None:
        choice["logprobs"] = logprobs
    return {"choices": [choice], "usage": {"prompt_tokens": 11, "completion_tokens": 2}}


@pytest.fixture(scope="session")
def faulty_server():
    """Base URL of the misbehaving server (append ``/<mode>``) and a port nothing listens on."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Faulty)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with socket.socket() as s:  # a port that was free a moment ago: connections are refused
        s.bind(("127.0.0.1", 0))
        down_port = s.getsockname()[1]
    yield f"http://127.0.0.1:{server.server_address[1]}", f"http://127.0.0.1:{down_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def faulty_log():
    """What the misbehaving server saw: ``hits``, ``requests`` and ``closed`` per path key."""
    return _Faulty


@pytest.fixture(scope="session")
def smollm2_policy(smollm2_path):
    """The real SmolLM2-135M-Instruct in-process (one load per session), on CPU."""
    from agentgym.engine import TransformersPolicy

    policy = TransformersPolicy(smollm2_path, device="cpu", seed=0)
    yield policy
    policy.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def smollm2_server(smollm2_path, tmp_path_factory):
    """``transformers serve`` of the real SmolLM2 on 127.0.0.1, started once per session."""
    exe = shutil.which("transformers")
    if exe is None:
        pytest.skip("the `transformers` command is not installed (pip install transformers)")
    for module in ("fastapi", "uvicorn"):
        pytest.importorskip(module, reason="transformers serve needs fastapi and uvicorn")
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                exe,
                "serve",
                str(smollm2_path),
                "--device",
                "cpu",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--continuous-batching",
                # an explicit KV cache (8,192 tokens): sized by default for a GPU, on CPU the
                # server grew to 14 GB and was killed for memory
                "--cb-block-size",
                "32",
                "--cb-num-blocks",
                "256",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"transformers serve exited ({proc.returncode}): {Path(log).read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"transformers serve did not answer in 300 s: {Path(log).read_text()[-2000:]}"
                )
            time.sleep(1.0)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
