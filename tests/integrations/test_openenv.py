"""agentgym envs served over OpenEnv's protocol, driven by OpenEnv's own clients over loopback.

Every server here is the real thing: uvicorn serving the app on 127.0.0.1 (in a thread, or in a
child process for the CLI), with OpenEnv's ``EnvClient`` (our typed subclass and OpenEnv's
``GenericEnvClient``) or a raw WebSocket for the malformed frames no client would send.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import strategies as st

pytest.importorskip("openenv", reason="openenv not installed")

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from openenv.core.generic_client import GenericEnvClient  # noqa: E402
from openenv.core.mcp_client import MCPToolClient  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect as ws_connect  # noqa: E402

import agentgym  # noqa: E402
from agentgym.core import INFO_KEYS  # noqa: E402
from agentgym.integrations.openenv import (  # noqa: E402
    AgentGymAction,
    AgentGymEnvClient,
    json_safe,
    render_state_key,
    text_safe,
)
from agentgym.integrations.openenv_server import (  # noqa: E402
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_TIMEOUT_S,
    MAX_FRAME_DEPTH,
    MAX_FRAME_VALUES,
    MAX_MESSAGE_BYTES,
    bind_warning,
    create_app,
    is_loopback,
)

ALL_IDS = [e.id for e in agentgym.ENTRIES]


@contextlib.contextmanager
def running_server(env_id: str, **app_kwargs: Any) -> Iterator[tuple[str, Any]]:
    """Serve ``create_app(env_id, **app_kwargs)`` on a free loopback port; yield (url, app)."""
    app = create_app(env_id, **app_kwargs)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_until_no_sessions(app: Any, within_s: float = 10.0) -> None:
    """Wait until the server has freed every session (it does so just after a client leaves)."""
    server = app.state.openenv_server
    deadline = time.monotonic() + within_s
    while server.active_sessions and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.active_sessions == 0


def client(url: str) -> Any:
    """OpenEnv's sync client wrapper around our typed EnvClient, connected."""
    return AgentGymEnvClient(base_url=url, message_timeout_s=30).sync().connect()


def pick_action(info: dict, rng: np.random.Generator, step: int) -> str:
    """A random usable action, and an unusable one on step 2 (it must round-trip as invalid)."""
    if step == 2:
        return "xyzzy !! not an action"
    choices = info.get("admissible_actions") or info.get("suggested_actions") or ["look"]
    action = str(choices[int(rng.integers(len(choices)))])
    if action == "search[<your query>]" and info.get("goal"):  # WebShop: search for the goal
        action = f"search[{' '.join(str(info['goal']).split()[-6:])}]"
    return action


def assert_same(remote: Any, obs: str, info: dict, reward: Any, terminated: bool, truncated: bool):
    """One remote StepResult equals one local gymnasium result, field by field."""
    o = remote.observation
    assert o.text == obs
    assert remote.reward == (None if reward is None else pytest.approx(float(reward)))
    assert remote.done == (terminated or truncated)
    assert (o.terminated, o.truncated) == (terminated, truncated)
    assert o.state_key == render_state_key(info["state_key"])
    assert o.task_id == info["task_id"]
    assert o.admissible_actions == info["admissible_actions"]
    assert (o.action_valid, o.won, o.score) == (info["action_valid"], info["won"], info["score"])
    assert o.info == json_safe({k: v for k, v in info.items() if k not in INFO_KEYS})


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ALL_IDS)
def test_round_trip_equals_local_env(env_id, make):
    """reset(seed) and a run of actions give over the wire exactly what the local env gives.

    Every registered id: real-data ids play the data in ../shared/data (``make`` points the
    family's variable at it, which the server's envs read too) and skip where it is absent.
    """
    local = make(env_id)
    with running_server(env_id, max_sessions=2) as (url, _), client(url) as remote:
        for seed in (0, 7):
            rng = np.random.default_rng(seed)
            obs, info = local.reset(seed=seed)
            result = remote.reset(seed=seed)
            assert_same(result, obs, info, None, False, False)
            for step in range(12):
                action = pick_action(info, rng, step)
                obs, reward, terminated, truncated, info = local.step(action)
                result = remote.step(AgentGymAction(text=action) if step % 2 else action)
                assert_same(result, obs, info, reward, terminated, truncated)
                if step == 2:
                    assert result.observation.action_valid is False
                if terminated or truncated:
                    break
            state = remote.state()
            assert (state.env_id, state.step_count) == (env_id, step + 1)
            assert state.state_key == render_state_key(info["state_key"])
            assert state.done == (terminated or truncated)


