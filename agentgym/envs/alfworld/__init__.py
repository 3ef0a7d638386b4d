"""ALFWorld: household tasks in TextWorld, from alfworld's own game files.

:class:`ALFWorldEnv` plays the real benchmark (``AgentGym/ALFWorld-v0``, data from
``$ALFWORLD_DATA``) and the project's synthetic games (``AgentGym/ALFWorld-Synthetic-v0``,
:mod:`.synthetic`) with text identical to alfworld's ``AlfredTWEnv``, on the fast simulator of
:mod:`.engine`. :func:`data_status` says what data was found; :func:`success_by_task_type`
reports evaluation results per task type.
"""

from agentgym.envs.alfworld.data import (
    SPLITS,
    TASK_TYPES,
    DataNotFoundError,
    data_status,
    list_games,
)
from agentgym.envs.alfworld.env import ALFWorldEnv, success_by_task_type
from agentgym.family import HISTORY_INTRO, FamilySpec, JudgeSpec, PromptTemplate

__all__ = [
    "FAMILY",
    "ALFWorldEnv",
    "DataNotFoundError",
    "SPLITS",
    "TASK_TYPES",
    "data_status",
    "list_games",
    "success_by_task_type",
]

#: What shared code asks of ALFWorld: verl-agent's ALFWorld prompt; a rule judge over the goal's
#: facts (a round scores 1 when it made a goal fact true, into a state not seen before: a fact is
#: often undone on the way, e.g. the ladle taken off the countertop to be cleaned); the paper's
#: out-of-distribution evaluation split; a process pool for rollouts (a step costs far more
#: than a process hop).
FAMILY = FamilySpec(
    prompt=PromptTemplate(
        first=(
            "You are an expert agent operating in the ALFRED Embodied Environment.\n"
            "{task_line}Your current observation is: {observation}\n{admissible_line}\n"
            "{instruction}\n"
        ),
        later=(
            "You are an expert agent operating in the ALFRED Embodied Environment.\n"
            "{task_line}" + HISTORY_INTRO + "{admissible_line}\n{instruction}\n"
        ),
        task_prefix="Your task is to: ",
    ),
    rule_judge=JudgeSpec(
        "progress", {"key": ("goal_progress", "goal_facts_met"), "since": "previous"}
    ),
    trainer_defaults={"eval_split": "valid_unseen", "env_backend": "process"},
    data_env_var="ALFWORLD_DATA",
)
