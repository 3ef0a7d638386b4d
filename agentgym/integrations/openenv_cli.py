"""``agentgym serve``: serve one env id over OpenEnv's protocol.

agentgym serve AgentGym/Sokoban-v0 --port 8000
agentgym serve Corridor-v0 --port 8000 --max-sessions 64 --session-timeout 120
agentgym serve AgentGym/Sokoban-v0 --host 0.0.0.0 --port 8000   # other hosts too: no auth!
agentgym serve AgentGym/Sokoban-v0 --port 8000 --llm   # prompts out, raw model text in

Clients connect to ws://HOST:PORT/ws (OpenEnv's ``EnvClient``, e.g. its ``GenericEnvClient``
or ``agentgym.integrations.openenv.AgentGymEnvClient``); each connection is one session with its
own env. Tool-calling clients (OpenEnv's ``MCPToolClient``) use /mcp: one tool, ``act(action)``.
The server has no authentication: it binds 127.0.0.1 unless --host says otherwise, and warns
when it does. Needs ``openenv`` >= 0.10 (in a clone: ``pip install -e ".[openenv]"``).
"""

from __future__ import annotations

import argparse
import json
import sys

from agentgym.cli_args import int_at_least, resolve_env_id


def _session_timeout(text: str) -> float | None:
    """argparse type: seconds > 0, or 0 for sessions that never time out."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 (0: no timeout), got {text}")
    return value or None


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"ports are 0..65535, got {value}")
    return value


def _env_kwargs(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"k\": 1}}': {text}")
    return value


def cmd_serve(args: argparse.Namespace) -> int:
    """Check everything that can fail in one line, then serve until Ctrl-C."""
    try:
        env_id = resolve_env_id(args.env_id)
        # OpenEnv's server imports gradio, which alone takes seconds: say so before it starts
        print(
            f"agentgym serve: starting {env_id}: loading OpenEnv's server...",
            file=sys.stderr,
            flush=True,
        )
        from agentgym.integrations.openenv_server import serve

        serve(
            env_id,
            host=args.host,
            port=args.port,
            env_kwargs=args.env_kwargs,
            llm={"history_length": args.history_length} if args.llm else None,
            max_sessions=args.max_sessions,
            session_timeout=args.session_timeout,
            log_level=args.log_level,
        )
    except KeyError as exc:  # unknown id: the message lists the registered ones
        print(f"agentgym serve: error: {exc.args[0]}", file=sys.stderr)
        return 2
    except (ImportError, FileNotFoundError, ValueError, TypeError) as exc:
        # missing openenv or the env's extra, missing data, bad --env-kwargs for this env
        print(f"agentgym serve: error: {exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``serve`` command to the main parser."""
    p = sub.add_parser(
        "serve",
        help="serve an env over OpenEnv's protocol (WebSocket /ws, one env per session)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("env_id", help="a registered id, e.g. AgentGym/Sokoban-v0 (or Sokoban-v0)")
    p.add_argument("--port", type=_port, default=8000, help="TCP port (8000)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (127.0.0.1: this machine only; anything else is reachable by "
        "others, with no authentication)",
    )
    p.add_argument(
        "--max-sessions",
        type=int_at_least(1),
        default=32,  # openenv_server.DEFAULT_MAX_SESSIONS (tested equal)
        help="sessions served at once; a connection beyond them gets an error (32)",
    )
    p.add_argument(
        "--session-timeout",
        type=_session_timeout,
        default=300.0,  # openenv_server.DEFAULT_SESSION_TIMEOUT_S (tested equal)
        help="seconds a session may stay idle before it is closed; 0: never (300)",
    )
    p.add_argument(
        "--env-kwargs",
        type=_env_kwargs,
        default=None,
        help="JSON object of gym.make keyword arguments, e.g. '{\"max_episode_steps\": 20}'",
    )
    p.add_argument(
        "--llm",
        action="store_true",
        help="serve prompts for a language model (task, history, admissible actions, format) and "
        "take its raw text as the action, e.g. '<think>...</think><action>up</action>'",
    )
    p.add_argument(
        "--history-length",
        type=int_at_least(0),
        default=2,
        help="with --llm: past (observation, action) pairs in each prompt (2)",
    )
    p.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        default="info",
        help="server log level (info)",
    )
    p.set_defaults(func=cmd_serve)


def main(argv: list[str] | None = None) -> int:
    """``python -m agentgym.integrations.openenv_cli ID ...``: the same command on its own."""
    parser = argparse.ArgumentParser(prog="agentgym")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
