"""Generation backends behind one interface: Hugging Face transformers and vLLM.

Both take plain-text prompts (the env's rendered observations), apply the tokenizer's chat
template, sample a response per prompt and return a :class:`Generation` holding the token ids
and the sampling log-probs. The trainer recomputes the "old" log-probs with its own forward
pass before the update (as verl does), because a generation engine's numerics (vLLM kernels,
bf16 sampling) differ slightly from the training forward; the sampling log-probs are kept for
diagnostics (``rollout/logprob_diff``).

- :class:`HFPolicy` works everywhere (CPU included); it generates with the very model being
  trained, so ``sync_weights`` has nothing to do.
- :class:`VLLMPolicy` is the GPU path: batched generation with ``vllm.LLM`` and the trained
  weights loaded into the engine after every update. It is **untested in this repository's CI**
  (no GPU, vLLM not installed); the API calls follow vLLM's documented ``LLM`` interface.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from agentgym.extras import missing_extra
from trainers.gigpo.generation import StaticDecoder


@dataclass
class Generation:
    """One sampled response."""

    text: str
    """the decoded response, special tokens removed (what the env wrapper parses)"""
    prompt_ids: list[int]
    """the chat-templated prompt's token ids"""
    response_ids: list[int]
    """the sampled token ids, up to and including the end-of-turn token if one was sampled"""
    logprobs: list[float]
    """log-prob of each sampled token under the sampling distribution (temperature applied)"""


class Policy(Protocol):
    def generate(self, prompts: Sequence[str]) -> list[Generation]: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...


def chat_prompt_ids(tokenizer: Any, prompt: str, max_prompt_tokens: int | None = None) -> list[int]:
    """Token ids of ``prompt`` as one user turn under the tokenizer's chat template.

    Without a chat template the raw prompt is encoded. Prompts longer than
    ``max_prompt_tokens`` keep their tail (the current observation and the instruction are at
    the end; the oldest history goes first), as verl-agent's left truncation does.
    """
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    else:
        text = prompt
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        ids = ids[-max_prompt_tokens:]
    return list(ids)


