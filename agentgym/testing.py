"""The family contract as one call: what every registered id must do, checked on a new family.

A new family's test is one line::

    from agentgym.testing import check_family

    def test_my_family():
        check_family("Mine/Counter-v0")

:func:`check_family` runs every check below on the id (a few seconds for a small env) and
raises :class:`FamilyContractError` (an ``AssertionError``, so pytest shows it as a failure)
naming the rule broken. Each check is also a function of its own, for a test that wants one:

==============================  ===============================================================
:func:`check_registration`      the id is registered, its env class names the entry's family,
                                the family's package declares ``FAMILY``, ``gym.make`` applies
                                the entry's step cap
:func:`check_gymnasium`         gymnasium's ``check_env`` passes on the unwrapped env, a
                                :class:`~agentgym.core.TextEnv`
:func:`check_info_keys`         :data:`~agentgym.core.INFO_KEYS` with their types on every
                                reset and step; ``admissible_actions`` listed exactly when
                                ``FAMILY.lists_actions``; observations inside the space
:func:`check_determinism`       the same seed gives the same rollout; some seed differs
:func:`check_pickle`            a pickled env continues exactly as the original
:func:`check_snapshot`          ``snapshot()`` restored in place, into a fresh env and through
                                pickle replays the original exactly
:func:`check_invalid_actions`   a non-text, garbage or :class:`~agentgym.core.InvalidAction`
                                action is an observation with ``action_valid=False`` that
                                changes no state and keeps the family's info keys
:func:`check_action_whitespace` whitespace around an action never changes it
:func:`check_reset_options`     ``options={"task": info["task_id"]}`` replays the task (where
                                ``"task"`` is in ``reset_option_keys``); bad options (unknown
                                names, unknown or path-like splits and tasks, other families'
                                task ids, wrong types) raise
                                :class:`~agentgym.core.ResetOptionError` without showing a
                                path, and leave the env working
:func:`check_prompt`            ``make_llm_env`` renders a prompt inside the space; model text
                                in the family's format steps validly; text that does not parse
                                is an invalid step with ``parse_error`` and the family's keys
==============================  ===============================================================

The reset-option rules a family follows (README, "Adding a family"): ``reset_option_keys``
lists the option names its ``_reset_task`` reads (default ``{"task", "split"}``; drop one the
family does not take and the base class refuses it). A family that takes ``"task"`` accepts
the ``task_id`` its infos report (and may accept an index) and raises ``KeyError`` /
``ValueError`` (turned into ``ResetOptionError``) or ``ResetOptionError`` for anything else; a
family that takes ``"split"`` refuses an unknown split the same way. Option values may come
from a remote client: they never reach the file system as paths.

``make`` (every check takes one) builds the env, ``gym.make`` by default; the suite's own
fixture passes one that sets real-data variables first.
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
import warnings
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from agentgym.core import INFO_KEYS, InvalidAction, ResetOptionError, TextEnv

__all__ = [
    "CHECKS",
    "GARBAGE_ACTIONS",
    "FamilyContractError",
    "check_action_whitespace",
    "check_determinism",
    "check_family",
    "check_gymnasium",
    "check_info_keys",
    "check_invalid_actions",
    "check_pickle",
    "check_prompt",
    "check_registration",
    "check_reset_options",
    "check_snapshot",
    "model_text",
    "unparseable_text",
]

Make = Callable[[str], gym.Env]

#: actions no family may accept, or crash on
GARBAGE_ACTIONS: tuple[Any, ...] = (
    "",
    " ",
    "x" * 100_000,
    "héllo wörld ✓ 漢字 🙂",
    "\x00\x01\x1b[2J\x7f\r\n\t",
    "<action>up</action>" * 1000,
    None,
    42,
    3.5,
    b"\xff\xfe bytes",
    ["up"],
)

#: option values that look like paths: refused, and the refusal names no folder
PATH_LIKE = ("../x", "/etc/passwd", "a/b", "..", "../outside/secret", "./test", "test/../test")
_ABSOLUTE_PATH = re.compile(r"(?<![\w.\-])/[\w.\-]+/")


class FamilyContractError(AssertionError):
    """A family broke a rule of the env contract; the message says which, on which id."""


def _require(condition: Any, env_id: str, message: str) -> None:
    if not condition:
        raise FamilyContractError(f"{env_id}: {message}")


def _choices(info: dict[str, Any]) -> list[str]:
    # free-text families (SearchQA) list no admissible actions but may suggest some
    return list(info["admissible_actions"] or info.get("suggested_actions") or ["look"])


def _rollout(env: gym.Env, seed: int, n_steps: int, action_seed: int = 0) -> list[tuple]:
    """(obs, reward, terminated, truncated, state_key) per step, random listed actions."""
    rng = np.random.default_rng(action_seed)
    obs, info = env.reset(seed=seed)
    out = [(obs, 0.0, False, False, info["state_key"])]
    for _ in range(n_steps):
        choices = _choices(info)
        obs, reward, terminated, truncated, info = env.step(
            choices[int(rng.integers(len(choices)))]
        )
        out.append((obs, reward, terminated, truncated, info["state_key"]))
        if terminated or truncated:
            break
    return out


def check_registration(env_id: str, make: Make = gym.make) -> None:
    """The id is in the registry and gymnasium's; the env's ``family`` is the entry's; the family
    declares a :class:`~agentgym.family.FamilySpec`; ``gym.make`` applies the entry's cap."""
    from agentgym.envs import entry
    from agentgym.family import FamilySpec, family_spec

    try:
        e = entry(env_id)
    except KeyError:
        raise FamilyContractError(
            f"{env_id} is not registered: agentgym.register(EnvEntry(...))"
        ) from None
    _require(env_id in gym.registry, env_id, "missing from gymnasium's registry")
    env = make(env_id)
    _require(
        env.unwrapped.family == e.family,
        env_id,
        f"the env's family is {env.unwrapped.family!r}, the entry's {e.family!r}",
    )
    _require(
        isinstance(family_spec(e.family), FamilySpec),
        env_id,
        f"the {e.family!r} family's package declares no FAMILY = FamilySpec(...)",
    )
    _require(
        env.spec is not None and env.spec.max_episode_steps == e.max_episode_steps,
        env_id,
        "gym.make did not apply the entry's max_episode_steps",
    )
    env.close()


