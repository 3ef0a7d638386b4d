"""``agentgym eval`` and ``agentgym rollout`` as a user runs them: compute threads that do not
oversubscribe the cores, Ctrl-C during local generation exits 130 cleanly, an output folder
holding an earlier run is refused (or replaced whole), a run that fails to start leaves no
folder behind, and an HTTP request abandoned at its deadline is hung up before its retry."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentgym.cli import main
from agentgym.engine import OpenAIChatPolicy, SamplingParams
from agentgym.engine.cli import cpu_cores, default_threads

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    """This checkout first on the path, no inherited thread settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**env, **extra}


# -- threads -------------------------------------------------------------------------------------


def test_default_threads_share_the_cores_among_the_processes():
    assert default_threads(8) == 8
    assert default_threads(8, workers=1) == 4
    assert default_threads(8, workers=3) == 2
    assert default_threads(2, workers=2) == 1
    assert default_threads(2, workers=8) == 1  # never 0
    assert default_threads(1) == 1
    with pytest.raises(ValueError):
        default_threads(0)


ROLLOUT = """
import os, sys, torch
from agentgym.cli import main
from agentgym.engine import OpenAIChatPolicy, SamplingParams
code = main(["rollout", "Corridor-v0", "--groups", "1", "--group-size", "2", *sys.argv[1:]])
print("RESULT", code, torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))
"""


