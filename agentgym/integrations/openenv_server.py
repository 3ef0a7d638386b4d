"""An OpenEnv server for any agentgym id: ``agentgym serve ID --port P``.

Built on OpenEnv's own ``HTTPEnvServer`` (the ``openenv`` package, public API only), so the wire
protocol is OpenEnv's:

- ``/ws`` (WebSocket): one session per connection, with its own env. Messages are
  ``{"type": "reset", "data": {"seed": 0, "options": {...}}}``, ``{"type": "step", "data":
  {"text": "up"}}``, ``{"type": "state"}``, ``{"type": "mcp", "data": <JSON-RPC>}`` and
  ``{"type": "close"}``; answers are ``observation``, ``state``, ``mcp`` or ``error`` messages
  (``{"type": "error", "data": {"message", "code"}}``). A bad message (not JSON, not an object,
  nested deeper than :data:`MAX_FRAME_DEPTH`, wrong types, unknown type, step before reset)
  gets an error and the session keeps serving.
- ``/mcp`` (JSON-RPC over HTTP or WebSocket): the env's action as one tool, ``act(action)``
  (``tools/list``, ``tools/call``), on a session made by ``openenv/session/create``; this is
  what OpenEnv's ``MCPToolClient`` speaks.
- HTTP: ``POST /reset`` (a fresh env per call: the first observation of a seed), ``GET /health``,
  ``/schema``, ``/metadata``, ``/state``. ``POST /step`` over HTTP answers 409: an episode lives
  in a WebSocket session. Malformed requests get 422 with the reason.

What this module adds in front of OpenEnv's server (an ASGI middleware, :class:`_WebSocketGuard`):
the session bound answered with a reason (a connection beyond ``max_sessions`` gets a
``CAPACITY_REACHED`` error and is closed, never queued); an idle timeout that closes the
connection and tells the client why (an error message, then a close frame with the reason);
errors instead of a dropped session for frames OpenEnv's handler cannot survive (JSON that is
not an object, binary frames, deep nesting); lone surrogates replaced before OpenEnv decodes a
frame; a client hanging up is a debug line, not a traceback. agentgym's errors map to 4xx.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from agentgym.core import ResetOptionError
from agentgym.extras import missing_extra
from agentgym.net import is_loopback

try:
    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.types import ConcurrencyConfig
except ImportError as exc:  # one line naming the extra, not a traceback into openenv
    raise missing_extra("agentgym serve", "openenv", "openenv") from exc

from agentgym.integrations.openenv import (
    AgentGymAction,
    AgentGymObservation,
    AgentGymState,
    ServedEnvironment,
    SessionError,
    json_safe,
)

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_TIMEOUT_S",
    "MAX_FRAME_DEPTH",
    "bind_warning",
    "create_app",
    "is_loopback",
    "serve",
]

logger = logging.getLogger(__name__)

#: sessions (WebSocket connections, each with its own env) served at once by default
DEFAULT_MAX_SESSIONS = 32
#: seconds a session may stay idle before the server closes it, by default
DEFAULT_SESSION_TIMEOUT_S = 300.0
#: deepest nesting of arrays and objects a message may have; no message of the protocol needs
#: more than a handful, and OpenEnv's handler ends the session on a frame nested a few hundred
#: deep (its error reply echoes the input, which pydantic then refuses to serialise)
MAX_FRAME_DEPTH = 32
#: message types that count as activity for the idle timeout (as they do for OpenEnv's reaper)
_ACTIVITY = frozenset({"reset", "step", "mcp"})


class _WebSocketGuard:
    """ASGI middleware in front of OpenEnv's WebSocket endpoints (``/ws``, ``/mcp``).

    - A new connection beyond the session bound is refused here: accepted, sent a
      ``CAPACITY_REACHED`` error, closed (1013, "try again later") after the client's first
      frame. OpenEnv refuses too, but closes at once, so a client's first send races the close
      and it often sees a bare "connection closed" instead of the reason. A connection that
      attaches to an existing session (``?session_id=``, as ``MCPToolClient`` does) takes no
      new slot and is let through.
    - A frame OpenEnv would die on is answered here with an error, and the session keeps
      serving: OpenEnv's handlers parse each text frame and call ``.get`` on it outside their
      error handling, so JSON that is not an object (``[1, 2]``, ``3``, ``null``), a binary
      frame, or a frame nested too deep ends the session. Text that is not JSON at all still
      reaches OpenEnv, which answers ``INVALID_JSON`` itself.
    - A frame holding lone surrogates (``"\\ud800"``) reaches OpenEnv with them replaced by
      U+FFFD: the action the env applies is then text that its answer can carry.
    - Idle timeout: when no reset, step or mcp message arrives for ``session_timeout`` seconds
      after the last answer, the client is sent the reason as an error message and a close
      frame, and OpenEnv's handler sees a disconnect, which frees the session.
    - A client that hangs up, even mid-step, is normal: later sends to it are dropped and the
      hang-up is one debug line, never a traceback.
    """

    #: how long a refused connection stays open so that the client's first message reads the
    #: capacity error (instead of racing the close: OpenEnv's own refusal closes at once)
    refusal_linger_s = 5.0
    #: how long to wait for the client's answer to a close frame the server sent
    close_wait_s = 5.0

    def __init__(self, app: Any, server: HTTPEnvServer, session_timeout: float | None):
        self.app = app
        self.server = server
        self.session_timeout = session_timeout

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
            return
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        jsonrpc = scope.get("path", "").rstrip("/").endswith("/mcp")
        attaches = b"session_id=" in scope.get("query_string", b"")
        if not attaches and self.server.active_sessions >= self.server.max_concurrent_envs:
            await self._refuse(receive, send, jsonrpc)
            return
        await _Connection(self, receive, send, jsonrpc).serve(scope)

    async def _http(self, scope: dict, receive: Any, send: Any) -> None:
        """Pass an HTTP request on with lone surrogates in its JSON body replaced.

        OpenEnv's and FastAPI's answers echo parts of the request (an unknown key, a tool name);
        one holding a lone surrogate cannot be encoded, which would turn a 4xx into a 500.
        """
        chunks, message = [], {"type": "http.request", "more_body": True}
        while message["type"] == "http.request" and message.get("more_body", False):
            message = await receive()
            chunks.append(message.get("body", b""))
        if message["type"] != "http.request":  # the client left while sending
            return
        body = b"".join(chunks)
        if b"\\u" in body:  # only a \u escape can spell a lone surrogate
            body = _sanitised_body(body)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect

        await self.app(scope, replay, send)

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
        try:
            await send(
                {
                    "type": "websocket.send",
                    "text": _error_frame(problem, jsonrpc, "CAPACITY_REACHED"),
                }
            )
            message = {"type": "websocket.receive"}
            try:
                async with asyncio.timeout(self.refusal_linger_s):
                    message = await receive()
            except TimeoutError:
                pass
            if message["type"] != "websocket.disconnect":
                await send({"type": "websocket.close", "code": 1013})  # 1013: try again later
        except OSError as exc:  # the refused client hung up first
            logger.debug("refused client hung up: %s", exc)


class _Connection:
    """One WebSocket connection between its client and OpenEnv's handler (see the guard)."""

    def __init__(self, guard: _WebSocketGuard, receive: Any, send: Any, jsonrpc: bool):
        self.guard = guard
        self._receive = receive
        self._send = send
        self.jsonrpc = jsonrpc
        self.gone = False  # the client hung up, or the server closed: nothing more is sent
        self.pending: asyncio.Task | None = None  # a receive() still waiting for the client
        self.last_activity = time.monotonic()
        self.active = False  # the last frame passed to OpenEnv was activity

    async def serve(self, scope: dict) -> None:
        try:
            await self.guard.app(scope, self.receive, self.send)
        except Exception as exc:  # noqa: BLE001 - see below
            # only a hung-up client is expected here: OpenEnv's handler lets the error of a
            # send to a closed socket escape from its error handling
            if not self.gone:
                raise
            logger.debug("client hung up: %s: %s", type(exc).__name__, exc)
        finally:
            if self.pending is not None and not self.pending.done():
                self.pending.cancel()

    async def send(self, message: dict) -> None:
        if self.gone:
            return  # the client is gone: an answer to it has nowhere to go
        try:
            await self._send(message)
        except OSError as exc:  # uvicorn's ClientDisconnected and its kin
            self.gone = True
            logger.debug("client hung up before an answer: %s", exc)
        if message["type"] == "websocket.close":
            self.gone = True

    async def receive(self) -> dict:
        while True:
            message = await self._next_message()
            if message["type"] == "websocket.disconnect":
                self.gone = True
            if message["type"] != "websocket.receive":
                return message
            problem, message, kind = _check_frame(message)
            if problem is None:
                if kind in _ACTIVITY or self.jsonrpc:  # on /mcp every request is a tool call
                    self.active = True
                return message
            # the handler is waiting in receive(), so nothing else is sending right now
            await self.send({"type": "websocket.send", "text": _error_frame(problem, self.jsonrpc)})

    async def _next_message(self) -> dict:
        """The client's next message, or a disconnect once the session has been idle too long."""
        now = time.monotonic()
        if self.active:  # OpenEnv just answered a reset/step/mcp: the idle clock restarts
            self.last_activity, self.active = now, False
        timeout = self.guard.session_timeout
        if self.pending is None:
            self.pending = asyncio.ensure_future(self._receive())
        if timeout is not None:
            # wait on the pending receive without cancelling it (a cancelled receive could
            # lose a frame); it is picked up by the next call if the client speaks in time
            done, _ = await asyncio.wait({self.pending}, timeout=self.last_activity + timeout - now)
            if not done:
                return await self._expire(timeout)
        else:
            await asyncio.wait({self.pending})
        message, self.pending = self.pending.result(), None
        return message

    async def _expire(self, timeout: float) -> dict:
        """Tell the client why, close, and hand OpenEnv's handler a disconnect."""
        reason = (
            f"session closed after {timeout:g} s without a reset or step (--session-timeout); "
            "open a new connection"
        )
        await self.send(
            {"type": "websocket.send", "text": _error_frame(reason, self.jsonrpc, "SESSION_ERROR")}
        )
        short = reason.encode()[:123].decode(errors="ignore")  # RFC 6455's limit on reasons
        await self.send({"type": "websocket.close", "code": 1000, "reason": short})
        assert self.pending is not None
        await asyncio.wait({self.pending}, timeout=self.guard.close_wait_s)  # the client's close
        return {"type": "websocket.disconnect", "code": 1000}