def test_a_step_after_truncation_over_the_wire_changes_nothing():
    """A session whose episode the step cap ended answers a further step with the last
    observation, reward 0, ``action_valid=False`` and the same flags; the state stays."""
    kwargs = {"max_episode_steps": 2}
    with running_server("AgentGym/Corridor-v0", env_kwargs=kwargs) as (url, _), client(url) as c:
        door = c.reset(seed=0).observation.admissible_actions[0]
        c.step("xyzzy")
        end = c.step("xyzzy").observation
        assert end.done and (end.terminated, end.truncated) == (False, True)
        for _ in range(2):  # a door the env would take: refused, as every step after the end
            after = c.step(door)
            o = after.observation
            assert (o.text, o.state_key, o.won) == (end.text, end.state_key, end.won)
            assert after.reward == 0.0 and o.action_valid is False
            assert after.done and (o.terminated, o.truncated) == (False, True)


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_openenv_generic_client_plays_every_id(env_id, make):
    """OpenEnv's own GenericEnvClient (plain dicts, no agentgym code) plays every registered id.

    A reset and a couple of steps each, equal to the local env; real-data ids skip where their
    data is absent (as in the round trip above).
    """
    local = make(env_id)
    obs, info = local.reset(seed=1)
    with running_server(env_id, max_sessions=1) as (url, _):
        with GenericEnvClient(base_url=url, message_timeout_s=60).sync() as remote:
            result = remote.reset(seed=1)
            assert result.observation["text"] == obs and result.done is False
            assert result.observation["state_key"] == render_state_key(info["state_key"])
            rng = np.random.default_rng(0)
            for step in range(2):
                action = pick_action(info, rng, step)
                obs, reward, terminated, truncated, info = local.step(action)
                result = remote.step({"text": action})
                o = result.observation
                assert (o["text"], o["action_valid"], o["won"]) == (
                    obs,
                    info["action_valid"],
                    info["won"],
                )
                assert result.reward == pytest.approx(float(reward))
                assert result.done == (terminated or truncated)
                assert o["state_key"] == render_state_key(info["state_key"])
                if result.done:
                    break
            state = remote.state()
            assert (state["env_id"], state["step_count"]) == (env_id, step + 1)


def test_mcp_tool_client_plays_through_the_act_tool():
    """OpenEnv's MCPToolClient sees one tool, ``act``, that plays the session's episode.

    The tool returns what the TRL adapter's ``act`` tool returns (observation, then the
    admissible actions or the end of the episode), and the episode is the one the client reset.
    """
    from agentgym.integrations.trl import AgentGymEnvironment

    env_id = "AgentGym/Corridor-v0"
    reference = AgentGymEnvironment(env_id)  # the TRL adapter, played locally
    with running_server(env_id, max_sessions=2) as (url, app):
        with MCPToolClient(base_url=url).sync() as env:
            tools = env.list_tools()
            assert [t.name for t in tools] == ["act"]
            assert "action" in tools[0].input_schema["properties"]
            assert "Take one action" in tools[0].description
            assert env.call_tool("act", action="forward") == "No episode is running."
            first = env.reset(seed=5)
            assert first.observation.text in reference.reset(seed=5)
            for action in ["forward", "xyzzy", "forward", "forward", "forward"]:
                text = env.call_tool("act", action=action)
                assert text == reference.act(action)
            state = env.state()
            assert state.step_count == 5
        wait_until_no_sessions(app)


def test_llm_mode_serves_prompts_and_parses_model_text():
    """With llm=..., the session is make_llm_env over the id: prompts out, raw model text in."""
    from agentgym.wrappers.llm import make_llm_env

    env_id = "AgentGym/Sokoban-v0"
    local = make_llm_env(gym.make(env_id), history_length=1)
    with running_server(env_id, llm={"history_length": 1}) as (url, _), client(url) as remote:
        obs, info = local.reset(seed=3)
        assert_same(remote.reset(seed=3), obs, info, None, False, False)
        assert "<action>" in obs  # a prompt, not the bare board
        for text in [
            "<think>go</think><action>up</action>",
            "no tags",
            "<think>b</think><action>left</action>",
        ]:
            obs, reward, terminated, truncated, info = local.step(text)
            result = remote.step(text)
            assert_same(result, obs, info, reward, terminated, truncated)
        assert result.observation.info["parsed_action"] == "left"


def test_lone_surrogate_in_model_text_is_answered_and_both_sides_agree():
    """``<think>\\ud800</think><action>down</action>`` (valid JSON, invalid UTF-8) is applied as
    the env would apply the same text with U+FFFD, and answered: the client's view and the
    server's episode stay the same, step after step."""
    from agentgym.wrappers.llm import make_llm_env

    env_id = "AgentGym/Sokoban-v0"
    local = make_llm_env(gym.make(env_id), history_length=1)
    texts = [
        "<think>\ud800</think><action>down</action>",
        "<think>ok \udfff\ud83d</think><action>left</action>",
        "<think>fine</think><action>up</action>",
    ]
    with running_server(env_id, llm={"history_length": 1}) as (url, _), client(url) as remote:
        obs, info = local.reset(seed=3)
        assert_same(remote.reset(seed=3), obs, info, None, False, False)
        thoughts = []
        for step, text in enumerate(texts, start=1):
            result = remote.step(text)  # was: "Error serializing to JSON", after the step
            thoughts.append(result.observation.info["think"])
            obs, reward, terminated, truncated, info = local.step(text_safe(text))
            assert_same(result, obs, info, reward, terminated, truncated)
            state = remote.state()
            assert state.step_count == step
            assert state.state_key == render_state_key(info["state_key"])
        assert thoughts[:2] == ["\ufffd", "ok \ufffd\ufffd"]  # as the env got them
    assert text_safe("a\ud800b\udfff") == "a\ufffdb\ufffd" and text_safe("é😀") == "é😀"
    assert json_safe({"k\ud800": ["\udc00"]}) == {"k\ufffd": ["\ufffd"]}


def test_reset_options_pick_the_task():
    """options travel to env.reset: the same task index gives the local env's task."""
    local = gym.make("AgentGym/Sokoban-v0")
    _, info = local.reset(seed=3, options={"task": 5})
    with running_server("AgentGym/Sokoban-v0") as (url, _), client(url) as remote:
        result = remote.reset(seed=3, options={"task": 5}, episode_id="episode-a")
        assert result.observation.task_id == info["task_id"]
        assert result.observation.state_key == render_state_key(info["state_key"])
        assert remote.state().episode_id == "episode-a"


