"""GroupVectorEnv under Gymnasium's conventions: its dict-of-arrays infos, its own vector and
single-env wrappers, compact space reprs, clear errors, and a Ray it starts being shut down."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import OrderEnforcing, RecordEpisodeStatistics, TimeLimit
from gymnasium.wrappers import vector as vector_wrappers

import agentgym  # noqa: F401 - registers the ids
from agentgym.rollout import random_policy
from agentgym.vector import GroupVectorEnv

ENV = "AgentGym/Corridor-v0"


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(np.all(a == b))


def test_gymnasium_layout_carries_the_list_layout_for_the_envs_that_stepped():
    lists = GroupVectorEnv(ENV, num_groups=3, group_size=2)
    dicts = GroupVectorEnv(ENV, num_groups=3, group_size=2, info_layout="gymnasium")
    assert lists.info_layout == "list"
    rng = np.random.default_rng(1)
    obs_l, infos_l = lists.reset(seed=4)
    obs_d, infos_d = dicts.reset(seed=4)
    assert obs_l == obs_d and isinstance(infos_d, dict)
    assert infos_d["_state_key"].all()
    assert list(infos_d["state_key"]) == [i["state_key"] for i in infos_l]
    steps, saw_partial = 0, False
    while not lists.all_done:
        was_active = lists.active.copy()
        actions = random_policy(obs_l, infos_l, rng)
        obs_l, rew_l, term_l, trunc_l, infos_l = lists.step(actions)
        obs_d, rew_d, term_d, trunc_d, infos_d = dicts.step(actions)
        steps += 1
        assert obs_l == obs_d and np.array_equal(rew_l, rew_d)
        # Gymnasium's flags mark the step an episode ended; the list layout repeats them
        assert np.array_equal(term_d, term_l & was_active)
        assert np.array_equal(trunc_d, trunc_l & was_active)
        # envs that did not step have no entry; the others carry exactly their list info
        assert np.array_equal(infos_d["_state_key"], was_active)
        saw_partial |= not was_active.all()
        as_list = vector_wrappers.DictInfoToList(dicts)._convert_info_to_list(infos_d)
        for i in np.flatnonzero(was_active):
            assert _same(as_list[i], infos_l[i]), i
        for i in np.flatnonzero(~was_active):
            assert as_list[i] == {}
        assert dicts.infos_list == infos_l  # the list view is there in either layout
        assert steps < 500
    assert saw_partial, "every episode ended on the same step: the masks went untested"
    lists.close()
    dicts.close()


def test_gymnasium_record_episode_statistics_counts_each_episode_once():
    vec = GroupVectorEnv(ENV, num_groups=2, group_size=3, info_layout="gymnasium")
    env = vector_wrappers.RecordEpisodeStatistics(vec)
    rng = np.random.default_rng(0)
    for episode in range(2):  # the second reset starts the statistics afresh
        env.reset(seed=episode)
        returns, lengths = np.full(6, np.nan), np.zeros(6, dtype=int)
        while not vec.all_done:
            *_, infos = env.step(random_policy([""] * 6, vec.infos_list, rng))
            if "episode" in infos:
                done = infos["_episode"]
                assert np.isnan(returns[done]).all(), "an episode was reported twice"
                returns[done], lengths[done] = (
                    infos["episode"]["r"][done],
                    infos["episode"]["l"][done],
                )
        # finished envs go on receiving (ignored) actions: no episode is counted again
        *_, infos = env.step(["left"] * 6)
        assert "episode" not in infos
        trajs = vec.trajectories()
        assert np.allclose(returns, [t.total_return for t in trajs])
        assert lengths.tolist() == [len(t.steps) for t in trajs]
        assert env.episode_count == 6 * (episode + 1)
    env.close()


def test_gymnasium_reward_wrappers_and_make_vec_switch():
    vec = gym.make_vec(ENV, num_envs=4, group_size=2, info_layout="gymnasium")
    assert isinstance(vec, GroupVectorEnv) and vec.info_layout == "gymnasium"
    env = vector_wrappers.TransformReward(vec, func=lambda r: 2 * r + 1)
    env.reset(seed=3)
    rng = np.random.default_rng(3)
    while not vec.all_done:
        stepped = vec.active.copy()
        _, rewards, *_ = env.step(random_policy([""] * 4, vec.infos_list, rng))
        raw = np.array(
            [
                t.steps[-1].reward if s else 0.0
                for t, s in zip(vec.trajectories(), stepped, strict=True)
            ]
        )
        assert np.allclose(rewards, 2 * raw + 1)
    env.close()
    with pytest.raises(ValueError, match="info_layout"):
        GroupVectorEnv(ENV, 1, 2, info_layout="dicts")


def test_single_env_under_gymnasium_wrappers():
    env = RecordEpisodeStatistics(TimeLimit(gym.make(ENV), max_episode_steps=3))
    with pytest.raises(gym.error.ResetNeeded):
        OrderEnforcing(gym.make(ENV)).step("left")
    env.reset(seed=0)
    total = 0.0
    for t in range(3):  # noqa: B007 - t is the step the episode ended on
        _, reward, terminated, truncated, info = env.step("left")
        total += reward
        if terminated:
            break
    assert terminated or (truncated and t == 2)
    assert info["episode"]["l"] == t + 1 and np.isclose(info["episode"]["r"], total)
    env.close()
    # the same wrappers inside every env of a group: nested infos become nested arrays
    wrappers = [(TimeLimit, {"max_episode_steps": 2}), (RecordEpisodeStatistics, {})]
    vec = GroupVectorEnv(ENV, 2, 2, wrappers=wrappers, info_layout="gymnasium")
    vec.reset(seed=1)
    vec.step(["left"] * 4)
    *_, terminated, truncated, infos = vec.step(["left"] * 4)
    assert (terminated | truncated).all() and vec.all_done
    assert infos["_episode"].all() and infos["episode"]["l"].tolist() == [2, 2, 2, 2]
    vec.close()


def test_a_string_action_and_a_reset_mask_get_clear_errors():
    vec = GroupVectorEnv(ENV, 1, 3)
    vec.reset(seed=0)
    with pytest.raises(TypeError, match=r"list of 3.*\[action\] \* 3"):
        vec.step("left")
    with pytest.raises(ValueError, match="reset_mask"):
        vec.reset(options={"reset_mask": np.ones(3, dtype=bool)})
    vec.reset(seed=0)
    assert len(vec.step(["left"] * 3)[0]) == 3  # still usable
    vec.close()


def test_batched_spaces_print_compactly():
    vec = GroupVectorEnv(ENV, num_groups=32, group_size=8)
    single = repr(vec.single_observation_space)
    assert repr(vec.observation_space) == f"Tuple({single} x 256)"
    assert len(repr(vec.action_space)) < 2 * len(repr(vec.single_action_space)) + 20
    # still Gymnasium's batched space: equal to batch_space's, contains a batch of observations
    from gymnasium.vector.utils import batch_space

    assert vec.observation_space == batch_space(vec.single_observation_space, 256)
    obs, _ = vec.reset(seed=0)
    assert vec.observation_space.contains(obs)
    vec.close()


# ----------------------------------------------------------------------------------------------
# Ray: a Ray the env started ends with the last env using it; the user's stays up
# ----------------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    """The process runs (a zombie, ended but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def test_ray_started_by_the_env_is_shut_down_and_the_users_is_not():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    opts = {"ray_options": {"num_cpus": 0}, "num_workers": 1}
    first = GroupVectorEnv(ENV, 1, 2, backend="ray", **opts)
    second = GroupVectorEnv(ENV, 1, 2, backend="ray", **opts)
    assert ray.is_initialized()
    node = ray._private.worker._global_node
    pids = [p.process.pid for procs in node.all_processes.values() for p in procs]
    assert pids and all(_alive(p) for p in pids)
    first.close()
    assert ray.is_initialized(), "closing one env stopped the Ray another env still uses"
    second.reset(seed=0)
    assert len(second.step(["left", "right"])[0]) == 2
    second.close()
    assert not ray.is_initialized()
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "the local Ray's processes (GCS, raylet) outlived it"

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        vec = GroupVectorEnv(ENV, 1, 2, backend="ray", **opts)
        vec.reset(seed=0)
        vec.close()
        assert ray.is_initialized(), "the user's Ray was shut down by the env"
        assert ray.cluster_resources().get("CPU") == 1
    finally:
        ray.shutdown()


def test_cli_rollout_runs_on_ray():
    pytest.importorskip("ray")
    out = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "rollout", "Corridor-v0"]
        + ["--groups", "1", "--group-size", "2", "--backend", "ray"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "backend ray" in out.stdout + out.stderr


_HEAD = """
import ray, sys, time
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
print(ray._private.worker._global_node.address_info["gcs_address"], flush=True)
sys.stdin.read()  # stays up until the test closes stdin
"""


@contextlib.contextmanager
def _token_cluster(home: Path) -> Iterator[tuple[str, str]]:
    """A one-CPU Ray cluster with token authentication, started by another driver (as
    ``ray start --head`` would on a head node); yields (its GCS address, its token).

    The token is explicit (``RAY_AUTH_TOKEN``) and ``HOME`` a fresh folder, so the cluster and
    the drivers that join it never read or write a token file of this machine's user.
    """
    token = secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, HOME=str(home))
    head = subprocess.Popen(
        [sys.executable, "-c", _HEAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        address = head.stdout.readline().strip()
        assert address, "the head driver did not start Ray"
        yield address, token
    finally:
        head.stdin.close()
        head.wait(timeout=60)


_JOIN = """
import ray, sys
from agentgym.vector import GroupVectorEnv
address = sys.argv[1]
vec = GroupVectorEnv(
    "AgentGym/Corridor-v0", 1, 2, backend="ray", num_workers=1, ray_address=address,
    ray_options={"num_cpus": 0},
)
assert ray.is_initialized()
assert ray.get_runtime_context().gcs_address == address
vec.reset(seed=0)
vec.close()
assert not ray.is_initialized()  # this driver left the cluster...
ray.init(address=address, log_to_driver=False, configure_logging=False)
assert ray.cluster_resources().get("CPU") == 1  # ...which is still up
ray.shutdown()
print("JOINED AND LEFT", flush=True)
"""


@pytest.mark.slow
def test_ray_address_joins_a_running_cluster_and_leaves_it_running(tmp_path):
    """Joining a token-authenticated cluster (Ray's default for a cluster ray.init() starts)
    with the token given on the driver. The driver is its own process with its own
    environment: Ray reads RAY_AUTH_MODE when it is loaded, so in this process the outcome
    would depend on whether an earlier test's ray.init() had set it."""
    pytest.importorskip("ray")
    assert ENV == "AgentGym/Corridor-v0"
    with _token_cluster(tmp_path) as (address, token):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(HOME=str(tmp_path), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        out = subprocess.run(
            [sys.executable, "-c", _JOIN, address],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        assert "JOINED AND LEFT" in out.stdout, out.stderr[-3000:]


@pytest.mark.slow
def test_joining_a_token_cluster_without_the_token_names_the_cause_and_the_fix(tmp_path):
    """A driver without RAY_AUTH_MODE=token (``ray_address`` or ``RAY_ADDRESS``) is refused
    by the cluster; the error says why and what to set, instead of a bare ConnectionError."""
    pytest.importorskip("ray")
    with _token_cluster(tmp_path) as (address, _):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(HOME=str(tmp_path), RAY_ADDRESS=address)  # no token mode, no token
        out = subprocess.run(
            [sys.executable, "-m", "agentgym.cli", "rollout", "Corridor-v0"]
            + ["--groups", "1", "--group-size", "2", "--backend", "ray"],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        assert out.returncode != 0
        assert "could not join the Ray cluster at " + address in out.stderr, out.stderr[-2000:]
        assert "RAY_AUTH_MODE=token" in out.stderr and "RAY_AUTH_TOKEN" in out.stderr
        assert "Traceback" not in out.stderr
        script = (
            "from agentgym.vector import GroupVectorEnv\n"
            "try:\n"
            f"    GroupVectorEnv('{ENV}', 1, 2, backend='ray', num_workers=1, "
            f"ray_address='{address}', ray_options={{'num_cpus': 0}})\n"
            "except ConnectionError as exc:\n"
            "    print('ERROR', exc)\n"
        )
        env.pop("RAY_ADDRESS")
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env
        )
        assert "ERROR could not join the Ray cluster" in out.stdout, out.stderr[-2000:]
        assert "RAY_AUTH_MODE=token" in out.stdout
