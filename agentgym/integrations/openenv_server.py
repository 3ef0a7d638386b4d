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
  in a WebSocket session. Malformed requests get 422 with the reason; a body longer than
  :data:`MAX_MESSAGE_BYTES` gets 413 before it is read.

``/mcp`` is OpenEnv's tool endpoint (``tools/list``, ``tools/call`` and OpenEnv's session methods),
not a general MCP server: the MCP handshake (``initialize``) is not implemented, so MCP clients
that start with it (Claude Desktop, the ``mcp`` SDK's clients) cannot use it; OpenEnv's
``MCPToolClient`` can.

What this module adds in front of OpenEnv's server (an ASGI middleware, :class:`_WebSocketGuard`):
the session bound answered with a reason (a connection beyond ``max_sessions`` gets a
``CAPACITY_REACHED`` error and is closed, never queued); an idle timeout that closes the
connection and tells the client why (an error message, then a close frame with the reason);
errors instead of a dropped session for frames OpenEnv's handler cannot survive (JSON that is
not an object, binary frames, deep nesting, numbers too long to read); bounds on the size and
work of a message, checked before it is parsed, with the parse of a long message done off the
event loop (so one client's frame never stalls the others); lone surrogates replaced before
OpenEnv decodes a frame; a client hanging up is one debug line, not a traceback. agentgym's
errors map to 4xx.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import time
from typing import Any

from agentgym.core import ResetOptionError, describe_action
from agentgym.net import is_loopback

try:  # fastapi and pydantic come with openenv (its server is built on them)
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.mcp_types import JsonRpcRequest, WSMCPMessage
    from openenv.core.env_server.types import (
        ConcurrencyConfig,
        WSCloseMessage,
        WSResetMessage,
        WSStateMessage,
        WSStepMessage,
    )
    from pydantic import BaseModel, ValidationError
except ImportError as exc:  # one line naming the extra, not a traceback into openenv
    from agentgym.integrations._openenv_missing import missing_openenv

    raise missing_openenv("agentgym serve", exc) from exc

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
    "MAX_FRAME_VALUES",
    "MAX_MESSAGE_BYTES",
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
#: longest WebSocket message and HTTP request body, in bytes (UTF-8): a longer one gets an error
#: (WebSocket; the session keeps serving) or 413 (HTTP) without being parsed. An action is one
#: line of text and a reset a few options, so this leaves room for long model outputs in LLM
#: mode while bounding what one message costs the server. (uvicorn itself drops a connection
#: whose frame exceeds its ``ws_max_size``, 16 MiB by default.)
MAX_MESSAGE_BYTES = 1 << 20
#: most JSON values (objects, arrays, strings, numbers...) one message may hold: no message of
#: the protocol needs more than a few dozen, and each one costs validation (and an error listing)
MAX_FRAME_VALUES = 10_000
#: validation problems listed in one error answer
_MAX_ERRORS_SHOWN = 5
#: messages longer than this (characters) are parsed in a worker thread, off the event loop
_INLINE_PARSE_CHARS = 16_384
#: message types that count as activity for the idle timeout (as they do for OpenEnv's reaper)
_ACTIVITY = frozenset({"reset", "step", "mcp"})


class _WebSocketGuard:
    """ASGI middleware in front of OpenEnv's endpoints (``/ws``, ``/mcp`` and the HTTP routes).

    - A new connection beyond the session bound is refused here: accepted, sent a
      ``CAPACITY_REACHED`` error, closed (1013, "try again later") after the client's first
      frame. OpenEnv refuses too, but closes at once, so a client's first send races the close
      and it often sees a bare "connection closed" instead of the reason. Connections that
      come in a burst all pass this check before any of their sessions counts; OpenEnv refuses
      those beyond the bound, and the guard holds each such refusal open, in its own words,
      until the client has read it. A
      connection that attaches to an existing session (``?session_id=``, as ``MCPToolClient``
      does) takes no new slot and is let through.
    - Every frame is checked before OpenEnv sees it, cheapest check first: its length
      (:data:`MAX_MESSAGE_BYTES`, before any parsing), then, once parsed (in a worker thread
      when it is long), its number of values (:data:`MAX_FRAME_VALUES`) and depth
      (:data:`MAX_FRAME_DEPTH`), then its shape against OpenEnv's message models. A frame
      that fails gets a short error that names the problem without echoing the frame, and
      the session keeps serving; OpenEnv's handler only ever sees frames it can answer
      cheaply. (It would otherwise end the session on JSON that is not an object, a binary
      frame, a deep nesting or a number too long to read, and answer a frame of a million
      unknown keys with every one of them echoed back.)
    - A frame holding lone surrogates (``"\\ud800"``) reaches OpenEnv with them replaced by
      U+FFFD: the action the env applies is then text that its answer can carry.
    - Idle timeout: when no reset, step or mcp message arrives for ``session_timeout`` seconds
      after the last answer, the client is sent the reason as an error message and a close
      frame, and OpenEnv's handler sees a disconnect, which frees the session.
    - A client that hangs up, even mid-step, is normal: later sends to it are dropped and the
      hang-up is one debug line per connection, never a traceback.
    - HTTP: a body longer than :data:`MAX_MESSAGE_BYTES` is answered 413 before it is
      buffered; a ``POST /mcp`` JSON-RPC request that is not valid (its fields, a ``session_id``
      that is not a string, more than :data:`MAX_FRAME_VALUES` values) is answered 422 with a
      short JSON-RPC error.
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
        """Pass an HTTP request on, bounded in size, with lone surrogates in its JSON replaced.

        OpenEnv's and FastAPI's answers echo parts of the request (an unknown key, a tool name);
        one holding a lone surrogate cannot be encoded, which would turn a 4xx into a 500.
        """
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > MAX_MESSAGE_BYTES:
            await _http_answer(send, 413, {"detail": _too_long(int(declared), "request body")})
            return
        chunks, size, message = [], 0, {"type": "http.request", "more_body": True}
        while message["type"] == "http.request" and message.get("more_body", False):
            message = await receive()
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > MAX_MESSAGE_BYTES:  # a chunked body with no length said: stop reading
                await _http_answer(send, 413, {"detail": _too_long(size, "request body")})
                return
        if message["type"] != "http.request":  # the client left while sending
            return
        body = b"".join(chunks)
        del chunks
        mcp = scope.get("method") == "POST" and scope.get("path", "").rstrip("/").endswith("/mcp")
        # only a \u escape can spell a lone surrogate; a JSON-RPC request is checked in full
        # (OpenEnv's answer to a bad one lists every problem, each key of it included)
        if b"\\u" in body or (mcp and body):
            if len(body) > _INLINE_PARSE_CHARS:
                body, problem = await asyncio.to_thread(_checked_body, body, mcp)
            else:
                body, problem = _checked_body(body, mcp)
            if problem is not None:
                await _http_answer(send, 422, problem)
                return
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
        try:
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.send", "text": self.capacity_error(jsonrpc)})
            await _linger_then_close(receive, send, self.refusal_linger_s)
        except OSError as exc:  # the refused client hung up first
            logger.debug("refused client hung up: %s", exc)

    def capacity_error(self, jsonrpc: bool) -> str:
        """The error frame refusing a session because all ``--max-sessions`` are taken."""
        active, limit = self.server.active_sessions, self.server.max_concurrent_envs
        problem = (
            f"Server at capacity: {min(active, limit)}/{limit} sessions active; close a session "
            "or start the server with a larger --max-sessions"
        )
        return _error_frame(problem, jsonrpc, "CAPACITY_REACHED")


async def _linger_then_close(
    receive: Any, send: Any, linger_s: float, close: dict | None = None
) -> None:
    """Wait up to ``linger_s`` for the client's first frame (so it reads the error sent before
    it, instead of racing the close), then close: with ``close`` (a close message), or 1013
    (try again later)."""
    message = {"type": "websocket.receive"}
    try:
        async with asyncio.timeout(linger_s):
            message = await receive()
    except TimeoutError:
        pass
    if message["type"] != "websocket.disconnect":
        await send(close or {"type": "websocket.close", "code": 1013})


class _Connection:
    """One WebSocket connection between its client and OpenEnv's handler (see the guard)."""

    def __init__(self, guard: _WebSocketGuard, receive: Any, send: Any, jsonrpc: bool):
        self.guard = guard
        self._receive = receive
        self._send = send
        self.jsonrpc = jsonrpc
        self.gone = False  # the client hung up, or the server closed: nothing more is sent
        self.logged = False  # the hang-up has had its debug line
        self.pending: asyncio.Task | None = None  # a receive() still waiting for the client
        self.last_activity = time.monotonic()
        self.active = False  # the last frame passed to OpenEnv was activity
        self.receives = 0  # calls of receive() by OpenEnv's handler (the 1st: the handshake)
        self.peer: Any = None  # the client's (host, port), named in the hang-up line

    def _hung_up(self, what: str, exc: BaseException) -> None:
        self.gone = True
        if not self.logged:  # one line per connection, whichever send or receive noticed it
            self.logged = True
            logger.debug(
                "%s (%s): %s: %s",
                what,
                self.peer,
                type(exc).__name__,
                exc,
                extra={"peer": self.peer},
            )

    async def serve(self, scope: dict) -> None:
        self.peer = tuple(scope["client"]) if scope.get("client") else None
        try:
            await self.guard.app(scope, self.receive, self.send)
        except Exception as exc:  # noqa: BLE001 - see below
            # only a hung-up client is expected here: OpenEnv's handler lets the error of a
            # send to a closed socket escape from its error handling
            if not self.gone:
                raise
            self._hung_up("client hung up", exc)
        finally:
            if self.pending is not None and not self.pending.done():
                self.pending.cancel()

    async def send(self, message: dict) -> None:
        if self.gone:
            return  # the client is gone: an answer to it has nowhere to go
        if self.receives < 2 and message["type"] == "websocket.send":
            # OpenEnv answers before asking for a first frame only to refuse the session; a
            # refusal for capacity (connections that came in a burst, all let through by the
            # guard before any of their sessions counted) gets the guard's words
            if _is_capacity_refusal(message.get("text")):
                message = {
                    "type": "websocket.send",
                    "text": self.guard.capacity_error(self.jsonrpc),
                }
        if message["type"] == "websocket.close" and self.receives < 2:
            # OpenEnv closes before asking for a first frame: it refused to make the session
            # (capacity, a failing env factory) and sent the reason just before; let the client
            # read it before the close, as the guard's own refusal does
            self.gone = True
            try:
                await _linger_then_close(
                    self._receive, self._send, self.guard.refusal_linger_s, message
                )
            except OSError as exc:
                self._hung_up("refused client hung up", exc)
            return
        try:
            await self._send(message)
        except OSError as exc:  # uvicorn's ClientDisconnected and its kin
            self._hung_up("client hung up before an answer", exc)
        if message["type"] == "websocket.close":
            self.gone = True

    async def receive(self) -> dict:
        self.receives += 1
        while True:
            message = await self._next_message()
            if message["type"] == "websocket.disconnect":
                self.gone = True
            if message["type"] != "websocket.receive":
                return message
            answer, message, kind = await self._check(message)
            if answer is None:
                if kind in _ACTIVITY or self.jsonrpc:  # on /mcp every request is a tool call
                    self.active = True
                return message
            # the handler is waiting in receive(), so nothing else is sending right now
            await self.send({"type": "websocket.send", "text": answer})

    async def _check(self, message: dict) -> tuple[str | None, dict, str | None]:
        """(the error frame answering a frame OpenEnv must not see or None, the frame, its type).

        The length is checked before anything else; a long frame is parsed in a worker thread.
        """
        text = message.get("text")
        if text is None:
            problem = 'binary frames are not messages: send JSON text such as {"type": "reset"}'
            return _error_frame(problem, self.jsonrpc), message, None
        size = len(text)
        if size > MAX_MESSAGE_BYTES // 4:  # only then can the UTF-8 length pass the bound
            size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_MESSAGE_BYTES:
            return _error_frame(_too_long(size, "message"), self.jsonrpc), message, None
        if size > _INLINE_PARSE_CHARS:
            # a lower bound on the values, counted without parsing: every string has two
            # unescaped quotes and at most every other value is a key's string
            strings = (text.count('"') - text.count('\\"')) // 2
            if strings // 2 > MAX_FRAME_VALUES:
                return _error_frame(_too_many_values(), self.jsonrpc), message, None
            answer, text, kind = await asyncio.to_thread(_check_frame, text, self.jsonrpc)
        else:
            answer, text, kind = _check_frame(text, self.jsonrpc)
        if answer is None and text is not message["text"]:
            message = dict(message, text=text)
        return answer, message, kind

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


