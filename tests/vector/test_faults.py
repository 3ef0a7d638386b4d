"""GroupVectorEnv under faults: env exceptions, interrupts, unpicklable actions, hung and killed
workers, use after close, scripts without a main guard, Ctrl-C.

Faults are real: workers are stopped with SIGSTOP and killed with SIGKILL, the parent is
interrupted with SIGINT, and scripts run in real subprocesses. Timeouts are short (1-2 s) so
the file stays fast.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import agentgym  # noqa: F401 - registers the ids
from agentgym.vector import GroupVectorEnv

ENV = "AgentGym/Corridor-v0"
REPO = Path(__file__).resolve().parents[2]
SHARDED = ["process", "ray"]


class Faulty(gym.Wrapper):
    """Raises on the action ``"boom"``; sleeps ``delay`` seconds on ``"slow"`` (then plays red)."""

    def __init__(self, env: gym.Env, delay: float = 0.5):
        super().__init__(env)
        self.delay = delay

    def step(self, action: Any):
        if action == "boom":
            raise ValueError("the env blew up on 'boom'")
        if action == "slow":
            time.sleep(self.delay)
            action = "red"
        return self.env.step(action)


class ExitWhileBuilding(gym.Wrapper):
    """A worker that dies (exit code 3) while it builds its envs."""

    def __init__(self, env: gym.Env):
        os._exit(3)


FAULTY = [(Faulty, {})]


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    # Ray workers cannot import test modules: ship this one's wrappers by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # one Ray for the module, started here, so the envs join it instead of each starting its own
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.shutdown()


def make(backend: str, request=None, **kwargs: Any) -> GroupVectorEnv:
    if backend == "ray":
        request.getfixturevalue("ray_session")
    kwargs.setdefault("num_workers", 2 if backend != "inprocess" else None)
    return GroupVectorEnv(ENV, backend=backend, **kwargs)


def worker_pids(vec: GroupVectorEnv) -> list[int]:
    return [p.pid for p in vec._backend.procs if p is not None]


def same(a: tuple, b: tuple) -> bool:
    """Two batched results are equal (obs, rewards, flags and state keys)."""
    if len(a) == 2:  # reset
        return a[0] == b[0] and [i["state_key"] for i in a[1]] == [i["state_key"] for i in b[1]]
    return (
        a[0] == b[0]
        and np.array_equal(a[1], b[1])
        and np.array_equal(a[2], b[2])
        and np.array_equal(a[3], b[3])
        and [i["state_key"] for i in a[4]] == [i["state_key"] for i in b[4]]
        and [i["action_valid"] for i in a[4]] == [i["action_valid"] for i in b[4]]
    )


# ----------------------------------------------------------------------------------------------
# 1. an exception in one env, or an interrupt, leaves every backend in sync
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["inprocess", *SHARDED])
def test_env_error_names_the_env_and_the_next_calls_stay_in_sync(backend, request):
    ref = make("inprocess", num_groups=2, group_size=4, wrappers=FAULTY)
    vec = make(backend, request, num_groups=2, group_size=4, wrappers=FAULTY, step_timeout=30)
    try:
        bad = [{"task": 0}, {"task": "not-a-number"}]
        with pytest.raises(RuntimeError, match=r"env 4 \(group 1\).*not-a-number") as err:
            vec.reset(seed=0, options={"group_options": bad})
        assert getattr(err.value, "env_index", None) == 4 and err.value.group == 1
        with pytest.raises(gym.error.ResetNeeded):  # a failed reset leaves no half-new episode
            vec.step(["red"] * 8)
        assert same(vec.reset(seed=1), ref.reset(seed=1))
        assert same(vec.step(["red"] * 8), ref.step(["red"] * 8))

        actions = ["blue"] * 8
        actions[6] = "boom"
        with pytest.raises(RuntimeError, match=r"env 6 \(group 1\).*blew up"):
            vec.step(actions)
        ref_actions = list(actions)
        ref_actions[6] = "red"
        ref.step(ref_actions)  # the others took their step; env 6's episode ended
        assert vec.step_index.tolist() == [2] * 6 + [1, 2]
        assert not vec.active[6] and "blew up" in vec.trajectories()[6].truncation_reason
        got, want = vec.step(["green"] * 8), ref.step(["green"] * 8)
        assert got[0][:6] == want[0][:6] and got[0][7] == want[0][7]
        assert np.array_equal(got[1][[0, 1, 2, 3, 4, 5, 7]], want[1][[0, 1, 2, 3, 4, 5, 7]])
        assert same(vec.reset(seed=2), ref.reset(seed=2))
    finally:
        ref.close()
        vec.close()


@pytest.mark.parametrize("backend", ["inprocess", *SHARDED])
def test_keyboard_interrupt_mid_step_leaves_the_backend_in_sync(backend, request):
    ref = make("inprocess", num_groups=2, group_size=2, wrappers=FAULTY)
    # The interrupt must land inside the slow step: a step that ended first would let it land in
    # pytest itself (on a busy machine a timer thread can wake up hundreds of ms late).
    slow = [(Faulty, {"delay": 3.0})]
    vec = make(backend, request, num_groups=2, group_size=2, wrappers=slow, step_timeout=30)
    try:
        vec.reset(seed=0)
        timer = threading.Timer(0.15, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            vec.step(["slow"] * 4)
        timer.join()
        with pytest.raises(gym.error.ResetNeeded, match="interrupted"):
            vec.step(["red"] * 4)
        assert same(vec.reset(seed=3), ref.reset(seed=3))
        for actions in (["red"] * 4, ["blue", "red", "green", "gold"]):
            assert same(vec.step(actions), ref.step(actions))
    finally:
        ref.close()
        vec.close()


# ----------------------------------------------------------------------------------------------
# 2. unpicklable actions are invalid steps on every backend
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", SHARDED)
def test_unpicklable_actions_are_invalid_steps_like_in_process(backend, request):
    ref = make("inprocess", num_groups=2, group_size=3)
    vec = make(backend, request, num_groups=2, group_size=3)
    try:
        lock = threading.Lock()
        actions = ["red", lambda: 0, "blue", lock, "green", "red"]
        ref.reset(seed=0)
        vec.reset(seed=0)
        want, got = ref.step(actions), vec.step(actions)
        assert same(got, want)
        assert [i["action_valid"] for i in got[4]][1] is False and not got[4][3]["action_valid"]
        assert got[0][1] == want[0][1] and "actions are text" in got[0][1]
        assert vec.step_index.tolist() == [1] * 6  # every env took its step, none was lost
        assert [len(t.steps) for t in vec.trajectories()] == [1] * 6
        assert same(vec.step(["red"] * 6), ref.step(["red"] * 6))
    finally:
        ref.close()
        vec.close()


# ----------------------------------------------------------------------------------------------
# 3. hung workers share one deadline
# ----------------------------------------------------------------------------------------------
def test_stopped_workers_cost_one_timeout_and_their_episodes_end_truncated():
    timeout = 1.5
    vec = make("process", num_groups=4, group_size=2, num_workers=4, step_timeout=timeout)
    stopped = []
    try:
        vec.reset(seed=0)
        stopped = [worker_pids(vec)[w] for w in (0, 2, 3)]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        obs, rewards, terminated, truncated, infos = vec.step(["red"] * 8)
        took = time.monotonic() - start
        assert timeout * 0.9 <= took < timeout * 1.8, f"step took {took:.1f} s"
        hung = np.isin(np.arange(8), [0, 1, 4, 5, 6, 7])
        assert truncated[hung].all() and not vec.active[hung].any()
        for i in np.flatnonzero(hung):
            assert "did not answer within" in infos[i]["truncation_reason"]
            assert vec.trajectories()[i].truncation_reason == infos[i]["truncation_reason"]
        assert vec.step_index.tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
        assert same(vec.reset(seed=5), GroupVectorEnv(ENV, 4, 2).reset(seed=5))
        assert set(worker_pids(vec)).isdisjoint(stopped)
    finally:
        vec.close()
        for pid in stopped:  # a stopped worker that survived would leak: it must be gone
            assert not _alive(pid), f"worker {pid} was left behind"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie waiting to be reaped counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------------------------------------
# 4. use after close
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["inprocess", *SHARDED])
def test_use_after_close_raises_and_close_is_idempotent(backend, request):
    vec = make(backend, request, num_groups=1, group_size=2)
    vec.reset(seed=0)
    pids = worker_pids(vec) if backend == "process" else []
    vec.close()
    vec.close()
    for call in (lambda: vec.reset(seed=0), lambda: vec.step(["red", "red"])):
        with pytest.raises(gym.error.ClosedEnvironmentError, match="closed"):
            call()
    assert len(vec.trajectories()) == 2  # the records stay readable
    if backend == "process":
        assert worker_pids(vec) == [] or all(not _alive(p) for p in worker_pids(vec))
        assert all(not _alive(p) for p in pids)


# ----------------------------------------------------------------------------------------------
# 5. construction failures, scripts without a main guard
# ----------------------------------------------------------------------------------------------
def test_worker_dying_while_building_says_so_and_not_replaced():
    with pytest.raises(RuntimeError, match="while building its envs") as err:
        GroupVectorEnv(
            ENV, 1, 2, backend="process", num_workers=1, wrappers=[(ExitWhileBuilding, {})]
        )
    assert "replaced" not in str(err.value) and "exit code 3" in str(err.value)
    with pytest.raises(RuntimeError, match="failed to build") as err:
        GroupVectorEnv(
            ENV, 1, 2, backend="process", num_workers=1, env_kwargs={"no_such_argument": 1}
        )
    assert "replaced" not in str(err.value) and "no_such_argument" in str(err.value)


README_EXAMPLE_WITHOUT_GUARD = """
import numpy as np
from agentgym import GroupVectorEnv
from agentgym.rollout import random_policy

