"""SPA-RL: the ``"spa"`` estimator against hand-computed cases, and its progress estimator
learning what the paper's objective asks (contributions that add up to the outcome)."""

from __future__ import annotations

import numpy as np
import pytest

from agentgym.algorithms import advantage_estimator, compute_advantage
from agentgym.algorithms.spa import ProgressEstimator, text_features

# One group of three trajectories (A: 2 steps, B: 2 steps, the second invalid, C: 1 step) and
# the progress estimator's contributions c_t of each row.
ROWS = dict(
    group_ids=[0, 0, 0, 0, 0],
    traj_ids=[0, 0, 1, 1, 2],
    step_ids=[0, 1, 0, 1, 0],
    rewards=[0.0, 1.0, 0.0, 0.0, 0.0],
    invalid=[False, False, False, True, False],
    process_rewards=[0.2, 0.8, 0.1, -0.1, 0.3],
)


def test_spa_by_hand():
    # r_fused with alpha 1, beta 0.5: r = c + 0.5 * valid
    #   A: 0.7, 1.3   B: 0.6, -0.1 (invalid: no grounding)   C: 0.8
    # gamma 1 returns: A: 2.0, 1.3   B: 0.5, -0.1   C: 0.8
    # step 0 cell {2.0, 0.5, 0.8}, mean 1.1: 0.9, -0.6, -0.3
    # step 1 cell {1.3, -0.1}, mean 0.6: 0.7, -0.7
    out = compute_advantage("spa", **ROWS)
    np.testing.assert_allclose(out.advantages, [0.9, 0.7, -0.6, -0.7, -0.3], atol=1e-6)
    np.testing.assert_array_equal(out.step_advantage.astype(np.float32), out.advantages)
    np.testing.assert_array_equal(out.episode_advantage, np.zeros(5))
    # gamma 0.5: A0 = 0.7 + 0.5 * 1.3 = 1.35, B0 = 0.6 - 0.05 = 0.55, C0 = 0.8; mean 0.9
    half = compute_advantage("spa", gamma=0.5, **ROWS)
    np.testing.assert_allclose(half.advantages, [0.45, 0.7, -0.35, -0.7, -0.1], atol=1e-6)
    # alpha 2, beta 0: r = 2c. Returns A: 2.0, 1.6  B: 0.0, -0.2  C: 0.6
    # step 0 mean 2.6 / 3; step 1 mean 0.7
    only = compute_advantage("spa", alpha=2.0, beta=0.0, **ROWS)
    m0 = 2.6 / 3
    np.testing.assert_allclose(
        only.advantages, [2.0 - m0, 0.9, -m0, -0.9, 0.6 - m0], rtol=1e-5, atol=1e-6
    )
    # mean_std_norm: step 1 cell {1.3, -0.1}, sample std 1.4 / sqrt(2): +-1/sqrt(2)
    std = compute_advantage("spa", norm="mean_std_norm", **ROWS)
    np.testing.assert_allclose(std.advantages[[1, 3]], [2**-0.5, -(2**-0.5)], rtol=1e-5)


def test_spa_invalid_penalty_and_inputs():
    # A penalty (0 by default) is charged to the invalid row's return: B1 -0.1 - 0.2 = -0.3,
    # step 1 cell {1.3, -0.3}, mean 0.5: 0.8, -0.8. Row order does not matter.
    out = compute_advantage("spa", invalid_penalty=0.2, **ROWS)
    np.testing.assert_allclose(out.advantages[[1, 3]], [0.8, -0.8], atol=1e-6)
    perm = [4, 2, 0, 3, 1]
    shuffled = {k: [v[i] for i in perm] for k, v in ROWS.items()}
    np.testing.assert_allclose(
        compute_advantage("spa", **shuffled).advantages,
        compute_advantage("spa", **ROWS).advantages[perm],
        atol=1e-6,
    )
    assert advantage_estimator("spa").inputs == ("process_rewards",)
    assert {"alpha", "beta"} <= set(advantage_estimator("spa").option_names())
    rows = {k: v for k, v in ROWS.items() if k != "process_rewards"}
    with pytest.raises(ValueError, match="'spa' needs process_rewards"):
        compute_advantage("spa", **rows)
    with pytest.raises(ValueError, match="finite"):
        compute_advantage("spa", **{**ROWS, "process_rewards": [0.0, np.nan, 0, 0, 0]})
    with pytest.raises(ValueError, match="'grpo' does not read process_rewards"):
        compute_advantage("grpo", **ROWS)


