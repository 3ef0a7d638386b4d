"""Where a :class:`~agentgym.vector.GroupVectorEnv` keeps its envs: every backend satisfies the
:class:`Backend` protocol.

- :mod:`~agentgym.vector.backends.inprocess`: in the caller's process (the default);
- :mod:`~agentgym.vector.backends.process`: a pool of worker processes on this machine;
- :mod:`~agentgym.vector.backends.ray`: Ray actors, on the machines of a Ray cluster.

The process and Ray backends share :mod:`~agentgym.vector.backends.sharded` (shards, one
deadline per call, lost workers replaced); each worker holds an
:class:`~agentgym.vector.backends.host.EnvHost`.
"""

from agentgym.vector.backends.base import (
    Backend,
    BackendName,
    EnvCommand,
    ResetRequest,
    ResetResult,
    StepRequest,
    StepResult,
)
from agentgym.vector.backends.inprocess import InProcessBackend
from agentgym.vector.backends.process import ProcessBackend
from agentgym.vector.backends.ray import RayBackend

__all__ = [
    "Backend",
    "BackendName",
    "EnvCommand",
    "InProcessBackend",
    "ProcessBackend",
    "RayBackend",
    "ResetRequest",
    "ResetResult",
    "StepRequest",
    "StepResult",
]
