"""Async language-model policies for the rollout engine: an OpenAI-compatible server, a local
transformers model, and scored admissible actions.

Every policy answers one turn with :meth:`Policy.act` and returns a :class:`PolicyOutput`, never
raising for a failure of the model or the server: a server that is down, slow, answers 500 or
garbage comes back as an output with ``error`` set (the engine makes that turn an invalid step,
and ends the episode truncated after repeated errors). Only a caller error (a policy that cannot
work at all with this backend, :class:`PolicyUnavailable`) raises, once, with what is needed.

- :class:`OpenAIChatPolicy`: ``POST /v1/chat/completions`` with httpx; the server applies the
  chat template. Token ids and log-probs are kept when the server returns them (vLLM does with
  ``logprobs``; ``transformers serve`` ignores the field).
- :class:`TransformersPolicy`: a local model in this process. Requests from many episodes are
  gathered by a micro-batcher into one batched ``generate`` in a single worker thread, and the
  sampled token ids and their log-probs are recorded (the ids trained are the ids sampled).
- :class:`ScoredActionPolicy`: scores each candidate action by the model's log-likelihood of it
  as the reply to the prompt and picks the best (or samples from the softmax); the scores come
  from a local model (:class:`TransformersPolicy`) or a server returning prompt log-probs
  (:class:`OpenAICompletionsScorer`, ``/v1/completions`` with ``echo`` + ``logprobs``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import queue
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "OpenAIChatPolicy",
    "OpenAICompletionsScorer",
    "Policy",
    "PolicyOutput",
    "PolicyUnavailable",
    "SamplingParams",
    "ScoredActionPolicy",
    "TransformersPolicy",
    "candidate_actions",
]

Messages = list[dict[str, str]]


class PolicyUnavailable(RuntimeError):
    """The policy cannot work with this backend at all (not a per-request failure)."""


@dataclass(frozen=True)
class SamplingParams:
    """How one turn is sampled."""

    temperature: float = 1.0
    """0 is greedy"""
    top_p: float = 1.0
    max_tokens: int = 256
    """most new tokens per turn"""


@dataclass
class PolicyOutput:
    """One turn's answer from a policy."""

    text: str
    """the model's raw text ("" when there is none, see ``error``)"""
    token_ids: list[int] | None = None
    """the sampled token ids, when the backend gives them"""
    logprobs: list[float] | None = None
    """the log-prob of each sampled token under the sampling distribution, when given"""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float = 0.0
    """wall time from the request to the answer (queueing included)"""
    error: str | None = None
    """why there is no usable answer (timeout, HTTP status, unreadable reply...), else None"""
    error_kind: str | None = None
    """a short class of ``error`` for summaries: timeout, http_status, connection, bad_response,
    no_candidates, model_error"""
    finish_reason: str | None = None
    action_scores: dict[str, float] | None = None
    """scored policy: each candidate action's score"""
    attempts: int = 1
    messages: list[dict[str, str]] | None = None
    """the messages actually sent, where the policy changed the ones it was given"""


