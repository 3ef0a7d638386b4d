"""TRL's real GRPOTrainer trains a tiny offline model on agentgym envs through both adapters.

Each path runs its example's entry point for a few steps and then checks, from what TRL itself
logged, that the rewards are the env's (replaying the logged actions in a fresh env gives the
logged reward) and that every generation of a prompt played the same task from the same state.
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from transformers import TrainerCallback  # noqa: E402

import agentgym  # noqa: E402
from agentgym.integrations.trl import (  # noqa: E402
    AgentGymEnvironment,
    GroupRollout,
    _group_tasks,
    build_dataset,
    environment_factory,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENV = "AgentGym/Corridor-v0"
GROUP = 4
SMALL = ["--num-generations", str(GROUP), "--batch-size", str(2 * GROUP)]


@pytest.fixture
def one_thread():
    """The examples run tiny models on one torch thread; give the others theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _example(name: str):
    sys.path.insert(0, str(EXAMPLES))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))


class _Recorder(TrainerCallback):
    """After every optimizer step, keep what TRL logged for that step's generation batch."""

    def __init__(self) -> None:
        self.trainer = None
        self.batches: list[dict] = []
        self.params_before: list[torch.Tensor] = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.params_before = [p.detach().clone() for p in model.parameters()]

    def on_step_end(self, args, state, control, **kwargs):
        logs = self.trainer._logs
        self.batches.append(
            {
                "completion": list(logs["completion"]),
                "rewards": {k: list(v) for k, v in logs["rewards"].items()},
            }
        )


def _replay(env_id, env_kwargs, seed, task_id, actions) -> tuple[float, object]:
    """Return and initial state_key of ``actions`` played from the row's task in a fresh env."""
    env = gym.make(env_id, disable_env_checker=True, **env_kwargs)
    _, info = env.reset(seed=seed, options={"task": task_id})
    total = 0.0
    for action in actions:
        _, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        if terminated or truncated:
            break
    env.close()
    return total, info["state_key"]


def _tool_calls(completion: list[dict]) -> list[str]:
    """The ``act`` arguments of a TRL-logged completion (a list of chat messages), in order."""
    return [
        call["function"]["arguments"]["action"]
        for message in completion
        if message["role"] == "assistant"
        for call in message.get("tool_calls") or []
    ]


# ----------------------------------------------------------------------------------------------
def test_importing_agentgym_does_not_import_trl():
    code = "import agentgym, agentgym.integrations.trl, sys; print('trl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_trl_is_one_line_naming_the_extra():
    code = (
        "import sys; sys.modules['trl'] = None\n"
        "from agentgym.integrations.trl import environment_factory\n"
        "environment_factory('AgentGym/Corridor-v0')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("agentgym.extras.MissingExtra")
        and 'pip install "agentgym-envs[trl]"' in last
    )