def _check_frame(message: dict) -> tuple[str | None, dict, str | None]:
    """(why OpenEnv could not survive this frame or None, the frame to pass on, its type)."""
    text = message.get("text")
    if text is None:
        return (
            'binary frames are not messages: send JSON text such as {"type": "reset"}',
            message,
            None,
        )
    try:
        value = json.loads(text)
    except RecursionError:
        return _too_deep(), message, None
    except ValueError:
        return None, message, None  # OpenEnv answers INVALID_JSON itself
    depth, surrogates = _walk(value)
    if depth > MAX_FRAME_DEPTH:
        return _too_deep(), message, None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), "value")
        example = '{"type": "step", "data": {"text": "up"}}'
        return f"a message is a JSON object such as {example}, got a JSON {kind}", message, None
    if surrogates:
        message = dict(message, text=json.dumps(json_safe(value)))
    kind = value.get("type")
    return None, message, kind if isinstance(kind, str) else None


def _sanitised_body(body: bytes) -> bytes:
    """A JSON body with lone surrogates replaced (anything else is returned as it came)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return body  # not JSON: FastAPI answers 422 itself
    if not _walk(value)[1]:
        return body
    return json.dumps(json_safe(value)).encode()


def _walk(value: Any) -> tuple[int, bool]:
    """(nesting depth of a parsed JSON value, whether any of its text holds a surrogate)."""
    depth, surrogates = 0, False
    stack = [(value, 1)]
    while stack:  # iterative: the value may be nested deeper than Python's recursion limit
        item, level = stack.pop()
        if isinstance(item, dict):
            depth = max(depth, level)
            for key, child in item.items():
                surrogates = surrogates or _has_surrogate(key)
                stack.append((child, level + 1))
        elif isinstance(item, list):
            depth = max(depth, level)
            stack.extend((child, level + 1) for child in item)
        elif isinstance(item, str):
            surrogates = surrogates or _has_surrogate(item)
    return depth, surrogates


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _too_deep() -> str:
    return f"message nested deeper than {MAX_FRAME_DEPTH} levels of arrays and objects"


_JSON_KINDS = {list: "array", int: "number", float: "number", str: "string", bool: "boolean"}
_JSON_KINDS[type(None)] = "null"


def _error_frame(problem: str, jsonrpc: bool, code: str = "INVALID_JSON") -> str:
    """An error frame in the endpoint's dialect: OpenEnv's error message, or JSON-RPC on /mcp."""
    if jsonrpc:  # JSON-RPC 2.0: -32600 invalid request; -32000 server error (as OpenEnv's refusal)
        error = {"code": -32600 if code == "INVALID_JSON" else -32000, "message": problem}
        return json.dumps({"jsonrpc": "2.0", "error": error, "id": None})
    return json.dumps({"type": "error", "data": {"message": problem, "code": code}})


def bind_warning(host: str, port: int) -> str | None:
    """The one-line warning for a bind other machines can reach (None for loopback)."""
    if is_loopback(host):
        return None
    return (
        f"agentgym serve: warning: listening on {host}:{port} with no authentication: anyone who "
        "can reach this port can open sessions and play the env; bind 127.0.0.1 (the default) "
        "or put it behind an authenticating proxy or firewall"
    )


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
    in one message (``KeyError``, :class:`agentgym.extras.MissingExtra`, ``FileNotFoundError``),
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
    # a partial of the class (not a lambda): OpenEnv then reads SUPPORTS_CONCURRENT_SESSIONS from
    # the class instead of building a throwaway env to check it. OpenEnv's own reaper gets the
    # timeout too: it frees sessions made over HTTP (/mcp); the guard closes idle connections
    # first, telling their clients why.
    server = HTTPEnvServer(
        factory,
        AgentGymAction,
        AgentGymObservation,
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=max_sessions, session_timeout=session_timeout
        ),
        state_cls=AgentGymState,
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
        return JSONResponse(status_code=409, content={"detail": json_safe(str(exc))})

    async def bad_input(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, (ValidationError, RequestValidationError)):
            # json_safe: FastAPI's own 422 handler fails (500) when the bad input is undecodable
            # bytes, which it echoes back in the error
            detail = json_safe([{k: v for k, v in e.items() if k != "url"} for e in exc.errors()])
        else:
            detail = json_safe(str(exc))
        return JSONResponse(status_code=422, content={"detail": detail})

    app.add_middleware(_WebSocketGuard, server=server, session_timeout=session_timeout)
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

    warning = bind_warning(host, port)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    print(
        f"agentgym serve: loading {env_id} (building and resetting one env; data-backed "
        "families read their data now)...",
        file=sys.stderr,
        flush=True,
    )
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
