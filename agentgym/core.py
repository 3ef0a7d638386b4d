"""The environment contract every agentgym env follows.

An agentgym env is a plain ``gymnasium.Env[str, str]``: it takes a text action and
returns a text observation. On top of Gymnasium's contract it promises a fixed set of
``info`` keys on every ``reset`` and ``step`` (see :data:`INFO_KEYS`), the most important
of which is ``state_key``: a hashable, canonical description of the simulator's true
state, so that step-level credit assignment (GiGPO's anchor-state groups) can group
rows by *world state* rather than by rendered text.

Subclasses implement three small hooks, and the base class does the rest (seeding,
step counting, the truncation cap, action coercion, the info-key check, never raising on
bad actions):

- ``_reset_task(options) -> (obs, info)``: start the task chosen by ``self.np_random`` or by
  ``options["task"]``; return the first observation and the family's info.
- ``_step_action(action) -> (obs, reward, terminated, info)``: apply one already-coerced
  ``str`` action. An action the env cannot use returns a clear observation,
  ``info["action_valid"] = False`` and leaves the state unchanged.
- ``state_key() -> Hashable``: the canonical state.

and, for :meth:`TextEnv.snapshot` / :meth:`TextEnv.restore` (every registered family provides
them; the registry-wide tests check it), three more:

- ``_snapshot_identity() -> Hashable``: what an env must share with another for a snapshot of
  one to restore into the other (id-defining kwargs, a digest of the data); computed once.
- ``_snapshot_state() -> Any``: an immutable, picklable value of everything ``step`` reads
  and changes, sharing what never changes.
- ``_restore_state(state)``: put that value back (validating first, so a refused restore
  changes nothing).
"""

from __future__ import annotations

import pickle
import string
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "INFO_KEYS",
    "TEXT_CHARSET",
    "MAX_ACTION_CHARS",
    "MAX_OBS_CHARS",
    "TextEnv",
    "InvalidAction",
    "ResetOptionError",
    "EnvSnapshot",
    "ProcessLocal",
    "SnapshotMismatch",
    "StepCap",
    "coerce_action",
    "describe_action",
]

#: Info keys present on every ``reset`` and ``step`` of every agentgym env.
#:
#: ``state_key``  hashable canonical state: equal iff the world is in the same state, whatever
#:                path led there and whatever the text says. Built from the simulator's state.
#: ``task_id``    stable id of the task / game / goal.
#: ``admissible_actions``  list of the valid actions now, or None where the family cannot list them.
#: ``action_valid``  whether the last action was understood and applicable (True after reset).
#: ``won``        the task is solved.
#: ``score``      the family's native task score (Sokoban: boxes on target fraction, WebShop: 0..1).
INFO_KEYS: tuple[str, ...] = (
    "state_key",
    "task_id",
    "admissible_actions",
    "action_valid",
    "won",
    "score",
)

_INFO_KEY_SET = frozenset(INFO_KEYS)

#: Characters an observation or action may hold: printable ASCII plus whitespace, plus the few
#: symbols families draw with (Sokoban's box-on-target mark). Observations never echo raw
#: user text outside this set (see :func:`describe_action`).
TEXT_CHARSET: frozenset[str] = frozenset(string.printable) | frozenset("√")

#: Longest action the action space describes. Longer actions are still accepted (and are
#: invalid for every family); the space only bounds what ``action_space.sample()`` produces.
MAX_ACTION_CHARS = 4096
#: Longest observation an env may return.
MAX_OBS_CHARS = 1 << 16


class InvalidAction:
    """An action that a wrapper already knows is unusable (e.g. model text with no ``<action>`` tag).

    Passing one to :meth:`TextEnv.step` costs the agent a step (so the step cap still applies)
    and returns ``message`` as the observation with ``action_valid=False``; the state is unchanged.
    """

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message

    def __repr__(self) -> str:
        return f"InvalidAction({self.message!r})"


class ResetOptionError(ValueError):
    """``reset(options=...)`` asked for something this env does not have.

    The one exception type every agentgym env raises for bad reset options: an unknown option
    name, a task index out of range, a task id of another env or split, an unknown split, or
    options that are not a dict. The message says what is accepted. (A ``ValueError``, so code
    that caught the old mix of ValueError subclasses keeps working.)
    """


class SnapshotMismatch(ValueError):
    """``restore(snapshot)`` was given a snapshot of another env class, variant or data.

    Raised before anything changes: the env keeps its state. The message names both sides.
    """