class HFPolicy:
    """Sampling with ``transformers``' ``generate`` on the training model itself.

    Prompts are left-padded into batches of ``batch_size``; sampling uses the full distribution
    at ``temperature`` (``top_k`` off, ``top_p`` as given); ``temperature=0`` is greedy. The
    model's own generation defaults that reshape the distribution (Qwen's instruct models ship
    ``repetition_penalty=1.05``, ``top_k=20``, ``temperature=0.7``) are overridden, so rollouts
    are sampled from the policy the update trains. ``autocast`` (a context-manager factory, e.g.
    bf16 on GPU) wraps generation; the log-probs are computed in float32.

    ``fast`` (the default) decodes with :class:`trainers.gigpo.generation.StaticDecoder`: a
    static KV cache, sampling on the device, finished rows dropped as they end, and on CUDA a
    compiled (CUDA-graph) decode step (``compile``: None = on CUDA only). ``fast=False`` calls
    ``generate`` (the reference path; the two give the same greedy tokens, and the same
    sampled tokens when no row is dropped, see ``tests/trainers/test_generation.py``).
    ``generation_dtype`` (fast path only; the trainer passes bf16 on GPU) decodes with a copy
    of the model in that dtype, refreshed by :meth:`sync_weights` after every update, instead
    of the fp32 training weights under ``autocast``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 512,
        max_prompt_tokens: int | None = None,
        batch_size: int = 64,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
        fast: bool = True,
        compile: bool | None = None,
        generation_dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.fast = fast
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.batch_size = batch_size
        self.autocast = autocast
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        )
        if fast and not StaticDecoder.supports(model):
            warnings.warn(
                "the static-cache decoder does not support this model or transformers version; "
                "generating with transformers' generate (upgrade transformers to >= 4.56, or "
                "pass hf_generation='generate' to silence this)",
                stacklevel=2,
            )
            self.fast = False
        # Decoding reads every weight once per token: from fp32 weights under autocast that is
        # a read, a cast and a write per step, 4x the bytes of reading a low-precision copy.
        self.generation_model = model
        if self.fast and generation_dtype is not None:
            self.generation_model = copy.deepcopy(model).to(generation_dtype)
            self.generation_model.eval().requires_grad_(False)
        self.decoder = StaticDecoder(
            self.generation_model, eos_ids=self.eos_ids, pad_id=self.pad_id, compile=compile
        )

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy ``model``'s weights into the low-precision generation copy, if there is one
        (in place: a captured decode step keeps reading the same tensors); otherwise nothing
        to do, generation runs on the trained model."""
        if self.generation_model is self.model:
            return
        for target, source in zip(
            self.generation_model.parameters(), model.parameters(), strict=True
        ):
            target.copy_(source)

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[str], temperature: float | None = None
    ) -> list[Generation]:
        temperature = self.temperature if temperature is None else temperature
        out: list[Generation] = []
        prompt_ids = [chat_prompt_ids(self.tokenizer, p, self.max_prompt_tokens) for p in prompts]
        # Similar lengths in one batch waste less padding; results go back in the caller's order.
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        results: dict[int, Generation] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                for i, gen in zip(
                    chunk,
                    self._generate_batch([prompt_ids[i] for i in chunk], temperature),
                    strict=True,
                ):
                    results[i] = gen
        finally:
            self.model.train(was_training)
        out = [results[i] for i in range(len(prompt_ids))]
        return out

    def _generate_batch(self, batch: list[list[int]], temperature: float) -> list[Generation]:
        if self.fast:
            ids, logprobs = self.decoder.generate(
                batch,
                max_new_tokens=self.max_new_tokens,
                temperature=temperature,
                top_p=self.top_p,
                autocast=self.autocast if self.generation_model is self.model else nullcontext,
            )
            return [
                Generation(self.tokenizer.decode(r, skip_special_tokens=True), p, r, lp)
                for p, r, lp in zip(batch, ids, logprobs, strict=True)
            ]
        device = next(self.model.parameters()).device
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids) :] = 1
        greedy = temperature <= 0
        sampling: dict[str, Any] = (
            {"do_sample": False}
            if greedy
            else {"do_sample": True, "temperature": temperature, "top_p": self.top_p, "top_k": 0}
        )
        recorder = _SampledLogprobs(1.0 if greedy else temperature)
        with self.autocast():
            sequences = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                max_new_tokens=self.max_new_tokens,
                pad_token_id=self.pad_id,
                eos_token_id=self.eos_ids,
                repetition_penalty=1.0,  # not the model's default: sample the trained policy
                logits_processor=LogitsProcessorList([recorder]),
                **sampling,
            )
        new = sequences[:, width:]  # (B, T_new)
        logp = recorder.finish(new)  # (B, T_new), float32
        # Keep tokens up to and including the first end-of-turn token; the rest is padding.
        is_eos = torch.isin(new, torch.tensor(self.eos_ids, device=new.device))
        after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
        lengths = (~after_eos).sum(dim=1).tolist()
        new_l, logp_l = new.tolist(), logp.tolist()
        gens = []
        for row, n in enumerate(lengths):
            ids = new_l[row][:n]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            gens.append(Generation(text, batch[row], ids, logp_l[row][:n]))
        return gens


