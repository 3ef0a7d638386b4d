"""Group rollouts: ``num_groups x group_size`` envs, every env of a group on the same task.

GRPO-style trainers (GRPO, GiGPO, RLOO...) compare several trajectories that start from the same
task and initial state. :class:`GroupVectorEnv` runs those groups: env ``i`` belongs to group
``i // group_size``; all envs of a group are reset with the same per-group seed (so, for every
agentgym env, the same task and the same initial state), and different groups get different
seeds. Autoreset is off: an env whose episode ended stays done (``active[i] == False``) until the
next :meth:`GroupVectorEnv.reset`, which is what a trainer that collects whole trajectories wants.

Every step is recorded in a :class:`Trajectory` of :class:`Step` records; ``Step.state_key`` is the
state the action was taken *from* (GiGPO's anchor state).

Branching (every backend): :meth:`GroupVectorEnv.snapshot` takes env ``i``'s state (env and
wrappers), :meth:`GroupVectorEnv.reset_to` starts every env from a snapshot (e.g. k copies of
one state, for SLATE's step-level groups), and :meth:`GroupVectorEnv.branch` copies one env
mid-rollout into others. Branched records keep the shared prefix and mark the branch point
(:attr:`Trajectory.branch_step`, :attr:`Trajectory.branch_of`).

Backends (``backend=``):

- ``"inprocess"`` (default): envs live in this process. Text env steps take micro- to milliseconds,
  so inter-process hops cost more than they save for light envs.
- ``"process"``: envs are split over ``num_workers`` worker processes that step their share in
  parallel; for heavy envs (real ALFWorld, WebShop's search engine). Workers are fresh
  interpreters that import only agentgym (and the user's script only when an env or wrapper
  class is defined there), so scripts work without an ``if __name__ == "__main__":`` guard;
  they run in their own process group and ignore SIGINT, so Ctrl-C reaches only the caller.
- ``"ray"``: the same shards as Ray actors, spread over the machines of a Ray cluster.

Faults (``"process"`` and ``"ray"`` alike):

- A worker that dies (killed, out of memory, a segfault in a simulator) or does not answer
  within ``step_timeout`` (one deadline for all workers of a call) ends the episodes it held
  with ``truncated=True`` and ``info["truncation_reason"]`` saying why; a fresh worker starts at
  once and takes those envs at the next reset. Nothing hangs.
- An env that raises ends its own episode the same way; the other envs take their step; then
  :class:`EnvError` names the env (index and group) and the cause. In ``reset``, the error is
  raised after every env has answered, and ``step`` asks for another reset.
- An action that cannot be pickled is an invalid step, as in-process.
- After ``KeyboardInterrupt`` in ``step``, the next call must be ``reset`` (the records no
  longer say which envs stepped); replies of the abandoned call are recognised and dropped.
- After ``close()``, ``reset`` / ``step`` / ``call`` raise ``ClosedEnvironmentError``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from agentgym.core import EnvSnapshot, SnapshotMismatch
from agentgym.vector.backends import process as _process
from agentgym.vector.backends.base import Backend, BackendName
from agentgym.vector.backends.inprocess import InProcessBackend
from agentgym.vector.backends.process import ProcessBackend
from agentgym.vector.backends.ray import RayBackend
from agentgym.vector.factory import EnvFactory, WrapperSpec
from agentgym.vector.failures import BootstrapError, EnvError, Failure
from agentgym.vector.records import Step, Trajectory

__all__ = ["GroupVectorEnv", "InfoLayout", "Infos", "make_group_vector_env", "vector_entry_point"]

InfoLayout = Literal["list", "gymnasium"]
"""the ``info_layout=`` argument of :class:`GroupVectorEnv`"""
#: ``info_layout="list"``: one dict per env; ``"gymnasium"``: a dict of arrays and ``_key`` masks
Infos = list[dict[str, Any]] | dict[str, Any]


class GroupVectorEnv(gym.vector.VectorEnv):
    """``num_groups x group_size`` copies of one env id; every group's envs share task and state.

    Args:
        env_id: a registered id, e.g. ``"AgentGym/Sokoban-v0"``, or an ``EnvSpec`` (for envs
            registered only in this process: workers rebuild them from the spec's entry point).
        num_groups: how many distinct tasks per reset.
        group_size: trajectories per task (GiGPO / GRPO's group size ``N``).
        backend: ``"inprocess"`` (default), ``"process"`` or ``"ray"``.
        num_workers: worker processes / Ray actors (default: CPU count, at most one per env).
        env_kwargs: keyword arguments for ``gym.make(env_id, ...)``.
        wrappers: ``(wrapper_class, kwargs)`` pairs applied to every env in order (e.g. the LLM
            prompt/parse wrappers); picklable so that workers can build them.
        step_timeout: seconds every worker has to answer one ``reset`` / ``step`` (one deadline
            for all of them); a worker still silent then is killed and its episodes end.
        ray_options: for ``backend="ray"``: actor options (``num_cpus``, ``resources``...).

        ray_address: for ``backend="ray"`` when Ray is not initialised yet: the cluster to join
            (``"auto"``, ``"ray://head:10001"``...; None: ``RAY_ADDRESS`` or a new local Ray).
            A Ray that this env started or joined is shut down (or left) when the last env
            using it closes; a Ray the user initialised stays up.
        info_layout: ``"list"`` (default): infos are a list of per-env dicts, what the trainers
            and :func:`agentgym.rollout.run_group_rollout` read. ``"gymnasium"``: Gymnasium's
            vector layout, a dict of arrays with a boolean ``"_key"`` mask per key, which
            Gymnasium's vector wrappers (``RecordEpisodeStatistics``, ``DictInfoToList``...)
            expect. Either way :attr:`infos_list` gives the list view.

    Batched results are lists / arrays of length ``num_envs = num_groups * group_size``:
    ``reset -> (obs: list[str], infos)`` and
    ``step(actions) -> (obs: list[str], rewards: float32 (num_envs,), terminated: bool (num_envs,),
    truncated: bool (num_envs,), infos)``. Envs that are no longer ``active`` ignore their action
    and report their final observation and reward 0. With ``info_layout="list"`` they also repeat
    their final flags and info. With ``"gymnasium"``, as in Gymnasium's vector envs (autoreset
    disabled), ``terminated`` / ``truncated`` mark only the step an episode ended, and an env that
    did not step has no entry in the infos (its ``_key`` masks are False): so episode statistics
    count each episode once. Text-agent infos hold strings, lists and state keys: in the
    gymnasium layout those are object arrays (``infos["state_key"][i]``).

    Two tasks, two trajectories each; the envs of a group start from the same state:

    >>> venv = GroupVectorEnv("AgentGym/Corridor-v0", num_groups=2, group_size=2)
    >>> obs, infos = venv.reset(seed=0)
    >>> venv.num_envs, venv.group_ids.tolist()
    (4, [0, 0, 1, 1])
    >>> infos[0]["state_key"] == infos[1]["state_key"], infos[0]["task_id"] == infos[2]["task_id"]
    (True, False)
    >>> obs, rewards, terminated, truncated, infos = venv.step(["red", "blue", "red", "red"])
    >>> rewards.shape, terminated.dtype, venv.active.tolist()
    ((4,), dtype('bool'), [True, True, True, True])
    >>> [len(t.steps) for t in venv.trajectories()], venv.trajectories()[0].steps[0].action
    ([1, 1, 1, 1], 'red')
    >>> venv.close()
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.DISABLED}

    def __init__(
        self,
        env_id: str | gym.envs.registration.EnvSpec,
        num_groups: int = 1,
        group_size: int = 8,
        backend: BackendName = "inprocess",
        num_workers: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[WrapperSpec] = (),
        step_timeout: float = 300.0,
        ray_options: dict[str, Any] | None = None,
        ray_address: str | None = None,
        info_layout: InfoLayout = "list",
    ):
        if info_layout not in ("list", "gymnasium"):
            raise ValueError(f"info_layout must be 'list' or 'gymnasium', got {info_layout!r}")
        self.info_layout = info_layout
        if num_groups < 1 or group_size < 1:
            raise ValueError(
                f"num_groups and group_size must be >= 1, got {num_groups}, {group_size}"
            )
        self.env_id = env_id
        self.num_groups = num_groups
        self.group_size = group_size
        self.num_envs = num_groups * group_size
        self.factory = EnvFactory(env_id, dict(env_kwargs or {}), tuple(wrappers))
        if backend == "process" and _process._IMPORTING_MAIN_IN_WORKER:
            raise BootstrapError(
                "an env worker imported this script (its envs use a class defined in it) and the "
                "script built a GroupVectorEnv at import time: put the script's code under "
                '`if __name__ == "__main__":`, or define the env and wrapper classes in a module'
            )
        self.closed = False  # before the backend starts: __del__ must see it if that fails
        if backend == "inprocess":
            self._backend: Backend = InProcessBackend(self.factory, self.num_envs)
        elif backend == "process":
            self._backend = ProcessBackend(self.factory, self.num_envs, num_workers, step_timeout)
        elif backend == "ray":
            self._backend = RayBackend(
                self.factory, self.num_envs, num_workers, step_timeout, ray_options, ray_address
            )
        else:
            raise ValueError(f"unknown backend {backend!r}; use 'inprocess', 'process' or 'ray'")
        self.backend = backend

        probe = self.factory() if backend != "inprocess" else self._local_envs()[0]
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        self.spec = probe.spec
        if backend != "inprocess":
            probe.close()
        self.observation_space = _compact(batch_space(self.single_observation_space, self.num_envs))
        self.action_space = _compact(batch_space(self.single_action_space, self.num_envs))
        assert isinstance(self.observation_space, spaces.Tuple)

        self.group_ids = np.repeat(np.arange(num_groups), group_size)
        self.traj_ids = np.full(self.num_envs, -1, dtype=np.int64)
        self.step_index = np.zeros(self.num_envs, dtype=np.int64)
        self.active = np.zeros(self.num_envs, dtype=bool)
        self._terminated = np.zeros(self.num_envs, dtype=bool)
        self._truncated = np.zeros(self.num_envs, dtype=bool)
        self._next_traj_id = 0
        self._rng = np.random.default_rng()
        self._obs: list[str] = [""] * self.num_envs
        self._infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._trajs: list[Trajectory] = []
        #: why step() needs a reset first (None once a reset succeeded)
        self._reset_needed: str | None = "call reset() before step()"

    # ------------------------------------------------------------------------------------------
    def group_seeds(self, seed: int | None) -> list[int]:
        """The per-group reset seeds: derived from ``seed`` (reproducible) or drawn fresh."""
        if seed is None:
            return [int(s) for s in self._rng.integers(0, 2**31 - 1, size=self.num_groups)]
        self._rng = np.random.default_rng(seed)
        return [int(s) for s in np.random.SeedSequence(seed).generate_state(self.num_groups) >> 1]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[str], Infos]:
        """Start a new episode in every env.

        Args:
            seed: reproducible per-group seeds are derived from it; None draws fresh ones.
            options: passed to every env's reset, except ``options["group_options"]``, a list of
                ``num_groups`` dicts passed to the envs of each group (e.g. ``{"task": 17}``).
        """
        options = dict(options or {})
        if "reset_mask" in options:
            # Gymnasium's partial reset: a group's envs must restart together on one task
            raise ValueError(
                "GroupVectorEnv resets every env at once (the envs of a group share a task), so "
                "options['reset_mask'] is not supported: call reset() without it when all_done"
            )
        group_options = options.pop("group_options", None)
        if group_options is not None and len(group_options) != self.num_groups:
            raise ValueError(
                f"group_options has {len(group_options)} entries, expected {self.num_groups}"
            )
        self._check_open()
        seeds = self.group_seeds(seed)
        requests = []
        for i in range(self.num_envs):
            g = int(self.group_ids[i])
            opts = {**options, **(group_options[g] if group_options else {})}
            requests.append((i, seeds[g], opts or None))
        # Until every env has reset, the records describe no episode: a reset that raises or is
        # interrupted leaves step() asking for another reset, not stepping half-old envs.
        self._reset_needed = "the last reset() did not complete; call reset() again"
        self.active[:] = False
        try:
            results = self._backend.reset(requests)
        except KeyboardInterrupt:
            raise KeyboardInterrupt("GroupVectorEnv.reset() interrupted") from None
        failed = [i for i, res in enumerate(results) if isinstance(res, Failure)]
        if failed:
            raise self._env_error(failed, [results[i] for i in failed], "reset")

        self.traj_ids = np.arange(self._next_traj_id, self._next_traj_id + self.num_envs)
        self._next_traj_id += self.num_envs
        self.step_index[:] = 0
        self.active[:] = True
        self._terminated[:] = False
        self._truncated[:] = False
        self._trajs = []
        for i, (obs, info) in enumerate(results):
            self._obs[i], self._infos[i] = obs, info
            self._trajs.append(
                Trajectory(
                    int(self.group_ids[i]),
                    int(self.traj_ids[i]),
                    str(info.get("task_id", "")),
                    start_info=info,
                )
            )
        self._reset_needed = None
        if self.info_layout == "gymnasium":
            return list(self._obs), self._gymnasium_infos(np.ones(self.num_envs, dtype=bool))
        return list(self._obs), list(self._infos)

    def step(
        self, actions: Sequence[Any]
    ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, Infos]:
        """Step every active env; see the class docstring for shapes.

        An env that raises ends its episode truncated (``truncation_reason`` names the error)
        while every other env takes its step as usual, then :class:`EnvError` names the env
        and the cause; the next ``step`` carries on with the others. An env whose worker died or
        hung ends truncated the same way, without an error. If the call is interrupted
        (KeyboardInterrupt), nothing tells which envs stepped, so the next call must be
        ``reset()``.
        """
        self._check_open()
        if isinstance(actions, (str, bytes)):
            raise TypeError(
                f"step() takes one action per env, a list of {self.num_envs}, not the single "
                f"string {actions!r:.60}; for the same action everywhere pass "
                f"[action] * {self.num_envs}"
            )
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        if self._reset_needed is not None:
            raise gym.error.ResetNeeded(self._reset_needed)
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        live = np.flatnonzero(self.active)
        try:
            results = self._backend.step([(int(i), actions[i]) for i in live])
        except BaseException as exc:
            self._reset_needed = (
                f"the last step() was interrupted ({type(exc).__name__}), so the episode "
                "records no longer match the envs; call reset()"
            )
            if isinstance(exc, KeyboardInterrupt):
                # Ctrl-C: one short traceback ending here, not the backend's internals
                raise KeyboardInterrupt("GroupVectorEnv.step() interrupted") from None
            raise
        raised = []
        for i, res in zip(live, results, strict=True):
            traj = self._trajs[i]
            anchor_obs, anchor_key = self._obs[i], self._infos[i].get("state_key")
            if isinstance(res, Failure):  # end the episode, keep what was recorded
                if res.raised:
                    raised.append(int(i))
                    reason = f"the env raised {res.reason}"
                else:
                    reason = res.reason
                info = dict(self._infos[i], truncation_reason=reason, action_valid=False)
                self._infos[i] = info
                self._truncated[i] = True
                self.active[i] = False
                traj.truncated, traj.truncation_reason = True, reason
                continue
            obs, reward, terminated, truncated, info = res
            rewards[i] = reward
            self.step_index[i] += 1
            self._obs[i], self._infos[i] = obs, info
            traj.steps.append(
                Step(
                    anchor_obs,
                    _as_text(actions[i]),
                    float(reward),
                    anchor_key,
                    bool(info.get("action_valid", True)),
                    info,
                )
            )
            if terminated or truncated:
                self.active[i] = False
                self._terminated[i], self._truncated[i] = terminated, truncated
                traj.terminated, traj.truncated = bool(terminated), bool(truncated)
                traj.won = bool(info.get("won", False))
                if truncated:
                    traj.truncation_reason = info.get("truncation_reason", "step limit")
        if raised:
            by_env = dict(zip(live.tolist(), results, strict=True))
            raise self._env_error(raised, [by_env[i] for i in raised], "step")
        if self.info_layout == "gymnasium":
            stepped = np.zeros(self.num_envs, dtype=bool)
            stepped[live] = True
            return (
                list(self._obs),
                rewards,
                self._terminated & stepped,
                self._truncated & stepped,
                self._gymnasium_infos(stepped),
            )
        return (
            list(self._obs),
            rewards,
            self._terminated.copy(),
            self._truncated.copy(),
            list(self._infos),
        )

    # ------------------------------------------------------------------------------------------
    # branching: start envs from snapshots, or copy one env's state and record into others
    # ------------------------------------------------------------------------------------------
    def snapshot(self, i: int) -> EnvSnapshot:
        """Env ``i``'s state now (any backend), with its wrappers' state: a
        :class:`GroupEnvSnapshot`, immutable and picklable, for :meth:`reset_to` of this or
        another vector env of the same id, arguments and wrappers."""
        self._check_open()
        i = self._env_index(i, "snapshot(i)")
        if self._reset_needed is not None:
            raise gym.error.ResetNeeded(self._reset_needed)
        (res,) = self._backend.call_envs("snapshot", [(i,)])
        if isinstance(res, Failure):
            if not res.raised:
                self._end_worker_envs(i, res.reason)
            raise self._env_error([i], [res], "snapshot")
        return res

    def reset_to(
        self,
        snapshots: Sequence[EnvSnapshot],
        prefixes: Sequence[Trajectory | None] | None = None,
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """Start every env from a snapshot: env ``i`` is restored to ``snapshots[i]``.

        Args:
            snapshots: ``num_envs`` snapshots, from :meth:`snapshot` (of this or another vector
                env built alike) or, for envs without wrappers of their own, from
                ``env.unwrapped.snapshot()``. One snapshot may appear many times (k copies).
            prefixes: optional, ``num_envs`` entries: env ``i``'s trajectory record starts as a
                copy of ``prefixes[i].steps`` (the steps that led to ``snapshots[i]``) with
                ``branch_step = len(prefix.steps)`` and ``branch_of`` the prefix's
                ``(group_id, traj_id)``; None entries (or no ``prefixes``) start empty records.

        Returns:
            ``(obs, infos)``: each env's last observation and info at its snapshot (infos in
            the vector env's ``info_layout``, as :meth:`reset` returns them). Envs whose
            snapshot was taken after their episode ended start done (``active[i] == False``);
            group ids are as after :meth:`reset` (env ``i`` in group ``i // group_size``) and
            every env gets a new ``traj_id``.

        Raises:
            ValueError: wrong lengths, or a prefix that does not end in its snapshot's state.
            SnapshotMismatch: a snapshot of another id, variant or wrapper stack; the message
                names the first such env. A failed ``reset_to`` leaves ``step()`` asking for a
                reset (or another ``reset_to``).
        """
        self._check_open()
        if len(snapshots) != self.num_envs:
            raise ValueError(f"reset_to() got {len(snapshots)} snapshots, expected {self.num_envs}")
        if prefixes is not None and len(prefixes) != self.num_envs:
            raise ValueError(f"reset_to() got {len(prefixes)} prefixes, expected {self.num_envs}")
        for i, snap in enumerate(snapshots):
            if not isinstance(snap, EnvSnapshot):
                raise TypeError(
                    f"snapshots[{i}] is a {type(snap).__name__}, not an EnvSnapshot; take "
                    "snapshots with vec.snapshot(i) or env.unwrapped.snapshot()"
                )
            prefix = prefixes[i] if prefixes is not None else None
            if prefix is not None and prefix.steps:
                end = prefix.steps[-1].info.get("state_key", snap.state_key)
                if end != snap.state_key:
                    raise ValueError(
                        f"prefixes[{i}] ends in state {end!r:.80} but snapshots[{i}] holds "
                        f"{snap.state_key!r:.80}: pass the trajectory that led to the snapshot"
                    )
        self._reset_needed = "the last reset_to() did not complete; call reset() or reset_to()"
        self.active[:] = False
        try:
            results = self._backend.call_envs("restore", list(enumerate(snapshots)))
        except KeyboardInterrupt:
            raise KeyboardInterrupt("GroupVectorEnv.reset_to() interrupted") from None
        failed = [i for i, res in enumerate(results) if isinstance(res, Failure)]
        if failed:
            raise self._restore_error(failed, [results[i] for i in failed], "reset_to")

        self.traj_ids = np.arange(self._next_traj_id, self._next_traj_id + self.num_envs)
        self._next_traj_id += self.num_envs
        self._trajs = []
        for i, (obs, info) in enumerate(results):
            prefix = prefixes[i] if prefixes is not None else None
            traj = Trajectory(
                int(self.group_ids[i]),
                int(self.traj_ids[i]),
                str(info.get("task_id", "")),
                start_info=None if prefix is not None and prefix.steps else info,
            )
            if prefix is not None:
                traj.steps = [copy.copy(step) for step in prefix.steps]
                traj.branch_step = len(prefix.steps)
                traj.branch_of = (prefix.group_id, prefix.traj_id)
                if prefix.steps:
                    traj.start_info = prefix.start_info
            self._set_done(i, traj, snapshots[i].done, info)
            self._obs[i], self._infos[i] = obs, info
            self.step_index[i] = len(traj.steps)
            self._trajs.append(traj)
        self._reset_needed = None
        if self.info_layout == "gymnasium":
            return list(self._obs), self._gymnasium_infos(np.ones(self.num_envs, dtype=bool))
        return list(self._obs), list(self._infos)

    def branch(self, source: int, targets: Sequence[int]) -> tuple[list[str], list[dict[str, Any]]]:
        """Mid-rollout, make every env in ``targets`` a copy of env ``source`` as it is now.

        Each target gets the source's state (env and wrappers, shipped between workers by the
        process and Ray backends) and a new trajectory record: a copy of the source's steps so
        far, with ``branch_step = len(source steps)`` and ``branch_of = (source group_id,
        source traj_id)``; its ``traj_id`` is new, its ``group_id`` stays ``target //
        group_size``. The source carries on unchanged. Targets are active unless the source's
        episode has ended. To draw k continuations of one state, branch the source into k - 1
        targets (the source continues as the k-th) or into k targets; see :class:`Trajectory`
        for how a trainer finds the siblings.

        Returns ``(obs, infos)`` of the targets, in ``targets`` order: lists, one observation
        and one info dict per target, whatever ``info_layout`` is.
        """
        self._check_open()
        source = self._env_index(source, "branch() source")
        targets = [self._env_index(t, "branch() target") for t in targets]
        if source in targets or len(set(targets)) != len(targets):
            raise ValueError(
                f"branch() targets {targets} must be distinct envs other than the source {source}"
            )
        if self._reset_needed is not None:
            raise gym.error.ResetNeeded(self._reset_needed)
        if not targets:
            return [], []
        snap = self.snapshot(source)
        try:
            results = self._backend.call_envs("restore", [(t, snap) for t in targets])
        except BaseException as exc:
            self._reset_needed = (
                f"the last branch() was interrupted ({type(exc).__name__}), so the records of "
                "its targets no longer match the envs; call reset() or reset_to()"
            )
            raise
        src = self._trajs[source]
        failed = []
        for t, res in zip(targets, results, strict=True):
            self.traj_ids[t] = self._next_traj_id
            self._next_traj_id += 1
            if isinstance(res, Failure):  # the target holds no episode now: it stays done
                failed.append(t)
                reason = f"branch() could not restore it: {res.reason}"
                self._trajs[t] = Trajectory(
                    int(self.group_ids[t]),
                    int(self.traj_ids[t]),
                    src.task_id,
                    truncated=True,
                    truncation_reason=reason,
                )
                self.active[t], self._terminated[t], self._truncated[t] = False, False, True
                self._infos[t] = dict(self._infos[t], truncation_reason=reason)
                continue
            obs, info = res
            traj = Trajectory(
                int(self.group_ids[t]),
                int(self.traj_ids[t]),
                src.task_id,
                [copy.copy(step) for step in src.steps],
                branch_step=len(src.steps),
                branch_of=(src.group_id, src.traj_id),
                start_info=src.start_info if src.steps else info,
            )
            self._set_done(t, traj, snap.done, info)
            traj.truncation_reason = src.truncation_reason
            self._obs[t], self._infos[t] = obs, info
            self.step_index[t] = len(traj.steps)
            self._trajs[t] = traj
        for t in failed:
            if not results[targets.index(t)].raised:
                self._end_worker_envs(t, results[targets.index(t)].reason)
        if failed:
            raise self._restore_error(failed, [results[targets.index(t)] for t in failed], "branch")
        return [self._obs[t] for t in targets], [self._infos[t] for t in targets]

    def _end_worker_envs(self, i: int, reason: str) -> None:
        """Env ``i``'s worker was lost (a fresh one holds new envs): every episode it held ends
        truncated, as a lost worker's episodes do in ``step``."""
        owner = self._backend.owner
        held = np.flatnonzero(owner == owner[i]) if owner is not None else [i]
        for j in held:
            if self.active[j]:
                self.active[j], self._truncated[j] = False, True
                self._trajs[j].truncated, self._trajs[j].truncation_reason = True, reason
                self._infos[j] = dict(self._infos[j], truncation_reason=reason)

    def _env_index(self, i: Any, what: str) -> int:
        if not isinstance(i, (int, np.integer)) or not 0 <= i < self.num_envs:
            raise IndexError(f"{what} must be an env index in [0, {self.num_envs}), got {i!r}")
        return int(i)

    def _set_done(
        self, i: int, traj: Trajectory, done: tuple[bool, bool] | None, info: dict[str, Any]
    ) -> None:
        """Env ``i`` (and its record) as the restored episode is: active, or ended."""
        terminated, truncated = done if done is not None else (False, False)
        self.active[i] = done is None
        self._terminated[i], self._truncated[i] = terminated, truncated
        traj.terminated, traj.truncated = bool(terminated), bool(truncated)
        if done is not None:
            traj.won = bool(info.get("won", False))
            if truncated:
                traj.truncation_reason = info.get("truncation_reason", "step limit")

    def _restore_error(self, failed: list[int], failures: list[Failure], call: str) -> Exception:
        """A refused snapshot is the env's :class:`SnapshotMismatch` (naming the env index);
        anything else an :class:`EnvError`."""
        first, res = failed[0], failures[0]
        if res.reason.startswith(("SnapshotMismatch:", "TypeError:", "ValueError:")):
            more = f" (and {len(failed) - 1} more: envs {failed[1:]})" if len(failed) > 1 else ""
            kind = SnapshotMismatch if res.reason.startswith("SnapshotMismatch") else ValueError
            group = int(self.group_ids[first])
            err = kind(
                f"{call}(): env {first} (group {group}){more} refused its snapshot: {res.reason}"
            )
            err.__cause__ = res.exc
            return err
        return self._env_error(failed, failures, call)

    # ------------------------------------------------------------------------------------------
    @property
    def infos_list(self) -> list[dict[str, Any]]:
        """The latest info of every env as a list of dicts, whatever ``info_layout`` is (an env
        that finished keeps the info of its last step)."""
        return list(self._infos)

    def _gymnasium_infos(self, mask: np.ndarray) -> dict[str, Any]:
        """Gymnasium's dict-of-arrays infos of the envs in ``mask`` (``_key`` masks included)."""
        out: dict[str, Any] = {}
        for i in np.flatnonzero(mask):
            out = self._add_info(out, self._infos[i], int(i))
        return out

    def trajectories(self) -> list[Trajectory]:
        """The current episode of every env, in env order (finished or not)."""
        return list(self._trajs)

    @property
    def all_done(self) -> bool:
        return not self.active.any()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call a method (or read an attribute) of every env; in-process backend only."""
        self._check_open()
        if self.backend != "inprocess":
            raise NotImplementedError("call() needs backend='inprocess'")
        out = []
        for env in self._local_envs():
            attr = env.get_wrapper_attr(name)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(out)

    def _local_envs(self) -> list[gym.Env]:
        """The envs themselves; only the in-process backend holds them here."""
        assert isinstance(self._backend, InProcessBackend)
        return self._backend.envs

    def close_extras(self, **kwargs: Any) -> None:
        backend = getattr(self, "_backend", None)  # absent when the constructor failed
        if backend is not None:
            backend.close()

    def _check_open(self) -> None:
        if self.closed:
            raise gym.error.ClosedEnvironmentError(
                f"{self!r} is closed; build a new GroupVectorEnv to run more episodes "
                "(trajectories() still returns the last episodes)"
            )

    def _env_error(self, failed: list[int], failures: list[Failure], call: str) -> EnvError:
        """One error for the envs that raised in ``call``: the first named, the rest counted."""
        first, res = failed[0], failures[0]
        group = int(self.group_ids[first])
        more = f" (and {len(failed) - 1} more: envs {failed[1:]})" if len(failed) > 1 else ""
        after = {
            "step": "its episode ended truncated; the other envs took their step",
            "snapshot": "no env changed, unless its worker was lost: then its episodes ended",
            "branch": "those targets hold no episode and stay done until the next reset",
            "reset_to": "call reset() or reset_to() again",
        }.get(call, "call reset() again with options every env accepts")
        where = "" if res.exc is not None else f"\nThe env's traceback:\n{res.traceback}"
        err = EnvError(
            f"env {first} (group {group}) raised {res.reason} during {call}(){more}; {after}"
            + where,
            env_index=first,
            group=group,
            failed=failed,
        )
        err.__cause__ = res.exc
        return err

    def __repr__(self) -> str:
        return (
            f"GroupVectorEnv({self.env_id!r}, num_groups={self.num_groups}, "
            f"group_size={self.group_size}, backend={self.backend!r})"
        )


class _BatchedTuple(spaces.Tuple):
    """Gymnasium's batched space for ``n`` copies of one space, printed as ``Tuple(<space> x n)``
    (the full tuple of text spaces would print a kilobyte per env)."""

    def __repr__(self) -> str:
        return f"Tuple({self.spaces[0]!r} x {len(self.spaces)})"


def _compact(space: spaces.Space) -> spaces.Space:
    if type(space) is spaces.Tuple and space.spaces:
        return _BatchedTuple(space.spaces)
    return space


def _as_text(action: Any) -> str:
    return action if isinstance(action, str) else repr(action)


def make_group_vector_env(env_id: str, num_envs: int = 1, **kwargs: Any) -> GroupVectorEnv:
    """``gym.make_vec(env_id, num_envs=N, group_size=k, backend=...)`` lands here.

    ``num_envs`` must be a multiple of ``group_size`` (default 1: independent envs, gymnasium's
    usual meaning). Keyword arguments GroupVectorEnv does not take go to the env constructor.
    """
    group_keys = {
        "group_size",
        "backend",
        "num_workers",
        "wrappers",
        "step_timeout",
        "ray_options",
        "ray_address",
        "info_layout",
    }
    group_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in group_keys}
    group_size = int(group_kwargs.pop("group_size", 1))
    if num_envs % group_size:
        raise ValueError(f"num_envs={num_envs} is not a multiple of group_size={group_size}")
    return GroupVectorEnv(
        env_id,
        num_groups=num_envs // group_size,
        group_size=group_size,
        env_kwargs=kwargs,
        **group_kwargs,
    )


def vector_entry_point(env_id: str) -> Callable[..., GroupVectorEnv]:
    """The ``vector_entry_point`` registered for ``env_id`` (make_vec does not pass the id)."""
    return functools.partial(make_group_vector_env, env_id)
