"""agentgym: Gymnasium text environments for training LLM agents with RL.

``import agentgym`` registers every env id with gymnasium::

    import gymnasium as gym
    import agentgym

    env = gym.make("AgentGym/Sokoban-v0")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("up")
    info["state_key"]   # hashable canonical state, for step-level credit assignment

The public API is what this module re-exports.
"""

from __future__ import annotations

import gymnasium as gym

from agentgym.core import (
    INFO_KEYS,
    TEXT_CHARSET,
    EnvSnapshot,
    ResetOptionError,
    SnapshotMismatch,
    TextEnv,
)
from agentgym.envs import ENTRIES, EnvEntry, entry
from agentgym.family import FamilySpec, family_spec, register_family
from agentgym.vector import GroupVectorEnv, Step, Trajectory, vector_entry_point

__version__ = "0.1.0"

__all__ = [
    "INFO_KEYS",
    "TEXT_CHARSET",
    "TextEnv",
    "EnvSnapshot",
    "SnapshotMismatch",
    "ResetOptionError",
    "ENTRIES",
    "EnvEntry",
    "entry",
    "env_ids",
    "FamilySpec",
    "family_spec",
    "register",
    "register_envs",
    "GroupVectorEnv",
    "Trajectory",
    "Step",
]


def register_envs() -> None:
    """Register every :data:`ENTRIES` id with gymnasium (idempotent).

    Each id's step cap is registered as gymnasium's ``max_episode_steps``: ``gym.make`` hands it
    to the env (:class:`~agentgym.core.StepCap`), and ``gym.make(id, max_episode_steps=N)`` (or
    ``env_kwargs={"max_episode_steps": N}`` wherever agentgym calls ``gym.make`` for you:
    ``gym.make_vec``, :class:`GroupVectorEnv`, the trainer, ``agentgym serve``, the TRL and verl
    adapters) sets another, longer or shorter.
    """
    for e in ENTRIES:
        # the family's FAMILY spec (prompt, judge, trainer defaults) sits beside its entry point
        register_family(e.family, e.entry_point.split(":")[0])
        if e.id in gym.registry:
            continue
        gym.register(
            id=e.id,
            entry_point=e.make,  # checks the optional packages first: one line naming the extra
            kwargs=dict(e.kwargs),
            # The one step cap: gym.make(id, max_episode_steps=N) can lengthen episodes as well
            # as shorten them, and env.spec.max_episode_steps reports the cap in force. StepCap
            # takes the place of gymnasium's TimeLimit, so the env enforces the cap itself and a
            # step after truncation is a no-op like any step after the end.
            max_episode_steps=e.max_episode_steps,
            additional_wrappers=_STEP_CAP,
            vector_entry_point=vector_entry_point(e.id),
            # Every id passes gymnasium's check_env in the test suite. The passive checker is
            # off by default because it breaks an env whose first reset raised (bad options):
            # it marks reset as checked before the call, and the next step then fails inside it.
            # gym.make(id, disable_env_checker=False) still turns it on.
            disable_env_checker=True,
        )


class _MadeWrappers(tuple):
    """The ``additional_wrappers`` gymnasium registers for every agentgym id: ``(StepCap,)``.

    ``gym.make`` applies them (it slices the tuple). ``gym.make_vec`` refuses a
    ``vector_entry_point`` next to additional wrappers, as a custom vector env might not apply
    them; ours does (every :class:`GroupVectorEnv` env is made with ``gym.make(id)``). That
    check reads the length, so this tuple reports none; iterating and slicing see StepCap.
    """

    __slots__ = ()

    def __len__(self) -> int:
        return 0


_STEP_CAP = _MadeWrappers(
    (gym.envs.registration.WrapperSpec("StepCap", "agentgym.core:StepCap", {}),)
)


def register(entry: EnvEntry) -> None:
    """Add one env id to :data:`ENTRIES` and to gymnasium: the registration line of a new family
    (or variant), e.g. ``agentgym.register(EnvEntry("Mine/Toy-v0", "mypkg.toy:ToyEnv", "toy"))``.

    Raises:
        ValueError: another entry already holds that id.
    """
    if any(e.id == entry.id for e in ENTRIES):
        raise ValueError(f"{entry.id} is already registered; give the new entry another id")
    ENTRIES.append(entry)
    register_envs()


def env_ids(available_only: bool = False) -> list[str]:
    """Registered agentgym ids; with ``available_only``, those whose optional packages are installed."""
    return [e.id for e in ENTRIES if not available_only or e.available()]


register_envs()