def test_state_key_digest_is_equal_exactly_when_keys_are():
    keys = [
        (1, 2),
        [1, 2],
        (1, (2,)),
        ((1, 2),),
        b"a",
        "a",
        ("a", None),
        ("a", False),
        ("a", 0),
        frozenset({"x", "y"}),
        frozenset({"x"}),
        (),
        2**70,
        1.0,
        True,
    ]
    digests = [render_state_key(k) for k in keys]
    assert len(set(digests)) == len(keys)
    assert all(len(d) == 32 and int(d, 16) >= 0 for d in digests)
    # a set hashes the same whatever order it iterates in; numpy scalars as their Python value
    members = [f"fact-{i}" for i in range(50)]
    assert render_state_key(frozenset(members)) == render_state_key(frozenset(reversed(members)))
    assert render_state_key((np.int64(3), "s")) == render_state_key((3, "s"))
    # over a real rollout: digests collide exactly where the env's keys do
    env = gym.make("AgentGym/Sokoban-v0")
    rng = np.random.default_rng(0)
    _, info = env.reset(seed=1)
    seen: dict[Any, str] = {}
    for _ in range(200):
        _, _, term, trunc, info = env.step(["up", "down", "left", "right"][rng.integers(4)])
        digest = render_state_key(info["state_key"])
        assert seen.setdefault(info["state_key"], digest) == digest
        if term or trunc:
            _, info = env.reset()
    assert len(set(seen.values())) == len(seen) > 5


def test_json_safe_keeps_what_json_can_hold():
    value = {
        1: (1, 2.5, None),
        "s": {"b", "a"},
        "raw": b"caf\xc3\xa9\xff",
        "np": np.arange(3),
        "x": np.float32(0.5),
        "inf": float("inf"),
    }
    out = json_safe(value)
    assert json.loads(json.dumps(out, allow_nan=False)) == {
        "1": [1, 2.5, None],
        "s": ["a", "b"],
        "raw": "café\ufffd",
        "np": [0, 1, 2],
        "x": 0.5,
        "inf": None,
    }


# ---------------------------------------------------------------------------------------------
def test_two_sessions_are_isolated():
    """Interleaved steps of two connections never leak: each matches its own local env."""
    env_id = "AgentGym/Sokoban-v0"
    locals_ = [gym.make(env_id), gym.make(env_id)]
    with running_server(env_id, max_sessions=2) as (url, app), client(url) as a, client(url) as b:
        remotes = [a, b]
        infos = []
        for seed, local, remote in zip((0, 1), locals_, remotes, strict=True):
            obs, info = local.reset(seed=seed)
            assert_same(remote.reset(seed=seed), obs, info, None, False, False)
            infos.append(info)
        assert infos[0]["task_id"] != infos[1]["task_id"]
        assert app.state.openenv_server.active_sessions == 2
        rng = np.random.default_rng(0)
        for step in range(10):
            for i in rng.permutation(2):
                action = ["up", "down", "left", "right"][rng.integers(4)]
                obs, reward, term, trunc, infos[i] = locals_[i].step(action)
                assert_same(remotes[i].step(action), obs, infos[i], reward, term, trunc)
                if term or trunc:  # start that one over; the other must not notice
                    obs, infos[i] = locals_[i].reset(seed=10 + step)
                    assert_same(remotes[i].reset(seed=10 + step), obs, infos[i], None, False, False)
        # resetting one session leaves the other's episode where it was
        before = b.state()
        a.reset(seed=99)
        assert b.state() == before


def test_concurrent_sessions_each_match_a_sequential_replay():
    """Sessions stepping at the same time (one server thread each) equal sequential local runs.

    WebShop's sessions share the catalogue and its search index, so this is where a session
    leaking into another under real concurrency would show.
    """
    import asyncio

    env_id, n_sessions, n_steps = "AgentGym/WebShop-Synthetic-v0", 6, 8

    async def play(url: str, seed: int) -> list[tuple[str, Any]]:
        rng = np.random.default_rng(seed)
        async with AgentGymEnvClient(base_url=url, message_timeout_s=60) as env:
            result = await env.reset(seed=seed)
            record = [("", result)]
            for step in range(n_steps):
                obs = result.observation
                action = pick_action(
                    {"admissible_actions": obs.admissible_actions, **obs.info}, rng, step
                )
                result = await env.step(action)
                record.append((action, result))
                if result.done:
                    break
            return record

    async def play_all(url: str) -> list:
        return await asyncio.gather(*(play(url, seed) for seed in range(n_sessions)))

    with running_server(env_id, max_sessions=n_sessions) as (url, _):
        records = asyncio.run(play_all(url))
    local = gym.make(env_id)
    for seed, record in enumerate(records):
        obs, info = local.reset(seed=seed)
        assert_same(record[0][1], obs, info, None, False, False)
        for action, result in record[1:]:
            obs, reward, terminated, truncated, info = local.step(action)
            assert_same(result, obs, info, reward, terminated, truncated)


