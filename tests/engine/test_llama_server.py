"""The engine against a real llama.cpp ``llama-server`` it starts itself, with the suite's
SmolLM2-135M-Instruct GGUF: sampled token ids and log-probs recorded, the request's temperature
honoured, the process stopped afterwards.

These need a built ``llama-server``; set ``AGENTGYM_LLAMA_SERVER`` to its path to run them (the
suite never builds llama.cpp). Without it they skip, except the ones about bad setup.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest

from agentgym.cli import main
from agentgym.engine import LlamaServer, LlamaServerError, OpenAIChatPolicy, SamplingParams

LLAMA_SERVER = os.environ.get("AGENTGYM_LLAMA_SERVER")
needs_binary = pytest.mark.skipif(
    not LLAMA_SERVER, reason="set AGENTGYM_LLAMA_SERVER to a llama-server binary to run this"
)


@pytest.fixture(scope="module")
def gguf():
    from agentgym.models import ModelNotAvailable, gguf_file

    try:
        return gguf_file("smollm2-135m")
    except ModelNotAvailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def llama(gguf):
    with LlamaServer(LLAMA_SERVER, gguf, slots=4, threads=1) as server:
        yield server


def _ask(server, params: SamplingParams, n: int, content: str = "Name a colour.") -> list:
    policy = OpenAIChatPolicy(server.base_url, model=server.model, retries=1, timeout=120)
    messages = [{"role": "user", "content": content}]

    async def go():
        try:
            return await asyncio.gather(*(policy.act(messages, params) for _ in range(n)))
        finally:
            await policy.aclose()

    return asyncio.run(go())


def test_a_missing_binary_is_a_clear_error(tmp_path, capsys):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(LlamaServerError, match="not an executable llama-server"):
        LlamaServer(tmp_path / "llama-server", model).start()
    with pytest.raises(LlamaServerError, match="neither a GGUF file"):
        LlamaServer(tmp_path / "llama-server", tmp_path / "absent.gguf")
    argv = ["eval", "Corridor-v0", "--llama-server", str(tmp_path / "nope"), "--gguf", str(model)]
    assert main([*argv, "--out-dir", str(tmp_path / "out"), "--quiet"]) == 2
    assert "not an executable llama-server" in capsys.readouterr().err
    scored = [*argv, "--policy", "scored", "--out-dir", str(tmp_path / "out"), "--quiet"]
    assert main(scored) == 2  # refused before anything starts
    assert "llama-server does not return" in capsys.readouterr().err


def test_a_server_that_exits_at_start_reports_its_log(tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n")
    fake.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    server = LlamaServer(fake, model, startup_timeout=30)
    with pytest.raises(LlamaServerError, match="failed to load model"):
        server.start()
    assert not server.running


@needs_binary
def test_sampled_token_ids_and_logprobs_are_recorded(llama, smollm2_path):
    from transformers import AutoTokenizer

    (out,) = _ask(llama, SamplingParams(temperature=1.0, max_tokens=12), 1)
    assert out.error is None and out.text
    assert out.token_ids and len(out.token_ids) == len(out.logprobs) == out.completion_tokens
    assert all(lp <= 0.0 for lp in out.logprobs)
    # the ids are the model's own: its tokenizer decodes them back to the text returned
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    assert tokenizer.decode(out.token_ids, skip_special_tokens=True).strip() == out.text.strip()


@needs_binary
def test_the_request_temperature_is_honoured_in_every_slot(llama):
    prompt = "Write one short sentence about the sea."
    greedy = _ask(llama, SamplingParams(temperature=0.0, max_tokens=16), 3, prompt)
    sampled = _ask(llama, SamplingParams(temperature=1.0, max_tokens=16), 4, prompt)
    assert all(o.error is None for o in greedy + sampled)
    assert len({o.text for o in greedy}) == 1
    assert len({o.text for o in sampled}) >= 3  # 16 tokens at T=1: repeats are rare


@needs_binary
def test_cli_starts_evaluates_and_stops_llama_server(gguf, tmp_path, capsys):
    argv = [
        "eval", "Corridor-v0", "--llama-server", LLAMA_SERVER, "--gguf", str(gguf),
        "--tasks", "2", "--group-size", "2", "--max-turns", "2", "--max-tokens", "16",
        "--temperature", "1", "--concurrency", "4", "--quiet", "--out-dir", str(tmp_path),
    ]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["ok"] and results["complete"] and results["episodes_finished"] == 4
    server = results["settings"]["server"]
    assert server["server"] == "llama.cpp" and server["slots"] == 4 and server["threads"] == 1
    env = results["envs"]["AgentGym/Corridor-v0"]
    assert not env["warnings"]  # the members of a group differ: it samples
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    turns = [t for r in rows for t in r["turns"]]
    assert turns and all(
        t["token_ids"] and len(t["token_ids"]) == len(t["logprobs"]) for t in turns
    )
    # stopped: nothing listens on its port any more
    port = int(server["command"][server["command"].index("--port") + 1])
    with socket.socket() as s, pytest.raises(OSError):
        s.connect(("127.0.0.1", port))
