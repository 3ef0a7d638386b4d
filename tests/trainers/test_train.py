"""The train script end to end: learning on the corridor, one Sokoban iteration, resume, CLI.

Every test runs the real entry point (``train(config)``) with a real tiny Qwen2 model and a
word-level tokenizer built offline; nothing is mocked.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from trainers.gigpo.config import PRESETS, Config, parse_args
from trainers.gigpo.train import STATE_FILE, train

# Metrics every training record carries (the stable vocabulary the README documents).
ROLLOUT_KEYS = {
    "iteration", "samples", "rollout/actions", "rollout/success_rate", "rollout/return", "rollout/episode_length",
    "rollout/invalid_rate", "rollout/response_tokens", "rollout/logprob_diff", "advantage/mean",
    "advantage/std", "update/loss", "update/pg_loss", "update/kl", "update/clip_fraction",
    "update/entropy", "update/grad_norm", "update/approx_kl_old", "time/generate", "time/env",
    "time/advantage", "time/update", "time/iteration",
}  # fmt: skip


def corridor(tmp_path, **overrides) -> Config:
    base = dict(out_dir=str(tmp_path / "run"), progress=False, tensorboard=False, plot=False)
    return Config.for_env("AgentGym/Corridor-v0", **{**base, **overrides})


def untimed(records):
    """Records without their wall-clock timings (the only fields two equal runs may differ in)."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def evals(history):
    return [r for r in history if "eval/success_rate" in r]


def test_learns_corridor_with_gigpo(tmp_path):
    """A random tiny model learns to follow the corridor's hints: held-out success rises by >= 0.3."""
    # 50 of the preset's 60 iterations: at seed 0 held-out success is 0 through iteration 30,
    # 0.22 at 40 and 1.0 at 50 (the preset's own run); the last 10 show nothing new. Evaluated
    # at the start and the end only.
    config = corridor(tmp_path, advantage="gigpo", seed=0, iterations=50, eval_every=50)
    history = train(config)
    ev = evals(history)
    start, final = ev[0]["eval/success_rate"], ev[-1]["eval/success_rate"]
    train_rows = [r for r in history if "rollout/success_rate" in r]
    assert len(train_rows) == config.iterations
    assert ROLLOUT_KEYS <= set(train_rows[0])
    assert (
        "eval/success_rate/corridor" in ev[-1] and "rollout/success_rate/corridor" in train_rows[-1]
    )
    # Learning, not just motion: evaluation on held-out layouts (split "test").
    assert final >= start + 0.3, [round(r["eval/success_rate"], 3) for r in ev]
    # The steps of the won episodes: logged exactly when some episode won, and a win walks
    # through every room (a detour adds a door and a "back").
    rooms = config.env_kwargs.get("length", 4)
    for row in train_rows:
        assert ("rollout/won_episode_length" in row) == (row["rollout/success_rate"] > 0), row
        if "rollout/won_episode_length" in row:
            assert rooms <= row["rollout/won_episode_length"] <= config.max_episode_steps
    # The invalid-action rate falls as the model learns the action words.
    assert train_rows[-1]["rollout/invalid_rate"] < train_rows[0]["rollout/invalid_rate"]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == json.loads(json.dumps(history))


def test_one_iteration_on_sokoban(tmp_path):
    config = Config.for_env(
        "AgentGym/Sokoban-v0",
        out_dir=str(tmp_path / "sok"),
        iterations=1,
        num_groups=2,
        group_size=2,
        max_episode_steps=3,
        max_new_tokens=4,
        eval_groups=2,
        eval_every=1,
        micro_batch_size=4,
        progress=False,
        tensorboard=False,
        plot=False,
        kl_coef=0.01,  # exercises the frozen reference copy
        entropy_coef=0.01,
    )
    assert (
        config.max_episode_steps == 3 and PRESETS["AgentGym/Sokoban-v0"]["max_episode_steps"] == 15
    )
    history = train(config)
    rec = [r for r in history if "rollout/success_rate" in r]
    assert len(rec) == 1 and ROLLOUT_KEYS <= set(rec[0])
    assert 1 <= rec[0]["rollout/episode_length"] <= 3
    assert rec[0]["rollout/response_tokens"] <= 4
    assert math.isfinite(rec[0]["update/loss"]) and rec[0]["update/kl"] >= 0
    assert len(evals(history)) == 2  # before the first iteration and after the last
    ckpt = tmp_path / "sok" / "checkpoint-1"
    assert (ckpt / STATE_FILE).exists() and (ckpt / "config.json").exists()


