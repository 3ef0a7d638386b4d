"""Policies over an OpenAI-compatible HTTP server (vLLM, SGLang, llama.cpp, ``transformers serve``)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agentgym.engine.chat_template import end_ids, turn_end_id
from agentgym.engine.policies.base import (
    Messages,
    Policy,
    PolicyOutput,
    PolicyUnavailable,
    SamplingParams,
)
from agentgym.extras import require

# ---------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP
# ---------------------------------------------------------------------------------------------


def _root(base_url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/v1`` -> ``http://host:8000/v1``."""
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


#: the largest reply body read, after decompression (a chat reply is a few kB; a server that
#: sends more is broken, and a small gzip reply can inflate to gigabytes)
MAX_REPLY_BYTES = 4 * 1024 * 1024

#: the longest ``Retry-After`` honoured, in seconds (a longer one is waited this long)
MAX_RETRY_AFTER_S = 60.0


class _ReplyTooLarge(Exception):
    """The reply body passed the size limit (the connection is dropped, the rest unread)."""


class _StreamError(Exception):
    """A streamed reply carried an ``error`` event (the server failed mid-reply)."""


def _sse_data(raw: bytes) -> list[str]:
    """The ``data`` of each server-sent event in ``raw``, in order (``\\n``, ``\\r\\n`` or
    ``\\r`` line ends; ``:`` comment lines and other fields skipped; several ``data`` lines of
    one event joined by ``\\n``; a last event without its blank line kept)."""
    events, lines = [], []
    # not str.splitlines: it also splits at U+2028 and others, which JSON strings may hold raw
    for line in re.split(r"\r\n|\r|\n", raw.decode("utf-8")):
        if not line:
            if lines:
                events.append("\n".join(lines))
            lines = []
            continue
        field, _, value = line.partition(":")
        if field == "data":
            lines.append(value[1:] if value.startswith(" ") else value)
    if lines:
        events.append("\n".join(lines))
    return events


