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


class _Faulty(BaseHTTPRequestHandler):
    """``/<mode>/v1/...``: ``500`` answers HTTP 500, ``garbage`` 200 with non-JSON, ``slow``
    sleeps past any short timeout, ``flaky`` answers 500 once per client then a valid reply,
    ``ok`` a valid chat completion carrying vLLM-style token ids and log-probs."""

    hits: dict[str, int] = {}
    lock = threading.Lock()

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
        mode = self.path.strip("/").split("/")[0]
        with self.lock:
            self.hits[mode] = self.hits.get(mode, 0) + 1
            count = self.hits[mode]
        if mode == "500":
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
        else:  # ok, and flaky's second try
            content = [
                {"token": "token_id:60", "logprob": -0.25},
                {"token": "token_id:61", "logprob": -1.5},
            ]
            body = {
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "<think>go</think><action>red</action>",
                        },
                        "finish_reason": "stop",
                        "logprobs": {"content": content},
                    }
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 2},
            }
            self._reply(200, json.dumps(body).encode())


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
