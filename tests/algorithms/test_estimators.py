"""RLOO, SLATE and CW-GRPO: the vectorised estimators against loop references and hand math.

Each estimator is checked against ``advantage_reference.py`` beside these tests (loops written
from the equations in its docstring) to 1e-6 on random batches (shuffled rows, sparse ids,
one-trajectory groups, branch groups of one, all-equal contributions, both norms), and against
small cases worked out by hand. Property tests check what each estimator promises: RLOO's advantages are the
leave-one-out ones, SLATE's are zero-mean within every branch group and zero elsewhere, and
CW-GRPO keeps GRPO's advantage on the answer round and shares ``R_i A_i`` among the rounds
before it.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
from advantage_reference import reference_advantage, taken_by
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym  # noqa: F401 - registers the env ids
from agentgym.algorithms.advantage import available_advantages, compute_advantage
from agentgym.algorithms.judges import (
    DEFAULT_JUDGE_TEMPLATE,
    LLMJudge,
    ProgressJudge,
    SearchQAJudge,
    row_contributions,
)
from agentgym.vector import Step, Trajectory

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def batches(draw) -> dict:
    """Random flat rows (shuffled) with branch groups and judge contributions."""
    rewards_pool = draw(st.sampled_from([(0.0, 1.0), (0.0, 10.0, -1.0), (0.5,), (-2.0, 3.5, 7.25)]))
    rows: dict[str, list] = {
        k: [] for k in ("group_ids", "traj_ids", "step_ids", "rewards", "invalid", "branch_ids")
    }
    rows["contributions"] = []
    next_traj, next_branch = 0, 0
    flat_contributions = draw(st.booleans())  # every trajectory's rounds judged alike
    for g in range(draw(st.integers(1, 4))):
        for _ in range(draw(st.integers(1, 5))):
            length = draw(st.integers(1, 6))
            level = draw(st.sampled_from([0.0, 0.5, 1.0]))
            for t in range(length):
                rows["group_ids"].append(g)
                rows["traj_ids"].append(next_traj)
                rows["step_ids"].append(t)
                rows["rewards"].append(draw(st.sampled_from(rewards_pool)))
                rows["invalid"].append(draw(st.booleans()))
                rows["contributions"].append(
                    level if flat_contributions else draw(st.sampled_from([0.0, 0.25, 1.0]))
                )
                # A few branch groups per batch, sizes 1..many; most rows belong to none.
                in_branch = draw(st.integers(0, 3))
                rows["branch_ids"].append(next_branch + in_branch if in_branch < 3 else -1)
            next_traj += 1
        next_branch += 3
    n = len(rows["rewards"])
    perm = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(n)
    offset = draw(st.sampled_from([0, 10**12]))  # sparse ids take the np.unique path
    out = {k: np.asarray(v)[perm] for k, v in rows.items()}
    out["traj_ids"] = out["traj_ids"] + offset
    out["invalid"] = out["invalid"].astype(bool)
    out["state_keys"] = None
    return out


options = st.fixed_dictionaries(
    {
        "norm": st.sampled_from(["mean_norm", "mean_std_norm"]),
        "episode_stats_over": st.sampled_from(["trajectories", "steps"]),
        "gamma": st.one_of(st.sampled_from([0.0, 1.0, 0.95]), st.floats(0.0, 1.0)),
        "invalid_penalty": st.sampled_from([0.0, 0.1, 0.5]),
    }
)


def check(name: str, batch: dict, opts: dict) -> np.ndarray:
    fast = compute_advantage(name, **taken_by(name, {**batch, **opts}))
    ref = reference_advantage(name, **batch, **opts)
    assert fast.advantages.dtype == np.float32
    np.testing.assert_allclose(fast.advantages, ref["advantages"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fast.returns, ref["returns"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        fast.step_advantage, ref["step_advantage"], rtol=1e-6, atol=1e-6, err_msg="step"
    )
    return fast.advantages.astype(np.float64)


def test_new_estimators_are_registered():
    assert {"rloo", "slate", "cw_grpo", "grpo", "gigpo"} <= set(available_advantages())


# --- RLOO ------------------------------------------------------------------------------------


@SETTINGS
@given(batch=batches(), opts=options)
def test_rloo_matches_reference(batch, opts):
    check("rloo", batch, opts)


@SETTINGS
@given(batch=batches())
def test_rloo_is_grpo_scaled_by_k_over_k_minus_1(batch):
    """With mean_norm and no penalty, RLOO = K/(K-1) * GRPO's (trajectory statistics)."""
    opts = {"invalid_penalty": 0.0, "norm": "mean_norm"}
    a_rloo = compute_advantage("rloo", **taken_by("rloo", {**batch, **opts})).advantages
    a_grpo = compute_advantage("grpo", **taken_by("grpo", {**batch, **opts})).advantages
    trajs_in_group = {
        g: len(set(batch["traj_ids"][batch["group_ids"] == g])) for g in set(batch["group_ids"])
    }
    k = np.array([trajs_in_group[g] for g in batch["group_ids"]], dtype=np.float64)
    expected = np.where(k > 1, k / np.maximum(k - 1, 1) * a_grpo, a_grpo)
    np.testing.assert_allclose(a_rloo, expected, rtol=1e-5, atol=1e-5)


