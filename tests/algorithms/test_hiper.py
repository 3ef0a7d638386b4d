"""HiPER: the plan-execute action format, the wrapper on a real env, and hierarchical advantage
estimation against hand math and a loop written from the equations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym  # noqa: F401 - registers the env ids
from agentgym.algorithms import available_advantages, compute_advantage
from agentgym.algorithms.advantage import AdvantageBatch
from agentgym.algorithms.hiper import (
    HiPERConfig,
    SubgoalActions,
    hierarchical_advantages,
    parse_subgoal,
    plan_execute_token_advantages,
)
from agentgym.wrappers import ParseActions, PromptRenderer, parse_action

# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------


def test_reply_without_plan_blocks_is_untouched_for_every_format():
    for text, fmt in [
        ("<think>t</think><action>open door 1</action>", "think_action"),
        ("<think>t</think><search>capital of france</search>", "search_answer"),
        ("go north", "plain"),
    ]:
        reply = parse_subgoal(text)
        assert (reply.subgoal, reply.switch, reply.text, reply.error) == (None, None, text, None)
        assert parse_action(reply.text, fmt).valid


def test_plan_blocks_are_cut_out_and_the_family_parser_reads_the_rest():
    reply = parse_subgoal(
        "<switch> switch </switch>\n<SUBGOAL> open the   door </SUBGOAL>"
        "<think>the door is shut</think><action>open door 1</action>"
    )
    assert (reply.subgoal, reply.switch, reply.error) == ("open the door", True, None)
    assert parse_action(reply.text, "think_action").action == "open door 1"
    keep = parse_subgoal("<switch>KEEP</switch><answer>paris</answer>")
    assert (keep.subgoal, keep.switch, keep.text) == (None, False, "<answer>paris</answer>")


@pytest.mark.parametrize(
    "text",
    [
        "<subgoal>never closed",
        "</subgoal>x<subgoal>",
        "<subgoal>a</subgoal><subgoal>b</subgoal>",
        "<switch>maybe</switch><action>x</action>",
        "<subgoal>a<switch>KEEP</switch></subgoal>",
        None,
        b"\xff<subgoal>",
    ],
)
def test_malformed_plan_blocks_are_errors_not_exceptions(text):
    reply = parse_subgoal(text)
    assert reply.error is not None and reply.subgoal is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([*"<>/abc ", "subgoal", "switch", "KEEP"])).map("".join))
def test_parse_subgoal_never_raises_and_keeps_its_invariant(text):
    reply = parse_subgoal(text)
    if reply.error is None:
        assert "<subgoal>" not in reply.text.lower() or reply.subgoal is None
    else:
        assert reply.subgoal is None and reply.switch is None


def test_subgoal_wrapper_marks_planner_turns_on_a_real_env():
    env = PromptRenderer(
        SubgoalActions(ParseActions(gym.make("AgentGym/Corridor-v0", length=3), "plain"))
    )
    _, info = env.reset(seed=0)
    assert info["subgoal"] is None and info["subgoal_start"] is False
    actions = info["admissible_actions"]
    a = actions[0]
    replies = [
        (f"{a}", True, None),  # the first turn always starts a segment
        (f"<subgoal>reach the end</subgoal>{a}", True, "reach the end"),  # stated: new
        (f"<subgoal>Reach the  END</subgoal>{a}", False, "reach the end"),  # same subgoal
        (f"<switch>KEEP</switch><subgoal>other</subgoal>{a}", False, "reach the end"),
        (f"<switch>SWITCH</switch><subgoal>other</subgoal>{a}", True, "other"),
        (f"<subgoal>unclosed {a}", False, "other"),  # malformed: invalid turn, no change
    ]
    for reply, start, subgoal in replies:
        prompt, _, terminated, truncated, info = env.step(reply)
        assert info["subgoal_start"] is start, reply
        assert info["subgoal"] == subgoal, reply
        # the sub-goal in force is shown with the observation, inside the space
        assert (f"Current sub-goal: {subgoal}" in prompt) is (subgoal is not None)
        assert env.observation_space.contains(prompt)
        if terminated or truncated:
            break
    assert info["action_valid"] is False and "subgoal_error" in info
    # a model's subgoal is kept inside the charset and bounded
    quiet = SubgoalActions(ParseActions(gym.make("AgentGym/Corridor-v0", length=3), "plain"))
    _, info = quiet.reset(seed=0)
    obs, *_, info = quiet.step(f"<subgoal>caf\u00e9 {'x' * 999}</subgoal>{a}")
    assert info["subgoal"].isascii() and len(info["subgoal"]) <= 256 + 3
    assert quiet.observation_space.contains(obs)


# ---------------------------------------------------------------------------------------------
# Hierarchical advantage estimation
# ---------------------------------------------------------------------------------------------

# One group, two trajectories. A: s0 -> s1 -> s2, rewards 0, 0, 1, a new subgoal at its third
# turn (segments [0, 1] and [2]). B: s0 -> s2, rewards 0, 0, one segment. Step groups: s0 (A0,
# B0), s2 (A2, B1), s1 (A1 alone).
HAND = dict(
    group_ids=[0, 0, 0, 0, 0],
    traj_ids=[0, 0, 0, 1, 1],
    step_ids=[0, 1, 2, 0, 1],
    rewards=[0.0, 0.0, 1.0, 0.0, 0.0],
    invalid=[False] * 5,
    state_keys=["s0", "s1", "s2", "s0", "s2"],
    segment_starts=[True, False, True, True, False],
)


def test_hiper_matches_hand_computation_gamma_one():
    # gamma 1: returns A 1, 1, 1 and B 0, 0; V(s0) = .5, V(s1) = 1, V(s2) = .5.
    # Executor: A2 = 1 - .5; A1 = 0 + V_H(s2) - V(s1) = -.5 (the boundary bootstrap);
    # A0 = (V(s1) - V(s0)) + A1 = 0; B1 = 0 - .5; B0 = (V(s2) - V(s0)) + B1 = -.5.
    # Planner: A2 = 1 - .5; A0 = 0 + V(s2) - V(s0) + 0.95 * A_H(A2) = .475; B0 = 0 - .5.
    result = compute_advantage("hiper", **HAND)
    np.testing.assert_allclose(result.step_advantage, [0.0, -0.5, 0.5, -0.5, -0.5], atol=1e-12)
    np.testing.assert_allclose(result.episode_advantage, [0.475, 0.0, 0.5, -0.5, 0.0], atol=1e-12)
    np.testing.assert_array_equal(result.advantages, result.step_advantage.astype(np.float32))


def test_hiper_matches_hand_computation_discounted():
    # gamma .5: returns A .25, .5, 1 and B 0, 0; V(s0) = .125, V(s1) = .5, V(s2) = .5.
    # Executor: A2 = .5; A1 = .5 * .5 - .5 = -.25; A0 = (.5 * .5 - .125) + .5 * A1 = 0;
    # B1 = -.5; B0 = (.5 * .5 - .125) + .5 * B1 = -.125.
    # Planner: A0 = 0 + .5**2 * V(s2) - V(s0) + .5**2 * .95 * .5 = .11875; A2 = .5; B0 = -.125.
    result = compute_advantage("hiper", gamma=0.5, **HAND)
    np.testing.assert_allclose(result.step_advantage, [0.0, -0.25, 0.5, -0.125, -0.5], atol=1e-12)
    np.testing.assert_allclose(
        result.episode_advantage, [0.11875, 0.0, 0.5, -0.125, 0.0], atol=1e-12
    )


def test_invalid_penalty_enters_the_reward_before_the_recursions():
    # Authors' convention: the penalty is a reward, so it reaches the earlier turns of its
    # segment (unlike GiGPO's, charged to its own step only).
    rows = dict(HAND, invalid=[False, True, False, False, False])
    clean = compute_advantage("hiper", invalid_penalty=0.1, **HAND)
    penalised = compute_advantage("hiper", invalid_penalty=0.1, **rows)
    # A1 is alone in s1 and its executor value absorbs the penalty; A0 (in s0 with B0) sees
    # the lower return through V(s1) and its planner advantage through the segment return.
    assert penalised.episode_advantage[0] == pytest.approx(clean.episode_advantage[0] - 0.05)
    assert penalised.step_advantage[0] == pytest.approx(clean.step_advantage[0] - 0.05)


def _loop_hae(rows, values, gamma, lam_turn, lam_seg):
    """HAE by loops over each trajectory, from the module docstring's equations."""
    n = len(rows["rewards"])
    r = np.array(rows["rewards"]) - 0.1 * np.array(rows["invalid"])
    a_low, a_high = np.zeros(n), np.zeros(n)
    for traj in set(rows["traj_ids"]):
        idx = sorted(
            (i for i in range(n) if rows["traj_ids"][i] == traj), key=lambda i: rows["step_ids"][i]
        )
        starts = [p for p, i in enumerate(idx) if p == 0 or rows["segment_starts"][i]]
        bounds = [*starts, len(idx)]
        segs = list(zip(bounds[:-1], bounds[1:], strict=True))
        nxt_high = 0.0
        for k in range(len(segs) - 1, -1, -1):
            s, e = segs[k]
            handoff = values[idx[e]] if e < len(idx) else 0.0
            acc = 0.0
            for p in range(e - 1, s - 1, -1):
                v_next = values[idx[p + 1]] if p + 1 < e else handoff
                delta = r[idx[p]] + gamma * v_next - values[idx[p]]
                acc = delta + (gamma * lam_turn * acc if p + 1 < e else 0.0)
                a_low[idx[p]] = acc
            seg_return = sum(gamma ** (p - s) * r[idx[p]] for p in range(s, e))
            d = e - s
            delta = seg_return + gamma**d * handoff - values[idx[s]]
            nxt_high = delta + gamma**d * lam_seg * nxt_high
            a_high[idx[s]] = nxt_high
    return a_low, a_high


