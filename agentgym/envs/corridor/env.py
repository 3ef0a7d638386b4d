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

    **Held-out layouts whose text never occurs in training** (``disjoint_splits=True``, needs
    the hint). Without it every split draws each room's right door from all the doors, so a
    held-out layout's room texts ("Room 1 of 3. Light comes through the red door.") are texts
    the training layouts show too: only the combination is new. With it, each room's doors are
    split in two halves, rotated by the room: in room ``r`` (from 0) the train layouts' right
    door is one of ``(r + j) % num_doors`` for ``j < num_doors // 2`` and the ``valid`` / ``test``
    layouts' one of the others, so every door is right somewhere in training but no (room,
    light) pair of a held-out layout is. The dead-end and invalid-action texts then end with
    the room's text too, so no observation of a held-out layout (after any actions) is an
    observation of a train layout (:meth:`split_texts` lists them). The one exception is an
    :class:`~agentgym.core.InvalidAction`, whose observation is the parser's own message.
    There are ``(num_doors // 2) ** length`` distinct train layouts and
    ``(num_doors - num_doors // 2) ** length`` held-out ones (layout ids beyond that repeat
    them); 4 doors give two of each per room.

    **Actions.** In a room: a door name (``red``, ``blue``...); the right one moves to the next
    room, the others to a dead end. In a dead end: ``back`` returns to the room. Anything else
    (unknown words, ``back`` in a room, a door in a dead end) is invalid: the state does not
    change, ``action_valid=False``, the step still counts. Matching is case- and
    whitespace-insensitive.

    **Reward.** ``goal_reward`` (10) on passing the last room's right door, which terminates
    the episode (``won=True``); minus ``step_cost`` (default 0) on every step. ``max_episode_steps`` caps the episode
    (None: no cap; the registered id's cap is ``2 * length + 4`` at the default length, enough to
    recover from two wrong turns).

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
        disjoint_splits: bool = False,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
    ):
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        if not 2 <= num_doors <= len(DOOR_NAMES):
            raise ValueError(f"num_doors must be in 2..{len(DOOR_NAMES)}, got {num_doors}")
        if num_layouts is not None and num_layouts < 1:
            raise ValueError(f"num_layouts must be >= 1 or None, got {num_layouts}")
        if disjoint_splits and not hint:
            raise ValueError(
                "disjoint_splits needs hint=True: without the hint a room's text does not "
                "depend on the layout, so held-out and train texts cannot differ"
            )
        super().__init__(max_episode_steps=max_episode_steps, render_mode=render_mode)
        self.length = length
        self.num_doors = num_doors
        self.hint = hint
        self.goal_reward = float(goal_reward)
        self.step_cost = float(step_cost)
        self.num_layouts = num_layouts
        self.list_doors = list_doors
        self.disjoint_splits = disjoint_splits
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
        if not self.disjoint_splits:
            return tuple(int(d) for d in rng.integers(self.num_doors, size=self.length))
        return tuple(
            self.split_doors(room, split)[int(i)]
            for room, i in enumerate(rng.integers(self._half(split), size=self.length))
        )

    def split_doors(self, room: int, split: str = "train") -> tuple[int, ...]:
        """The doors (indices into :attr:`doors`) that can be right in ``room`` (from 0) in a
        layout of ``split``: all of them, or with ``disjoint_splits`` the split's half."""
        if split not in _SPLIT_OFFSETS:
            raise ValueError(f"unknown split {split!r}; choose one of {sorted(_SPLIT_OFFSETS)}")
        if not self.disjoint_splits:
            return tuple(range(self.num_doors))
        k, half = self.num_doors, self.num_doors // 2
        shifts = range(half) if split == "train" else range(half, k)
        return tuple((room + j) % k for j in shifts)

    def _half(self, split: str) -> int:
        return self.num_doors // 2 if split == "train" else self.num_doors - self.num_doors // 2

    def split_texts(self, split: str = "train") -> set[str]:
        """Every observation a layout of ``split`` can show before the episode ends, except the
        echo of an invalid action's own text: each room's text (plain and after ``back``), its
        dead end, and with ``disjoint_splits`` the invalid-action texts' endings (which hold
        the room's text). What the held-out guarantee is checked on."""
        texts = set()
        for room in range(self.length):
            for door in self.split_doors(room, split):
                line = self._room_line(room, door)
                texts |= {line, f"You walk back. {line}", self._dead_end_text(room, door)}
        return texts

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
            text = self._dead_end_text(self._room, self._right[self._room])
            return text, reward, False, self._info(True)
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
            self.disjoint_splits,
        )

    def _snapshot_state(self) -> tuple:
        return (self._split, self._layout_id, self._right, self._room, self._dead_end)

    def _restore_state(self, state: tuple) -> None:
        self._split, self._layout_id, self._right, self._room, self._dead_end = state

    # -- text and info -----------------------------------------------------------------------
    def _room_text(self, prefix: str = "") -> str:
        text = self._room_line(self._room, self._right[self._room])
        return f"{prefix} {text}" if prefix else text

    def _room_line(self, room: int, right: int) -> str:
        text = f"Room {room + 1} of {self.length}."
        if self.list_doors:
            text += f" Doors: {self._door_list}."
        if self.hint:
            text += f" Light comes through the {self.doors[right]} door."
        return text

    def _dead_end_text(self, room: int, right: int) -> str:
        # With disjoint splits the room's text follows, so that no held-out observation is
        # one a train layout shows.
        if self.disjoint_splits:
            return f"Dead end. Say back. {self._room_line(room, right)}"
        return "Dead end. Say back."

    @property
    def invalid_action_reward(self) -> float:
        return -self.step_cost if self.step_cost else 0.0  # avoid a -0.0 reward

    def _invalid(self, action: str, allowed: list[str]) -> str:
        text = f"Invalid action {describe_action(action)!r}. Say one of: {', '.join(allowed)}."
        if self.disjoint_splits:  # where you still are, as above
            right = self._right[self._room]
            if self._dead_end:
                text += f" {self._dead_end_text(self._room, right)}"
            else:
                text += f" {self._room_line(self._room, right)}"
        return text

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
