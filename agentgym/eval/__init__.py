"""Real language models against agentgym envs: policies, the async rollout engine, summaries.

See :mod:`agentgym.eval.engine` for a runnable example and ``agentgym eval -h`` for the command.
Importing this package imports neither torch nor httpx: each policy imports its backend when
built.
"""

from agentgym.eval.engine import (
    EngineStats,
    EpisodeRecord,
    EpisodeSpec,
    RolloutEngine,
    Turn,
    make_episodes,
    state_key_text,
)
from agentgym.eval.policies import (
    OpenAIChatPolicy,
    OpenAICompletionsScorer,
    Policy,
    PolicyOutput,
    PolicyUnavailable,
    SamplingParams,
    ScoredActionPolicy,
    TransformersPolicy,
    candidate_actions,
)
from agentgym.eval.report import format_table, summarize

__all__ = [
    "EngineStats",
    "EpisodeRecord",
    "EpisodeSpec",
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
    "format_table",
    "make_episodes",
    "state_key_text",
    "summarize",
]