#: OpenEnv's model of each message type a /ws session takes
_MESSAGE_MODELS: dict[str, type[BaseModel]] = {
    "reset": WSResetMessage,
    "step": WSStepMessage,
    "state": WSStateMessage,
    "close": WSCloseMessage,
    "mcp": WSMCPMessage,
}
#: step payloads OpenEnv reads as MCP actions instead of the env's action
_MCP_ACTION_TYPES = frozenset({"list_tools", "call_tool"})


def _is_capacity_refusal(text: str | None) -> bool:
    """Whether ``text`` is OpenEnv's refusal of a session at capacity (in either dialect)."""
    if not text or "sessions" not in text:
        return False
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if not isinstance(value, dict):
        return False
    data = value.get("data") if value.get("type") == "error" else (value.get("error") or {})
    if not isinstance(data, dict):
        return False
    details = data.get("data") if isinstance(data.get("data"), dict) else data
    return data.get("code") == "CAPACITY_REACHED" or "max_sessions" in details


def _check_frame(text: str, jsonrpc: bool) -> tuple[str | None, str, str | None]:
    """(the error frame answering ``text`` or None, the text to pass on, its message type).

    Pure and thread-safe: the guard calls it in a worker thread for long frames. One parse and
    one walk (values, depth and surrogates together) serve every check; OpenEnv's handler parses
    again only a frame that passed, which is bounded in size and values, and which it answers
    without failing and without echoing it at length.
    """
    try:
        value = json.loads(text)
    except RecursionError:
        return _error_frame(_too_deep(), jsonrpc), text, None
    except json.JSONDecodeError as exc:  # its message says where, never what
        return _error_frame(f"Invalid JSON: {exc}", jsonrpc, "PARSE_ERROR"), text, None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        problem = (
            f"a number in the message has more than {sys.get_int_max_str_digits()} digits; "
            "send such a value as a string"
        )
        return _error_frame(problem, jsonrpc), text, None
    problem, surrogates = _walk(value)
    if problem is not None:
        return _error_frame(problem, jsonrpc), text, None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), "value")
        example = '{"type": "step", "data": {"text": "up"}}'
        problem = f"a message is a JSON object such as {example}, got a JSON {kind}"
        return _error_frame(problem, jsonrpc), text, None
    if jsonrpc:
        problem = _rpc_problem(value)
        if problem is not None:
            return _error_frame(problem, jsonrpc), text, None
        kind = None
    else:
        answer, kind = _message_problem(value)
        if answer is not None:
            return answer, text, None
    if surrogates:
        text = json.dumps(json_safe(value))
    return None, text, kind


