"""The Sokoban text env: gym-sokoban's rules and rewards, verl-agent's text observation."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Hashable
from functools import lru_cache
from typing import Any, ClassVar, NamedTuple

import numpy as np

from agentgym.core import ProcessLocal, ResetOptionError, TextEnv, describe_action
from agentgym.envs.sokoban.cache import RoomCache, resolve_room_cache
from agentgym.envs.sokoban.generator import FLOOR, TARGET, WALL, Room, generate_room

__all__ = ["ACTIONS", "SokobanEnv", "check_room", "parse_room", "render_room_rgb"]

#: the four moves, in gym-sokoban's order (its actions 1..4)
ACTIONS: tuple[str, ...] = ("up", "down", "left", "right")
_ACTION_INDEX = {a: i for i, a in enumerate(ACTIONS)}
_LONGEST_ACTION = 64  # longer text cannot be a move once stripped: skip lowercasing 100 KB

# gym-sokoban's rewards
STEP_PENALTY = -0.1
BOX_ON_TARGET = 1.0
BOX_OFF_TARGET = -1.0
ALL_ON_TARGET = 10.0

#: verl-agent / RAGEN symbols
SYMBOLS = {
    "wall": "#",
    "floor": "_",
    "target": "O",
    "box": "X",
    "box_on_target": "√",
    "player": "P",
    "player_on_target": "S",
}
# glyph index: 0 wall, 1 floor, 2 target, 3 box on target, 4 box, 5 player, 6 player on target
# (gym-sokoban's room codes, plus RAGEN's 6 for the player on a target)
_GLYPH_ORDER = ("wall", "floor", "target", "box_on_target", "box", "player", "player_on_target")
#: how a cell is written: verl-agent writes " # \t" per cell, "compact" writes "#"
TEXT_FORMATS = {
    "verl-agent": tuple(f" {SYMBOLS[k]} \t" for k in _GLYPH_ORDER),
    "compact": tuple(SYMBOLS[k] for k in _GLYPH_ORDER),
}
_SYMBOL_TO_CELL = {  # symbol -> (fixed code, box, player)
    "#": (WALL, False, False),
    "_": (FLOOR, False, False),
    " ": (FLOOR, False, False),
    "O": (TARGET, False, False),
    "X": (FLOOR, True, False),
    "√": (TARGET, True, False),
    "P": (FLOOR, False, True),
    "S": (TARGET, False, True),
}

# split -> range of task seeds, so that train, valid and test rooms never coincide
# (verl-agent draws train seeds below 2**16 and validation seeds above)
_SPLIT_SEEDS = {"train": (0, 1 << 30), "valid": (1 << 30, 3 << 29), "test": (3 << 29, 1 << 31)}


def _make_tiles(size: int = 16) -> np.ndarray:
    """(7, size, size, 3) uint8 tile per glyph index: flat colours, numpy only."""
    t = np.zeros((7, size, size, 3), dtype=np.uint8)
    wall, floor = (90, 60, 50), (225, 215, 190)
    t[0] = wall
    t[0, :: size // 2, :] = (60, 40, 35)  # mortar lines
    t[1:] = floor
    a, b = size // 4, size - size // 4
    t[2, a:b, a:b] = (220, 60, 60)  # target: red square
    t[6, a:b, a:b] = (220, 60, 60)
    t[4, 2:-2, 2:-2] = (200, 140, 40)  # box: orange
    t[3, 2:-2, 2:-2] = (60, 170, 70)  # box on target: green
    yy, xx = np.mgrid[:size, :size]
    disc = (yy - (size - 1) / 2) ** 2 + (xx - (size - 1) / 2) ** 2 <= (size / 3) ** 2
    t[5][disc] = (50, 90, 210)  # player: blue disc
    t[6][disc] = (50, 90, 210)
    return t


_TILES = _make_tiles()


def render_room_rgb(codes: np.ndarray, tiles: np.ndarray = _TILES) -> np.ndarray:
    """(H*t, W*t, 3) uint8 image of an (H, W) array of glyph indices (gym-sokoban codes, 6 =
    player on target), one ``t x t`` tile per cell."""
    h, w = codes.shape
    t = tiles.shape[1]
    return tiles[codes].transpose(0, 2, 1, 3, 4).reshape(h * t, w * t, 3)


def parse_room(text: str) -> Room:
    """A :class:`Room` from a grid in the env's symbols (either text format).

    One row per line; cells are single characters (``"#_PX_#"``) or whitespace-separated
    tokens (verl-agent's ``" # \\t _ \\t"``). The room must be a rectangle enclosed by walls,
    with one player and as many boxes as targets (at least one). Raises ValueError otherwise.
    """
    rows = []
    for line in text.strip("\n").split("\n"):
        tokens = line.split()
        cells = tokens if len(tokens) > 1 else list(line.strip())
        if cells:
            rows.append(cells)
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError("a room is a non-empty rectangle of cells, one row per line")
    h, w = len(rows), len(rows[0])
    fixed = np.empty((h, w), dtype=np.uint8)
    boxes, players = [], []
    for r, row in enumerate(rows):
        for c, sym in enumerate(row):
            if sym not in _SYMBOL_TO_CELL:
                raise ValueError(f"unknown symbol {sym!r} at row {r}, column {c}")
            code, box, player = _SYMBOL_TO_CELL[sym]
            fixed[r, c] = code
            if box:
                boxes.append(r * w + c)
            if player:
                players.append(r * w + c)
    if len(players) != 1:
        raise ValueError(f"a room needs exactly one player (P or S), got {len(players)}")
    fixed.flags.writeable = False
    room = Room(fixed=fixed, player=players[0], boxes=tuple(sorted(boxes)), score=0)
    check_room(room)
    return room


def check_room(room: Room) -> None:
    """Raise ValueError unless ``room`` can be played: enclosed by walls, as many boxes as
    targets (at least one), player and boxes on distinct free cells."""
    fixed = room.fixed
    if fixed.ndim != 2 or min(fixed.shape) < 3:
        raise ValueError(f"a room is a 2-d grid of at least 3x3 cells, got shape {fixed.shape}")
    border = np.concatenate([fixed[0], fixed[-1], fixed[:, 0], fixed[:, -1]])
    if (border != WALL).any():
        raise ValueError("the room must be enclosed by walls (#) on every side")
    n_targets = int((fixed == TARGET).sum())
    if not room.boxes or len(room.boxes) != n_targets:
        raise ValueError(
            f"a room needs as many boxes as targets (>= 1); got {len(room.boxes)} box(es) "
            f"and {n_targets} target(s)"
        )
    cells = [room.player, *room.boxes]
    flat = fixed.reshape(-1)
    if len(set(cells)) != len(cells) or any(
        not 0 <= c < flat.size or flat[c] == WALL for c in cells
    ):
        raise ValueError("the player and the boxes must stand on distinct floor or target cells")


class _SokobanState(NamedTuple):
    """What a Sokoban step reads and changes (see ``SokobanEnv``'s snapshot paragraph)."""

    room: Room  # shared: immutable (read-only arrays, tuples)
    room_id: int
    task_id: str
    player: int
    boxes: tuple[int, ...]
    box_mask: bytes  # one byte per cell, 1 where a box stands
    on_target: int
    cells: tuple[str, ...]  # the observation's cells, so a restore need not redraw the grid
    tables: ProcessLocal  # the room's lookup tables (_ROOM_TABLES), reused in this process


#: the attributes ``_set_room`` derives from a room and the text format, never changed by a step
_ROOM_TABLES = (
    "_w",
    "_deltas",
    "_free",
    "_target",
    "_room_id",
    "_total_boxes",
    "_empty_glyph",
    "_box_glyph",
    "_player_glyph",
    "_text_pos",
)


@lru_cache(maxsize=4096)
def _generated_room(h: int, w: int, num_boxes: int, num_gen_steps: int | None, seed: int) -> Room:
    # Memoised: the envs of a rollout group reset to the same seed, so one generation serves
    # the whole group. Rooms are immutable (read-only arrays, tuples).
    return generate_room(np.random.default_rng(seed), (h, w), num_boxes, num_gen_steps)


class SokobanEnv(TextEnv):
    """Sokoban with gym-sokoban's rules and rewards and verl-agent's text observation.

    **Task.** A room of ``dim_room`` cells with ``num_boxes`` boxes and as many targets. By
    default rooms are generated at reset by our port of gym-sokoban's generator
    (:mod:`agentgym.envs.sokoban.generator`): task ``s`` is the room generated from
    ``numpy.random.default_rng(s)``; ``reset(seed=...)`` draws ``s`` from the env's seeded
    stream, ``options={"task": s}`` (an int, or a task id string) picks it, and
    ``options={"split": "train" | "valid" | "test"}`` draws ``s`` from disjoint ranges.
    With ``room_cache`` (an ``.npz`` path, a bundled cache's name such as ``"10x10-3box"``,
    or a :class:`~agentgym.envs.sokoban.cache.RoomCache`) task ``i`` is room ``i`` of the
    cache, drawn uniformly by ``reset`` (splits apply to generated rooms only). ``options={"room": text_or_Room}`` plays a given
    room (see :func:`parse_room`). Every room starts unsolved and is solvable.

    **Observation.** The grid, one row per line, in verl-agent's symbols: ``#`` wall, ``_``
    floor, ``O`` target, ``X`` box, ``√`` box on target, ``P`` player, ``S`` player on target.
    ``text_format="verl-agent"`` (default) writes each cell as verl-agent does
    (``" # \\t"``), ``"compact"`` as one character.

    **Actions.** ``up``, ``down``, ``left``, ``right``; case and surrounding whitespace are
    ignored. Moving into a box pushes it if the cell beyond is free. A move blocked by a wall,
    or a push blocked by a wall or another box, is a *valid* action that changes nothing
    (``action_valid=True``, ``action_effective=False``) and costs the step penalty, as in
    gym-sokoban: the action was understood and legal, the world just did not yield. Any other
    text is invalid: the observation says which actions exist, ``action_valid=False``, the
    state is unchanged, and the step still costs the step penalty (as verl-agent charges its
    invalid action).

    **Reward** (gym-sokoban's): -0.1 every step, +1 when a push puts a box on a target, -1 when
    it takes one off, +10 when every box is on a target, which terminates the episode
    (``won=True``). ``max_episode_steps`` truncates (None: no cap; the registered 6x6 id's is
    15, verl-agent's setting).

    **state_key** ``(room_id, player, *boxes)``: ints; ``room_id`` is a 64-bit hash of the
    fixed layout (walls and targets), ``player`` and the sorted ``boxes`` are flat cells
    ``row * width + col``. Equal exactly when the world is in the same state.

    **Info** also has ``action_effective`` (the player moved) and ``boxes_on_target``.
    ``score`` is the fraction of boxes on targets.

    **Snapshot** (:meth:`~agentgym.core.TextEnv.snapshot`): the player and box cells, the box
    mask and the observation's cells (copied: a few hundred bytes), with the :class:`Room` and
    its lookup tables shared by reference (they never change), so a restore onto another room
    assigns them; after pickling the tables are recomputed from the room once. Identity: ``dim_room``, ``num_boxes``,
    ``num_gen_steps``, the room cache's fingerprint, ``text_format`` and the step cap.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    family: ClassVar[str] = "sokoban"
    action_syntax: ClassVar[str] = "up, down, left or right: one push or move per step"
    reset_option_keys: ClassVar[frozenset[str]] = frozenset({"task", "split", "room"})
    #: what the board's symbols mean (``agentgym play`` shows it)
    legend: ClassVar[str] = ", ".join(f"{SYMBOLS[k]} {k.replace('_', ' ')}" for k in _GLYPH_ORDER)
    #: invalid actions cost the step penalty, as in verl-agent
    invalid_action_reward: ClassVar[float] = STEP_PENALTY

    def __init__(
        self,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        max_episode_steps: int | None = None,
        num_gen_steps: int | None = None,
        render_mode: str | None = None,
        room_cache: str | os.PathLike | RoomCache | None = None,
        text_format: str = "verl-agent",
    ):
        super().__init__(max_episode_steps=max_episode_steps, render_mode=render_mode)
        self.dim_room = (int(dim_room[0]), int(dim_room[1]))
        self.num_boxes = int(num_boxes)
        self.num_gen_steps = num_gen_steps
        if text_format not in TEXT_FORMATS:
            raise ValueError(f"text_format={text_format!r}; choose one of {sorted(TEXT_FORMATS)}")
        self.text_format = text_format
        self._glyphs = TEXT_FORMATS[text_format]
        self._cache: RoomCache | None = None
        self._cache_tag = ""
        if room_cache is not None:
            self._cache = resolve_room_cache(room_cache)
            if self._cache.dim != self.dim_room or self._cache.num_boxes != self.num_boxes:
                raise ValueError(
                    f"room cache holds {self._cache.dim[0]}x{self._cache.dim[1]} rooms with "
                    f"{self._cache.num_boxes} box(es), but the env was made with "
                    f"dim_room={self.dim_room}, num_boxes={self.num_boxes}; pass matching values"
                )
            self._cache_tag = f"c{self._cache.fingerprint}-"
        self._prefix = f"sokoban-{self.dim_room[0]}x{self.dim_room[1]}-{self.num_boxes}box-"
        # a room before the first reset, so that every attribute exists (pickling, render)
        if self._cache is not None:
            self._set_room(self._cache.room(0), f"{self._prefix}{self._cache_tag}0")
        else:
            first = _generated_room(*self.dim_room, self.num_boxes, num_gen_steps, 0)
            self._set_room(first, f"{self._prefix}0")

    # -- tasks -------------------------------------------------------------------------------
    def _task_index(self, task: Any, split: str | None) -> int:
        if isinstance(task, str) and not task.isdigit():
            expected = self._prefix + self._cache_tag
            if not task.startswith(expected) or not task[len(expected) :].isdigit():
                raise ResetOptionError(
                    f"task id {task!r} is not a task of this env (its ids look like {expected}<n>)"
                )
            task = task[len(expected) :]
        if isinstance(task, str):
            task = int(task)
        if isinstance(task, bool) or not isinstance(task, (int, np.integer)):
            raise ResetOptionError(
                f"options['task'] must be a task number or a task id, got {task!r:.60}"
            )
        index = int(task)
        if self._cache is not None:
            if not 0 <= index < len(self._cache):
                raise ResetOptionError(
                    f"task {index} is outside the room cache (0..{len(self._cache) - 1})"
                )
            return index
        low, high = _SPLIT_SEEDS[split] if split is not None else (0, _SPLIT_SEEDS["test"][1])
        if not low <= index < high:
            where = f"split {split!r}" if split is not None else "any split"
            raise ResetOptionError(f"task {index} is not a room of {where} ({low}..{high - 1})")
        return index

    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if "room" in options:
            room = options["room"]
            if isinstance(room, str):
                room = parse_room(room)
            elif isinstance(room, Room):
                check_room(room)
            else:
                raise ValueError(
                    f"options['room'] must be a grid string or a Room, got {room!r:.60}"
                )
            self._set_room(room, f"sokoban-custom-{self._room_hash(room.fixed):016x}")
        else:
            split = options.get("split")
            if split is not None and split not in _SPLIT_SEEDS:
                raise ResetOptionError(
                    f"unknown split {describe_action(split)!r}; choose one of {sorted(_SPLIT_SEEDS)}"
                )
            if "task" in options and options["task"] is not None:
                index = self._task_index(options["task"], split)
            elif self._cache is not None:
                index = int(self.np_random.integers(len(self._cache)))
            else:
                index = int(self.np_random.integers(*_SPLIT_SEEDS[split or "train"]))
            if self._cache is not None:
                room = self._cache.room(index)
            else:
                room = _generated_room(*self.dim_room, self.num_boxes, self.num_gen_steps, index)
            self._set_room(room, f"{self._prefix}{self._cache_tag}{index}")
        return self._grid(), self._info(True, False, False)

    @staticmethod
    def _room_hash(fixed: np.ndarray) -> int:
        h = hashlib.blake2b(digest_size=8)
        h.update(np.asarray(fixed.shape, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(fixed, dtype=np.uint8).tobytes())
        return int.from_bytes(h.digest(), "little")

    def _set_room(self, room: Room, task_id: str) -> None:
        """Precompute everything a step needs for ``room``: flat lookups and the text cells."""
        h, w = room.fixed.shape
        flat = room.fixed.reshape(-1)
        self.room = room
        self.task_id = task_id
        self._w = w
        self._deltas = (-w, w, -1, 1)
        self._free = (flat != WALL).tolist()
        self._target = (flat == TARGET).tolist()
        self._room_id = self._room_hash(room.fixed)
        self._box = bytearray(h * w)
        for b in room.boxes:
            self._box[b] = 1
        self._boxes = list(room.boxes)
        self._player = room.player
        self._total_boxes = len(room.boxes)
        self._on_target = sum(self._target[b] for b in room.boxes)
        # glyph of each cell when it is empty / holds a box / holds the player, so a step
        # rewrites two or three entries of the text and the observation is one join
        g = self._glyphs
        self._empty_glyph = [
            g[2] if t else g[1] if f else g[0]
            for t, f in zip(self._target, self._free, strict=True)
        ]
        self._box_glyph = [g[3] if t else g[4] for t in self._target]
        self._player_glyph = [g[6] if t else g[5] for t in self._target]
        # text: one list entry per cell plus a "\n" after every row but the last
        self._text_pos = [c + c // w for c in range(h * w)]
        cells: list[str] = []
        for r in range(h):
            cells.extend(self._glyph(r * w + c) for c in range(w))
            cells.append("\n")
        self._cells = cells[:-1]

    # -- dynamics ----------------------------------------------------------------------------
    def _glyph(self, cell: int) -> str:
        g = self._glyphs
        if cell == self._player:
            return g[6] if self._target[cell] else g[5]
        if self._box[cell]:
            return g[3] if self._target[cell] else g[4]
        if self._target[cell]:
            return g[2]
        return g[1] if self._free[cell] else g[0]

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        move = _ACTION_INDEX.get(action.strip().lower()) if len(action) <= _LONGEST_ACTION else None
        if move is None:
            obs = (
                f'Invalid action "{describe_action(action)}". '
                f"Valid actions: {', '.join(ACTIONS)}.\n{self._grid()}"
            )
            info = self._info(False, False, False)
            return obs, STEP_PENALTY, False, info
        d = self._deltas[move]
        p = self._player
        nxt = p + d
        reward = STEP_PENALTY
        moved = False
        # Rooms are enclosed by walls and the player stands inside, so nxt (and, when nxt is
        # free, nxt + d) are always inside the grid.
        if self._free[nxt]:
            box = self._box
            if not box[nxt]:
                moved = True
            else:
                beyond = nxt + d
                if self._free[beyond] and not box[beyond]:
                    moved = True
                    box[nxt], box[beyond] = 0, 1
                    boxes = self._boxes
                    boxes[boxes.index(nxt)] = beyond
                    if len(boxes) > 1:
                        boxes.sort()
                    change = self._target[beyond] - self._target[nxt]
                    if change:
                        self._on_target += change
                        reward += BOX_ON_TARGET if change > 0 else BOX_OFF_TARGET
                    self._cells[self._text_pos[beyond]] = self._box_glyph[beyond]
            if moved:
                self._player = nxt
                pos, cells = self._text_pos, self._cells
                cells[pos[p]] = self._empty_glyph[p]
                cells[pos[nxt]] = self._player_glyph[nxt]
        won = self._on_target == self._total_boxes
        if won:
            reward += ALL_ON_TARGET
        return "".join(self._cells), reward, won, self._info(True, moved, won)

    def state_key(self) -> Hashable:
        return (self._room_id, self._player, *self._boxes)

    # -- snapshot / restore --------------------------------------------------------------------
    def _snapshot_identity(self) -> Hashable:
        return (
            self.dim_room,
            self.num_boxes,
            self.num_gen_steps,
            self._cache_tag,
            self.text_format,
        )

    def _snapshot_state(self) -> _SokobanState:
        return _SokobanState(
            self.room,
            self._room_id,
            self.task_id,
            self._player,
            tuple(self._boxes),
            bytes(self._box),
            self._on_target,
            tuple(self._cells),
            ProcessLocal(tuple(getattr(self, name) for name in _ROOM_TABLES)),
        )

    def _restore_state(self, state: _SokobanState) -> None:
        if state.room_id != self._room_id or state.task_id != self.task_id:
            room, tables = state.room, state.tables.value
            if tables is not None:
                self.room, self.task_id = room, state.task_id
                for name, value in zip(_ROOM_TABLES, tables, strict=True):
                    setattr(self, name, value)
            else:
                if room.fixed.flags.writeable:  # unpickled: keep the layout read-only as ever
                    room.fixed.flags.writeable = False
                self._set_room(room, state.task_id)
        self._player = state.player
        self._boxes = list(state.boxes)
        self._box = bytearray(state.box_mask)
        self._on_target = state.on_target
        self._cells = list(state.cells)

    # -- text, info, render ------------------------------------------------------------------
    def _grid(self) -> str:
        return "".join(self._cells)

    def _info(self, valid: bool, moved: bool, won: bool) -> dict[str, Any]:
        return {
            "state_key": (self._room_id, self._player, *self._boxes),
            "task_id": self.task_id,
            "admissible_actions": list(ACTIONS),
            "action_valid": valid,
            "won": won,
            "score": self._on_target / self._total_boxes,
            "action_effective": moved,
            "boxes_on_target": self._on_target,
        }

    def state_codes(self) -> np.ndarray:
        """(H, W) uint8 glyph indices of the current state (gym-sokoban's ``room_state``
        codes, with 6 for the player on a target)."""
        codes = self.room.fixed.reshape(-1).copy()
        boxes = np.asarray(self._boxes)
        codes[boxes] = np.where(codes[boxes] == TARGET, 3, 4)
        codes[self._player] = 6 if self._target[self._player] else 5
        return codes.reshape(self.room.fixed.shape)

    def render(self) -> str | np.ndarray | None:
        """``"ansi"``: the observation text; ``"rgb_array"``: an (H*16, W*16, 3) uint8 image."""
        if self.render_mode == "rgb_array":
            return render_room_rgb(self.state_codes())
        return super().render()