class ProcessLocal:
    """A value a snapshot carries by reference within this process and drops when pickled.

    For caches derived from the state (a room's lookup tables, a game's admissible actions):
    a restore in the same process reuses them, a restore from a pickled snapshot finds
    ``value`` None and recomputes. The value must never be mutated in place.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any = None):
        self.value = value

    def __reduce__(self) -> tuple:
        return ProcessLocal, ()


@dataclass(frozen=True, slots=True, eq=False)
class EnvSnapshot:
    """The whole simulator state of a :class:`TextEnv` at one moment: immutable and picklable.

    Made by :meth:`TextEnv.snapshot`, put back by :meth:`TextEnv.restore` into any env of the
    same class, variant and data (in this process or, pickled, in another). Only what a step can
    change is copied; what never changes (a room's layout, a game's static facts, a catalogue,
    a retriever) is shared by reference in-process and found again by name after pickling.
    A pickled snapshot is a pickle: unpickle only snapshots from a trusted source.
    """

    env_class: str
    """``module.Class`` of the env it was taken from"""
    identity: Hashable
    """the env's :meth:`TextEnv.snapshot_identity`; :meth:`TextEnv.restore` refuses another"""
    state: Any
    """the family's part (``_snapshot_state``): immutable values of what a step reads and changes"""
    state_key: Hashable
    """``info["state_key"]`` of the state it holds"""
    elapsed_steps: int
    """steps taken since the last reset"""
    done: tuple[bool, bool] | None
    """``(terminated, truncated)`` once the episode has ended, else None"""
    last_obs: str
    """the last observation returned"""
    frozen: bytes
    """the last info dict and the random stream's state, pickled: a deep copy nobody can alias
    (each restore unpickles its own)"""

    @property
    def info(self) -> dict[str, Any]:
        """A fresh copy of the last info dict returned before the snapshot."""
        return pickle.loads(self.frozen)[0]

    def __repr__(self) -> str:
        name = self.env_class.rsplit(".", 1)[-1]
        key = repr(self.state_key)
        key = key if len(key) <= 80 else key[:77] + "..."
        return f"EnvSnapshot({name}, step {self.elapsed_steps}, done={self.done}, state_key={key})"


def coerce_action(action: Any) -> str | None:
    """Turn whatever a caller passed as an action into ``str``, or None if it is not text.

    ``bytes`` are decoded as UTF-8 with replacement; numpy string scalars become ``str``;
    anything else (None, numbers, lists) is not an action and gives None.

    >>> coerce_action("go north"), coerce_action(b"up"), isinstance(coerce_action(np.str_("a")), str)
    ('go north', 'up', True)
    >>> coerce_action(None), coerce_action(42), coerce_action(["up"])
    (None, None, None)
    """
    if isinstance(action, str):
        return action
    if isinstance(action, (bytes, bytearray)):
        return bytes(action).decode("utf-8", errors="replace")
    # numpy.str_ is a str subclass and is handled above; this catches 0-d numpy arrays of text.
    item = getattr(action, "item", None)
    if callable(item) and getattr(action, "shape", None) == ():
        value = item()
        return value if isinstance(value, str) else None
    return None


def describe_action(action: Any, limit: int = 60) -> str:
    """A short, safe rendering of a user's action for an error observation or a prompt.

    Keeps the text inside :data:`TEXT_CHARSET` whatever the action held (control characters,
    non-ASCII as ``\\x..`` escapes, lone surrogates, 1 MB strings), so it can be echoed back,
    and at most ``limit + 3`` characters long (``"..."`` marks a cut). Non-text actions show
    their ``repr``.

    >>> describe_action("héllo\\x1b[2J")
    'h\\\\xe9llo?[2J'
    >>> describe_action("x" * 100, limit=5), describe_action(None)
    ('xxxxx...', 'None')
    """
    text = action if isinstance(action, str) else repr(action)
    shown = text[:limit].encode("ascii", "backslashreplace").decode("ascii")
    shown = "".join(c if c in TEXT_CHARSET and c not in "\r\x0b\x0c" else "?" for c in shown)
    # escapes lengthen non-ASCII text (up to 10 characters per code point): cut again
    cut = len(text) > limit or len(shown) > limit
    return shown[:limit] + ("..." if cut else "")