def test_example_rolls_out_groups_over_the_wire(capsys):
    """examples/openenv_client.py's rollout, against a server on loopback."""
    import asyncio
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "openenv_client.py"
    spec = importlib.util.spec_from_file_location("openenv_client_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with running_server("AgentGym/Sokoban-v0", max_sessions=4) as (url, app):
        asyncio.run(example.rollout(url, groups=2, group_size=2, seed=0))
        wait_until_no_sessions(app)  # every session was closed (the server frees them just after)
        out = capsys.readouterr().out
        assert "4 episodes in 2 groups" in out and "steps/s over the wire" in out
        asyncio.run(example.rollout(url, groups=1, group_size=2, seed=0, tools=True))
        wait_until_no_sessions(app)
        out = capsys.readouterr().out
        assert "2 episodes in 1 groups" in out and "steps/s over the wire" in out


def test_session_bound_refuses_with_a_clear_error_not_a_hang():
    with running_server("AgentGym/Corridor-v0", max_sessions=2) as (url, app):
        server = app.state.openenv_server
        with client(url) as a, client(url) as b:
            a.reset(seed=0)
            b.reset(seed=1)
            for _ in range(3):  # refused every time, at once
                t0 = time.monotonic()
                with pytest.raises(
                    RuntimeError, match="capacity.*--max-sessions.*CAPACITY_REACHED"
                ):
                    with client(url) as c:
                        c.reset(seed=2)
                assert time.monotonic() - t0 < 5
            assert server.active_sessions == 2
            # the sessions inside the bound keep serving
            assert a.step("forward").observation.task_id == a.state().task_id
        # once they close, the slots free up
        deadline = time.monotonic() + 10
        while server.active_sessions and time.monotonic() < deadline:
            time.sleep(0.02)
        with client(url) as c:
            assert c.reset(seed=2).observation.task_id


def test_idle_session_times_out_and_says_so():
    with running_server("AgentGym/Corridor-v0", max_sessions=1, session_timeout=0.3) as (
        url,
        app,
    ):
        server = app.state.openenv_server
        with client(url) as busy:  # activity keeps a session alive past its timeout
            busy.reset(seed=0)
            for _ in range(8):  # 0.8 s in all, each gap well inside the timeout
                time.sleep(0.1)
                busy.step("wait")  # an unusable action is still activity
            assert busy.step("wait").observation.text
        deadline = time.monotonic() + 10
        while server.active_sessions and time.monotonic() < deadline:
            time.sleep(0.02)
        with client(url) as idle:
            idle.reset(seed=0)
            time.sleep(1.0)  # > timeout + reaper interval
            assert server.active_sessions == 0  # the slot is free again
            # OpenEnv's client reconnects after the server's close, to a fresh session that has
            # no episode yet: the step is refused, never applied to a stale episode
            with pytest.raises(RuntimeError, match="send reset first"):
                idle.step("wait")
            assert idle.reset(seed=0).observation.text
        with ws_connect(url.replace("http", "ws") + "/ws", open_timeout=10) as raw:
            raw.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
            assert json.loads(raw.recv(timeout=10))["type"] == "observation"
            # without sending anything: first the reason as an error message, then the close
            answer = json.loads(raw.recv(timeout=10))
            assert answer["data"]["code"] == "SESSION_ERROR"
            assert "session closed after 0.3 s" in answer["data"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                raw.recv(timeout=10)
            assert closed.value.rcvd.code == 1000
            assert "session closed after 0.3 s" in closed.value.rcvd.reason
        wait_until_no_sessions(app)  # freed just after the close handshake
        with client(url) as fresh:  # and a new session takes the freed slot
            assert fresh.reset(seed=0).observation.text


# ---------------------------------------------------------------------------------------------
def test_malformed_websocket_messages_get_errors_and_the_session_keeps_serving():
    local = gym.make("AgentGym/Sokoban-v0")
    with running_server("AgentGym/Sokoban-v0") as (url, _):
        with ws_connect(url.replace("http", "ws") + "/ws", open_timeout=10) as ws:

            def ask(frame: str | bytes) -> dict:
                ws.send(frame)
                return json.loads(ws.recv(timeout=10))

            cases = {
                "not json {": ("INVALID_JSON", "Invalid JSON"),
                "[1, 2]": ("INVALID_JSON", "got a JSON array"),
                "3": ("INVALID_JSON", "got a JSON number"),
                "null": ("INVALID_JSON", "got a JSON null"),
                b"\x00\xff": ("INVALID_JSON", "binary frames"),
                '{"type": "fly"}': ("UNKNOWN_TYPE", "fly"),
                '{"type": "step"}': ("VALIDATION_ERROR", ""),
                '{"type": "step", "data": "up"}': ("VALIDATION_ERROR", ""),
                '{"type": "step", "data": {"text": 5}}': ("VALIDATION_ERROR", ""),
                '{"type": "step", "data": {"txt": "up"}}': ("VALIDATION_ERROR", ""),
                '{"type": "step", "data": {"text": "up"}}': ("EXECUTION_ERROR", "send reset"),
                '{"type": "reset", "data": [1]}': ("VALIDATION_ERROR", ""),
                '{"type": "reset", "data": {"seed": "x"}}': ("EXECUTION_ERROR", "seed"),
                '{"type": "reset", "data": {"seed": -1}}': ("EXECUTION_ERROR", "seed"),
                '{"type": "reset", "data": {"sed": 1}}': ("EXECUTION_ERROR", "sed"),
                '{"type": "reset", "data": {"options": {"spilt": "x"}}}': (
                    "EXECUTION_ERROR",
                    "no reset option spilt",
                ),
            }
            for frame, (code, words) in cases.items():
                answer = ask(frame)
                assert answer["type"] == "error", frame
                assert answer["data"]["code"] == code, (frame, answer)
                assert words in answer["data"]["message"], (frame, answer)
            # the same session still plays, exactly as the local env
            obs, info = local.reset(seed=4)
            answer = ask(json.dumps({"type": "reset", "data": {"seed": 4}}))
            assert answer["data"]["observation"]["text"] == obs
            obs, reward, *_ = local.step("left")
            answer = ask(json.dumps({"type": "step", "data": {"text": "left"}}))
            assert answer["type"] == "observation", answer
            assert answer["data"]["observation"]["text"] == obs
            assert answer["data"]["reward"] == pytest.approx(reward)
            assert ask('{"type": "state"}')["data"]["step_count"] == 1
        # OpenEnv's generic client over the same server: errors surface as RuntimeError
        with GenericEnvClient(base_url=url).sync() as generic:
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                generic.step({"text": ["up"]})
            assert generic.reset(seed=4).observation["text"] == local.reset(seed=4)[0]


def test_deeply_nested_frames_get_an_error_and_the_session_keeps_serving():
    """A frame nested far deeper than any message needs is answered with an error; the session,
    its episode and the connection survive (they used to end with SESSION_ERROR)."""
    local = gym.make("AgentGym/Sokoban-v0")
    deep = 500

    def nested(leaf: str) -> str:
        return "[" * deep + leaf + "]" * deep

    frames = [
        '{"type": "step", "data": {"text": ' + nested('"up"') + "}}",
        '{"type": "reset", "data": {"options": ' + nested("1") + "}}",
        '{"type": "step", "data": ' + '{"a": ' * deep + "1" + "}" * deep + "}",
        nested("0"),
        "[" * 100_000 + "]" * 100_000,  # past Python's recursion limit in json.loads
    ]
    with running_server("AgentGym/Sokoban-v0") as (url, _):
        with ws_connect(url.replace("http", "ws") + "/ws", open_timeout=10) as ws:

            def ask(frame: str) -> dict:
                ws.send(frame)
                return json.loads(ws.recv(timeout=30))

            obs, info = local.reset(seed=4)
            assert ask(json.dumps({"type": "reset", "data": {"seed": 4}}))["type"] == "observation"
            for frame in frames:
                answer = ask(frame)
                assert answer["type"] == "error", answer
                assert answer["data"]["code"] == "INVALID_JSON", answer
                assert f"nested deeper than {MAX_FRAME_DEPTH}" in answer["data"]["message"]
            # the episode is where it was: the next step continues it
            obs, reward, *_ = local.step("left")
            answer = ask(json.dumps({"type": "step", "data": {"text": "left"}}))
            assert answer["type"] == "observation", answer
            assert answer["data"]["observation"]["text"] == obs
            assert ask('{"type": "state"}')["data"]["step_count"] == 1


@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager")
def test_clients_hanging_up_mid_step_log_no_tracebacks():
    """A client that hangs up after sending a step is normal: no warning, no traceback."""
    import logging
    import socket

    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(level=logging.DEBUG)
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "agentgym.integrations")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        with running_server("AgentGym/Sokoban-v0", max_sessions=4) as (url, app):
            for i in range(20):
                ws = ws_connect(url.replace("http", "ws") + "/ws", open_timeout=10)
                ws.send(json.dumps({"type": "reset", "data": {"seed": i}}))
                ws.recv(timeout=10)
                ws.send(json.dumps({"type": "step", "data": {"text": "up"}}))
                if i % 2:  # half of them without even a TCP goodbye
                    ws.socket.shutdown(socket.SHUT_RDWR)
                ws.socket.close()  # no close frame: the client just goes away
            wait_until_no_sessions(app)  # every hung-up session is freed
            with client(url) as c:  # and the server still serves
                assert c.reset(seed=0).observation.text
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
    # uvicorn's own "connection open/closed" info lines are every connection's, not errors
    loud = [r for r in records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [(r.name, r.getMessage()[:200]) for r in loud]
    # one debug line per connection at most, whichever of the server's sends and receives
    # notices the hang-up first (a send and then OpenEnv's handler both used to log it). The
    # lines name the connection: no connection twice. The last, well-behaved client's own
    # close can race its last answer and be noticed too, so 21 connections may each have one.
    ours = [r for r in records if r.name.startswith("agentgym")]
    peers = [getattr(r, "peer", None) for r in ours]
    assert None not in peers and len(set(peers)) == len(peers), peers
    assert len(ours) <= 21 and all(r.levelno == logging.DEBUG for r in ours)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_frames = st.one_of(
    _json_values.map(json.dumps),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["reset", "step", "state", "mcp", "bogus"]), "data": _json_values}
    ).map(json.dumps),
    st.fixed_dictionaries(
        {"type": st.just("step"), "data": st.fixed_dictionaries({"text": st.text(max_size=30)})}
    ).map(json.dumps),
    st.text(max_size=30),
    st.binary(max_size=30),
)


