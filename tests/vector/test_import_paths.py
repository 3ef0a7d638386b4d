"""The vector env's former home, ``agentgym.wrappers.group``, and the public shortcuts give the
objects of :mod:`agentgym.vector` themselves; pickles that name the old module still load; every
backend satisfies the :class:`~agentgym.vector.backends.Backend` protocol."""

from __future__ import annotations

import pickle
import typing

import pytest

import agentgym
import agentgym.vector as vector
import agentgym.wrappers
import agentgym.wrappers.group as old_group
from agentgym.vector import Backend, BackendName, GroupVectorEnv, InfoLayout, Step, Trajectory
from agentgym.wrappers import ActionFormat, parse_action

ENV = "AgentGym/Corridor-v0"


def test_old_module_re_exports_the_same_objects():
    assert old_group.__all__, "agentgym.wrappers.group exports nothing"
    for name in old_group.__all__:
        assert getattr(old_group, name) is getattr(vector, name), name
    for name in ("GroupVectorEnv", "Step", "Trajectory"):
        assert getattr(agentgym, name) is getattr(vector, name), name
    for name in ("GroupVectorEnv", "Step", "Trajectory", "EnvError", "EnvFactory"):
        assert getattr(agentgym.wrappers, name) is getattr(vector, name), name
    assert old_group.vector_entry_point is vector.vector_entry_point


def test_gym_make_vec_builds_the_vector_packages_env():
    import gymnasium as gym

    vec = gym.make_vec(ENV, num_envs=4, group_size=2)
    assert type(vec) is GroupVectorEnv and vec.num_groups == 2
    vec.close()


def _as_if_pickled_by_the_old_module(obj: object, new_module: str) -> bytes:
    """``obj`` pickled as the old ``agentgym.wrappers.group`` would have: its class named there.

    Protocol 0 names classes as text lines (``c<module>\\n<name>\\n``), so the module can be
    swapped without re-encoding lengths.
    """
    data = pickle.dumps(obj, protocol=0)
    old = data.replace(f"c{new_module}\n".encode(), b"cagentgym.wrappers.group\n")
    assert old != data and new_module.encode() not in old, "the pickle does not name the class"
    return old


def test_pickles_naming_the_old_module_load_as_the_new_classes():
    vec = GroupVectorEnv(ENV, num_groups=1, group_size=2)
    vec.reset(seed=3)
    after, *_ = vec.step(["red", "blue"])
    traj = vec.trajectories()[0]
    snap = vec.snapshot(0)
    vec.close()

    step = pickle.loads(_as_if_pickled_by_the_old_module(traj.steps[0], "agentgym.vector.records"))
    assert type(step) is Step and step == traj.steps[0]
    # a Trajectory holds Steps: both class references are rewritten
    loaded = pickle.loads(_as_if_pickled_by_the_old_module(traj, "agentgym.vector.records"))
    assert type(loaded) is Trajectory and loaded == traj
    old_snap = _as_if_pickled_by_the_old_module(snap, "agentgym.vector.snapshot")
    restored = pickle.loads(old_snap)
    assert type(restored) is vector.GroupEnvSnapshot and restored.state_key == snap.state_key

    # the restored snapshot is usable: a fresh vector env continues from it
    other = GroupVectorEnv(ENV, num_groups=1, group_size=2)
    obs, infos = other.reset_to([restored, restored])
    assert [i["state_key"] for i in infos] == [snap.state_key] * 2
    assert obs == [after[0]] * 2
    other.close()


@pytest.mark.parametrize("backend", ["inprocess", "process"])
def test_backends_satisfy_the_protocol(backend: BackendName):
    vec = GroupVectorEnv(ENV, num_groups=1, group_size=2, backend=backend, num_workers=1)
    try:
        assert isinstance(vec._backend, Backend)
        owner = vec._backend.owner
        assert (owner is None) == (backend == "inprocess")
    finally:
        vec.close()


def test_literal_argument_types_name_every_accepted_value():
    hints = typing.get_type_hints(GroupVectorEnv.__init__)
    assert hints["backend"] == BackendName and hints["info_layout"] == InfoLayout
    assert typing.get_args(BackendName) == ("inprocess", "process", "ray")
    assert typing.get_args(InfoLayout) == ("list", "gymnasium")
    with pytest.raises(ValueError, match="'inprocess', 'process' or 'ray'"):
        GroupVectorEnv(ENV, backend="threads")  # type: ignore[arg-type]
    # the action formats of the LLM wrappers: every value the type names is accepted
    assert typing.get_type_hints(parse_action)["fmt"] == ActionFormat
    for fmt in typing.get_args(ActionFormat):
        parse_action("<action>go</action>", fmt)
    with pytest.raises(ValueError, match="unknown action format"):
        parse_action("<action>go</action>", "xml")  # type: ignore[arg-type]
