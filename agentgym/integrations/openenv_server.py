"""An OpenEnv server for any agentgym id: ``agentgym serve ID --port P``.

Built on OpenEnv's own ``HTTPEnvServer`` (``openenv-core``), so the wire protocol is OpenEnv's:

- ``/ws`` (WebSocket): one session per connection, with its own env. Messages are
  ``{"type": "reset", "data": {"seed": 0, "options": {...}}}``, ``{"type": "step", "data":
  {"text": "up"}}``, ``{"type": "state"}`` and ``{"type": "close"}``; answers are ``observation``,
  ``state`` or ``error`` messages (``{"type": "error", "data": {"message", "code"}}``). A bad
  message (not JSON, wrong types, unknown type, step before reset) gets an error and the session
  keeps serving.
- HTTP: ``POST /reset`` (a fresh env per call: the first observation of a seed), ``GET /health``,
  ``/schema``, ``/metadata``, ``/state``. ``POST /step`` over HTTP answers 409: an episode lives
  in a WebSocket session. Malformed requests get 422 with the reason.

What this module adds to OpenEnv's server: the session bound (``max_sessions``; a connection
beyond it gets a ``CAPACITY_REACHED`` error and is closed, never queued), an idle timeout that
is checked often enough for short timeouts (OpenEnv's own reaper wakes every >= 5 s) and that
tells the client why (an error message, then a close frame with the reason; OpenEnv frees the
env but leaves the connection open and silent), errors instead of a dropped session for frames
OpenEnv's handler cannot parse (JSON arrays, numbers, binary frames), and agentgym's errors
mapped to 4xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import sys
import time
from typing import Any

from fastapi import FastAPI, Request, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from agentgym.core import ResetOptionError
from agentgym.envs import MissingExtra, install_hint

try:
    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.types import ConcurrencyConfig
except ImportError as exc:  # one line naming the extra, not a traceback into openenv
    raise MissingExtra(
        f"agentgym serve needs openenv-core, not installed: {install_hint('openenv')}"
    ) from exc

from agentgym.integrations.openenv import (
    AgentGymAction,
    AgentGymObservation,
    ServedEnvironment,
    SessionError,
    json_safe,
)

__all__ = ["DEFAULT_MAX_SESSIONS", "DEFAULT_SESSION_TIMEOUT_S", "create_app", "serve"]

logger = logging.getLogger(__name__)

#: sessions (WebSocket connections, each with its own env) served at once by default
DEFAULT_MAX_SESSIONS = 32
#: seconds a session may stay idle before the server closes it, by default
DEFAULT_SESSION_TIMEOUT_S = 300.0


class _Connection:
    """One WebSocket connection, as the guard saw it open: how to talk to its client."""

    __slots__ = ("send", "jsonrpc", "closed_by_server")

    def __init__(self, send: Any, jsonrpc: bool):
        self.send = send
        self.jsonrpc = jsonrpc
        self.closed_by_server = False

    async def hang_up(self, reason: str, code: str) -> None:
        """Send ``reason`` as an error message, then close with it (best effort: it may be gone).

        Called by the reaper while the connection's handler waits for the next message, so
        nothing else is sending; the client's answer to the close ends that wait.
        """
        self.closed_by_server = True
        with contextlib.suppress(Exception):
            await self.send(
                {"type": "websocket.send", "text": _error_frame(reason, self.jsonrpc, code)}
            )
            short = reason.encode()[:123].decode(errors="ignore")  # RFC 6455's limit on reasons
            await self.send({"type": "websocket.close", "code": 1000, "reason": short})


#: the connection whose handler is running: OpenEnv's handler creates its session in the task the
#: guard set this in, which is how the server learns which connection a session belongs to
_current_connection: contextvars.ContextVar[_Connection | None] = contextvars.ContextVar(
    "agentgym_openenv_connection", default=None
)


class _AgentGymEnvServer(HTTPEnvServer):
    """OpenEnv's server with an idle-session reaper that suits short timeouts, says why it
    closed a session, and closes that session's connection too."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._connections: dict[str, _Connection] = {}

    async def _create_session(self) -> tuple[str, Any]:
        session_id, env = await super()._create_session()
        connection = _current_connection.get()
        if connection is not None:
            self._connections[session_id] = connection
        return session_id, env

    async def _destroy_session(self, session_id: str) -> None:
        self._connections.pop(session_id, None)
        await super()._destroy_session(session_id)

    async def _reap_idle_sessions(self) -> None:
        timeout = self._session_idle_timeout_s
        if timeout is None:
            return
        # wake often enough that a session lives at most ~1.25x its timeout (OpenEnv waits >= 5 s)
        interval = min(max(timeout / 4, 0.05), 5.0)
        while True:
            try:
                await asyncio.sleep(interval)
                now = time.time()
                async with self._session_lock:
                    stale = [
                        sid
                        for sid, info in self._session_info.items()
                        if now - info.last_activity_at > timeout
                    ]
                for sid in stale:
                    async with self._session_lock:  # activity may have arrived since the scan
                        info = self._session_info.get(sid)
                        if info is None or time.time() - info.last_activity_at <= timeout:
                            continue
                        env = self._sessions.get(sid)
                    reason = (
                        f"session closed after {timeout:g} s without a reset or step "
                        "(--session-timeout); open a new connection"
                    )
                    if isinstance(env, ServedEnvironment):
                        env.expire(reason)  # for a message already on its way
                    connection = self._connections.get(sid)
                    await self._destroy_session(sid)
                    if connection is not None:
                        await connection.hang_up(reason, "SESSION_ERROR")
            except asyncio.CancelledError:
                break
            except Exception as exc:  # noqa: BLE001 - the reaper must outlive one bad session
                logger.warning("idle-session reaper: %s: %s (will retry)", type(exc).__name__, exc)