def test_any_frame_gets_exactly_one_answer_and_the_session_survives():
    """Fuzz: whatever a client sends (except close), one answer comes back; the session lives."""
    from hypothesis import HealthCheck, given, settings

    with running_server("AgentGym/Sokoban-v0") as (url, _):
        with ws_connect(url.replace("http", "ws") + "/ws", open_timeout=10) as ws:

            @settings(
                max_examples=150,
                deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture],
            )
            @given(frame=_frames)
            def one_frame(frame: str | bytes) -> None:
                ws.send(frame)
                answer = json.loads(ws.recv(timeout=10))
                assert answer["type"] in {"observation", "state", "error", "mcp"}, answer

            one_frame()
            ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
            answer = json.loads(ws.recv(timeout=10))
            assert (
                answer["data"]["observation"]["text"]
                == gym.make("AgentGym/Sokoban-v0").reset(seed=0)[0]
            )


def test_http_endpoints_answer_bad_requests_with_4xx():
    with running_server("AgentGym/Sokoban-v0") as (url, _):
        http = httpx.Client(base_url=url, timeout=30)
        as_json = {"content-type": "application/json"}
        local_obs, _ = gym.make("AgentGym/Sokoban-v0").reset(seed=2)
        ok = http.post("/reset", json={"seed": 2})
        assert ok.status_code == 200 and ok.json()["observation"]["text"] == local_obs
        step = http.post("/step", json={"action": {"text": "up"}})
        assert step.status_code == 409 and "/ws" in step.json()["detail"]
        bad = [
            http.post("/reset", content=b"not json", headers={"content-type": "application/json"}),
            http.post("/reset", json={"seed": -1}),
            http.post("/reset", json={"seed": "x"}),
            http.post("/reset", json={"seed": 0, "options": {"bogus": 1}}),
            http.post("/reset", json={"seed": 0, "sed": 1}),
            http.post("/step", json={"action": {"text": 3}}),
            http.post("/step", json={"act": "up"}),
            http.post("/step", content=b"\xff"),
            # a lone surrogate (valid JSON, not UTF-8) that the error echoes: was a 500
            http.post("/reset", content=b'{"options": {"\\ud800": 1}}', headers=as_json),
            http.post("/reset", content=b'{"seed": 0, "\\udfff": 1}', headers=as_json),
        ]
        assert [r.status_code for r in bad] == [422] * len(bad), [r.text for r in bad]
        assert "bogus" in bad[3].text and "sed" in bad[4].text
        # the surrogate arrives as U+FFFD, and the env names an unknown option in printable form
        assert "no reset option \\ufffd" in bad[-2].json()["detail"]
        tool = http.post(  # the same over MCP: OpenEnv's error names the tool asked for
            "/mcp",
            content=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", '
            b'"params": {"name": "a\\ud800ct", "arguments": {}}}',
            headers=as_json,
        )
        assert tool.status_code == 200 and "Tool not found: a\ufffdct" in tool.text
        assert http.get("/health").json()["status"] == "healthy"
        assert http.get("/metadata").json()["name"] == "AgentGym/Sokoban-v0"
        schema = http.get("/schema").json()
        assert "text" in schema["action"]["properties"]
        assert "state_key" in schema["observation"]["properties"]


