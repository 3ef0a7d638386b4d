"""GroupVectorEnv: group semantics, trajectory records, both backends, a worker killed mid-episode."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest

import agentgym  # noqa: F401 - registers the ids
from agentgym.rollout import random_policy, run_group_rollout, state_group_stats
from agentgym.vector import GroupVectorEnv

ENV = "AgentGym/Corridor-v0"


def play(vec: GroupVectorEnv, seed: int):
    rng = np.random.default_rng(seed)
    obs, infos = vec.reset(seed=seed)
    history = [(list(obs), [i["state_key"] for i in infos])]
    while not vec.all_done:
        obs, rewards, terminated, truncated, infos = vec.step(random_policy(obs, infos, rng))
        history.append((list(obs), rewards.tolist(), terminated.tolist(), truncated.tolist()))
    return history, vec.trajectories()


def test_groups_share_task_and_state_groups_differ():
    vec = GroupVectorEnv(ENV, num_groups=4, group_size=3)
    obs, infos = vec.reset(seed=0)
    keys = [i["state_key"] for i in infos]
    tasks = [i["task_id"] for i in infos]
    for g in range(4):
        members = slice(3 * g, 3 * g + 3)
        assert len(set(keys[members])) == 1 and len(set(tasks[members])) == 1
        assert len(set(obs[members])) == 1
    assert len({tasks[3 * g] for g in range(4)}) > 1, "all groups got the same task"
    assert vec.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    vec.close()


def test_seeded_resets_are_reproducible_and_unseeded_differ():
    vec = GroupVectorEnv(ENV, num_groups=3, group_size=2)
    a, _ = play(vec, seed=5)
    b, _ = play(vec, seed=5)
    assert a == b
    starts = {tuple(vec.reset()[0]) for _ in range(4)}
    assert len(starts) > 1
    vec.close()


def test_active_mask_autoreset_off_and_trajectory_records():
    vec = GroupVectorEnv(ENV, num_groups=2, group_size=4)
    obs, infos = vec.reset(seed=1)
    first_traj_ids = vec.traj_ids.copy()
    rng = np.random.default_rng(0)
    done_obs: dict[int, str] = {}
    while not vec.all_done:
        before_active = vec.active.copy()
        anchor = [i["state_key"] for i in infos]
        prev_steps = vec.step_index.copy()
        obs, rewards, terminated, truncated, infos = vec.step(random_policy(obs, infos, rng))
        for i in range(vec.num_envs):
            if not before_active[i]:  # finished envs stay finished: same obs, reward 0, no step
                assert obs[i] == done_obs[i] and rewards[i] == 0.0
                assert vec.step_index[i] == prev_steps[i]
            else:
                assert vec.step_index[i] == prev_steps[i] + 1
                traj = vec.trajectories()[i]
                assert traj.steps[-1].state_key == anchor[i], (
                    "Step.state_key must be the anchor state"
                )
                if terminated[i] or truncated[i]:
                    done_obs[i] = obs[i]
                    assert not vec.active[i]
    trajs = vec.trajectories()
    assert [t.traj_id for t in trajs] == first_traj_ids.tolist()
    assert all(t.done for t in trajs)
    assert all(len(t.steps) == n for t, n in zip(trajs, vec.step_index, strict=True))
    for t in trajs:
        assert t.total_return == pytest.approx(sum(s.reward for s in t.steps))
        assert t.won == t.steps[-1].info["won"]
    vec.reset(seed=2)
    assert set(vec.traj_ids).isdisjoint(first_traj_ids), "traj ids must be fresh on every reset"
    with pytest.raises(ValueError, match="expected 8 actions"):
        vec.step(["x"])
    vec.close()


def test_process_backend_matches_inprocess():
    inproc = GroupVectorEnv(ENV, num_groups=3, group_size=4)
    proc = GroupVectorEnv(ENV, num_groups=3, group_size=4, backend="process", num_workers=2)
    try:
        a, ta = play(inproc, seed=9)
        b, tb = play(proc, seed=9)
        assert a == b
        assert [[s.state_key for s in t.steps] for t in ta] == [
            [s.state_key for s in t.steps] for t in tb
        ]
    finally:
        inproc.close()
        proc.close()


def test_killed_worker_is_replaced_and_its_episodes_end_truncated():
    vec = GroupVectorEnv(ENV, num_groups=2, group_size=4, backend="process", num_workers=2)
    try:
        obs, infos = vec.reset(seed=3)
        victim = vec._backend.procs[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=5)
        start = time.monotonic()
        obs, rewards, terminated, truncated, infos = vec.step(["red"] * vec.num_envs)
        assert time.monotonic() - start < 30, "a dead worker must not hang the step"
        dead = np.arange(vec.num_envs) < 4  # worker 0 held envs 0..3
        assert truncated[dead].all() and not vec.active[dead].any()
        for i in np.flatnonzero(dead):
            assert "killed by signal 9" in infos[i]["truncation_reason"]
            assert vec.trajectories()[i].truncation_reason == infos[i]["truncation_reason"]
        assert vec.step_index[~dead].tolist() == [1] * 4, "the live worker's envs took their step"
        assert vec._backend.procs[0].pid != victim.pid and vec._backend.procs[0].poll() is None
        # the replacement serves a full new episode
        obs, infos = vec.reset(seed=4)
        assert vec.active.all() and all(
            infos[i]["state_key"] == infos[0]["state_key"] for i in range(4)
        )
        history, trajs = play(vec, seed=4)
        assert all(t.done and "died" not in (t.truncation_reason or "") for t in trajs)
        assert sum(len(t.steps) for t in trajs) == int(vec.step_index.sum()) > 0
    finally:
        vec.close()


def test_env_errors_in_workers_are_reported_not_hung():
    with pytest.raises(RuntimeError, match="failed to build"):
        GroupVectorEnv(
            ENV, 1, 2, backend="process", num_workers=1, env_kwargs={"no_such_argument": 1}
        )


def test_make_vec_and_bad_arguments():
    vec = gym.make_vec(ENV, num_envs=6, group_size=3)
    assert isinstance(vec, GroupVectorEnv) and vec.num_groups == 2
    vec.close()
    with pytest.raises(ValueError, match="multiple of group_size"):
        gym.make_vec(ENV, num_envs=5, group_size=2)
    with pytest.raises(ValueError, match="unknown backend"):
        GroupVectorEnv(ENV, 1, 2, backend="gpu")
    with pytest.raises(gym.error.ResetNeeded):
        GroupVectorEnv(ENV, 1, 2).step(["x", "y"])


def test_state_group_stats_counts_shared_states():
    report = run_group_rollout(ENV, num_groups=2, group_size=8, seed=0)
    assert report.episodes == 16 and report.steps > 0
    sg = report.state_groups
    assert sg.num_steps == report.steps
    # every group starts in one state, so at least the first step of each trajectory is shared
    assert sg.shared_fraction >= 16 / report.steps
    assert 0.0 <= sg.singleton_fraction <= 1.0 and sg.max_group_size >= 8
    assert state_group_stats([]).num_steps == 0


def test_ray_backend_matches_inprocess_and_survives_a_killed_actor():
    ray = pytest.importorskip("ray")
    inproc = GroupVectorEnv(ENV, num_groups=2, group_size=4)
    vec = GroupVectorEnv(ENV, num_groups=2, group_size=4, backend="ray", num_workers=2)
    try:
        a, _ = play(inproc, seed=9)
        b, _ = play(vec, seed=9)
        assert a == b
        vec.reset(seed=3)
        actor = vec._backend.actors[1]
        ray.kill(actor, no_restart=True)
        # ray.kill is asynchronous: wait until the actor is really gone, or the step may still
        # reach it and the test would race the kill
        deadline = time.monotonic() + 60
        while True:
            try:
                ray.get(actor.run.remote("step", []), timeout=60)
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < deadline, "the killed actor kept answering"
            time.sleep(0.05)
        obs, rewards, terminated, truncated, infos = vec.step(["red"] * vec.num_envs)
        dead = np.arange(vec.num_envs) >= 4
        assert truncated[dead].all() and not vec.active[dead].any()
        assert all("Ray actor" in infos[i]["truncation_reason"] for i in np.flatnonzero(dead))
        assert vec.step_index[~dead].tolist() == [1] * 4
        obs, infos = vec.reset(seed=3)  # the replacement actor serves the next episode
        assert vec.active.all() and infos[4]["state_key"] == infos[7]["state_key"]
    finally:
        inproc.close()
        vec.close()
        ray.shutdown()
