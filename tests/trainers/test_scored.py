"""The scored-action policy (``--policy scored``) on the real SmolLM2-135M-Instruct."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from agentgym.engine import SamplingParams, ScoredActionPolicy, TransformersPolicy
from agentgym.engine.decoding import choose, score_candidates
from trainers.gigpo.config import Config, ConfigError
from trainers.gigpo.logprobs import response_forward
from trainers.gigpo.rollout import collect, make_group_env


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    return model, tokenizer


def scored_policy(model, tokenizer) -> ScoredActionPolicy:
    """The trainer's scored policy over ``model`` (torch's global generator chooses)."""
    return ScoredActionPolicy(TransformersPolicy(model, tokenizer, seed=None), seed=None)


def user(prompts):
    return [[{"role": "user", "content": p}] for p in prompts]


class Recording:
    """The policy, keeping every call's prompts, admissible lists and outputs."""

    def __init__(self, policy):
        self.policy = policy
        self.calls = []

    def generate(self, messages, params, infos=None):
        out = self.policy.generate(messages, params, infos)
        prompts = [m[-1]["content"] for m in messages]
        self.calls.append((prompts, [i["admissible_actions"] for i in infos], out))
        return out


@pytest.mark.realmodel
@pytest.mark.parametrize(
    "env_id, kwargs",
    [
        ("AgentGym/Corridor-v0", {"length": 2, "max_episode_steps": 4}),
        ("AgentGym/Sokoban-v0", {"max_episode_steps": 2}),  # the second step has history
    ],
)
def test_chosen_action_is_admissible(smollm2, env_id, kwargs):
    model, tokenizer = smollm2
    policy = Recording(scored_policy(model, tokenizer))
    venv = make_group_env(
        env_id, num_groups=2, group_size=2, fmt="plain", template="actions", env_kwargs=kwargs,
        history_length=1,
    )  # fmt: skip
    torch.manual_seed(0)
    batch = collect(venv, policy, SamplingParams(temperature=2.0), seed=1)
    venv.close()
    assert len(batch) > 0 and policy.calls
    for prompts, admissible, gens in policy.calls:
        for prompt, acts, gen in zip(prompts, admissible, gens, strict=True):
            assert gen.text in acts
            assert "Valid actions:" in prompt  # the short prompt lists them
            assert gen.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
            assert len(gen.logprobs) == len(gen.token_ids)
    assert not batch.invalid.any()  # every chosen action was valid for the env


@pytest.mark.realmodel
def test_recorded_logprobs_equal_fresh_forward(smollm2):
    """What the rollout records is what the update's forward pass computes (ratio 1)."""
    model, tokenizer = smollm2
    policy = scored_policy(model, tokenizer)
    prompts = [
        'Room 1 of 3. Light comes through the blue door.\nValid actions: "red", "blue".\n',
        'Dead end. Say back.\nValid actions: "back".\n',
        'Room 2 of 3. Light comes through the green door.\nValid actions: "go through the '
        'green door", "red", "look around the room".\n',
    ]
    admissible = [["red", "blue"], ["back"], ["go through the green door", "red", "look around"]]
    torch.manual_seed(0)
    gens = policy.generate(
        user(prompts), SamplingParams(), [{"admissible_actions": a} for a in admissible]
    )
    fresh, mask, _ = response_forward(
        model.eval(), [g.prompt_ids for g in gens], [g.token_ids for g in gens],
        tokenizer.pad_token_id, torch.device("cpu"),
    )  # fmt: skip
    for b, g in enumerate(gens):
        assert g.text in admissible[b]
        expected = fresh[b, mask[b] > 0]
        torch.testing.assert_close(torch.tensor(g.logprobs), expected, atol=1e-4, rtol=0)
    # Every candidate, not only the chosen one: the shared-cache scoring equals full passes.
    candidates = [[policy.scorer.action_ids(a) for a in acts] for acts in admissible]
    scored = score_candidates(
        model, [g.prompt_ids for g in gens], candidates, pad_id=tokenizer.pad_token_id
    )
    for b, cands in enumerate(candidates):
        full, m, _ = response_forward(
            model, [gens[b].prompt_ids] * len(cands), cands, tokenizer.pad_token_id,
            torch.device("cpu"),
        )  # fmt: skip
        for k in range(len(cands)):
            torch.testing.assert_close(scored[b][k], full[k, m[k] > 0], atol=1e-4, rtol=0)


@pytest.mark.realmodel
def test_temperature_zero_is_the_argmax(smollm2):
    model, tokenizer = smollm2
    policy = scored_policy(model, tokenizer)
    prompt = "Room 1 of 3. Light comes through the gold door.\n"
    actions = ["red", "blue", "gold", "pink door", "gray"]
    info = [{"admissible_actions": actions}]
    chosen = policy.generate(user([prompt]), SamplingParams(temperature=0.0), info)[0]
    scored = score_candidates(
        model, [chosen.prompt_ids], [[policy.scorer.action_ids(a) for a in actions]],
        pad_id=tokenizer.pad_token_id,
    )[0]  # fmt: skip
    totals = torch.stack([s.sum() for s in scored])
    assert chosen.text == actions[int(torch.argmax(totals))]
    # a vanishing temperature samples the argmax too; a high one spreads over the actions
    torch.manual_seed(0)
    assert policy.generate(user([prompt]), SamplingParams(temperature=1e-6), info)[0].text == (
        chosen.text
    )
    assert {choose(totals, 1e-6) for _ in range(50)} == {int(torch.argmax(totals))}
    assert len({choose(totals, 50.0) for _ in range(50)}) > 1


def test_choose_follows_the_softmax():
    scores = torch.tensor([0.0, 1.0, -2.0])
    assert choose(scores, 0.0) == 1
    torch.manual_seed(0)
    draws = torch.tensor([choose(scores, 1.0) for _ in range(4000)])
    freq = torch.bincount(draws, minlength=3).double() / len(draws)
    torch.testing.assert_close(freq, torch.softmax(scores.double(), 0), atol=0.03, rtol=0)


def test_refused_for_a_family_without_admissible_actions(tmp_path):
    config = Config.for_env(
        "AgentGym/SearchQA-Synthetic-v0", policy="scored", out_dir=str(tmp_path / "r")
    )
    with pytest.raises(ConfigError, match="lists none"):
        config.validate()
    out = subprocess.run(
        [sys.executable, "-m", "trainers.gigpo.train", "--env", "AgentGym/SearchQA-Synthetic-v0",
         "--policy", "scored", "--out-dir", str(tmp_path / "cli")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--policy free" in out.stderr


def test_scored_sets_plain_text_and_the_action_prompt():
    config = Config.for_env("AgentGym/Sokoban-v0", policy="scored")
    assert (config.fmt, config.prompt_template) == ("plain", "actions")
    given = Config.for_env("AgentGym/Sokoban-v0", policy="scored", prompt_template="compact")
    assert given.prompt_template == "compact"
    with pytest.raises(ConfigError, match="policy"):
        Config.for_env("AgentGym/Corridor-v0", policy="guess").validate()
