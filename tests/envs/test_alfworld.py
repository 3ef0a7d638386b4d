"""ALFWorld on the real game files: parity with stock alfworld, state keys, data, errors.

The real-data tests read the archives in ../shared/data/alfworld (or $AGENTGYM_SHARED_DATA),
unpack what they need into pytest's tmp dir, and skip cleanly when the archives are absent.
Tests on the synthetic games live in test_alfworld_synthetic.py.
"""

from __future__ import annotations

import os
import pickle
import random
import tarfile
from pathlib import Path

import gymnasium as gym
import pytest

import agentgym  # noqa: F401 - registers the ids
from agentgym.core import InvalidAction, ResetOptionError
from agentgym.envs.alfworld import (
    TASK_TYPES,
    ALFWorldEnv,
    DataNotFoundError,
    data_status,
    list_games,
    success_by_task_type,
)
from agentgym.envs.alfworld.data import _MEMORY
from agentgym.envs.alfworld.engine import World, demangle_names, load_game
from agentgym.envs.alfworld.expert import oracle_action

pytest.importorskip("textworld")
pytest.importorskip("alfworld")

SHARED = Path(
    os.environ.get(
        "AGENTGYM_SHARED_DATA", Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    )
)
ARCHIVES = SHARED / "alfworld"
VALID_SEEN = ARCHIVES / "json_2.1.1-valid_seen.tar.xz"
TRAIN = ARCHIVES / "json_2.1.1-train.tar.xz"
VALID_TRAIN = ARCHIVES / "json_2.1.1-valid_train.tar.xz"
VALID_UNSEEN = ARCHIVES / "json_2.1.1-valid_unseen.tar.xz"
GAME = "game.tw-pddl"


def _need(archive: Path) -> None:
    if not archive.is_file():
        pytest.skip(f"ALFWorld archive {archive} absent")


@pytest.fixture(scope="session")
def real_root(alfworld_real_root) -> Path:
    """All of valid_seen and the first few playable train games (tests/conftest.py)."""
    return alfworld_real_root


def _games(root: Path, split: str) -> list[tuple[str, str]]:
    try:
        return list_games(root, split)
    except DataNotFoundError:
        pytest.skip(f"no {split} games unpacked")


def _one_per_task_type(root: Path) -> list[tuple[str, str]]:
    games = _games(root, "valid_seen")
    picked = {}
    for tid, path in games[3::7]:  # spread over the split, deterministic
        picked.setdefault(tid.split("/")[1].split("-")[0], (tid, path))
    assert set(picked) == set(TASK_TYPES.values())
    return sorted(picked.values())


# ---------------------------------------------------------------------------------------------
# Parity with stock alfworld
# ---------------------------------------------------------------------------------------------
def _play_both(root: Path, task_id: str, path: str, seed: int, n_steps: int) -> tuple[int, bool]:
    """Play one action sequence through stock alfworld and our env, compare every step.

    Actions: the oracle's (reaches the goal) 75% of the time, a random admissible command 15%,
    an inadmissible one 10% (checks "Nothing happens." and that the state is unchanged).
    """
    from agentgym.envs.alfworld.reference import StockALFWorld

    split = task_id.split("/")[0]
    stock = StockALFWorld(path)
    ours = ALFWorldEnv(data_root=root, split=split, max_episode_steps=None)
    s_obs, s_info = stock.reset()
    obs, info = ours.reset(options={"task": task_id})
    assert obs == s_obs
    assert info["admissible_actions"] == s_info["admissible_commands"]
    rng = random.Random(seed)
    garbage = ["put nothing in/on nowhere 1", "Go to bed 1", "look around", "", "take"]
    won = False
    for step in range(n_steps):
        r = rng.random()
        if r < 0.75:
            action = ours.expert_action("oracle") or "look"
        elif r < 0.9:
            action = rng.choice(info["admissible_actions"])
        else:
            action = rng.choice(garbage)
        before = info["admissible_actions"]
        s_obs, s_score, s_done, s_info = stock.step(action)
        obs, reward, terminated, truncated, info = ours.step(action)
        where = f"{task_id} step {step} action {action!r}"
        assert obs == s_obs, where
        assert info["admissible_actions"] == s_info["admissible_commands"], where
        assert info["won"] == s_info["won"], where
        assert terminated == s_done, where
        assert reward == (10.0 if s_info["won"] and not won else 0.0), where
        assert info["action_valid"] == (action.strip() in before), where
        assert info["action_valid"] or obs == "Nothing happens.", where
        won = s_info["won"]
        if terminated:
            break
    stock.close()
    return step + 1, won