# ---------------------------------------------------------------------------------------------
def _many_keys(n: int) -> str:
    """A step message carrying ``n`` extra keys: valid JSON, cheap to send, costly to echo."""
    extra = ", ".join(f'"k{i}": 0' for i in range(n))
    return '{"type": "step", "data": {"text": "up"}, ' + extra + "}"


def test_an_oversized_or_overfull_frame_is_refused_briefly_and_blocks_no_one():
    """A frame past MAX_MESSAGE_BYTES is refused unparsed, one past MAX_FRAME_VALUES after a
    parse off the event loop; each answer is short (no echo), and meanwhile other sessions,
    new handshakes and /health are served at once. (Such a frame used to hold the event loop
    for seconds to minutes and be answered with every key echoed back.)"""
    huge = _many_keys(300_000)  # ~3.4 MB
    full = _many_keys(MAX_FRAME_VALUES + 10)  # ~140 KB: under the byte bound, over the values'
    assert len(huge) > MAX_MESSAGE_BYTES > len(full)
    with running_server("AgentGym/Sokoban-v0") as (url, _):
        ws_url = url.replace("http", "ws") + "/ws"
        http = httpx.Client(base_url=url, timeout=30)
        with ws_connect(ws_url, open_timeout=10) as other, ws_connect(ws_url) as bad:
            other.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
            assert json.loads(other.recv(timeout=10))["type"] == "observation"
            bad.send(json.dumps({"type": "reset", "data": {"seed": 2}}))
            bad.recv(timeout=10)
            cases = [
                (huge, "longer than the server's limit"),  # refused by its length
                (_many_keys(3 * MAX_FRAME_VALUES), "JSON values"),  # by its quotes, unparsed
                (full, "JSON values"),  # parsed (in a worker thread), then counted
            ]
            for frame, words in cases:
                t0 = time.monotonic()
                bad.send(frame)
                # while the server takes the frame in: others are served at once
                other.send(json.dumps({"type": "step", "data": {"text": "up"}}))
                assert json.loads(other.recv(timeout=10))["type"] == "observation"
                assert http.get("/health").status_code == 200
                with ws_connect(ws_url, open_timeout=10) as newcomer:
                    newcomer.send(json.dumps({"type": "state"}))
                    assert json.loads(newcomer.recv(timeout=10))["type"] == "state"
                raw = bad.recv(timeout=10)
                # (unchecked, such a frame held the event loop for tens of seconds)
                assert time.monotonic() - t0 < 10
                assert len(raw) < 600, raw[:600]  # the reason, not the frame
                answer = json.loads(raw)
                assert answer["type"] == "error" and words in answer["data"]["message"], answer
            # the refused session still plays
            bad.send(json.dumps({"type": "step", "data": {"text": "left"}}))
            assert json.loads(bad.recv(timeout=10))["type"] == "observation"


