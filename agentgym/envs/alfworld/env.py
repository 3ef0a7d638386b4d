"""The ALFWorld text env: alfworld's own games and text, on a fast simulator."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, ClassVar, NamedTuple

from agentgym.core import ResetOptionError, SnapshotMismatch, TextEnv
from agentgym.envs.alfworld.data import (
    SPLITS,
    DataNotFoundError,
    list_games,
    normalize_split,
    normalize_task_types,
    present_splits,
    resolve_data_root,
    task_type_of,
)
from agentgym.envs.alfworld.engine import FrozenWorld, Game, World, load_game

__all__ = ["ALFWorldEnv", "SplitNotFoundError", "success_by_task_type"]

_NO_DATA = (
    "ALFWorld data not found in {where} (looked for {split_dir}); set ALFWORLD_DATA to the folder "
    "holding json_2.1.1 (get it with `alfworld-download`, which fills ~/.cache/alfworld), or pass "
    "data_root=..., or use the built-in synthetic games: "
    "gym.make('AgentGym/ALFWorld-Synthetic-v0')"
)


class SplitNotFoundError(ResetOptionError, DataNotFoundError):
    """An ALFWorld split whose folder is absent while others are present: a
    :class:`~agentgym.core.ResetOptionError` when a reset option asked for it, and a
    ``FileNotFoundError`` for code that catches missing data. The message lists the splits
    present."""


class _ALFWorldState(NamedTuple):
    """What an ALFWorld step reads and changes (see ``ALFWorldEnv``'s snapshot paragraph)."""

    split: str
    task_id: str
    game_path: str
    game_digest: bytes  # the game's PDDL-problem digest: a restore refuses another game file
    world: FrozenWorld
    won: bool
    expert_plan: tuple[str, ...]


class ALFWorldEnv(TextEnv):
    """ALFWorld's TextWorld games (``AgentGym/ALFWorld-v0``), text-identical to alfworld.

    Every observation, admissible-command list, ``won`` and the step reward sign are those of
    alfworld's ``AlfredTWEnv`` in text mode (TextWorld's PDDL backend wrapped in alfworld's
    ``AlfredDemangler`` and ``AlfredInfos``) on the same game and commands: the first
    observation starts with ``-= Welcome to TextWorld, ALFRED! =-`` and ends with the task
    line; an action that is not admissible returns ``"Nothing happens."``. The simulator is
    our own (:mod:`.engine`), an order of magnitude faster per step and per reset, with parsed
    games shared by every env of a process.

    Args:
        data_root: folder holding ``json_2.1.1``; default ``$ALFWORLD_DATA``, then
            ``~/.cache/alfworld`` (where ``alfworld-download`` puts it).
        split: ``"train"`` (3553 games), ``"valid_seen"`` (140, in-distribution eval) or
            ``"valid_unseen"`` (134, out-of-distribution eval); ``"valid"`` means
            ``valid_seen`` and ``"test"`` means ``valid_unseen``. ``reset(options={"split":
            ...})`` switches split.
        task_types: subset of the six task types, by name or by alfworld's ids 1..6; None
            keeps all.
        max_episode_steps: step cap (truncation; None: none); the registered ids use 50, as
            verl-agent.
        reward_scale: the reward of the winning step (verl-agent's 10 x won); every other step
            gives 0. ``info["score"]`` is 1.0 once won, else 0.0 (alfworld's own score).
        expert: put ``info["expert_action"]`` (see :meth:`expert_action`) in every info:
            ``"oracle"`` (or True) for the fast scripted solver that reads the true facts,
            ``"planner"`` for Fast Downward's optimal plan (alfworld's ``expert_type: planner``;
            0.2-30 s per plan). Off by default, and never computed unless asked.
        synthetic: play the games the project generates itself
            (:func:`agentgym.envs.alfworld.synthetic.ensure_synthetic_data`) instead of real
            data; ``info["synthetic"]`` says which.

    Tasks: ``reset(seed=s)`` draws a game with ``self.np_random``; ``options={"task": i}``
    picks the i-th game of the split (sorted by task id), ``options={"task": task_id}`` a
    game by id, where ``task_id`` is ``<split>/<task folder>/<trial>``.

    Info keys beyond the contract: ``goal`` (the task sentence, e.g. ``"put a clean cloth in
    countertop."``), ``task_type``, ``gamefile``, ``synthetic``, ``goal_progress``,
    ``goal_facts_met`` and ``expert_action`` when ``expert=True``.

    ``goal_progress`` (float in [0, 1], exactly 1.0 iff won) is the fraction of the PDDL goal's
    facts that hold for the best choice of objects: "clean some cloth and put it in cabinet"
    is at 1/2 once a cloth is clean (or once a cloth is in a cabinet) and 1.0 when one clean
    cloth is in a cabinet; "find two X and put them in Y" is at 1/2 with one X in a Y. Type
    conditions count as given, so progress can start above 0 (a look-at task's lamp already
    stands on its table) and can drop (taking the one X out of a Y). ``goal_facts_met``
    (float in [0, 1], at least ``goal_progress``) scores each goal fact by whether *any*
    object meets it, so it rises when some X is cleaned even where a dirty X already in a Y
    holds ``goal_progress`` at 1/2. Together they are the ground truth of ALFWorld's rule judge
    (``agentgym.algorithms.judges.rule_judge("alfworld")``: a round scores 1 when it raised
    either); see ``World.goal_progress`` and ``World.goal_facts_met``.

    ``action_valid`` is whether the command (stripped, as TextWorld strips it) is admissible;
    only then does the world change.

    ``state_key`` is the set of true PDDL facts that can change and that something reads
    (agent location, object locations, inventory, opened, hot/cold/clean/sliced/toggled/on),
    as canonical bytes (a digest of the game's PDDL problem, then the sorted facts coded as
    uint16 predicate and object ranks): equal exactly when the game and those facts are equal,
    whatever the order of the actions that led there and whatever the text said. Facts nothing
    reads are left out (ALFWorld's ``checked``, set by look / examine / open), and so is
    TextWorld's memory of atoms made false (which only the "Next to it, you see" line reads):
    the same world can come with a different text. :meth:`describe_state` lists the facts.

    **Snapshot** (:meth:`~agentgym.core.TextEnv.snapshot`): the split, the game (by file and a
    digest of its PDDL problem; the parsed :class:`~.engine.Game` with its static facts, texts
    and compiled actions is shared by every env of the process and never copied), the true
    fluent facts and TextWorld's memory of facts made false (frozensets of small tuples),
    ``won`` and the planner's remaining plan. In-process, the admissible actions and fact
    indexes computed for that state come along, so the first step after a restore costs what
    any step costs; a pickled snapshot leaves them behind. Identity: the data folder, the task
    types, ``reward_scale``, ``expert``, ``synthetic`` and the step cap; a restore also checks
    the game's digest. Two states with equal ``state_key`` step alike (rewards, flags, state
    keys, admissible commands) but, as above, their text may differ.
    """

    family: ClassVar[str] = "alfworld"
    action_syntax: ClassVar[str] = (
        "a command as TextWorld writes it ('go to fridge 1', 'take apple 1 from countertop 1'); "
        "'help' lists the command forms"
    )

    def __init__(
        self,
        data_root: str | os.PathLike[str] | None = None,
        split: str = "train",
        task_types: Iterable[int | str] | None = None,
        max_episode_steps: int | None = None,
        reward_scale: float = 10.0,
        expert: bool | str = False,
        synthetic: bool = False,
        render_mode: str | None = None,
    ):
        super().__init__(max_episode_steps=max_episode_steps, render_mode=render_mode)
        self.synthetic = bool(synthetic)
        if self.synthetic and data_root is None:
            try:
                from agentgym.envs.alfworld.synthetic import ensure_synthetic_data
            except ImportError as exc:  # pragma: no cover - the generator ships with the package
                raise ImportError(
                    "the synthetic ALFWorld generator (agentgym.envs.alfworld.synthetic) is not "
                    f"available: {exc}"
                ) from exc
            data_root = ensure_synthetic_data()
        self.data_root = resolve_data_root(data_root)
        self.task_types = normalize_task_types(task_types)
        self.reward_scale = float(reward_scale)
        if expert is True:
            expert = "oracle"
        if expert not in (False, None, "oracle", "planner"):
            raise ValueError(f"expert={expert!r}: use False, True / 'oracle', or 'planner'")
        self.expert = expert or False
        self.split = normalize_split(split)
        if not present_splits(self.data_root):  # no data at all: say so now, not at reset
            raise DataNotFoundError(self._no_data_message(self.data_root / "json_2.1.1"))
        # games of self.split, listed on first use: a root holding only valid_seen serves
        # split="valid_seen" (or reset(options={"split": "valid_seen"})) without a train folder
        self._split_games: list[tuple[str, str]] | None = None
        self._task_id = ""
        self._game: Game | None = None
        self._world: World | None = None
        self._won = False
        self._expert_plan: list[str] = []  # remaining planner commands, valid while followed

    # -- tasks ----------------------------------------------------------------------------
    def _no_data_message(self, looked_for: Any) -> str:
        where = (
            f"$ALFWORLD_DATA ({self.data_root})"
            if os.environ.get("ALFWORLD_DATA")
            else str(self.data_root)
        )
        return _NO_DATA.format(where=where, split_dir=looked_for)

    @property
    def _games(self) -> list[tuple[str, str]]:
        """The games of the current split, loaded on first use."""
        if self._split_games is None:
            self._split_games = self._load_split(self.split)
        return self._split_games

    @_games.setter
    def _games(self, games: list[tuple[str, str]] | None) -> None:
        self._split_games = games

    def _load_split(self, split: str) -> list[tuple[str, str]]:
        try:
            games = list_games(self.data_root, split, self.task_types)
        except DataNotFoundError as exc:
            present = present_splits(self.data_root)
            if not present:
                raise DataNotFoundError(self._no_data_message(exc)) from None
            # no path in the message: a reset option may come from a remote client
            raise SplitNotFoundError(
                f"ALFWorld split {split!r} is not in the data folder; present: "
                f"{', '.join(present)} (unpack json_2.1.1/{split} beside them to play it)"
            ) from None
        if not games:
            raise DataNotFoundError(
                f"no playable ALFWorld games in split {split!r} for task types "
                f"{list(self.task_types)} (alfworld's filter keeps solvable games only)"
            )
        return games

    @property
    def num_tasks(self) -> int:
        """Playable games in the current split (after the task-type filter)."""
        return len(self._games)

    @property
    def task_ids(self) -> list[str]:
        return [tid for tid, _ in self._games]

    def _pick(self, task: Any) -> tuple[str, str]:
        if task is None:
            return self._games[int(self.np_random.integers(len(self._games)))]
        if (
            isinstance(task, bool)
            or not isinstance(task, str | int)
            and not hasattr(task, "__index__")
        ):
            raise ResetOptionError(
                f"options['task'] must be a game number or a task id, got {task!r:.60}"
            )
        if not isinstance(task, str):
            i = int(task)
            if not -len(self._games) <= i < len(self._games):
                raise ResetOptionError(f"task index {i} out of range for {len(self._games)} games")
            return self._games[i]
        for tid, path in self._games:
            if tid == task or path == task:
                return tid, path
        raise ResetOptionError(f"unknown ALFWorld task {task!r} in split {self.split}")

    # -- TextEnv hooks ----------------------------------------------------------------------
    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        split = options.get("split")
        task = options.get("task")
        if split is None and isinstance(task, str) and task.split("/", 1)[0] in SPLITS:
            split = task.split("/", 1)[0]  # a task id names its split
        if split is not None and normalize_split(split) != self.split:
            # pick from the other split first: a bad task leaves the env on its current split
            new_split = normalize_split(split)
            current = self.split, self._split_games  # may be unloaded: keep it so
            self.split, self._games = new_split, self._load_split(new_split)
            try:
                self._task_id, path = self._pick(task)
            except ResetOptionError:
                self.split, self._games = current
                raise
        else:
            self._task_id, path = self._pick(task)
        self._game = load_game(path)
        self._world = World(self._game)
        self._won = False
        self._expert_plan = []
        return self._world.intro(), self._info(True)

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        world = self._world
        if world is None:
            raise RuntimeError("call reset() before step()")
        feedback, changed = world.step(action)
        reward = 0.0
        if changed:
            self._advance_expert(action.strip())
            if world.won():
                self._won = True
                reward = self.reward_scale
        return feedback, reward, self._won, self._info(changed)

    def state_key(self) -> Hashable:
        """Canonical bytes of the true changeable facts (see the class docstring)."""
        if self._world is None:
            raise RuntimeError("call reset() before state_key()")
        return self._world.state_key()

    # -- snapshot / restore --------------------------------------------------------------------
    def _snapshot_identity(self) -> Hashable:
        return (
            str(self.data_root),
            tuple(self.task_types),
            self.reward_scale,
            self.expert,
            self.synthetic,
        )

    def _snapshot_state(self) -> _ALFWorldState:
        game, world = self._game, self._world
        return _ALFWorldState(
            self.split,
            self._task_id,
            game.path,
            game.key_prefix,
            world.freeze(),
            self._won,
            tuple(self._expert_plan),
        )

    def _restore_state(self, state: _ALFWorldState) -> None:
        game = self._game
        if game is None or game.path != state.game_path:
            try:
                game = load_game(state.game_path)
            except OSError as exc:
                raise SnapshotMismatch(
                    f"the snapshot's game {state.game_path} cannot be read here ({exc}); restore "
                    "it where the same ALFWorld data is"
                ) from exc
        if game.key_prefix != state.game_digest:
            raise SnapshotMismatch(
                f"the game file {state.game_path} differs from the one the snapshot was taken on"
            )
        games = self._games if state.split == self.split else self._load_split(state.split)
        world = self._world if self._world is not None and self._world.game is game else None
        world = world if world is not None else World(game)
        world.thaw(state.world)
        self.split, self._games = state.split, games
        self._task_id, self._game, self._world = state.task_id, game, world
        self._won = state.won
        self._expert_plan = list(state.expert_plan)

    def describe_state(self) -> list[str]:
        """The facts behind :meth:`state_key`, readable (``"holds(agent1, apple 1)"``), sorted."""
        if self._world is None:
            raise RuntimeError("call reset() before describe_state()")
        return self._world.describe()

    def _info(self, valid: bool) -> dict[str, Any]:
        game = self._game
        world = self._world
        info = {
            "state_key": world.state_key(),
            "task_id": self._task_id,
            "admissible_actions": list(world.admissible_commands()),
            "action_valid": valid,
            "won": self._won,
            "score": 1.0 if self._won else 0.0,
            "goal": game.goal_text,
            "task_type": task_type_of(self._task_id),
            "gamefile": game.path,
            "synthetic": self.synthetic,
            "goal_progress": world.goal_progress(),
            "goal_facts_met": world.goal_facts_met(),
        }
        if self.expert:
            info["expert_action"] = self.expert_action()
        return info

    # -- expert -----------------------------------------------------------------------------
    def expert_action(self, kind: str | None = None) -> str | None:
        """The expert's next command from the current state, or None when it has none.

        ``kind="oracle"`` (default, or the env's ``expert`` setting): a scripted solver that
        reads the true facts (finds an object of the goal's type, takes it, heats / cools /
        cleans it or switches the lamp on, puts it in place); milliseconds per call, wins
        every valid_seen game. ``kind="planner"``: the next command of Fast Downward's optimal
        plan (alfworld's ``expert_type: planner``), kept while the agent follows it and
        recomputed otherwise; 0.2-30 s per plan. Computed only when called.
        """
        if self._world is None:
            raise RuntimeError("call reset() before expert_action()")
        kind = kind or (self.expert if isinstance(self.expert, str) else "oracle")
        if self._won:
            return None
        if kind == "oracle":
            from agentgym.envs.alfworld.expert import oracle_action

            return oracle_action(self._world)
        if kind != "planner":
            raise ValueError(f"unknown expert kind {kind!r}: 'oracle' or 'planner'")
        admissible = self._world.operators()
        if not self._expert_plan or self._expert_plan[0] not in admissible:
            from agentgym.envs.alfworld.expert import plan_commands

            self._expert_plan = plan_commands(self._world)
        return self._expert_plan[0] if self._expert_plan else None

    def _advance_expert(self, command: str) -> None:
        if self._expert_plan and self._expert_plan[0] == command:
            self._expert_plan.pop(0)
        else:
            self._expert_plan = []

    # -- pickling: the game is shared and rebuilt from its file; the world state travels ----
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_game"] = None
        state["_world"] = self._world.dump() if self._world is not None else None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        world = state.pop("_world")
        self.__dict__.update(state)
        self._world = None
        if world is not None:
            path = dict(self._games).get(self._task_id)
            self._game = load_game(path)
            self._world = World(self._game)
            self._world.restore(world)


def success_by_task_type(
    records: Iterable[Any],
) -> dict[str, dict[str, float]]:
    """Success rate per ALFWorld task type, plus ``"all"``.

    ``records`` are episode results: :class:`agentgym.wrappers.group.Trajectory` objects
    (``won`` and the ``task_type`` of any step's info, or the task id), or final info dicts
    (``won`` and ``task_type`` / ``task_id``), or ``(task_type_or_task_id, won)`` pairs.
    Returns ``{task_type: {"success": rate, "episodes": n}}``, sorted by task type.
    """
    wins: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for rec in records:
        if isinstance(rec, tuple) and len(rec) == 2:
            key, won = rec
        elif isinstance(rec, Mapping):
            key, won = rec.get("task_type") or rec.get("task_id", ""), rec.get("won", False)
        else:
            key = ""
            steps = getattr(rec, "steps", None) or []
            for step in steps:
                key = step.info.get("task_type", "") if isinstance(step.info, Mapping) else ""
                if key:
                    break
            key = key or getattr(rec, "task_id", "")
            won = getattr(rec, "won", False)
        task_type = key if key in _TYPE_NAMES else task_type_of(key) if key else "unknown"
        for name in (task_type, "all"):
            wins[name][0] += bool(won)
            wins[name][1] += 1
    return {
        k: {"success": w / n if n else 0.0, "episodes": float(n)}
        for k, (w, n) in sorted(wins.items())
    }


_TYPE_NAMES = frozenset(normalize_task_types(None))