def _message_problem(value: dict) -> tuple[str | None, str | None]:
    """(the error frame for a /ws message OpenEnv would fail or echo on, or None; its type)."""
    kind = value.get("type")
    model = _MESSAGE_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        shown = describe_action(kind if isinstance(kind, str) else json.dumps(kind), limit=40)
        problem = f"Unknown message type: {shown}; send one of {', '.join(_MESSAGE_MODELS)}"
        return _error_frame(problem, False, "UNKNOWN_TYPE"), None
    try:
        model.model_validate(value)
        data = value.get("data")
        if kind == "step" and data.get("type") not in _MCP_ACTION_TYPES:
            AgentGymAction.model_validate(data)
    except ValidationError as exc:
        problem = f"Invalid message: {_validation_summary(exc)}"
        return _error_frame(problem, False, "VALIDATION_ERROR"), None
    if kind == "mcp":
        problem = _rpc_problem(value["data"])
        if problem is not None:  # answered as OpenEnv answers an mcp message: in JSON-RPC
            rpc = json.loads(_error_frame(problem, True))
            return json.dumps({"type": "mcp", "data": rpc}), None
    return None, kind


def _rpc_problem(request: dict) -> str | None:
    """Why a JSON-RPC request OpenEnv's MCP handler would fail or echo on is bad, or None."""
    try:
        JsonRpcRequest.model_validate(request)
    except ValidationError as exc:
        return f"Invalid request: {_validation_summary(exc)}"
    params = request.get("params")
    if isinstance(params, dict) and "session_id" in params:
        session_id = params["session_id"]
        if not isinstance(session_id, str):
            kind = _JSON_KINDS.get(type(session_id), "value")
            return (
                "Invalid params: session_id is the string openenv/session/create answered, "
                f"got a JSON {kind}"
            )
    return None