def check_gymnasium(env_id: str, make: Make = gym.make) -> None:
    """gymnasium's ``check_env`` passes on the unwrapped env, a :class:`TextEnv`."""
    from gymnasium.utils.env_checker import check_env

    env = make(env_id)
    _require(isinstance(env.unwrapped, TextEnv), env_id, "the env is not an agentgym TextEnv")
    with warnings.catch_warnings():
        # check_env warns that gym.make's env is wrapped; the contract is the unwrapped env's
        warnings.simplefilter("ignore", UserWarning)
        check_env(env.unwrapped, skip_render_check=True)
    env.close()


def check_info_keys(env_id: str, make: Make = gym.make, n_steps: int = 30) -> None:
    """Every reset and step reports :data:`INFO_KEYS` with their types; the observation is inside
    ``observation_space``; ``admissible_actions`` is a list exactly when the family's
    ``FAMILY.lists_actions`` says so."""
    from agentgym.family import family_spec

    env = make(env_id)
    spec = family_spec(env.unwrapped.family)
    lists_actions = spec.lists_actions if spec is not None else None
    obs, info = env.reset(seed=3)
    for _ in range(n_steps):
        _require(env.observation_space.contains(obs), env_id, f"observation {obs[:200]!r}...")
        missing = [k for k in INFO_KEYS if k not in info]
        _require(not missing, env_id, f"info lacks {missing}")
        _require(isinstance(info["state_key"], Hashable), env_id, "state_key is not hashable")
        hash(info["state_key"])
        _require(isinstance(info["task_id"], str) and info["task_id"], env_id, "task_id: str")
        actions = info["admissible_actions"]
        _require(
            actions is None
            or (isinstance(actions, list) and all(isinstance(a, str) for a in actions)),
            env_id,
            "admissible_actions is neither None nor a list of str",
        )
        if lists_actions is not None:
            _require(
                (actions is not None) == lists_actions,
                env_id,
                f"FAMILY.lists_actions is {lists_actions} but admissible_actions is {actions!r:.80}",
            )
        for key, kind in (("action_valid", bool), ("won", bool), ("score", float)):
            _require(isinstance(info[key], kind), env_id, f"info[{key!r}] is not a {kind.__name__}")
        obs, reward, terminated, truncated, info = env.step(_choices(info)[0])
        _require(isinstance(reward, float), env_id, "the reward is not a float")
        if terminated or truncated:
            obs, info = env.reset()
    env.close()