@pytest.mark.realdata
def test_parity_with_stock_valid_seen(real_root):
    wins = 0
    for i, (tid, path) in enumerate(_one_per_task_type(real_root)):
        _, won = _play_both(real_root, tid, path, seed=i, n_steps=20)
        wins += won
    assert wins >= 3, "the oracle-led sequences should reach the goal in most games"


@pytest.mark.realdata
def test_parity_with_stock_train(real_root):
    tid, path = _games(real_root, "train")[0]
    _play_both(real_root, tid, path, seed=100, n_steps=15)


@pytest.mark.realdata
@pytest.mark.slow
def test_parity_with_stock_sweep(real_root):
    """More games and longer sequences (a few minutes)."""
    games = _games(real_root, "valid_seen")[::7] + _games(real_root, "train")
    for i, (tid, path) in enumerate(games):
        _play_both(real_root, tid, path, seed=1000 + i, n_steps=40)


@pytest.mark.realdata
def test_parity_random_walk_long(real_root):
    """A long random walk (no goal-seeking) on one game: lists, 'Next to it', open/close."""
    tid, path = _games(real_root, "valid_seen")[17]
    from agentgym.envs.alfworld.reference import StockALFWorld

    stock = StockALFWorld(path)
    ours = ALFWorldEnv(data_root=real_root, split="valid_seen", max_episode_steps=None)
    s_obs, s_info = stock.reset()
    obs, info = ours.reset(options={"task": tid})
    rng = random.Random(7)
    for _ in range(25):
        action = rng.choice(info["admissible_actions"])
        s_obs, _, _, s_info = stock.step(action)
        obs, _, _, _, info = ours.step(action)
        assert (obs, info["admissible_actions"]) == (s_obs, s_info["admissible_commands"])


# ---------------------------------------------------------------------------------------------
# state_key
# ---------------------------------------------------------------------------------------------
def _env(root: Path, task_index: int = 0) -> tuple[ALFWorldEnv, str, dict]:
    env = ALFWorldEnv(data_root=root, split="valid_seen", max_episode_steps=None)
    obs, info = env.reset(options={"task": task_index})
    return env, obs, info


def _do(env: ALFWorldEnv, action: str) -> tuple[str, dict]:
    obs, _, _, _, info = env.step(action)
    assert info["action_valid"], (action, obs)
    return obs, info


@pytest.mark.realdata
def test_state_key_same_text_different_world(real_root):
    env, _, info = _env(real_root, 20)
    # "Nothing happens." with empty hands, then with an object in hand
    obs0, _, _, _, i0 = env.step("do a barrel roll")
    assert obs0 == "Nothing happens." and not i0["action_valid"]
    assert i0["state_key"] == info["state_key"]  # an invalid action changes nothing
    while not env.unwrapped._world.facts.get("holds"):
        _do(env, env.expert_action("oracle"))
    obs1, _, _, _, i1 = env.step("do a barrel roll")
    assert obs1 == obs0 and i1["state_key"] != i0["state_key"]

    # the same "look" text at one place, with and without the object in hand
    env2, _, info2 = _env(real_root, 20)
    place = next(a for a in info2["admissible_actions"] if a.startswith("go to"))
    _do(env2, place)
    look_empty, i_empty = _do(env2, "look")
    while not env2.unwrapped._world.facts.get("holds"):
        _do(env2, env2.expert_action("oracle"))
    _do(env2, place)
    look_full, i_full = _do(env2, "look")
    assert look_full == look_empty
    assert i_full["state_key"] != i_empty["state_key"]