def test_rloo_by_hand():
    # One group, three trajectories with outcomes 1, 0, 2; trajectory 1's only row is invalid.
    # Baselines: (0+2)/2 = 1, (1+2)/2 = 1.5, (1+0)/2 = 0.5 -> 0, -1.5 - 0.1, 1.5.
    a = compute_advantage(
        "rloo",
        group_ids=[0, 0, 0, 0, 0],
        traj_ids=[0, 0, 1, 2, 2],
        step_ids=[0, 1, 0, 0, 1],
        rewards=[0.0, 1.0, 0.0, 0.0, 2.0],
        state_keys=None,
        invalid=[False, False, True, False, False],
    ).advantages
    np.testing.assert_allclose(a, [0.0, 0.0, -1.6, 1.5, 1.5], atol=1e-6)


# --- SLATE -----------------------------------------------------------------------------------


@SETTINGS
@given(batch=batches(), opts=options)
def test_slate_matches_reference(batch, opts):
    a = check("slate", batch, opts)
    branch = batch["branch_ids"]
    assert not a[branch < 0].any(), "rows outside branch groups are not samples"
    for b in set(branch[branch >= 0].tolist()):
        members = branch == b
        if opts["norm"] == "mean_norm":  # zero-mean within each branch group
            assert abs(a[members].sum()) < 1e-4 * max(1, members.sum())
        if members.sum() == 1:
            assert a[members][0] == 0.0


def test_slate_by_hand():
    # Two siblings branch at step 1 of one prefix (rows 1 and 3); gamma 0.5.
    # Sibling A: rewards after branch 0, 4 -> G = 0 + 0.5 * 4 = 2; sibling B: 1 -> G = 1.
    # Mean 1.5: A gets +0.5, B -0.5; the prefix row and A's last row are not samples.
    a = compute_advantage(
        "slate",
        group_ids=[0, 0, 0, 0],
        traj_ids=[0, 0, 0, 1],
        step_ids=[0, 1, 2, 1],
        rewards=[0.0, 0.0, 4.0, 1.0],
        state_keys=None,
        invalid=[False] * 4,
        gamma=0.5,
        branch_ids=[-1, 7, -1, 7],
    ).advantages
    np.testing.assert_allclose(a, [0.0, 0.5, 0.0, -0.5], atol=1e-6)


def test_slate_needs_branch_ids():
    with pytest.raises(ValueError, match="branch_ids"):
        compute_advantage(
            "slate", group_ids=[0], traj_ids=[0], step_ids=[0], rewards=[1.0],
            state_keys=None, invalid=[False],
        )  # fmt: skip
    with pytest.raises(ValueError, match="-1"):
        compute_advantage(
            "slate", group_ids=[0], traj_ids=[0], step_ids=[0], rewards=[1.0],
            state_keys=None, invalid=[False], branch_ids=[-2],
        )  # fmt: skip


# --- CW-GRPO ---------------------------------------------------------------------------------


CONTRIBUTION_GAMMAS = st.sampled_from([math.inf, 0.5, 3.0, 100.0])


@SETTINGS
@given(batch=batches(), opts=options, contribution_gamma=CONTRIBUTION_GAMMAS)
def test_cw_grpo_matches_reference(batch, opts, contribution_gamma):
    check("cw_grpo", batch, {**opts, "contribution_gamma": contribution_gamma})