def check_determinism(env_id: str, make: Make = gym.make, n_steps: int = 40) -> None:
    """Two envs given the same seed and actions play the same rollout (observations, rewards,
    flags, state keys); among five seeds, some start elsewhere."""
    env_a, env_b = make(env_id), make(env_id)
    for seed in (0, 7):
        a = _rollout(env_a, seed, n_steps, action_seed=seed)
        b = _rollout(env_b, seed, n_steps, action_seed=seed)
        _require(a == b, env_id, f"seed {seed} gave two different rollouts")
    firsts = {_rollout(env_a, s, 0)[0][4] for s in range(5)}
    _require(len(firsts) > 1, env_id, "five seeds gave the same initial state")


def check_pickle(env_id: str, make: Make = gym.make) -> None:
    """A pickled copy of a mid-episode env continues exactly as the original."""
    env = make(env_id)
    rng = np.random.default_rng(1)
    _, info = env.reset(seed=11)
    for _ in range(3):
        choices = _choices(info)
        _, _, terminated, truncated, info = env.step(choices[int(rng.integers(len(choices)))])
        if terminated or truncated:
            _, info = env.reset(seed=12)
    clone = pickle.loads(pickle.dumps(env))
    for _ in range(5):
        choices = _choices(info)
        action = choices[int(rng.integers(len(choices)))]
        a, b = env.step(action), clone.step(action)
        _require(a[:4] == b[:4], env_id, f"the pickled copy stepped {action!r} differently")
        _require(a[4]["state_key"] == b[4]["state_key"], env_id, "the pickled copy's state differs")
        info = a[4]
        if a[2] or a[3]:
            break


def _play(env: TextEnv, actions: list[Any]) -> list[tuple]:
    out: list[tuple] = [env.step(a) for a in actions]
    out.append(env.reset())  # the random stream is part of the state
    return out


def check_snapshot(env_id: str, make: Make = gym.make) -> None:
    """``snapshot()`` after reset and mid-episode, restored into the same env after it moved on,
    into a fresh env and through pickle, replays the original exactly (observations, rewards,
    flags, infos, and the task the next unseeded ``reset()`` draws)."""
    env = make(env_id).unwrapped
    rng = np.random.default_rng(5)
    for n_prefix in (0, 3):
        _, info = env.reset(seed=int(rng.integers(1 << 16)))
        for _ in range(n_prefix):
            info = env.step(_choices(info)[int(rng.integers(len(_choices(info))))])[4]
        snap = env.snapshot()
        _require(snap.state_key == info["state_key"], env_id, "snapshot.state_key != info's")
        actions = []
        for _ in range(6):
            choices = _choices(info)
            actions.append(choices[int(rng.integers(len(choices)))])
            info = env.step(actions[-1])[4]
        env.restore(snap)
        original = _play(env, actions)
        env.restore(snap)
        _require(_play(env, actions) == original, env_id, "a restore in place replayed otherwise")
        for where, target, copy in (
            ("into a fresh env", make(env_id).unwrapped, snap),
            ("after pickling", make(env_id).unwrapped, pickle.loads(pickle.dumps(snap))),
        ):
            target.restore(copy)
            _require(_play(target, actions) == original, env_id, f"a restore {where} differs")