def test_errors_never_echo_a_long_input():
    """Unknown keys, wrong types and long values are named short in errors, whatever their size."""
    long = "x" * 200_000
    frames = [
        json.dumps({"type": "step", "data": {"text": "up", long: 1}}),
        json.dumps({"type": "step", "data": {"text": [long]}}),
        json.dumps({"type": "reset", "data": {"seed": 0, "options": {"split": long}}}),
        json.dumps({"type": "reset", "data": {long: 1}}),
        json.dumps({"type": long}),
        json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "method": [long]}}),
        _many_keys(2_000),
    ]
    with running_server("AgentGym/Sokoban-v0") as (url, _):
        with ws_connect(url.replace("http", "ws") + "/ws", open_timeout=10) as ws:
            for frame in frames:
                ws.send(frame)
                raw = ws.recv(timeout=10)
                assert len(raw) < 1000, raw[:300]
                assert json.loads(raw)["type"] in {"error", "mcp"}
        http = httpx.Client(base_url=url, timeout=30)
        answer = http.post("/reset", json={"seed": 0, "options": {"split": long}})
        assert answer.status_code == 422 and len(answer.text) < 1000, answer.text[:300]
        answer = http.post("/reset", json={"seed": long})
        assert answer.status_code == 422 and len(answer.text) < 1000, answer.text[:300]
        request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        for bad in ({**request, **{f"k{i}": 0 for i in range(5000)}}, {**request, "id": [long]}):
            answer = http.post("/mcp", json=bad)
            assert answer.status_code == 422 and len(answer.text) < 1000, answer.text[:300]
            assert answer.json()["error"]["code"] == -32600


def test_a_number_too_long_to_read_is_an_error_and_the_session_keeps_serving():
    digits = "1" * 5000  # past Python's 4300-digit limit on int conversion
    with running_server("AgentGym/Sokoban-v0") as (url, _):
        with ws_connect(url.replace("http", "ws") + "/ws", open_timeout=10) as ws:
            ws.send('{"type": "reset", "data": {"seed": ' + digits + "}}")
            answer = json.loads(ws.recv(timeout=10))
            assert answer["type"] == "error" and "digits" in answer["data"]["message"], answer
            ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        with ws_connect(url.replace("http", "ws") + "/mcp", open_timeout=10) as ws:
            ws.send('{"jsonrpc": "2.0", "method": "tools/list", "id": ' + digits + "}")
            assert "digits" in json.loads(ws.recv(timeout=10))["error"]["message"]
            ws.send(json.dumps({"jsonrpc": "2.0", "method": "tools/list", "id": 1}))
            assert json.loads(ws.recv(timeout=10))["result"]["tools"][0]["name"] == "act"


def test_a_burst_of_connects_past_the_bound_all_read_the_reason():
    """200 clients connecting at once to a 2-session server: 2 play, and every other one reads
    the capacity error before its connection closes (not a bare close)."""
    import asyncio

    from websockets.asyncio.client import connect as ws_async_connect

    async def burst(ws_url: str, n: int) -> list[str]:
        done = asyncio.Event()

        async def one() -> str:
            try:
                async with ws_async_connect(ws_url, open_timeout=30) as ws:
                    await ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
                    answer = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    if answer["type"] == "observation":
                        await done.wait()  # hold the slot until every client has its answer
                        return "played"
                    return f"{answer['data']['code']}: {answer['data']['message']}"
            except ConnectionClosed as exc:
                return f"closed: {exc}"

        tasks = [asyncio.ensure_future(one()) for _ in range(n)]
        while sum(t.done() for t in tasks) < n - 2 and not all(t.done() for t in tasks):
            await asyncio.sleep(0.05)
        done.set()
        return await asyncio.wait_for(asyncio.gather(*tasks), 120)

    with running_server("AgentGym/Corridor-v0", max_sessions=2) as (url, app):
        t0 = time.monotonic()
        outcomes = asyncio.run(burst(url.replace("http", "ws") + "/ws", 200))
        assert time.monotonic() - t0 < 90
        assert outcomes.count("played") == 2, sorted(set(outcomes))
        refused = [o for o in outcomes if o != "played"]
        bare = [o for o in refused if not o.startswith("CAPACITY_REACHED")]
        assert not bare, (len(bare), sorted(set(bare))[:3])
        assert all("--max-sessions" in o for o in refused)
        wait_until_no_sessions(app)


def test_http_bodies_past_the_limit_get_413_before_they_are_read():
    big = (
        b'{"jsonrpc": "2.0", "method": "tools/list", "params": {"pad": "'
        + b"x" * (4 * MAX_MESSAGE_BYTES)
        + b'"}}'
    )

    def chunks() -> Iterator[bytes]:  # no content-length: the server counts as it reads
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    with running_server("AgentGym/Sokoban-v0") as (url, _):
        as_json = {"content-type": "application/json"}
        for path in ("/mcp", "/reset"):
            with httpx.Client(base_url=url, timeout=30) as http:
                declared = http.post(path, content=big, headers=as_json)
            assert declared.status_code == 413, (path, declared.text[:200])
            assert "limit" in declared.json()["detail"]
            with httpx.Client(base_url=url, timeout=30) as http:
                streamed = http.post(path, content=chunks(), headers=as_json)
            assert streamed.status_code == 413, (path, streamed.text[:200])
        with httpx.Client(base_url=url, timeout=30) as http:  # and the server still serves
            assert http.post("/reset", json={"seed": 0}).status_code == 200


@pytest.mark.parametrize("session_id", [[1, 2], {"a": 1}, 3])
def test_mcp_session_id_of_the_wrong_type_is_a_4xx(session_id):
    with running_server("AgentGym/Corridor-v0") as (url, _):
        http = httpx.Client(base_url=url, timeout=30)
        for method in ("openenv/session/close", "tools/list"):
            answer = http.post(
                "/mcp",
                json={
                    "jsonrpc": "2.0",
                    "id": 7,
                    "method": method,
                    "params": {"session_id": session_id},
                },
            )
            assert 400 <= answer.status_code < 500, answer.text[:300]
            assert "session_id" in answer.json()["error"]["message"]
            assert "Traceback" not in answer.text
        assert http.get("/health").status_code == 200