@pytest.mark.parametrize("contribution_gamma", [math.inf, 2.0])
@pytest.mark.parametrize("norm", ["mean_norm", "mean_std_norm"])
def test_cw_grpo_matches_reference_on_a_large_random_batch(contribution_gamma, norm):
    """Continuous judge scores and rewards, 300 trajectories of 1..8 rounds, shuffled rows."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 9, size=300)
    traj = np.repeat(np.arange(300), lengths)
    n = traj.shape[0]
    batch = {
        "group_ids": traj // 6,
        "traj_ids": traj,
        "step_ids": np.arange(n) - np.repeat(np.cumsum(lengths) - lengths, lengths),
        "rewards": rng.normal(size=n) * (rng.random(n) < 0.3),
        "state_keys": None,
        "invalid": rng.random(n) < 0.2,
        "contributions": rng.random(n) * (rng.random(n) < 0.7),
    }
    perm = rng.permutation(n)
    batch = {k: v if v is None else v[perm] for k, v in batch.items()}
    opts = {"norm": norm, "invalid_penalty": 0.1, "contribution_gamma": contribution_gamma}
    check("cw_grpo", batch, opts)


def cw_one_group(contributions_by_traj, outcomes, contribution_gamma=math.inf, invalid=None):
    """CW-GRPO advantages of one group, one list per trajectory; each trajectory's outcome is
    its last round's reward."""
    rows = [(i, t) for i, cs in enumerate(contributions_by_traj) for t in range(len(cs))]
    last = {i: len(cs) - 1 for i, cs in enumerate(contributions_by_traj)}
    a = compute_advantage(
        "cw_grpo",
        group_ids=[0] * len(rows),
        traj_ids=[i for i, _ in rows],
        step_ids=[t for _, t in rows],
        rewards=[float(outcomes[i]) if t == last[i] else 0.0 for i, t in rows],
        state_keys=None,
        invalid=[False] * len(rows) if invalid is None else invalid,
        contributions=[c for cs in contributions_by_traj for c in cs],
        contribution_gamma=contribution_gamma,
    ).advantages.astype(np.float64)
    out, start = [], 0
    for cs in contributions_by_traj:
        out.append(a[start : start + len(cs)])
        start += len(cs)
    return out


def test_cw_grpo_by_hand_success_follows_the_contributions():
    # Outcomes 3, 1 (mean 2): A = +1, -1. The winner's 3 search rounds scored 1, 0, 0 share
    # R * A = 3: the first takes all of it (3 * 1/1 * A); the answer round keeps A whatever its
    # own score (0.4 here).
    win, lose = cw_one_group([[1.0, 0.0, 0.0, 0.4], [1.0, 0.0, 0.5]], outcomes=[3.0, 1.0])
    np.testing.assert_allclose(win, [3.0, 0.0, 0.0, 1.0], atol=1e-6)
    # A < 0: the blame is spread evenly (weight 1 on every round), contributions ignored.
    np.testing.assert_allclose(lose, [-1.0, -1.0, -1.0], atol=1e-6)
    # Proportional weights: scores 0.2, 0.6 -> 1/4, 3/4 of R * A = 2.
    win, _ = cw_one_group([[0.2, 0.6, 1.0], [0.0]], outcomes=[2.0, 0.0])
    np.testing.assert_allclose(win, [0.5, 1.5, 1.0], atol=1e-6)


def test_cw_grpo_by_hand_softmax():
    # gamma = ln 3 over the search rounds' scores 1, 0: exp weights 3, 1 -> w = 3/4, 1/4; R = 2,
    # A = +1 -> 1.5, 0.5; the answer round keeps 1. The loser (A = -1) stays uniform.
    win, lose = cw_one_group(
        [[1.0, 0.0, 0.9], [0.0, 1.0, 0.0]], outcomes=[3.0, 1.0], contribution_gamma=math.log(3)
    )
    np.testing.assert_allclose(win, [1.5, 0.5, 1.0], atol=1e-6)
    np.testing.assert_allclose(lose, [-1.0, -1.0, -1.0], atol=1e-6)
    # A huge finite gamma concentrates on the best round without overflowing.
    win, _ = cw_one_group([[0.2, 0.3, 0.0], [0.0]], outcomes=[2.0, 0.0], contribution_gamma=1e6)
    np.testing.assert_allclose(win, [0.0, 2.0, 1.0], atol=1e-6)


