"""A local transformers model in this process: batched for lockstep rounds, micro-batched across
episodes for the async engine, and the scorer of the scored-action policy."""

from __future__ import annotations

import asyncio
import atexit
import copy
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.engine.chat_template import end_ids, turn_end_id
from agentgym.engine.policies.base import (
    Infos,
    Messages,
    Policy,
    PolicyOutput,
    SamplingParams,
)
from agentgym.extras import require

__all__ = ["GenerationCancelled", "TransformersPolicy", "chat_prompt_ids"]


class GenerationCancelled(RuntimeError):
    """Raised inside a forward pass of a policy being closed: the batch in progress stops at
    its next forward pass instead of decoding to ``max_tokens``."""


def chat_prompt_ids(
    tokenizer: Any, prompt: str | Messages, max_prompt_tokens: int | None = None
) -> list[int]:
    """Token ids of ``prompt`` (text, as one user turn, or chat messages) under the tokenizer's
    chat template, the generation prompt added.

    Without a chat template the text of the last message is encoded. Prompts longer than
    ``max_prompt_tokens`` keep their tail (the current observation and the instruction are at
    the end; the oldest history goes first), as verl-agent's left truncation does.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = messages[-1]["content"]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        ids = ids[-max_prompt_tokens:]
    return list(ids)


#: prompts whose ids a TransformersPolicy remembers (cleared when full)
PROMPT_MEMO_SIZE = 4096


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
    """A local transformers model, in this process.

    :meth:`generate` answers a lockstep round: every prompt in length-sorted batches of
    ``max_batch``, in the caller's thread (the trainer samples from the model it trains).
    :meth:`act` answers one turn of the async engine: requests go on a queue, and one worker
    thread owning the model takes, each time it is free, the oldest queued request and those
    with the same sampling parameters and a similar prompt length (up to ``max_batch``; see
    :func:`padding_bounded_batch`) into one batch, so the more episodes wait on the model the
    bigger its batches, and the event loop never blocks on a forward pass.

    Sampling uses the whole distribution at ``temperature`` (``top_k`` off, ``top_p`` as asked,
    no repetition penalty: the model's own generation defaults are overridden so the recorded
    log-probs are those of the distribution sampled); temperature 0 is greedy. ``token_ids``
    are the sampled ids up to and including the end-of-turn token, ``logprobs`` their log-probs
    under the model's distribution at the sampling temperature (float32; before top-p
    truncation, the distribution a training forward pass scores), ``prompt_ids`` the prompt.

    Args:
        model: a transformers folder or hub name (``agentgym.models.model_path()`` gives the
            suite's SmolLM2), loaded here; or a loaded causal LM (a trainer's, peft included),
            used as it is, with ``tokenizer``.
        tokenizer: the model's tokenizer, when ``model`` is a loaded model.
        device: ``"auto"`` (CUDA when present, else CPU), or a torch device string; for a loaded
            model, where it already is.
        max_batch: most prompts in one batch.
        max_prompt_tokens: longer prompts keep their tail (the current observation and the
            instruction are at the end).
        seed: seeds torch's global generator once (None: leave it as it is, as a trainer that
            seeded it does).
        decoder: ``"generate"`` (transformers' ``generate``, the reference) or ``"static"``
            (:class:`~agentgym.engine.decoding.StaticDecoder`: a static KV cache, sampling on
            the device, finished rows dropped, on CUDA a compiled decode step; the same greedy
            tokens, see ``tests/trainers/test_generation.py``). Falls back to ``"generate"``
            with a warning where the model or transformers version does not support it.
        compile: the static decoder's ``compile`` (None: on CUDA only).
        autocast: a context-manager factory (e.g. bf16 on GPU) wrapping generation on the model
            itself; log-probs are float32.
        generation_dtype: static decoder only: decode with a copy of the model in this dtype,
            refreshed by :meth:`sync_weights`, instead of the model's weights under autocast.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        device: str = "auto",
        *,
        max_batch: int = 32,
        max_prompt_tokens: int | None = None,
        dtype: Any = None,
        seed: int | None = 0,
        batch_wait_s: float = 0.002,
        decoder: str = "generate",
        compile: bool | None = None,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
        generation_dtype: Any = None,
    ):
        require("a local model (TransformersPolicy, agentgym eval --model)", "train", "torch")
        import torch

        if decoder not in ("generate", "static"):
            raise ValueError(f"decoder must be 'generate' or 'static', got {decoder!r}")
        if isinstance(model, str | Path):
            require(
                "a local model (TransformersPolicy, agentgym eval --model)", "train", "transformers"
            )
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self.model_path = str(model)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(self.model_path)
            kwargs = {"dtype": dtype} if dtype is not None else {}
            model = AutoModelForCausalLM.from_pretrained(self.model_path, **kwargs).to(device)
            model.eval().requires_grad_(False)
        elif tokenizer is None:
            raise ValueError("a loaded model needs its tokenizer: TransformersPolicy(model, tok)")
        else:
            self.model_path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.max_batch = max_batch
        self.max_prompt_tokens = max_prompt_tokens
        self.batch_wait_s = batch_wait_s
        self.autocast = autocast
        self.eos_ids = end_ids(model, tokenizer)
        #: the token the chat template closes a reply with: what a scored action ends with
        self.turn_end_id = turn_end_id(tokenizer, self.eos_ids)
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        )
        if seed is not None:
            torch.manual_seed(seed)
        self.decoder = None
        self.generation_model = model
        if decoder == "static":
            self.decoder = self._static_decoder(compile, generation_dtype)
        self._action_ids: dict[str, list[int]] = {}  # action texts recur: tokenize each once
        self._prompt_memo: dict[tuple, list[int]] = {}
        self.batch_sizes: list[int] = []
        """size of every batch the worker ran (for measuring how well requests gathered)"""
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._exit_hook = False

    def _static_decoder(self, compile: bool | None, generation_dtype: Any) -> Any:
        from agentgym.engine.decoding import StaticDecoder

        if not StaticDecoder.supports(self.model):
            warnings.warn(
                "the static-cache decoder does not support this model or transformers version; "
                "generating with transformers' generate (upgrade transformers to >= 4.56, or "
                "pass hf_generation='generate' to silence this)",
                stacklevel=3,
            )
            return None
        # Decoding reads every weight once per token: from fp32 weights under autocast that is
        # a read, a cast and a write per step, 4x the bytes of reading a low-precision copy.
        if generation_dtype is not None:
            self.generation_model = copy.deepcopy(self.model).to(generation_dtype)
            self.generation_model.eval().requires_grad_(False)
        return StaticDecoder(
            self.generation_model, eos_ids=self.eos_ids, pad_id=self.pad_id, compile=compile
        )

    # -- a lockstep round ------------------------------------------------------------------------
    def prompt_ids(self, messages: Messages) -> list[int]:
        """The chat-templated prompt's token ids (tail kept past ``max_prompt_tokens``).

        Memoised: the members of a group share their first prompt, and small envs revisit
        states, while rendering a chat template is most of a tiny model's turn on CPU."""
        try:
            key = (
                getattr(self.tokenizer, "chat_template", None),
                self.max_prompt_tokens,
                tuple((m["role"], m["content"]) for m in messages),
            )
            hash(key)
        except (KeyError, TypeError):  # content parts (lists), extra fields: rendered each time
            return chat_prompt_ids(self.tokenizer, messages, self.max_prompt_tokens)
        ids = self._prompt_memo.get(key)
        if ids is None:
            if len(self._prompt_memo) >= PROMPT_MEMO_SIZE:
                self._prompt_memo.clear()
            ids = self._prompt_memo[key] = chat_prompt_ids(
                self.tokenizer, messages, self.max_prompt_tokens
            )
        return list(ids)

    def generate(
        self, messages: Sequence[Messages], params: SamplingParams, infos: Infos = None
    ) -> list[PolicyOutput]:
        """One output per conversation, sampled in length-sorted batches (the model is put in
        eval mode meanwhile); outputs in the order given."""
        started = time.perf_counter()
        prompt_ids = [self.prompt_ids(m) for m in messages]
        # Similar lengths in one batch waste less padding; results go back in the caller's order.
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        results: dict[int, tuple[list[int], list[float]]] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), self.max_batch):
                chunk = order[start : start + self.max_batch]
                sampled = self._sample([prompt_ids[i] for i in chunk], params)
                results.update(zip(chunk, sampled, strict=True))
        finally:
            self.model.train(was_training)
        latency = time.perf_counter() - started
        return [self._output(prompt_ids[i], *results[i], latency) for i in range(len(prompt_ids))]

    def _output(
        self, prompt: list[int], ids: list[int], logprobs: list[float], latency: float
    ) -> PolicyOutput:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        finish = "stop" if ids and ids[-1] in self.eos_ids else "length"
        return PolicyOutput.sampled(text, prompt, ids, logprobs, latency, finish)

    def _sample(
        self, batch: list[list[int]], params: SamplingParams
    ) -> list[tuple[list[int], list[float]]]:
        """(ids, log-probs) sampled after each prompt of ``batch``, one batch."""
        from agentgym.engine.decoding import generate_left_padded

        with self._lock:  # the worker thread and a direct caller never share a forward pass
            if self.decoder is not None:
                ids, logprobs = self.decoder.generate(
                    batch,
                    max_new_tokens=params.max_tokens,
                    temperature=params.temperature,
                    top_p=params.top_p,
                    autocast=self.autocast if self.generation_model is self.model else nullcontext,
                )
            else:
                ids, logprobs = generate_left_padded(
                    self.model,
                    batch,
                    eos_ids=self.eos_ids,
                    pad_id=self.pad_id,
                    max_new_tokens=params.max_tokens,
                    temperature=params.temperature,
                    top_p=params.top_p,
                    autocast=self.autocast,
                )
        return list(zip(ids, logprobs, strict=True))

    def sync_weights(self, model: Any) -> None:
        """Copy ``model``'s weights into the low-precision generation copy, if there is one
        (in place: a captured decode step keeps reading the same tensors); otherwise nothing
        to do, generation runs on the model itself."""
        import torch

        if self.generation_model is self.model:
            return
        with torch.no_grad():
            for target, source in zip(
                self.generation_model.parameters(), model.parameters(), strict=True
            ):
                target.copy_(source)

    # -- scoring actions -------------------------------------------------------------------------
    def action_ids(self, action: str) -> list[int]:
        """The response ids of ``action`` as a whole reply: its tokens, then the token the chat
        template ends a reply with (:attr:`turn_end_id`), so a prefix of a longer action is not
        favoured and the ids trained are those the model sees after its turns."""
        ids = self._action_ids.get(action)
        if ids is None:
            ids = list(self.tokenizer(action, add_special_tokens=False)["input_ids"])
            ids.append(self.turn_end_id)
            self._action_ids[action] = ids
        return ids

    def score_candidates(
        self,
        prompts: Sequence[list[int]],
        candidates: Sequence[Sequence[list[int]]],
        temperature: float = 1.0,
        token_budget: int = 4096,
    ) -> list[list[list[float]]]:
        """Per-token log-probs of every candidate continuation of every prompt (see
        :func:`agentgym.engine.decoding.score_candidates`), the model in eval mode meanwhile."""
        from agentgym.engine.decoding import score_candidates

        was_training = self.model.training
        self.model.eval()
        try:
            with self._lock:
                scored = score_candidates(
                    self.model,
                    prompts,
                    candidates,
                    pad_id=self.pad_id,
                    temperature=temperature,
                    autocast=self.autocast,
                    token_budget=token_budget,
                )
        finally:
            self.model.train(was_training)
        return [[lp.tolist() for lp in row] for row in scored]

    async def score(
        self, messages: Messages, actions: Sequence[str]
    ) -> tuple[list[tuple[float, int]] | None, str | None, str | None]:
        """(sum of log-probs, token count) of each action as the whole reply to ``messages``
        (:meth:`action_ids`). All actions in one forward pass over the shared prompt."""
        ids = self.prompt_ids(messages)
        try:
            scores = await self._submit("score", ids, actions=[self.action_ids(a) for a in actions])
        except Exception as exc:  # noqa: BLE001
            return None, f"{type(exc).__name__}: {exc}", "model_error"
        return scores, None, None

    # -- one turn of the async engine ------------------------------------------------------------
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
        return self._output(ids, new_ids, logprobs, time.perf_counter() - started)

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker thread and wait for it (also done by :meth:`aclose`, and at exit).

        A batch in progress stops at its next forward pass (its requests fail with
        :class:`GenerationCancelled`) and queued requests fail with "policy closed". The thread
        is joined here: a thread still inside torch when the interpreter exits aborts the
        process ("terminate called without an active exception") instead of exiting cleanly.
        """
        worker = self._worker
        if worker is None or not worker.is_alive():
            return
        self._queue.put(None)
        if worker is threading.current_thread():
            return
        self._closing.set()
        models = {id(m): m for m in (self.model, self.generation_model)}.values()
        hooks = [m.register_forward_pre_hook(self._cancel_forward) for m in models]
        try:
            worker.join()
        finally:
            for hook in hooks:
                hook.remove()
            self._closing.clear()

    def _cancel_forward(self, module: Any, args: Any) -> None:
        # Registered only while close() waits, and it raises only in the worker thread: a
        # trainer's forward pass on the same model in another thread is left alone.
        if self._closing.is_set() and threading.current_thread() is self._worker:
            raise GenerationCancelled("policy closed during generation")

    def describe(self) -> dict[str, Any]:
        return {"policy": "transformers", "model": self.model_path, "device": str(self.device)}

    async def _submit(
        self,
        kind: str,
        ids: list[int],
        *,
        params: SamplingParams | None = None,
        actions: list[list[int]] | None = None,
    ) -> Any:
        if self._worker is None or not self._worker.is_alive():  # first use, or after close()
            self._worker = threading.Thread(target=self._serve, name="agentgym-model", daemon=True)
            self._worker.start()
            if not self._exit_hook:
                # An owner that never closes the policy (an exception, Ctrl-C in a script)
                # still gets the thread stopped before the interpreter tears torch down.
                atexit.register(_close_at_exit, weakref.ref(self))
                self._exit_hook = True
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
                alike = [j for j in pending[1:] if j.kind == "generate" and j.params == head.params]
                batch = padding_bounded_batch(head, alike, self.max_batch)
            pending = [j for j in pending if all(j is not b for b in batch)]
            try:
                if head.kind == "score":
                    lps = self.score_candidates([head.prompt_ids], [head.actions or []])[0]
                    results = [[(sum(lp), len(lp)) for lp in lps]]
                else:
                    results = self._sample([j.prompt_ids for j in batch], head.params)
                    self.batch_sizes.append(len(batch))
                for job, result in zip(batch, results, strict=True):
                    _answer(job, result, None)
            except Exception as exc:  # noqa: BLE001 - reported to every waiting request
                for job in batch:
                    _answer(job, None, exc)
            if stop:
                for job in pending:
                    _answer(job, None, RuntimeError("policy closed"))
                return


#: padded prompt tokens a batch may add to its real ones: this share of them, or this many
MAX_PADDING_SHARE, MAX_PADDING_TOKENS = 0.25, 64


def padding_bounded_batch(head: _Job, others: Sequence[_Job], max_batch: int) -> list[_Job]:
    """``head`` and the waiting requests closest to it in prompt length, while the batch's
    left padding stays small (at most :data:`MAX_PADDING_SHARE` of its real prompt tokens, or
    :data:`MAX_PADDING_TOKENS`): every prompt of a batch is computed at the longest one's
    length, so a 170-token prompt batched with a 720-token one costs 720 tokens. On CPU prompt
    tokens are most of a turn's cost; the requests left out form the next batches."""
    chosen, lengths = [head], [len(head.prompt_ids)]
    for job in sorted(others, key=lambda j: abs(len(j.prompt_ids) - lengths[0])):
        if len(chosen) == max_batch:
            break
        trial = [*lengths, len(job.prompt_ids)]
        padding = max(trial) * len(trial) - sum(trial)
        if padding <= max(MAX_PADDING_SHARE * sum(trial), MAX_PADDING_TOKENS):
            chosen.append(job)
            lengths = trial
    return chosen


def _answer(job: _Job, result: Any, error: BaseException | None) -> None:
    """Hand ``job``'s result to its event loop; nothing when that loop has closed (the run that
    awaited it ended: Ctrl-C)."""
    try:
        job.loop.call_soon_threadsafe(_resolve, job.future, result, error)
    except RuntimeError:  # "Event loop is closed"
        pass


def _close_at_exit(ref: weakref.ref[TransformersPolicy]) -> None:
    policy = ref()
    if policy is not None:
        policy.close()


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting coroutine was cancelled (Ctrl-C)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