@pytest.mark.realdata
def test_state_key_same_world_different_order(real_root):
    # a game with two openable receptacles
    for index in range(len(_games(real_root, "valid_seen"))):
        env, _, info = _env(real_root, index)
        openable = []
        for go in (a for a in info["admissible_actions"] if a.startswith("go to ")):
            env.reset(options={"task": index})
            _, i = _do(env, go)
            name = go.removeprefix("go to ")
            if f"open {name}" in i["admissible_actions"]:
                openable.append(name)
            if len(openable) == 2:
                break
        if len(openable) == 2:
            break
    else:
        pytest.skip("no game with two openable receptacles")
    a, b = openable
    home = next(
        x for x in info["admissible_actions"] if x.startswith("go to ") and x[6:] not in (a, b)
    )

    def run(order):
        env.reset(options={"task": index})
        keys = []
        for name in order:
            _do(env, f"go to {name}")
            _, i = _do(env, f"open {name}")
            keys.append(i["state_key"])
        _, i = _do(env, home)
        return keys, i["state_key"]

    keys_ab, final_ab = run([a, b])
    facts_ab = env.describe_state()
    keys_ba, final_ba = run([b, a])
    assert final_ab == final_ba and env.describe_state() == facts_ab
    assert f"opened({a})" in facts_ab and f"opened({b})" in facts_ab
    assert keys_ab[0] != keys_ba[0]  # only one of the two open: different worlds
    # examining, looking and the inventory are bookkeeping: the key does not move
    _, i = _do(env, "inventory")
    assert i["state_key"] == final_ab
    _, i = _do(env, "look")
    assert i["state_key"] == final_ab
    # same world, whichever path: re-visiting does not change it either
    _do(env, f"go to {a}")
    _, i = _do(env, home)
    assert i["state_key"] == final_ab
    assert isinstance(final_ab, bytes) and hash(final_ab) is not None


# ---------------------------------------------------------------------------------------------
# data, errors, API
# ---------------------------------------------------------------------------------------------
@pytest.mark.realdata
def test_game_counts_small_splits(real_root, tmp_path):
    assert len(list_games(real_root, "valid_seen")) == 140
    assert len(list_games(real_root, "valid", task_types=None)) == 140
    counts = {t: len(list_games(real_root, "valid_seen", [t])) for t in TASK_TYPES}
    assert sum(counts.values()) == 140 and all(counts.values())
    _need(VALID_TRAIN)
    with tarfile.open(VALID_TRAIN, "r:xz") as tar:
        tar.extractall(tmp_path, filter="data")
    assert len(list_games(tmp_path, "valid_train")) == 199
    line = data_status(real_root)
    assert "valid_seen 140" in line and "valid_unseen absent" in line


@pytest.mark.realdata
def test_game_count_valid_unseen(tmp_path):
    _need(VALID_UNSEEN)
    with tarfile.open(VALID_UNSEEN, "r:xz") as tar:
        tar.extractall(tmp_path, filter="data")
    assert len(list_games(tmp_path, "valid_unseen")) == 134
    assert len(list_games(tmp_path, "test")) == 134


@pytest.mark.realdata
def test_game_count_train(tmp_path):  # ~10 s: unpacks the whole train archive
    _need(TRAIN)
    with tarfile.open(TRAIN, "r:xz") as tar:
        tar.extractall(tmp_path, filter="data")
    assert len(list_games(tmp_path, "train")) == 3553
    _MEMORY.clear()  # second listing comes from the on-disk index, same answer
    assert len(list_games(tmp_path, "train")) == 3553


def test_no_data_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataNotFoundError) as err:
        gym.make("AgentGym/ALFWorld-v0")
    msg = str(err.value)
    assert "ALFWORLD_DATA" in msg and "json_2.1.1" in msg and "alfworld-download" in msg
    assert "AgentGym/ALFWorld-Synthetic-v0" in msg
    assert "valid_seen absent" in data_status()


@pytest.fixture(scope="module")
def valid_seen_only(tmp_path_factory) -> Path:
    """A data root holding only json_2.1.1/valid_seen, as unpacked from its archive."""
    _need(VALID_SEEN)
    root = tmp_path_factory.mktemp("valid_seen_only")
    with tarfile.open(VALID_SEEN, "r:xz") as tar:
        tar.extractall(root, filter="data")
    return root


@pytest.mark.realdata
def test_a_root_with_only_valid_seen_plays_valid_seen(valid_seen_only, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(valid_seen_only))
    # the split asked for, through the constructor and through a reset option
    env = ALFWorldEnv(split="valid_seen")
    obs, info = env.reset(seed=0)
    assert info["task_id"].startswith("valid_seen/") and env.num_tasks == 140
    env = gym.make("AgentGym/ALFWorld-v0")  # default split train is absent: still constructs
    obs, info = env.reset(seed=0, options={"split": "valid_seen"})
    assert info["task_id"].startswith("valid_seen/") and "-= Welcome to TextWorld" in obs
    # an absent split says which splits are here, and names no path
    for split in ("train", "valid_unseen"):
        with pytest.raises(ResetOptionError) as err:
            env.reset(options={"split": split})
        assert "present: valid_seen" in str(err.value)
        assert str(valid_seen_only) not in str(err.value)
    assert env.unwrapped.split == "valid_seen"  # the refusal left the env on its split
    with pytest.raises(DataNotFoundError, match="present: valid_seen"):
        ALFWorldEnv().reset(seed=0)  # train by default, absent