def test_cw_grpo_all_zero_contributions():
    # gamma = inf: a success whose search rounds all scored 0 gives them nothing (the authors'
    # behaviour: the normaliser is clamped at 1e-6, no round earned the credit) ...
    win, lose = cw_one_group([[0.0, 0.0, 0.0], [0.0, 0.0]], outcomes=[1.0, 0.0])
    np.testing.assert_allclose(win, [0.0, 0.0, 0.5], atol=1e-6)
    np.testing.assert_allclose(lose, [-0.5, -0.5], atol=1e-6)
    # ... while a finite gamma's softmax of equal scores is uniform: GRPO.
    win, _ = cw_one_group([[0.0, 0.0, 0.0], [0.0, 0.0]], outcomes=[1.0, 0.0], contribution_gamma=5)
    np.testing.assert_allclose(win, [0.5, 0.5, 0.5], atol=1e-6)


def test_cw_grpo_one_round_trajectories_are_grpo():
    base = dict(
        group_ids=[0, 0, 0, 1], traj_ids=[0, 1, 2, 3], step_ids=[0, 0, 0, 0],
        rewards=[1.0, 0.0, 5.0, 2.0], state_keys=None, invalid=[False, True, False, False],
    )  # fmt: skip
    # GRPO's advantage of the penalty-free outcomes, less each row's own penalty (the invalid
    # action does not move the group statistics, unlike the "grpo" estimator's Eq. 3).
    grpo_a = compute_advantage("grpo", **base, invalid_penalty=0.0).advantages - 0.1 * np.array(
        base["invalid"]
    )
    for contribution_gamma in (math.inf, 1.0):
        a = compute_advantage(
            "cw_grpo", **base, contributions=[0.0, 1.0, 0.3, 0.0],
            contribution_gamma=contribution_gamma,
        ).advantages  # fmt: skip
        np.testing.assert_allclose(a, grpo_a, atol=1e-6)


def _rows_by_trajectory(batch: dict) -> dict[int, np.ndarray]:
    """Row indices of each trajectory in step order."""
    out = {}
    for t in set(batch["traj_ids"].tolist()):
        rows = np.flatnonzero(batch["traj_ids"] == t)
        out[t] = rows[np.argsort(batch["step_ids"][rows])]
    return out


@SETTINGS
@given(batch=batches(), opts=options, contribution_gamma=CONTRIBUTION_GAMMAS)
def test_cw_grpo_conserves_credit_and_keeps_the_answer_round(batch, opts, contribution_gamma):
    """The answer round gets GRPO's advantage; the rounds before it share R_i * A_i."""
    opts = {**opts, "invalid_penalty": 0.0}
    a_cw = compute_advantage(
        "cw_grpo", **taken_by("cw_grpo", batch), **opts, contribution_gamma=contribution_gamma
    ).advantages.astype(np.float64)
    a_grpo = compute_advantage("grpo", **taken_by("grpo", {**batch, **opts})).advantages
    a_grpo = a_grpo.astype(np.float64)
    c = batch["contributions"]
    for rows in _rows_by_trajectory(batch).values():
        *searches, answer = rows
        a_i = a_grpo[answer]
        assert a_cw[answer] == pytest.approx(a_i, rel=1e-6, abs=1e-6)
        if not searches:
            continue
        if a_i < 0:  # failures: uniform, every round keeps A_i
            np.testing.assert_allclose(a_cw[searches], a_i, rtol=1e-5, atol=1e-6)
        elif c[searches].max() > 0 or not math.isinf(contribution_gamma):
            total = a_cw[searches].sum()
            assert total == pytest.approx(len(searches) * a_i, rel=1e-5, abs=1e-4)
        else:  # gamma = inf, nothing credited: the search rounds get 0
            np.testing.assert_allclose(a_cw[searches], 0.0, atol=1e-6)
        # The sign of the credit never flips: the weights are non-negative.
        assert (a_cw[rows] * a_i >= -1e-9).all()


@SETTINGS
@given(batch=batches(), opts=options, contribution_gamma=CONTRIBUTION_GAMMAS)
def test_cw_grpo_charges_the_penalty_to_its_round_unscaled(batch, opts, contribution_gamma):
    opts = {**opts, "invalid_penalty": 0.0, "contribution_gamma": contribution_gamma}
    batch = taken_by("cw_grpo", batch)
    clean = compute_advantage("cw_grpo", **batch, **opts).advantages.astype(np.float64)
    penalised = compute_advantage("cw_grpo", **batch, **{**opts, "invalid_penalty": 0.5})
    np.testing.assert_allclose(
        penalised.advantages, clean - 0.5 * batch["invalid"], rtol=1e-5, atol=1e-5
    )