class _WebSocketGuard:
    """ASGI middleware in front of OpenEnv's WebSocket endpoints (``/ws``, ``/mcp``).

    - A connection beyond the session bound is refused here: accepted, sent a
      ``CAPACITY_REACHED`` error, closed (1013, "try again later") after the client's first
      frame. OpenEnv refuses too, but closes at once, so a client's first send races the close
      and it often sees a bare "connection closed" instead of the reason.
    - A frame OpenEnv would die on is answered here with an error, and the session keeps
      serving: OpenEnv's handlers parse each text frame and call ``.get`` on it outside their
      error handling, so JSON that is not an object (``[1, 2]``, ``3``, ``null``) or a binary
      frame ends the session. Text that is not JSON at all still reaches OpenEnv, which answers
      ``INVALID_JSON`` itself.
    - A client that hangs up first is normal, not a server error: OpenEnv's handler closes the
      socket in ``finally`` and lets the ``WebSocketDisconnect`` of an already-gone client
      escape, which uvicorn would log as a traceback on every ordinary disconnect.
    """

    #: how long a refused connection stays open so that the client's first message reads the
    #: capacity error (instead of racing the close: OpenEnv's own refusal closes at once)
    refusal_linger_s = 5.0

    def __init__(self, app: Any, server: HTTPEnvServer):
        self.app = app
        self.server = server

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        jsonrpc = scope.get("path", "").rstrip("/").endswith("/mcp")
        if self.server.active_sessions >= self.server.max_concurrent_envs:
            await self._refuse(receive, send, jsonrpc)
            return

        connection = _Connection(send, jsonrpc)
        _current_connection.set(connection)  # this task's context: seen by _create_session

        async def checked_receive() -> dict:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                problem = _frame_problem(message)
                if problem is None:
                    return message
                # the handler is waiting in receive(), so nothing else is sending right now
                await send({"type": "websocket.send", "text": _error_frame(problem, jsonrpc)})

        try:
            await self.app(scope, checked_receive, send)
        except (WebSocketDisconnect, RuntimeError) as exc:
            # RuntimeError: OpenEnv's handler closing a socket the reaper already closed
            if isinstance(exc, RuntimeError) and not connection.closed_by_server:
                raise

    async def _refuse(self, receive: Any, send: Any, jsonrpc: bool) -> None:
        """Accept, send the capacity error, wait for the client's first frame, close (1013)."""
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        active, limit = self.server.active_sessions, self.server.max_concurrent_envs
        problem = (
            f"Server at capacity: {active}/{limit} sessions active; close a session or start "
            "the server with a larger --max-sessions"
        )
        await send(
            {"type": "websocket.send", "text": _error_frame(problem, jsonrpc, "CAPACITY_REACHED")}
        )
        message = {"type": "websocket.receive"}
        try:
            async with asyncio.timeout(self.refusal_linger_s):
                message = await receive()
        except TimeoutError:
            pass
        if message["type"] != "websocket.disconnect":
            await send({"type": "websocket.close", "code": 1013})  # 1013: try again later


def _frame_problem(message: dict) -> str | None:
    """Why OpenEnv could not survive this frame, or None if it can take it."""
    text = message.get("text")
    if text is None:
        return 'binary frames are not messages: send JSON text such as {"type": "reset"}'
    try:
        value = json.loads(text)
    except ValueError:
        return None  # OpenEnv answers INVALID_JSON itself
    if not isinstance(value, dict):
        return (
            f'a message is a JSON object such as {{"type": "step", "data": '
            f'{{"text": "up"}}}}, got a JSON {_JSON_KINDS.get(type(value), "value")}'
        )
    return None