class VLLMPolicy:
    """Batched generation with ``vllm.LLM``; trained weights are loaded after every update.

    Untested here (no GPU and no vLLM in this repository's CI). Weight sync uses
    ``LLM.collective_rpc`` to call ``model_runner.model.load_weights`` inside the engine's
    worker (vLLM >= 0.8), with the V0 ``llm_engine.model_executor.driver_worker`` path as a
    fallback for older versions. The V1 engine is kept in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the caller set it): otherwise every sync would
    pickle the whole state dict to the engine process.
    """

    def __init__(
        self,
        model_name: str,
        tokenizer: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 512,
        max_prompt_tokens: int | None = None,
        gpu_memory_utilization: float = 0.4,
        dtype: str = "bfloat16",
        seed: int = 0,
    ):
        # Read by vLLM when the engine starts, so it must be set before LLM(...).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise missing_extra("backend='vllm'", "vLLM", "vllm", "use backend='hf'") from exc
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.llm = vllm.LLM(
            model=model_name,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            enable_prefix_caching=True,  # the group's envs share their first prompt
        )
        self.params = vllm.SamplingParams(
            temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, logprobs=0
        )

    def generate(
        self, prompts: Sequence[str], temperature: float | None = None
    ) -> list[Generation]:
        params = self.params
        if temperature is not None:
            params = self._vllm.SamplingParams(
                temperature=temperature,
                top_p=params.top_p,
                max_tokens=params.max_tokens,
                logprobs=0,
            )
        ids = [chat_prompt_ids(self.tokenizer, p, self.max_prompt_tokens) for p in prompts]
        outputs = self.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
        gens = []
        for prompt_ids, out in zip(ids, outputs, strict=True):
            comp = out.outputs[0]
            response = list(comp.token_ids)
            logprobs = [
                step[tok].logprob for tok, step in zip(response, comp.logprobs or [], strict=False)
            ]
            gens.append(Generation(comp.text, prompt_ids, response, logprobs))
        return gens

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s current weights into the engine (LoRA adapters merged first)."""
        if hasattr(model, "merge_and_unload"):  # peft: vLLM serves the merged weights
            state = _merged_lora_state(model)
        else:
            state = {k: v.detach() for k, v in model.state_dict().items()}
        weights = list(state.items())

        def _load(worker: Any) -> None:
            worker.model_runner.model.load_weights(weights=weights)

        if hasattr(self.llm, "collective_rpc"):
            self.llm.collective_rpc(_load)
        else:  # vLLM V0 engine
            self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(
                weights
            )
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached KV was computed with the old weights


class _SampledLogprobs(LogitsProcessor):
    """Records log p(sampled token) at every generation step, one (B, V) step at a time.

    ``generate`` calls it with the model's logits before sampling; the token drawn from them is
    the last column of ``input_ids`` at the next call (and of the output after the last one).
    Keeping only the previous step's log-softmax costs O(B * V) memory, where
    ``output_logits=True`` would keep every step's logits (O(B * T * V): about 20 GB for 64
    responses of 512 tokens over Qwen's 152k-token vocabulary). It runs before the sampling
    warpers, so the log-probs are of the full distribution at ``temperature``, the distribution
    the update's forward pass scores.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None  # (B, V) log-softmax of the last step
        self.steps: list[torch.Tensor] = []  # (B,) per generated token

    def _take(self, tokens: torch.Tensor) -> None:
        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
            self.previous = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(B, T_new) log-probs of ``new_tokens``, the generated part of the sequences."""
        if new_tokens.shape[1]:
            self._take(new_tokens[:, -1])
        if not self.steps:
            return torch.zeros(new_tokens.shape, dtype=torch.float32, device=new_tokens.device)
        return torch.stack(self.steps, dim=1)


def _merged_lora_state(model: Any) -> dict[str, torch.Tensor]:
    """The base model's state with LoRA deltas merged, under the base model's parameter names."""
    model.merge_adapter()
    try:
        state = {}
        for name, value in model.state_dict().items():
            if "lora_" in name:
                continue
            clean = name.replace("base_model.model.", "", 1).replace(".base_layer", "")
            state[clean] = value.detach().clone()
    finally:
        model.unmerge_adapter()
    return state


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    """End-of-turn ids: the generation config's (Qwen lists several) plus the tokenizer's."""
    ids: list[int] = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.append(configured)
    elif configured:
        ids.extend(int(i) for i in configured)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the tokenizer has no eos token and the model's generation config none")
    return ids