class Policy(ABC):
    """A model that answers one turn: chat messages in, text (and tokens) out."""

    #: whether :meth:`act` wants the plain action format (the reply is an action, not a
    #: ``<think>``/``<action>`` response); the scored policy does
    plain_actions: bool = False

    @abstractmethod
    async def act(
        self,
        messages: Messages,
        params: SamplingParams,
        info: dict[str, Any] | None = None,
    ) -> PolicyOutput:
        """Answer one turn. ``info`` is the env's info of the current state (the scored policy
        reads its candidate actions). Never raises for a model or server failure."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def describe(self) -> dict[str, Any]:
        """What the results file records about this policy."""
        return {"policy": type(self).__name__}


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP
# ---------------------------------------------------------------------------------------------


def _root(base_url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/v1`` -> ``http://host:8000/v1``."""
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class _HTTPClient:
    """httpx.AsyncClient with timeouts, retries with backoff, and failures as values."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str | None,
        timeout: float,
        retries: int,
        backoff: float,
        max_connections: int,
    ):
        import httpx

        self.base_url = _root(base_url)
        self.model = model
        self._model_lock = asyncio.Lock()
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._httpx = httpx
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=max_connections),
        )

    async def post(
        self, path: str, body: dict[str, Any]
    ) -> tuple[dict | None, str | None, str | None, int]:
        """(JSON reply, error, error kind, attempts). Retries connection errors, timeouts and
        5xx/429 answers with exponential backoff; a 4xx other than 429 is not retried."""
        httpx = self._httpx
        error, kind = "no attempt", "connection"
        for attempt in range(1, self.retries + 2):
            if attempt > 1:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 2) * (0.5 + random.random()))
            try:
                reply = await self.client.post(path, json=body)
            except httpx.TimeoutException:
                error, kind = (
                    f"no answer from {self.base_url}{path} within {self.timeout:g} s",
                    "timeout",
                )
                continue
            except httpx.HTTPError as exc:
                error, kind = (
                    f"cannot reach {self.base_url}{path}: {type(exc).__name__}: {exc}",
                    "connection",
                )
                continue
            if reply.status_code != 200:
                snippet = reply.text[:200].replace("\n", " ")
                error, kind = (
                    f"HTTP {reply.status_code} from {self.base_url}{path}: {snippet}",
                    "http_status",
                )
                if reply.status_code in (429,) or reply.status_code >= 500:
                    continue
                return None, error, kind, attempt
            try:
                data = reply.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                snippet = reply.text[:120].replace("\n", " ")
                error, kind = (
                    f"unreadable JSON from {self.base_url}{path}: {snippet!r}",
                    "bad_response",
                )
                continue
            if not isinstance(data, dict):
                error, kind = (
                    f"unexpected JSON from {self.base_url}{path}: {str(data)[:120]}",
                    "bad_response",
                )
                continue
            return data, None, None, attempt
        return None, error, kind, self.retries + 1

    async def model_name(self) -> str:
        """The served model: the one given, else the first of ``GET /v1/models`` (asked once)."""
        async with self._model_lock:
            if self.model is None:
                listing = await self.get("/models")
                try:
                    self.model = str(listing["data"][0]["id"])  # type: ignore[index]
                except (TypeError, KeyError, IndexError):
                    return "default"  # ask again next turn: the server may still be starting
            return self.model

    async def get(self, path: str) -> dict | None:
        try:
            reply = await self.client.get(path)
            return reply.json() if reply.status_code == 200 else None
        except (self._httpx.HTTPError, json.JSONDecodeError, UnicodeDecodeError):
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
        logprobs: ask for the sampled tokens' log-probs (``logprobs: true``); kept when returned.
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
    ):
        self.http = _HTTPClient(
            base_url, api_key, model, timeout, retries, backoff, max_connections
        )
        self.logprobs = logprobs
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
            # vLLM returns each sampled token as "token_id:<id>" with this flag, so the ids
            # trained are the ids sampled (no re-tokenisation of the text).
            body.update(logprobs=True, top_logprobs=0)
        if self._token_ids_field:
            body["return_tokens_as_token_ids"] = True
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
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        token_ids, logprobs = _chat_logprobs(choice.get("logprobs"))
        return PolicyOutput(
            text,
            token_ids=token_ids,
            logprobs=logprobs,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            latency_s=latency,
            finish_reason=choice.get("finish_reason"),
            attempts=attempts,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    def describe(self) -> dict[str, Any]:
        return {"policy": "openai-chat", "base_url": self.http.base_url, "model": self.http.model}


def _chat_logprobs(block: Any) -> tuple[list[int] | None, list[float] | None]:
    """Token ids and log-probs from a chat choice's ``logprobs.content`` (None when absent).

    Ids come from vLLM's ``token_id:<id>`` tokens (``return_tokens_as_token_ids``); servers that
    return token strings give log-probs only."""
    try:
        content = block["content"]
        logprobs = [float(t["logprob"]) for t in content]
    except (TypeError, KeyError, ValueError):
        return None, None
    ids: list[int] | None = []
    for t in content:
        token = t.get("token", "")
        if isinstance(token, str) and token.startswith("token_id:") and token[9:].isdigit():
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
        from transformers import AutoTokenizer

        self.http = _HTTPClient(base_url, api_key, model, timeout, retries, backoff, 256)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        # The end-of-turn token closes each candidate, as in the local scorer.
        self.end_text = self.tokenizer.eos_token or ""
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


# ---------------------------------------------------------------------------------------------
# Local transformers model, micro-batched
# ---------------------------------------------------------------------------------------------


@dataclass
class _Job:
    kind: str  # "generate" | "score"
    prompt_ids: list[int]
    params: SamplingParams | None
    actions: list[list[int]] | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


class TransformersPolicy(Policy):
    """A local transformers model, in this process; generation micro-batched across episodes.

    Every :meth:`act` puts its request on a queue; one worker thread owns the model and takes,
    each time it is free, every queued request with the same sampling parameters (up to
    ``max_batch``) into one left-padded ``generate`` call. So the more episodes wait on the
    model, the bigger its batches, and the event loop never blocks on a forward pass.

    Sampling uses the whole distribution at ``temperature`` (``top_k`` off, ``top_p`` as asked,
    no repetition penalty: the model's own generation defaults are overridden so the recorded
    log-probs are those of the distribution sampled); temperature 0 is greedy. ``token_ids``
    are the sampled ids up to and including the end-of-turn token, ``logprobs`` their log-probs
    under the model's distribution at the sampling temperature (float32; before top-p
    truncation, the distribution a training forward pass scores).

    Args:
        model_path: a transformers folder or hub name (``agentgym.models.model_path()`` gives
            the suite's SmolLM2).
        device: ``"auto"`` (CUDA when present, else CPU), or a torch device string.
        max_batch: most requests in one ``generate``.
        max_prompt_tokens: longer prompts keep their tail (the current observation and the
            instruction are at the end).
        seed: seeds torch's generator once, so a run's sampling is reproducible given the same
            batches.
    """

    def __init__(
        self,
        model_path: str | Path,
        device: str = "auto",
        *,
        max_batch: int = 32,
        max_prompt_tokens: int | None = None,
        dtype: Any = None,
        seed: int | None = 0,
        batch_wait_s: float = 0.002,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        kwargs = {"dtype": dtype} if dtype is not None else {}
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, **kwargs).to(self.device)
        self.model.eval().requires_grad_(False)
        self.max_batch = max_batch
        self.max_prompt_tokens = max_prompt_tokens
        self.batch_wait_s = batch_wait_s
        eos = self.model.generation_config.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos_ids:
            eos_ids.append(self.tokenizer.eos_token_id)
        self.eos_ids = eos_ids
        self.pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos_ids[0]
        )
        if seed is not None:
            torch.manual_seed(seed)
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.batch_sizes: list[int] = []
        """size of every batch the worker ran (for measuring how well requests gathered)"""
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name="agentgym-model", daemon=True)
        self._worker.start()

    # -- public --------------------------------------------------------------------------------
    def prompt_ids(self, messages: Messages) -> list[int]:
        """The chat-templated prompt's token ids (tail kept past ``max_prompt_tokens``)."""
        ids = self.tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = list(ids)
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            ids = ids[-self.max_prompt_tokens :]
        return ids

    async def act(
        self, messages: Messages, params: SamplingParams, info: dict[str, Any] | None = None
    ) -> PolicyOutput:
        started = time.perf_counter()
        ids = self.prompt_ids(messages)
        try:
            new_ids, logprobs = await self._submit("generate", ids, params=params)
        except Exception as exc:  # noqa: BLE001 - a model failure ends the turn, not the run
            return PolicyOutput(
                "",
                latency_s=time.perf_counter() - started,
                error=f"{type(exc).__name__}: {exc}",
                error_kind="model_error",
            )
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        finish = "stop" if new_ids and new_ids[-1] in self.eos_ids else "length"
        return PolicyOutput(
            text,
            token_ids=new_ids,
            logprobs=logprobs,
            prompt_tokens=len(ids),
            completion_tokens=len(new_ids),
            latency_s=time.perf_counter() - started,
            finish_reason=finish,
        )

    async def score(
        self, messages: Messages, actions: Sequence[str]
    ) -> tuple[list[tuple[float, int]] | None, str | None, str | None]:
        """(sum of log-probs, token count) of each action as the whole reply to ``messages``
        (its tokens plus the end-of-turn token, so a prefix of a longer action is not favoured).
        All actions in one forward pass over the shared prompt."""
        ids = self.prompt_ids(messages)
        end = self.eos_ids[0]
        action_ids = [
            list(self.tokenizer(a, add_special_tokens=False)["input_ids"]) + [end] for a in actions
        ]
        try:
            scores = await self._submit("score", ids, actions=action_ids)
        except Exception as exc:  # noqa: BLE001
            return None, f"{type(exc).__name__}: {exc}", "model_error"
        return scores, None, None

    async def aclose(self) -> None:
        self._queue.put(None)

    def close(self) -> None:
        """Stop the worker thread (also done by :meth:`aclose`)."""
        self._queue.put(None)

    def describe(self) -> dict[str, Any]:
        return {"policy": "transformers", "model": self.model_path, "device": str(self.device)}

    # -- worker --------------------------------------------------------------------------------
    async def _submit(
        self,
        kind: str,
        ids: list[int],
        *,
        params: SamplingParams | None = None,
        actions: list[list[int]] | None = None,
    ) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put(_Job(kind, ids, params, actions, loop, future))
        return await future

    def _serve(self) -> None:
        pending: list[_Job] = []
        while True:
            if not pending:
                job = self._queue.get()
                if job is None:
                    return
                pending.append(job)
                time.sleep(self.batch_wait_s)  # let requests arriving together batch together
            stop = False
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                pending.append(job)
            head = pending[0]
            if head.kind == "score":
                batch = [head]
            else:
                batch = [j for j in pending if j.kind == "generate" and j.params == head.params][
                    : self.max_batch
                ]
            pending = [j for j in pending if all(j is not b for b in batch)]
            try:
                if head.kind == "score":
                    results = [self._score(head.prompt_ids, head.actions or [])]
                else:
                    results = self._generate(
                        [j.prompt_ids for j in batch], head.params or SamplingParams()
                    )
                    self.batch_sizes.append(len(batch))
                for job, result in zip(batch, results, strict=True):
                    job.loop.call_soon_threadsafe(_resolve, job.future, result, None)
            except Exception as exc:  # noqa: BLE001 - reported to every waiting request
                for job in batch:
                    job.loop.call_soon_threadsafe(_resolve, job.future, None, exc)
            if stop:
                for job in pending:
                    job.loop.call_soon_threadsafe(
                        _resolve, job.future, None, RuntimeError("policy closed")
                    )
                return

    def _generate(
        self, batch: list[list[int]], params: SamplingParams
    ) -> list[tuple[list[int], list[float]]]:
        import torch
        from transformers import LogitsProcessorList

        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids) :] = 1
        greedy = params.temperature <= 0
        sampling: dict[str, Any] = (
            {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
            if greedy
            else {
                "do_sample": True,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": 0,
            }
        )
        recorder = _SampledLogprobs(1.0 if greedy else params.temperature)
        with torch.inference_mode():
            sequences = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                max_new_tokens=params.max_tokens,
                pad_token_id=self.pad_id,
                eos_token_id=self.eos_ids,
                repetition_penalty=1.0,
                logits_processor=LogitsProcessorList([recorder]),
                **sampling,
            )
        new = sequences[:, width:]  # (B, T_new)
        logp = recorder.finish(new).cpu()  # (B, T_new)
        new = new.cpu()
        results = []
        for row in range(len(batch)):
            ids = new[row].tolist()
            n = len(ids)
            for t, tok in enumerate(ids):
                if tok in self.eos_ids:
                    n = t + 1
                    break
            results.append((ids[:n], logp[row, :n].tolist()))
        return results

    def _score(self, prompt: list[int], actions: list[list[int]]) -> list[tuple[float, int]]:
        import torch

        if not actions:
            return []
        with torch.inference_mode():
            # The prompt once; its cache is repeated for every action (they share it).
            first = self.model(torch.tensor([prompt], device=self.device), use_cache=True)
            last = torch.log_softmax(first.logits[0, -1].float(), dim=-1)  # (V,)
            # transformers 5 names the KV cache `cache`; 4.x `past_key_values`
            cache = getattr(first, "cache", None) or first.past_key_values
            cache.batch_repeat_interleave(len(actions))
            width = max(len(a) for a in actions)
            # Right padding: causal attention keeps pads after an action from touching it.
            ids = torch.full((len(actions), width), self.pad_id, dtype=torch.long)
            for row, a in enumerate(actions):
                ids[row, : len(a)] = torch.tensor(a, dtype=torch.long)
            mask = torch.ones(
                (len(actions), len(prompt) + width), dtype=torch.long, device=self.device
            )
            out = self.model(ids.to(self.device), attention_mask=mask, **{self._cache_arg: cache})
            logp = torch.log_softmax(out.logits.float(), dim=-1).cpu()  # (A, W, V)
        scores = []
        for row, a in enumerate(actions):
            total = float(last[a[0]])
            for j in range(1, len(a)):
                total += float(logp[row, j - 1, a[j]])
            scores.append((total, len(a)))
        return scores