def test_cw_grpo_rejects_bad_contributions_and_gamma():
    base = dict(group_ids=[0], traj_ids=[0], step_ids=[0], rewards=[1.0], state_keys=None)
    with pytest.raises(ValueError, match="contributions"):
        compute_advantage("cw_grpo", **base, invalid=[False])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        compute_advantage("cw_grpo", **base, invalid=[False], contributions=[1.5])
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="contribution_gamma must be > 0"):
            compute_advantage(
                "cw_grpo", **base, invalid=[False], contributions=[0.5], contribution_gamma=bad
            )


# --- Judges ----------------------------------------------------------------------------------


def play(env, actions_or_policy, max_steps: int = 20, **reset_kwargs) -> Trajectory:
    """One real episode as a Trajectory (Step.state_key: the state the action was taken from)."""
    obs, info = env.reset(**reset_kwargs)
    traj = Trajectory(group_id=0, traj_id=0, task_id=str(info.get("task_id")))
    for t in range(max_steps):
        if callable(actions_or_policy):
            action = actions_or_policy(obs, info)
        elif t < len(actions_or_policy):
            action = actions_or_policy[t]
        else:
            break
        key = info["state_key"]
        next_obs, reward, terminated, truncated, next_info = env.step(action)
        traj.steps.append(
            Step(obs, action, float(reward), key, bool(next_info["action_valid"]), next_info)
        )
        obs, info = next_obs, next_info
        if terminated or truncated:
            break
    return traj


def test_progress_judge_scores_the_rounds_that_advance_a_room():
    env = gym.make("AgentGym/Corridor-v0", length=3, num_doors=3)
    right = env.unwrapped.layout(4)
    doors = env.unwrapped.doors
    wrong = doors[(right[1] + 1) % 3]
    # right door, wrong door, back, an invalid word, right door, right door (the goal)
    actions = [doors[right[0]], wrong, "back", "jump", doors[right[1]], doors[right[2]]]
    traj = play(env, actions, options={"task": 4})
    assert traj.steps[-1].info["won"]
    scores = ProgressJudge()([traj])[0]
    np.testing.assert_array_equal(scores, [1, 0, 0, 0, 1, 1])
    # CW-GRPO over a group with a losing trajectory: the winner's credit before the goal round
    # goes to its advancing rounds only, and the rows that did not advance get none of it.
    loser = play(env, [wrong if right[0] != doors.index(wrong) else doors[right[0] - 1]] * 2,
                 options={"task": 4})  # fmt: skip
    loser.traj_id = 1
    trajs = [traj, loser]
    contrib = row_contributions(trajs, ProgressJudge())
    a = compute_advantage(
        "cw_grpo",
        group_ids=[0] * len(contrib),
        traj_ids=[tr.traj_id for tr in trajs for _ in tr.steps],
        step_ids=[t for tr in trajs for t in range(len(tr.steps))],
        rewards=[s.reward for tr in trajs for s in tr.steps],
        state_keys=None,
        invalid=[not s.action_valid for tr in trajs for s in tr.steps],
        invalid_penalty=0.0,
        contributions=contrib,
    ).advantages
    winner_a = 10.0 / 2  # outcomes 10 and 0
    # The 5 rounds before the goal share 5 * A in proportion to their scores (two advanced);
    # the goal round keeps A.
    np.testing.assert_allclose(a[:5], winner_a * 5 * scores[:5] / scores[:5].sum(), atol=1e-5)
    assert a[5] == pytest.approx(winner_a)


def test_searchqa_judge_credits_the_search_that_found_the_answer():
    from agentgym.envs.searchqa import ScriptedSearchPolicy
    from agentgym.envs.searchqa.synthetic import knowledge_base

    env = gym.make("AgentGym/SearchQA-Synthetic-v0")
    policy = ScriptedSearchPolicy()
    texts = {p["id"]: p["contents"] for p in knowledge_base(0).passages}
    judged = 0
    for task in range(6):
        traj = play(env, lambda o, i: policy.act(0, o, i), seed=task)
        scores = SearchQAJudge(texts)([traj])[0]
        assert scores.shape == (len(traj.steps),)
        last = traj.steps[-1].info
        if "golden_answers" not in last:
            continue
        judged += 1
        assert scores[-1] == pytest.approx(last["f1"])
        # A search scores 1 exactly when a passage it newly retrieved holds a golden answer.
        from agentgym.envs.searchqa.qa import normalize_answer

        gold = [normalize_answer(g) for g in last["golden_answers"]]
        for t, step in enumerate(traj.steps[:-1]):
            new = step.info["state_key"][1] - step.state_key[1]
            holds = any(g in normalize_answer(texts[d]) for d in new for g in gold)
            assert scores[t] == float(holds)
        if last["won"]:  # the scripted policy found the answer: some search held it
            assert scores[:-1].max() == 1.0 or len(traj.steps) == 1
    assert judged >= 3


