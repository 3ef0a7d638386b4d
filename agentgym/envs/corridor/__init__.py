"""Corridor: a tiny text env where step-level credit assignment matters.

See :class:`CorridorEnv`. Used by the trainer's learning test and the GiGPO-vs-GRPO benchmark.
"""

from agentgym.envs.corridor.env import DOOR_NAMES, CorridorEnv
from agentgym.family import FamilySpec, JudgeSpec

__all__ = ["CorridorEnv", "DOOR_NAMES"]

#: What shared code asks of the corridor: the generic prompt; a rule judge on ``info["score"]``,
#: the share of rooms passed (a round scores 1 exactly when it advanced a room); and for the
#: bundled trainer a tiny-model setup that learns on a CPU in minutes (a far larger learning
#: rate than a 1.5B model tolerates, single-token actions, short responses). Its layouts are
#: held out in text, not only in combination: 3 rooms, 4 doors, ``disjoint_splits`` (each
#: room's right door in the test split is one the train split never lights in that room), so
#: no test prompt occurs in training: 8 distinct test layouts, 6 distinct test room texts
#: (2 per room; 18 test observations with the walk-back and dead-end variants).
FAMILY = FamilySpec(
    rule_judge=JudgeSpec("progress", {"key": "score"}),
    trainer_defaults={
        "fmt": "plain",
        "prompt_template": "compact",
        "history_length": 0,
        "train_split": "train",
        "eval_split": "test",
        "env_kwargs": {"length": 3, "num_doors": 4, "list_doors": False, "disjoint_splits": True},
        "model": "tiny",
        "max_new_tokens": 1,
        "lr": 2e-3,
        "num_groups": 8,
        "group_size": 8,
        "iterations": 60,
        "mini_batch_size": 128,
        "micro_batch_size": 64,
        "kl_coef": 0.0,
        "cpu_threads": 1,
        "eval_every": 10,
    },
)