def test_environment_exposes_act_as_a_typed_documented_tool():
    from transformers.utils import get_json_schema

    env = environment_factory(ENV)()
    schema = get_json_schema(env.act)["function"]
    assert schema["name"] == "act"
    assert schema["parameters"]["properties"]["action"]["type"] == "string"
    assert schema["parameters"]["properties"]["action"]["description"]
    # what TRL turns into tools: the class's public functions other than reset / get_reward
    tools = [
        name
        for name, _ in inspect.getmembers(AgentGymEnvironment, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    ]
    assert tools == ["act"]


def test_reset_replays_the_row_and_bad_actions_do_not_raise():
    kwargs = {"length": 2, "num_doors": 3}
    rows = list(build_dataset(ENV, 3, seed=5, env_kwargs=kwargs))
    assert len({r["task_id"] for r in rows}) == 3
    assert [r["seed"] for r in rows] == [5, 6, 7]
    assert rows[0]["prompt"][-1]["task_id"] == rows[0]["task_id"]
    a, b = environment_factory(ENV, kwargs)(), environment_factory(ENV, kwargs)()
    assert a.reset(**rows[1]) == b.reset(**rows[1])
    assert a.initial_state_key == b.initial_state_key
    assert a.trajectory.task_id == rows[1]["task_id"]
    text = a.act("open the fridge")
    assert "Invalid action" in text and a.info["action_valid"] is False
    assert a.trajectory.steps[-1].action_valid is False
    with pytest.raises(ValueError, match="build_dataset"):
        a.reset(prompt=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    "env_id",
    [
        "AgentGym/Sokoban-v0",
        "AgentGym/ALFWorld-Synthetic-v0",
        "AgentGym/SearchQA-Synthetic-v0",
        "AgentGym/WebShop-Synthetic-v0",
    ],
)
def test_every_family_starts_a_group_from_one_state(env_id):
    if env_id not in agentgym.env_ids(available_only=True):
        pytest.skip(f"{env_id}: optional packages not installed")
    rows = list(build_dataset(env_id, 2, seed=3))
    factory = environment_factory(env_id)
    first, second = factory(), factory()
    assert first.reset(**rows[1]) == second.reset(**rows[1])
    assert first.initial_state_key == second.initial_state_key
    assert first.trajectory.task_id == rows[1]["task_id"]
    first.act("<an action no family accepts>")
    assert first.info["action_valid"] is False
    assert first.trajectory.steps[0].state_key == second.initial_state_key


def test_environment_factory_trains_on_env_rewards(tmp_path, one_thread):
    """TRL's GRPOTrainer drives the env through tool calls; its logged rewards are the env's."""
    example = _example("trl_environment_factory")
    recorder = _Recorder()
    steps = 3
    trainer, factory = example.build(
        ["--max-steps", str(steps), "--num-tasks", "8", *SMALL, "--output-dir", str(tmp_path)],
        callbacks=[recorder],
    )
    recorder.trainer = trainer
    trainer.train()

    per_batch = len(factory.episodes) // steps
    assert len(factory.episodes) == steps * per_batch and per_batch % GROUP == 0
    all_rewards = []
    for b, batch in enumerate(recorder.batches):
        episodes = factory.episodes[b * per_batch : (b + 1) * per_batch]
        logged = batch["rewards"]["AgentGymEnvironment"]
        # TRL's logged reward of each completion is what the env returned for that rollout ...
        assert logged == pytest.approx([e.reward for e in episodes])
        for ep, completion in zip(episodes, batch["completion"], strict=True):
            calls = _tool_calls(completion)
            # ... the env played exactly the tool calls TRL logged, up to the episode's end ...
            assert ep.actions == calls[: len(ep.actions)]
            assert ep.trajectory.done or len(ep.actions) == len(calls)
            # ... and a fresh env replaying them from the row's task gives the same reward
            replayed, initial = _replay(
                factory.env_id, factory.env_kwargs, ep.seed, ep.task_id, ep.actions
            )
            assert replayed == pytest.approx(ep.reward)
            assert initial == ep.initial_state_key
        # every generation of one prompt played the same task from the same state
        for g in range(0, per_batch, GROUP):
            group = episodes[g : g + GROUP]
            assert len({(e.task_id, e.seed, e.initial_state_key) for e in group}) == 1
        assert len({e.task_id for e in episodes}) == per_batch // GROUP
        all_rewards += logged
    assert any(r > 0 for r in all_rewards), "no rollout won: the reward check would be vacuous"
    assert any(r == 0 for r in all_rewards)
    changed = [
        not torch.equal(a, b.detach())
        for a, b in zip(recorder.params_before, trainer.model.parameters(), strict=True)
    ]
    assert any(changed), "GRPO did not update the model"


def test_rollout_func_trains_on_env_returns_with_shared_group_states(tmp_path, one_thread):
    """GroupRollout plays each group on one task; TRL trains on model tokens only."""
    example = _example("trl_rollout_func")
    seen: list[dict] = []

    def record(completions, completion_ids, env_return, task_id, initial_state_key, **kw):
        seen.append(
            {
                "completion_ids": completion_ids,
                "env_return": env_return,
                "task_id": task_id,
                "initial_state_key": initial_state_key,
                "state_keys": kw["state_keys"],
                "turn_spans": kw["turn_spans"],
                "step_rewards": kw["step_rewards"],
                "seed": kw["seed"],
            }
        )
        return [0.0] * len(completions)

    recorder = _Recorder()
    steps = 2
    trainer, rollout = example.build(
        ["--max-steps", str(steps), "--num-tasks", "8", *SMALL, "--output-dir", str(tmp_path)],
        reward_funcs=[record],
        callbacks=[recorder],
    )
    recorder.trainer = trainer
    outputs = []

    def keep(prompts, trainer):  # the rollout's raw output (tokens, env_mask, logprobs)
        out = rollout(prompts, trainer)
        outputs.append(out)
        # The sequence TRL trains on (prompt + completion) is the one the model generated
        # from: the model's own log-probs of its tokens there equal the sampling log-probs.
        with torch.no_grad():
            for p, c, m, lp in zip(
                out["prompt_ids"],
                out["completion_ids"],
                out["env_mask"],
                out["logprobs"],
                strict=True,
            ):
                logits = trainer.model(torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
                own = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c)[:, None])
                at = torch.tensor(m, dtype=torch.bool)
                assert torch.allclose(own[at, 0], torch.tensor(lp)[at], atol=1e-4)
        return out

    trainer.rollout_func = keep
    try:
        trainer.train()
    finally:
        rollout.close()
    tokenizer = trainer.processing_class

    assert len(seen) == steps == len(recorder.batches) == len(outputs)
    all_returns = []
    for batch, rec, out in zip(seen, recorder.batches, outputs, strict=True):
        n = len(batch["env_return"])
        # the reward TRL logged and trained on is the env return of each completion
        assert rec["rewards"]["env_return_reward"] == pytest.approx(batch["env_return"])
        for i in range(n):
            ids, mask, logps = out["completion_ids"][i], out["env_mask"][i], out["logprobs"][i]
            assert len(ids) == len(mask) == len(logps) <= trainer.max_completion_length
            spans = batch["turn_spans"][i]
            model_positions = sorted(p for s, e in spans for p in range(s, e))
            assert model_positions == [p for p, m in enumerate(mask) if m == 1]
            assert all(logps[p] <= 0.0 and np.isfinite(logps[p]) for p in model_positions)
            assert all(logps[p] == 0.0 for p, m in enumerate(mask) if m == 0)
            # replaying the model's turns (decoded as the rollout decoded them) in a fresh env
            actions = [tokenizer.decode(ids[s:e], skip_special_tokens=True) for s, e in spans]
            actions = actions[: len(batch["step_rewards"][i])]
            replayed, initial = _replay(
                rollout.env_id, rollout.env_kwargs, None, batch["task_id"][i], actions
            )
            assert replayed == pytest.approx(batch["env_return"][i])
            assert initial == batch["initial_state_key"][i] == batch["state_keys"][i][0]
            assert len(batch["state_keys"][i]) == len(batch["step_rewards"][i])
        for g in range(0, n, GROUP):
            assert len(set(batch["task_id"][g : g + GROUP])) == 1
            assert len(set(batch["initial_state_key"][g : g + GROUP])) == 1
            assert len(set(batch["seed"][g : g + GROUP])) == 1
        assert len(set(batch["task_id"])) == n // GROUP
        all_returns += batch["env_return"]
    assert any(r > 0 for r in all_returns) and any(r == 0 for r in all_returns)
    assert any(
        not torch.equal(a, b.detach())
        for a, b in zip(recorder.params_before, trainer.model.parameters(), strict=True)
    )