def test_llm_judge_tiny_qwen_is_batched_and_probabilistic():
    torch = pytest.importorskip("torch")
    from trainers.gigpo.tiny import build_model, build_tokenizer

    env = gym.make("AgentGym/Corridor-v0", length=3, num_doors=3)
    trajs = [play(env, ["red", "back", "blue", "green"], options={"task": t}) for t in range(3)]
    texts = [DEFAULT_JUDGE_TEMPLATE] + [s.observation for tr in trajs for s in tr.steps]
    tokenizer = build_tokenizer(texts + ["yes no red blue green back"])
    model = build_model(tokenizer, seed=3).eval()
    one = LLMJudge(model, tokenizer, batch_size=1)(trajs)
    many = LLMJudge(model, tokenizer, batch_size=8)(trajs)
    for a, b, tr in zip(one, many, trajs, strict=True):
        assert a.shape == (len(tr.steps),)
        np.testing.assert_allclose(a, b, atol=1e-5)  # padding does not change a prompt's score
        assert ((a > 0) & (a < 1)).all()
    # The score is the softmax over the yes/no logits of the prompt's next token.
    judge = LLMJudge(model, tokenizer)
    prompt = judge.prompts(trajs[:1])[0]
    assert "red" in prompt and trajs[0].steps[1].observation in prompt
    with torch.inference_mode():
        logits = model(**tokenizer([prompt], return_tensors="pt")).logits[0, -1]
    expected = torch.softmax(logits[[judge.yes_id, judge.no_id]], 0)[0].item()
    assert one[0][0] == pytest.approx(expected, abs=1e-5)


def test_judge_output_is_checked():
    class Broken(ProgressJudge):
        def score(self, trajectories):
            return [np.full(len(t.steps), 2.0) for t in trajectories]

    env = gym.make("AgentGym/Corridor-v0")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Broken()([play(env, ["red"], options={"task": 0})])


def test_slea_rl_by_hand():
    """SLEA-RL (the authors' advantage): GiGPO Eq. 8 with episode statistics over step rows.

    One group, gamma 0.5. Trajectory A: states s0, s1, rewards 0, 1 (return 1); B: s0, reward 0.
    Episode: mean over the 3 step rows (1, 1, 0) = 2/3, so A's rows get 1/3 and B's -2/3 (over
    trajectories it would be +-1/2). Step: returns A0 = 0.5, A1 = 1, B0 = 0; cluster s0 holds
    A0 and B0 (mean 0.25): +-0.25; s1 holds A1 alone: 0.
    """
    rows = dict(
        group_ids=[0, 0, 0],
        traj_ids=[0, 0, 1],
        step_ids=[0, 1, 0],
        rewards=[0.0, 1.0, 0.0],
        invalid=[False] * 3,
        state_keys=["s0", "s1", "s0"],
        gamma=0.5,
    )
    out = compute_advantage("slea_rl", **rows)
    np.testing.assert_allclose(out.episode_advantage, [1 / 3, 1 / 3, -2 / 3])
    np.testing.assert_allclose(out.step_advantage, [0.25, 0.0, -0.25])
    np.testing.assert_allclose(out.advantages, [1 / 3 + 0.25, 1 / 3, -2 / 3 - 0.25], rtol=1e-6)
    # omega is the authors' step_advantage_w; the episode statistics are not an option
    half = compute_advantage("slea_rl", omega=0.5, **rows)
    np.testing.assert_allclose(half.advantages, [1 / 3 + 0.125, 1 / 3, -2 / 3 - 0.125], rtol=1e-6)
    same = compute_advantage("gigpo", episode_stats_over="steps", **rows)
    np.testing.assert_array_equal(out.advantages, same.advantages)
    with pytest.raises(ValueError, match="needs state_keys"):
        compute_advantage("slea_rl", **{**rows, "state_keys": None})
    with pytest.raises(ValueError, match="takes no option 'episode_stats_over'"):
        compute_advantage("slea_rl", episode_stats_over="trajectories", **rows)
