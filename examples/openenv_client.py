"""Group rollouts against an agentgym env served over OpenEnv's protocol.

Any library that speaks OpenEnv (TRL, torchforge, ART, Unsloth, NeMo Gym...) drives a served
env the way this script does: one WebSocket session per trajectory, ``reset`` / ``step`` /
``state`` messages, observations carrying the text, reward, done and agentgym's info.

Here ``groups x group-size`` sessions run concurrently (asyncio): the sessions of a group reset
with the same seed, so they start from the same task, as GiGPO's groups do; a random policy picks
admissible actions. At the end the script counts how many steps landed in a state that another
trajectory of the same group also visited (``observation.state_key`` is equal exactly when the
env's canonical state is), which is what step-level credit assignment groups on.

With ``--tools`` the same episodes are played the way a tool-calling agent plays them: through
OpenEnv's ``MCPToolClient`` and the env's one tool, ``act(action)``, which answers with the
observation text followed by the admissible actions (or the end of the episode).

    python examples/openenv_client.py                      # starts its own server, then plays
    python examples/openenv_client.py --tools              # the same, through the act tool
    agentgym serve AgentGym/Sokoban-v0 --port 8000 &       # or against a running server:
    python examples/openenv_client.py --url http://127.0.0.1:8000

Needs openenv (>= 0.10): pip install -e ".[openenv]" in a clone of agentgym (not on the package index yet).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import httpx
from openenv.core.mcp_client import MCPToolClient

from agentgym.integrations.openenv import AgentGymEnvClient


async def play_one(url: str, seed: int, policy_seed: int) -> list[tuple[str, float]]:
    """One trajectory in its own session: [(state_key, reward), ...] of every step."""
    rng = random.Random(policy_seed)
    steps: list[tuple[str, float]] = []
    async with AgentGymEnvClient(base_url=url) as env:
        result = await env.reset(seed=seed)  # same seed -> same task and start state
        while not result.done:
            obs = result.observation
            action = rng.choice(
                obs.admissible_actions or obs.info.get("suggested_actions", ["look"])
            )
            result = await env.step(action)
            steps.append((result.observation.state_key, result.reward or 0.0))
        steps.append(("won" if result.observation.won else "lost", 0.0))
    return steps


async def play_with_tools(url: str, seed: int, policy_seed: int) -> list[tuple[str, float]]:
    """One trajectory through the ``act`` tool, reading actions off the text it returns.

    The tool's answer is all a tool-calling model sees: no reward or state key, so each step
    records ("", 0.0), and the last entry says whether the episode was won.
    """
    rng = random.Random(policy_seed)
    steps: list[tuple[str, float]] = []
    async with MCPToolClient(base_url=url) as env:
        result = await env.reset(seed=seed)
        text = (
            result.observation.text
            + "\nAdmissible actions: "
            + ", ".join(result.observation.admissible_actions or ["look"])
        )
        while "The episode is over" not in text:
            listed = text.rsplit("Admissible actions: ", 1)[-1]
            text = await env.call_tool("act", action=rng.choice(listed.split(", ")))
            steps.append(("", 0.0))
        steps.append(("won" if text.endswith("you won.") else "lost", 0.0))
    return steps


async def rollout(url: str, groups: int, group_size: int, seed: int, tools: bool = False) -> None:
    t0 = time.perf_counter()
    play = play_with_tools if tools else play_one
    jobs = [
        play(url, seed=seed + g, policy_seed=seed * 10_000 + g * group_size + i)
        for g in range(groups)
        for i in range(group_size)
    ]
    trajectories = await asyncio.gather(*jobs)  # every session at once (bounded by the server)
    seconds = time.perf_counter() - t0

    n_steps = wins = shared = 0
    for g in range(groups):
        group = trajectories[g * group_size : (g + 1) * group_size]
        # in how many trajectories of this group does each state appear?
        visits = Counter(key for traj in group for key in {k for k, _ in traj[:-1]})
        for traj in group:
            wins += traj[-1][0] == "won"
            n_steps += len(traj) - 1
            shared += sum(visits[key] > 1 for key, _ in traj[:-1] if key)
    episodes = groups * group_size
    summary = (
        f"{episodes} episodes in {groups} groups: {wins}/{episodes} won, {n_steps} steps "
        f"({n_steps / seconds:,.0f} steps/s over the wire, {episodes} concurrent sessions)"
    )
    if not tools:  # tool answers carry no state key
        summary += (
            f"; {shared / max(n_steps, 1):.0%} of steps reached a state another trajectory of "
            "their group also reached"
        )
    print(summary)


@contextlib.contextmanager
def local_server(env_id: str, max_sessions: int) -> Iterator[str]:
    """``agentgym serve env_id`` in a child process on a free loopback port; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "agentgym.integrations.openenv_cli", env_id, "--port", str(port)]
    cmd += ["--max-sessions", str(max_sessions), "--log-level", "warning"]
    server = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # wait until it answers (the first env is built before it listens)
            if server.poll() is not None:
                sys.exit(f"the server exited with code {server.returncode} (see its error above)")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                sys.exit("the server did not answer within 120 s")
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", default=None, help="a running `agentgym serve` (default: start one)")
    p.add_argument("--env", default="AgentGym/Sokoban-v0", help="id to serve when starting one")
    p.add_argument("--groups", type=int, default=2, help="tasks")
    p.add_argument("--group-size", type=int, default=4, help="trajectories per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tools", action="store_true", help="play through the MCP tool act(action)")
    args = p.parse_args()
    if args.url:
        asyncio.run(rollout(args.url, args.groups, args.group_size, args.seed, args.tools))
        return
    with local_server(args.env, max_sessions=args.groups * args.group_size) as url:
        asyncio.run(rollout(url, args.groups, args.group_size, args.seed, args.tools))


if __name__ == "__main__":
    main()
