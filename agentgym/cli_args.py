"""Argument checks shared by the ``agentgym`` command and the sub-commands other subpackages add
to it (``agentgym serve`` in ``agentgym.integrations``).

They live here, not in ``agentgym.cli``, so that a sub-command imports them without importing
the command that imports it back.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from agentgym.envs import ENTRIES, entry

__all__ = ["int_at_least", "resolve_env_id"]


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``low``, checked before any work starts."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number >= {low}, got {text!r}"
            ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def resolve_env_id(env_id: str) -> str:
    """The registered id that ``env_id`` names: a full id, or one without its ``AgentGym/``
    prefix (``Sokoban-v0``). Raises ``KeyError`` listing the registered ids otherwise."""
    if f"AgentGym/{env_id}" in {e.id for e in ENTRIES}:
        return f"AgentGym/{env_id}"
    return entry(env_id).id
