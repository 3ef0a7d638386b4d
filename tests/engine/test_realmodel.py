"""The real SmolLM2-135M-Instruct end to end: in-process, behind ``transformers serve``, and
scoring admissible actions; every family's prompts under its chat template.

One model load and one server per session (fixtures in conftest.py); budgets are tiny (a few
tokens, one or two turns) so that these run in the default suite.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

import agentgym
from agentgym.cli import main
from agentgym.engine import (
    RolloutEngine,
    SamplingParams,
    ScoredActionPolicy,
    candidate_actions,
    make_episodes,
)
from agentgym.wrappers.llm import make_llm_env

pytestmark = pytest.mark.realmodel

#: one id per family that plays with no data to download
FAMILY_IDS = sorted(
    {
        e.family: e.id for e in reversed(agentgym.envs.ENTRIES) if not e.real_data and e.available()
    }.values()
)


def _run(engine, specs):
    return asyncio.run(engine.run(specs))


def test_sampled_token_ids_and_logprobs_are_what_the_model_gives(smollm2_policy):
    """Token in, token out: the recorded ids decode to the text the env parsed, and their
    log-probs are the model's own (a teacher-forced forward over prompt + ids agrees)."""
    policy = smollm2_policy
    engine = RolloutEngine(
        policy,
        SamplingParams(temperature=1.0, max_tokens=6),
        max_turns=1,
        concurrency=4,
        policy_version=7,
    )
    # The worker gathers what arrives within batch_wait_s of a first request (2 ms by default):
    # on a machine busy with other work the second episode's reset can take longer than that.
    wait, policy.batch_wait_s = policy.batch_wait_s, 0.5
    try:
        records = _run(engine, make_episodes("AgentGym/Corridor-v0", tasks=1, group_size=2))
    finally:
        policy.batch_wait_s = wait
    # the two requests arrived together and went through the model as one batch
    assert max(policy.batch_sizes) >= 2
    for rec in records:
        (turn,) = rec.turns
        assert turn.policy_version == 7
        assert (
            turn.token_ids and len(turn.token_ids) == len(turn.logprobs) == turn.completion_tokens
        )
        assert policy.tokenizer.decode(turn.token_ids, skip_special_tokens=True) == turn.text
        prompt = policy.prompt_ids(turn.messages)
        assert turn.prompt_tokens == len(prompt)
        with torch.inference_mode():
            logits = policy.model(torch.tensor([prompt + turn.token_ids])).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        expected = logp.gather(-1, torch.tensor(turn.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(turn.logprobs), expected, atol=2e-3)


def test_scored_actions_match_a_plain_forward_and_are_always_valid(smollm2_policy):
    policy = smollm2_policy
    messages = [{"role": "user", "content": "You are in a corridor. Which door do you open?"}]
    actions = ["red", "blue door", "the green one"]
    scores, error, _ = asyncio.run(policy.score(messages, actions))
    assert error is None
    prompt = policy.prompt_ids(messages)
    end = policy.eos_ids[0]
    with torch.inference_mode():
        for action, (total, n) in zip(actions, scores, strict=True):
            ids = policy.tokenizer(action, add_special_tokens=False)["input_ids"] + [end]
            logits = policy.model(torch.tensor([prompt + ids])).logits[0].float()
            logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
            reference = float(logp.gather(-1, torch.tensor(ids)[:, None]).sum())
            assert n == len(ids) and total == pytest.approx(reference, abs=2e-3)

    scored = ScoredActionPolicy(policy)
    engine = RolloutEngine(scored, SamplingParams(temperature=0), max_turns=2)
    records = _run(engine, make_episodes("AgentGym/Sokoban-v0", tasks=1, group_size=2))
    for rec in records:
        for turn in rec.turns:
            assert turn.action_valid and turn.action in {"up", "down", "left", "right"}
            assert set(turn.action_scores) == {"up", "down", "left", "right"}
            assert turn.action == max(turn.action_scores, key=turn.action_scores.get)
    # greedy and the same start: both members of the group chose the same actions
    assert [t.action for t in records[0].turns] == [t.action for t in records[1].turns]


@pytest.mark.parametrize("env_id", FAMILY_IDS)
def test_every_family_renders_under_the_chat_template_and_survives_the_model(
    smollm2_policy, env_id
):
    policy = smollm2_policy
    for fmt in (None, "plain"):
        env = make_llm_env(env_id, fmt=fmt)
        prompt, info = env.reset(seed=0, options={"task": 0})
        ids = policy.prompt_ids([{"role": "user", "content": prompt}])
        text = policy.tokenizer.decode(ids)
        # ChatML around the whole prompt, and within the model's context
        assert text.startswith("<|im_start|>") and prompt.strip() in text
        assert text.endswith("<|im_start|>assistant\n")
        assert len(ids) < policy.model.config.max_position_embeddings
    # whatever the model writes, each turn is an action the env took or an invalid step
    engine = RolloutEngine(policy, SamplingParams(temperature=1.0, max_tokens=8), max_turns=2)
    (rec,) = _run(engine, make_episodes(env_id, tasks=1))
    assert rec.end_reason in {"max_turns", "terminated", "env_truncated"}
    assert len(rec.turns) >= 1
    for turn in rec.turns:
        assert turn.error is None
        if turn.parse_error is not None:  # the text did not parse: an invalid step
            assert not turn.action_valid and turn.action is None
        else:  # it parsed: the env received the action (and judged it valid or not)
            assert turn.action is not None
    if candidate_actions(info):
        scored = RolloutEngine(
            ScoredActionPolicy(policy), SamplingParams(temperature=1.0), max_turns=1
        )
        (rec,) = _run(scored, make_episodes(env_id, tasks=1))
        assert rec.turns[0].action in rec.turns[0].action_scores


def test_cli_model_in_process(smollm2_path, tmp_path, capsys):
    code = main(
        [
            "eval",
            "Corridor-v0",
            "--model",
            str(smollm2_path),
            "--device",
            "cpu",
            "--tasks",
            "1",
            "--group-size",
            "2",
            "--max-episode-steps",
            "1",
            "--max-tokens",
            "8",
            "--temperature",
            "1",
            "--out-dir",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    summary = results["envs"]["AgentGym/Corridor-v0"]
    assert summary["episodes"] == 2 and summary["turns"] == 1.0
    assert summary["policy_errors"] == {}
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [len(r["turns"]) for r in rows] == [1, 1]
    assert all(r["turns"][0]["token_ids"] for r in rows)
    assert "AgentGym/Corridor-v0: 2 episodes over 1 tasks" in capsys.readouterr().out


def test_cli_against_transformers_serve(smollm2_server, tmp_path):
    code = main(
        [
            "eval",
            "Corridor-v0",
            "--base-url",
            smollm2_server,
            "--tasks",
            "1",
            "--group-size",
            "2",
            "--max-episode-steps",
            "1",  # two concurrent requests; more turns only cost time
            "--max-tokens",
            "16",
            "--temperature",
            "1",
            "--timeout",
            "300",
            "--out-dir",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    summary = results["envs"]["AgentGym/Corridor-v0"]
    assert summary["episodes"] == 2 and summary["policy_errors"] == {}
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    turns = [t for r in rows for t in r["turns"]]
    assert len(turns) == 2
    assert all(t["text"] and t["completion_tokens"] and t["prompt_tokens"] for t in turns)
    # the server's own model name was looked up and recorded
    assert results["settings"]["policy_info"]["model"].endswith("SmolLM2-135M-Instruct")


def test_scored_over_a_server_without_prompt_logprobs_fails_once_clearly(
    smollm2_server, smollm2_path, tmp_path, capsys
):
    code = main(
        [
            "eval",
            "Corridor-v0",
            "--base-url",
            smollm2_server,
            "--policy",
            "scored",
            "--tokenizer",
            str(smollm2_path),
            "--tasks",
            "2",
            "--max-episode-steps",
            "1",
            "--timeout",
            "300",
            "--out-dir",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "returned no prompt log-probs" in err and "vLLM" in err
    assert err.count("returned no prompt log-probs") == 1
    assert json.loads((tmp_path / "results.json").read_text())["complete"] is False


@pytest.fixture
def every_playable_id(request, monkeypatch) -> list[str]:
    """Every registered id whose packages are here, with real data unpacked (or generated in the
    family's real format) where the id needs it; ids whose real data is absent are left out."""
    from agentgym.family import family_spec

    ids = []
    for e in agentgym.envs.ENTRIES:
        if not e.available():
            continue
        if e.real_data:
            variable = family_spec(e.family).data_env_var
            try:
                root = request.getfixturevalue(f"{e.family}_real_data")  # conftest's convention
            except (pytest.skip.Exception, pytest.FixtureLookupError):
                continue
            monkeypatch.setenv(variable, str(root))
        ids.append(e.id)
    return ids


@pytest.mark.parametrize("path", ["model", "base_url"])
def test_eval_plays_every_registered_id_on_both_paths(
    path, every_playable_id, smollm2_path, request, tmp_path
):
    """`agentgym eval` in-process (--model) and against a real server (--base-url) gives every
    registered id an episode: the model's reply reaches the env as an action or an invalid step,
    and no request fails."""
    if path == "model":
        backend = ["--model", str(smollm2_path), "--device", "cpu"]
    else:
        # transformers serve on a loaded CPU has refused a burst of 10 connections now and then
        # (the run records them as connection errors): a few in flight, and retries
        server = request.getfixturevalue("smollm2_server")
        backend = ["--base-url", server, "--timeout", "300", "--concurrency", "4", "--retries", "4"]
    budget = ["--tasks", "1", "--max-episode-steps", "1", "--max-tokens", "8", "--temperature", "1"]
    code = main(
        ["eval", *every_playable_id, *backend, *budget, "--out-dir", str(tmp_path), "--quiet"]
    )
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert sorted(results["envs"]) == sorted(every_playable_id)
    for env_id, summary in results["envs"].items():
        assert summary["episodes"] == 1, env_id
        assert summary["policy_errors"] == {}, env_id
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(r["env_id"] for r in rows) == sorted(every_playable_id)
    for row in rows:
        (turn,) = row["turns"]
        assert turn["text"], row["env_id"]
        # parsed: the env took the action (valid or not); unparsed: an invalid step
        assert turn["action"] is not None or turn["action_valid"] is False, row["env_id"]
