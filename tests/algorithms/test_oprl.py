"""OPRL (iStar): the ``"oprl"`` estimator against hand-computed cases, and its implicit PRM:
its step reward is a log-ratio to the reference, and trajectory DPO moves it towards the
steps of the trajectories that won."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentgym.algorithms import advantage_estimator, compute_advantage
from agentgym.algorithms.oprl import Candidates, ImplicitPRM, preference_pairs
from agentgym.algorithms.spa import text_features

# Group 0: A (outcome 1, two steps), B (outcome 0, one step); group 1: C alone (outcome 1).
ROWS = dict(
    group_ids=[0, 0, 0, 1],
    traj_ids=[0, 0, 1, 2],
    step_ids=[0, 1, 0, 0],
    rewards=[0.0, 1.0, 0.0, 1.0],
    invalid=[False] * 4,
    process_rewards=[0.2, 0.4, -0.3, 0.5],
)


def test_oprl_by_hand():
    # A_E: group 0 outcomes (1, 0), mean 0.5: A +0.5, B -0.5; group 1 has one trajectory:
    #      mean 0 (the GRPO convention), C +1.
    # A_S: group 0 step rewards (0.2, 0.4, -0.3), mean 0.1: 0.1, 0.3, -0.4; C alone: 0.
    out = compute_advantage("oprl", **ROWS)
    np.testing.assert_allclose(out.episode_advantage, [0.5, 0.5, -0.5, 1.0])
    np.testing.assert_allclose(out.step_advantage, [0.1, 0.3, -0.4, 0.0], atol=1e-12)
    np.testing.assert_allclose(out.advantages, [0.6, 0.8, -0.9, 1.0], atol=1e-6)
    # omega 0.5: 0.5 + 0.05, 0.5 + 0.15, -0.5 - 0.2, 1
    half = compute_advantage("oprl", omega=0.5, **ROWS)
    np.testing.assert_allclose(half.advantages, [0.55, 0.65, -0.7, 1.0], atol=1e-6)
    # mean_std_norm: A_S / sample std of (0.2, 0.4, -0.3) = sqrt(0.26 / 2); A_E / (1/sqrt(2))
    std = compute_advantage("oprl", norm="mean_std_norm", **ROWS)
    s = np.sqrt(0.13)
    np.testing.assert_allclose(std.step_advantage[:3], np.array([0.1, 0.3, -0.4]) / s, rtol=1e-5)
    np.testing.assert_allclose(std.episode_advantage[:3], [2**-0.5, 2**-0.5, -(2**-0.5)], rtol=1e-5)
    # The invalid-action penalty is GRPO's: B's row is invalid, its value -0.1, the group's
    # mean (1 - 0.1) / 2 = 0.45: A 0.55, B -0.45 - 0.1 = -0.55.
    pen = compute_advantage("oprl", **{**ROWS, "invalid": [False, False, True, False]})
    np.testing.assert_allclose(pen.episode_advantage[:3], [0.55, 0.55, -0.55], atol=1e-12)
    assert advantage_estimator("oprl").inputs == ("process_rewards",)
    with pytest.raises(ValueError, match="'oprl' needs process_rewards"):
        compute_advantage("oprl", **{k: v for k, v in ROWS.items() if k != "process_rewards"})


def test_preference_pairs_by_hand():
    # Group 0: outcomes 1, 0, 1 (trajectory 1 lost to both); group 1: 0.5 alone; group 2:
    # a tie (no pair).
    pairs = preference_pairs(
        group_ids=[0, 0, 0, 0, 1, 2, 2],
        traj_ids=[0, 1, 2, 2, 3, 4, 5],
        rewards=[1.0, 0.0, 0.0, 1.0, 0.5, 1.0, 1.0],
    )
    assert sorted(map(tuple, pairs.tolist())) == [(0, 1), (2, 1)]


def test_implicit_reward_is_a_log_ratio_to_the_reference():
    prm = ImplicitPRM(4, beta=0.5)
    feats = np.eye(4, dtype=np.float32)[:2]  # two rows: actions 0 and 1 of their states
    cand = Candidates(
        features=np.stack([np.eye(4, dtype=np.float32)[:2]] * 2),  # both rows: actions 0, 1
        ref_logprobs=np.log([[0.25, 0.75], [0.25, 0.75]]),
        mask=np.ones((2, 2), dtype=bool),
    )
    # f_phi starts at 0: pi_phi is the reference, every reward 0.
    np.testing.assert_array_equal(prm.step_rewards(feats, cand), [0.0, 0.0])
    # The reference is renormalised over the candidates: probabilities that do not sum to 1
    # (float32 rounding, a truncated candidate list) still give exactly 0.
    unnormalised = Candidates(cand.features, np.log([[0.2, 0.7], [0.25, 0.75001]]), cand.mask)
    np.testing.assert_array_equal(prm.step_rewards(feats, unnormalised), [0.0, 0.0])
    # A constant f (bias 3) still gives pi_phi = pi_ref with candidates; without them the
    # reward is beta * f = 1.5.
    with torch.no_grad():
        prm.net[2].bias.fill_(3.0)
    np.testing.assert_allclose(prm.step_rewards(feats, cand), [0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(prm.step_rewards(feats), [1.5, 1.5], atol=1e-6)
    # By hand: f(a0) = 1, f(a1) = 0. log Z = log(0.25 e + 0.75) = 0.4076...
    # r(a0) = 0.5 (1 - log Z), r(a1) = 0.5 (0 - log Z); pi_phi sums to 1.
    with torch.no_grad():
        prm.net[2].bias.zero_()
        prm.net[0].weight.zero_()
        prm.net[0].weight[0, 0] = 100.0  # tanh saturates: hidden unit 0 is 1 on action 0
        prm.net[2].weight.zero_()
        prm.net[2].weight[0, 0] = 1.0
    log_z = np.log(0.25 * np.e + 0.75)
    r = prm.step_rewards(feats, cand)
    np.testing.assert_allclose(r, [0.5 * (1 - log_z), -0.5 * log_z], rtol=1e-5)
    pi_phi = np.exp(r / 0.5 + np.log([0.25, 0.75]))
    np.testing.assert_allclose(pi_phi.sum(), 1.0, rtol=1e-5)


def _key_groups(rng: np.random.Generator, groups: int) -> dict:
    """Groups of 4 trajectories of 2-3 steps; a trajectory wins (outcome 1) iff it took the
    key ("take key"); "drop key" and "look around" are neutral filler."""
    texts, traj, group, rewards = [], [], [], []
    for g in range(groups):
        for k in range(4):
            won = k % 2 == 0
            steps = ["look around"] * int(rng.integers(1, 3)) + ["take key" if won else "drop key"]
            rng.shuffle(steps)
            for t, s in enumerate(steps):
                texts.append(s)
                traj.append(4 * g + k)
                group.append(g)
                rewards.append(1.0 if won and t == len(steps) - 1 else 0.0)
    return dict(texts=texts, traj_ids=traj, group_ids=group, rewards=rewards)


def test_trajectory_dpo_moves_the_reward_towards_the_winners_steps():
    data = _key_groups(np.random.default_rng(0), 8)
    dim = 32
    prm = ImplicitPRM(dim, beta=0.05, lr=1e-2, seed=0)
    feats = text_features(data["texts"], dim)
    rows = {k: data[k] for k in ("group_ids", "traj_ids", "rewards")}
    stats = prm.update(feats, **rows, steps=100)
    assert stats["oprl/pairs"] == 8 * 4  # per group: 2 winners x 2 losers
    assert stats["oprl/dpo_loss_before"] == pytest.approx(np.log(2), rel=1e-6)  # r = 0 at start
    assert stats["oprl/dpo_loss"] < 0.5 * stats["oprl/dpo_loss_before"]
    take, drop, look = prm.step_rewards(text_features(["take key", "drop key", "look around"], dim))
    assert take > 0 > drop
    assert take - look > 0 and look - drop > 0
    # The advantage built on them ranks the winning step above the neutral one in a winner.
    adv = compute_advantage(
        "oprl",
        step_ids=_positions(data["traj_ids"]),
        invalid=[False] * len(data["texts"]),
        process_rewards=prm.step_rewards(feats),
        **rows,
    )
    texts = np.array(data["texts"])
    won = (np.bincount(data["traj_ids"], weights=data["rewards"]) > 0)[data["traj_ids"]]
    assert (
        adv.step_advantage[texts == "take key"].min()
        > adv.step_advantage[(texts == "look around") & won].max()
    )


def _positions(traj_ids: list[int]) -> list[int]:
    out, last, t = [], None, 0
    for i in traj_ids:
        t = t + 1 if i == last else 0
        out.append(t)
        last = i
    return out


def test_dpo_with_candidates_raises_the_policy_of_the_winning_action():
    # One state, two candidate actions (reference 0.5 each); the trajectory that took "take
    # key" won. After DPO the PRM's policy prefers it: log-ratio > 0 for it, < 0 for the other.
    dim = 16
    acts = text_features(["take key", "drop key"], dim)
    cand = Candidates(
        features=np.stack([acts, acts]),
        ref_logprobs=np.log(np.full((2, 2), 0.5)),
        mask=np.ones((2, 2), dtype=bool),
    )
    prm = ImplicitPRM(dim, beta=0.1, lr=5e-2)
    rows = dict(group_ids=[0, 0], traj_ids=[0, 1], rewards=[1.0, 0.0])
    prm.update(acts, cand, **rows, steps=50)
    good, bad = prm.step_rewards(acts, cand)
    assert good > 0 > bad
    # pi_phi is still a distribution over the two actions
    np.testing.assert_allclose(np.exp(good / 0.1) * 0.5 + np.exp(bad / 0.1) * 0.5, 1.0, rtol=1e-5)


def test_a_batch_without_preferences_changes_nothing():
    prm = ImplicitPRM(8)
    x = np.eye(8, dtype=np.float32)[:3]
    before = {k: v.clone() for k, v in prm.net.state_dict().items()}
    stats = prm.update(x, group_ids=[0, 0, 1], traj_ids=[0, 1, 2], rewards=[1.0, 1.0, 0.0])
    assert stats == {"oprl/dpo_loss_before": 0.0, "oprl/dpo_loss": 0.0, "oprl/pairs": 0.0}
    for k, v in prm.net.state_dict().items():
        assert torch.equal(v, before[k])
    with pytest.raises(ValueError, match="reduce"):
        ImplicitPRM(8, reduce="max")
    with pytest.raises(ValueError, match="at least one candidate"):
        prm.step_rewards(
            x[:1],
            Candidates(np.zeros((1, 2, 8)), np.zeros((1, 2)), np.zeros((1, 2), dtype=bool)),
        )


def test_the_trainer_trains_the_implicit_prm_beside_the_policy(tmp_path):
    """``--advantage oprl`` runs end to end (real tiny Qwen2 on the corridor); the PRM's DPO
    loss goes down on every batch that holds a preference pair."""
    from trainers.gigpo.config import Config
    from trainers.gigpo.train import train

    config = Config.for_env(
        "AgentGym/Corridor-v0", advantage="oprl", iterations=2, num_groups=2, group_size=4,
        eval_every=0, out_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
        plot=False, save_final=False, quiet=True, env_kwargs={"length": 2},
    )  # fmt: skip
    history = train(config)
    assert all("oprl/dpo_loss" in r for r in history)
    assert any(r["oprl/pairs"] for r in history)  # a group held a winner and a loser
    for record in history:
        if record["oprl/pairs"]:
            assert record["oprl/dpo_loss"] < record["oprl/dpo_loss_before"]
        assert record["update/grad_norm"] > 0
