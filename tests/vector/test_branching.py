"""Branching rollouts in GroupVectorEnv: snapshot(i), reset_to(snapshots, prefixes), branch().

Every backend (in-process, worker processes, Ray where importable): k copies of one env made at
step t continue exactly as that env would under the same actions (checked against a sequential
replay on a plain env), their records start with the source's steps and mark the branch point,
branches cross workers, snapshots of one vector env start another, and refused snapshots say
which env refused them.
"""

from __future__ import annotations

import os
import pickle
import signal

import gymnasium as gym
import numpy as np
import pytest

import agentgym  # noqa: F401 - registers the ids
from agentgym.core import SnapshotMismatch
from agentgym.rollout import random_policy
from agentgym.vector import EnvError, EnvFactory, GroupEnvSnapshot, GroupVectorEnv
from agentgym.wrappers.llm import make_llm_env

ENV = "AgentGym/Corridor-v0"
LLM_WRAPPERS = [(make_llm_env, {"history_length": 2})]


def _ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


BACKENDS = ["inprocess", "process"]
#: Ray actors take seconds to start: one Ray test, the one that ships wrapper state too
NEEDS_RAY = pytest.mark.skipif(not _ray_available(), reason="Ray is not installed")


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance for the module's Ray tests (starting one costs seconds)."""
    yield
    if _ray_available():
        import ray

        if ray.is_initialized():
            ray.shutdown()


def make_vec(backend: str, wrappers=(), num_groups: int = 2, group_size: int = 3):
    # two workers over 6 envs: envs 0-2 in worker 0, 3-5 in worker 1
    workers = None if backend == "inprocess" else 2
    return GroupVectorEnv(
        ENV, num_groups, group_size, backend=backend, num_workers=workers, wrappers=wrappers
    )


def as_text(action: str, wrapped: bool) -> str:
    return f"<think>go</think><action>{action}</action>" if wrapped else action


def replay(seed: int, actions: list[str], wrappers=()) -> list[tuple]:
    """A plain env reset with ``seed`` and stepped with ``actions``: every (obs, reward,
    terminated, truncated, info), the reset's (obs, info) first."""
    env = EnvFactory(ENV, {}, tuple(wrappers))()
    out: list[tuple] = [env.reset(seed=seed)]
    for action in actions:
        out.append(env.step(action))
        if out[-1][2] or out[-1][3]:
            break
    return out


def record_of(traj) -> list[tuple]:
    return [(s.observation, s.action, s.reward, s.state_key, s.action_valid) for s in traj.steps]


def expected_record(seed: int, actions: list[str], wrappers=()) -> list[tuple]:
    """What a Trajectory must hold after ``actions``, from the sequential replay."""
    results = replay(seed, actions, wrappers)
    rows = []
    for (obs, info), step in zip(
        [(r[0], r[-1]) for r in results], results[1:], strict=False
    ):  # each step's anchor is the previous result
        rows.append(
            (obs, actions[len(rows)], step[1], info["state_key"], step[4].get("action_valid"))
        )
    return rows


def actions_for(infos: list[dict], rng: np.random.Generator, wrapped: bool) -> list[str]:
    raw = random_policy([""] * len(infos), infos, rng)
    if rng.random() < 0.3:  # now and then an invalid action: it is a step too
        raw[int(rng.integers(len(raw)))] = "xyzzy"
    return [as_text(a, wrapped) for a in raw]