def test_text_features_are_deterministic_unit_rows():
    f = text_features(["Go north to the kitchen", "go north to the kitchen", ""], dim=64)
    assert f.shape == (3, 64) and f.dtype == np.float32
    np.testing.assert_array_equal(f[0], f[1])  # case-insensitive
    np.testing.assert_allclose(np.linalg.norm(f[0]), 1.0, rtol=1e-6)
    assert not f[2].any()  # no words: zeros, not NaN
    with pytest.raises(ValueError, match="dim"):
        text_features(["x"], dim=0)


def _corridor_like(rng: np.random.Generator, trajectories: int) -> dict:
    """Trajectories of 1-4 steps drawn from four step texts; only "take key" and "open door"
    pay: the outcome is 1 per "take key" plus 2 per "open door", paid at the last step."""
    worth = {"look around": 0.0, "take key": 1.0, "open door": 2.0, "wait here": 0.0}
    texts, traj, rewards, group = [], [], [], []
    for i in range(trajectories):
        steps = rng.choice(list(worth), size=int(rng.integers(1, 5)))
        outcome = sum(worth[s] for s in steps)
        for t, s in enumerate(steps):
            texts.append(str(s))
            traj.append(i)
            group.append(i // 4)
            rewards.append(outcome if t == len(steps) - 1 else 0.0)
    return dict(texts=texts, traj_ids=traj, group_ids=group, rewards=rewards, worth=worth)


def test_progress_estimator_learns_contributions_that_sum_to_the_outcome():
    rng = np.random.default_rng(0)
    train = _corridor_like(rng, 64)
    dim = 32
    est = ProgressEstimator(dim, seed=0, lr=1e-2)
    feats = text_features(train["texts"], dim)
    rows = {k: train[k] for k in ("group_ids", "traj_ids", "rewards")}
    first = est.update(feats, **rows)
    stats = est.update(feats, **rows, steps=300)
    # L_PE went down, by a lot, and the loss reported before a step is the one before it.
    assert stats["spa/progress_loss"] < 0.01 * first["spa/progress_loss_before"]
    assert stats["spa/progress_loss_before"] < first["spa/progress_loss_before"]
    # Each step's contribution is what it is worth (the only decomposition that fits every
    # trajectory), and on new trajectories the contributions add up to the outcome.
    words = list(train["worth"])
    c = est.predict(text_features(words, dim))
    np.testing.assert_allclose(c, [train["worth"][w] for w in words], atol=0.1)
    test = _corridor_like(np.random.default_rng(1), 16)
    total = np.bincount(test["traj_ids"], weights=est.predict(text_features(test["texts"], dim)))
    outcome = np.bincount(test["traj_ids"], weights=test["rewards"])
    np.testing.assert_allclose(total, outcome, atol=0.3)
    # The state round-trips (a trainer's checkpoint).
    other = ProgressEstimator(dim, seed=1)
    other.load_state_dict(est.state_dict())
    np.testing.assert_array_equal(other.predict(feats), est.predict(feats))


def test_progress_estimator_checks_shapes_and_is_seeded():
    a, b = ProgressEstimator(8, seed=3), ProgressEstimator(8, seed=3)
    x = np.eye(8, dtype=np.float32)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    with pytest.raises(ValueError, match=r"\(N, 8\)"):
        a.predict(np.zeros((2, 5)))
    with pytest.raises(ValueError, match="rewards"):
        a.loss(x[:2], group_ids=[0, 0], traj_ids=[0, 1], rewards=[1.0])


def test_the_trainer_trains_the_progress_estimator_beside_the_policy(tmp_path):
    """``--advantage spa`` runs end to end (real tiny Qwen2 on the corridor): the advantages
    read the estimator's contributions and every iteration's update lowers L_PE on its batch."""
    from trainers.gigpo.config import Config
    from trainers.gigpo.train import train

    config = Config.for_env(
        "AgentGym/Corridor-v0", advantage="spa", iterations=2, num_groups=2, group_size=4,
        eval_every=0, out_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
        plot=False, save_final=False, quiet=True, env_kwargs={"length": 2},
    )  # fmt: skip
    history = train(config)
    for record in history:
        assert record["spa/progress_loss"] < record["spa/progress_loss_before"]
        assert record["update/grad_norm"] > 0
