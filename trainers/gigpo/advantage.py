"""The trainer's advantage estimators: a re-export of :mod:`agentgym.algorithms.advantage`.

GRPO and GiGPO live in the library so that other RL libraries' adapters (the verl estimator in
:mod:`agentgym.integrations.verl`) and this trainer use one implementation; this module keeps the
trainer's import path. Estimators registered through either name land in the same registry.
"""

from agentgym.algorithms.advantage import *  # noqa: F403  (the public API, see its __all__)
from agentgym.algorithms.advantage import (  # noqa: F401  (typing names, outside __all__)
    EpisodeStatsOver,
    EstimatorFn,
    Norm,
    gigpo,
    grpo,
)
from agentgym.algorithms.advantage import __all__ as __all__  # noqa: F401
