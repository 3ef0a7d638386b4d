"""``agentgym retrieval``: build search indexes and serve them."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``retrieval`` command and its sub-commands to the main parser."""
    p = sub.add_parser("retrieval", help="build search indexes and serve them over HTTP")
    p.add_subparsers(dest="retrieval_command", required=True)