def _merge_stream(raw: bytes) -> dict[str, Any]:
    """The non-streamed chat completion body equivalent to a streamed one.

    ``raw`` is the ``text/event-stream`` body: ``data: {chunk}`` events ending with
    ``data: [DONE]`` (a stream that ends without it is read as far as it goes). Choice 0's
    ``delta.content`` pieces are joined into ``message.content``, its ``logprobs.content``
    entries are concatenated in order into ``logprobs.content`` (unchanged, so
    :func:`_chat_logprobs` reads them as it reads a non-streamed reply's), the last non-null
    ``finish_reason`` and the last ``usage`` object (the final chunk's, with
    ``stream_options.include_usage``) are kept. When some chunk carries text without
    log-probs the log-probs are dropped (``logprobs: null``): a partial list would pair
    log-probs with the wrong tokens. ``choices`` is empty when no chunk had a choice 0.

    Raises:
        _StreamError: an event is ``{"error": ...}`` (vLLM and ``transformers serve`` report a
            failure after the 200 status this way).
        json.JSONDecodeError, UnicodeDecodeError: an event is not JSON.
    """
    text: list[str] = []
    items: list[Any] = []
    complete = True  # every piece of text came with its log-probs
    seen, finish, usage = False, None, None
    for data in _sse_data(raw):
        if data.strip() == "[DONE]":
            break
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise json.JSONDecodeError("an event is not a JSON object", data, 0)
        if "error" in chunk:
            raise _StreamError(str(chunk["error"])[:200])
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        choices = chunk.get("choices")
        choice = (
            next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)
            if isinstance(choices, list)
            else None
        )
        if choice is None:
            continue
        seen = True
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        piece = delta.get("content")
        if isinstance(piece, str):
            text.append(piece)
        block = choice.get("logprobs")
        entries = block.get("content") if isinstance(block, dict) else None
        if isinstance(entries, list):
            items.extend(entries)
        elif piece:
            complete = False
        if choice.get("finish_reason") is not None:
            finish = choice["finish_reason"]
    body: dict[str, Any] = {"choices": [], "usage": usage}
    if seen:
        message = {"role": "assistant", "content": "".join(text)}
        logprobs = {"content": items} if complete and items else None
        body["choices"].append(
            {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
        )
    return body


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date), None when the
    header is absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _count(value: Any) -> int | None:
    """A usage count from a reply: a finite number >= 0 as an int, anything else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        return None
    return int(value)


class _HTTPClient:
    """httpx.AsyncClient with a deadline per request, retries with backoff, a cap on the reply
    size, and failures as values."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str | None,
        timeout: float,
        retries: int,
        backoff: float,
        max_connections: int,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ):
        require("an OpenAI-compatible server's policy (agentgym eval --base-url)", "eval", "httpx")
        import httpx

        self.base_url = _root(base_url)
        self.model = model
        self._model_lock = asyncio.Lock()
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_reply_bytes = max_reply_bytes
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._httpx = httpx
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=max_connections),
        )

    async def _send(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, Any, bytes]:
        """(status, headers, body) of one request, read at most ``max_reply_bytes`` (decoded).

        Leaving the ``stream`` block early (the size limit, a deadline, a cancelled episode)
        closes the connection, so the server sees the request abandoned."""
        async with self.client.stream(method, path, json=body) as reply:
            declared = reply.headers.get("content-length", "")
            encoded = reply.headers.get("content-encoding", "identity") not in ("", "identity")
            if not encoded and declared.isdigit() and int(declared) > self.max_reply_bytes:
                raise _ReplyTooLarge
            chunks, size = [], 0
            async for chunk in reply.aiter_bytes():
                size += len(chunk)
                if size > self.max_reply_bytes:
                    raise _ReplyTooLarge
                chunks.append(chunk)
            return reply.status_code, reply.headers, b"".join(chunks)

    async def post(
        self, path: str, body: dict[str, Any]
    ) -> tuple[dict | None, str | None, str | None, int]:
        """(JSON reply, error, error kind, attempts).

        Each attempt has ``timeout`` seconds in all (connecting, waiting and reading: a server
        trickling bytes is cut off at the deadline). Connection errors, timeouts, unreadable
        replies and 5xx/429 answers are retried with exponential backoff, or after the server's
        ``Retry-After`` where it sends one; a 4xx other than 429 and a reply over the size limit
        are not retried.

        A ``text/event-stream`` reply (a request sent with ``"stream": true``) is read to its
        end within the same deadline and size limit, counted in streamed bytes, and merged into
        the body a non-streamed request gets (:func:`_merge_stream`); an ``error`` event in it
        is an unreadable reply."""
        httpx = self._httpx
        url = f"{self.base_url}{path}"
        error, kind = "no attempt", "connection"
        wait: float | None = None
        for attempt in range(1, self.retries + 2):
            if attempt > 1:
                if wait is None:
                    wait = self.backoff * 2 ** (attempt - 2) * (0.5 + random.random())
                await asyncio.sleep(wait)
            wait = None
            try:
                async with asyncio.timeout(self.timeout):
                    status, headers, raw = await self._send("POST", path, body)
            except (TimeoutError, httpx.TimeoutException):
                error, kind = f"no complete answer from {url} within {self.timeout:g} s", "timeout"
                continue
            except _ReplyTooLarge:
                error = f"reply from {url} larger than {self.max_reply_bytes} bytes; not read"
                return None, error, "bad_response", attempt
            except httpx.HTTPError as exc:
                error, kind = f"cannot reach {url}: {type(exc).__name__}: {exc}", "connection"
                continue
            if status != 200:
                snippet = raw[:200].decode("utf-8", "replace").replace("\n", " ")
                error, kind = f"HTTP {status} from {url}: {snippet}", "http_status"
                if status == 429 or status >= 500:
                    wait = _retry_after(headers.get("retry-after"))
                    continue
                return None, error, kind, attempt
            try:
                if headers.get("content-type", "").startswith("text/event-stream"):
                    data = _merge_stream(raw)
                else:
                    data = json.loads(raw)
            except _StreamError as exc:
                error, kind = f"error event in the stream from {url}: {exc}", "bad_response"
                continue
            except (json.JSONDecodeError, UnicodeDecodeError):
                snippet = raw[:120].decode("utf-8", "replace").replace("\n", " ")
                error, kind = f"unreadable JSON from {url}: {snippet!r}", "bad_response"
                continue
            if not isinstance(data, dict):
                error, kind = f"unexpected JSON from {url}: {str(data)[:120]}", "bad_response"
                continue
            return data, None, None, attempt
        return None, error, kind, self.retries + 1

    async def model_name(self) -> str:
        """The served model: the one given, else the first of ``GET /v1/models`` (asked once)."""
        async with self._model_lock:
            if self.model is None:
                served = await self.served_models()
                if not served:
                    return "default"  # ask again next turn: the server may still be starting
                self.model = served[0]
            return self.model

    async def served_models(self) -> list[str] | None:
        """The ids listed by ``GET /v1/models``, or None when the server does not list them."""
        listing = await self.get("/models")
        try:
            return [str(m["id"]) for m in listing["data"]]  # type: ignore[index]
        except (TypeError, KeyError):
            return None

    async def get(self, path: str) -> dict | None:
        try:
            async with asyncio.timeout(self.timeout):
                status, _, raw = await self._send("GET", path)
            return json.loads(raw) if status == 200 else None
        except (
            TimeoutError,
            _ReplyTooLarge,
            self._httpx.HTTPError,
            json.JSONDecodeError,
            UnicodeDecodeError,
        ):
            return None

    async def aclose(self) -> None:
        await self.client.aclose()