_JSON_KINDS = {list: "array", int: "number", float: "number", str: "string", bool: "boolean"}
_JSON_KINDS[type(None)] = "null"


def _error_frame(problem: str, jsonrpc: bool, code: str = "INVALID_JSON") -> str:
    """An error frame in the endpoint's dialect: OpenEnv's error message, or JSON-RPC on /mcp."""
    if jsonrpc:  # JSON-RPC 2.0: -32600 invalid request; -32000 server error (as OpenEnv's refusal)
        error = {"code": -32600 if code == "INVALID_JSON" else -32000, "message": problem}
        return json.dumps({"jsonrpc": "2.0", "error": error, "id": None})
    return json.dumps({"type": "error", "data": {"message": problem, "code": code}})


def create_app(
    env_id: str,
    *,
    env_kwargs: dict[str, Any] | None = None,
    llm: dict[str, Any] | None = None,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    session_timeout: float | None = DEFAULT_SESSION_TIMEOUT_S,
) -> FastAPI:
    """The FastAPI app serving ``env_id`` over OpenEnv's protocol (see the module docstring).

    ``max_sessions`` (>= 1) bounds the concurrent sessions; ``session_timeout`` is the idle time
    in seconds after which a session is closed (None: never). ``env_kwargs`` go to ``gym.make``;
    ``llm`` (``make_llm_env`` keyword arguments) serves prompts and takes raw model text (see
    :class:`~agentgym.integrations.openenv.ServedEnvironment`).

    One env is built and reset here, so that a bad id, missing packages or missing data fail now
    in one message (``KeyError``, :class:`agentgym.envs.MissingExtra`, ``FileNotFoundError``),
    and so that the family's shared data (catalogues, indexes) is loaded once, before concurrent
    sessions could race to load it.
    """
    import agentgym

    agentgym.entry(env_id).check_available()
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
    if session_timeout is not None and not session_timeout > 0:
        raise ValueError(f"session_timeout must be > 0 seconds or None, got {session_timeout}")
    probe = ServedEnvironment(env_id, env_kwargs, llm)
    probe.reset(seed=0)
    probe.close()
    # a partial of the class (not a lambda): OpenEnv then reads SUPPORTS_CONCURRENT_SESSIONS from
    # the class instead of building a throwaway env to check it
    factory = functools.partial(ServedEnvironment, env_id, env_kwargs, llm)
    server = _AgentGymEnvServer(
        factory,
        AgentGymAction,
        AgentGymObservation,
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=max_sessions, session_timeout=session_timeout
        ),
    )
    app = FastAPI(
        title=f"agentgym {env_id} (OpenEnv protocol)",
        version=agentgym.__version__,
        description=__doc__,
    )
    server.register_routes(app)
    app.state.openenv_server = server  # for introspection (active sessions) and tests

    # errors raised inside OpenEnv's HTTP handlers would otherwise be 500s
    async def session_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    async def bad_input(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, (ValidationError, RequestValidationError)):
            # json_safe: FastAPI's own 422 handler fails (500) when the bad input is undecodable
            # bytes, which it echoes back in the error
            detail = json_safe([{k: v for k, v in e.items() if k != "url"} for e in exc.errors()])
        else:
            detail = str(exc)
        return JSONResponse(status_code=422, content={"detail": detail})

    app.add_middleware(_WebSocketGuard, server=server)
    app.add_exception_handler(SessionError, session_error)
    app.add_exception_handler(ResetOptionError, bad_input)
    app.add_exception_handler(ValidationError, bad_input)
    app.add_exception_handler(RequestValidationError, bad_input)
    return app


def serve(
    env_id: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    env_kwargs: dict[str, Any] | None = None,
    llm: dict[str, Any] | None = None,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    session_timeout: float | None = DEFAULT_SESSION_TIMEOUT_S,
    log_level: str = "info",
) -> None:
    """Serve ``env_id`` until interrupted (blocking). Binds 127.0.0.1 unless ``host`` says otherwise.

    Everything that can fail does so before the port is bound (see :func:`create_app`).
    """
    import uvicorn

    app = create_app(
        env_id,
        env_kwargs=env_kwargs,
        llm=llm,
        max_sessions=max_sessions,
        session_timeout=session_timeout,
    )
    timeout = f"idle timeout {session_timeout:g} s" if session_timeout else "no idle timeout"
    print(
        f"agentgym serve: {env_id} over OpenEnv at ws://{host}:{port}/ws "
        f"(at most {max_sessions} sessions, {timeout}); Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level)
