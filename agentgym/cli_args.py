"""Argument checks shared by the ``agentgym`` command and the sub-commands other subpackages add
to it (``agentgym serve`` in ``agentgym.integrations``).

They live here, not in ``agentgym.cli``, so that a sub-command imports them without importing
the command that imports it back.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from agentgym.envs import ENTRIES, entry

__all__ = ["add_max_episode_steps", "int_at_least", "resolve_env_id"]


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


class _OldFlag(argparse.Action):
    """A flag's old name, accepted for one release: stores under the new name's ``dest`` and
    says so in one line on stderr."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        new = "--" + self.dest.replace("_", "-")
        print(f"{parser.prog}: warning: {option} is deprecated: use {new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_max_episode_steps(
    parser: argparse.ArgumentParser, help: str, old: str | None = None
) -> None:
    """Add ``--max-episode-steps N`` (the env's step cap, as ``gym.make(id,
    max_episode_steps=N)``; default None: the registered cap), and ``old``, a former name of
    the flag, accepted with a one-line warning and hidden from ``--help``."""
    parser.add_argument("--max-episode-steps", type=int_at_least(1), default=None, help=help)
    if old is not None:
        parser.add_argument(
            old,
            dest="max_episode_steps",
            type=int_at_least(1),
            action=_OldFlag,
            help=argparse.SUPPRESS,
        )