class _SampledLogprobs:
    """A logits processor recording log p(sampled token) one (B, V) step at a time.

    ``generate`` calls it with each step's logits before sampling (custom processors run before
    the temperature/top-p warpers); the token drawn is the last column of ``input_ids`` at the
    next call, or of the output after the last. Keeping one step costs O(B * V) memory, where
    ``output_scores=True`` would keep O(B * T * V). The log-probs are those of the full
    distribution at the sampling temperature (top-p truncation not applied).
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: Any = None  # (B, V) log-softmax of the last step
        self.steps: list[Any] = []  # (B,) per generated token

    def _take(self, tokens: Any) -> None:
        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
            self.previous = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        self._take(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, new_tokens: Any) -> Any:
        """(B, T_new) log-probs of ``new_tokens``, the generated part of the sequences."""
        import torch

        if new_tokens.shape[1]:
            self._take(new_tokens[:, -1])
        if not self.steps:
            return torch.zeros(new_tokens.shape, dtype=torch.float32)
        return torch.stack(self.steps, dim=1)


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting coroutine was cancelled (Ctrl-C)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


# ---------------------------------------------------------------------------------------------
# Scored admissible actions
# ---------------------------------------------------------------------------------------------


def candidate_actions(info: dict[str, Any] | None) -> list[str]:
    """The actions a scored policy chooses among: ``info["suggested_actions"]`` where the family
    gives concrete ones (WebShop's searches, SearchQA's queries and answers), else
    ``info["admissible_actions"]``; placeholders such as ``search[<your query>]`` dropped."""
    info = info or {}
    for key in ("suggested_actions", "admissible_actions"):
        actions = info.get(key)
        if actions:
            kept = [a for a in actions if isinstance(a, str) and a.strip() and "<" not in a]
            if kept:
                return list(dict.fromkeys(kept))
    return []


class ScoredActionPolicy(Policy):
    """Pick among the candidate actions by the model's log-likelihood of each as the reply.

    Each candidate's score is the sum (``reduce="sum"``) or the mean (``reduce="mean"``) of the
    log-probs of its tokens and the end-of-turn token, given the chat prompt; the policy picks
    the best at temperature 0, else samples from ``softmax(score / temperature)``. Candidates
    are :func:`candidate_actions` of the turn's info; the prompt should list them and ask for
    one (the engine renders it with the family template in the ``plain`` format). The reply
    text is the chosen action itself.

    Args:
        scorer: a :class:`TransformersPolicy` (local logits) or an
            :class:`OpenAICompletionsScorer` (a server returning prompt log-probs).
    """

    plain_actions = True

    def __init__(
        self,
        scorer: TransformersPolicy | OpenAICompletionsScorer,
        *,
        reduce: str = "sum",
        seed: int | None = 0,
    ):
        if reduce not in ("sum", "mean"):
            raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
        self.scorer = scorer
        self.reduce = reduce
        self.rng = random.Random(seed)

    async def act(
        self, messages: Messages, params: SamplingParams, info: dict[str, Any] | None = None
    ) -> PolicyOutput:
        started = time.perf_counter()
        actions = candidate_actions(info)
        if not actions:
            return PolicyOutput(
                "",
                latency_s=0.0,
                error="the env lists no admissible or suggested actions to score",
                error_kind="no_candidates",
            )
        listed = info.get("admissible_actions") if info else None
        if listed is None or list(listed) != actions:
            # The prompt lists the env's admissible actions, or none (SearchQA): name the
            # candidates scored, so the model is asked for one of them.
            shown = ", ".join(repr(a) for a in actions)
            messages = [
                *messages[:-1],
                {**messages[-1], "content": f"{messages[-1]['content']}Choose one of: {shown}\n"},
            ]
        scored, error, kind = await self.scorer.score(messages, actions)
        latency = time.perf_counter() - started
        if scored is None:
            return PolicyOutput(
                "", latency_s=latency, error=error, error_kind=kind, messages=messages
            )
        values = [s if self.reduce == "sum" else s / max(n, 1) for s, n in scored]
        if params.temperature <= 0:
            choice = max(range(len(actions)), key=values.__getitem__)
        else:
            top = max(values)
            weights = [math.exp((v - top) / params.temperature) for v in values]
            choice = self.rng.choices(range(len(actions)), weights=weights)[0]
        return PolicyOutput(
            actions[choice],
            completion_tokens=scored[choice][1],
            latency_s=latency,
            action_scores=dict(zip(actions, values, strict=True)),
            messages=messages,
        )

    async def aclose(self) -> None:
        await self.scorer.aclose()

    def describe(self) -> dict[str, Any]:
        inner = (
            self.scorer.describe()
            if isinstance(self.scorer, TransformersPolicy)
            else {"base_url": self.scorer.http.base_url}
        )
        return {**inner, "policy": "scored", "reduce": self.reduce}