@pytest.mark.parametrize(
    "backend, wrapped",
    [pytest.param(b, w, id=f"{b}-{'llm' if w else 'bare'}") for b in BACKENDS for w in (0, 1)]
    + [pytest.param("ray", True, id="ray-llm", marks=NEEDS_RAY)],
)
def test_branches_continue_as_the_source_would(backend, wrapped, ray_session):
    wrappers = LLM_WRAPPERS if wrapped else ()
    vec = make_vec(backend, wrappers)
    try:
        rng = np.random.default_rng(7)
        seed = 11
        group_seed = vec.group_seeds(seed)[0]
        obs, infos = vec.reset(seed=seed)
        taken: list[list[str]] = [[] for _ in range(vec.num_envs)]
        for _ in range(2):  # t = 2 steps before the branch point
            actions = actions_for(infos, rng, wrapped)
            actions[0] = as_text("red", wrapped)  # a known valid-or-wrong door: never done yet
            obs, _, _, _, infos = vec.step(actions)
            for i in range(vec.num_envs):
                taken[i].append(actions[i])
        source_before = vec.trajectories()[0]
        targets = [1, 2, 4]  # env 4 lives in the other worker and group
        b_obs, b_infos = vec.branch(0, targets)
        for k, t in enumerate(targets):
            assert b_obs[k] == obs[0] and b_infos[k]["state_key"] == infos[0]["state_key"]
            taken[t] = list(taken[0])
        trajs = vec.trajectories()
        for t in targets:
            assert trajs[t].branch_step == 2 and trajs[t].branch_of == (0, source_before.traj_id)
            assert trajs[t].steps == source_before.steps  # the shared prefix, as recorded
            assert trajs[t].steps is not source_before.steps
            assert trajs[t].group_id == t // 3 and vec.active[t]
        assert len({trajs[i].traj_id for i in range(vec.num_envs)}) == vec.num_envs
        assert trajs[0].branch_step is None and trajs[3].branch_of is None

        # every env (branches included) takes its own actions from here to the end
        while not vec.all_done:
            actions = actions_for(infos, rng, wrapped)
            active = vec.active.copy()
            obs, rewards, terminated, truncated, infos = vec.step(actions)
            for i in np.flatnonzero(active):
                taken[i].append(actions[i])
        final = vec.trajectories()
        continuations = {tuple(taken[t][2:]) for t in [0, *targets]}
        assert len(continuations) > 1, "the branches took the same actions: nothing compared"
        for i in [0, *targets, 3, 5]:
            # branches replay the source's episode (group 0's seed) whatever their group
            seed_i = group_seed if i in (0, *targets) else vec.group_seeds(seed)[1]
            assert record_of(final[i]) == expected_record(seed_i, taken[i], wrappers), i
            ends = replay(seed_i, taken[i], wrappers)[-1]
            assert obs[i] == ends[0] and infos[i]["state_key"] == ends[4]["state_key"]
            assert final[i].done and final[i].won == ends[4]["won"]
    finally:
        vec.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_to_snapshots_of_another_vector_env(backend, ray_session):
    source = GroupVectorEnv(ENV, 2, 3, wrappers=LLM_WRAPPERS)  # in-process
    rng = np.random.default_rng(3)
    obs, infos = source.reset(seed=5)
    for _ in range(3):
        obs, _, _, _, infos = source.step(actions_for(infos, rng, wrapped=True))
    # two states, three continuations each (the SLATE layout), snapshots pickled as workers do
    snaps = [pickle.loads(pickle.dumps(source.snapshot(i))) for i in (1, 4)]
    prefixes = [source.trajectories()[1]] * 3 + [source.trajectories()[4]] * 3
    vec = make_vec(backend, LLM_WRAPPERS)
    try:
        r_obs, r_infos = vec.reset_to([snaps[0]] * 3 + [snaps[1]] * 3, prefixes)
        assert r_obs == [obs[1]] * 3 + [obs[4]] * 3
        assert [i["state_key"] for i in r_infos] == [infos[1]["state_key"]] * 3 + [
            infos[4]["state_key"]
        ] * 3
        for i, traj in enumerate(vec.trajectories()):
            assert traj.steps == prefixes[i].steps and traj.branch_step == 3
            assert traj.branch_of == (prefixes[i].group_id, prefixes[i].traj_id)
            assert traj.group_id == i // 3
        assert vec.active.tolist() == [not source.trajectories()[j].done for j in [1] * 3 + [4] * 3]

        # env i of the new vec plays on exactly as the source's env did under the same actions
        twin = GroupVectorEnv(ENV, 2, 3, wrappers=LLM_WRAPPERS)
        twin.reset_to([source.snapshot(1)] * 3 + [source.snapshot(4)] * 3)
        t_infos = r_infos
        while not vec.all_done:
            actions = actions_for(t_infos, rng, wrapped=True)
            got = vec.step(actions)
            want = twin.step(actions)
            assert got[0] == want[0] and got[1].tolist() == want[1].tolist()
            assert [i["state_key"] for i in got[4]] == [i["state_key"] for i in want[4]]
            t_infos = got[4]
        assert [record_of(t)[3:] for t in vec.trajectories()] == [
            record_of(t) for t in twin.trajectories()
        ]
        twin.close()
    finally:
        vec.close()
        source.close()


def test_bare_env_snapshots_and_finished_sources():
    vec = GroupVectorEnv(ENV, 1, 3)
    env = gym.make(ENV)
    _, info = env.reset(seed=2)
    right = info["admissible_actions"]
    snap = env.unwrapped.snapshot()  # a plain EnvSnapshot: no wrappers of ours, accepted
    obs, infos = vec.reset_to([snap] * 3)
    assert obs == [snap.last_obs] * 3 and all(t.branch_step is None for t in vec.trajectories())
    assert vec.step([right[0]] * 3)[4][0]["state_key"] == env.step(right[0])[4]["state_key"]

    # a finished source: its branches are finished too, with its flags and record
    while not vec.all_done:
        vec.step(["xyzzy"] * 3)
    src = vec.trajectories()[0]
    vec.branch(0, [2])
    assert not vec.active[2] and vec.trajectories()[2].truncated == src.truncated
    assert vec.trajectories()[2].steps == src.steps
    with pytest.raises(gym.error.ResetNeeded):
        GroupVectorEnv(ENV, 1, 2).snapshot(0)
    # infos in the vector env's layout, as reset() gives them
    gym_layout = GroupVectorEnv(ENV, 1, 3, info_layout="gymnasium")
    _, gym_infos = gym_layout.reset_to([snap] * 3)
    assert list(gym_infos["state_key"]) == [snap.state_key] * 3
    gym_layout.close()
    wrapped_vec = GroupVectorEnv(ENV, 1, 3, wrappers=LLM_WRAPPERS)
    with pytest.raises(ValueError, match="vec.snapshot|GroupVectorEnv.snapshot"):
        wrapped_vec.reset_to([snap] * 3)
    vec.close()
    wrapped_vec.close()


