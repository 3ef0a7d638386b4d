"""Serve agentgym envs over OpenEnv's protocol, and talk to them with OpenEnv's client.

`OpenEnv <https://github.com/huggingface/OpenEnv>`_ (the ``openenv`` package, >= 0.10) is the env
protocol that TRL, torchforge, ART, Unsloth and NeMo Gym speak: a server exposes ``reset`` /
``step`` / ``state`` over a WebSocket (``/ws``, one env per connection) and HTTP, MCP tools over
``/mcp``, and a client subclass of ``openenv.core.EnvClient`` drives it. This module holds the
agentgym side of that protocol, built on OpenEnv's public API only:

- :class:`AgentGymAction`: ``{"text": "<the action>"}``, the text the env receives.
- :class:`AgentGymObservation`: the observation text, ``reward``, ``done`` (= terminated or
  truncated, OpenEnv's single flag), both gymnasium flags, and the contract's info keys made
  JSON-safe (``state_key`` as a digest string, ``task_id``, ``admissible_actions``,
  ``action_valid``, ``won``, ``score``) plus the family's other keys in ``info``.
- :class:`ServedEnvironment`: an OpenEnv ``Environment`` around one agentgym env; the server
  (:mod:`agentgym.integrations.openenv_server`, ``agentgym serve ID``) builds one per session.
  For tool-calling agents it also exposes the env's action as one MCP tool, ``act(action)``,
  as the TRL ``environment_factory`` adapter does (:mod:`agentgym.integrations.trl`).
- :class:`AgentGymEnvClient`: OpenEnv's ``EnvClient`` typed for these messages.

Text crossing the wire is made valid Unicode first (:func:`text_safe`: a lone surrogate, which
JSON can carry but UTF-8 cannot, becomes U+FFFD), both in the action before the env sees it and
in everything sent back, so a step that was applied is always answered.

Importing this module needs ``openenv``; without it the import raises one line naming the
extra (``pip install "agentgym-envs[openenv]"``). ``import agentgym`` never imports it.

Example (a server started with ``agentgym serve AgentGym/Sokoban-v0 --port 8000``)::

    from agentgym.integrations.openenv import AgentGymEnvClient

    with AgentGymEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=0)
        result = env.step("up")  # or AgentGymAction(text="up")
        result.observation.text, result.reward, result.done, result.observation.state_key
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import struct
import threading
import uuid
from collections.abc import Hashable
from typing import Any

import gymnasium as gym

from agentgym.core import INFO_KEYS, ResetOptionError, describe_action

#: OpenEnv's gradio web UI: imported by ``openenv.core``'s ``__init__`` whatever is asked of it
_WEB_UI = "openenv.core.env_server.web_interface"
_WEB_UI_NAMES = ("create_web_interface_app", "WebInterfaceManager")


def _import_openenv_core_without_gradio() -> None:
    """Import ``openenv.core`` without its web UI, which imports gradio (most of the 17-23 s
    the import takes, and nothing a client or our server uses).

    ``openenv.core.env_server`` imports the UI in a ``try`` that expects ModuleNotFoundError
    when gradio is absent; the UI is held out of ``sys.modules`` for that one import, so the
    package loads as it does without gradio. Then the sentinel is removed, and the two names the
    package re-exports from the UI are served on first access by importing it then (OpenEnv's
    own ``create_app`` imports the UI module itself when asked for it). Nothing is done when
    ``openenv.core`` is already imported.
    """
    import sys

    if "openenv.core" in sys.modules or _WEB_UI in sys.modules:
        return
    sys.modules[_WEB_UI] = None  # type: ignore[assignment] - "import halted": ModuleNotFoundError
    try:
        import openenv.core  # noqa: F401
    except ImportError:
        return  # the import below says what is missing
    finally:
        if sys.modules.get(_WEB_UI, 0) is None:
            del sys.modules[_WEB_UI]
    for name in ("openenv.core.env_server", "openenv.core"):
        _serve_web_ui_lazily(sys.modules[name])


def _serve_web_ui_lazily(module: Any) -> None:
    """Replace ``module``'s None stand-ins for the web UI's names by an import on first access
    (PEP 562: a module's ``__getattr__`` is called for names it does not hold)."""
    import importlib

    names = [n for n in _WEB_UI_NAMES if n in vars(module) and getattr(module, n) is None]
    if not names:
        return
    for name in names:
        delattr(module, name)
    fallback = vars(module).get("__getattr__")

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's name
        if name in names:
            value = getattr(importlib.import_module(_WEB_UI), name)
            setattr(module, name, value)
            return value
        if fallback is not None:
            return fallback(name)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    module.__getattr__ = __getattr__


_import_openenv_core_without_gradio()

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
except ImportError as exc:  # one line naming the extra, not a traceback into openenv
    from agentgym.integrations._openenv_missing import missing_openenv

    raise missing_openenv("agentgym.integrations.openenv", exc) from exc

# openenv brings pydantic: imported after it, so that its absence is the one-line error above
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError  # noqa: E402

__all__ = [
    "AgentGymAction",
    "AgentGymObservation",
    "AgentGymState",
    "AgentGymEnvClient",
    "ServedEnvironment",
    "SessionError",
    "render_state_key",
    "json_safe",
    "text_safe",
    "describe",
]


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------
class AgentGymAction(Action):
    """One text action, exactly what ``env.step`` receives (``{"text": "up"}`` on the wire)."""

    text: str = Field(description="the action text, e.g. 'up' or 'open drawer 1'")


class AgentGymObservation(Observation):
    """What one ``reset`` or ``step`` returns.

    ``done`` is ``terminated or truncated`` (OpenEnv has one flag); both gymnasium flags are
    kept so a trainer can bootstrap truncated episodes. ``reward`` is None after a reset.
    ``state_key`` is :func:`render_state_key` of the env's ``info["state_key"]``: equal strings
    exactly when the env's keys are equal, so GiGPO-style grouping by state works remotely.
    ``info`` holds the family's other info keys (``goal``, ``boxes_on_target``...), JSON-safe.
    """

    text: str = Field(default="", description="the observation text")
    terminated: bool = Field(default=False, description="the task ended (won or lost for good)")
    truncated: bool = Field(default=False, description="the step cap ended the episode")
    state_key: str = Field(default="", description="digest of the canonical state")
    task_id: str = Field(default="", description="stable id of the task")
    admissible_actions: list[str] | None = Field(
        default=None, description="valid actions now, or null where the family cannot list them"
    )
    action_valid: bool = Field(default=True, description="the last action was usable")
    won: bool = Field(default=False, description="the task is solved")
    score: float = Field(default=0.0, description="the family's native task score")
    info: dict[str, Any] = Field(default_factory=dict, description="the family's other info")


class AgentGymState(State):
    """``state`` of a session: OpenEnv's ``episode_id`` / ``step_count`` plus the env's identity."""

    env_id: str = Field(default="", description="the agentgym id served")
    task_id: str | None = Field(default=None, description="task of the current episode")
    state_key: str | None = Field(default=None, description="digest of the canonical state")
    done: bool = Field(default=False, description="the current episode has ended")
    episode_return: float = Field(default=0.0, description="sum of the episode's rewards so far")
    won: bool = Field(default=False, description="the current episode's task is solved")


class _ResetParams(BaseModel):
    """The ``reset`` parameters a session accepts; anything else is a validation error."""

    model_config = ConfigDict(extra="forbid")

    seed: StrictInt | None = Field(default=None, ge=0)
    episode_id: str | None = Field(default=None, max_length=255)
    options: dict[str, Any] | None = None


class SessionError(RuntimeError):
    """A session cannot do what was asked (no episode yet, or it was closed); the message says why.

    The WebSocket protocol answers it as an error message (the connection stays usable where
    the session still exists); the HTTP endpoints answer it with 409.
    """


# ---------------------------------------------------------------------------------------------
# JSON-safe rendering
# ---------------------------------------------------------------------------------------------
def render_state_key(key: Hashable) -> str:
    """A 32-hex-digit digest of ``key``: equal for equal keys, different for different ones.

    The digest hashes a type-tagged, length-prefixed encoding, so keys that differ only in type
    (``(1, 2)`` vs ``[1, 2]``, ``b"a"`` vs ``"a"``) differ; a frozenset hashes its members in
    sorted digest order, so its iteration order never matters. 128 bits make an accidental
    collision negligible for any number of states a run visits. Cost is linear in the key size
    (an ALFWorld fact set of a few KB hashes in microseconds).
    """
    h = hashlib.blake2b(digest_size=16)
    _feed(h, key)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, bool):  # before int: True is an int
        h.update(b"T" if value else b"F")
    elif isinstance(value, int):
        text = str(value).encode()
        h.update(b"i" + len(text).to_bytes(4, "little") + text)
    elif isinstance(value, (bytes, bytearray)):
        h.update(b"b" + len(value).to_bytes(8, "little") + bytes(value))
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        h.update(b"s" + len(raw).to_bytes(8, "little") + raw)
    elif value is None:
        h.update(b"n")
    elif isinstance(value, float):
        h.update(b"f" + struct.pack("<d", value))
    elif isinstance(value, (tuple, list)):
        h.update((b"t" if isinstance(value, tuple) else b"l") + len(value).to_bytes(8, "little"))
        for item in value:
            _feed(h, item)
    elif isinstance(value, (frozenset, set)):
        members = sorted(render_state_key(item).encode() for item in value)
        h.update(b"S" + len(members).to_bytes(8, "little") + b"".join(members))
    elif callable(getattr(value, "item", None)) and getattr(value, "shape", None) == ():
        _feed(h, value.item())  # numpy scalars hash as the Python number they hold
    else:
        text = repr(value).encode("utf-8", "backslashreplace")
        h.update(b"r" + type(value).__qualname__.encode() + b":" + text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def text_safe(text: str) -> str:
    """``text`` with every lone surrogate (U+D800..U+DFFF) replaced by U+FFFD.

    JSON's ``"\\ud800"`` escape decodes to such a code point, which no UTF-8 encoder accepts;
    replacing it where text enters and leaves the server keeps every answer serialisable.
    Text without surrogates (the usual case) is returned as is after one ``encode`` check.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def json_safe(value: Any) -> Any:
    """``value`` with every part JSON can't hold turned into one it can.

    Tuples and sets become lists (sets sorted by their text, so the order is stable), dict keys
    strings, text valid Unicode (:func:`text_safe`), bytes UTF-8 text (undecodable bytes
    replaced), numpy scalars and arrays Python numbers and lists, non-finite floats None,
    anything else its ``str``.
    """
    if isinstance(value, str):
        return text_safe(value)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {text_safe(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v) for v in value), key=str)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        return json_safe(tolist())
    return text_safe(str(value))


def make_observation(
    obs: str,
    info: dict[str, Any],
    reward: float | None = None,
    terminated: bool = False,
    truncated: bool = False,
) -> AgentGymObservation:
    """Turn one gymnasium ``reset`` / ``step`` result into an :class:`AgentGymObservation`."""
    extra = {k: v for k, v in info.items() if k not in _CONTRACT_KEYS}
    admissible = info.get("admissible_actions")
    return AgentGymObservation(
        text=text_safe(obs),
        reward=None if reward is None else float(reward),
        done=bool(terminated or truncated),
        terminated=bool(terminated),
        truncated=bool(truncated),
        state_key=render_state_key(info["state_key"]),
        task_id=text_safe(str(info["task_id"])),
        admissible_actions=None if admissible is None else [text_safe(str(a)) for a in admissible],
        action_valid=bool(info["action_valid"]),
        won=bool(info["won"]),
        score=float(info["score"]),
        info=json_safe(extra),
    )


_CONTRACT_KEYS = frozenset(INFO_KEYS)


def describe(observation: AgentGymObservation) -> str:
    """The text a tool call returns: the observation, then the admissible actions or the end.

    The same rendering as the TRL ``environment_factory`` adapter's ``act`` tool, so a model
    sees the same text whichever way it plays.
    """
    text = observation.text
    if observation.done:
        return text + "\nThe episode is over" + (": you won." if observation.won else ".")
    if observation.admissible_actions:
        text += "\nAdmissible actions: " + ", ".join(observation.admissible_actions)
    return text


# ---------------------------------------------------------------------------------------------
# The server-side environment
# ---------------------------------------------------------------------------------------------
class ServedEnvironment(Environment[AgentGymAction, AgentGymObservation, AgentGymState]):
    """One agentgym env behind OpenEnv's ``Environment`` interface (one per server session).

    The gymnasium env is built on the first ``reset`` (``gym.make(env_id, **env_kwargs)``), so
    OpenEnv's stateless endpoints (``/state``, ``/metadata``) cost nothing. With ``llm`` (the
    keyword arguments of :func:`agentgym.wrappers.llm.make_llm_env`, ``{}`` for its defaults)
    the env is wrapped for a language model: observations are whole prompts (task, recent
    history, admissible actions, output format) and actions are the model's raw text, parsed
    by the wrapper (unparseable text is an invalid step with ``info["parse_error"]``). Each instance owns
    its env; data every env of a family shares (catalogues, room caches) stays one read-only
    copy per process, which is why sessions may run concurrently.

    ``reset(seed=None, episode_id=None, options=None)`` takes the gymnasium reset's ``seed``
    (int >= 0) and ``options`` (e.g. ``{"task": 3}``). Other keys, wrong types and options the
    env does not have raise :class:`agentgym.core.ResetOptionError` saying what is accepted.
    ``step`` before any ``reset``, or after :meth:`close`, raises :class:`SessionError`.
    An unusable action is not an error: it is an observation with ``action_valid=False``.

    Tools: :attr:`mcp_server` is a FastMCP server holding one tool, ``act(action)`` (the same
    name, argument and returned text as the TRL adapter's tool), which steps this session's
    episode; OpenEnv's server answers MCP ``tools/list`` / ``tools/call`` from it, over ``/mcp``
    (with the session id of ``openenv/session/create``) or as ``mcp`` messages on ``/ws``.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session builds its own env (see the docstring)

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        llm: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.llm = None if llm is None else dict(llm)
        self._env: gym.Env | None = None
        self._state = AgentGymState(env_id=env_id)
        self._closed_reason: str | None = None
        # one episode, two ways in (WebSocket steps and MCP tool calls may come from different
        # threads): steps and resets of this session never overlap
        self._lock = threading.RLock()
        self._mcp_server: Any = None

    # -- OpenEnv's interface -------------------------------------------------------------------
    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
        **unknown: Any,
    ) -> AgentGymObservation:
        # **unknown: OpenEnv passes only the keys a signature names, so without it a typo such as
        # {"sed": 3} would be dropped silently; validating here makes it an error instead
        try:
            params = _ResetParams.model_validate(
                dict(unknown, seed=seed, episode_id=episode_id, options=options)
            )
        except ValidationError as exc:  # one readable line instead of pydantic's report
            # names shown short and printable, and only the first few: they come from a client
            errors = exc.errors(include_url=False, include_input=False)
            problems = "; ".join(
                f"{'.'.join(describe_action(str(p), limit=40) for p in e['loc']) or 'data'}: "
                f"{e['msg']}"
                for e in errors[:3]
            ) + (f"; and {len(errors) - 3} more" if len(errors) > 3 else "")
            raise ResetOptionError(
                f"bad reset message ({problems}); reset takes seed (int >= 0), episode_id (str) "
                "and options (a dict such as {'task': 3})"
            ) from None
        with self._lock:
            self._check_open()
            if self._env is None:
                self._env = self._make_env()
            try:
                obs, info = self._env.reset(seed=params.seed, options=params.options)
            except BaseException:
                # a reset that raised may leave wrappers half-updated (gymnasium's passive checker
                # then fails the next step), so the session starts over from a fresh env
                self._env.close()
                self._env = None
                self._state = AgentGymState(env_id=self.env_id)
                raise
            observation = make_observation(obs, info)
            self._state = AgentGymState(
                env_id=self.env_id,
                episode_id=params.episode_id or uuid.uuid4().hex,
                step_count=0,
                task_id=observation.task_id,
                state_key=observation.state_key,
                done=False,
            )
            return observation

    def step(
        self, action: AgentGymAction, timeout_s: float | None = None, **kwargs: Any
    ) -> AgentGymObservation:
        with self._lock:
            self._check_open()
            if self._env is None or self._state.episode_id is None:
                raise SessionError(
                    f"{self.env_id}: no episode to step yet; send reset first (over HTTP every "
                    "call gets a fresh env, so episodes need the WebSocket session at /ws)"
                )
            # the env sees exactly the text the client will see echoed back (parsed_action...)
            obs, reward, terminated, truncated, info = self._env.step(text_safe(action.text))
            observation = make_observation(obs, info, reward, terminated, truncated)
            self._state.step_count += 1
            self._state.state_key = observation.state_key
            self._state.done = observation.done
            self._state.episode_return += observation.reward or 0.0
            self._state.won = observation.won
            return observation

    def act(self, action: str) -> str:
        """Take one action in the environment and see what happens.

        Args:
            action: The action to take, written as the observation asks (for example one of the
                admissible actions it lists).

        Returns:
            The environment's observation after the action.
        """
        with self._lock:
            if self._env is None or self._state.episode_id is None:
                return "No episode is running."
            if self._state.done:
                return "The episode is over; no more actions are taken."
            return describe(self.step(AgentGymAction(text=action)))

    @property
    def mcp_server(self) -> Any:
        """A FastMCP server with this session's ``act`` tool (built on first use)."""
        if self._mcp_server is None:
            from fastmcp import FastMCP

            server = FastMCP(name=f"agentgym {self.env_id}")

            async def act(action: str) -> str:
                # off the event loop: OpenEnv awaits the tool there
                return await asyncio.to_thread(self.act, action)

            act.__doc__ = ServedEnvironment.act.__doc__
            server.tool(act)
            self._mcp_server = server
        return self._mcp_server

    @property
    def state(self) -> AgentGymState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=self.env_id,
            description=f"agentgym text env {self.env_id}: send {{'text': action}}, receive the "
            "observation text with reward, done and the env's info",
            version=_agentgym_version(),
        )

    def close(self) -> None:
        """Close the env; later calls raise :class:`SessionError` (idempotent)."""
        with self._lock:
            if self._closed_reason is None:
                self._closed_reason = "this session was closed; open a new connection"
            if self._env is not None:
                self._env.close()
                self._env = None

    # -- helpers --------------------------------------------------------------------------------
    def _make_env(self) -> gym.Env:
        env = gym.make(self.env_id, **self.env_kwargs)
        if self.llm is not None:
            from agentgym.wrappers.llm import make_llm_env

            env = make_llm_env(env, **self.llm)
        return env

    def _check_open(self) -> None:
        if self._closed_reason is not None:
            raise SessionError(f"{self.env_id}: {self._closed_reason}")


def _agentgym_version() -> str:
    import agentgym

    return agentgym.__version__


# ---------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------
class AgentGymEnvClient(EnvClient[AgentGymAction, AgentGymObservation, AgentGymState]):
    """OpenEnv's WebSocket client, typed for an ``agentgym serve`` server.

    Async by default (``async with AgentGymEnvClient(base_url=...) as env``); ``.sync()`` gives
    the blocking wrapper. ``step`` takes an :class:`AgentGymAction` or plain text. A server error
    (bad message, capacity reached, expired session) raises ``RuntimeError`` with the server's
    message and code, as every OpenEnv client does.
    """

    def _step_payload(self, action: AgentGymAction | str) -> dict[str, Any]:
        if isinstance(action, str):
            return {"text": action}
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[AgentGymObservation]:
        observation = AgentGymObservation(
            **payload.get("observation", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )
        return StepResult(observation=observation, reward=observation.reward, done=observation.done)

    def _parse_state(self, payload: dict[str, Any]) -> AgentGymState:
        return AgentGymState(**payload)
