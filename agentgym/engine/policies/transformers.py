"""A local transformers model in this process, micro-batched across episodes."""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.engine.policies.base import (
    Messages,
    Policy,
    PolicyOutput,
    SamplingParams,
)

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