@st.composite
def segmented_batches(draw) -> dict:
    rows: dict[str, list] = {
        k: [] for k in ("group_ids", "traj_ids", "step_ids", "rewards", "invalid", "segment_starts")
    }
    traj = 0
    for g in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(1, 4))):
            for t in range(draw(st.integers(1, 7))):
                rows["group_ids"].append(g)
                rows["traj_ids"].append(traj)
                rows["step_ids"].append(t)
                rows["rewards"].append(draw(st.sampled_from([0.0, 1.0, -0.5, 2.0])))
                rows["invalid"].append(draw(st.booleans()))
                rows["segment_starts"].append(draw(st.booleans()))
            traj += 1
    order = draw(st.permutations(range(len(rows["rewards"]))))
    return {k: [v[i] for i in order] for k, v in rows.items()}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segmented_batches(),
    st.sampled_from([1.0, 0.9, 0.5]),
    st.sampled_from([1.0, 0.8]),
    st.sampled_from([0.95, 0.0, 1.0]),
    st.integers(0, 2**32 - 1),
)
def test_vectorised_hae_matches_the_loop(rows, gamma, lam_turn, lam_seg, seed):
    values = np.random.default_rng(seed).normal(size=len(rows["rewards"]))
    config = HiPERConfig(gamma=gamma, lam_turn=lam_turn, lam_seg=lam_seg)
    batch = AdvantageBatch(
        group_ids=rows["group_ids"],
        traj_ids=rows["traj_ids"],
        step_ids=rows["step_ids"],
        rewards=rows["rewards"],
        state_keys=None,
        invalid=rows["invalid"],
        config=config,
        segment_starts=rows["segment_starts"],
    )
    low, high = hierarchical_advantages(
        batch, batch.segment_starts, values, values, gamma=gamma, lam_turn=lam_turn, lam_seg=lam_seg
    )
    ref_low, ref_high = _loop_hae(rows, values, gamma, lam_turn, lam_seg)
    np.testing.assert_allclose(low, ref_low, atol=1e-9)
    np.testing.assert_allclose(high, ref_high, atol=1e-9)


def test_telescoping_at_lambda_one():
    # lam_turn = lam_seg = 1: A_H at a planner turn is its discounted return minus V(s).
    rows = dict(HAND)
    result = compute_advantage("hiper", gamma=0.9, lam_seg=1.0, **rows)
    g = result.returns
    v = {"s0": (g[0] + g[3]) / 2, "s2": (g[2] + g[4]) / 2}
    assert result.episode_advantage[0] == pytest.approx(g[0] - v["s0"])
    assert result.episode_advantage[2] == pytest.approx(g[2] - v["s2"])


def test_mean_std_norm_whitens_each_level():
    result = compute_advantage("hiper", norm="mean_std_norm", **HAND)
    planner = np.array(HAND["segment_starts"])
    assert abs(result.step_advantage.mean()) < 1e-9
    assert result.step_advantage.std() == pytest.approx(1.0, rel=1e-4)
    assert abs(result.episode_advantage[planner].mean()) < 1e-9
    assert np.all(result.episode_advantage[~planner] == 0.0)


def test_hiper_is_registered_and_needs_its_inputs():
    assert "hiper" in available_advantages()
    rows = {k: v for k, v in HAND.items() if k != "segment_starts"}
    with pytest.raises(ValueError, match="needs segment_starts"):
        compute_advantage("hiper", **rows)
    with pytest.raises(ValueError, match="does not read segment_starts"):
        compute_advantage("gigpo", **HAND)
    with pytest.raises(ValueError, match="lam_seg"):
        compute_advantage("hiper", lam_seg=1.5, **HAND)


def test_token_assignment_puts_each_level_on_its_span():
    result = compute_advantage("hiper", **HAND)
    action = torch.tensor([[0, 1, 1]] * 5)
    subgoal = torch.tensor([[1, 0, 0]] * 5)
    tokens = plan_execute_token_advantages(result, action, subgoal)
    np.testing.assert_allclose(tokens[:, 0].numpy(), result.episode_advantage, atol=1e-6)
    np.testing.assert_allclose(tokens[:, 2].numpy(), result.step_advantage, atol=1e-6)


def test_the_trainer_builds_segment_starts_from_step_infos():
    from types import SimpleNamespace

    from agentgym.algorithms import advantage_estimator
    from agentgym.vector import Step, Trajectory
    from trainers.gigpo.train import estimator_inputs

    marked = Trajectory(group_id=0, traj_id=0, task_id="t")
    for start in (True, False, True):
        marked.steps.append(Step("o", "a", 0.0, "s", True, {"subgoal_start": start}))
    plain = Trajectory(group_id=0, traj_id=1, task_id="t")
    plain.steps += [Step("o", "a", 0.0, "s", True, {}) for _ in range(2)]
    batch = SimpleNamespace(trajectories=[marked, plain], row_start=None)
    inputs = estimator_inputs(advantage_estimator("hiper"), batch, None)
    np.testing.assert_array_equal(inputs["segment_starts"], [True, False, True, True, False])


def test_docstring_examples_hold():
    import doctest

    import agentgym.algorithms.hiper as module

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 3 and result.failed == 0
