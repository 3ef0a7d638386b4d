"""SLEA-RL's experience library: admission and eviction by hand, retrieval by ``state_key``,
rate-limited evolution from trajectories, atomic persistence, and the prompt wrapper on a real
env next to the SLEA-RL estimator that groups steps by the same keys."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import numpy as np
import pytest

import agentgym  # noqa: F401 - registers the env ids
from agentgym.algorithms import compute_advantage
from agentgym.algorithms.slea_library import (
    MAX_CONTENT_CHARS,
    ExperienceLibrary,
    ExperiencePrompt,
    LibraryConfig,
)
from agentgym.vector import Step, Trajectory
from agentgym.wrappers import make_llm_env

# Contents far apart for the novelty test (difflib ratio and word overlap well under 0.85).
A = "open the drawer before looking inside it"
B = "walk to the kitchen counter first"
C = "examine every shelf in order"
D = "pick up the key then unlock the door"

OPEN = dict(warmup_updates=0, min_library_size=1)  # retrieval from the first experience


def test_admission_and_eviction_by_score():
    lib = ExperienceLibrary(golden_capacity_per_level=2, **OPEN)
    a = lib.admit(A, "golden", "method", 0.5, "s1")
    b = lib.admit(B, "golden", "method", 0.7, "s2")
    assert (a.uid, b.uid) == (0, 1)
    # Full level: a candidate must score strictly higher than the lowest (0.5) to get in.
    assert lib.admit(C, "golden", "method", 0.4, "s3") is None
    assert lib.admit(C, "golden", "method", 0.5, "s3") is None
    d = lib.admit(D, "golden", "method", 0.6, "s3")
    assert d is not None and d.uid == 2
    assert [e.content for e in lib.experiences()] == [B, D]  # A, the lowest, went
    # Its cluster held nothing else, so it is gone; s1 now falls back to the library's best.
    assert lib.stats()["library/clusters"] == 2.0
    assert lib.retrieve("s1").golden[0].content == B
    # Other levels and zones have their own capacity.
    assert lib.admit(A, "golden", "example", 0.1, "s1") is not None
    assert lib.admit(A, "warning", "mistake", 0.0, "s1") is not None
    assert len(lib) == 4


def test_the_oldest_of_equal_lows_goes_first():
    lib = ExperienceLibrary(warning_capacity_per_level=2)
    lib.admit(A, "warning", "pattern", 0.5, "s")
    lib.admit(B, "warning", "pattern", 0.5, "t")
    lib.admit(C, "warning", "pattern", 0.9, "u")
    assert [e.content for e in lib.experiences()] == [B, C]


def test_similar_advice_merges_within_a_state_and_keeps_the_higher_score():
    lib = ExperienceLibrary()
    first = lib.admit(
        "Avoid invalid actions - check available options first", "warning", "pattern", 0.3, "s"
    )
    again = lib.admit(
        "avoid invalid actions -  check available options first!", "warning", "pattern", 0.5, "s"
    )
    assert again is None and first.score == 0.5 and len(lib) == 1
    # The same advice learnt in another state is kept for that state too.
    assert lib.admit(first.content, "warning", "pattern", 0.5, "t") is not None
    # A lower score never lowers the kept one.
    lib.admit(first.content, "warning", "pattern", 0.1, "s")
    assert first.score == 0.5


def test_bad_input_is_a_clear_error_and_content_is_bounded():
    lib = ExperienceLibrary()
    with pytest.raises(ValueError, match="unknown zone/level"):
        lib.admit(A, "golden", "mistake", 1.0, "s")
    with pytest.raises(ValueError, match="finite"):
        lib.admit(A, "golden", "method", float("nan"), "s")
    with pytest.raises(TypeError):
        lib.admit(A, "golden", "method", 1.0, ["unhashable"])
    with pytest.raises(ValueError, match="warmup_updates"):
        LibraryConfig(warmup_updates=-1)
    exp = lib.admit("é\x1b" + "x" * 5000, "golden", "method", 1.0, "s")
    assert len(exp.content) <= MAX_CONTENT_CHARS and exp.content.isascii()
    assert len(lib) == 1


def test_retrieval_by_state_key_best_first_with_task_fallback():
    lib = ExperienceLibrary(**OPEN)
    lib.admit(A, "golden", "method", 0.2, ("room", 1), task_id="t1")
    lib.admit(B, "golden", "method", 0.9, ("room", 1), task_id="t1")
    lib.admit(C, "golden", "example", 0.5, ("room", 1), task_id="t1")
    lib.admit(D, "warning", "mistake", 0.0, ("room", 1), task_id="t1")
    lib.admit("never go back", "golden", "method", 1.0, ("room", 2), task_id="t2")
    got = lib.retrieve(("room", 1), "t1")
    assert [e.content for e in got.golden] == [B, C]  # top 2 by score
    assert [e.content for e in got.warning] == [D]
    assert [e.usage_count for e in got.golden] == [1, 1]
    # A state with nothing of its own: the task's best (experiences of task t2 are not served).
    assert [e.content for e in lib.retrieve(("room", 9), "t1").golden] == [B, C]
    assert [e.content for e in lib.retrieve(("room", 9), "t2").golden] == ["never go back"]
    assert not ExperienceLibrary(fallback=False, **OPEN).retrieve(("room", 9))
    hint = lib.hint(got)
    assert hint == f"[Tips: {B}; {C}]\n[Avoid: {D}]"


def test_nothing_is_retrieved_during_the_warmup():
    lib = ExperienceLibrary(warmup_updates=1, min_library_size=2)
    lib.admit(A, "golden", "method", 1.0, "s")
    lib.admit(B, "golden", "method", 1.0, "s")
    assert not lib.retrieve("s")  # no update yet
    lib.update([])
    assert [e.content for e in lib.retrieve("s").golden] == [A, B]


def _traj(keys, actions, rewards, valid=None, truncated=False, task="t"):
    t = Trajectory(group_id=0, traj_id=0, task_id=task, truncated=truncated)
    valid = valid or [True] * len(keys)
    for k, a, r, v in zip(keys, actions, rewards, valid, strict=True):
        t.steps.append(Step("obs", a, r, k, v, {"parsed_action": a if v else None}))
    return t


def test_update_distils_step_level_experiences_with_rate_limits():
    lib = ExperienceLibrary(max_warnings_per_update=3, **OPEN)
    win = _traj(["s0", "s1", "s2"], ["red", "blue", "green"], [0.0, 0.0, 1.0])
    loss = _traj(
        ["s0", "s1", "s1", "s1"],
        ["red", "blue", "blue", "blue"],
        [0.0] * 4,
        valid=[True, False, True, True],
        truncated=True,
    )
    stats = lib.update([loss, win])
    assert stats["successes"] == 1 and stats["failures"] == 1
    assert stats["strategies_added"] == 3 and stats["warnings_added"] == 3
    golden = {e.state_key: e.content for e in lib.experiences("golden")}
    assert golden["s0"] == "Action sequence that led to success from here: red -> blue -> green"
    assert golden["s2"] == "Action sequence that led to success from here: green"
    warnings = [(e.level, e.state_key, e.content) for e in lib.experiences("warning")]
    # The last three actions start at step 1 (s1); the repeat starts at step 1; the invalid
    # step is step 1; the diagnostic (the 4th warning) is over the rate limit.
    assert warnings == [
        ("mistake", "s1", "Avoid this action pattern: blue -> blue -> blue"),
        ("pattern", "s1", "Avoid repeating the same action 'blue' multiple times"),
        ("pattern", "s1", "Avoid invalid actions - check available options first"),
    ]
    assert lib.updates == 1
    # The same batch again: everything is merged, nothing added.
    again = lib.update([loss, win])
    assert again["strategies_added"] == 0 and again["merged_or_rejected"] >= 3


def test_update_reads_only_the_best_successes():
    lib = ExperienceLibrary(top_k_trajectories=1, **OPEN)
    weak = _traj(["a"], ["left"], [0.6])
    strong = _traj(["b"], ["right"], [2.0])
    lib.update([weak, strong])
    assert [e.state_key for e in lib.experiences("golden")] == ["b"]


def test_save_and_load_round_trip_atomically(tmp_path):
    lib = ExperienceLibrary(golden_capacity_per_level=3, **OPEN)
    keys = [b"\x00grid", ("page", 3, ("q", None)), 12, "plain", 1.5, True]
    for i, key in enumerate(keys):
        lib.admit(f"advice number {i} " + "abcdefghij"[i] * (i + 3), "golden", "example", i, key)
    lib.retrieve(keys[1])
    lib.update([])
    path = tmp_path / "library.json"
    lib.save(path)
    back = ExperienceLibrary.load(path)
    assert back.config == lib.config and back.updates == lib.updates
    assert [vars(e) for e in back.experiences()] == [vars(e) for e in lib.experiences()]
    assert back.retrieve(keys[1]).uids == lib.retrieve(keys[1]).uids
    assert back.admit("fresh advice here", "warning", "mistake", 1.0, "z").uid == lib._next_uid
    # A key that cannot be saved leaves the old file whole.
    before = path.read_text()
    lib.admit("object key", "warning", "pattern", 1.0, frozenset({1}))
    with pytest.raises(TypeError, match="cannot save state_key"):
        lib.save(path)
    assert path.read_text() == before
    (tmp_path / "bad.json").write_text(
        json.dumps({"format": "agentgym-slea-library", "version": 1})
    )
    with pytest.raises(ValueError, match="malformed"):
        ExperienceLibrary.load(tmp_path / "bad.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a saved experience library"):
        ExperienceLibrary.load(tmp_path / "junk.json")


def _lit_door(obs: str) -> str | None:
    found = re.search(r"Light comes through the (\w+) door", obs)
    return found.group(1) if found else None


def _episode(env, seed, good: bool) -> Trajectory:
    """Play Corridor: the lit door (a win) or always another one, then back (a loss)."""
    obs, info = env.reset(seed=seed)
    traj = Trajectory(group_id=0, traj_id=seed, task_id=info["task_id"])
    while True:
        lit = _lit_door(info["raw_observation"])
        admissible = info["admissible_actions"]
        action = lit if good else next(a for a in admissible if a != lit)
        key = info["state_key"]
        obs, reward, terminated, truncated, info = env.step(action)
        traj.steps.append(Step(obs, action, float(reward), key, info["action_valid"], info))
        if terminated or truncated:
            traj.terminated, traj.truncated, traj.won = terminated, truncated, info["won"]
            return traj


def test_experiences_reach_the_prompt_and_match_slea_rl_step_groups():
    lib = ExperienceLibrary(**OPEN)
    env = ExperiencePrompt(make_llm_env(gym.make("AgentGym/Corridor-v0", length=3), "plain"), lib)
    assert env.observation_space.max_length > env.env.observation_space.max_length
    first, info = env.reset(seed=7)
    assert info["experience_hint"] == "" and first.startswith("You are")  # empty library
    win, loss = _episode(env, 7, good=True), _episode(env, 7, good=False)
    assert win.won and not loss.won
    lib.update([win, loss])
    prompt, info = env.reset(seed=7)
    start = win.steps[0].state_key
    assert info["state_key"] == start
    hint = info["experience_hint"]
    assert hint.startswith(
        "[Tips: Action sequence that led to success from here: " + win.steps[0].action
    )
    assert prompt.startswith(hint + "\n\n") and env.observation_space.contains(prompt)
    assert info["experience_uids"] == lib.retrieve(start, info["task_id"]).uids
    # The estimator's step groups are the library's clusters: rows that share a step group
    # (equal state_key) retrieve the same experiences.
    rows = [(t, i, s) for t, traj in enumerate((win, loss)) for i, s in enumerate(traj.steps)]
    result = compute_advantage(
        "slea_rl",
        group_ids=[0] * len(rows),
        traj_ids=[t for t, _, _ in rows],
        step_ids=[i for _, i, _ in rows],
        rewards=[s.reward for _, _, s in rows],
        invalid=[not s.action_valid for _, _, s in rows],
        state_keys=[s.state_key for _, _, s in rows],
    )
    assert result.stats["num_step_groups"] == len({s.state_key for _, _, s in rows})
    by_key: dict = {}
    for _, _, s in rows:
        by_key.setdefault(s.state_key, set()).add(tuple(lib.retrieve(s.state_key).uids))
    assert all(len(v) == 1 for v in by_key.values())
    assert np.isfinite(result.advantages).all()
    # prepend=False leaves the observation alone and still reports the hint.
    quiet = ExperiencePrompt(env.env, lib, prepend=False)
    plain, info = quiet.reset(seed=7)
    assert plain.startswith("You are") and info["experience_hint"] == hint
