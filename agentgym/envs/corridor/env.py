"""A corridor of rooms; a wrong door leads to a dead end that ``back`` recovers from.

Why this env exists: a trajectory can take a wrong turn and still win (it walks back out of the
dead end and carries on), so episode-level credit (GRPO) rewards the wrong turn together with
the rest of a winning trajectory. Step-level credit over the same anchor state (GiGPO) compares
the wrong door with the right one taken from the *same room* in other trajectories of the group,
and the wrong door's discounted return is lower (it costs two extra steps), so it is penalised.

Text is kept short and made of a few dozen distinct words so that tiny models can play it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import numpy as np

from agentgym.core import ResetOptionError, TextEnv, describe_action

#: Door names; each is one word, so a word-level tokenizer makes every action a single token.
DOOR_NAMES: tuple[str, ...] = ("red", "blue", "green", "gold", "gray", "pink")

BACK = "back"

#: Layout ids per split; layouts of different splits never share an id (so never a task_id).
_SPLIT_OFFSETS = {"train": 0, "valid": 1_000_000, "test": 2_000_000}


class CorridorEnv(TextEnv):
    """A corridor of ``length`` rooms, each with ``num_doors`` doors; one door leads on.

    **Task.** A layout fixes which door is right in each room. It is drawn from the layout id
    (``options={"task": int}``, or the reset seed), and a split (``options={"split": ...}``,
    default ``"train"``) offsets the ids so that train, valid and test layouts never coincide.
    With ``hint=True`` (default) each room's text says which door the light comes through, so
    a policy can solve any layout from the observation alone; with ``hint=False`` the right door
    must be found by trial (and remembered through the history). ``list_doors=False`` leaves
    the door list out of the room text (it stays in ``info["admissible_actions"]``): shorter
    prompts, and the hint is the only door word a tiny model reads.

    **Actions.** In a room: a door name (``red``, ``blue``...); the right one moves to the next
    room, the others to a dead end. In a dead end: ``back`` returns to the room. Anything else
    (unknown words, ``back`` in a room, a door in a dead end) is invalid: the state does not
    change, ``action_valid=False``, the step still counts. Matching is case- and
    whitespace-insensitive.

    **Reward.** ``goal_reward`` (10) on passing the last room's right door, which terminates
    the episode (``won=True``); minus ``step_cost`` (default 0) on every step. The step cap
    ``max_episode_steps`` defaults to ``2 * length + 4``: enough to recover from two wrong turns.

    **state_key** ``(layout_id, split, room, in_dead_end)``: the room index and whether the agent
    stands in that room's dead end; all wrong doors of a room lead to the same dead end.

    Info also has ``task_type`` (``"corridor"``), ``room`` and ``layout``.

    **Snapshot** (:meth:`~agentgym.core.TextEnv.snapshot`): the split, layout, its right doors
    (an immutable tuple, shared), the room and the dead-end flag. Identity: every constructor
    argument that changes the task or its text.
    """

    family: ClassVar[str] = "corridor"
    action_syntax: ClassVar[str] = "a door's name to go through it, or back from a dead end"

    def __init__(
        self,
        length: int = 4,
        num_doors: int = 3,
        hint: bool = True,
        goal_reward: float = 10.0,
        step_cost: float = 0.0,
        num_layouts: int | None = None,
        list_doors: bool = True,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
    ):
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        if not 2 <= num_doors <= len(DOOR_NAMES):
            raise ValueError(f"num_doors must be in 2..{len(DOOR_NAMES)}, got {num_doors}")
        if num_layouts is not None and num_layouts < 1:
            raise ValueError(f"num_layouts must be >= 1 or None, got {num_layouts}")
        super().__init__(
            max_episode_steps=2 * length + 4 if max_episode_steps is None else max_episode_steps,
            render_mode=render_mode,
        )
        self.length = length
        self.num_doors = num_doors
        self.hint = hint
        self.goal_reward = float(goal_reward)
        self.step_cost = float(step_cost)
        self.num_layouts = num_layouts
        self.list_doors = list_doors
        self.doors: tuple[str, ...] = DOOR_NAMES[:num_doors]
        self._door_list = ", ".join(self.doors)
        self._split = "train"
        self._layout_id = 0
        self._right: tuple[int, ...] = ()
        self._room = 0
        self._dead_end = False

    # -- tasks -------------------------------------------------------------------------------
    def layout(self, layout_id: int, split: str = "train") -> tuple[int, ...]:
        """The right door (index into :attr:`doors`) of each room of a layout; deterministic."""
        rng = np.random.default_rng(_SPLIT_OFFSETS[split] + layout_id)
        return tuple(int(d) for d in rng.integers(self.num_doors, size=self.length))

    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        split = options.get("split")
        task = options.get("task")
        if isinstance(task, str):  # a task id, "corridor-<split>-<layout>", names its split
            parts = task.split("-")
            if len(parts) != 3 or parts[0] != "corridor" or not parts[2].isdigit():
                raise ResetOptionError(
                    f"task id {task!r} is not a corridor task (ids look like corridor-train-5)"
                )
            if split is not None and split != parts[1]:
                raise ResetOptionError(f"task id {task!r} is not in split {split!r}")
            split, task = parts[1], int(parts[2])
        split = "train" if split is None else split
        if split not in _SPLIT_OFFSETS:
            raise ResetOptionError(
                f"unknown split {describe_action(split)!r}; choose one of {sorted(_SPLIT_OFFSETS)}"
            )
        if task is None:
            high = self.num_layouts if self.num_layouts is not None else 1_000_000
            layout_id = int(self.np_random.integers(high))
        elif isinstance(task, (int, np.integer)) and not isinstance(task, bool):
            layout_id = int(task)
            if not 0 <= layout_id < 1_000_000:
                raise ResetOptionError(f"task {layout_id}: layout numbers are 0..999999")
        else:
            raise ResetOptionError(
                f"options['task'] must be a layout number or a task id, got {task!r:.60}"
            )
        self._split, self._layout_id = split, layout_id
        self._right = self.layout(layout_id, split)
        self._room, self._dead_end = 0, False
        return self._room_text(), self._info(True)

    # -- dynamics ----------------------------------------------------------------------------
    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        word = " ".join(action.lower().split())
        reward = self.invalid_action_reward  # every step, valid or not, pays the step cost
        if self._dead_end:
            if word != BACK:
                return self._invalid(action, [BACK]), reward, False, self._info(False)
            self._dead_end = False
            return self._room_text("You walk back."), reward, False, self._info(True)
        if word not in self.doors:
            return self._invalid(action, list(self.doors)), reward, False, self._info(False)
        if self.doors.index(word) != self._right[self._room]:
            self._dead_end = True
            return "Dead end. Say back.", reward, False, self._info(True)
        self._room += 1
        if self._room == self.length:
            return "You reach the goal!", reward + self.goal_reward, True, self._info(True)
        return self._room_text(), reward, False, self._info(True)

    def state_key(self) -> Hashable:
        return (self._layout_id, self._split, self._room, self._dead_end)

    # -- snapshot / restore --------------------------------------------------------------------
    def _snapshot_identity(self) -> Hashable:
        return (
            self.length,
            self.num_doors,
            self.hint,
            self.goal_reward,
            self.step_cost,
            self.num_layouts,
            self.list_doors,
        )

    def _snapshot_state(self) -> tuple:
        return (self._split, self._layout_id, self._right, self._room, self._dead_end)

    def _restore_state(self, state: tuple) -> None:
        self._split, self._layout_id, self._right, self._room, self._dead_end = state

    # -- text and info -----------------------------------------------------------------------
    def _room_text(self, prefix: str = "") -> str:
        text = f"Room {self._room + 1} of {self.length}."
        if self.list_doors:
            text += f" Doors: {self._door_list}."
        if self.hint:
            text += f" Light comes through the {self.doors[self._right[self._room]]} door."
        return f"{prefix} {text}" if prefix else text

    @property
    def invalid_action_reward(self) -> float:
        return -self.step_cost if self.step_cost else 0.0  # avoid a -0.0 reward

    def _invalid(self, action: str, allowed: list[str]) -> str:
        return f"Invalid action {describe_action(action)!r}. Say one of: {', '.join(allowed)}."

    def _info(self, valid: bool) -> dict[str, Any]:
        won = self._room == self.length
        if won:
            admissible: list[str] = []
        elif self._dead_end:
            admissible = [BACK]
        else:
            admissible = list(self.doors)
        return {
            "state_key": self.state_key(),
            "task_id": f"corridor-{self._split}-{self._layout_id}",
            "admissible_actions": admissible,
            "action_valid": valid,
            "won": won,
            "score": 1.0 if won else self._room / self.length,
            "task_type": "corridor",
            "room": self._room,
            "layout": self._layout_id,
        }
