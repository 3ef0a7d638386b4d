"""SokobanEnv and its room generator: rules, rewards, state keys, text, caches, solvability."""

from __future__ import annotations

import pickle
from collections import deque

import gymnasium as gym
import numpy as np
import pytest

import agentgym  # noqa: F401 - registers the ids
from agentgym.core import InvalidAction
from agentgym.envs.sokoban import (
    ACTIONS,
    SokobanEnv,
    build_room_cache,
    generate_room,
    load_room_cache,
    parse_room,
)
from agentgym.envs.sokoban.cache import main as cache_main
from agentgym.envs.sokoban.generator import TARGET, WALL, reverse_play

ONE_BOX = """
#######
#P_XO_#
#######
"""
TWO_BOXES = """
########
#PXO__O#
#____X_#
########
"""
TARGET_TO_TARGET = """
#######
#P√OX_#
#######
"""
ON_TARGET = """
######
#PO__#
#_X__#
#_X_O#
######
"""
OPEN = """
######
#P___#
#____#
#_XO_#
######
"""


def compact_env(**kw) -> SokobanEnv:
    return SokobanEnv(text_format="compact", **kw)


def play(env: SokobanEnv, room: str, actions: list[str]):
    env.reset(seed=0, options={"room": room})
    return [env.step(a) for a in actions]


def solve(room_fixed: np.ndarray, player: int, boxes: tuple[int, ...]) -> list[str] | None:
    """Breadth-first search over (player, boxes) with the real push rules; the shortest plan."""
    h, w = room_fixed.shape
    flat = room_fixed.reshape(-1)
    targets = frozenset(np.flatnonzero(flat == TARGET).tolist())
    deltas = dict(zip(ACTIONS, (-w, w, -1, 1), strict=True))
    start = (player, frozenset(boxes))
    parent = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        p, bx = state
        if bx == targets:
            plan = []
            while parent[state] is not None:
                state, action = parent[state]
                plan.append(action)
            return plan[::-1]
        for action, d in deltas.items():
            nxt = p + d
            if flat[nxt] == WALL:
                continue
            nb = bx
            if nxt in bx:
                beyond = nxt + d
                if flat[beyond] == WALL or beyond in bx:
                    continue
                nb = (bx - {nxt}) | {beyond}
            child = (nxt, nb)
            if child not in parent:
                parent[child] = (state, action)
                queue.append(child)
    return None


# -- generator ---------------------------------------------------------------------------------
def test_same_seed_same_room_different_seeds_differ():
    rooms = [generate_room(np.random.default_rng(s)) for s in range(20)]
    again = [generate_room(np.random.default_rng(s)) for s in range(20)]
    for a, b in zip(rooms, again, strict=True):
        assert np.array_equal(a.fixed, b.fixed) and (a.player, a.boxes) == (b.player, b.boxes)
    distinct = {(r.fixed.tobytes(), r.player, r.boxes) for r in rooms}
    assert len(distinct) >= 15


@pytest.mark.parametrize(("dim", "num_boxes", "seeds"), [((6, 6), 1, 25), ((7, 7), 2, 6)])
def test_generated_rooms_are_unsolved_and_solvable(dim, num_boxes, seeds):
    for s in range(seeds):
        room = generate_room(np.random.default_rng(s), dim, num_boxes)
        flat = room.fixed.reshape(-1)
        assert room.fixed.shape == dim and len(room.boxes) == num_boxes and room.score > 0
        # walls all round, every target uncovered (no box, no player), as gym-sokoban's score
        assert (room.fixed[[0, -1]] == WALL).all() and (room.fixed[:, [0, -1]] == WALL).all()
        assert (flat == TARGET).sum() == num_boxes
        assert all(flat[b] != TARGET for b in room.boxes) and flat[room.player] != TARGET
        plan = solve(room.fixed, room.player, room.boxes)
        assert plan, f"seed {s}: generated room has no solution"
        # the env's own dynamics agree with the solver: replaying the plan wins
        env = SokobanEnv(dim_room=dim, num_boxes=num_boxes, max_episode_steps=None)
        env.reset(options={"room": room})
        for a in plan:
            obs, reward, terminated, truncated, info = env.step(a)
        assert terminated and info["won"] and info["score"] == 1.0


