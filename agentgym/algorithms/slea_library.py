"""SLEA-RL's self-evolving experience library, keyed by ``state_key`` (arXiv 2603.18079).

SLEA-RL (Wang and Jiang) retrieves experiences at *every* step, by the cluster of the current
observation, and puts them in the prompt; the library evolves between updates from the
rollouts, through score-based admission and rate-limited extraction, never through gradients.
Its advantage is GiGPO's on the same clusters (:func:`agentgym.algorithms.advantage.slea_rl`);
this module is the rest: the library (:class:`ExperienceLibrary`), its evolution
(:meth:`ExperienceLibrary.update`) and the prompt wrapper that supplies the retrieved
experiences (:class:`ExperiencePrompt`).

Conventions follow the authors' code (``verl/trainer/ppo/forge/`` of kingofspace0wzz/slea-rl:
``experience_library.py``, ``experience_evolution.py``, ``step_experience.py`` and the rollout
loop), with their defaults:

* **zones and levels.** Successful strategies go to the golden zone (levels ``principle``,
  ``method``, ``example``; 100 per level), failure patterns to the warning zone (``mistake``,
  ``pattern``, ``diagnostic``; 50 per level).
* **score-based admission.** A candidate too similar to an experience already there
  (``difflib`` ratio of the lowercased first 300 characters, or word Jaccard overlap, above
  0.85) is merged: the kept one takes the higher score and nothing is added. When its level is
  full, a candidate replaces the lowest-scored experience only if it scores strictly higher
  (the oldest goes first among equal lows); otherwise it is turned away.
* **rate-limited extraction.** Per update, trajectories scoring at least 0.5 (their total
  reward) are successes, others failures; only the 5 best successes and the 5 worst failures
  are read, and at most 10 strategies and 5 warnings are admitted.
* **rules, not an LLM** (their default extraction): from a success, the action sequence that
  followed (``method``, the trajectory's score) and reasoning sentences such as "I should..."
  (``example``, 0.8 x score); from a failure, its last three actions (``mistake``, ``|score|``),
  a thrice-repeated action or an invalid action (``pattern``, 0.5) and a diagnosis (truncated,
  invalid actions, or generic; ``diagnostic``, 0.3).
* **retrieval.** The top 2 golden and top 1 warning experiences of the current observation's
  cluster; a cluster with none falls back to the library's best (by score) for the task.
  Nothing is retrieved during the first 5 updates or while the library holds fewer than 10
  experiences (their ``warmup_steps`` and ``min_library_size``). Each retrieval counts a use.
* **prompt.** The retrieved experiences become a short hint (their ``minimal`` style:
  ``[Tips: a; b]`` and ``[Avoid: c]``, at most 800 characters) that the rollout puts before
  the observation (they send it as a separate system message).

Where this module differs, and why:

* **the cluster is ``state_key``.** Their default clustering is exact match on the observation
  text; here it is the exact canonical state, which names the state whatever its text (the
  same key the SLEA-RL advantage groups steps by). Each experience is *distilled at* a state:
  a step-level experience is stored under the ``state_key`` of the step it was drawn from, so
  the cluster's experiences are the ones learnt there. (Their clustered mode instead attaches
  whatever the global fallback returned to the cluster on first lookup, which makes a
  cluster's contents depend on the order of lookups; here lookups never change the library.)
* **step-level extraction.** Their rules read one decoded response per trajectory; here every
  step of a success yields a ``method`` experience at its state ("from here, a -> b -> ..."),
  and a failure's warnings are stored at the state where the pattern began. Their
  ``principle`` rules are ALFWorld keyword heuristics and are left out (the library knows no
  family).
* **novelty within a cluster.** The similarity merge compares a candidate with the
  experiences of its own zone *and state*, so the same advice learnt in two states is kept for
  both.
* **strict rate limits and order.** The caps count admissions and stop at the cap (theirs
  are checked between trajectories, so one trajectory can overshoot); retrieval within a
  cluster is by score, then age.
* **bounded and deterministic.** Capacities bound the experiences (450 by default), contents
  are cut to :data:`MAX_CONTENT_CHARS`, clusters exist only while they hold an experience;
  ids count admissions; no hashing of text, so a library is the same on every run.
  :meth:`ExperienceLibrary.save` writes JSON atomically (:mod:`agentgym.io`) and
  :meth:`ExperienceLibrary.load` reads it back exactly.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
from collections.abc import Hashable, Iterable
from dataclasses import asdict, dataclass, field, fields
from difflib import SequenceMatcher
from typing import Any, Literal, SupportsFloat

import gymnasium as gym
from gymnasium import spaces

from agentgym.core import TEXT_CHARSET, describe_action
from agentgym.io import atomic_write_json

__all__ = [
    "LEVELS",
    "MAX_CONTENT_CHARS",
    "Experience",
    "ExperienceLibrary",
    "ExperiencePrompt",
    "LibraryConfig",
    "Retrieved",
]

Zone = Literal["golden", "warning"]

LEVELS: dict[str, tuple[str, ...]] = {
    "golden": ("principle", "method", "example"),
    "warning": ("mistake", "pattern", "diagnostic"),
}
"""the levels of each zone"""

MAX_CONTENT_CHARS = 300
"""longest experience text kept (the authors compare the first 300 characters for novelty)"""

_FORMAT_VERSION = 1
_SEQUENCE_SHOWN = 5  # actions listed in a "method" experience (the authors' actions[:5])
_DECISION_RE = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"I (?:should|need to|will)\s+(.+?)(?:\.|$)",
        r"(?:Therefore|So|Thus),?\s+(.+?)(?:\.|$)",
        r"The (?:best|correct|right) (?:approach|action|step) is\s+(.+?)(?:\.|$)",
    )
]


@dataclass(frozen=True)
class LibraryConfig:
    """The library's options; defaults are the authors' (see the module docstring)."""

    golden_capacity_per_level: int = 100
    """experiences kept per golden level"""
    warning_capacity_per_level: int = 50
    """experiences kept per warning level"""
    similarity_threshold: float = 0.85
    """above this text similarity a candidate is merged into an existing experience"""
    success_threshold: float = 0.5
    """a trajectory whose total reward reaches this is a success"""
    top_k_trajectories: int = 5
    """successes (best first) and failures (worst first) read per update"""
    max_strategies_per_update: int = 10
    """golden experiences admitted per update at most"""
    max_warnings_per_update: int = 5
    """warning experiences admitted per update at most"""
    top_k_golden: int = 2
    """golden experiences retrieved per step"""
    top_k_warning: int = 1
    """warning experiences retrieved per step"""
    warmup_updates: int = 5
    """updates before anything is retrieved"""
    min_library_size: int = 10
    """experiences the library must hold before anything is retrieved"""
    fallback: bool = True
    """a state with no experience of its own gets the task's best ones"""
    max_hint_chars: int = 800
    """longest hint :meth:`ExperienceLibrary.hint` renders"""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{f.name} must be an int >= 0, got {value!r}")
        if not 0.0 <= self.similarity_threshold <= 1.0:
            raise ValueError(
                f"similarity_threshold must be in [0, 1], got {self.similarity_threshold}"
            )
        if not math.isfinite(self.success_threshold):
            raise ValueError("success_threshold must be finite")