def test_rollout_func_plays_every_episode_through_the_engine(
    tmp_path, one_thread, monkeypatch, engine_runs
):
    """Through TRL's GRPOTrainer, each rollout_func call is one run of the library's engine: the
    policy generating every turn is called only from inside that run, and what TRL trains on is
    that run's records (each turn's sampled ids at its span, sampled from the sequence before)."""
    from agentgym.integrations import trl as adapter

    calls, batches = [], []

    class RecordingPolicy(adapter._TrainerPolicy):
        """The adapter's own policy (real generation), noting the engine each turn came from."""

        async def sample(self, prompt_ids, max_tokens):
            calls.append((engine_runs.current(), self, list(prompt_ids)))
            return await super().sample(prompt_ids, max_tokens)

        def _generate(self, contexts, max_new_tokens):
            batches.append((self, len(contexts)))
            return super()._generate(contexts, max_new_tokens)

    monkeypatch.setattr(adapter, "_TrainerPolicy", RecordingPolicy)
    steps = 2
    trainer, rollout = _example("trl_rollout_func").build(
        ["--max-steps", str(steps), "--num-tasks", "4", *SMALL, "--output-dir", str(tmp_path)]
    )
    outputs = []

    def keep(prompts, trainer):
        outputs.append(rollout(prompts, trainer))
        return outputs[-1]

    trainer.rollout_func = keep
    try:
        trainer.train()
    finally:
        rollout.close()

    assert len(engine_runs.runs) == len(outputs) == steps
    assert calls and all(engine is not None for engine, _, _ in calls)  # no turn outside a run
    for step, ((engine, records), out) in enumerate(zip(engine_runs.runs, outputs, strict=True)):
        assert isinstance(engine.policy, RecordingPolicy) and engine.lockstep
        turns = [t for r in records for t in r.turns]
        mine = [(policy, ids) for e, policy, ids in calls if e is engine]
        assert len(mine) == len(turns) == engine.stats.turns > 0
        assert all(policy is engine.policy for policy, _ in mine)
        assert sorted(ids for _, ids in mine) == sorted(t.prompt_ids for t in turns)
        assert {t.policy_version for t in turns} == {step}  # the trainer's global step
        # lockstep: each round's turns of all running episodes are one generate call
        sizes = [n for policy, n in batches if policy is engine.policy]
        assert len(sizes) == max(len(r.turns) for r in records) and sum(sizes) == len(turns)
        assert sizes[0] == len(records)
        assert len(records) == len(out["completion_ids"])
        for i, record in enumerate(records):
            prompt, completion = out["prompt_ids"][i], out["completion_ids"][i]
            spans = out["turn_spans"][i]
            assert len(spans) == len(record.turns)
            for turn, (start, end) in zip(record.turns, spans, strict=True):
                assert completion[start:end] == turn.token_ids
                assert out["logprobs"][i][start:end] == turn.logprobs
                assert turn.prompt_ids == prompt + completion[:start]
            assert out["step_rewards"][i] == [t.reward for t in record.turns]
            assert out["env_return"][i] == pytest.approx(record.total_reward)
            assert (out["task_id"][i], out["won"][i]) == (record.task_id, record.won)
    assert rollout.records is engine_runs.runs[-1][1]