def _reference_reverse_playing(walls, targets, player, ttl=300, max_states=300_000):
    """gym-sokoban's reverse_playing written plainly over a whole-room array (slow), to pin
    down that the fast search returns exactly the same room."""
    h, w = walls.shape
    structure = np.where(walls, 0, 1).reshape(-1)
    structure[targets] = 2
    state = structure.copy()
    state[targets] = 4
    state[player] = 5
    mapping = {t: t for t in targets}
    explored, best = set(), [-1, None, None]

    def dfs(state, mapping, swaps, ttl):
        ttl -= 1
        if ttl <= 0 or len(explored) >= max_states:
            return
        key = state.tobytes()
        if key in explored:
            return
        disp = sum(abs(b // w - t // w) + abs(b % w - t % w) for t, b in mapping.items())
        score = swaps * disp if (state == 2).sum() == len(targets) else 0
        if score > best[0]:
            best[:] = [score, state, mapping]
        explored.add(key)
        for action in range(8):
            d = (-w, w, -1, 1)[action % 4]
            nxt_state, nxt_map, pulled = state.copy(), dict(mapping), False
            p = int(np.flatnonzero(state == 5)[0])
            if state[p + d] in (1, 2):
                nxt_state[p], nxt_state[p + d] = structure[p], 5
                if action < 4 and state[p - d] in (3, 4):
                    nxt_state[p], nxt_state[p - d] = 3, structure[p - d]
                    for k, v in nxt_map.items():
                        if v == p - d:
                            nxt_map[k], pulled = p, True
            dfs(nxt_state, nxt_map, swaps + pulled, ttl)

    dfs(state, mapping, 0, ttl)
    score, state, mapping = best
    return score, int(np.flatnonzero(state == 5)[0]), tuple(mapping[t] for t in targets)


def test_reverse_play_matches_reference_algorithm():
    from agentgym.envs.sokoban.generator import place_targets_and_player, room_topology

    rng = np.random.default_rng(123)
    checked = 0
    for dim, nb in [((6, 6), 1)] * 15 + [((7, 7), 2)] * 3:
        topo = room_topology(rng, dim, int(1.7 * sum(dim)))
        placed = place_targets_and_player(rng, topo, nb)
        if placed is None:
            continue
        player, targets = placed
        fast = reverse_play(topo == WALL, targets, player, max_states=2000)
        slow = _reference_reverse_playing(topo == WALL, targets, player, max_states=2000)
        assert fast == slow
        checked += 1
    assert checked >= 15


# -- env: rewards and rules --------------------------------------------------------------------
def test_push_onto_target_and_solve():
    env = compact_env()
    (o1, r1, t1, tr1, i1), (o2, r2, t2, tr2, i2) = play(env, ONE_BOX, ["right", "right"])
    assert r1 == pytest.approx(-0.1) and not t1 and i1["action_effective"]
    assert r2 == pytest.approx(-0.1 + 1 + 10) and t2 and not tr2
    assert i2["won"] and i2["score"] == 1.0
    assert o2.splitlines()[1] == "#__P√_#"


def test_box_on_and_off_targets():
    env = compact_env()
    steps = play(env, TWO_BOXES, ["right"] * 4)
    rewards = [s[1] for s in steps]
    assert rewards == pytest.approx([0.9, -1.1, -0.1, 0.9])  # on, off, floor, on again
    assert [s[4]["score"] for s in steps] == [0.5, 0.0, 0.0, 0.5]
    assert not any(s[2] for s in steps)  # one box still off its target


def test_target_to_target_and_blocked_push():
    env = compact_env()
    _, info0 = env.reset(options={"room": TARGET_TO_TARGET})
    assert info0["score"] == 0.5
    obs, r, term, _, info = env.step("right")  # box moves from a target onto a target
    assert r == pytest.approx(-0.1) and info["score"] == 0.5 and not term
    key = info["state_key"]
    obs2, r2, _, _, info2 = env.step("right")  # box pushed into the other box: blocked
    assert r2 == pytest.approx(-0.1)
    assert info2["action_valid"] and not info2["action_effective"]
    assert info2["state_key"] == key and obs2 == obs


def test_walls_block_but_cost_a_step():
    env = compact_env()
    obs, info = env.reset(options={"room": OPEN})
    for action in ("up", "left"):  # the player starts in the top-left corner
        obs2, r, _, _, info2 = env.step(action)
        assert r == pytest.approx(-0.1) and info2["action_valid"] and not info2["action_effective"]
        assert info2["state_key"] == info["state_key"] and obs2 == obs


@pytest.mark.parametrize("action", ["jump", "", "up!", "u p", "push up", "x" * 1000])
def test_invalid_actions_change_nothing(action):
    env = compact_env()
    obs, info = env.reset(options={"room": OPEN})
    obs2, r, term, trunc, info2 = env.step(action)
    assert info2["action_valid"] is False and info2["state_key"] == info["state_key"]
    assert "up, down, left, right" in obs2 and obs in obs2  # says what exists, shows the grid
    assert r == pytest.approx(-0.1) and not term and not trunc


@pytest.mark.parametrize("action", ["UP", " Down ", "\tleft\n", "RiGhT"])
def test_actions_ignore_case_and_whitespace(action):
    env = compact_env()
    env.reset(options={"room": OPEN})
    for a in ("right", "right", "down"):
        env.step(a)  # the player, on (2, 3), can now move every way
    _, _, _, _, info = env.step(action)
    assert info["action_valid"] and info["action_effective"]


def test_wrapper_invalid_action_is_not_a_move():
    env = compact_env()
    _, info = env.reset(options={"room": OPEN})
    _, _, _, _, info2 = env.step(InvalidAction("no <action> tag"))
    assert not info2["action_valid"] and info2["state_key"] == info["state_key"]


def test_truncation_at_15_steps():
    env = compact_env(max_episode_steps=15)  # the registered cap
    env.reset(options={"room": OPEN})
    for i in range(15):
        _, _, term, trunc, _ = env.step("up")  # blocked: the episode can only run out
        assert not term and trunc == (i == 14)
    assert env.elapsed_steps == 15


# -- state keys ------------------------------------------------------------------------------
def test_state_key_same_state_by_different_paths():
    env = compact_env(max_episode_steps=None)
    keys = {}
    for path in (["right", "down"], ["down", "right"], ["right", "right", "left", "down"]):
        _, info = env.reset(options={"room": OPEN})
        for a in path:
            _, _, _, _, info = env.step(a)
        keys[tuple(path)] = info["state_key"]
    assert len(set(keys.values())) == 1  # same world state, whatever path and step count
    # every other reachable position differs, and so does the same player with the box pushed
    _, info = env.reset(options={"room": OPEN})
    seen = {info["state_key"]}
    for a in ("right", "right", "down", "left", "left", "down"):
        _, _, _, _, info = env.step(a)
        seen.add(info["state_key"])
    assert len(seen) == 7 and keys[("right", "down")] in seen


def test_state_key_tracks_boxes_and_rooms():
    env = compact_env()
    _, info = env.reset(options={"room": TWO_BOXES})
    _, _, _, _, a = env.step("right")  # player on (1, 2), box on (1, 3)
    env.reset(options={"room": TWO_BOXES})
    env.step("right")
    env.step("right")
    _, _, _, _, b = env.step("left")  # player on (1, 2), box on (1, 4)
    assert a["state_key"][1] == b["state_key"][1] and a["state_key"] != b["state_key"]
    # the same positions in a different room never share a key
    other = TWO_BOXES.replace("#____X_#", "#____X##")
    _, c = env.reset(options={"room": other})
    assert c["state_key"][1:] == info["state_key"][1:] and c["state_key"] != info["state_key"]


def test_group_resets_share_state_keys_and_task_ids():
    a, b = SokobanEnv(), SokobanEnv()
    for seed in range(5):
        _, ia = a.reset(seed=seed)
        _, ib = b.reset(seed=seed)
        assert ia["state_key"] == ib["state_key"] and ia["task_id"] == ib["task_id"]


# -- tasks, text, render, pickle -------------------------------------------------------------
def test_seeded_resets_are_deterministic_and_unsolved():
    env, again = SokobanEnv(), SokobanEnv()
    tasks = set()
    for seed in range(30):
        obs, info = env.reset(seed=seed)
        assert (obs, info) == again.reset(seed=seed)
        assert not info["won"] and info["score"] == 0.0
        assert "√" not in obs and "S" not in obs and obs.count("P") == 1
        tasks.add(info["task_id"])
    assert len(tasks) == 30


def test_task_option_replays_a_task_by_id_or_number():
    env = SokobanEnv()
    obs, info = env.reset(seed=4)
    task_id = info["task_id"]
    assert task_id.startswith("sokoban-6x6-1box-")
    assert env.reset(options={"task": task_id})[0] == obs
    assert env.reset(options={"task": int(task_id.rsplit("-", 1)[1])})[0] == obs
    with pytest.raises(ValueError, match="not a task of this env"):
        env.reset(options={"task": "sokoban-8x8-2box-3"})
    _, valid = env.reset(seed=4, options={"split": "valid"})
    assert int(valid["task_id"].rsplit("-", 1)[1]) >= 1 << 30  # never a train seed


def test_text_formats():
    env = SokobanEnv()  # verl-agent's format: " # \t" per cell, one row per line
    obs, _ = env.reset(options={"room": ONE_BOX})
    lines = obs.split("\n")
    assert len(lines) == 3 and lines[1] == " # \t P \t _ \t X \t O \t _ \t # \t"
    assert parse_room(obs).boxes == parse_room(ONE_BOX).boxes  # both formats parse
    env = compact_env()
    obs, _ = env.reset(options={"room": OPEN})
    assert obs == OPEN.strip("\n")
    env.reset(options={"room": ON_TARGET})
    obs, *_ = env.step("right")  # the player steps onto a target
    assert obs.splitlines()[1] == "#_S__#"
    with pytest.raises(ValueError, match="enclosed"):
        parse_room("#######\n#P_XO__\n#######")


def test_rgb_array():
    env = SokobanEnv(render_mode="rgb_array")
    env.reset(options={"room": OPEN})
    img = env.render()
    assert img.shape == (5 * 16, 6 * 16, 3) and img.dtype == np.uint8
    env.step("right")
    assert not np.array_equal(env.render(), img)  # the player's tile moved
    assert SokobanEnv(render_mode="ansi").reset(seed=0)[0] is not None


def test_pickle_round_trip_keeps_the_episode():
    env = SokobanEnv()
    env.reset(seed=9)
    env.step("left")
    clone = pickle.loads(pickle.dumps(env))
    assert clone.state_key() == env.state_key() and clone.elapsed_steps == 1
    for a in ("up", "right", "down", "down"):
        assert env.step(a)[:4] == clone.step(a)[:4]


def test_registered_variants():
    env = gym.make("AgentGym/Sokoban-v0")
    obs, info = env.reset(seed=0)
    assert env.unwrapped.family == "sokoban" and len(obs.split("\n")) == 6
    assert info["task_id"].startswith("sokoban-6x6-1box-")


# -- room cache --------------------------------------------------------------------------------
def test_room_cache_round_trip(tmp_path):
    cache = build_room_cache((6, 6), 1, n=4, seed=3, progress=False)
    path = tmp_path / "rooms.npz"
    cache.save(path)
    loaded = load_room_cache(path)
    for name in ("fixed", "player", "boxes", "score"):
        assert np.array_equal(getattr(cache, name), getattr(loaded, name))
    # room i is the room the generator gives for rng([seed, i])
    room2 = generate_room(np.random.default_rng([3, 2]), (6, 6), 1)
    assert np.array_equal(loaded.fixed[2], room2.fixed) and loaded.player[2] == room2.player
    env = SokobanEnv(room_cache=path)
    _, info = env.reset(options={"task": 2})
    assert env.room.boxes == room2.boxes and info["task_id"].endswith("-2")
    assert env.reset(options={"task": info["task_id"]})[1]["state_key"] == info["state_key"]
    seen = {env.reset(seed=s)[1]["task_id"] for s in range(30)}
    assert len(seen) == 4  # seeded resets draw from the cache's rooms only
    with pytest.raises(ValueError, match="outside the room cache"):
        env.reset(options={"task": 4})
    with pytest.raises(ValueError, match="dim_room"):
        SokobanEnv(dim_room=(8, 8), room_cache=path)
    with pytest.raises(FileNotFoundError, match="agentgym.envs.sokoban.cache"):
        SokobanEnv(room_cache=tmp_path / "missing.npz")


def test_cache_cli(tmp_path):
    out = tmp_path / "cli.npz"
    cache_main(["--dim", "6", "6", "--boxes", "1", "--n", "3", "--seed", "3", "--out", str(out)])
    assert np.array_equal(
        load_room_cache(out).fixed, build_room_cache((6, 6), 1, 3, 3, progress=False).fixed
    )


def test_bundled_cache_is_the_generators_rooms():
    made = gym.make("AgentGym/Sokoban-10x10-3box-v0")
    env = made.unwrapped
    cache = env._cache
    assert len(cache) == 1000 and cache.dim == (10, 10) and cache.num_boxes == 3
    for i in (0, 999):
        room = generate_room(np.random.default_rng([cache.seed, i]), (10, 10), 3)
        assert np.array_equal(cache.fixed[i], room.fixed) and cache.room(i).boxes == room.boxes
    obs, info = env.reset(seed=0)
    assert info["score"] == 0.0 and len(obs.split("\n")) == 10 and made.spec.max_episode_steps == 50


@pytest.mark.parametrize(
    ("room", "match"),
    [
        ("#####\n#PXO#\n#_X_#\n#####", "as many boxes as targets"),
        ("#####\n#P_O#\n#####", "as many boxes as targets"),
        ("#####\n#PXO#\n#PXO#\n#####", "exactly one player"),
        ("#####\n#PXQ#\n#####", "unknown symbol"),
    ],
)
def test_bad_rooms_are_rejected_at_reset(room, match):
    with pytest.raises(ValueError, match=match):
        SokobanEnv().reset(options={"room": room})