def check_invalid_actions(env_id: str, make: Make = gym.make) -> None:
    """Unusable actions never raise: each is an observation inside the space with
    ``action_valid=False``, the state unchanged, and every info key a valid step reports kept."""
    env = make(env_id)
    _, info = env.reset(seed=5)
    key = info["state_key"]
    for action in (*GARBAGE_ACTIONS, InvalidAction("nothing to do")):
        obs, _, terminated, truncated, info = env.step(action)
        _require(info["action_valid"] is False, env_id, f"{action!r:.40} was accepted")
        _require(info["state_key"] == key, env_id, f"{action!r:.40} changed the state")
        _require(env.observation_space.contains(obs), env_id, f"{action!r:.40}: bad observation")
        if terminated or truncated:
            _, info = env.reset(seed=5)
            key = info["state_key"]
    # an invalid step keeps the family's own keys (trainers read them from a last step)
    _, info = env.reset(seed=0)
    valid = info
    if info["admissible_actions"]:
        valid = env.step(info["admissible_actions"][0])[4]
        _require(valid["action_valid"], env_id, "its first admissible action was invalid")
    env.reset(seed=0)
    bad = env.step(None)[4]
    lost = sorted(set(valid) - set(bad))
    _require(not lost, env_id, f"an invalid step lost the info keys {lost}")
    env.close()


def check_action_whitespace(env_id: str, make: Make = gym.make) -> None:
    """An action padded with whitespace steps exactly as the action itself."""
    env = make(env_id).unwrapped
    rng = np.random.default_rng(0)
    _, info = env.reset(seed=4)
    for _ in range(6):
        choices = info["admissible_actions"] or info.get("suggested_actions")
        if not choices:
            return  # nothing to pad: the family lists and suggests no action
        action = choices[int(rng.integers(len(choices)))]
        padded = pickle.loads(pickle.dumps(env))
        plain, spaced = env.step(action), padded.step(f"  {action} \n")
        _require(plain[:4] == spaced[:4], env_id, f"padding changed the step of {action!r}")
        _require(spaced[4]["action_valid"], env_id, f"padded {action!r} was refused")
        info = plain[4]
        if plain[2] or plain[3]:
            return


def _refused(env: TextEnv, env_id: str, options: Any, shown: str | None = None) -> None:
    try:
        env.reset(seed=0, options=options)
    except ResetOptionError as exc:
        message = str(exc)
        _require(message, env_id, f"options {options!r:.80} were refused without a message")
        if shown is not None:  # the refusal of a path-like value names no folder
            for text in (repr(shown), shown):
                message = message.replace(text, "<value>")
            for secret in (os.getcwd(), str(Path.home()), tempfile.gettempdir()):
                _require(secret not in message, env_id, f"refusing {shown!r} showed {secret}")
            _require(not _ABSOLUTE_PATH.search(message), env_id, f"refusing {shown!r}: a path")
        return
    raise FamilyContractError(f"{env_id}: reset options {options!r:.80} were accepted")


def check_reset_options(env_id: str, make: Make = gym.make, foreign: bool = True) -> None:
    """The reset-option rules (module docstring): task ids replay their task, every bad option
    is one :class:`ResetOptionError` that shows no path, and the env works afterwards.

    ``foreign``: also refuse the first task id of every other registered family whose envs
    need no real data (builds one env of each).
    """
    import agentgym

    env, other = make(env_id).unwrapped, make(env_id).unwrapped
    keys = env.reset_option_keys
    splits: list[str | None] = [None]
    if "split" in keys:
        for split in ("valid", "test", "valid_seen"):
            try:
                env.reset(seed=0, options={"split": split})
                splits.append(split)
            except (ResetOptionError, FileNotFoundError):  # no such split, or its data is absent
                continue
    for split in splits if "task" in keys else ():
        options = {"split": split} if split else None
        for seed in (0, 1, 2):
            obs, info = env.reset(seed=seed, options=options)
            # the id alone picks the same task: the same first observation and state
            obs2, info2 = other.reset(seed=99, options={"task": info["task_id"]})
            _require(
                (obs2, info2["task_id"], info2["state_key"])
                == (obs, info["task_id"], info["state_key"]),
                env_id,
                f"options={{'task': {info['task_id']!r}}} did not replay the task of seed {seed}"
                + (f" in split {split!r}" if split else ""),
            )
    env.reset(seed=0)
    bad: list[Any] = [
        "task 3",
        {"spilt": "train"},
        {"split": "no-such-split"},
        {"task": "no-such-task-id"},
        {"task": -(10**30)},
        {"task": 10**30},
        {"task": 3.5},
        {"task": [1, 2]},
        {"task": {"a": 1}},
    ]
    if foreign:
        for e in agentgym.ENTRIES:
            if e.family == env.family or e.real_data or not e.available():
                continue
            try:
                bad.append({"task": gym.make(e.id).unwrapped.reset(seed=0)[1]["task_id"]})
            except FileNotFoundError:
                continue
    for options in bad:
        _refused(env, env_id, options)
    for key in ("split", "task"):
        for value in PATH_LIKE:
            _refused(env, env_id, {key: value}, shown=value)
    _, info = env.reset(seed=0)
    _require(info["task_id"], env_id, "the env does not reset after refusing options")


