"""HiPER in the bundled trainer: subgoal envs, the tiny model's plan words, per-token advantages."""

from __future__ import annotations

import numpy as np

from agentgym.algorithms.advantage import advantage_estimator, compute_advantage
from agentgym.algorithms.hiper import SUBGOAL_INSTRUCTION, parse_subgoal
from trainers.gigpo import train as train_module
from trainers.gigpo.config import Config
from trainers.gigpo.rollout import TRAINER_TEMPLATES
from trainers.gigpo.subgoals import PLAN_WORDS, make_subgoal_llm_env, plan_token_mask
from trainers.gigpo.tiny import build_tokenizer


def test_plan_tokens_are_the_plan_blocks_of_a_well_formed_reply():
    tok = build_tokenizer(["go north now"], whole_words=PLAN_WORDS)

    def mask(text: str) -> list[bool]:
        return plan_token_mask(tok, tok(text)["input_ids"]).tolist()

    # The switch block is one word; a subgoal's words sit between its two tag words.
    assert mask("<switch>SWITCH</switch><subgoal>go north</subgoal> north") == [True] * 5 + [False]
    assert mask("north <switch>KEEP</switch>") == [False, True]
    assert mask("go north") == [False, False]
    # Malformed plans are no plans (the env marks the turn invalid).
    assert mask("<subgoal> north") == [False, False]
    assert mask("</subgoal> <switch>SWITCH</switch>") == [False, False]


def test_subgoal_envs_ask_for_subgoals_and_report_segment_starts():
    for template in (None, "compact"):  # with and without a format instruction
        env = make_subgoal_llm_env(
            "AgentGym/Corridor-v0",
            fmt="plain",
            history_length=1,
            template=TRAINER_TEMPLATES.get(template, template),
        )
        obs, info = env.reset(seed=0)
        # The instruction goes beside the format's; the tiny model's prompt shows neither.
        assert (SUBGOAL_INSTRUCTION in obs) == (template is None)
        assert info["subgoal_start"] is False
        door = info["admissible_actions"][0]
        obs, _, _, _, info = env.step(f"<switch>KEEP</switch> {door}")
        assert info["subgoal_start"] and info["action_valid"]  # the first turn always starts
        obs, _, _, _, info = env.step(f"<switch>SWITCH</switch> {info['admissible_actions'][0]}")
        assert info["subgoal_start"] and info["action_valid"]
        obs, _, _, _, info = env.step(f"<switch>KEEP</switch> {info['admissible_actions'][0]}")
        assert not info["subgoal_start"] and info["action_valid"]


def test_a_hiper_iteration_trains_plan_tokens_on_the_planner_advantage(tmp_path, monkeypatch):
    """One iteration of ``--advantage hiper`` on the corridor with the tiny model: episodes have
    segments after their first turn, and the loss sees the planner advantage on planner turns'
    plan tokens and the executor advantage on every other token."""
    seen: dict[str, list] = {"groups": [], "adv": [], "batch": []}
    real_update, real_groups = train_module.update_policy, train_module.micro_groups
    real_loss = train_module.ppo_clip_loss

    def update_policy(config, learner, batch, advantages, it, console):
        seen["batch"].append(batch)
        return real_update(config, learner, batch, advantages, it, console)

    def micro_groups(*args, **kwargs):
        groups = real_groups(*args, **kwargs)
        seen["groups"].extend(groups)
        return groups

    def ppo_clip_loss(logp, old_lp, adv_tok, mask, *args, **kwargs):
        seen["adv"].append((adv_tok.detach().cpu().clone(), mask.detach().cpu().clone()))
        return real_loss(logp, old_lp, adv_tok, mask, *args, **kwargs)

    monkeypatch.setattr(train_module, "update_policy", update_policy)
    monkeypatch.setattr(train_module, "micro_groups", micro_groups)
    monkeypatch.setattr(train_module, "ppo_clip_loss", ppo_clip_loss)
    config = Config.for_env(
        "AgentGym/Corridor-v0",
        advantage="hiper",
        max_new_tokens=2,  # room for a one-word plan and a one-word action
        # Each level whitened over its own rows: the planner advantage of a segment's first
        # turn then differs from the executor one (raw, they coincide on an episode's last
        # segment), so a loss that gave every token the executor advantage is told apart.
        norm="mean_std_norm",
        iterations=1,
        num_groups=2,
        group_size=4,
        eval_groups=0,
        checkpoint_every=0,
        save_final=False,
        out_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
        plot=False,
        quiet=True,
    )
    (record,) = train_module.train(config)
    (batch,) = seen["batch"]
    assert record["advantage/segments_per_episode"] > 1.0  # logged: the model does plan

    # Episodes have more than one segment: turns after the first start new ones.
    infos = [[s.info for s in t.steps] for t in batch.trajectories]
    assert all(steps[0]["subgoal_start"] for steps in infos)
    assert any(info["subgoal_start"] for steps in infos for info in steps[1:])

    # The two levels, computed here from the rollout's rows.
    starts = np.array([info["subgoal_start"] for steps in infos for info in steps])
    result = compute_advantage(
        "hiper",
        group_ids=batch.group_ids,
        traj_ids=batch.traj_ids,
        step_ids=batch.step_ids,
        rewards=batch.rewards,
        state_keys=batch.state_keys,
        invalid=batch.invalid,
        segment_starts=starts,
        **train_module.estimator_options(config, advantage_estimator("hiper")),
    )
    low, high = result.step_advantage, result.episode_advantage
    # The run's tokenizer (built the same way: the tiny one is a function of the env's texts).
    words = build_tokenizer(train_module.env_texts(config), whole_words=PLAN_WORDS)
    checked_plan = 0
    # Each micro-batch's rows (in the order the loss saw them) against what the loss got.
    assert len(seen["groups"]) == len(seen["adv"])
    for idx, (adv, mask) in zip(seen["groups"], seen["adv"], strict=True):
        width = adv.shape[1]
        for b, i in enumerate(idx):
            ids = batch.response_ids[i]
            got = adv[b, width - len(ids) :]
            assert mask[b, width - len(ids) :].all() and not mask[b, : width - len(ids)].any()
            text = words.decode(ids, skip_special_tokens=True)
            planner = starts[i] or batch.step_ids[i] == 0
            well_formed = parse_subgoal(text).error is None
            for j, word in enumerate(words.convert_ids_to_tokens(ids)):
                is_plan = planner and well_formed and word in PLAN_WORDS
                want = high[i] if is_plan else low[i]
                assert abs(float(got[j]) - want) < 1e-5, (text, j, float(got[j]), low[i], high[i])
                checked_plan += is_plan and abs(high[i] - low[i]) > 1e-3
    # Planner tokens whose advantage differs from the executor's were trained (the old loss
    # gave every token the row's executor advantage).
    assert checked_plan > 0