class OpenAIChatPolicy(Policy):
    """Chat completions from any OpenAI-compatible server (vLLM, SGLang, llama.cpp,
    ``transformers serve``).

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` (``/v1`` is added if missing).
        api_key: sent as a bearer token when given.
        model: the served model's name; None asks ``GET /v1/models`` once and takes the first.
        timeout: seconds per request.
        retries: further tries after a timeout, a connection error, a 5xx/429 answer or an
            unreadable reply, with exponential backoff from ``backoff`` seconds.
        logprobs: ask for the sampled tokens' ids and log-probs (``logprobs: true,
            top_logprobs: 1``); kept when returned (vLLM, llama.cpp). Both servers return the
            log-probs of the model's distribution before temperature and top-p (the local
            policy records them at the sampling temperature: the same at temperature 1).
        max_reply_bytes: replies larger than this (after decompression) are not read; the turn
            fails with ``error_kind="bad_response"``. A streamed reply counts its streamed
            bytes (the events, a few times the text's size with log-probs).
        stream: send ``"stream": true`` (with ``stream_options.include_usage``) and read the
            server-sent events. The returned :class:`PolicyOutput` is the same as without it
            (text, token ids, log-probs, finish reason, usage). What it changes is what the
            server does with an abandoned request (the deadline passed, the episode
            cancelled): the client hangs up either way, but ``transformers serve`` stops
            generating only for a streamed request, and otherwise goes on generating the
            abandoned reply. Off by default: vLLM and llama.cpp stop either way.

    A 4xx answer other than 429 before any request has succeeded (a wrong ``model`` name, a
    wrong path, a refused key) raises :class:`PolicyUnavailable`: every later turn would get the
    same answer. After a first success it is a failed turn like any other.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        *,
        timeout: float = 120.0,
        retries: int = 2,
        backoff: float = 0.5,
        logprobs: bool = True,
        max_connections: int = 256,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        stream: bool = False,
    ):
        self.http = _HTTPClient(
            base_url, api_key, model, timeout, retries, backoff, max_connections, max_reply_bytes
        )
        self.logprobs = logprobs
        self.stream = stream
        self._answered = False  # a request has succeeded: a later 4xx is that turn's failure
        # vLLM's extension field; strict servers (transformers serve) answer 422 to unknown
        # fields, so it is dropped for good after the first such answer.
        self._token_ids_field = logprobs

    async def act(
        self, messages: Messages, params: SamplingParams, info: dict[str, Any] | None = None
    ) -> PolicyOutput:
        started = time.perf_counter()
        body: dict[str, Any] = {
            "model": await self.http.model_name(),
            "messages": messages,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
        }
        if self.logprobs:
            # top_logprobs 1, not 0: llama.cpp returns no log-probs at all for 0. vLLM returns
            # each sampled token as "token_id:<id>" with the flag below, llama.cpp gives its
            # "id": the ids trained are the ids sampled (no re-tokenisation of the text).
            body.update(logprobs=True, top_logprobs=1)
        if self._token_ids_field:
            body["return_tokens_as_token_ids"] = True
        if self.stream:
            body.update(stream=True, stream_options={"include_usage": True})
        data, error, kind, attempts = await self.http.post("/chat/completions", body)
        if (
            data is None
            and "return_tokens_as_token_ids" in body  # (another request may have dropped it)
            and error is not None
            and "return_tokens_as_token_ids" in error
        ):
            self._token_ids_field = False
            del body["return_tokens_as_token_ids"]
            data, error, kind, attempts = await self.http.post("/chat/completions", body)
        latency = time.perf_counter() - started
        if data is None and not self._answered and _client_error(error):
            raise PolicyUnavailable(await self._refused(error))
        if data is None:
            return PolicyOutput(
                "", latency_s=latency, error=error, error_kind=kind, attempts=attempts
            )
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"]
            if text is None:
                text = ""
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
        except (KeyError, IndexError, TypeError) as exc:
            return PolicyOutput(
                "",
                latency_s=latency,
                error=f"reply without choices[0].message.content ({exc}): {str(data)[:160]}",
                error_kind="bad_response",
                attempts=attempts,
            )
        self._answered = True
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        token_ids, logprobs = _chat_logprobs(choice.get("logprobs"))
        return PolicyOutput(
            text,
            token_ids=token_ids,
            logprobs=logprobs,
            prompt_tokens=_count(usage.get("prompt_tokens")),
            completion_tokens=_count(usage.get("completion_tokens")),
            latency_s=latency,
            finish_reason=choice.get("finish_reason"),
            attempts=attempts,
        )

    async def _refused(self, error: str) -> str:
        """What to tell the user when the server refuses the first request."""
        served = await self.http.served_models()
        model = self.http.model
        hint = f"the server refuses the first request ({error})"
        if served and model not in served:
            return f"{hint}; it serves {', '.join(served)}, not {model!r}: check --served-model"
        return f"{hint}; check --base-url, --served-model and --api-key"

    async def aclose(self) -> None:
        await self.http.aclose()

    def describe(self) -> dict[str, Any]:
        return {
            "policy": "openai-chat",
            "base_url": self.http.base_url,
            "model": self.http.model,
            "stream": self.stream,
        }


def _chat_logprobs(block: Any) -> tuple[list[int] | None, list[float] | None]:
    """Token ids and log-probs from a chat choice's ``logprobs.content`` (None when absent).

    One entry per sampled token, ``{"token": ..., "logprob": ...}``. The id is llama.cpp's
    ``"id": <int>`` field, or vLLM's ``"token": "token_id:<id>"`` (with
    ``return_tokens_as_token_ids``); servers that give neither give log-probs only. A
    log-prob that is not a finite number <= 0 (NaN, a string) drops them all.
    """
    try:
        content = block["content"]
        logprobs = [float(t["logprob"]) for t in content]
    except (TypeError, KeyError, ValueError):
        return None, None
    if not all(lp <= 0.0 and lp != float("-inf") for lp in logprobs):  # NaN fails <= too
        return None, None
    ids: list[int] | None = []
    for t in content:
        token, token_id = t.get("token", ""), t.get("id")
        if isinstance(token_id, int) and not isinstance(token_id, bool) and token_id >= 0:
            ids.append(token_id)
        elif isinstance(token, str) and token.startswith("token_id:") and token[9:].isdigit():
            ids.append(int(token[9:]))
        else:
            ids = None
            break
    return ids, logprobs


def _client_error(error: str | None) -> bool:
    """Whether a request failed with a 4xx answer other than 429 (the server refuses it)."""
    return bool(error) and error.startswith("HTTP 4") and not error.startswith("HTTP 429")


class OpenAICompletionsScorer:
    """Log-likelihood of candidate continuations from a server's prompt log-probs.

    ``POST /v1/completions`` with ``echo: true, logprobs: 1, max_tokens: 1`` and one prompt per
    candidate (the chat-templated prompt followed by the candidate): the server returns the
    log-prob of every prompt token (vLLM does). The chat template is applied here, with the
    tokenizer at ``tokenizer`` (a folder or hub name), because ``/v1/completions`` takes raw text.
    A server that returns no prompt log-probs raises :class:`PolicyUnavailable` on the first
    turn (``transformers serve`` ignores ``logprobs``).
    """

    def __init__(
        self,
        base_url: str,
        tokenizer: str | Path,
        api_key: str | None = None,
        model: str | None = None,
        *,
        timeout: float = 120.0,
        retries: int = 2,
        backoff: float = 0.5,
    ):
        require("scoring actions on a server (its tokenizer, here)", "train", "transformers")
        from transformers import AutoTokenizer

        self.http = _HTTPClient(base_url, api_key, model, timeout, retries, backoff, 256)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        # The token the chat template closes a reply with ends each candidate, as in the local
        # scorer (not the generation config's first end id: Llama 3.x lists <|end_of_text|>).
        self.end_text = self.tokenizer.decode(
            [turn_end_id(self.tokenizer, _end_ids(self.tokenizer))]
        )
        self._list_prompts = True

    async def score(
        self, messages: Messages, actions: Sequence[str]
    ) -> tuple[list[tuple[float, int]] | None, str | None, str | None]:
        """((sum log-prob, token count) per action, error, error kind)."""
        prefix = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        prompts = [prefix + a + self.end_text for a in actions]
        model = await self.http.model_name()

        def body(prompt: str | list[str]) -> dict[str, Any]:
            return {
                "model": model,
                "prompt": prompt,
                "max_tokens": 1,
                "echo": True,
                "logprobs": 1,
                "temperature": 0,
            }

        choices: list[Any] | None = None
        if self._list_prompts:  # all candidates in one request, where the server takes a list
            data, error, kind, _ = await self.http.post("/completions", body(prompts))
            if data is None and not _client_error(error):
                return None, error, kind
            if data is None:
                self._list_prompts = False  # refused: one request per candidate from now on
            else:
                choices = data.get("choices")
        if choices is None:
            replies = await asyncio.gather(
                *(self.http.post("/completions", body(p)) for p in prompts)
            )
            choices = []
            for index, (data, error, kind, _) in enumerate(replies):
                if data is None and _client_error(error):
                    raise PolicyUnavailable(
                        f"{error}; scoring admissible actions over HTTP needs /v1/completions "
                        "with echo=true and logprobs (vLLM serves it); use --model PATH for a "
                        "local model, or --policy free"
                    )
                if data is None:
                    return None, error, kind
                try:
                    choices.append({**data["choices"][0], "index": index})
                except (KeyError, IndexError, TypeError):
                    return None, f"unreadable /completions reply: {str(data)[:120]}", "bad_response"
        out: list[tuple[float, int] | None] = [None] * len(prompts)
        try:
            for i, choice in enumerate(choices):
                index = int(choice.get("index", i))
                lp = choice.get("logprobs") or {}
                offsets, values = lp.get("text_offset"), lp.get("token_logprobs")
                if not offsets or not values:
                    raise PolicyUnavailable(
                        f"{self.http.base_url}/completions returned no prompt log-probs (echo=true, "
                        "logprobs=1): scoring admissible actions over HTTP needs a server that "
                        "returns them (vLLM does; transformers serve does not); use --model PATH "
                        "for a local model, or --policy free"
                    )
                end = len(prompts[index])
                picked = [
                    v
                    for o, v in zip(offsets, values, strict=False)
                    if len(prefix) <= o < end and v is not None
                ]
                out[index] = (float(sum(picked)), len(picked))
        except PolicyUnavailable:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return None, f"unreadable /completions reply ({exc})", "bad_response"
        if any(o is None for o in out):
            return None, "the /completions reply misses some candidates", "bad_response"
        return out, None, None  # type: ignore[return-value]

    async def aclose(self) -> None:
        await self.http.aclose()


def _end_ids(tokenizer: Any) -> list[int]:
    """The end ids of the model whose tokenizer ``tokenizer`` (a loaded one, from a folder or hub
    name with a ``generation_config.json`` where there is one) is."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(tokenizer.name_or_path)
    except (OSError, ValueError):  # no generation config beside the tokenizer
        config = None
    return end_ids(SimpleNamespace(generation_config=config), tokenizer)