@pytest.mark.parametrize("backend", ["inprocess", "process"])
def test_refused_snapshots_name_the_env(backend):
    vec = make_vec(backend)
    try:
        vec.reset(seed=0)
        good = vec.snapshot(0)
        assert isinstance(good, GroupEnvSnapshot)
        with pytest.raises(ValueError, match="expected 6"):
            vec.reset_to([good] * 5)
        with pytest.raises(ValueError, match="expected 6"):
            vec.reset_to([good] * 6, [None] * 2)
        with pytest.raises(TypeError, match=r"snapshots\[2\]"):
            vec.reset_to([good, good, "state", good, good, good])
        other = GroupVectorEnv("AgentGym/Sokoban-v0", 1, 1)
        other.reset(seed=0)
        foreign = other.snapshot(0)
        other.close()
        with pytest.raises(SnapshotMismatch, match=r"env 4\b.*SokobanEnv|env 4\b.*wrappers"):
            vec.reset_to([good] * 4 + [foreign] + [good])
        with pytest.raises(gym.error.ResetNeeded):  # half the envs were restored: not steppable
            vec.step(["red"] * 6)
        vec.reset_to([good] * 6)  # a good reset_to recovers
        vec.step(["red"] * 6)
        # a prefix that did not lead to the snapshot
        vec.reset(seed=1)
        vec.step(["xyzzy"] * 6)
        with pytest.raises(ValueError, match=r"prefixes\[0\]"):
            vec.reset_to([other_state()] * 6, [vec.trajectories()[0]] + [None] * 5)
        with pytest.raises(IndexError, match="source"):
            vec.branch(6, [0])
        with pytest.raises(ValueError, match="distinct"):
            vec.branch(0, [0, 1])
        with pytest.raises(ValueError, match="distinct"):
            vec.branch(0, [1, 1])
    finally:
        vec.close()


def other_state():
    """A snapshot of the same id in another episode's state."""
    fresh = GroupVectorEnv(ENV, 2, 3)
    fresh.reset(seed=99)
    snap = fresh.snapshot(1)
    fresh.close()
    return snap


def test_branch_into_a_dead_worker_ends_that_target_only():
    vec = make_vec("process")
    try:
        obs, infos = vec.reset(seed=4)
        os.kill(vec._backend.procs[1].pid, signal.SIGKILL)  # envs 3-5
        vec._backend.procs[1].wait(timeout=10)
        with pytest.raises(EnvError, match=r"env 4 .*branch\(\)") as caught:
            vec.branch(0, [1, 4])
        assert caught.value.failed == [4]
        assert vec.active[1] and not vec.active[4]
        # envs 3 and 5 lived in the lost worker: their episodes ended too, the others go on
        assert vec.active.tolist() == [True, True, True, False, False, False]
        assert vec.trajectories()[3].truncated and "died" in vec.trajectories()[3].truncation_reason
        assert vec.trajectories()[1].branch_of == (0, vec.trajectories()[0].traj_id)
        assert (
            vec.trajectories()[4].truncated and "branch()" in vec.infos_list[4]["truncation_reason"]
        )
        obs, *_ = vec.step(["red"] * 6)  # the others step on; the dead worker's envs are done
        assert obs[1] == obs[0]
        vec.reset(seed=4)  # a reset brings the restarted worker's envs back
        assert vec.active.all()
    finally:
        vec.close()


def test_branches_of_branches_form_a_tree():
    vec = GroupVectorEnv(ENV, 1, 4)
    vec.reset(seed=8)
    vec.step(["xyzzy"] * 4)
    vec.branch(0, [1])  # level 1: branch point after step 1
    vec.step(["red", "blue", "xyzzy", "xyzzy"])
    vec.branch(1, [2, 3])  # level 2: from the branch, after step 2
    root, mid, leaf_a, leaf_b = vec.trajectories()
    assert (mid.branch_of, mid.branch_step) == ((0, root.traj_id), 1)
    assert {(t.branch_of, t.branch_step) for t in (leaf_a, leaf_b)} == {((0, mid.traj_id), 2)}
    assert leaf_a.steps == mid.steps and leaf_a.steps[:1] == root.steps[:1]
    assert leaf_a.steps[1].action == "blue" and root.steps[1].action == "red"
    vec.close()