def test_game_index_honours_agentgym_cache(tmp_path, monkeypatch):
    split_dir = tmp_path / "data" / "json_2.1.1" / "valid_seen"
    for i in range(3):
        game = split_dir / f"pick_and_place_simple-Apple-None-Fridge-{i}" / "trial_1" / GAME
        game.parent.mkdir(parents=True)
        game.write_text('{"pddl_problem": "", "solvable": true}')
    monkeypatch.setattr("agentgym.envs.alfworld.data._PERSIST_MIN", 1)
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "cache"))
    _MEMORY.clear()
    assert len(list_games(tmp_path / "data", "valid_seen")) == 3
    assert len(list((tmp_path / "cache" / "alfworld").glob("index-*.json"))) == 1


def test_an_unwritable_cache_costs_one_warning_line_not_the_env(tmp_path, monkeypatch, caplog):
    """A cache folder that cannot be created even by root: its parent is a regular file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("AGENTGYM_CACHE", str(blocker / "cache"))
    split_dir = tmp_path / "data" / "json_2.1.1" / "valid_seen"
    game = split_dir / "pick_and_place_simple-Apple-None-Fridge-1" / "trial_1" / GAME
    game.parent.mkdir(parents=True)
    game.write_text('{"pddl_problem": "", "solvable": true}')
    monkeypatch.setattr("agentgym.envs.alfworld.data._PERSIST_MIN", 1)
    _MEMORY.clear()
    with caplog.at_level("WARNING", logger="agentgym"):
        assert len(list_games(tmp_path / "data", "valid_seen")) == 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "agentgym"]
    assert len(warnings) == 1 and "AGENTGYM_CACHE" in warnings[0], warnings
    assert "\n" not in warnings[0]


@pytest.mark.realdata
def test_garbage_actions_never_raise(real_root):
    env, _, info = _env(real_root, 3)
    key = info["state_key"]
    for action in ["", " ", "x" * 100_000, "gö tö ☃", "\x00\x1b[2J\r\n", "look\x00", None, 3]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert not info["action_valid"] and reward == 0.0 and not terminated
        assert info["state_key"] == key
        assert obs == "Nothing happens." or action is None or action == 3
    obs, *_, info = env.step(InvalidAction("no <action> tag"))
    assert not info["action_valid"] and info["state_key"] == key
    # TextWorld strips commands: a padded admissible command is played (and valid)
    obs, *_, info = env.step("  look  ")
    assert info["action_valid"] and obs != "Nothing happens."


@pytest.mark.realdata
def test_reset_seed_options_and_info(real_root):
    env = ALFWorldEnv(data_root=real_root, split="valid_seen")
    a = env.reset(seed=123)
    b = env.reset(seed=123)
    assert a[0] == b[0] and a[1]["task_id"] == b[1]["task_id"]
    assert a[1]["state_key"] == b[1]["state_key"]
    tid = env.task_ids[5]
    obs, info = env.reset(options={"task": tid})
    assert info["task_id"] == tid and env.reset(options={"task": 5})[1]["task_id"] == tid
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-\n\n")
    assert obs.endswith("Your task is to: " + info["goal"])
    assert info["task_type"] == tid.split("/")[1].split("-")[0]
    assert info["gamefile"].endswith(tid + "/" + GAME)
    assert info["synthetic"] is False and info["won"] is False and info["score"] == 0.0
    other = env.reset(options={"task": 6})[1]["state_key"]
    assert other != info["state_key"]  # keys of different games never compare equal
    looks = ALFWorldEnv(data_root=real_root, split="valid", task_types=[2])
    assert looks.num_tasks == len(list_games(real_root, "valid_seen", ["look_at_obj_in_light"]))
    for seed in range(5):
        assert looks.reset(seed=seed)[1]["task_type"] == "look_at_obj_in_light"
    with pytest.raises(ValueError):
        ALFWorldEnv(data_root=real_root, split="valid_seen", task_types=[9])
    with pytest.raises(ResetOptionError, match="unknown ALFWorld task"):
        env.reset(options={"task": "valid_seen/nope/nope"})
    train = _games(real_root, "train")[0][0]
    assert env.reset(options={"task": train})[1]["task_id"] == train  # the id names its split
    assert env.split == "train"
    assert env.reset(options={"split": "valid", "task": 0})[1]["task_id"].startswith("valid_seen/")


@pytest.mark.realdata
def test_win_reward_truncation_and_expert(real_root):
    env = ALFWorldEnv(data_root=real_root, split="valid_seen", expert=True, reward_scale=5.0)
    obs, info = env.reset(options={"task": 40})
    total = 0.0
    for _ in range(50):
        obs, reward, terminated, truncated, info = env.step(info["expert_action"])
        total += reward
        if terminated:
            break
    assert terminated and info["won"] and info["score"] == 1.0 and total == 5.0
    assert info["expert_action"] is None
    # a finished episode stays finished
    obs2, reward, terminated, _, info2 = env.step("look")
    assert terminated and reward == 0.0 and not info2["action_valid"]
    # the step cap truncates
    env = ALFWorldEnv(data_root=real_root, split="valid_seen", max_episode_steps=3)
    env.reset(options={"task": 40})
    flags = [env.step("look")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    # no expert unless asked
    assert (
        "expert_action" not in ALFWorldEnv(data_root=real_root, split="valid_seen").reset(seed=0)[1]
    )


@pytest.mark.realdata
@pytest.mark.slow
def test_planner_expert_reaches_the_goal(real_root):
    """alfworld's planner expert (Fast Downward from the current state): seconds per plan."""
    env = ALFWorldEnv(data_root=real_root, split="valid_seen", expert="planner")
    obs, info = env.reset(options={"task": 40})
    for _ in range(40):
        action = info["expert_action"]
        assert action in info["admissible_actions"]
        obs, _, terminated, _, info = env.step(action)
        if terminated:
            break
    assert info["won"]


