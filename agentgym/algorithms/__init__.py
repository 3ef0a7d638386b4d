"""Advantage estimators for multi-turn agent RL, shared by every trainer that consumes agentgym.

:mod:`agentgym.algorithms.advantage` holds the one implementation of GRPO and GiGPO (arXiv
2505.10978), RLOO, SLATE, CW-GRPO and SLEA-RL: the bundled trainer (``trainers/gigpo``) and the
library adapters (e.g. the verl estimator in :mod:`agentgym.integrations.verl`) all import it
from here. HiPER's hierarchical estimator is in :mod:`agentgym.algorithms.hiper`. SPA-RL
(:mod:`~agentgym.algorithms.spa`) and OPRL (:mod:`~agentgym.algorithms.oprl`) read a learned
model's step rewards; their models live beside them, with an ``update`` method
(:class:`~agentgym.algorithms.learned_credit.LearnedCredit` holds either for a trainer).
:mod:`agentgym.algorithms.ground_truth` computes exact advantages on small envs to score them
against.
Each estimator is registered by name with its own options dataclass and the per-row inputs it
reads (:func:`advantage_estimator`). Pure numpy; torch is imported only by
:func:`~agentgym.algorithms.advantage.token_advantages` and when a learned model is built.
"""

# Importing them registers "spa" and "oprl" (torch loads when a model is built).
from agentgym.algorithms import oprl, spa  # noqa: F401
from agentgym.algorithms.advantage import (
    EPISODE_STATS,
    NORMS,
    ROW_INPUTS,
    AdvantageConfig,
    AdvantageResult,
    CWGRPOConfig,
    EpisodeGroupConfig,
    Estimator,
    GiGPOConfig,
    SLEARLConfig,
    advantage_estimator,
    available_advantages,
    compute_advantage,
    encode_state_keys,
    register_advantage,
    token_advantages,
    unregister_advantage,
)
from agentgym.algorithms.hiper import HiPERConfig  # registers "hiper"

__all__ = [
    "EPISODE_STATS",
    "NORMS",
    "ROW_INPUTS",
    "AdvantageConfig",
    "AdvantageResult",
    "CWGRPOConfig",
    "EpisodeGroupConfig",
    "Estimator",
    "GiGPOConfig",
    "HiPERConfig",
    "SLEARLConfig",
    "advantage_estimator",
    "available_advantages",
    "compute_advantage",
    "encode_state_keys",
    "register_advantage",
    "token_advantages",
    "unregister_advantage",
]