def test_rollout_func_groups_runs_of_one_task_and_refuses_prompts_without_one():
    GroupRollout(ENV, fmt="plain")  # builds no env until called
    with pytest.raises(ValueError, match="build_dataset"):
        _group_tasks([[{"role": "user", "content": "hi"}]] * 4, 4)
    with pytest.raises(ValueError, match="build_dataset"):
        _group_tasks(["a plain text prompt"] * 4, 4)
    row = [{"role": "user", "content": "x", "task_id": "corridor-train-1", "seed": 1}]
    other = [{"role": "user", "content": "x", "task_id": "corridor-train-2", "seed": 2}]
    one = {"task_id": "corridor-train-1", "seed": 1, "split": None}
    two = {"task_id": "corridor-train-2", "seed": 2, "split": None}
    with pytest.raises(ValueError, match="num_generations=4"):
        _group_tasks([row, row, other, other], 4)
    assert _group_tasks([row] * 4 + [other] * 4, 4) == ([one, two], 4)
    # a process holding part of a prompt's repeats (12 rollouts per process, 8 per prompt)
    assert _group_tasks([row] * 8 + [other] * 4, 8) == ([one, one, two], 4)
    with pytest.raises(ValueError, match="format"):
        GroupRollout(ENV, fmt="no-such-format")