def _validation_summary(exc: ValidationError, limit: int = 3) -> str:
    """The first ``limit`` problems of a validation error, locations shortened, inputs left out."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    shown = [
        f"{'.'.join(describe_action(str(part), limit=40) for part in e['loc']) or 'message'}: "
        f"{e['msg']}"
        for e in errors[:limit]
    ]
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return "; ".join(shown) + more


def _checked_body(body: bytes, mcp: bool) -> tuple[bytes, dict | None]:
    """(an HTTP JSON body with lone surrogates replaced, the 422 answer it gets or None).

    A body that is not JSON is returned as it came: FastAPI and OpenEnv answer it themselves.
    """
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return body, None
    problem, surrogates = _walk(value)
    if problem is None and mcp and isinstance(value, dict):
        problem = _rpc_problem(value)
    if problem is not None:
        if not mcp:
            return body, {"detail": problem}
        request_id = value.get("id") if isinstance(value, dict) else None
        request_id = request_id if isinstance(request_id, (str, int)) else None
        error = {"code": -32602 if "Invalid params" in problem else -32600, "message": problem}
        return body, {"jsonrpc": "2.0", "error": error, "id": request_id}
    if not surrogates:
        return body, None
    return json.dumps(json_safe(value)).encode(), None


async def _http_answer(send: Any, status: int, content: Any) -> None:
    """Answer an HTTP request with ``content`` as JSON, without reading (more of) its body."""
    body = json.dumps(content).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 413:  # the unread rest of the body would be taken for the next request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _walk(value: Any) -> tuple[str | None, bool]:
    """(why a parsed JSON value is too big or too deep or None, whether its text holds a
    surrogate). Stops at the first bound passed."""
    count, surrogates = 0, False
    stack = [(value, 1)]
    while stack:  # iterative: the value may be nested deeper than Python's recursion limit
        item, level = stack.pop()
        count += 1
        if count > MAX_FRAME_VALUES:
            return _too_many_values(), surrogates
        if isinstance(item, dict):
            if level > MAX_FRAME_DEPTH:
                return _too_deep(), surrogates
            for key, child in item.items():
                surrogates = surrogates or _has_surrogate(key)
                stack.append((child, level + 1))
        elif isinstance(item, list):
            if level > MAX_FRAME_DEPTH:
                return _too_deep(), surrogates
            stack.extend((child, level + 1) for child in item)
        elif isinstance(item, str):
            surrogates = surrogates or _has_surrogate(item)
    return None, surrogates


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _too_deep() -> str:
    return f"message nested deeper than {MAX_FRAME_DEPTH} levels of arrays and objects"


def _too_many_values() -> str:
    return (
        f"message holds more than {MAX_FRAME_VALUES} JSON values; send one action or reset "
        "per message"
    )


def _too_long(size: int, what: str) -> str:
    return (
        f"{what} of {size} bytes is longer than the server's limit of {MAX_MESSAGE_BYTES} bytes; "
        "send one action or reset per message"
    )


_JSON_KINDS = {list: "array", dict: "object", int: "number", float: "number", str: "string"}
_JSON_KINDS.update({bool: "boolean", type(None): "null"})


def _error_frame(problem: str, jsonrpc: bool, code: str = "INVALID_JSON") -> str:
    """An error frame in the endpoint's dialect: OpenEnv's error message, or JSON-RPC on /mcp.

    ``PARSE_ERROR`` (text that is not JSON) is OpenEnv's ``INVALID_JSON`` on ``/ws`` and
    JSON-RPC's -32700 on ``/mcp``.
    """
    if jsonrpc:  # JSON-RPC 2.0: -32700 parse error; -32600 invalid request; -32000 server error
        number = {"PARSE_ERROR": -32700, "INVALID_JSON": -32600}.get(code, -32000)
        error = {"code": number, "message": problem}
        return json.dumps({"jsonrpc": "2.0", "error": error, "id": None})
    code = "INVALID_JSON" if code == "PARSE_ERROR" else code
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
            # bytes, which it echoes back in the error; the input itself is never echoed (it may
            # be a megabyte), nor are more than a few of the problems
            errors = [
                {k: v for k, v in e.items() if k not in ("url", "input")}
                for e in exc.errors()[:_MAX_ERRORS_SHOWN]
            ]
            detail = json_safe(errors)
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