def _rollout_threads(*argv: str, **env: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", ROLLOUT, *argv],
        env=_env(**env), capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    _, code, threads, omp = line.split()
    assert code == "0", done.stderr
    return int(threads), omp


def test_rollout_sets_torch_threads_and_the_workers_variable():
    assert _rollout_threads("--threads", "1") == (1, "1")
    # the process backend starts one worker per env here (2 envs): the cores are shared by 3
    workers = min(os.cpu_count() or 1, 2)
    expected = default_threads(cpu_cores(), workers)
    assert _rollout_threads("--backend", "process") == (expected, str(expected))
    # $OMP_NUM_THREADS, when the user set it, is the default
    assert _rollout_threads(OMP_NUM_THREADS="1") == (1, "1")


@pytest.mark.realmodel
def test_eval_model_runs_torch_on_the_threads_asked(smollm2_path, tmp_path):
    def run(*argv: str) -> dict:
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        done = subprocess.run(
            [sys.executable, "-m", "agentgym.cli", "eval", "Corridor-v0", "--model",
             str(smollm2_path), "--device", "cpu", "--tasks", "1", "--max-episode-steps", "1",
             "--max-tokens", "2", "--quiet", "--out-dir", str(out), *argv],
            env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads((out / "results.json").read_text())["settings"]

    assert run("--threads", "1")["torch_threads"] == 1
    assert run()["torch_threads"] == default_threads(cpu_cores())


# -- Ctrl-C during generation ----------------------------------------------------------------


@pytest.mark.realmodel
def test_ctrl_c_during_local_generation_exits_130_without_aborting(smollm2_path, tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "agentgym.cli", "eval", "Corridor-v0", "--model",
         str(smollm2_path), "--device", "cpu", "--tasks", "1", "--group-size", "2",
         "--max-tokens", "256", "--threads", "1", "--out-dir", str(tmp_path / "run")],
        env=_env(), stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    seen = ""
    deadline = time.monotonic() + 240
    while "episodes:" not in seen and time.monotonic() < deadline:  # the bar: episodes started
        char = process.stderr.read(1)
        if not char:
            break
        seen += char
    assert "episodes:" in seen, seen
    time.sleep(2.0)  # inside the first turn's generation (256 tokens take far longer)
    process.send_signal(signal.SIGINT)
    try:
        rest = process.stderr.read()
        code = process.wait(timeout=120)
    finally:
        process.kill()
    assert "terminate called" not in rest
    assert code == 130, rest
    assert "interrupted: wrote the 0 of 2 episodes" in rest
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["complete"] is False and results["episodes_finished"] == 0


# -- the output folder -----------------------------------------------------------------------


def _dead_server_eval(out: Path, faulty_server, *argv: str) -> int:
    _, down = faulty_server  # every turn fails at once: episodes finish in milliseconds
    return main(
        ["eval", "Corridor-v0", "--base-url", down, "--served-model", "m", "--retries", "0",
         "--quiet", "--out-dir", str(out), *argv]
    )  # fmt: skip


def _run_files(out: Path) -> tuple[int, int]:
    """(episodes results.json says finished, lines in trajectories.jsonl)."""
    results = json.loads((out / "results.json").read_text())
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    return results["episodes_finished"], len(lines)


def test_an_earlier_run_is_refused_unless_overwrite(tmp_path, faulty_server, capsys):
    out = tmp_path / "run"
    assert _dead_server_eval(out, faulty_server, "--tasks", "4") == 1
    assert _run_files(out) == (4, 4)
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    capsys.readouterr()

    assert _dead_server_eval(out, faulty_server, "--tasks", "2") == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(errors) == 1 and "holds an earlier run" in errors[0] and "--overwrite" in errors[0]
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before  # untouched

    assert _dead_server_eval(out, faulty_server, "--tasks", "2", "--overwrite") == 1
    assert _run_files(out) == (2, 2)  # both replaced: summary and trajectories agree


def test_overwrite_keeps_the_earlier_run_when_the_new_one_fails_to_start(tmp_path, faulty_server):
    out = tmp_path / "run"
    assert _dead_server_eval(out, faulty_server, "--tasks", "3") == 1
    code = main(
        ["eval", "Corridor-v0", "--llama-server", "/nonexistent/llama-server", "--policy",
         "scored", "--out-dir", str(out), "--overwrite"]
    )  # fmt: skip
    assert code == 2
    assert _run_files(out) == (3, 3)


def test_a_run_that_fails_to_start_leaves_no_timestamped_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path.parent / "no-data-here"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bad = [
        # a flag combination refused before anything runs
        ["Corridor-v0", "--llama-server", "/nonexistent/llama-server", "--policy", "scored"],
        # a model that is not there
        ["Corridor-v0", "--model", str(tmp_path / "no-model-here")],
        # no env id that can run (its data is missing)
        ["ALFWorld-v0", "--base-url", "http://127.0.0.1:9", "--quiet"],
    ]
    for argv in bad:
        assert main(["eval", *argv]) == 2
    assert not list(tmp_path.iterdir())


def test_a_run_without_out_dir_writes_a_timestamped_folder_here(
    tmp_path, monkeypatch, faulty_server
):
    monkeypatch.chdir(tmp_path)
    _, down = faulty_server
    argv = ["eval", "Corridor-v0", "--base-url", down, "--served-model", "m", "--retries", "0"]
    assert main([*argv, "--tasks", "1", "--quiet"]) == 1
    (folder,) = tmp_path.glob("agentgym-eval-*")
    assert _run_files(folder) == (1, 1)


# -- abandoned requests are hung up ------------------------------------------------------------


class _Holding(BaseHTTPRequestHandler):
    """Reads a request and holds it, never answering, until the client hangs up; records per
    connection when the request came and when the client closed it."""

    log: list[dict[str, float]] = []

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        entry = {"arrived": time.monotonic()}
        self.log.append(entry)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.connection], [], [], 0.02)
            if ready and not self.connection.recv(1, socket.MSG_PEEK):
                entry["closed"] = time.monotonic()
                return


def test_every_timed_out_attempt_is_hung_up_before_its_retry():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Holding)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Holding.log = []
    policy = OpenAIChatPolicy(
        f"http://127.0.0.1:{server.server_address[1]}", model="m", timeout=0.5, retries=2,
        backoff=0.2,
    )  # fmt: skip

    async def go():
        try:
            return await policy.act([{"role": "user", "content": "hi"}], SamplingParams())
        finally:
            await policy.aclose()

    try:
        out = asyncio.run(go())
        time.sleep(0.3)
    finally:
        server.shutdown()
        server.server_close()
    assert out.error_kind == "timeout" and out.attempts == 3
    log = _Holding.log
    assert len(log) == 3 and all("closed" in e for e in log), log
    for attempt, retry in zip(log, log[1:], strict=False):
        # hung up at its deadline, before the retry was sent: the server never holds both
        assert attempt["closed"] - attempt["arrived"] < 0.5 + 0.4
        assert attempt["closed"] <= retry["arrived"]
