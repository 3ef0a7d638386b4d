"""How a vector env builds its envs, in this process or in a worker: a picklable recipe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

__all__ = ["EnvFactory", "WrapperSpec"]

WrapperSpec = tuple[Callable[..., gym.Env], dict[str, Any]]
"""``(wrapper_class, kwargs)``: one wrapper applied around every env of a vector env"""


@dataclass(frozen=True)
class EnvFactory:
    """A picklable recipe for one env: ``gym.make(env_id, **env_kwargs)`` then each wrapper.

    Workers call it after :func:`~agentgym.vector.backends.host.bootstrap_worker` has
    registered agentgym's ids there.
    """

    env_id: str | gym.envs.registration.EnvSpec
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    wrappers: tuple[WrapperSpec, ...] = ()

    def __call__(self) -> gym.Env:
        # The passive checker only inspects the first reset/step; the registry-wide tests run
        # check_env, so vectorised copies skip it.
        env = gym.make(self.env_id, disable_env_checker=True, **self.env_kwargs)
        for wrapper, kwargs in self.wrappers:
            env = wrapper(env, **kwargs)
        return env