@pytest.mark.realdata
def test_oracle_solves_every_valid_seen_game(real_root):
    games = _games(real_root, "valid_seen")
    results = []
    for tid, path in games[::4]:
        world = World(load_game(path))
        for _ in range(60):
            action = oracle_action(world)
            if action is None:
                break
            world.step(action)
        results.append((tid, world.won()))
    table = success_by_task_type(results)
    assert table["all"]["success"] == 1.0, [t for t, w in results if not w]


@pytest.mark.realdata
def test_pickle_round_trip(real_root):
    env, _, _ = _env(real_root, 11)
    for _ in range(4):
        _do(env, env.expert_action())
    copy = pickle.loads(pickle.dumps(env))
    assert copy.state_key() == env.state_key()
    action = env.expert_action()
    assert copy.step(action)[0] == env.step(action)[0]
    assert copy.state_key() == env.state_key()


@pytest.mark.realdata
def test_check_env_and_make(real_root, monkeypatch):
    from gymnasium.utils.env_checker import check_env

    monkeypatch.setenv("ALFWORLD_DATA", str(real_root))
    env = gym.make("AgentGym/ALFWorld-v0", split="valid_seen")
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert info["admissible_actions"] and "state_key" in info


@pytest.mark.realdata
def test_grammar_and_names_match_textworld_and_alfworld(real_root):
    from alfworld.agents.utils.misc import Demangler
    from textworld.envs.pddl.logic import GameLogic
    from textworld.generator.game import EntityInfo

    tid, path = _games(real_root, "valid_seen")[60]
    game = load_game(path)
    import json

    data = json.loads(Path(path).read_text())
    logic = GameLogic(domain=data["pddl_domain"], grammar=data["grammar"])
    assert set(logic.actions) == set(game.actions)
    for name, action in logic.actions.items():
        assert (action.template, action.feedback_rule) == (
            game.actions[name].template,
            game.actions[name].feedback,
        )
    assert set(logic.grammar._rules) == set(game.grammar.rules)
    infos = {i: EntityInfo(i, "t") for i in game.entities}
    demangler = Demangler(game_infos=infos, shuffle=False)
    expected = {i: demangler.demangle_alfred_name(i) for i in infos}
    assert demangle_names(list(infos)) == expected == game.names


def test_success_by_task_type():
    rows = [
        ("pick_and_place_simple", True),
        ({"task_type": "pick_and_place_simple", "won": False}),
        ({"task_id": "valid_seen/look_at_obj_in_light-X-None-DeskLamp-1/trial_1", "won": True}),
    ]
    table = success_by_task_type(rows)
    assert table["pick_and_place_simple"] == {"success": 0.5, "episodes": 2.0}
    assert table["look_at_obj_in_light"]["success"] == 1.0
    assert table["all"] == {"success": 2 / 3, "episodes": 3.0}