class TextEnv(gym.Env[str, str]):
    """Base class of every agentgym environment.

    **Spaces.** ``observation_space`` and ``action_space`` are :class:`gymnasium.spaces.Text`
    over :data:`TEXT_CHARSET`.

    **reset(seed=None, options=None) -> (obs, info).** The same ``seed`` always gives the same
    task and the same initial state. ``options={"task": index_or_id}`` picks a task
    explicitly; ``options={"split": "train" | "valid" | "test"}`` picks a split where the
    family has them. Without a seed, the env's random stream continues, so successive resets
    visit different tasks.

    **step(action) -> (obs, reward, terminated, truncated, info).** ``terminated`` is True when
    the task has ended for good (won, or lost with no way back). ``truncated`` is True when the
    step cap ended the episode first: :attr:`max_episode_steps` steps since the last reset (the
    env counts them itself, :attr:`elapsed_steps`). Under ``gym.make`` the cap is the registry
    entry's, or ``gym.make(id, max_episode_steps=N)``'s (:class:`StepCap` hands it to the env);
    an env class built directly has none unless given one. An action the env cannot use is
    never an exception: it returns an observation that says why, ``info["action_valid"] =
    False``, and the world state does not change. Non-text actions (None, numbers) are treated
    the same way. Stepping a finished episode (terminated or truncated) returns the last
    observation, reward 0, ``action_valid=False`` and the same terminated / truncated flags, and
    changes nothing.

    **Action text.** Every family ignores whitespace around an action (the base class strips
    it). Beyond that each family matches actions as its benchmark does: Sokoban and Corridor
    ignore case and runs of inner whitespace; ALFWorld matches the command exactly as TextWorld
    does (case and inner spaces count; the LLM wrapper lower-cases and collapses model text as
    verl-agent does, which yields the commands' form); WebShop lower-cases as WebShop does;
    SearchQA keeps the query and answer text as written.

    **info**, on every reset and step, holds at least :data:`INFO_KEYS`:

    - ``state_key``: hashable; two info dicts have equal ``state_key`` exactly when the
      simulator is in the same state (for Sokoban: player and box positions; for ALFWorld: the
      PDDL facts), whatever path led there and whatever the observation text says. It never
      depends on the step count or on the text alone, so it is the right key for GiGPO's
      step-level (anchor-state) groups.
    - ``task_id``: str, stable across runs and machines.
    - ``admissible_actions``: list[str] of the actions valid now, or None.
    - ``action_valid``: bool; True after reset.
    - ``won``: bool, ``score``: float (the family's native score).

    Families may add keys of their own (``synthetic``, ``goal``, ``task_type``...).

    **Snapshot / restore.** ``snapshot()`` returns an :class:`EnvSnapshot`: an immutable,
    picklable copy of the whole simulator state after the last reset or step (the world, the
    step count, the done flags, the last observation and info, the random stream
    ``np_random`` that the next ``reset()`` draws from, and whatever else ``step`` reads).
    ``restore(snapshot)`` puts this env into exactly that state, provided it has the same class,
    the same id-defining arguments and the same data (:meth:`snapshot_identity`); otherwise it
    raises :class:`SnapshotMismatch` and changes nothing. From then on the env behaves exactly as
    the original did after the snapshot: the same actions give the same observations, rewards,
    ``terminated`` / ``truncated`` flags and infos (state keys included), whether the snapshot
    is restored into the env it came from after it moved on, into a fresh env, or into an env
    of another process after pickling. Snapshots share what never changes and copy only what a
    step can change, so both calls cost microseconds; each family's docstring says what its
    snapshot holds. The step count and the done flags are episode state and come along; the
    step cap is the restoring env's own configuration and stays. Restoring acts on the
    unwrapped env: gymnasium's ``OrderEnforcing``
    wrapper (what ``gym.make`` adds) still wants one ``reset()`` before its first ``step``, so
    step ``env.unwrapped`` or reset the wrapped env once before restoring into it.
    Two snapshots with equal ``state_key`` behave the same from then on: the same actions give
    the same rewards, ``terminated`` flags, state keys and admissible actions, and the same
    observations wherever the family's text is a function of its state (every family but
    ALFWorld, whose text remembers facts made false); only the step cap, which counts steps
    since reset, may end one earlier.

    >>> import gymnasium as gym, agentgym
    >>> env = gym.make("AgentGym/Corridor-v0")
    >>> obs, info = env.reset(seed=0)
    >>> obs
    'Room 1 of 4. Doors: red, blue, green. Light comes through the green door.'
    >>> [info[k] for k in ("task_id", "admissible_actions", "action_valid", "won", "score")]
    ['corridor-train-850624', ['red', 'blue', 'green'], True, False, 0.0]
    >>> obs, reward, terminated, truncated, info = env.step("purple")  # never an exception
    >>> obs, info["action_valid"]
    ("Invalid action 'purple'. Say one of: red, blue, green.", False)
    >>> snap = env.unwrapped.snapshot()
    >>> first = env.step("blue")
    >>> env.unwrapped.restore(snap)
    >>> env.step("blue")[:4] == first[:4]  # the same step again, from the same state
    True
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    #: family name shown by ``agentgym list`` ("sokoban", "alfworld", ...)
    family: ClassVar[str] = "text"

    #: how actions are written, in one line for a person (``agentgym play`` shows it at start)
    action_syntax: ClassVar[str] = "an action is text"

    #: the ``reset(options=...)`` keys this env understands; any other key is a
    #: :class:`ResetOptionError` (a typo such as ``{"spilt": "test"}`` must not pass silently)
    reset_option_keys: ClassVar[frozenset[str]] = frozenset({"task", "split"})

    #: values an invalid step reports for info keys that describe the action, not the state
    #: (only where the family reports the key): an invalid action has no effect
    invalid_step_info: ClassVar[dict[str, Any]] = {"action_effective": False}

    @property
    def invalid_action_reward(self) -> float:
        """Reward of a step whose action was unusable (non-text, unparseable, inadmissible).

        Families whose every step costs something (Sokoban's -0.1) charge it here too, so that
        an invalid action is never cheaper than a valid one; the default is 0.0.
        """
        return 0.0

    def __init__(self, max_episode_steps: int | None = None, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r} is not supported by {type(self).__name__}; "
                f"choose one of {self.metadata['render_modes']}"
            )
        self.render_mode = render_mode
        #: the step cap in force: the episode is truncated after this many steps since the last
        #: reset (None: no cap). Under ``gym.make`` it is the registry entry's, set by
        #: :class:`StepCap`; env classes have no default of their own.
        self.max_episode_steps = max_episode_steps
        self.observation_space = spaces.Text(
            max_length=MAX_OBS_CHARS, min_length=0, charset=TEXT_CHARSET
        )
        self.action_space = spaces.Text(
            max_length=MAX_ACTION_CHARS, min_length=0, charset=TEXT_CHARSET
        )
        self._elapsed_steps = 0
        self._done: tuple[bool, bool] | None = None  # (terminated, truncated) once finished
        self._last_obs = ""
        self._last_info: dict[str, Any] = {}
        self._snapshot_id: Hashable | None = None  # snapshot_identity(), computed once

    # -- hooks for subclasses --------------------------------------------------------------
    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        raise NotImplementedError

    def state_key(self) -> Hashable:
        """The canonical, hashable state of the simulator now (see the class docstring)."""
        raise NotImplementedError

    def _snapshot_identity(self) -> Hashable:
        """What two envs must share for a snapshot of one to restore into the other: the
        arguments that change the task or the dynamics, and a digest of the data (not paths
        alone where the data could differ). Plain values (str, int, tuples), equal across
        processes: never ``id()`` or ``hash()`` of a str. Called once per env."""
        raise NotImplementedError(self._no_snapshot_message())

    def _snapshot_state(self) -> Any:
        """An immutable, picklable value holding everything ``step`` reads and changes; shares
        what never changes by reference (pickling must send or re-find it)."""
        raise NotImplementedError(self._no_snapshot_message())

    def _restore_state(self, state: Any) -> None:
        """Put a ``_snapshot_state()`` value back. Validate first (raise
        :class:`SnapshotMismatch` if the data differs), then assign: a refused restore changes
        nothing. The value may be restored many times: copy what this env will mutate."""
        raise NotImplementedError(self._no_snapshot_message())

    def _no_snapshot_message(self) -> str:
        return (
            f"{type(self).__name__} does not support snapshot()/restore(): implement its "
            "_snapshot_identity(), _snapshot_state() and _restore_state() hooks (see "
            "agentgym.core.TextEnv)"
        )

    # -- snapshot / restore ----------------------------------------------------------------
    def snapshot_identity(self) -> Hashable:
        """``(module.Class, the family's identity)``: what a snapshot must match to be restored
        here (see :meth:`restore`). The step cap is not part of it: it is configuration of the
        env that restores, while the step count is episode state the snapshot carries."""
        if getattr(self, "_snapshot_id", None) is None:  # None: not yet computed
            self._snapshot_id = (
                f"{type(self).__module__}.{type(self).__qualname__}",
                self._snapshot_identity(),
            )
        return self._snapshot_id

    def snapshot(self) -> EnvSnapshot:
        """The whole simulator state now, as an immutable, picklable :class:`EnvSnapshot`.

        See the class docstring for the contract. Raises RuntimeError before the first
        ``reset()`` (there is no state yet) and NotImplementedError for an env class that does
        not implement the snapshot hooks.
        """
        identity = self.snapshot_identity()
        if not self._last_info:
            raise RuntimeError(f"{type(self).__name__}: call reset() before snapshot()")
        rng = self._np_random
        frozen = pickle.dumps(
            (
                self._last_info,
                None if rng is None else rng.bit_generator.state,
                self._np_random_seed,
            ),
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        return EnvSnapshot(
            identity[0],
            identity,
            self._snapshot_state(),
            self.state_key(),
            self._elapsed_steps,
            self._done,
            self._last_obs,
            frozen,
        )

    def restore(self, snapshot: EnvSnapshot) -> None:
        """Put this env into the state ``snapshot`` holds (see the class docstring).

        Raises TypeError if ``snapshot`` is not an :class:`EnvSnapshot`, and
        :class:`SnapshotMismatch` if it was taken from an env of another class, variant
        (id-defining arguments) or data; the env is then unchanged.
        """
        if not isinstance(snapshot, EnvSnapshot):
            raise TypeError(
                f"restore() takes an EnvSnapshot from env.unwrapped.snapshot(), got "
                f"{type(snapshot).__name__}"
            )
        identity = self.snapshot_identity()
        if snapshot.identity != identity:
            if snapshot.env_class != identity[0]:
                why = f"it was taken from a {snapshot.env_class}"
            else:
                why = (
                    f"it was taken from an env made with other arguments or data "
                    f"(its identity {snapshot.identity!r:.300}; this env's {identity!r:.300})"
                )
            raise SnapshotMismatch(
                f"cannot restore this snapshot into {type(self).__name__}: {why}; restore it "
                "into an env made with the same id, arguments and data"
            )
        info, rng_state, rng_seed = pickle.loads(snapshot.frozen)
        self._restore_state(snapshot.state)
        self._elapsed_steps = snapshot.elapsed_steps
        self._done = snapshot.done
        self._last_obs = snapshot.last_obs
        self._last_info = info
        if rng_state is None:
            self._np_random = None
        else:
            if self._np_random is None or (
                type(self._np_random.bit_generator).__name__ != rng_state["bit_generator"]
            ):
                # a placeholder seed: the state set below replaces it entirely
                bit_generator = getattr(np.random, rng_state["bit_generator"])(0)
                self._np_random = np.random.Generator(bit_generator)
            self._np_random.bit_generator.state = rng_state
        self._np_random_seed = rng_seed

    # -- the gymnasium API -----------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = self._check_reset_options(options)
        try:
            obs, info = self._reset_task(options)
        except ResetOptionError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, OverflowError) as exc:
            if not options:  # nothing the caller chose: a bug of the family, not bad input
                raise
            # one documented exception type for bad options, whatever the family raised
            detail = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else exc
            raise ResetOptionError(f"{type(self).__name__}: bad reset options: {detail}") from exc
        self._elapsed_steps = 0
        self._done = None
        info.setdefault("action_valid", True)
        return self._record(obs, info)

    def step(self, action: Any) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._done is not None:
            info = dict(self._last_info, action_valid=False)
            return self._last_obs, 0.0, self._done[0], self._done[1], info
        text = coerce_action(action)
        if isinstance(action, InvalidAction):
            obs = describe_action(action.message, limit=500)
            reward, terminated = self.invalid_action_reward, False
            info = self._invalid_info()
        elif text is None:
            obs = f"Invalid action {describe_action(action)}: actions are text."
            reward, terminated = self.invalid_action_reward, False
            info = self._invalid_info()
        else:
            # one rule for every family: surrounding whitespace never matters (see the docstring)
            obs, reward, terminated, info = self._step_action(text.strip())
        self._elapsed_steps += 1
        truncated = (
            not terminated
            and self.max_episode_steps is not None
            and self._elapsed_steps >= self.max_episode_steps
        )
        if terminated or truncated:
            self._done = (bool(terminated), bool(truncated))
        obs, info = self._record(obs, info)
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_obs
        return None

    # -- helpers ---------------------------------------------------------------------------
    def _check_reset_options(self, options: Any) -> dict[str, Any]:
        if options is None:
            return {}
        if not isinstance(options, dict):
            raise ResetOptionError(
                f"reset options must be a dict such as {{'task': 3}}, got {describe_action(options)}"
            )
        # option names may come from a remote client: shown short and printable
        unknown = sorted(
            describe_action(str(k), limit=40) for k in options.keys() - self.reset_option_keys
        )
        if unknown:
            raise ResetOptionError(
                f"{type(self).__name__} has no reset option {', '.join(unknown)}; "
                f"it accepts {', '.join(sorted(self.reset_option_keys))}"
            )
        return dict(options)

    @property
    def elapsed_steps(self) -> int:
        """Steps taken since the last reset (invalid actions count: they cost the agent a turn)."""
        return self._elapsed_steps

    def _invalid_info(self) -> dict[str, Any]:
        """Info for an action that changed nothing: the last info with ``action_valid=False``.

        Every key the family reports is kept (``goal``, ``task_type``, ``boxes_on_target``...):
        the state did not change, and trainers read such keys from a trajectory's last step.
        Keys that describe the action rather than the state are set for a no-op
        (:attr:`invalid_step_info`).
        """
        info = dict(self._last_info)
        for key, value in self.invalid_step_info.items():
            if key in info:
                info[key] = value
        info["action_valid"] = False
        return info

    def _record(self, obs: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if not info.keys() >= _INFO_KEY_SET:  # a family bug, not a user error: fail loudly
            missing = [k for k in INFO_KEYS if k not in info]
            raise RuntimeError(f"{type(self).__name__} info lacks contract keys {missing}")
        if len(obs) > MAX_OBS_CHARS:
            obs = obs[: MAX_OBS_CHARS - 3] + "..."
        self._last_obs, self._last_info = obs, info
        return obs, info


class StepCap(gym.Wrapper[str, str, str, str], gym.utils.RecordConstructorArgs):
    """The step cap of a registered id, in the place of gymnasium's ``TimeLimit``.

    ``gym.make(id)`` wraps a capped env in ``TimeLimit`` (with the registered
    ``max_episode_steps``, or ``gym.make(id, max_episode_steps=N)``'s); every agentgym id then
    adds this wrapper (the registry's ``additional_wrappers``), which reads that cap from the
    public ``spec``, hands it to the :class:`TextEnv` (:attr:`TextEnv.max_episode_steps`) and
    drops the ``TimeLimit``. So the env enforces the one cap itself: it counts its steps
    (:attr:`elapsed_steps`, carried by snapshots), and a step after truncation is a no-op like
    any step after the episode ended (the last observation, reward 0, ``action_valid=False``,
    the same flags), which ``TimeLimit`` would pass through to the env as a real step.
    ``env.spec.max_episode_steps`` still reports the cap in force, and ``gym.make(env.spec)``
    makes the same env again.

    Around an env that is not a :class:`TextEnv`, the ``TimeLimit`` stays and enforces the cap;
    around an env that ``gym.make`` did not make (no ``spec``), the env keeps its own cap.
    The wrapper holds no episode state of its own; :attr:`max_episode_steps` is the cap in force.
    """

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        spec = env.spec
        base = env.unwrapped
        if spec is None:
            cap = base.max_episode_steps if isinstance(base, TextEnv) else None
        else:
            cap = spec.max_episode_steps
        if isinstance(base, TextEnv):
            if isinstance(env, gym.wrappers.TimeLimit):
                env = env.env
            base.max_episode_steps = cap
        gym.Wrapper.__init__(self, env)
        self.max_episode_steps = cap

    @property
    def elapsed_steps(self) -> int:
        """Steps taken since the last reset, as the :class:`TextEnv` counts them."""
        return self.env.unwrapped.elapsed_steps

    @property
    def spec(self) -> gym.envs.registration.EnvSpec | None:
        """The env's spec, with this wrapper and the cap in force (``max_episode_steps``)."""
        spec = super().spec  # a copy this wrapper caches and owns
        if spec is not None:
            spec.max_episode_steps = self.max_episode_steps
        return spec
