"""The one engine that plays episodes against a language model: policies, the runner, summaries.

Evaluation (``agentgym eval``), ``agentgym rollout``, the bundled trainer and the TRL and verl
adapters all play their episodes here: per episode as coroutines (:class:`RolloutEngine`), or in
lockstep rounds over group envs (:mod:`agentgym.engine.lockstep`).

See :mod:`agentgym.engine.runner` for a runnable example and ``agentgym eval -h`` for the command.
Importing this package imports neither torch nor httpx: each policy imports its backend when
built.
"""

from agentgym.engine.llama_server import LlamaServer, LlamaServerError
from agentgym.engine.policies import (
    OpenAIChatPolicy,
    OpenAICompletionsScorer,
    Policy,
    PolicyOutput,
    PolicyUnavailable,
    SamplingParams,
    ScoredActionPolicy,
    TransformersPolicy,
    candidate_actions,
    chat_prompt_ids,
)
from agentgym.engine.report import format_table, summarize
from agentgym.engine.runner import (
    EngineStats,
    EpisodeRecord,
    EpisodeSpec,
    RolloutEngine,
    Turn,
    make_episodes,
    state_key_text,
)

__all__ = [
    "EngineStats",
    "EpisodeRecord",
    "EpisodeSpec",
    "LlamaServer",
    "LlamaServerError",
    "OpenAIChatPolicy",
    "OpenAICompletionsScorer",
    "Policy",
    "PolicyOutput",
    "PolicyUnavailable",
    "RolloutEngine",
    "SamplingParams",
    "ScoredActionPolicy",
    "TransformersPolicy",
    "Turn",
    "candidate_actions",
    "chat_prompt_ids",
    "format_table",
    "make_episodes",
    "state_key_text",
    "summarize",
]
