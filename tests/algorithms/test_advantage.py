"""GRPO / GiGPO advantages: the vectorised estimators against the loop reference and hand math.

The reference (``advantage_reference.py`` beside these tests) is written straight from the paper's
equations with loops and dicts; property tests check the fast version matches it to 1e-6 on
random batches (singleton step groups, all-equal rewards, one-trajectory groups, shuffled rows,
both norms, both episode statistics, gamma 0 and 1, ids and keys of every shape). Small cases are
checked against numbers derived by hand in the comments.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from advantage_reference import reference_advantage, taken_by
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainers.gigpo.advantage import (
    SIZE_BUCKETS,
    AdvantageResult,
    advantage_estimator,
    available_advantages,
    compute_advantage,
    encode_state_keys,
    register_advantage,
    step_group_stats,
    token_advantages,
    unregister_advantage,
)

EPS = 1e-6


def rows(trajectories: list[dict]) -> dict:
    """Flat rows from [{"group": g, "traj": t, "states": [...], "rewards": [...], "invalid": [...]}]."""
    out: dict[str, list] = {k: [] for k in ("group_ids", "traj_ids", "step_ids", "rewards")}
    out["state_keys"], out["invalid"] = [], []
    for tr in trajectories:
        for t, (key, reward) in enumerate(zip(tr["states"], tr["rewards"], strict=True)):
            out["group_ids"].append(tr["group"])
            out["traj_ids"].append(tr["traj"])
            out["step_ids"].append(t)
            out["rewards"].append(reward)
            out["state_keys"].append(key)
            out["invalid"].append(tr.get("invalid", [False] * len(tr["states"]))[t])
    return out


def assert_matches_reference(batch: dict, **kwargs) -> AdvantageResult:
    fast = compute_advantage(**taken_by(kwargs["name"], {**batch, **kwargs}))
    ref = reference_advantage(**batch, **kwargs)
    for field in ("returns", "episode_advantage", "step_advantage"):
        np.testing.assert_allclose(
            getattr(fast, field), ref[field], rtol=1e-6, atol=1e-6, err_msg=field
        )
    assert fast.advantages.dtype == np.float32
    np.testing.assert_allclose(fast.advantages, ref["advantages"], rtol=1e-6, atol=1e-6)
    if batch["state_keys"] is not None:
        sizes = np.asarray(ref["step_group_sizes"])
        assert fast.stats["num_step_groups"] == len(sizes)
        assert fast.stats["singleton_share"] == pytest.approx(np.mean(sizes == 1))
        assert fast.stats["mean_step_group_size"] == pytest.approx(sizes.mean())
        assert fast.stats["max_step_group_size"] == sizes.max()
        for label, lo, hi in SIZE_BUCKETS:
            in_bucket = (sizes >= lo) & (sizes <= (hi if hi is not None else np.inf))
            assert fast.stats[f"size_share/{label}"] == pytest.approx(np.mean(in_bucket))
    return fast


# ---------------------------------------------------------------------------------------------
# Random batches
# ---------------------------------------------------------------------------------------------


@st.composite
def batches(draw) -> dict:
    """A random flat batch, rows shuffled, with ids and keys in any of the accepted forms."""
    num_groups = draw(st.integers(1, 4))
    # Few distinct reward values make all-equal groups and ties common.
    reward_values = draw(
        st.sampled_from(
            [[0.0], [0.0, 1.0], [0.0, 1.0, -0.5, 2.5], [1.0, 1.0 + 1e-9], [0.0, 10.0, 3.0]]
        )
    )
    num_states = draw(st.integers(1, 4))  # few states: large step groups; 1 state: all share
    shared_states = draw(st.booleans())  # the same key may appear in different groups
    reuse_traj_ids = draw(st.booleans())  # traj ids unique only within a group
    trajectories = []
    next_traj = 0
    for g in range(num_groups):
        for k in range(draw(st.integers(1, 4))):  # 1 = a one-trajectory group
            length = draw(st.integers(1, 7))
            states = [draw(st.integers(0, num_states - 1)) for _ in range(length)]
            trajectories.append(
                {
                    "group": g,
                    "traj": k if reuse_traj_ids else next_traj,
                    "states": [("s", s) if shared_states else ("s", g, s) for s in states],
                    "rewards": [draw(st.sampled_from(reward_values)) for _ in range(length)],
                    "invalid": [draw(st.booleans()) for _ in range(length)],
                }
            )
            next_traj += 1
    batch = rows(trajectories)
    n = len(batch["rewards"])

    # Ids of any shape: offset (negative or huge: the sparse path), steps with gaps.
    group_offset = draw(st.sampled_from([0, 7, -3, 10**12]))
    traj_offset = draw(st.sampled_from([0, 1000, -50, 3 * 10**11]))
    step_scale, step_offset = draw(st.sampled_from([(1, 0), (1, 5), (3, 0), (2, -7)]))
    perm = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(n)
    key_form = draw(st.sampled_from(["objects", "encoded", "strings", "none"]))
    keys = [batch["state_keys"][i] for i in perm]
    if key_form == "encoded":
        keys = encode_state_keys(keys)
    elif key_form == "strings":
        keys = np.array([repr(k) for k in keys])
    elif key_form == "none":
        keys = None
    return {
        "group_ids": np.asarray(batch["group_ids"])[perm] + group_offset,
        "traj_ids": np.asarray(batch["traj_ids"])[perm] + traj_offset,
        "step_ids": np.asarray(batch["step_ids"])[perm] * step_scale + step_offset,
        "rewards": np.asarray(batch["rewards"])[perm],
        "state_keys": keys,
        "invalid": np.asarray(batch["invalid"])[perm],
    }


options = st.fixed_dictionaries(
    {
        "norm": st.sampled_from(["mean_norm", "mean_std_norm"]),
        "episode_stats_over": st.sampled_from(["trajectories", "steps"]),
        "gamma": st.one_of(st.sampled_from([0.0, 1.0, 0.95]), st.floats(0.0, 1.0)),
        "omega": st.one_of(st.just(1.0), st.floats(0.0, 3.0)),
        "invalid_penalty": st.sampled_from([0.0, 0.1, 0.5]),
    }
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(batch=batches(), opts=options)
def test_gigpo_matches_reference(batch, opts):
    if batch["state_keys"] is None:
        with pytest.raises(ValueError, match="state_keys"):
            compute_advantage("gigpo", **batch, **opts)
        return
    fast = assert_matches_reference(batch, name="gigpo", **opts)
    # A step group of one row has no peer: its step advantage is exactly 0.
    ref_sizes = reference_advantage("gigpo", **batch, **opts)["step_group_sizes"]
    if 1 in ref_sizes:
        assert (fast.step_advantage == 0.0).any()


@SETTINGS
@given(batch=batches(), opts=options)
def test_grpo_matches_reference(batch, opts):
    fast = assert_matches_reference(batch, name="grpo", **opts)
    assert not fast.step_advantage.any()
    np.testing.assert_allclose(fast.advantages, fast.episode_advantage, rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(batch=batches(), opts=options, seed=st.integers(0, 2**32 - 1))
def test_row_order_does_not_matter(batch, opts, seed):
    if batch["state_keys"] is None:
        return
    first = compute_advantage("gigpo", **batch, **opts)
    perm = np.random.default_rng(seed).permutation(len(batch["rewards"]))
    keys = batch["state_keys"]
    shuffled = {k: np.asarray(v)[perm] for k, v in batch.items() if k != "state_keys"}
    shuffled["state_keys"] = [keys[i] for i in perm]
    second = compute_advantage("gigpo", **shuffled, **opts)
    np.testing.assert_allclose(second.advantages, first.advantages[perm], rtol=1e-6, atol=1e-7)
    assert second.stats == pytest.approx(first.stats)


@pytest.mark.parametrize(
    ("gamma", "length"),
    [(0.3, 200), (0.95, 1000), (1.0, 3000), (0.999, 60)],
    ids=["scan-small-gamma", "scan-long-episode", "scan-large-batch", "cumsum-near-one"],
)
def test_long_trajectories_both_return_paths(gamma, length):
    """Long episodes, small gamma or big batches take the exact scan instead of the rescaled
    cumsum (whose error bound gamma**-(L-1) * L * N * eps would pass 1e-9); both match."""
    rng = np.random.default_rng(length)
    trajectories = [
        {
            "group": 0,
            "traj": k,
            "states": list(rng.integers(0, 20, size=length - k * (length // 4))),
            "rewards": list(rng.choice([0.0, 1.0, -2.0], size=length - k * (length // 4))),
        }
        for k in range(3)
    ]
    batch = rows(trajectories)
    assert_matches_reference(batch, name="gigpo", gamma=gamma, norm="mean_std_norm")


# ---------------------------------------------------------------------------------------------
# Small cases worked out by hand
# ---------------------------------------------------------------------------------------------


def two_trajectories() -> dict:
    # One group. Trajectory A: s0 -> s1, rewards [0, 1]. Trajectory B: s0 -> s2, rewards [0, 0].
    return rows(
        [
            {"group": 0, "traj": 0, "states": ["s0", "s1"], "rewards": [0.0, 1.0]},
            {"group": 0, "traj": 1, "states": ["s0", "s2"], "rewards": [0.0, 0.0]},
        ]
    )


def test_hand_case_mean_norm():
    # gamma 0.5: returns A = [0 + 0.5 * 1, 1] = [0.5, 1], B = [0, 0].
    # Episode: outcomes A = 1, B = 0, group mean 0.5 -> A rows +0.5, B rows -0.5.
    # Step groups: s0 = {A0: 0.5, B0: 0} (mean 0.25) -> +0.25 / -0.25; s1, s2 singletons -> 0.
    # A = episode + step: [0.75, 0.5, -0.75, -0.5].
    out = compute_advantage(
        "gigpo", **two_trajectories(), gamma=0.5, invalid_penalty=0.0, norm="mean_norm"
    )
    np.testing.assert_allclose(out.returns, [0.5, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(out.episode_advantage, [0.5, 0.5, -0.5, -0.5])
    np.testing.assert_allclose(out.step_advantage, [0.25, 0.0, -0.25, 0.0])
    np.testing.assert_allclose(out.advantages, [0.75, 0.5, -0.75, -0.5], rtol=1e-7)
    assert out.stats["num_step_groups"] == 3
    assert out.stats["singleton_share"] == pytest.approx(2 / 3)
    assert out.stats["singleton_row_share"] == pytest.approx(2 / 4)
    assert out.stats["size_share/2-5"] == pytest.approx(1 / 3)


def test_hand_case_mean_std_norm():
    # Same batch. Episode values [1, 0]: mean 0.5, sample std sqrt((0.25 + 0.25) / 1) =
    # sqrt(0.5), so A rows get 0.5 / (sqrt(0.5) + 1e-6) and B rows the negative.
    # Step group s0 values [0.5, 0]: mean 0.25, std sqrt(2 * 0.0625) = sqrt(0.125), so A0 gets
    # 0.25 / (sqrt(0.125) + 1e-6) and B0 the negative; singletons stay 0.
    out = compute_advantage(
        "gigpo", **two_trajectories(), gamma=0.5, invalid_penalty=0.0, norm="mean_std_norm"
    )
    e = 0.5 / (math.sqrt(0.5) + EPS)
    s = 0.25 / (math.sqrt(0.125) + EPS)
    np.testing.assert_allclose(out.episode_advantage, [e, e, -e, -e], rtol=1e-12)
    np.testing.assert_allclose(out.step_advantage, [s, 0.0, -s, 0.0], rtol=1e-12)
    assert e == pytest.approx(0.70710578, abs=1e-8)  # sqrt(0.5) ~ 0.70710678, shifted by eps


def test_episode_statistics_over_trajectories_or_steps():
    # A: 3 steps, outcome 1; B: 1 step, outcome 0 (no discounting matters for the episode term).
    # Over trajectories: mean (1 + 0) / 2 = 0.5 -> A rows +0.5, B row -0.5.
    # Over steps (verl-agent's default): values [1, 1, 1, 0], mean 0.75 -> A +0.25, B -0.75.
    batch = rows(
        [
            {"group": 0, "traj": 0, "states": ["a", "b", "c"], "rewards": [0.0, 0.0, 1.0]},
            {"group": 0, "traj": 1, "states": ["a"], "rewards": [0.0]},
        ]
    )
    per_traj = compute_advantage("grpo", **batch, episode_stats_over="trajectories")
    per_step = compute_advantage("grpo", **batch, episode_stats_over="steps")
    np.testing.assert_allclose(per_traj.advantages, [0.5, 0.5, 0.5, -0.5])
    np.testing.assert_allclose(per_step.advantages, [0.25, 0.25, 0.25, -0.75])


def test_invalid_action_penalty_and_revisited_state():
    # A: invalid action in s0 (the state stays s0), then s0 -> s1, reward 1 at the end.
    # B: s0 -> s2, no reward. gamma 1, penalty 0.1, mean_norm, statistics over trajectories.
    # Returns (raw rewards): A = [1, 1, 1], B = [0, 0].
    # Episode scores per row: A = [1 - 0.1, 1, 1], B = [0, 0]; trajectory values are the first
    # rows' scores, 0.9 and 0, mean 0.45 -> A [0.45, 0.55, 0.55], B [-0.45, -0.45].
    # Step group s0 = {A0: 1 - 0.1, A1: 1, B0: 0}, mean 1.9 / 3 -> A0 0.9 - 1.9/3, A1 1 - 1.9/3,
    # B0 -1.9/3; s1 and s2 are singletons -> 0.
    batch = rows(
        [
            {
                "group": 0,
                "traj": 0,
                "states": ["s0", "s0", "s1"],
                "rewards": [0.0, 0.0, 1.0],
                "invalid": [True, False, False],
            },
            {"group": 0, "traj": 1, "states": ["s0", "s2"], "rewards": [0.0, 0.0]},
        ]
    )
    out = compute_advantage("gigpo", **batch, gamma=1.0, invalid_penalty=0.1)
    m = 1.9 / 3
    np.testing.assert_allclose(out.returns, [1, 1, 1, 0, 0])
    np.testing.assert_allclose(out.episode_advantage, [0.45, 0.55, 0.55, -0.45, -0.45])
    np.testing.assert_allclose(out.step_advantage, [0.9 - m, 1 - m, 0, -m, 0], atol=1e-12)
    # Without the penalty the invalid step is indistinguishable from the valid one.
    free = compute_advantage("gigpo", **batch, gamma=1.0, invalid_penalty=0.0)
    assert free.step_advantage[0] == pytest.approx(free.step_advantage[1])
    assert out.advantages[0] < free.advantages[0]


def test_omega_weights_the_step_term():
    batch = two_trajectories()
    base = compute_advantage("gigpo", **batch, gamma=0.5, omega=1.0)
    for omega in (0.0, 0.5, 2.0):
        out = compute_advantage("gigpo", **batch, gamma=0.5, omega=omega)
        np.testing.assert_allclose(out.episode_advantage, base.episode_advantage)
        np.testing.assert_allclose(
            out.advantages, base.episode_advantage + omega * base.step_advantage, rtol=1e-6
        )
    # omega 0 is GRPO's advantage (same episode term, no step term).
    grpo = compute_advantage("grpo", **batch, gamma=0.5)
    zero = compute_advantage("gigpo", **batch, gamma=0.5, omega=0.0)
    np.testing.assert_allclose(zero.advantages, grpo.advantages)


def test_discounting_only_changes_the_step_term():
    # gamma 0: returns are the rewards, A0 and B0 both return 0, so the s0 group is flat.
    # gamma 1: returns are [1, 1] and [0, 0], so A0 - B0 = 1 in the s0 group.
    batch = two_trajectories()
    zero = compute_advantage("gigpo", **batch, gamma=0.0, invalid_penalty=0.0)
    one = compute_advantage("gigpo", **batch, gamma=1.0, invalid_penalty=0.0)
    np.testing.assert_allclose(zero.returns, [0, 1, 0, 0])
    np.testing.assert_allclose(one.returns, [1, 1, 0, 0])
    np.testing.assert_allclose(zero.step_advantage, [0, 0, 0, 0])
    np.testing.assert_allclose(one.step_advantage, [0.5, 0, -0.5, 0])
    np.testing.assert_allclose(zero.episode_advantage, one.episode_advantage)


def test_one_trajectory_group_keeps_its_score():
    # verl's convention: a group with one value is normalised with mean 0 and std 1.
    # Outcome 2 - penalty 0.1 on the invalid first row: rows score [1.9, 2].
    batch = rows(
        [
            {
                "group": 5,
                "traj": 9,
                "states": ["x", "y"],
                "rewards": [0.0, 2.0],
                "invalid": [True, False],
            }
        ]
    )
    mean_norm = compute_advantage("gigpo", **batch, norm="mean_norm")
    np.testing.assert_allclose(mean_norm.episode_advantage, [1.9, 2.0])
    np.testing.assert_allclose(mean_norm.step_advantage, [0.0, 0.0])  # both singletons
    std_norm = compute_advantage("gigpo", **batch, norm="mean_std_norm")
    np.testing.assert_allclose(std_norm.episode_advantage, np.array([1.9, 2.0]) / (1 + EPS))
    # Over steps the group has two values (1.9, 2): mean 1.95 -> [-0.05, 0.05].
    steps = compute_advantage("gigpo", **batch, episode_stats_over="steps")
    np.testing.assert_allclose(steps.episode_advantage, [-0.05, 0.05], atol=1e-12)


def test_all_equal_rewards_give_zero_advantage():
    # Four identical trajectories: every group and step group is flat, so every advantage is 0,
    # and mean_std_norm divides ~0 by (0 + eps) instead of producing NaN.
    same = rows(
        [{"group": 0, "traj": k, "states": ["a", "b"], "rewards": [0.0, 1.0]} for k in range(4)]
    )
    # Different paths but no reward anywhere: also all 0.
    zero = rows(
        [
            {
                "group": 0,
                "traj": k,
                "states": ["a", "b", "a", "c"][: k + 1],
                "rewards": [0.0] * (k + 1),
            }
            for k in range(4)
        ]
    )
    for batch in (same, zero):
        for norm in ("mean_norm", "mean_std_norm"):
            for over in ("trajectories", "steps"):
                out = compute_advantage("gigpo", **batch, norm=norm, episode_stats_over=over)
                # 0 up to float64 rounding of the returns (about 1e-16; the epsilon keeps
                # mean_std_norm from amplifying it past 1e-9).
                np.testing.assert_allclose(out.advantages, 0.0, atol=1e-9)


def test_groups_are_independent():
    # The same state key in two groups forms two step groups (Eq. 6 groups within a group).
    batch = rows(
        [
            {"group": 0, "traj": 0, "states": ["s"], "rewards": [1.0]},
            {"group": 0, "traj": 1, "states": ["s"], "rewards": [0.0]},
            {"group": 1, "traj": 2, "states": ["s"], "rewards": [5.0]},
        ]
    )
    out = compute_advantage("gigpo", **batch, gamma=1.0)
    # Group 0: outcomes 1, 0 (mean 0.5) and step group {1, 0} (mean 0.5): A = [1, -1].
    # Group 1: one trajectory (mean 0) with outcome 5, its step group a singleton: A = 5.
    np.testing.assert_allclose(out.advantages, [1.0, -1.0, 5.0])
    assert out.stats["num_step_groups"] == 2


def test_grpo_uses_the_undiscounted_outcome():
    batch = two_trajectories()
    for gamma in (0.0, 0.5, 1.0):
        out = compute_advantage("grpo", **batch, gamma=gamma, norm="mean_std_norm")
        e = 0.5 / (math.sqrt(0.5) + EPS)
        np.testing.assert_allclose(out.advantages, [e, e, -e, -e], rtol=1e-6)
        assert not out.step_advantage.any()
    # GRPO needs no state keys; it then reports no step-group statistics.
    no_keys = compute_advantage("grpo", **dict(batch, state_keys=None))
    assert no_keys.stats == {}


# ---------------------------------------------------------------------------------------------
# Statistics, registry, token broadcast, errors
# ---------------------------------------------------------------------------------------------


def test_step_group_stats_by_hand():
    # Sizes 1, 1, 3, 7, 30 (and two unused codes): 5 groups, 42 rows.
    stats = step_group_stats(np.array([1, 0, 1, 3, 7, 0, 30]))
    assert stats["num_step_groups"] == 5
    assert stats["mean_step_group_size"] == pytest.approx(42 / 5)
    assert stats["max_step_group_size"] == 30
    assert stats["singleton_share"] == pytest.approx(2 / 5)
    assert stats["singleton_row_share"] == pytest.approx(2 / 42)
    assert stats["size_share/1"] == pytest.approx(2 / 5)
    assert stats["size_share/2-5"] == pytest.approx(1 / 5)
    assert stats["size_share/6-10"] == pytest.approx(1 / 5)
    assert stats["size_share/11-20"] == 0.0
    assert stats["size_share/21+"] == pytest.approx(1 / 5)
    assert step_group_stats(None) == {}
    assert step_group_stats(np.zeros(0, dtype=np.int64))["num_step_groups"] == 0


@pytest.fixture
def episode_only_estimator():
    """An estimator registered for one test (options: AdvantageConfig's), then unregistered so
    that no other test sees it."""

    @register_advantage("episode_only_test")
    def episode_only(batch, config):
        return AdvantageResult(
            advantages=np.full(batch.n, config.gamma, dtype=np.float32),
            returns=batch.returns,
            episode_advantage=np.ones(batch.n),
            step_advantage=np.zeros(batch.n),
            stats={},
        )

    yield episode_only
    unregister_advantage("episode_only_test")


def test_registry(episode_only_estimator):
    assert {"gigpo", "grpo"} <= set(available_advantages())
    out = compute_advantage("episode_only_test", **two_trajectories(), gamma=0.5)
    np.testing.assert_array_equal(out.advantages, np.full(4, 0.5, dtype=np.float32))
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("gigpo")(episode_only_estimator)
    with pytest.raises(ValueError, match="registered: .*gigpo"):
        compute_advantage("gipgo", **two_trajectories())


def test_registry_is_left_as_found():
    # The fixture above removed its estimator (pytest runs the tests of a file in order).
    assert "episode_only_test" not in available_advantages()


def test_each_estimator_takes_its_own_options_and_inputs():
    assert advantage_estimator("gigpo").inputs == ("state_keys",)
    assert advantage_estimator("slate").inputs == ("branch_ids",)
    assert advantage_estimator("cw_grpo").inputs == ("contributions",)
    assert "omega" in advantage_estimator("gigpo").option_names()
    assert "omega" not in advantage_estimator("grpo").option_names()
    assert "episode_stats_over" not in advantage_estimator("rloo").option_names()
    assert "contribution_gamma" in advantage_estimator("cw_grpo").option_names()
    batch = two_trajectories()
    # An option of another estimator: the message lists the ones this estimator takes.
    with pytest.raises(ValueError, match=r"'grpo' takes no option 'omega'.*gamma, norm"):
        compute_advantage("grpo", **batch, omega=0.5)
    with pytest.raises(ValueError, match="contribution_gamma"):
        compute_advantage("gigpo", **batch, contribution_gamma=1.0)
    # An input it does not read, and one it needs but was not given.
    with pytest.raises(ValueError, match="'gigpo' does not read branch_ids"):
        compute_advantage("gigpo", **batch, branch_ids=[0, 0, -1, -1])
    with pytest.raises(ValueError, match="'slate' needs branch_ids"):
        compute_advantage("slate", **batch)
    # The options reach the estimator: omega scales GiGPO's step term, as Eq. 8 says.
    half = compute_advantage("gigpo", **batch, omega=0.5)
    np.testing.assert_allclose(
        half.advantages, half.episode_advantage + 0.5 * half.step_advantage, rtol=1e-6
    )
    with pytest.raises(ValueError, match="unknown estimator inputs"):
        register_advantage("bad_inputs_test", inputs=("rewardz",))
    assert "bad_inputs_test" not in available_advantages()


def test_token_advantages_broadcast_to_response_tokens():
    torch = pytest.importorskip("torch")
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    out = token_advantages(np.array([0.5, -1.0, 2.0], dtype=np.float32), mask)
    assert out.dtype == torch.float32 and out.shape == (3, 3)
    expected = torch.tensor([[0.5, 0.5, 0.0], [-1.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    assert torch.equal(out, expected)
    with pytest.raises(ValueError, match=r"\(N,\)"):
        token_advantages(np.zeros(2), mask)


def test_empty_batch():
    empty = {
        "group_ids": [],
        "traj_ids": [],
        "step_ids": [],
        "rewards": [],
        "state_keys": [],
        "invalid": [],
    }
    out = compute_advantage("gigpo", **empty)
    assert out.advantages.shape == (0,)
    assert out.stats["num_step_groups"] == 0


def test_bad_input_is_explained():
    batch = two_trajectories()
    with pytest.raises(ValueError, match="each \\(trajectory, step\\) must appear once"):
        compute_advantage("gigpo", **dict(batch, step_ids=[0, 0, 0, 1]))
    with pytest.raises(ValueError, match="rewards must be finite"):
        compute_advantage("gigpo", **dict(batch, rewards=[0.0, float("nan"), 0.0, 0.0]))
    with pytest.raises(ValueError, match="shape"):
        compute_advantage("gigpo", **dict(batch, rewards=[0.0, 1.0]))
    with pytest.raises(ValueError, match="integers"):
        compute_advantage("gigpo", **dict(batch, traj_ids=[0.5, 0.5, 1.5, 1.5]))
    with pytest.raises(TypeError, match="hashable"):
        compute_advantage("gigpo", **dict(batch, state_keys=[[0], [1], [0], [2]]))
    with pytest.raises(ValueError, match="state_keys"):
        compute_advantage("gigpo", **dict(batch, state_keys=None))
    with pytest.raises(ValueError, match="norm"):
        compute_advantage("gigpo", **batch, norm="std")
    with pytest.raises(ValueError, match="episode_stats_over"):
        compute_advantage("gigpo", **batch, episode_stats_over="groups")
    with pytest.raises(ValueError, match="gamma"):
        compute_advantage("gigpo", **batch, gamma=1.5)
