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
- :class:`TransformersPolicy`: a local model in this process (a folder, or a trainer's model).
  A lockstep round is one batched call (:meth:`Policy.generate`); requests from the async
  engine's episodes are gathered by a micro-batcher into batches in a single worker thread; the
  sampled token ids and their log-probs are recorded (the ids trained are the ids sampled).
- ``agentgym.engine.policies.vllm.VLLMPolicy``: vLLM in this process, the GPU path of lockstep
  rounds (imported on its own: it needs vLLM).
- :class:`ScoredActionPolicy`: scores each candidate action by the model's log-likelihood of it
  as the reply to the prompt and picks the best (or samples from the softmax); the scores come
  from a local model (:class:`TransformersPolicy`) or a server returning prompt log-probs
  (:class:`OpenAICompletionsScorer`, ``/v1/completions`` with ``echo`` + ``logprobs``).
"""

from agentgym.engine.policies.base import (
    Policy,
    PolicyOutput,
    PolicyUnavailable,
    SamplingParams,
)
from agentgym.engine.policies.http import OpenAIChatPolicy, OpenAICompletionsScorer
from agentgym.engine.policies.scored import ScoredActionPolicy, candidate_actions
from agentgym.engine.policies.transformers import TransformersPolicy, chat_prompt_ids

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
    "chat_prompt_ids",
]
