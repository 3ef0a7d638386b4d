"""Env -> env transforms (LLM prompt rendering and output parsing); the group-rollout vector env,
now in :mod:`agentgym.vector`, is re-exported here too."""

from agentgym.vector import (
    EnvError,
    EnvFactory,
    GroupEnvSnapshot,
    GroupVectorEnv,
    Step,
    Trajectory,
    make_group_vector_env,
)
from agentgym.wrappers.llm import (
    FAMILY_TEMPLATES,
    FORMAT_INSTRUCTIONS,
    FORMATS,
    PROMPT_TEMPLATES,
    ParseActions,
    ParsedAction,
    ParseFailure,
    PromptRenderer,
    PromptTemplate,
    make_llm_env,
    parse_action,
    render_prompt,
)

__all__ = [
    "EnvError",
    "EnvFactory",
    "GroupEnvSnapshot",
    "GroupVectorEnv",
    "Step",
    "Trajectory",
    "make_group_vector_env",
    "FAMILY_TEMPLATES",
    "FORMAT_INSTRUCTIONS",
    "FORMATS",
    "PROMPT_TEMPLATES",
    "ParseActions",
    "ParsedAction",
    "ParseFailure",
    "PromptRenderer",
    "PromptTemplate",
    "make_llm_env",
    "parse_action",
    "render_prompt",
]