def test_checkpoint_resume_restores_state(tmp_path):
    """Stopping after 2 iterations and resuming gives the uninterrupted run's state at iteration 2.

    Weights, optimizer moments, RNG state, tokenizer and history come back exactly, so the
    resumed third iteration equals the uninterrupted run's third iteration.
    """
    # On CPU: bit-identical updates need deterministic kernels, which CUDA's atomic-add
    # reductions are not by default; the CUDA RNG's round trip is checked on a GPU in
    # tests/trainers/test_generation.py.
    common = dict(
        iterations=3, num_groups=2, group_size=4, eval_every=0, checkpoint_every=1, seed=3,
        env_kwargs={"length": 2}, device="cpu",
    )  # fmt: skip
    full = train(corridor(tmp_path / "a", **common))
    first = train(corridor(tmp_path / "b", **{**common, "iterations": 2}))

    assert len(full) == 3 and untimed(full[:2]) == untimed(first)  # same seed, same run
    ckpt_a = tmp_path / "a" / "run" / "checkpoint-2"
    ckpt_b = tmp_path / "b" / "run" / "checkpoint-2"
    sa = torch.load(ckpt_a / STATE_FILE, weights_only=False)
    sb = torch.load(ckpt_b / STATE_FILE, weights_only=False)
    assert sb["iteration"] == 2 and sb["config"]["seed"] == 3 and sb["history"] == first
    assert torch.equal(sa["torch_rng"], sb["torch_rng"])
    moments = [v["exp_avg"] for v in sb["optimizer"]["state"].values()]
    assert moments and any(m.abs().sum() > 0 for m in moments)
    for ka, kb in zip(
        sa["optimizer"]["state"].values(), sb["optimizer"]["state"].values(), strict=True
    ):
        assert torch.equal(ka["exp_avg"], kb["exp_avg"]) and torch.equal(
            ka["exp_avg_sq"], kb["exp_avg_sq"]
        )

    # Resuming runs only the missing iteration and keeps the earlier history.
    seen = []
    import trainers.gigpo.multienv as train_module  # where the flat rollout's collect is called

    real_collect = train_module.collect

    def spy(venv, policy, params, **kw):
        seen.append((kw.get("seed"), [p.detach().clone() for p in policy.model.parameters()]))
        return real_collect(venv, policy, params, **kw)

    train_module.collect = spy
    try:
        resumed = train(corridor(tmp_path / "b", **{**common, "resume": str(ckpt_b)}))
    finally:
        train_module.collect = real_collect
    assert len(resumed) == 3 and resumed[:2] == first and resumed[2]["iteration"] == 3
    assert untimed(resumed[2:]) == untimed(full[2:])
    assert len(seen) == 1 and seen[0][0] == 3 * 1_000_003 + 2  # the third iteration's tasks
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(ckpt_a)  # the uninterrupted run's weights
    for p_resumed, p_saved in zip(seen[0][1], saved.parameters(), strict=True):
        assert torch.equal(p_resumed, p_saved)
    assert (tmp_path / "b" / "run" / "checkpoint-3" / STATE_FILE).exists()