@dataclass
class Experience:
    """One entry of the library."""

    uid: int
    """admission number, unique within the library (0, 1, 2, ...)"""
    content: str
    """the advice, inside :data:`~agentgym.core.TEXT_CHARSET`, at most MAX_CONTENT_CHARS long"""
    zone: Zone
    level: str
    """one of ``LEVELS[zone]``"""
    score: float
    """quality score: admission and retrieval rank by it"""
    state_key: Hashable
    """the cluster it was distilled at: the ``state_key`` it is retrieved for"""
    task_id: str | None = None
    """the task it came from; the fallback serves it to the same task only (None: any)"""
    usage_count: int = 0
    """times it was retrieved"""


@dataclass(frozen=True)
class Retrieved:
    """What one step retrieves: best first."""

    golden: tuple[Experience, ...] = ()
    warning: tuple[Experience, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.golden or self.warning)

    @property
    def uids(self) -> list[int]:
        return [e.uid for e in (*self.golden, *self.warning)]


@dataclass
class _Cluster:
    golden: list[int] = field(default_factory=list)
    warning: list[int] = field(default_factory=list)


class ExperienceLibrary:
    """SLEA-RL's experience library: zones of scored experiences, indexed by ``state_key``.

    ``update(trajectories)`` evolves it from a batch of finished trajectories
    (:class:`agentgym.vector.Trajectory`: steps with ``state_key``, action, reward, validity,
    info); ``retrieve(state_key, task_id)`` returns the experiences for one step and ``hint``
    renders them for a prompt; :class:`ExperiencePrompt` does both inside a rollout. Memory is
    bounded by the capacities whatever the rollouts hold. Not thread-safe; one library serves
    the envs of one process (an in-process :class:`~agentgym.vector.GroupVectorEnv` shares it).
    """

    def __init__(self, config: LibraryConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("pass a LibraryConfig or keyword options, not both")
        self.config = config if config is not None else LibraryConfig(**options)
        self.updates = 0
        """updates so far (the warmup counts them)"""
        self._next_uid = 0
        self._by_uid: dict[int, Experience] = {}
        self._levels: dict[tuple[str, str], list[int]] = {
            (zone, level): [] for zone, levels in LEVELS.items() for level in levels
        }
        self._clusters: dict[Hashable, _Cluster] = {}

    # -- contents ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._by_uid)

    def experiences(self, zone: Zone | None = None) -> list[Experience]:
        """Every experience (of ``zone``), in admission order."""
        return [e for e in self._by_uid.values() if zone is None or e.zone == zone]

    def capacity(self, zone: Zone) -> int:
        """Experiences kept per level of ``zone``."""
        c = self.config
        return c.golden_capacity_per_level if zone == "golden" else c.warning_capacity_per_level

    def stats(self) -> dict[str, float]:
        """Flat, JSON-ready counts (for a trainer's metrics)."""
        out: dict[str, float] = {
            "library/size": float(len(self)),
            "library/golden": float(len(self.experiences("golden"))),
            "library/warning": float(len(self.experiences("warning"))),
            "library/clusters": float(len(self._clusters)),
            "library/updates": float(self.updates),
        }
        for (zone, level), uids in self._levels.items():
            out[f"library/{zone}/{level}"] = float(len(uids))
        return out

    # -- admission ---------------------------------------------------------------------------

    def admit(
        self,
        content: str,
        zone: Zone,
        level: str,
        score: float,
        state_key: Hashable,
        task_id: str | None = None,
    ) -> Experience | None:
        """Offer one experience; returns it if admitted, None if merged or turned away.

        Merged: an experience of the same zone and state is too similar (module docstring);
        it keeps the higher of the two scores. Turned away: its level is full and it does not
        score strictly higher than the level's lowest, which it otherwise replaces.

        Raises:
            ValueError: an unknown zone or level, or a score that is not finite.
            TypeError: an unhashable ``state_key``.
        """
        if zone not in LEVELS or level not in LEVELS[zone]:
            raise ValueError(
                f"unknown zone/level {zone!r}/{level!r}; choose from "
                + ", ".join(f"{z}/{lv}" for z, lvs in LEVELS.items() for lv in lvs)
            )
        score = float(score)
        if not math.isfinite(score):
            raise ValueError(f"score must be finite, got {score}")
        hash(state_key)  # an unhashable key fails here, before anything changes
        content = describe_action(" ".join(str(content).split()), limit=MAX_CONTENT_CHARS - 3)
        cluster = self._clusters.get(state_key)
        if cluster is not None:
            for uid in getattr(cluster, zone):
                existing = self._by_uid[uid]
                if self._similar(content, existing.content):
                    existing.score = max(existing.score, score)
                    return None
        level_uids = self._levels[(zone, level)]
        if len(level_uids) >= self.capacity(zone):
            if not level_uids:
                return None  # a capacity of 0
            worst = min(level_uids, key=lambda u: (self._by_uid[u].score, u))
            if score <= self._by_uid[worst].score:
                return None
            self._remove(worst)
        exp = Experience(self._next_uid, content, zone, level, score, state_key, task_id)
        self._next_uid += 1
        self._insert(exp)
        return exp

    def _similar(self, a: str, b: str) -> bool:
        """The authors' novelty test: difflib ratio or word Jaccard above the threshold."""
        a, b = a.lower().strip(), b.lower().strip()
        threshold = self.config.similarity_threshold
        if SequenceMatcher(None, a[:300], b[:300]).ratio() > threshold:
            return True
        wa, wb = set(a.split()), set(b.split())
        return bool(wa and wb) and len(wa & wb) / len(wa | wb) > threshold

    def _insert(self, exp: Experience) -> None:
        self._by_uid[exp.uid] = exp
        self._levels[(exp.zone, exp.level)].append(exp.uid)
        getattr(self._clusters.setdefault(exp.state_key, _Cluster()), exp.zone).append(exp.uid)

    def _remove(self, uid: int) -> None:
        exp = self._by_uid.pop(uid)
        self._levels[(exp.zone, exp.level)].remove(uid)
        cluster = self._clusters[exp.state_key]
        getattr(cluster, exp.zone).remove(uid)
        if not cluster.golden and not cluster.warning:
            del self._clusters[exp.state_key]  # clusters live only while they hold experiences

    # -- evolution ---------------------------------------------------------------------------

    def update(self, trajectories: Iterable[Any]) -> dict[str, int]:
        """Evolve the library from a batch of finished trajectories; returns what changed.

        Each trajectory needs ``steps`` (each with ``state_key``, ``action``, ``reward``,
        ``action_valid`` and ``info``), and may have ``task_id`` and ``truncated`` (an
        :class:`agentgym.vector.Trajectory` has all). The env action shown in an experience is
        ``info["parsed_action"]`` when a parser recorded one, else the step's action; the
        reasoning read for ``example`` experiences is ``info["think"]``.

        Returns:
            ``strategies_added``, ``warnings_added``, ``merged_or_rejected`` (candidates not
            admitted, the rate limits aside), ``successes`` and ``failures`` (trajectories
            read).
        """
        c = self.config
        scored = [(float(sum(s.reward for s in t.steps)), i, t) for i, t in enumerate(trajectories)]
        scored = [x for x in scored if x[2].steps]
        wins = sorted(
            (x for x in scored if x[0] >= c.success_threshold), key=lambda x: (-x[0], x[1])
        )
        losses = sorted(
            (x for x in scored if x[0] < c.success_threshold), key=lambda x: (x[0], x[1])
        )
        wins, losses = wins[: c.top_k_trajectories], losses[: c.top_k_trajectories]
        out = dict.fromkeys(("strategies_added", "warnings_added", "merged_or_rejected"), 0)
        out["successes"], out["failures"] = len(wins), len(losses)
        for batch, zone, cap, key, extract in (
            (wins, "golden", c.max_strategies_per_update, "strategies_added", _strategies),
            (losses, "warning", c.max_warnings_per_update, "warnings_added", _warnings),
        ):
            for score, _, traj in batch:
                for content, level, value, state_key in extract(traj, score):
                    if out[key] >= cap:
                        break
                    task = getattr(traj, "task_id", None)
                    if self.admit(content, zone, level, value, state_key, task) is None:
                        out["merged_or_rejected"] += 1
                    else:
                        out[key] += 1
        self.updates += 1
        return out

    # -- retrieval ---------------------------------------------------------------------------

    def retrieve(self, state_key: Hashable, task_id: str | None = None) -> Retrieved:
        """The experiences for a step acting from ``state_key``: best (score, then age) first.

        Empty during the warmup (fewer than ``warmup_updates`` updates, or fewer than
        ``min_library_size`` experiences). The state's own cluster first; a state with none
        gets, with ``fallback``, the library's best for ``task_id`` (experiences of that task
        or of none). Counts a use of each experience returned.
        """
        c = self.config
        if self.updates < c.warmup_updates or len(self) < max(c.min_library_size, 1):
            return Retrieved()
        try:
            cluster = self._clusters.get(state_key)
        except TypeError:  # an unhashable key has no cluster
            cluster = None
        if cluster is not None:
            golden = self._best(self._by_uid[u] for u in cluster.golden)
            warning = self._best(self._by_uid[u] for u in cluster.warning)
        else:
            golden, warning = [], []
        if not golden and not warning and c.fallback:
            pool = [e for e in self._by_uid.values() if e.task_id in (None, task_id)]
            golden = self._best(e for e in pool if e.zone == "golden")
            warning = self._best(e for e in pool if e.zone == "warning")
        golden, warning = golden[: c.top_k_golden], warning[: c.top_k_warning]
        for exp in (*golden, *warning):
            exp.usage_count += 1
        return Retrieved(tuple(golden), tuple(warning))

    @staticmethod
    def _best(exps: Iterable[Experience]) -> list[Experience]:
        return sorted(exps, key=lambda e: (-e.score, e.uid))

    def hint(self, retrieved: Retrieved) -> str:
        """The prompt hint for ``retrieved`` ("" when empty), the authors' minimal style:

        ``[Tips: <first 100 chars of each golden>; ...]`` and ``[Avoid: <first 80 chars of
        the first warning>]`` on two lines, at most ``max_hint_chars`` long.
        """
        parts = []
        if retrieved.golden:
            parts.append("[Tips: " + "; ".join(e.content[:100] for e in retrieved.golden) + "]")
        if retrieved.warning:
            parts.append("[Avoid: " + retrieved.warning[0].content[:80] + "]")
        text = "\n".join(parts)
        limit = self.config.max_hint_chars
        return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."

    # -- persistence ------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the library as JSON, atomically (a reader sees the old file or the new one).

        Raises:
            TypeError: a ``state_key`` that is not str, bytes, int, float, bool, None or a
                tuple of them (nothing is written).
        """
        atomic_write_json(
            path,
            {
                "format": "agentgym-slea-library",
                "version": _FORMAT_VERSION,
                "config": asdict(self.config),
                "updates": self.updates,
                "next_uid": self._next_uid,
                "experiences": [
                    {**asdict(e), "state_key": _encode_key(e.state_key)}
                    for e in self._by_uid.values()
                ],
            },
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ExperienceLibrary:
        """Read a library :meth:`save` wrote; the same contents, scores, counts and ids.

        Raises:
            FileNotFoundError: no file at ``path``.
            ValueError: the file is not a saved library (the message says what is wrong).
        """
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} is not a saved experience library: {err}") from None
        if not isinstance(data, dict) or data.get("format") != "agentgym-slea-library":
            raise ValueError(f"{path} is not a saved experience library")
        if data.get("version") != _FORMAT_VERSION:
            raise ValueError(
                f"{path} is experience library format {data.get('version')!r}; this version "
                f"reads format {_FORMAT_VERSION}"
            )
        try:
            lib = cls(LibraryConfig(**data["config"]))
            lib.updates = int(data["updates"])
            for raw in data["experiences"]:
                exp = Experience(**{**raw, "state_key": _decode_key(raw["state_key"])})
                if exp.zone not in LEVELS or exp.level not in LEVELS[exp.zone]:
                    raise ValueError(f"unknown zone/level {exp.zone!r}/{exp.level!r}")
                if exp.uid in lib._by_uid:
                    raise ValueError(f"experience id {exp.uid} appears twice")
                lib._insert(exp)
            lib._next_uid = max(int(data["next_uid"]), max(lib._by_uid, default=-1) + 1)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path} holds a malformed experience library: {err}") from None
        return lib


# ---------------------------------------------------------------------------------------------
# Rule-based extraction (step-level)
# ---------------------------------------------------------------------------------------------


def _shown(step: Any) -> str:
    info = step.info if isinstance(step.info, dict) else {}
    action = info.get("parsed_action") or step.action
    return describe_action(action, limit=60)


def _strategies(traj: Any, score: float) -> list[tuple[str, str, float, Hashable]]:
    """(content, level, score, state_key) from a success, step by step."""
    steps = traj.steps
    actions = [_shown(s) for s in steps]
    out = []
    for t, step in enumerate(steps):
        if not step.action_valid:
            continue
        shown = actions[t : t + _SEQUENCE_SHOWN]
        text = "Action sequence that led to success from here: " + " -> ".join(shown)
        if len(steps) - t > _SEQUENCE_SHOWN:
            text += f" (and {len(steps) - t - _SEQUENCE_SHOWN} more steps)"
        out.append((text, "method", score, step.state_key))
        think = step.info.get("think") if isinstance(step.info, dict) else None
        if isinstance(think, str):
            for pattern in _DECISION_RE:
                for match in pattern.findall(think)[:2]:
                    if len(match) > 10:
                        out.append(
                            (
                                f"Key decision: {match.strip()}",
                                "example",
                                0.8 * score,
                                step.state_key,
                            )
                        )
    return out


def _warnings(traj: Any, score: float) -> list[tuple[str, str, float, Hashable]]:
    """(content, level, score, state_key) from a failure, at the state where each began."""
    steps = traj.steps
    actions = [_shown(s) for s in steps]
    first = max(len(steps) - 3, 0)
    out = [
        (
            "Avoid this action pattern: " + " -> ".join(actions[first:]),
            "mistake",
            abs(score),
            steps[first].state_key,
        )
    ]
    for i in range(len(steps) - 2):
        if actions[i] == actions[i + 1] == actions[i + 2]:
            out.append(
                (
                    f"Avoid repeating the same action '{actions[i]}' multiple times",
                    "pattern",
                    0.5,
                    steps[i].state_key,
                )
            )
            break
    invalid = next((s for s in steps if not s.action_valid), None)
    if invalid is not None:
        out.append(
            (
                "Avoid invalid actions - check available options first",
                "pattern",
                0.5,
                invalid.state_key,
            )
        )
    if getattr(traj, "truncated", False):
        diagnosis = "Task failed due to exceeding step limit - find more efficient paths"
    elif invalid is not None:
        diagnosis = "Task failed due to invalid actions - verify action validity before executing"
    else:
        diagnosis = "Task failed - review the approach and try alternative strategies"
    out.append((diagnosis, "diagnostic", 0.3, steps[0].state_key))
    return out


# ---------------------------------------------------------------------------------------------
# State keys in JSON
# ---------------------------------------------------------------------------------------------


def _encode_key(key: Hashable) -> Any:
    if key is None or isinstance(key, bool):
        return {"v": key}
    if isinstance(key, int):
        return {"int": str(key)}
    if isinstance(key, float):
        return {"float": repr(key)}
    if isinstance(key, str):
        return {"str": key}
    if isinstance(key, bytes):
        return {"bytes": base64.b64encode(key).decode("ascii")}
    if isinstance(key, tuple):
        return {"tuple": [_encode_key(k) for k in key]}
    raise TypeError(
        f"cannot save state_key {key!r} of type {type(key).__name__}: a saved library holds "
        "str, bytes, int, float, bool, None and tuples of them"
    )


def _decode_key(raw: Any) -> Hashable:
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ValueError(f"bad state_key encoding {raw!r}")
    ((kind, value),) = raw.items()
    if kind == "v" and (value is None or isinstance(value, bool)):
        return value
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "bytes":
        return base64.b64decode(value, validate=True)
    if kind == "tuple" and isinstance(value, list):
        return tuple(_decode_key(v) for v in value)
    raise ValueError(f"bad state_key encoding {raw!r}")


# ---------------------------------------------------------------------------------------------
# The prompt side
# ---------------------------------------------------------------------------------------------


class ExperiencePrompt(gym.Wrapper):
    """Put the library's experiences for the current state before every prompt.

    Wrap the env that renders prompts (``ExperiencePrompt(make_llm_env(env), library)``): on
    every reset and step the experiences for ``info["state_key"]`` (and ``info["task_id"]``)
    are retrieved and their hint, followed by a blank line, is put before the observation.
    A chat engine that prefers the authors' layout (the hint as its own system message) reads
    it from ``info["experience_hint"]`` and builds with ``prepend=False``, which leaves the
    observation alone. ``info["experience_uids"]`` lists what was retrieved.
    """

    def __init__(self, env: gym.Env, library: ExperienceLibrary, *, prepend: bool = True) -> None:
        super().__init__(env)
        self.library = library
        self.prepend = prepend
        base = getattr(env.observation_space, "max_length", None)
        if prepend and isinstance(base, int):
            self.observation_space = spaces.Text(
                max_length=base + library.config.max_hint_chars + 2,
                min_length=0,
                charset=TEXT_CHARSET,
            )

    def _augment(self, obs: Any, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        retrieved = self.library.retrieve(info.get("state_key"), info.get("task_id"))
        hint = self.library.hint(retrieved)
        info = dict(info)
        info["experience_hint"], info["experience_uids"] = hint, retrieved.uids
        if hint and self.prepend and isinstance(obs, str):
            obs = f"{hint}\n\n{obs}"
        return obs, info

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        return self._augment(*self.env.reset(seed=seed, options=options))

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        obs, info = self._augment(obs, info)
        return obs, reward, terminated, truncated, info
