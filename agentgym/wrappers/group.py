"""The former home of the group-rollout vector env, now the :mod:`agentgym.vector` package.

Imports and pickles that name ``agentgym.wrappers.group`` keep working: every name here is the
object itself from :mod:`agentgym.vector`, not a copy. New code imports from
:mod:`agentgym.vector` (or ``agentgym`` / ``agentgym.wrappers`` for ``GroupVectorEnv``).
"""

# ruff: noqa: F401 - re-exports, the former private names too (for code that reached into them)
from agentgym.vector.backends.host import EnvHost as _EnvHost
from agentgym.vector.backends.inprocess import InProcessBackend as _InProcessBackend
from agentgym.vector.backends.process import ProcessBackend as _ProcessBackend
from agentgym.vector.backends.process import _worker_main
from agentgym.vector.backends.ray import RayBackend as _RayBackend
from agentgym.vector.backends.ray import RaySession as _RaySession
from agentgym.vector.backends.sharded import ShardedBackend as _ShardedBackend
from agentgym.vector.backends.sharded import _sendable, _UnsendableAction
from agentgym.vector.factory import EnvFactory, WrapperSpec
from agentgym.vector.failures import BootstrapError as _BootstrapError
from agentgym.vector.failures import EnvError, WorkerDied
from agentgym.vector.failures import Failure as _Failure
from agentgym.vector.records import Step, Trajectory
from agentgym.vector.snapshot import GroupEnvSnapshot
from agentgym.vector.snapshot import restore_env as _restore_env
from agentgym.vector.snapshot import snapshot_env as _snapshot_env
from agentgym.vector.vector_env import (
    GroupVectorEnv,
    Infos,
    make_group_vector_env,
    vector_entry_point,
)

__all__ = [
    "Step",
    "Trajectory",
    "GroupVectorEnv",
    "EnvError",
    "GroupEnvSnapshot",
    "EnvFactory",
    "make_group_vector_env",
]
