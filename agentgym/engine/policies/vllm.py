"""vLLM in this process: the GPU path of lockstep rounds, trained weights loaded after updates."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

from agentgym.engine.policies.base import Infos, Messages, Policy, PolicyOutput, SamplingParams
from agentgym.engine.policies.transformers import chat_prompt_ids
from agentgym.extras import missing_extra

__all__ = ["VLLMPolicy"]


class VLLMPolicy(Policy):
    """Batched generation with ``vllm.LLM``; a trainer's weights are loaded after every update.

    Untested here (no GPU and no vLLM in this repository's CI). :meth:`generate` answers a
    lockstep round in one ``LLM.generate`` call (prompts chat-templated here, so the prompt ids
    are known; prefix caching on, as a group's episodes share their first prompt), with the
    sampled ids and their log-probs (``logprobs=0``: the sampled token's). Weight sync uses
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
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.llm = vllm.LLM(
            model=model_name,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            enable_prefix_caching=True,  # the group's envs share their first prompt
        )

    def generate(
        self, messages: Sequence[Messages], params: SamplingParams, infos: Infos = None
    ) -> list[PolicyOutput]:
        started = time.perf_counter()
        sampling = self._vllm.SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            logprobs=0,
        )
        ids = [chat_prompt_ids(self.tokenizer, m, self.max_prompt_tokens) for m in messages]
        outputs = self.llm.generate(
            [{"prompt_token_ids": x} for x in ids], sampling, use_tqdm=False
        )
        latency = time.perf_counter() - started
        out = []
        for prompt_ids, result in zip(ids, outputs, strict=True):
            comp = result.outputs[0]
            response = list(comp.token_ids)
            logprobs = [
                step[tok].logprob for tok, step in zip(response, comp.logprobs or [], strict=False)
            ]
            out.append(
                PolicyOutput.sampled(
                    comp.text, prompt_ids, response, logprobs, latency, comp.finish_reason
                )
            )
        return out

    async def act(
        self, messages: Messages, params: SamplingParams, info: dict[str, Any] | None = None
    ) -> PolicyOutput:
        return (await asyncio.to_thread(self.generate, [messages], params, [info]))[0]

    async def act_batch(
        self, messages: Sequence[Messages], params: SamplingParams, infos: Infos = None
    ) -> list[PolicyOutput]:
        return await asyncio.to_thread(self.generate, messages, params, infos)

    def sync_weights(self, model: Any) -> None:
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

    def describe(self) -> dict[str, Any]:
        return {"policy": "vllm", "model": self.model_name}


def _merged_lora_state(model: Any) -> dict[str, Any]:
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
