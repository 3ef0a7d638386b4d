"""Advantage estimators for multi-turn agent RL, shared by every trainer that consumes agentgym.

:mod:`agentgym.algorithms.advantage` holds the one implementation of GRPO and GiGPO (arXiv
2505.10978): the bundled trainer (``trainers/gigpo``) and the library adapters (e.g. the verl
estimator in :mod:`agentgym.integrations.verl`) all import it from here. Pure numpy; torch is
imported only by :func:`~agentgym.algorithms.advantage.token_advantages`.
"""

from agentgym.algorithms.advantage import (
    AdvantageConfig,
    AdvantageResult,
    available_advantages,
    compute_advantage,
    encode_state_keys,
    register_advantage,
    token_advantages,
)

__all__ = [
    "AdvantageConfig",
    "AdvantageResult",
    "available_advantages",
    "compute_advantage",
    "encode_state_keys",
    "register_advantage",
    "token_advantages",
]