def model_text(action: str, fmt: str) -> str:
    """Model text in the action format ``fmt`` that parses to ``action`` (the inverse of
    :func:`agentgym.wrappers.llm.parse_action`, for scripted checks).

    >>> model_text("go north", "think_action")
    '<think>ok</think><action>go north</action>'
    >>> model_text("search[capital of France]", "search_answer")
    '<search>capital of France</search>'
    >>> model_text("inc", "plain")
    'inc'
    """
    if fmt == "think_action":
        return f"<think>ok</think><action>{action}</action>"
    if fmt == "search_answer":
        kind, _, rest = action.partition("[")
        return f"<{kind}>{rest.removesuffix(']')}</{kind}>"
    return action


def unparseable_text(fmt: str) -> str:
    """Model text that does not parse in the action format ``fmt``: text without tags for the
    tagged formats; for ``plain``, where any text is the action, blank text.

    >>> from agentgym.wrappers.llm import parse_action
    >>> [parse_action(unparseable_text(f), f).valid for f in ("think_action", "search_answer", "plain")]
    [False, False, False]
    """
    return "   " if fmt == "plain" else "no tags at all"


def check_prompt(env_id: str, make: Make = gym.make) -> None:
    """``make_llm_env`` renders prompts inside the observation space; a listed action written in
    the family's format steps validly; text that does not parse is an invalid step that
    reports ``parse_error`` and keeps every key the family reports."""
    from agentgym.wrappers.llm import make_llm_env

    #: keys the LLM wrappers add on top of the env's own
    wrapper_keys = {"parsed_action", "think", "parse_error", "raw_observation"}
    env = make_llm_env(make(env_id))
    prompt, info = env.reset(seed=0)
    _require(isinstance(prompt, str) and prompt.strip(), env_id, "the prompt is empty")
    _require(env.observation_space.contains(prompt), env_id, "the prompt is outside the space")
    valid = info
    if info.get("admissible_actions"):
        prompt, _, _, _, valid = env.step(model_text(info["admissible_actions"][0], env.fmt))
        _require(valid["action_valid"], env_id, f"a listed action in {env.fmt!r} text was invalid")
        _require(env.observation_space.contains(prompt), env_id, "a prompt is outside the space")
    env.reset(seed=0)
    *_, bad = env.step(unparseable_text(env.fmt))
    _require(bad["action_valid"] is False and "parse_error" in bad, env_id, "unparseable text")
    lost = sorted((set(valid) - wrapper_keys) - set(bad))
    _require(not lost, env_id, f"unparseable text lost the info keys {lost}")
    env.close()


#: every check :func:`check_family` runs, in order
CHECKS: tuple[Callable[..., None], ...] = (
    check_registration,
    check_gymnasium,
    check_info_keys,
    check_determinism,
    check_pickle,
    check_snapshot,
    check_invalid_actions,
    check_action_whitespace,
    check_reset_options,
    check_prompt,
)


def check_family(env_id: str, make: Make = gym.make) -> None:
    """Run every check of the family contract (:data:`CHECKS`) on the registered ``env_id``.

    Raises:
        FamilyContractError: the first rule the family breaks, named with the id.
    """
    for check in CHECKS:
        check(env_id, make)
