"""Deprecated alias of :mod:`agentgym.engine`, kept for one release.

The engine plays every episode against a model (evaluation, rollouts, training, the TRL and verl
adapters), so it moved out of a package named for evaluation. Import from ``agentgym.engine``.
"""

import warnings

from agentgym.engine import *  # noqa: F403
from agentgym.engine import __all__  # noqa: F401

warnings.warn(
    "agentgym.eval is now agentgym.engine; the old name goes away in the next release",
    DeprecationWarning,
    stacklevel=2,
)