def test_grpo_and_lora_run(tmp_path):
    """The GRPO estimator and LoRA (peft) both train: LoRA weights move, base weights do not."""
    config = corridor(
        tmp_path, advantage="grpo", lora_rank=4, iterations=1, num_groups=2, group_size=4,
        eval_every=0, kl_coef=0.05, env_kwargs={"length": 2},
    )  # fmt: skip
    history = train(config)
    assert history[-1]["update/grad_norm"] > 0
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ckpt = tmp_path / "run" / "checkpoint-1"
    base = AutoModelForCausalLM.from_pretrained(ckpt / "base")
    tuned = PeftModel.from_pretrained(base, ckpt)
    lora_b = [p for n, p in tuned.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # B starts at zero; it moved


def test_tensorboard_mirrors_every_numeric_metric(tmp_path):
    """The TensorBoard events hold the JSONL records: one series per numeric metric, same steps."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = corridor(
        tmp_path, tensorboard=True, iterations=2, num_groups=2, group_size=2, eval_every=1,
        eval_groups=2, env_kwargs={"length": 2},
    )  # fmt: skip
    history = train(config)
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in history:
        for key, value in record.items():
            if key != "iteration" and isinstance(value, (int, float)):
                expected.setdefault(key, []).append((record["iteration"], float(value)))
    assert ROLLOUT_KEYS - {"iteration"} <= set(expected)
    assert "eval/success_rate" in expected and len(expected["eval/success_rate"]) == 3

    events = EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(expected)
    for key, series in expected.items():
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert [step for step, _ in logged] == [step for step, _ in series], key
        # TensorBoard stores float32.
        assert [v for _, v in logged] == pytest.approx([v for _, v in series], rel=1e-6), key


def test_missing_tensorboard_is_reported_once(tmp_path, monkeypatch, capsys):
    """Asking for TensorBoard without the package logs to JSONL and says why there are no events."""
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name == "torch.utils.tensorboard":
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    from trainers.gigpo.train import MetricLogger

    logger = MetricLogger(tmp_path / "run", tensorboard=True)
    logger.log({"iteration": 1, "rollout/return": 0.5})
    logger.close()
    assert "tensorboard is not installed" in capsys.readouterr().err
    assert not (tmp_path / "run" / "tb").exists()
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text()) == {
        "iteration": 1, "rollout/return": 0.5,
    }  # fmt: skip


def test_cli_parses_presets_and_overrides():
    c = parse_args(["--env", "AgentGym/Sokoban-v0", "--iterations", "2", "--advantage", "grpo"])
    assert (c.env, c.iterations, c.advantage, c.max_episode_steps) == (
        "AgentGym/Sokoban-v0",
        2,
        "grpo",
        15,
    )
    assert (c.group_size, c.num_groups, c.lr, c.history_length, c.gamma) == (8, 16, 1e-6, 2, 0.95)
    c = parse_args(["--env", "AgentGym/ALFWorld-v0", "--max-steps", "none", "--no-tensorboard",
                    "--env-kwargs", '{"synthetic": true}'])  # fmt: skip
    assert (
        c.max_episode_steps is None
        and c.tensorboard is False
        and c.env_kwargs == {"synthetic": True}
    )
    with pytest.raises(TypeError, match="unknown config fields"):
        Config.for_env("AgentGym/Corridor-v0", learning_rate=1.0)


def test_unknown_env_id_is_explained_before_any_work(tmp_path, capsys):
    from trainers.gigpo.train import main

    with pytest.raises(ValueError, match="unknown env id 'AgentGym/Nope-v0'.*AgentGym/Sokoban-v0"):
        train(Config.for_env("AgentGym/Nope-v0", out_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()  # nothing was loaded or written
    with pytest.raises(SystemExit) as exit_info:
        main(["--env", "AgentGym/Nope-v0", "--out-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2 and "unknown env id" in capsys.readouterr().err


def test_model_given_by_path_trains_and_resumes(tmp_path):
    """The real-model path (``--model DIR``, as with a downloaded Qwen) on CPU: the same code the
    GPU iteration runs, with a small saved Qwen2 instead of a 1.5B one."""
    from transformers import AutoModelForCausalLM

    from trainers.gigpo.tiny import build_model, build_tokenizer

    tok = build_tokenizer(["up down left right # _ O X P"])
    path = tmp_path / "saved-model"
    build_model(tok, seed=2).save_pretrained(path)
    tok.save_pretrained(path)
    common = dict(model=str(path), num_groups=2, group_size=2, max_episode_steps=2, max_new_tokens=4,
                  eval_every=0, progress=False, tensorboard=False, plot=False,
                  checkpoint_every=1)  # fmt: skip
    config = Config.for_env(
        "AgentGym/Sokoban-v0", iterations=1, out_dir=str(tmp_path / "run"), **common
    )
    first = train(config)
    assert len(first) == 1 and math.isfinite(first[0]["update/loss"])
    ckpt = tmp_path / "run" / "checkpoint-1"
    tuned = AutoModelForCausalLM.from_pretrained(ckpt)
    original = AutoModelForCausalLM.from_pretrained(path)
    moved = [
        not torch.equal(a, b)
        for a, b in zip(tuned.parameters(), original.parameters(), strict=True)
    ]
    assert any(moved)  # the update changed the saved weights, not a copy of the input
    resumed = train(
        Config.for_env(
            "AgentGym/Sokoban-v0", iterations=2, out_dir=str(tmp_path / "run"),
            resume=str(ckpt), **common,
        )
    )  # fmt: skip
    assert [r["iteration"] for r in resumed] == [1, 2] and resumed[0] == first[0]


@pytest.mark.gpu
@pytest.mark.timeout(900)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_iteration_qwen2_5_1_5b_sized_on_gpu(tmp_path):
    """One iteration with a Qwen2.5-1.5B-shaped random model (no download) on Sokoban:
    ``benchmarks/bench_gpu_iteration.py`` at the preset's size but 4 rounds instead of 15
    (the full 15 take minutes; the whole benchmark is for ``--compare`` runs by hand),
    figures written to tmp_path."""
    result = run_benchmark(
        "bench_gpu_iteration.py", "--max-episode-steps", "4", "--out", str(tmp_path / "gpu.json")
    )
    assert result["model"]["parameters"] > 1.5e9 and result["peak_gpu_memory_gib"] > 0
    assert math.isfinite(result["update_loss"]) and result["generate_tokens_per_s"] > 0
    print(json.dumps({k: v for k, v in result.items() if k != "record"}, indent=1))


def test_gpu_iteration_benchmark_runs_on_cpu_with_a_small_model(tmp_path):
    """The GPU benchmark's own code path, end to end on CPU with a 2-layer model of the real
    vocabulary size, so its first run on a GPU does not find a bug the CPU run could have."""
    result = run_benchmark(
        "bench_gpu_iteration.py", "--device", "cpu", "--layers", "2", "--hidden", "64",
        "--max-new-tokens", "3", "--num-groups", "2", "--group-size", "2", "--max-episode-steps", "2",
        "--out", str(tmp_path / "gpu.json"),
    )  # fmt: skip
    assert result["config"]["num_groups"] == 2 and result["config"]["max_new_tokens"] == 3
    assert result["model"]["parameters"] > 151936 * 64  # the real vocabulary's embedding
    assert result["peak_gpu_memory_gib"] is None and math.isfinite(result["update_loss"])
    # Rows are steps of the 4 episodes; a random model rarely samples its end token among
    # 151,936 ids, so responses run to the 3-token cap.
    assert (
        4 <= result["rows"] <= 8
        and result["rows"] == result["record"]["rollout/episode_length"] * 4
    )
    assert result["generated_tokens"] <= 3 * result["rows"]
    assert result["generate_tokens_per_s"] == pytest.approx(
        result["generated_tokens"] / result["time_s"]["generate"]
    )


def run_benchmark(script: str, *args: str) -> dict:
    """Run ``benchmarks/<script>`` as a user would; returns the JSON it wrote to ``--out``."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, str(root / "benchmarks" / script), *args], check=True, cwd=root)
    return json.loads(Path(args[args.index("--out") + 1]).read_text())


def test_hf_policy_logprobs_match_training_forward():
    """Sampling log-probs (generate, left-padded batches) equal the update's forward log-probs."""
    from agentgym.engine import SamplingParams, TransformersPolicy
    from trainers.gigpo.tiny import build_model, build_tokenizer
    from trainers.gigpo.train import response_forward

    tok = build_tokenizer(["Room 1 of 3 . Light comes through the red door . blue green back"])
    model = build_model(tok, seed=1)
    policy = TransformersPolicy(model, tok, max_batch=3, seed=None, decoder="static")
    params = SamplingParams(temperature=0.7, max_tokens=5)
    torch.manual_seed(0)
    prompts = ["Room 1 of 3.", "Light comes through the red door. Room 2 of 3.", "back", "red blue"]
    messages = [[{"role": "user", "content": p}] for p in prompts]
    gens = policy.generate(messages, params)
    assert len(gens) == 4 and all(1 <= len(g.token_ids) <= 5 for g in gens)
    for g in gens:  # a response ends at the end-of-turn token, if one was sampled
        assert tok.eos_token_id not in g.token_ids[:-1]
        assert g.text == tok.decode(g.token_ids, skip_special_tokens=True)
    with torch.no_grad():
        logp, mask, _ = response_forward(
            model, [g.prompt_ids for g in gens], [g.token_ids for g in gens], tok.pad_token_id,
            torch.device("cpu"), temperature=0.7,
        )  # fmt: skip
    for b, g in enumerate(gens):
        assert logp[b, mask[b] > 0].tolist() == pytest.approx(g.logprobs, abs=1e-4)
    assert sum(len(g.token_ids) for g in gens) > len(gens)  # multi-token responses checked
    greedy = SamplingParams(temperature=0, max_tokens=5)
    assert [g.token_ids for g in policy.generate(messages, greedy)] == [
        g.token_ids for g in policy.generate(messages, greedy)
    ]


def test_hf_policy_samples_the_trained_distribution_not_the_model_defaults():
    """A model's generation defaults (Qwen ships repetition_penalty, top_k, temperature) do not
    leak into rollouts: greedy decoding is the argmax of the raw logits at every step."""
    from agentgym.engine import SamplingParams, TransformersPolicy, chat_prompt_ids
    from trainers.gigpo.tiny import build_model, build_tokenizer

    tok = build_tokenizer(["Room 1 of 3 . Light comes through the red door . blue green back"])
    model = build_model(tok, seed=1).eval()
    model.generation_config.repetition_penalty = 100.0
    model.generation_config.top_k = 1
    model.generation_config.temperature = 0.3
    policy = TransformersPolicy(model, tok, seed=None, decoder="static")
    prompt = "Room 1 of 3."
    ids = torch.tensor([chat_prompt_ids(tok, prompt)])
    expected = []
    with torch.no_grad():
        for _ in range(8):  # greedy by hand, on raw logits
            nxt = int(model(ids).logits[0, -1].argmax())
            expected.append(nxt)
            if nxt == tok.eos_token_id:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    # The hand-rolled decode repeats a token, so a leaked repetition penalty would change it.
    assert len(set(expected)) < len(expected), expected
    greedy = SamplingParams(temperature=0, max_tokens=8)
    out = policy.generate([[{"role": "user", "content": prompt}]], greedy)
    assert out[0].token_ids == expected


def test_bf16_autocast_and_gradient_checkpointing_on_cpu(tmp_path):
    """The GPU update path (bf16 autocast, activation checkpointing) runs here on CPU.

    Checkpointing trades memory for compute and must not change the numbers: its run equals
    the plain fp32 run exactly. bf16 autocast does change them, slightly, and still trains.
    """
    # Pinned to CPU: with a GPU, device "auto" would make the "plain" run bf16 already.
    common = dict(iterations=1, num_groups=2, group_size=4, eval_every=0, seed=5, device="cpu",
                  env_kwargs={"length": 2}, save_final=False)  # fmt: skip

    plain = train(corridor(tmp_path / "fp32", gradient_checkpointing=False, **common))
    ckpt = train(corridor(tmp_path / "ckpt", gradient_checkpointing=True, **common))
    bf16 = train(
        corridor(tmp_path / "bf16", dtype="bfloat16", gradient_checkpointing=True, **common)
    )
    assert untimed(ckpt) == untimed(plain)
    rec = bf16[-1]
    assert math.isfinite(rec["update/loss"]) and rec["update/grad_norm"] > 0
    assert untimed(bf16) != untimed(plain)  # bf16 compute took effect


def test_tiny_tokenizer_round_trips_beside_a_qwen2_config(tmp_path):
    """Saved with its model, the word-level tokenizer loads back unchanged (AutoTokenizer alone
    would rebuild Qwen's BPE around it and drop every word)."""
    from agentgym.engine import chat_prompt_ids
    from trainers.gigpo.tiny import build_model, build_tokenizer, load_tokenizer

    text = "Room 1 of 3. Light comes through the red door."
    tok = build_tokenizer([text])
    build_model(tok).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    ids = chat_prompt_ids(tok, text)
    assert chat_prompt_ids(loaded, text) == ids and tok.unk_token_id not in ids
    assert loaded.decode(ids[3:5]) == "1 of"


# ----------------------------------------------------------------------------------------------
# runs kept apart, feedback, Ctrl-C
# ----------------------------------------------------------------------------------------------
SMALL = dict(iterations=2, num_groups=2, group_size=2, eval_every=1, eval_groups=2,
             checkpoint_every=1, env_kwargs={"length": 2})  # fmt: skip


def test_a_second_run_into_a_used_out_dir_is_refused(tmp_path, capsys):
    """A second run does not append to the first one's metrics, events or checkpoints."""
    from trainers.gigpo.train import main

    first = train(corridor(tmp_path, **SMALL))
    args = ["--env", "AgentGym/Corridor-v0", "--out-dir", str(tmp_path / "run"), "--no-progress"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--resume" in err and "--overwrite" in err, err
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == json.loads(json.dumps(first))  # untouched

    # --overwrite replaces the run: the new metrics only, no checkpoint from the old run.
    second = train(corridor(tmp_path, **{**SMALL, "iterations": 1, "overwrite": True}))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == json.loads(json.dumps(second))
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-1"]


def test_resume_truncates_metrics_and_tensorboard_to_the_resumed_iteration(tmp_path):
    """Resuming from checkpoint-1 of a 3-iteration run leaves one record per iteration in
    metrics.jsonl and one TensorBoard point per step, equal to the resumed history."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    common = {**SMALL, "iterations": 3, "tensorboard": True}
    full = train(corridor(tmp_path, **common))
    resumed = train(
        corridor(tmp_path, **{**common, "resume": str(tmp_path / "run" / "checkpoint-1")})
    )
    assert untimed(resumed) == untimed(full)  # the same run, continued exactly
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == json.loads(json.dumps(resumed))

    events = EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    for key in ("rollout/success_rate", "eval/success_rate", "update/loss"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        expected = [(r["iteration"], r[key]) for r in resumed if key in r]
        assert [s for s, _ in logged] == [s for s, _ in expected], key
        assert [v for _, v in logged] == pytest.approx([v for _, v in expected], rel=1e-6), key


def test_feedback_lines_progress_summary_and_curve(tmp_path, capsys):
    """Where the run goes, a line per iteration, progress bars on stderr, a final summary and
    a learning-curve PNG; --quiet keeps only the summary."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    history = train(corridor(tmp_path, **SMALL, progress=True, plot=True))
    out, err = capsys.readouterr()
    run = tmp_path / "run"
    assert str(run / "metrics.jsonl") in out and str(run / "checkpoint-") in out
    per_iteration = [x for x in out.splitlines() if x.startswith("iteration ")]
    assert len(per_iteration) == 2, out
    rows = [r for r in history if "rollout/success_rate" in r]
    for line, record in zip(per_iteration, rows, strict=True):
        assert f"success {record['rollout/success_rate']:.2f}" in line
        assert f"invalid {record['rollout/invalid_rate']:.2f}" in line
        assert "tok/s" in line and "generate" in line and "update" in line
    assert "rollout" in err and "update" in err  # the bars inside an iteration
    assert "finished 2 iterations" in out and "eval success" in out
    with Image.open(run / "curve.png") as image:
        assert image.format == "PNG" and image.size[0] > 200
    assert str(run / "curve.png") in out

    train(corridor(tmp_path / "q", **SMALL, progress=True, plot=False, quiet=True))
    out, err = capsys.readouterr()
    assert err == "" and [x for x in out.splitlines() if x.strip()][0].startswith("finished")


def test_plot_cli_draws_a_metrics_file_and_says_when_matplotlib_is_missing(
    tmp_path, monkeypatch, capsys
):
    from PIL import Image

    from trainers.gigpo import plot

    train(corridor(tmp_path, **SMALL))
    png = tmp_path / "curve.png"
    if importlib.util.find_spec("matplotlib") is not None:
        plot.main([str(tmp_path / "run" / "metrics.jsonl"), "-o", str(png)])
        with Image.open(png) as image:
            assert image.format == "PNG"
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # as if not installed
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        plot.main([str(tmp_path / "run" / "metrics.jsonl"), "-o", str(tmp_path / "no.png")])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "matplotlib" in err and "pip install" in err
    assert not (tmp_path / "no.png").exists()


def test_ctrl_c_stops_cleanly_with_a_checkpoint_that_resumes(tmp_path):
    """SIGINT to a real training process: one line, no traceback, a resumable checkpoint."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from trainers.gigpo.checkpoint import latest_complete
    from trainers.gigpo.train import main

    root = Path(__file__).resolve().parents[2]
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainers.gigpo.train", "--env", "AgentGym/Corridor-v0",
         "--env-kwargs", '{"length": 2}', "--num-groups", "2", "--group-size", "2",
         "--eval-every", "0", "--iterations", "100000", "--out-dir", str(run),
         "--no-tensorboard", "--no-plot", "--no-progress"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for line in proc.stdout:
            if line.startswith("iteration 3/"):
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "interrupted" in err and "--resume" in err
    ckpt = latest_complete(run)
    assert ckpt is not None and str(ckpt) in err
    done = int(ckpt.name.split("-")[1])
    assert done >= 3

    main(["--resume", str(run), "--iterations", str(done + 2), "--no-progress"])
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == list(range(1, done + 3))
    assert latest_complete(run) == run / f"checkpoint-{done + 2}"


def test_resuming_a_finished_run_says_it_is_finished_and_how_to_extend_it(tmp_path, capsys):
    from trainers.gigpo.train import main

    run = tmp_path / "run"
    first = train(corridor(tmp_path, **{**SMALL, "eval_every": 0}))
    before = sorted(p.name for p in run.iterdir())
    capsys.readouterr()
    history = train(corridor(tmp_path, **{**SMALL, "eval_every": 0, "resume": str(run)}))
    assert untimed(history) == untimed(first)
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1, out
    assert "is finished" in out and f"--resume {run} --iterations 4" in out, out
    assert "finished iterations" not in out  # not "finished iterations 3-2"
    assert sorted(p.name for p in run.iterdir()) == before

    main(["--resume", str(run), "--no-progress"])  # the command line says the same
    assert "is finished" in capsys.readouterr().out
    main(["--resume", str(run), "--iterations", "3", "--no-progress"])  # and extends it
    assert iterations_logged(run) == [1, 2, 3]


def iterations_logged(run) -> list[int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["iteration"] for x in lines if "rollout/success_rate" in json.loads(x)]


def test_evaluation_is_sized_to_the_run_and_timed_apart(tmp_path, capsys):
    """Unset ``eval_groups`` plays one rollout's worth of episodes (here 2 x 2), and the
    iteration's time leaves the evaluation before it out (it has its own line and metric)."""
    config = corridor(
        tmp_path, iterations=1, num_groups=2, group_size=2, eval_every=1, eval_groups=None,
        env_kwargs={"length": 2}, save_final=False,
    )  # fmt: skip
    history = train(config)
    out = capsys.readouterr().out
    assert "on 4 held-out tasks" in out
    first_eval, record = history[0], history[1]
    assert first_eval["iteration"] == 0 and "time/eval" in first_eval
    parts = sum(record[k] for k in ("time/generate", "time/env", "time/advantage", "time/update"))
    # What the iteration adds to its parts is bookkeeping, far below one evaluation.
    assert record["time/iteration"] - parts < first_eval["time/eval"], (record, first_eval)


def test_the_loop_gives_each_estimator_its_own_options():
    """The trainer passes an estimator the config fields named as its options, no others."""
    from agentgym.algorithms import advantage_estimator, compute_advantage
    from trainers.gigpo.config import Config
    from trainers.gigpo.train import estimator_options

    config = Config.for_env(
        "AgentGym/Corridor-v0", omega=0.25, contribution_gamma=2.0, norm="mean_std_norm"
    )
    gigpo = estimator_options(config, advantage_estimator("gigpo"))
    assert gigpo["omega"] == 0.25 and gigpo["norm"] == "mean_std_norm"
    assert gigpo["gamma"] == config.gamma and "contribution_gamma" not in gigpo
    grpo = estimator_options(config, advantage_estimator("grpo"))
    assert "omega" not in grpo and grpo["episode_stats_over"] == config.episode_stats_over
    assert estimator_options(config, advantage_estimator("cw_grpo"))["contribution_gamma"] == 2.0
    assert "episode_stats_over" not in estimator_options(config, advantage_estimator("rloo"))
    # Every registered estimator accepts what the loop builds for it.
    rows = {"group_ids": [0, 0], "traj_ids": [0, 1], "step_ids": [0, 0], "rewards": [1.0, 0.0],
            "invalid": [False, False], "state_keys": ["s", "s"]}  # fmt: skip
    inputs = {"branch_ids": [0, 0], "contributions": [1.0, 1.0]}
    for name in ("gigpo", "grpo", "rloo", "slate", "cw_grpo"):
        spec = advantage_estimator(name)
        own = {k: v for k, v in inputs.items() if k in spec.inputs}
        compute_advantage(name, **rows, **own, **estimator_options(config, spec))


def test_lora_layers_adapt_only_the_top_layers(tmp_path):
    """``lora_layers=1`` puts adapters on every linear module of the last decoder layer only, so
    the backward pass stops there: the lower layers get no gradient at all."""
    from trainers.gigpo.train import load_model_and_tokenizer

    config = corridor(tmp_path, lora_rank=2, lora_layers=1, tiny_layers=3)
    model, tokenizer = load_model_and_tokenizer(config, None)
    adapted = {
        n.split(".layers.")[1].split(".")[0] for n, _ in model.named_parameters() if "lora_A" in n
    }
    assert adapted == {"2"}
    # every linear module of that layer: q, k, v, o, gate, up, down
    assert sum("lora_A" in n for n, _ in model.named_parameters()) == 7
    ids = torch.tensor([tokenizer.encode("red door")])
    model(input_ids=ids).logits.sum().backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads and all(".layers.2." in n for n in grads)

    too_many = corridor(tmp_path, lora_rank=2, lora_layers=4, tiny_layers=3)
    from trainers.gigpo.config import ConfigError

    with pytest.raises(ConfigError, match="--lora-layers 4: the model has 3 decoder layers"):
        load_model_and_tokenizer(too_many, None)