@pytest.mark.slow
def test_rollout_func_tiny_model_learns_the_corridor(tmp_path, one_thread):
    """The rollout example's defaults: 120 GRPO steps take the return from chance to winning."""
    trainer, rollout = _example("trl_rollout_func").build(["--output-dir", str(tmp_path)])
    try:
        trainer.train()
    finally:
        rollout.close()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    first, last = np.mean(rewards[:30]), np.mean(rewards[-30:])
    assert first < 5.0 < 9.0 < last, (first, last)  # 10 is a win; chance wins a quarter


MIXED = ["AgentGym/Corridor-v0", "AgentGym/Sokoban-v0"]


def test_mixed_dataset_routes_each_row_to_its_env():
    """Several envs: rows name their env (TRL's ``environment`` column), shares follow the
    weights, and the dict factory's env for a row replays exactly that row's task."""
    kwargs = {"AgentGym/Corridor-v0": {"length": 2}}
    data = build_dataset(MIXED, 6, seed=3, env_kwargs=kwargs, weights=[2, 1])
    envs = data["environment"]
    assert envs.count(MIXED[0]) == 4 and envs.count(MIXED[1]) == 2
    assert envs[:4] == [MIXED[0], MIXED[1], MIXED[0], MIXED[1]]  # alternating
    factories = environment_factory(MIXED, kwargs)
    assert isinstance(factories, dict) and set(factories) == set(MIXED)
    assert factories[MIXED[0]].env_kwargs == {"length": 2}
    for row in data:
        assert row["prompt"][0]["environment"] == row["environment"]
        env = factories[row["environment"]]()
        first = env.reset(**row)  # TRL passes the whole row, env column included
        assert env.info["task_id"] == row["task_id"]
        fresh = gym.make(row["environment"], **kwargs.get(row["environment"], {}))
        obs, info = fresh.reset(seed=row["seed"], options={"task": row["task_id"]})
        assert first.startswith(obs) and env.initial_state_key == info["state_key"]
    with pytest.raises(ValueError, match="not among"):
        build_dataset(MIXED, 4, env_kwargs={"AgentGym/WebShop-v0": {}})
    with pytest.raises(ValueError, match="at least 2 tasks"):
        build_dataset(MIXED, 1)
    # a single env keeps its plain dataset: no environment column (TRL's single-factory form)
    assert "environment" not in build_dataset(MIXED[0], 2).column_names


def test_grpo_trainer_accepts_the_mixed_dataset_and_dict_factory(tmp_path, one_thread):
    """TRL's own GRPOTrainer takes the dict form: one tool set per env, rows routed by column."""
    from trl import GRPOConfig, GRPOTrainer

    example = _example("trl_environment_factory")
    model, tokenizer = example.tiny_tool_model(ENV, example.TINY_ENV_KWARGS, warmup_steps=1)
    factories = environment_factory(MIXED, {ENV: example.TINY_ENV_KWARGS})
    config = GRPOConfig(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4, max_steps=1,
        max_completion_length=32, max_tool_calling_iterations=1, beta=0.0, report_to=[],
        save_strategy="no", use_cpu=True, bf16=False,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model,
        args=config,
        train_dataset=build_dataset(MIXED, 4, env_kwargs={ENV: example.TINY_ENV_KWARGS}),
        processing_class=tokenizer,
        environment_factory=factories,
    )
    assert trainer._multi_environment
    assert set(trainer.environment_factories) == set(MIXED)
    trainer.train()  # one step: every rollout played the env its row names
    played = [e for f in factories.values() for e in f.episodes]
    assert len(played) == 4  # 4 rollouts per step: 2 rows x 2 generations
    for env_id, f in factories.items():
        assert f.episodes  # both envs were played ...
        for e in f.episodes:  # ... each on its own tasks
            assert e.task_id.startswith("corridor" if env_id == ENV else "sokoban")
