"""The trainer's tree rollout (``collect_tree``): sibling continuations from shared prefixes,
whose branch-step rows SLATE trains on."""

from __future__ import annotations

import numpy as np
import pytest

from agentgym.algorithms.advantage import compute_advantage
from agentgym.engine import Policy, PolicyOutput, SamplingParams


class DoorPolicy(Policy):
    """A seeded random corridor player: the engine's Policy, answering a lockstep round."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    async def act(self, messages, params, info=None):
        return self.generate([messages], params, [info])[0]

    def generate(self, messages, params, infos=None):
        words = ["red", "blue", "green", "back", "back"]
        return [
            PolicyOutput(w, token_ids=[3], logprobs=[-0.5], prompt_ids=[1, 2])
            for w in (words[int(self.rng.integers(len(words)))] for _ in messages)
        ]


@pytest.mark.parametrize(
    "branch_points,continuations,group_size", [(1, 2, 4), (2, 2, 4), (1, 3, 6)]
)
def test_tree_rollout_builds_sibling_groups_at_equal_samples(
    branch_points, continuations, group_size
):
    from trainers.gigpo.rollout import collect_tree, make_group_env

    venv = make_group_env(
        "AgentGym/Corridor-v0", num_groups=3, group_size=group_size, template="compact"
    )
    try:
        batch = collect_tree(
            venv,
            DoorPolicy(1),
            SamplingParams(),
            branch_points=branch_points,
            continuations=continuations,
            branch_span=2,
            seed=5,
        )
    finally:
        venv.close()
    trajs = batch.trajectories
    # Equal samples: one complete episode per env, as the flat rollout plays.
    assert len(trajs) == 3 * group_size and all(t.done for t in trajs)
    assert len({t.traj_id for t in trajs}) == len(trajs)
    assert any(t.branch_of is not None for t in trajs)
    # Rows are own steps only: a branch's prefix is its source's rows, not repeated.
    assert len(batch) == sum(len(t.steps) - s for t, s in zip(trajs, batch.row_start, strict=True))
    by_id = {(t.group_id, t.traj_id): t for t in trajs}
    for t in trajs:
        if t.branch_of is None:
            continue
        src = by_id[t.branch_of]
        k = t.branch_step
        # The prefix is the source's and ends in the state the sibling acted from.
        assert [s.action for s in t.steps[:k]] == [s.action for s in src.steps[:k]]
        assert t.steps[k].state_key == src.steps[k - 1].info["state_key"]
    # Every branch group's rows act from one state, and siblings number at least 2 at a branch.
    for b in set(batch.branch_ids.tolist()) - {-1}:
        rows = np.flatnonzero(batch.branch_ids == b)
        assert len({batch.state_keys[i] for i in rows}) == 1
        assert len({int(batch.group_ids[i]) for i in rows}) == 1
    sizes = np.bincount(batch.branch_ids[batch.branch_ids >= 0])
    assert sizes.max() >= continuations
    # SLATE trains on exactly the branch-step rows.
    adv = compute_advantage(
        "slate",
        group_ids=batch.group_ids,
        traj_ids=batch.traj_ids,
        step_ids=batch.step_ids,
        rewards=batch.rewards,
        state_keys=batch.state_keys,
        invalid=batch.invalid,
        branch_ids=batch.branch_ids,
    )
    assert not adv.advantages[batch.branch_ids < 0].any()


def test_tree_rollout_rejects_a_budget_that_does_not_divide_the_group():
    from trainers.gigpo.rollout import collect_tree, make_group_env

    venv = make_group_env("AgentGym/Corridor-v0", num_groups=1, group_size=6)
    try:
        with pytest.raises(ValueError, match="multiple of"):
            collect_tree(venv, DoorPolicy(0), SamplingParams(), branch_points=2, continuations=2)
    finally:
        venv.close()