vec = GroupVectorEnv("AgentGym/Corridor-v0", num_groups=2, group_size=2,
                     backend="process", num_workers=2)
rng = np.random.default_rng(0)
obs, infos = vec.reset(seed=0)
while not vec.all_done:
    obs, rewards, terminated, truncated, infos = vec.step(random_policy(obs, infos, rng))
print("episodes", len(vec.trajectories()), "done", all(t.done for t in vec.trajectories()))
vec.close()
"""


def _run_script(tmp_path: Path, source: str, **kwargs: Any) -> subprocess.Popen:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_script_without_main_guard_runs(tmp_path):
    proc = _run_script(tmp_path, README_EXAMPLE_WITHOUT_GUARD)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "episodes 4 done True" in out
    assert err.strip() == ""


def test_script_with_main_guard_runs(tmp_path):
    body = textwrap.indent(textwrap.dedent(README_EXAMPLE_WITHOUT_GUARD), "    ")
    proc = _run_script(tmp_path, 'if __name__ == "__main__":\n' + body)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "episodes 4 done True" in out


SCRIPT_WITH_ITS_OWN_WRAPPER = """
import gymnasium as gym
from agentgym import GroupVectorEnv


class Shout(gym.ObservationWrapper):  # defined in the script: workers must import it
    def observation(self, obs):
        return obs.upper()


def main():
    vec = GroupVectorEnv("AgentGym/Corridor-v0", num_groups=1, group_size=2,
                         backend="process", num_workers=2, wrappers=[(Shout, {{}})])
    obs, _ = vec.reset(seed=0)
    print("upper", all(o == o.upper() for o in obs))
    vec.close()


{call}
"""


def test_script_defining_its_own_wrapper_needs_the_guard_and_says_so(tmp_path):
    guarded = 'if __name__ == "__main__":\n    main()'
    proc = _run_script(tmp_path, SCRIPT_WITH_ITS_OWN_WRAPPER.format(call=guarded))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "upper True" in out

    proc = _run_script(tmp_path, SCRIPT_WITH_ITS_OWN_WRAPPER.format(call="main()"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert err.count("Traceback") == 1, err  # the script's own; the workers print nothing
    last = err.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: env workers 0, 1 failed to build their envs: "), last
    assert 'if __name__ == "__main__":' in last


# ----------------------------------------------------------------------------------------------
# 6. Ctrl-C during a process-backend rollout
# ----------------------------------------------------------------------------------------------
CTRL_C_SCRIPT = """
import sys
from agentgym.vector import GroupVectorEnv
sys.path.insert(0, {tests!r})
from test_faults import Faulty

if __name__ == "__main__":
    vec = GroupVectorEnv("AgentGym/Corridor-v0", num_groups=4, group_size=2, backend="process",
                         num_workers=4, wrappers=[(Faulty, {{"delay": 0.2}})])
    print("pids", *[p.pid for p in vec._backend.procs], flush=True)
    while True:
        vec.reset()
        while not vec.all_done:
            vec.step(["slow"] * vec.num_envs)
"""


def test_ctrl_c_prints_one_traceback_and_leaves_no_workers(tmp_path):
    # A new session stands in for the terminal: Ctrl-C signals its whole foreground group.
    proc = _run_script(
        tmp_path, CTRL_C_SCRIPT.format(tests=str(Path(__file__).parent)), start_new_session=True
    )
    line = proc.stdout.readline()
    assert line.startswith("pids"), proc.stderr.read()
    pids = [int(p) for p in line.split()[1:]]
    time.sleep(0.5)  # mid-rollout: workers are inside their env steps
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    lines = err.strip().splitlines()
    assert proc.returncode != 0
    assert err.count("Traceback") <= 1 and lines[-1].startswith("KeyboardInterrupt"), err
    assert len(lines) <= 10, f"{len(lines)} lines of stderr on Ctrl-C:\n{err}"
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "workers outlived the interrupted script"


def test_stopped_ray_actors_cost_one_timeout(request):
    request.getfixturevalue("ray_session")
    timeout = 2.0
    vec = make(  # three actors on a two-core machine: they must not each reserve a CPU
        "ray",
        request,
        num_groups=3,
        group_size=2,
        num_workers=3,
        step_timeout=timeout,
        ray_options={"num_cpus": 0},
    )
    try:
        vec.reset(seed=0)
        ray = vec._backend.ray
        pids = [
            ray.get(a.__ray_call__.remote(lambda self: os.getpid())) for a in vec._backend.actors
        ]
        for pid in pids[:2]:
            os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        truncated, infos = vec.step(["red"] * 6)[3:]
        took = time.monotonic() - start
        assert timeout * 0.9 <= took < timeout * 1.8, f"step took {took:.1f} s"
        assert truncated[:4].all() and vec.step_index.tolist() == [0, 0, 0, 0, 1, 1]
        assert all("did not answer within" in infos[i]["truncation_reason"] for i in range(4))
        assert same(vec.reset(seed=5), GroupVectorEnv(ENV, 3, 2).reset(seed=5))
    finally:
        vec.close()
