"""The records a :class:`~agentgym.vector.GroupVectorEnv` keeps: one :class:`Trajectory` of
:class:`Step` s per episode, plain dataclasses that a trainer turns into training rows."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Step", "Trajectory"]


@dataclass
class Step:
    """One step of one trajectory.

    >>> step = Step("Room 1 of 4.", "red", 0.0, ("c", 0), True, {"won": False})
    >>> step.state_key, step.action_valid
    (('c', 0), True)
    """

    observation: str
    """the observation the action was chosen from (after wrappers: e.g. the rendered prompt)"""
    action: str
    """the action as given to ``step`` (e.g. the raw model text before parsing)"""
    reward: float
    state_key: Hashable
    """``state_key`` of the state the action was taken FROM: the anchor state of GiGPO"""
    action_valid: bool
    info: dict[str, Any]
    """the info returned by this step"""


@dataclass
class Trajectory:
    """One episode of one env of a group.

    A branched episode (:meth:`GroupVectorEnv.branch`, or :meth:`GroupVectorEnv.reset_to` with
    a prefix) starts with a copy of the steps its source took before the branch point (same
    observations, actions, rewards and ``state_key`` s), so every record is a whole episode.
    ``branch_step`` is the index of its first own step and ``branch_of`` the
    ``(group_id, traj_id)`` of the trajectory it was copied from.

    Building groups from branches: the k continuations of one prefix (SLATE's group) are the
    trajectories with equal ``(branch_of, branch_step)``, plus the source itself (the one whose
    ``(group_id, traj_id)`` is ``branch_of``) when it was stepped on as one of them; they differ
    from ``steps[branch_step]`` on. Following ``branch_of`` links from the leaves gives the
    tree of a tree-shaped rollout.

    >>> t = Trajectory(group_id=0, traj_id=1, task_id="corridor-train-1")
    >>> t.steps.append(Step("Room 1 of 2.", "red", 0.0, 0, True, {}))
    >>> t.steps.append(Step("Room 2 of 2.", "blue", 1.0, 1, True, {"won": True}))
    >>> t.terminated = t.won = True
    >>> t.total_return, t.done, len(t.steps)
    (1.0, True, 2)
    """

    group_id: int
    traj_id: int
    task_id: str
    steps: list[Step] = field(default_factory=list)
    won: bool = False
    terminated: bool = False
    truncated: bool = False
    truncation_reason: str | None = None
    branch_step: int | None = None
    """index in ``steps`` of the first step taken after the branch point; None: not a branch"""
    branch_of: tuple[int, int] | None = None
    """``(group_id, traj_id)`` of the trajectory the prefix was copied from; None: not a branch"""
    start_info: dict[str, Any] | None = None
    """the info of the state the episode started from (its ``reset``; a branch's is its
    source's), which ``steps[0]`` acted from: what a judge compares the first round with"""

    @property
    def total_return(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated
