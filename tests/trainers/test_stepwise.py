"""SLATE's stepwise rollout and the judges the trainer chooses from (``--judge rule|llm``).

Real envs, a real GroupVectorEnv (snapshots and branching), a real tiny Qwen2 judge; the policy
is a seeded random player with the trainer's ``generate`` signature.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import agentgym  # noqa: F401  (registers the envs)
from agentgym.algorithms import compute_advantage
from agentgym.algorithms.judges import (
    CW_GRPO_TEMPLATES,
    RULE_JUDGES,
    LLMJudge,
    ProgressJudge,
    SearchQAJudge,
    rule_judge,
)
from agentgym.engine import SamplingParams
from agentgym.vector import Step, Trajectory
from trainers.gigpo.config import Config, ConfigError
from trainers.gigpo.rollout import collect_stepwise, make_group_env

# the seeded random corridor player of the tree-rollout tests (pytest puts this folder on the path)
from test_tree_rollout import DoorPolicy  # noqa: E402  isort: skip


def play(env, actions, **reset_kwargs) -> Trajectory:
    """One episode of ``actions`` (stopping at its end) recorded as a Trajectory."""
    obs, info = env.reset(**reset_kwargs)
    traj = Trajectory(0, 0, info.get("task_id"))
    for action in actions:
        key = info["state_key"]
        nxt, reward, term, trunc, info = env.step(action)
        traj.steps.append(Step(obs, action, float(reward), key, bool(info["action_valid"]), info))
        obs = nxt
        if term or trunc:
            break
    return traj


# --- stepwise rollout ------------------------------------------------------------------------


def _stepwise(group_size=4, num_groups=3, seed=7, judge=None, backend="inprocess", **kwargs):
    venv = make_group_env(
        "AgentGym/Corridor-v0",
        num_groups=num_groups,
        group_size=group_size,
        fmt="plain",  # the policy's words are the actions, as the trainer's corridor preset
        template="compact",
        backend=backend,
        num_workers=2 if backend == "process" else None,
    )
    try:
        return collect_stepwise(
            venv, DoorPolicy(seed), SamplingParams(), judge or ProgressJudge(), seed=seed, **kwargs
        )
    finally:
        venv.close()


def test_stepwise_candidates_share_their_prefix_and_form_one_branch_group_per_round():
    batch = _stepwise()
    k = 4
    groups = batch.branch_ids
    # Every round of every group holds exactly K candidates, all acting from one state.
    for b in np.unique(groups):
        rows = np.flatnonzero(groups == b)
        assert len(rows) == k
        assert len({batch.state_keys[i] for i in rows}) == 1
        assert len(set(batch.group_ids[rows].tolist())) == 1
        assert len(set(batch.step_ids[rows].tolist())) == 1
    # Equal samples: K candidates per round, i.e. K generations per round as K episodes take.
    rounds = {(int(g), int(s)) for g, s in zip(batch.group_ids, batch.step_ids, strict=True)}
    assert len(batch) == k * len(rounds)
    # One episode per group, played by the winners: each next round starts where a winner ended.
    assert len(batch.trajectories) == 3 and all(t.done for t in batch.trajectories)
    for g, episode in enumerate(batch.trajectories):
        g_rows = np.flatnonzero(batch.group_ids == g)
        assert batch.step_ids[g_rows].max() + 1 == len(episode.steps)
        for t, step in enumerate(episode.steps):
            at_t = g_rows[batch.step_ids[g_rows] == t]
            assert {batch.state_keys[i] for i in at_t} == {step.state_key}
    # Unique one-step trajectories: a candidate's return is its own dense reward.
    assert len(set(batch.traj_ids.tolist())) == len(batch)


def _chosen_dense_rewards(episode: Trajectory) -> np.ndarray:
    """The dense rewards of an episode's own steps: env reward + the rule judge's score (the
    judge reads only the prefix, so a candidate's score equals its step's in the episode)."""
    return np.array([s.reward for s in episode.steps]) + ProgressJudge()([episode])[0]


def test_stepwise_dense_reward_is_env_reward_plus_rule_judge_and_slate_is_eq5():
    batch = _stepwise(seed=3)
    # Corridor: 0 per step, 10 at the goal; the rule judge adds 1 for a room passed.
    assert set(np.round(batch.rewards, 6).tolist()) <= {0.0, 1.0, 10.0, 11.0}
    assert {0.0, 1.0} <= set(batch.rewards.tolist())
    for g, episode in enumerate(batch.trajectories):
        g_rows = np.flatnonzero(batch.group_ids == g)
        for t, dense in enumerate(_chosen_dense_rewards(episode)):
            assert dense in batch.rewards[g_rows[batch.step_ids[g_rows] == t]]
    adv = compute_advantage(
        "slate",
        group_ids=batch.group_ids,
        traj_ids=batch.traj_ids,
        step_ids=batch.step_ids,
        rewards=batch.rewards,
        state_keys=batch.state_keys,
        invalid=np.zeros(len(batch), bool),
        branch_ids=batch.branch_ids,
        norm="mean_std_norm",
    ).advantages
    for b in np.unique(batch.branch_ids):
        rows = np.flatnonzero(batch.branch_ids == b)
        r = batch.rewards[rows].astype(np.float64)
        expected = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        np.testing.assert_allclose(adv[rows], expected, rtol=1e-5, atol=1e-5)


def test_stepwise_selection_follows_the_softmax_of_advantages():
    """A near-zero temperature always continues from a best-rewarded candidate; a high one
    (near-uniform draws) continues from worse candidates too."""

    def chosen_vs_best(batch):
        gaps = []
        for g, episode in enumerate(batch.trajectories):
            g_rows = np.flatnonzero(batch.group_ids == g)
            for t, dense in enumerate(_chosen_dense_rewards(episode)):
                gaps.append(batch.rewards[g_rows[batch.step_ids[g_rows] == t]].max() - dense)
        return np.array(gaps)

    greedy = chosen_vs_best(_stepwise(seed=11, selection_temperature=1e-4, num_groups=4))
    np.testing.assert_allclose(greedy, 0.0, atol=1e-5)
    hot = chosen_vs_best(_stepwise(seed=11, selection_temperature=100.0, num_groups=4))
    assert (hot > 0.5).any()


def test_stepwise_rollout_is_the_same_over_worker_processes():
    """Branching ships snapshots between workers: the rows equal the in-process rollout's."""
    here, there = _stepwise(seed=5), _stepwise(seed=5, backend="process")
    np.testing.assert_array_equal(here.rewards, there.rewards)
    np.testing.assert_array_equal(here.branch_ids, there.branch_ids)
    assert here.state_keys == there.state_keys
    assert [[s.action for s in t.steps] for t in here.trajectories] == [
        [s.action for s in t.steps] for t in there.trajectories
    ]


def test_stepwise_rejects_bad_budgets():
    with pytest.raises(ValueError, match="group_size >= 2"):
        _stepwise(group_size=1)
    with pytest.raises(ValueError, match="selection_temperature"):
        _stepwise(selection_temperature=0.0)


# --- judges ----------------------------------------------------------------------------------


def test_rule_judges_cover_the_families_with_ground_truth_and_refuse_webshop():
    assert set(RULE_JUDGES) == {"corridor", "sokoban", "alfworld", "searchqa"}
    alfworld = rule_judge("alfworld")
    assert (alfworld.keys, alfworld.since) == (("goal_progress", "goal_facts_met"), "previous")
    assert rule_judge("corridor").since == "best"
    with pytest.raises(ValueError, match="LLM judge"):
        rule_judge("webshop")


def test_searchqa_env_ground_truth_matches_the_passage_reading_judge():
    """``info["retrieved_answer"]`` (what the env knows) scores every round as reading the
    passages does; a trajectory recorded without the key needs the passage texts."""
    from agentgym.envs.searchqa import ScriptedSearchPolicy
    from agentgym.envs.searchqa.synthetic import knowledge_base

    env = gym.make("AgentGym/SearchQA-Synthetic-v0")
    kb = knowledge_base()
    texts = {str(p["id"]): p["contents"] for p in kb.passages}
    trajs = []
    for seed in range(12):
        policy = ScriptedSearchPolicy()
        obs, info = env.reset(seed=seed)
        traj = Trajectory(0, seed, info["task_id"])
        done = False
        while not done:
            action = policy.act(0, obs, info)
            key = info["state_key"]
            obs, reward, term, trunc, info = env.step(action)
            traj.steps.append(Step("", action, float(reward), key, True, info))
            done = term or trunc
        trajs.append(traj)
    from_env = SearchQAJudge()(trajs)
    assert any(s[:-1].max(initial=0.0) == 1.0 for s in from_env)  # searches that found it
    assert any((s[:-1] == 0.0).any() for s in from_env)  # and bridge hops that did not
    if True:  # the same rounds read from the passages
        stripped = [
            Trajectory(0, t.traj_id, t.task_id, [
                Step(s.observation, s.action, s.reward, s.state_key, True,
                     {k: v for k, v in s.info.items() if k != "retrieved_answer"})
                for s in t.steps
            ])
            for t in trajs
        ]  # fmt: skip
        from_text = SearchQAJudge(passage_text=lambda d: texts[d])(stripped)
        for a, b in zip(from_env, from_text, strict=True):
            np.testing.assert_array_equal(a, b)
        with pytest.raises(ValueError, match="passage_text"):
            SearchQAJudge()(stripped)


def _tiny_judge_model(texts):
    from trainers.gigpo.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer(texts + ["yes no red blue green back"])
    return build_model(tokenizer, seed=5), tokenizer


def test_llm_judge_multiplies_its_templates_and_scores_last_rounds_alone():
    env = gym.make("AgentGym/Corridor-v0", length=3, num_doors=3)
    trajs = [play(env, ["red", "back", "blue"], options={"task": t}) for t in range(3)]
    texts = list(CW_GRPO_TEMPLATES) + [s.observation for tr in trajs for s in tr.steps]
    model, tokenizer = _tiny_judge_model(texts)
    model.train()  # as the policy is between updates
    both = LLMJudge(model, tokenizer, template=CW_GRPO_TEMPLATES)
    first = LLMJudge(model, tokenizer, template=CW_GRPO_TEMPLATES[0])
    second = LLMJudge(model, tokenizer, template=CW_GRPO_TEMPLATES[1])
    s_both, s1, s2 = both(trajs), first(trajs), second(trajs)
    for a, b, c in zip(s_both, s1, s2, strict=True):
        np.testing.assert_allclose(a, b * c, rtol=1e-6)
    assert model.training  # judging left the model as it found it
    last = both.score_last(trajs)
    np.testing.assert_allclose(last, [s[-1] for s in s_both], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="at least one template"):
        LLMJudge(model, tokenizer, template=())


# --- trainer options ---------------------------------------------------------------------------


def test_config_wires_judges_and_stepwise_rollouts():
    assert Config(advantage="slate", rollout="stepwise").validate() is None
    old = Config(advantage="cw_grpo", judge="progress")
    old.validate()
    assert old.judge == "rule"  # earlier configs' name for the rule judge still loads
    with pytest.raises(ConfigError, match="llm"):
        Config(env="AgentGym/WebShop-Synthetic-v0", advantage="cw_grpo").validate()
    with pytest.raises(ConfigError, match="at least 2"):
        Config(advantage="slate", rollout="stepwise", group_size=1).validate()
    with pytest.raises(ConfigError, match="slate"):
        Config(advantage="gigpo", rollout="stepwise").validate()
    with pytest.raises(ConfigError, match="contribution_gamma"):
        Config(advantage="cw_grpo", contribution_gamma=0.0).validate()


@pytest.mark.parametrize(
    "options",
    [
        {"advantage": "slate", "rollout": "stepwise", "norm": "mean_std_norm"},
        {"advantage": "cw_grpo", "judge": "llm"},
        {"advantage": "cw_grpo", "judge": "rule", "contribution_gamma": 2.0},
    ],
    ids=["slate-stepwise", "cw_grpo-llm-policy-judge", "cw_grpo-rule-softmax"],
)
def test_trainer_runs_each_judge_and_rollout(tmp_path, options):
    from trainers.gigpo.train import train

    config = Config.for_env(
        "AgentGym/Corridor-v0",
        out_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
        plot=False,
        iterations=1,
        num_groups=2,
        group_size=4,
        eval_every=0,
        seed=1,
        **options,
    )
    history = train(config)
    row = [r for r in history if "rollout/success_rate" in r][-1]
    assert np.isfinite(row["update/loss"]) and row["advantage/std"] > 0


def test_alfworld_rule_judge_credits_the_rounds_that_make_goal_facts_true():
    """Expert episodes of every synthetic task type, played through a GroupVectorEnv: the judge
    scores 1 exactly where ``goal_progress`` or ``goal_facts_met`` rises above its value before
    the round (the reset's, via ``Trajectory.start_info``, for the first) into an unseen state,
    which includes the winning round and the clean/heat/cool round of those task types."""
    pytest.importorskip("textworld")
    from agentgym.envs.alfworld import TASK_TYPES
    from agentgym.envs.alfworld.data import task_type_of
    from agentgym.vector import GroupVectorEnv

    probe = gym.make("AgentGym/ALFWorld-Synthetic-v0").unwrapped
    first: dict[str, int] = {}
    for i, tid in enumerate(probe.task_ids):
        first.setdefault(task_type_of(tid), i)
    assert set(first) == set(TASK_TYPES.values())
    judge = rule_judge("alfworld")
    venv = GroupVectorEnv(
        "AgentGym/ALFWorld-Synthetic-v0", num_groups=1, group_size=1, env_kwargs={"expert": True}
    )
    try:
        for task_type, task in sorted(first.items()):
            _, infos = venv.reset(options={"task": task})
            start = infos[0]
            while venv.active.any():
                _, _, _, _, infos = venv.step([infos[0]["expert_action"]])
            traj = venv.trajectories()[0]
            assert traj.won and traj.start_info is start
            scores = judge([traj])[0]
            keys = ("goal_progress", "goal_facts_met")
            before, states = start, {start["state_key"]}
            for t, step in enumerate(traj.steps):
                rose = any(step.info[k] > before[k] for k in keys)
                new_state = step.info["state_key"] not in states
                assert scores[t] == float(rose and new_state), (task_type, t, step.action)
                before = step.info
                states.add(step.info["state_key"])
            assert scores[-1] == 1.0  # the round that won made the last goal fact true
            for verb in ("clean", "heat", "cool"):
                if verb in task_type:
                    assert any(
                        s.action.startswith(verb) and sc == 1.0
                        for s, sc in zip(traj.steps, scores, strict=True)
                    ), (task_type, [s.action for s in traj.steps])
    finally:
        venv.close()


def test_progress_judge_starts_from_the_reset_info():
    """A round that leaves a non-zero starting value unchanged scores 0 (it would score 1
    against a default start of 0), and several keys score a round that raised any of them."""
    env = gym.make("AgentGym/Corridor-v0", length=3, num_doors=3)
    traj = play(env, ["red", "blue", "green"], options={"task": 0})
    first = traj.steps[0].info["score"]
    traj.start_info = {"score": first}  # as if the episode had started where step 0 ended
    assert ProgressJudge()([traj])[0][0] == 0.0
    traj.start_info = None
    assert ProgressJudge()([traj])[0][0] == float(first > 0)
    for step in traj.steps:
        step.info["other"] = 0.0
    traj.steps[0].info["other"] = 1.0
    both = ProgressJudge(("other", "score"))([traj])[0]
    assert both[0] == 1.0
    np.testing.assert_array_equal(both[1:], ProgressJudge()([traj])[0][1:])


def test_progress_judge_since_previous_credits_recoveries_but_not_loops():
    """``since="previous"`` credits a value regained after a loss in a new state (ALFWorld's
    clean-after-take); a round back into a state already seen scores 0; ``"best"`` credits
    only new records."""

    def traj_of(values, keys):
        steps = [
            Step("", "a", 0.0, prev, True, {"v": v, "state_key": k})
            for v, k, prev in zip(values, keys, ["s0", *keys[:-1]], strict=True)
        ]
        return Trajectory(0, 0, "t", steps, start_info={"v": 0.5, "state_key": "s0"})

    # lose the fact, regain it in a new state, then the goal
    t = traj_of([0.0, 0.5, 1.0], ["s1", "s2", "s3"])
    assert ProgressJudge("v", since="previous")([t])[0].tolist() == [0.0, 1.0, 1.0]
    assert ProgressJudge("v", since="best")([t])[0].tolist() == [0.0, 0.0, 1.0]
    # take it out and put it back: the state after the put is the start state again
    loop = traj_of([0.0, 0.5, 0.0, 0.5], ["s1", "s0", "s1", "s0"])
    assert ProgressJudge("v", since="previous")([loop])[0].tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="since"):
        ProgressJudge("v", since="ever")