def test_unknown_session_ids_are_errors():
    """OpenEnv's session methods (JSON-RPC over /mcp) answer an unknown id with an error."""
    with running_server("AgentGym/Corridor-v0") as (url, _):
        http = httpx.Client(base_url=url, timeout=30)
        answer = http.post(
            "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "openenv/session/close",
                "params": {"session_id": "no-such-session"},
            },
        ).json()
        assert "Unknown session_id: no-such-session" in answer["error"]["message"]
        assert http.post("/mcp", content=b"{oops").json()["error"]["code"] == -32700
        with ws_connect(url.replace("http", "ws") + "/mcp", open_timeout=10) as ws:
            ws.send("[1]")  # a frame OpenEnv's JSON-RPC loop would die on
            assert json.loads(ws.recv(timeout=10))["error"]["code"] == -32600
        with client(url) as c:  # and the server still serves sessions
            assert c.reset(seed=0).observation.text


# ---------------------------------------------------------------------------------------------
def test_cli_serves_a_real_process_and_stops_on_ctrl_c():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "agentgym.integrations.openenv_cli", "Corridor-v0"]
    cmd += ["--port", str(port), "--max-sessions", "1", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        # the first thing it says, before the slow imports, is what it is loading
        first = proc.stderr.readline()
        assert "starting AgentGym/Corridor-v0: loading OpenEnv's server" in first, first
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.1)
        local = gym.make("AgentGym/Corridor-v0")
        with client(url) as remote:
            obs, info = local.reset(seed=5)
            assert_same(remote.reset(seed=5), obs, info, None, False, False)
            action = info["admissible_actions"][0]
            assert_same(remote.step(action), *_reorder(local.step(action)))
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"), client(url) as extra:
                extra.reset()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "loading AgentGym/Corridor-v0 (building" in err
    assert "AgentGym/Corridor-v0 over OpenEnv at ws://127.0.0.1" in err
    assert "warning" not in err  # loopback: nothing to warn about


def test_a_non_loopback_bind_is_warned_about_in_one_line():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.0.2.1", "example.org"))
    assert bind_warning("127.0.0.1", 8000) is None
    warning = bind_warning("0.0.0.0", 8000)
    assert warning.count("\n") == 0 and "no authentication" in warning
    assert "0.0.0.0:8000" in warning and "127.0.0.1" in warning
    # the CLI warns before it binds: 192.0.2.1 (TEST-NET-1) is no address of this machine, so
    # the bind fails and nothing is ever exposed
    cmd = [sys.executable, "-m", "agentgym.integrations.openenv_cli", "Corridor-v0"]
    cmd += ["--host", "192.0.2.1", "--port", "8000", "--log-level", "critical"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if "warning" in line]
    assert len(lines) == 1 and "192.0.2.1:8000 with no authentication" in lines[0], out.stderr


def _reorder(step: tuple) -> tuple:
    obs, reward, terminated, truncated, info = step
    return obs, info, reward, terminated, truncated


def test_cli_errors_are_one_line(capsys):
    from agentgym.integrations.openenv_cli import main

    assert main(["Nope-v0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown env id 'Nope-v0'" in err
    assert main(["Corridor-v0", "--env-kwargs", '{"no_such_kwarg": 1}']) == 2
    assert "no_such_kwarg" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["Corridor-v0", "--session-timeout", "-1"])
    assert "--session-timeout" in capsys.readouterr().err


def test_cli_defaults_match_the_server_defaults():
    import argparse

    from agentgym.integrations.openenv_cli import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "Corridor-v0"])
    assert (args.max_sessions, args.session_timeout) == (
        DEFAULT_MAX_SESSIONS,
        DEFAULT_SESSION_TIMEOUT_S,
    )
    assert args.host == "127.0.0.1"


def test_import_agentgym_never_imports_openenv_and_the_guard_names_the_extra():
    code = (
        "import sys, agentgym, agentgym.integrations\n"
        "assert 'openenv' not in sys.modules\n"
        "sys.modules['openenv'] = None  # as if openenv-core were not installed\n"
        "for name in ('openenv', 'openenv_server'):\n"
        "    try:\n"
        "        __import__('agentgym.integrations.' + name)\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert len(out) == 2
    assert all('pip install "agentgym-envs[openenv]"' in line for line in out), out


def test_openenv_core_shadowing_openenv_is_named_in_the_error(tmp_path):
    """openenv-core (an older OpenEnv) installs the same ``openenv`` module; where it is the one
    installed, the error names it and how to replace it, not just "install openenv"."""
    site = tmp_path / "site"
    (site / "openenv").mkdir(parents=True)
    (site / "openenv" / "__init__.py").write_text("")  # no openenv.core.env_server...
    info = site / "openenv_core-0.3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: openenv-core\nVersion: 0.3.0\n")
    code = (
        "for name in ('openenv', 'openenv_server'):\n"
        "    try:\n"
        "        __import__('agentgym.integrations.' + name)\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(agentgym.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), root]))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    lines = out.stdout.splitlines()
    assert len(lines) == 2, (out.stdout, out.stderr[-2000:])
    assert all("openenv-core 0.3.0" in line for line in lines), lines
    assert all("pip uninstall -y openenv-core" in line for line in lines), lines
