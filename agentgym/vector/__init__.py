"""Group rollouts: :class:`GroupVectorEnv` runs ``num_groups x group_size`` envs, every env of a
group on the same task and initial state, and records each episode as a :class:`Trajectory`.

The package, after Gymnasium's ``gymnasium.vector``:

- :mod:`~agentgym.vector.vector_env`: :class:`GroupVectorEnv` and ``gym.make_vec``'s entry point;
- :mod:`~agentgym.vector.records`: :class:`Step` and :class:`Trajectory`;
- :mod:`~agentgym.vector.snapshot`: :class:`GroupEnvSnapshot`, an env's state with its wrappers';
- :mod:`~agentgym.vector.factory`: :class:`EnvFactory`, the picklable recipe workers build envs
  from;
- :mod:`~agentgym.vector.failures`: what stands in for a failed env's result, and
  :class:`EnvError`;
- :mod:`~agentgym.vector.backends`: the :class:`~agentgym.vector.backends.Backend` protocol and
  the in-process, process-pool and Ray backends (with their fault handling: a lost worker is
  replaced and its episodes end truncated; nothing hangs).
"""

from agentgym.vector.backends import Backend, BackendName
from agentgym.vector.factory import EnvFactory, WrapperSpec
from agentgym.vector.failures import EnvError
from agentgym.vector.records import Step, Trajectory
from agentgym.vector.snapshot import GroupEnvSnapshot
from agentgym.vector.vector_env import (
    GroupVectorEnv,
    InfoLayout,
    Infos,
    make_group_vector_env,
    vector_entry_point,
)

__all__ = [
    "Backend",
    "BackendName",
    "EnvError",
    "EnvFactory",
    "GroupEnvSnapshot",
    "GroupVectorEnv",
    "InfoLayout",
    "Infos",
    "Step",
    "Trajectory",
    "WrapperSpec",
    "make_group_vector_env",
    "vector_entry_point",
]
