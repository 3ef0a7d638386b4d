"""Train an LLM agent on an agentgym env with GiGPO (arXiv 2505.10978), or GRPO for comparison.

One script, read top to bottom (CleanRL style): ``train()`` builds the model, its learner
(optimizer, reference, batching: :func:`build_learner`) and the engine's policy
(:func:`build_policy`), then each iteration runs

``# EVALUATE``   greedy episodes on held-out tasks every ``eval_every`` iterations;
``# ROLLOUT``    ``num_groups x group_size`` episodes, every group on one task, prompts rendered
                 with the last ``history_length`` steps and generated in batches;
``# ADVANTAGE``  one row per (trajectory, step); the estimator named by ``--advantage``
                 (:mod:`agentgym.algorithms.advantage`) turns rewards, group ids and
                 ``state_key`` anchors into per-row advantages;
``# UPDATE``     PPO-clip (token-mean), optional k3 KL to the frozen initial policy and entropy
                 bonus, mini-batches with gradient accumulation over micro-batches;
``# LOG``        a stable metric vocabulary to ``metrics.jsonl`` (and TensorBoard when installed);
``# CHECKPOINT`` every ``checkpoint_every`` iterations and at the end.

The forward/log-prob math is in ``logprobs.py``, console lines, progress bars and Ctrl-C in
``console.py``, checkpoint files in ``checkpoint.py``.

Usage::

    python -m trainers.gigpo.train --env AgentGym/Corridor-v0 --iterations 40
    python -m trainers.gigpo.train --env AgentGym/Sokoban-v0 --model Qwen/Qwen2.5-1.5B-Instruct \\
        --generation-backend vllm --device cuda
    python -m trainers.gigpo.train --resume runs/gigpo          # its latest complete checkpoint

Programmatic: ``train(Config.for_env("AgentGym/Corridor-v0", iterations=5))`` returns the metric
history (one dict per logged record, the same records as ``metrics.jsonl``).

Metric names (stable; "<type>" is ``info["task_type"]`` where the env reports one):
``rollout/success_rate``, ``rollout/success_rate/<type>``, ``rollout/return``,
``rollout/episode_length``, ``rollout/won_episode_length`` (steps of the won episodes, absent
when none won), ``rollout/invalid_rate``, ``rollout/response_tokens``,
``rollout/logprob_diff``, ``advantage/mean``, ``advantage/std``, ``advantage/<step-group stat>``,
``advantage/segments_per_episode`` (HiPER),
``update/loss``, ``update/pg_loss``, ``update/kl``, ``update/clip_fraction``, ``update/entropy``,
``update/grad_norm``, ``update/approx_kl_old``, ``update/first_ratio_dev`` (max |ratio - 1|
over the tokens before the iteration's first optimizer step: 0 up to float rounding),
``eval/success_rate``, ``eval/success_rate/<type>``, ``eval/return``, ``time/generate``, ``time/env``, ``time/advantage``, ``time/update``,
``time/eval``, ``time/iteration``, ``time/tokens_per_s`` (generated tokens per second of
generation), ``time/update_tokens_per_s`` (prompt + response tokens of the rows per second of
update), plus ``iteration`` and ``samples`` (trajectories so far).

The run folder (``out_dir``) holds one run: a new run refuses a folder that is not empty unless
``--overwrite``; ``--resume`` continues in place, rewriting ``metrics.jsonl`` (and purging
TensorBoard) back to the checkpoint's iteration. Checkpoints are atomic (``checkpoint.py``).
Ctrl-C stops at once during a rollout or evaluation (nothing has changed yet) and after the
update otherwise, writes a checkpoint and prints one line saying how to resume; a run stopped
before its final evaluation runs it when resumed. Resuming trusts a run folder no more than its
weights: the tokenizer and its chat template never come from it (see ``checkpoint.py``).
"""

# ruff: noqa: E402  (the command line is checked before the heavy imports below)
from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # Run as a script: check the command line before importing torch (seconds), so that a
    # mistyped flag or a missing data folder is answered at once.
    from trainers.gigpo.config import command_line, fail

    _CHECKED = command_line()
    try:  # the train extra's packages, imported below: named in one line, not a traceback
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ModuleNotFoundError as missing:
        from agentgym.extras import missing_extra

        fail(str(missing_extra("training", (missing.name or "torch").split(".")[0], "train")))

import numpy as np
import torch

from agentgym.engine import Policy, SamplingParams, ScoredActionPolicy, TransformersPolicy
from agentgym.extras import MissingExtra, missing_extra
from agentgym.io import atomic_write_text
from trainers.gigpo import checkpoint
from trainers.gigpo.advantage import Estimator, advantage_estimator, compute_advantage
from trainers.gigpo.checkpoint import STATE_FILE as STATE_FILE  # re-exported
from trainers.gigpo.checkpoint import CheckpointError, CheckpointSaveError, resolve_resume
from trainers.gigpo.config import PROG, Config, ConfigError, command_line, fail
from trainers.gigpo.config import check_env_id as check_env_id  # re-exported
from trainers.gigpo.console import (
    Console,
    CtrlC,
    RolloutProgress,
    eval_line,
    interrupted,
    iteration_line,
    peft_deprecation_silenced,
    summary_lines,
)
from trainers.gigpo.console import TrainingInterrupted as TrainingInterrupted  # re-exported
from trainers.gigpo.logprobs import (
    autocast_for,
    batched_logprobs,
    micro_groups,
    pad_right_aligned,
    row_lengths,
    rows_forward,
)
from trainers.gigpo.logprobs import response_forward as response_forward  # re-exported
from trainers.gigpo.loss import kl_k3, masked_mean, ppo_clip_loss
from trainers.gigpo.multienv import (
    MixedEnvs,
    advantages_per_env,
    collect_any,
    env_configs,
    env_metrics,
    split_groups,
)
from trainers.gigpo.packing import INFERENCE_FACTOR, auto_token_budget, supports_varlen
from trainers.gigpo.rollout import (
    RolloutBatch,
    collect_stepwise,
    collect_tree,
    make_group_env,
)
from trainers.gigpo.subgoals import (
    PLAN_WORDS,
    llm_env_for,
    micro_batch_advantages,
    plan_execute_advantages,
    segments_per_episode,
    uses_subgoals,
)


# ----------------------------------------------------------------------------------------------
# model and tokenizer
# ----------------------------------------------------------------------------------------------
def env_texts(config: Config, episodes: int = 24) -> list[str]:
    """Prompts the env produces under the trainer's wrappers, for the tiny model's vocabulary.

    Plays a few episodes of random admissible (and some invalid) actions on every split used.
    """
    if config.extra_envs:  # every env's texts, each under its own settings
        return [
            text
            for c in env_configs(config)
            for text in env_texts(dataclasses.replace(c, extra_envs=[]), episodes)
        ]
    rng = random.Random(config.seed)
    texts: list[str] = []
    splits = {config.train_split, config.eval_split}
    venv = make_group_env(
        config.env,
        num_groups=1,
        group_size=1,
        fmt=config.fmt,
        history_length=config.history_length,
        template=config.prompt_template,
        env_kwargs=_env_kwargs(config),
    )
    try:
        for ep in range(episodes):
            split = sorted(splits, key=str)[ep % len(splits)]
            obs, infos = venv.reset(seed=10_000 + ep, options=_split_options(split))
            texts.append(obs[0])
            while venv.active[0]:
                admissible = infos[0].get("admissible_actions") or ["help"]
                action = rng.choice(admissible) if rng.random() > 0.1 else "<invalid>"
                obs, _, _, _, infos = venv.step([action])
                texts.append(obs[0])
    finally:
        venv.close()
    if config.judge == "llm" and config.judge_model == "policy":
        # The policy judges rounds: its vocabulary needs the judge's prompts and answer words.
        from agentgym.algorithms.judges import CW_GRPO_TEMPLATES, DEFAULT_JUDGE_TEMPLATE

        blank = {"observation": "", "action": "", "result": ""}
        texts += [t.format(**blank) for t in (DEFAULT_JUDGE_TEMPLATE, *CW_GRPO_TEMPLATES)]
        texts.append(" yes no")
    return texts


def load_model_and_tokenizer(config: Config, resume_dir: Path | None) -> tuple[Any, Any]:
    """The policy model (fp32 weights; bf16 compute comes from autocast) and its tokenizer.

    Resuming, the weights come from ``resume_dir`` but the tokenizer never does: the tiny
    model's is rebuilt from the vocabulary saved there, any other model's is loaded from the
    base model the run's config names. A chat template saved in ``resume_dir`` that differs
    from the one used is refused (:class:`CheckpointError`) before any prompt is rendered.
    """
    from transformers import AutoModelForCausalLM

    from trainers.gigpo.tiny import CHAT_TEMPLATE, load_tiny_tokenizer

    source = resume_dir if resume_dir is not None else None
    if config.model == "tiny":
        from trainers.gigpo.tiny import build_model, build_tokenizer

        if source is not None:  # the tiny vocabulary and base weights were saved with the run
            checkpoint.check_chat_templates(source, CHAT_TEMPLATE, "the tiny model")
            tokenizer = load_tiny_tokenizer(source)
            base = AutoModelForCausalLM.from_pretrained(
                source / "base" if config.lora_rank else source
            )
            # The tiny model's vocabulary is its tokenizer's: a mismatch means the tokenizer
            # files are not the ones trained with (a fallback tokenizer would run, untrained).
            if len(tokenizer) != base.config.vocab_size:
                raise CheckpointError(
                    f"--resume {source}: its tokenizer has {len(tokenizer)} tokens but the model "
                    f"{base.config.vocab_size}; resume from a checkpoint saved whole"
                )
        else:
            # HiPER's plan tags as whole words, or the tiny model could never write them
            plan = PLAN_WORDS if uses_subgoals(config.advantage) else ()
            tokenizer = build_tokenizer(env_texts(config), whole_words=plan)
            base = build_model(
                tokenizer,
                num_layers=config.tiny_layers,
                hidden_size=config.tiny_hidden,
                seed=config.seed,
            )
    else:
        tokenizer = load_base_tokenizer(config.model, source)  # a hub name goes to AutoTokenizer
        if source is not None:
            checkpoint.check_chat_templates(source, tokenizer.chat_template, config.model)
        base = AutoModelForCausalLM.from_pretrained(
            config.model if config.lora_rank or source is None else source, dtype=torch.float32
        )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not config.lora_rank:
        return base, tokenizer
    from peft import LoraConfig, PeftModel, get_peft_model

    if source is not None:
        return PeftModel.from_pretrained(base, source, is_trainable=True), tokenizer
    layers = None
    if config.lora_layers:
        total = base.config.num_hidden_layers
        if config.lora_layers > total:
            raise ConfigError(
                f"--lora-layers {config.lora_layers}: the model has {total} decoder layers"
            )
        layers = list(range(total - config.lora_layers, total))  # the top ones
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        # peft takes a layer subset only with named modules: the linear ones of the layers
        target_modules=decoder_linear_names(base) if layers else "all-linear",
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, lora), tokenizer


def decoder_linear_names(model: Any) -> list[str]:
    """The names (last part) of the linear modules inside the decoder layers, e.g. ``q_proj``."""
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and ".layers." in name
        }
    )


def load_base_tokenizer(model: str, resume_dir: Path | None) -> Any:
    """The tokenizer of the base model ``model`` (a folder or hub name); resuming from
    ``resume_dir``, a base that cannot be loaded is a :class:`CheckpointError` saying why the
    tokenizer is not taken from the checkpoint instead."""
    from trainers.gigpo.tiny import load_tokenizer

    try:
        return load_tokenizer(model)
    except (OSError, ValueError) as err:
        if resume_dir is None:
            raise
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise CheckpointError(
            f"--resume {resume_dir}: the tokenizer is loaded from the base model {model} named in "
            f"its config (a checkpoint's own tokenizer files are not trusted), which cannot be "
            f"loaded ({type(err).__name__}: {first}); make {model} available to resume"
        ) from None


def resolve_device(config: Config) -> tuple[torch.device, torch.dtype]:
    """The device and compute dtype (bf16 autocast on GPU unless told otherwise)."""
    if config.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(config.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                "--device cuda asked for, but torch sees no CUDA device; use --device cpu"
            )
    if config.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, config.dtype)
    return device, dtype


# ----------------------------------------------------------------------------------------------
# logging and checkpoints
# ----------------------------------------------------------------------------------------------
class MetricLogger:
    """Writes one JSON object per record to ``metrics.jsonl``; mirrors scalars to TensorBoard.

    TensorBoard events go to ``<out_dir>/tb``: one scalar series per numeric metric, named as in
    the JSONL record, at step ``record["iteration"]``. Without the ``tensorboard`` package the
    logger says so once and writes the JSONL only.

    The files start from ``history`` (the records of the checkpoint resumed from; empty for a new
    run): ``metrics.jsonl`` is rewritten to hold exactly those (atomically), and a resumed run's
    TensorBoard events from iteration ``resume_iteration`` on are purged (``purge_step``) and
    the history's records from there re-logged, so that a resumed run has one record per
    iteration, not the killed run's tail twice.
    """

    def __init__(
        self,
        out_dir: Path,
        tensorboard: bool,
        history: list[dict[str, Any]] | None = None,
        resume_iteration: int | None = None,
    ):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        history = history or []
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in history))
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                print(
                    "tensorboard is not installed: logging to metrics.jsonl only "
                    "(pip install tensorboard, or pass --no-tensorboard to silence this)",
                    file=sys.stderr,
                )
            else:
                tb = out_dir / "tb"
                continuing = resume_iteration is not None and tb.is_dir()
                self.writer = SummaryWriter(
                    str(tb), purge_step=resume_iteration if continuing else None
                )
                # The purge removes the resumed iteration's own record too: log it again.
                first = resume_iteration if continuing else None
                for record in history:
                    if first is None or record["iteration"] >= first:
                        self._add_scalars(record)
                self.writer.flush()

    def _add_scalars(self, record: dict[str, Any]) -> None:
        for k, v in record.items():
            if isinstance(v, (int, float)) and k != "iteration":
                self.writer.add_scalar(k, v, record["iteration"])

    def log(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            self._add_scalars(record)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def rng_state() -> dict[str, Any]:
    """The torch (CPU and, where present, CUDA) and numpy global RNG states (what a checkpoint
    restores).

    On CUDA a resumed run draws the uninterrupted run's samples only with the CUDA generators
    restored too (sampling runs on the device). Even then it is not bit-identical on every
    GPU: some CUDA kernels (atomic-add reductions in embedding and index backward passes,
    cuBLAS split-K choices) are nondeterministic unless ``torch.use_deterministic_algorithms``
    and ``CUBLAS_WORKSPACE_CONFIG`` are set, so weights after an update can differ in the last
    bits and the difference grows from there.
    """
    state = {"torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def save_checkpoint(
    path: Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    config: Config,
    iteration: int,
    history: list[dict],
    rng: dict[str, Any] | None = None,
) -> Path:
    """Model (HF format; LoRA: the adapter, plus the tiny base), tokenizer, optimizer, RNG
    (``rng``, default: the current state), config and history, written atomically."""
    return checkpoint.save_checkpoint(
        path,
        model,
        tokenizer,
        optimizer,
        config.to_dict(),
        iteration,
        list(history),
        rng if rng is not None else rng_state(),
        save_base=bool(config.lora_rank and config.model == "tiny"),
    )


def _env_kwargs(config: Config) -> dict[str, Any]:
    kwargs = dict(config.env_kwargs)
    if config.max_episode_steps is not None:
        kwargs.setdefault("max_episode_steps", config.max_episode_steps)
    return kwargs


def make_run_envs(
    config: Config, num_groups: int, group_size: int, *, evaluation: bool, library: Any = None
) -> Any:
    """The run's group env: one ``GroupVectorEnv``, or with ``extra_envs`` a
    :class:`~trainers.gigpo.multienv.MixedEnvs` whose groups are split between the envs
    (training: by ``env_weights``; evaluation: evenly), each env with its own settings.
    ``library``: SLEA-RL's experience library, whose hints every prompt then starts with."""
    configs = env_configs(config)
    prompt_wrappers = None
    if library is not None:
        from agentgym.algorithms.slea_library import ExperiencePrompt

        prompt_wrappers = [(ExperiencePrompt, {"library": library})]

    def make(c: Config, groups: int) -> Any:
        return make_group_env(
            c.env,
            num_groups=groups,
            group_size=group_size,
            fmt=c.fmt,
            history_length=c.history_length,
            template=c.prompt_template,
            env_kwargs=_env_kwargs(c),
            backend=config.env_backend,
            num_workers=config.env_workers,
            llm_env=llm_env_for(config.advantage),
            prompt_wrappers=prompt_wrappers,
        )

    if len(configs) == 1:
        return make(config, num_groups)
    weights = [1.0] * len(configs) if evaluation else config.env_weights or [1.0] * len(configs)
    counts = split_groups(max(num_groups, len(configs)), weights)
    split = "eval_split" if evaluation else "train_split"
    return MixedEnvs(
        names=[c.env for c in configs],
        venvs=[make(c, n) for c, n in zip(configs, counts, strict=True)],
        options=[_split_options(getattr(c, split)) for c in configs],
        max_new_tokens=[c.max_new_tokens for c in configs],
        # Held-out tasks: without an eval split, seeds far from the training seeds.
        seeds=[2**31 - 1 - config.seed if c.eval_split is None else config.seed for c in configs]
        if evaluation
        else None,
    )


def make_judge(config: Config, model: Any = None, tokenizer: Any = None) -> Any:
    """The per-round judge of ``--judge``: the env family's rule judge, or an LLM judge (the
    policy model itself with ``--judge-model policy``, else the causal LM named there)."""
    from agentgym.algorithms.judges import LLMJudge, llm_judge_templates, rule_judge
    from agentgym.envs import entry

    family = entry(config.env).family
    if config.judge == "rule":
        try:
            return rule_judge(family)
        except ValueError as exc:
            raise ConfigError(f"--judge rule: {exc}") from None
    if config.judge_model != "policy":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = next(model.parameters()).device if model is not None else "cpu"
        tokenizer = AutoTokenizer.from_pretrained(config.judge_model)
        model = AutoModelForCausalLM.from_pretrained(config.judge_model).to(device).eval()
    # The family says how its rounds are judged (search rounds: CW-GRPO's two verdicts).
    return LLMJudge(model, tokenizer, template=llm_judge_templates(family))


def _contributions(batch: RolloutBatch, judge: Any) -> np.ndarray:
    """CW-GRPO's judge scores of every row, in row order."""
    scores = judge(batch.trajectories)
    if batch.row_start is not None:  # tree rows: own steps only
        scores = [s[start:] for s, start in zip(scores, batch.row_start.tolist(), strict=True)]
    return np.concatenate(scores) if scores else np.zeros(0)


def _segment_starts(batch: RolloutBatch, judge: Any) -> np.ndarray:
    """HiPER's planner turns, in row order: ``info["subgoal_start"]`` of each step (set by
    ``agentgym.algorithms.hiper.SubgoalActions``); without it only first turns start one."""
    starts = [
        [bool(s.info.get("subgoal_start", t == 0)) for t, s in enumerate(traj.steps)]
        for traj in batch.trajectories
    ]
    if batch.row_start is not None:  # tree rows: own steps only
        starts = [s[start:] for s, start in zip(starts, batch.row_start.tolist(), strict=True)]
    return np.concatenate(starts).astype(bool) if starts else np.zeros(0, dtype=bool)


def row_texts(batch: RolloutBatch) -> list[str]:
    """Each row's observation and action, in row order: what SPA's and OPRL's learned models
    read (:class:`agentgym.algorithms.learned_credit.LearnedCredit`)."""
    steps = [tr.steps for tr in batch.trajectories]
    if batch.row_start is not None:  # tree rows: own steps only
        steps = [s[start:] for s, start in zip(steps, batch.row_start.tolist(), strict=True)]
    return [f"{step.observation}\n{step.action}" for s in steps for step in s]


# How the rollout provides each per-row input an estimator may declare beyond the common rows
# (state_keys are passed to every estimator, which reports step-group stats from them). The
# second argument is the judge, or for process_rewards the run's LearnedCredit.
ESTIMATOR_INPUTS: dict[str, Callable[[RolloutBatch, Any], Any]] = {
    "branch_ids": lambda batch, judge: batch.branch_ids,
    "contributions": _contributions,
    "segment_starts": _segment_starts,
    "process_rewards": lambda batch, credit: credit.process_rewards(row_texts(batch)),
}


def estimator_inputs(estimator: Estimator, batch: RolloutBatch, judge: Any) -> dict[str, Any]:
    """The per-row inputs ``estimator`` declares, built from ``batch`` (and the ``judge``)."""
    return {
        name: ESTIMATOR_INPUTS[name](batch, judge)
        for name in estimator.inputs
        if name != "state_keys"
    }


def estimator_options(config: Config, estimator: Estimator) -> dict[str, Any]:
    """The options ``estimator`` takes, from the config fields of the same name (the others
    keep the estimator's defaults)."""
    return {k: getattr(config, k) for k in estimator.option_names() if hasattr(config, k)}


def _split_options(split: str | None) -> dict[str, Any] | None:
    return {"split": split} if split else None


def episode_metrics(prefix: str, batch: RolloutBatch) -> dict[str, float]:
    """Success rate (overall and per ``task_type``), return and length of a batch's episodes."""
    trajs = batch.trajectories
    won = np.array([t.won for t in trajs], dtype=float)
    out = {
        f"{prefix}/success_rate": float(won.mean()),
        f"{prefix}/return": float(np.mean([t.total_return for t in trajs])),
        f"{prefix}/episode_length": float(np.mean([len(t.steps) for t in trajs])),
    }
    if won.any():  # how directly the wins win (absent when none did)
        lengths = [len(t.steps) for t, w in zip(trajs, won, strict=True) if w]
        out[f"{prefix}/won_episode_length"] = float(np.mean(lengths))
    by_type: dict[str, list[float]] = defaultdict(list)
    for t, w in zip(trajs, won, strict=True):
        task_type = t.steps[-1].info.get("task_type") if t.steps else None
        if task_type:
            by_type[str(task_type)].append(w)
    for task_type, values in sorted(by_type.items()):
        out[f"{prefix}/success_rate/{task_type}"] = float(np.mean(values))
    return out


def evaluate(
    config: Config,
    eval_venv: Any,
    policy: Any,
    params: SamplingParams,
    phase: Any,
    iteration: int,
    samples: int,
) -> dict[str, Any]:
    """Greedy (by default) episodes on the same held-out tasks every time (a fixed seed);
    the record logged as ``eval/...`` at ``iteration``."""
    t0 = time.perf_counter()
    # Without a held-out split, seeds far from the training seeds give other tasks.
    seed = 2**31 - 1 - config.seed if config.eval_split is None else config.seed
    batch = collect_any(
        eval_venv,
        RolloutProgress(policy, phase, eval_venv.num_envs, "eval"),
        params,
        seed=seed,
        options=_split_options(config.eval_split),
    )
    record = {"iteration": iteration, "samples": samples}
    record.update(episode_metrics("eval", batch))
    if isinstance(eval_venv, MixedEnvs):  # and per env
        record.update(env_metrics("eval", batch, eval_venv.names, episode_metrics))
    record["time/eval"] = time.perf_counter() - t0
    return record


def evaluated_at(history: list[dict[str, Any]], iteration: int) -> bool:
    """Whether ``history`` holds an evaluation at ``iteration`` (a checkpoint written after the
    final evaluation already holds it)."""
    return any(r["iteration"] == iteration and "eval/success_rate" in r for r in history)


def build_policy(
    config: Config,
    model: Any,
    tokenizer: Any,
    autocast: Callable[[], Any],
    device: torch.device,
    compute_dtype: torch.dtype,
) -> Policy:
    """The engine's policy the rollouts sample from: the scored-action policy over the trained
    model, vLLM (its weights synced after every update), or the trained model itself."""
    if config.generation_backend not in ("hf", "vllm"):
        raise ValueError(
            f"generation_backend must be 'hf' or 'vllm', got {config.generation_backend!r}"
        )
    if config.generation_backend == "vllm" and config.policy != "scored":
        from agentgym.engine.policies.vllm import VLLMPolicy

        if config.model == "tiny":
            raise ValueError("the vLLM backend needs a real model path (--model ...), not 'tiny'")
        policy: Policy = VLLMPolicy(
            config.model,
            tokenizer,
            max_prompt_tokens=config.max_prompt_tokens,
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            seed=config.seed,
        )
        policy.sync_weights(model)
        return policy
    local = TransformersPolicy(
        model,
        tokenizer,
        max_batch=config.generation_batch_size,
        max_prompt_tokens=config.max_prompt_tokens,
        seed=None,  # torch's generator is the trainer's (seeded, checkpointed)
        autocast=autocast,
        decoder="static" if config.hf_generation == "static" else "generate",
        compile=config.compile_decode,
        # On GPU the decoder reads a bf16 copy of the weights (synced after each update).
        generation_dtype=compute_dtype
        if device.type == "cuda" and compute_dtype != torch.float32
        else None,
    )
    if config.policy == "scored":  # choose among admissible actions (trainers/gigpo/scored.py)
        return ScoredActionPolicy(
            local,
            seed=None,
            token_temperature=config.temperature if config.temperature > 0 else 1.0,
        )
    return local


def sampling_params(config: Config) -> tuple[SamplingParams, SamplingParams]:
    """How rollouts and evaluations sample (for the scored policy the temperature is the softmax
    temperature over actions)."""
    temperature = config.action_temperature if config.policy == "scored" else config.temperature
    rollout = SamplingParams(temperature, config.top_p, config.max_new_tokens)
    return rollout, dataclasses.replace(rollout, temperature=config.eval_temperature)


@dataclass
class Learner:
    """What an update needs: the trained model, its optimizer, the KL reference and the batching."""

    model: Any
    optimizer: torch.optim.Optimizer
    trainable: list[torch.nn.Parameter]
    reference: Any
    """a frozen copy of the initial policy (None: no KL, or LoRA's base with the adapter off)"""
    pad_id: int
    device: torch.device
    autocast: Callable[[], Any]
    train_budget: int | None
    """tokens per training micro-batch (None: ``micro_batch_size`` rows)"""
    infer_budget: int | None
    packed: bool


def build_learner(
    config: Config, model: Any, tokenizer: Any, device: torch.device, compute_dtype: torch.dtype
) -> Learner:
    """Put ``model`` on ``device`` in training mode (activation checkpointing on GPU unless told
    otherwise) and build its optimizer, KL reference and update batching."""
    model.to(device)
    checkpointing = config.gradient_checkpointing
    if checkpointing or (checkpointing is None and device.type == "cuda"):
        # transformers 5 renamed it; >= 4.45 (our floor) only has the old name.
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)()
        model.config.use_cache = False  # generate() turns the cache back on for itself
    model.train()
    pad_id = tokenizer.pad_token_id

    autocast = autocast_for(device, compute_dtype)

    # The KL reference is the initial policy: a frozen copy, or the LoRA base (adapter off).
    reference = None
    if config.kl_coef > 0 and not config.lora_rank:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    # Update batching: token budgets sized from the model (and the card) unless given.
    batching = config.update_batching
    if batching == "auto":
        batching = "packed" if supports_varlen(model) else "tokens"
    packed = batching == "packed"
    card = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    if batching == "rows":
        train_budget = infer_budget = None
    elif config.micro_batch_tokens is not None:
        train_budget = config.micro_batch_tokens
        infer_budget = INFERENCE_FACTOR * config.micro_batch_tokens
    else:
        train_budget = auto_token_budget(model.config, device_memory=card)
        infer_budget = auto_token_budget(model.config, inference=True, device_memory=card)

    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    return Learner(
        model, optimizer, trainable, reference, pad_id, device, autocast, train_budget,
        infer_budget, packed,
    )  # fmt: skip


def collect_rollout(
    config: Config, venv: Any, policy: Any, params: SamplingParams, judge: Any, it: int
) -> RolloutBatch:
    """Iteration ``it``'s rollout: stepwise, tree or flat (one env or several), on the training
    split with the iteration's seed."""
    seed = config.seed * 1_000_003 + it
    options = _split_options(config.train_split)
    if config.rollout == "stepwise":
        return collect_stepwise(
            venv, policy, params, judge, selection_temperature=config.selection_temperature,
            seed=seed, options=options,
        )  # fmt: skip
    if config.rollout == "tree":
        return collect_tree(
            venv, policy, params, branch_points=config.branch_points,
            continuations=config.continuations, branch_span=config.branch_span, seed=seed,
            options=options,
        )  # fmt: skip
    return collect_any(venv, policy, params, seed=seed, options=options)


def compute_advantages(
    config: Config,
    batch: RolloutBatch,
    estimator: Estimator,
    options: dict[str, Any],
    judge: Any,
    tokenizer: Any = None,
) -> tuple[torch.Tensor | list[torch.Tensor], dict[str, float]]:
    """(N,) per-row advantages of the estimator named by ``--advantage`` (each env's rows alone
    in a run over several envs), and their ``advantage/...`` metrics.

    With ``tokenizer``, an estimator that reads ``segment_starts`` (HiPER) gives per-token
    advantages instead, one (len(response),) tensor per row: the planner advantage on planner
    turns' plan tokens, the executor one elsewhere (``trainers.gigpo.subgoals``); the metrics
    stay those of the row advantages."""

    def advantage_of(batch: RolloutBatch) -> Any:
        return compute_advantage(
            config.advantage,
            group_ids=batch.group_ids,
            traj_ids=batch.traj_ids,
            step_ids=batch.step_ids,
            rewards=batch.rewards,
            state_keys=batch.state_keys,
            invalid=batch.invalid,
            **estimator_inputs(estimator, batch, judge),
            **options,
        )

    if batch.env_ids is None:
        adv = advantage_of(batch)
        values, adv_stats = adv.advantages, adv.stats
    else:  # several envs: each env's rows alone (trainers/gigpo/multienv.py)
        values, adv_stats = advantages_per_env(batch, advantage_of)
    advantages = torch.as_tensor(np.asarray(values, dtype=np.float32))
    record = {
        "advantage/mean": float(advantages.mean()),
        "advantage/std": float(advantages.std()) if len(advantages) > 1 else 0.0,
    }
    for k, v in (adv_stats or {}).items():
        if isinstance(v, (int, float, np.floating, np.integer)):
            record[f"advantage/{k}"] = float(v)
    if tokenizer is not None and uses_subgoals(config.advantage):
        record["advantage/segments_per_episode"] = segments_per_episode(batch)
        starts = _segment_starts(batch, judge)
        return plan_execute_advantages(batch, advantage_of, starts, tokenizer), record
    return advantages, record


def update_policy(
    config: Config,
    learner: Learner,
    batch: RolloutBatch,
    advantages: torch.Tensor | list[torch.Tensor],
    it: int,
    console: Any,
) -> dict[str, float]:
    """PPO-clip over ``batch`` (token-mean), ``ppo_epochs`` x mini-batches with gradient
    accumulation over micro-batches, optional k3 KL to the reference and entropy bonus.

    ``advantages``: (N,) per row, or per token (a (len(response),) tensor per row). Returns
    the ``update/...`` metrics and ``rollout/logprob_diff`` (sampler vs trainer log-probs per
    token).
    """
    model, optimizer, reference = learner.model, learner.optimizer, learner.reference
    pad_id, device, autocast = learner.pad_id, learner.device, learner.autocast
    infer_budget, train_budget, packed = learner.infer_budget, learner.train_budget, learner.packed
    trainable = learner.trainable
    n = len(batch)
    all_rows = np.arange(n)
    # "Old" log-probs from the training forward (not the sampler's) so that the first
    # ratio is exactly 1, whatever numerical path generation took. With one optimizer
    # step per iteration the policy is still the old one when the loss is computed, so
    # the loss's own forward (detached) serves and a forward pass is saved.
    temp = config.temperature if config.temperature > 0 else 1.0
    single_step = config.ppo_epochs == 1 and config.mini_batch_size >= n
    old: list[torch.Tensor] | None = None
    if not single_step:
        old = batched_logprobs(
            model, batch, all_rows, config.micro_batch_size, pad_id, device, autocast,
            temp, infer_budget, packed,
        )  # fmt: skip
    diffs: list[float] = []
    first_ratio_dev = 0.0  # max |ratio - 1| over the tokens before the first step
    ref: list[torch.Tensor] | None = None
    if config.kl_coef > 0:
        if reference is not None:
            ref = batched_logprobs(
                reference, batch, all_rows, config.micro_batch_size, pad_id, device,
                autocast, temp, infer_budget, packed,
            )  # fmt: skip
        else:  # LoRA: the base model is the adapter switched off
            with model.disable_adapter():
                ref = batched_logprobs(
                    model, batch, all_rows, config.micro_batch_size, pad_id, device,
                    autocast, temp, infer_budget, packed,
                )  # fmt: skip
    sums: dict[str, float] = defaultdict(float)
    steps = 0
    gen = np.random.default_rng(config.seed * 7919 + it)
    console.update_started(
        config.ppo_epochs * math.ceil(n / config.mini_batch_size), f"update {it + 1}"
    )
    for epoch in range(config.ppo_epochs):
        perm = gen.permutation(n)
        for mb_start in range(0, n, config.mini_batch_size):
            mini = perm[mb_start : mb_start + config.mini_batch_size]
            num_tokens = float(sum(len(batch.response_ids[i]) for i in mini))
            optimizer.zero_grad(set_to_none=True)
            for idx in micro_groups(batch, mini, train_budget, config.micro_batch_size):
                with autocast():
                    logp, mask, entropy = rows_forward(
                        model,
                        [batch.prompt_ids[i] for i in idx],
                        [batch.response_ids[i] for i in idx],
                        pad_id,
                        device,
                        with_entropy="grad" if config.entropy_coef > 0 else True,
                        temperature=temp,
                        packed=packed,
                    )
                width = logp.shape[1]
                if old is None:
                    old_lp = logp.detach()
                else:
                    old_lp = pad_right_aligned([old[i] for i in idx], width, device)
                if epoch == 0:  # sampler vs trainer log-probs, per token
                    sampled = pad_right_aligned(
                        [torch.tensor(batch.sample_logprobs[i]) for i in idx], width, device
                    )
                    diffs.append(float(masked_mean((old_lp - sampled).abs(), mask)))
                if steps == 0:  # no optimizer step yet: every ratio must be 1
                    dev = ((logp.detach() - old_lp).exp() - 1).abs() * mask
                    first_ratio_dev = max(first_ratio_dev, float(dev.max()))
                adv_tok = micro_batch_advantages(advantages, idx, width, device)
                pg = ppo_clip_loss(logp, old_lp, adv_tok, mask, config.clip_ratio, denom=num_tokens)
                loss = pg.loss
                share = mask.sum().item() / num_tokens  # this micro-batch's share of tokens
                ent = masked_mean(entropy, mask, num_tokens)
                if config.entropy_coef > 0:
                    loss = loss - config.entropy_coef * ent
                if ref is not None:
                    kl = masked_mean(
                        kl_k3(logp, pad_right_aligned([ref[i] for i in idx], width, device)),
                        mask,
                        num_tokens,
                    )
                    loss = loss + config.kl_coef * kl
                    sums["update/kl"] += kl.item()
                loss.backward()
                sums["update/loss"] += loss.item()
                sums["update/pg_loss"] += pg.loss.item()
                sums["update/entropy"] += ent.item()
                sums["update/clip_fraction"] += pg.clip_fraction.item() * share
                sums["update/approx_kl_old"] += pg.approx_kl_old.item() * share
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
            if math.isfinite(float(grad_norm)):
                optimizer.step()
            sums["update/grad_norm"] += float(grad_norm)
            steps += 1
            console.optimizer_step()
    record = {
        "rollout/logprob_diff": float(np.mean(diffs)) if diffs else 0.0,
        "update/first_ratio_dev": first_ratio_dev,
    }
    for k, v in sums.items():
        record[k] = v / max(steps, 1)
    if ref is None:
        record["update/kl"] = 0.0
    return record


def run_folder_line(config: Config, out_dir: Path) -> str:
    """The line saying where a run writes (metrics, TensorBoard, checkpoints, curve)."""
    n = config.checkpoint_every
    every = f"every {n} iterations and " if n > 1 else "every iteration and " if n else ""
    saved = f"{every}at the end" if config.save_final else every.removesuffix(" and ")
    return (
        f"run folder {out_dir}: metrics {out_dir / 'metrics.jsonl'}"
        + (f", TensorBoard {out_dir / 'tb'}" if config.tensorboard else "")
        + (f", checkpoints {out_dir}/checkpoint-N {saved}" if saved else "")
        + (f", curve {out_dir / 'curve.png'}" if config.plot else "")
    )


def load_for_run(config: Config, resume_dir: Path | None) -> tuple[Any, Any]:
    """:func:`load_model_and_tokenizer`, a checkpoint that cannot be loaded reported as a
    :class:`CheckpointError` (one line)."""
    # transformers' per-load bar is noise for the tiny model; a real model's load keeps it.
    with (
        checkpoint.quiet_transformers() if config.quiet or config.model == "tiny" else nullcontext()
    ):
        try:
            return load_model_and_tokenizer(config, resume_dir)
        except pickle.UnpicklingError as err:  # weights that torch's weights_only load refuses
            if resume_dir is None:
                raise
            raise checkpoint.unsafe_pickle_error(resume_dir, "its model weights", err) from None
        except (OSError, ValueError, RuntimeError) as err:
            if resume_dir is None or isinstance(err, CheckpointError):
                raise
            # A checkpoint saved before checksums existed can still hold damaged weights.
            first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
            raise CheckpointError(
                f"--resume {resume_dir}: its model or tokenizer cannot be loaded "
                f"({type(err).__name__}: {first}); resume from an earlier checkpoint"
            ) from None


def restore_state(
    state: dict[str, Any], optimizer: torch.optim.Optimizer
) -> tuple[int, list[dict[str, Any]]]:
    """Load a checkpoint's optimizer and RNG states; returns (iterations done, history)."""
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    if state.get("cuda_rng") is not None and torch.cuda.is_available():
        # Saved from as many devices as that run saw; restore those that exist here.
        for index, cuda_state in enumerate(state["cuda_rng"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)
    return state["iteration"], list(state["history"])


def print_summary(
    config: Config,
    history: list[dict[str, Any]],
    start: int,
    seconds: float,
    out_dir: Path,
    last_saved: int | None,
) -> None:
    """The run's closing lines: what changed, and where the checkpoint, metrics and curve are."""
    lines = summary_lines(history, start, seconds)
    if start >= config.iterations:  # resumed only for the final evaluation (said by its line)
        lines = [f"finished the run: its final evaluation at iteration {start} in {seconds:.1f}s"]
    where = [f"metrics {out_dir / 'metrics.jsonl'}"]
    if last_saved is not None:
        where.insert(0, f"checkpoint {out_dir / f'checkpoint-{last_saved}'}")
    if config.plot:
        from trainers.gigpo.plot import plot_history

        try:
            where.append(f"curve {plot_history(history, out_dir / 'curve.png')}")
        except ImportError as err:
            print(str(err), file=sys.stderr)
    for line in [*lines, ", ".join(where)]:
        print(line, flush=True)


# ----------------------------------------------------------------------------------------------
# the training loop
# ----------------------------------------------------------------------------------------------
# train() is longer than the other functions on purpose: the loop reads top to bottom in one
# place (CleanRL's shape), each phase is a function of its own, and what stays here is the loop
# with the Ctrl-C bookkeeping (``consistent``, ``must_finish``) that every phase updates in turn.
def train(config: Config) -> list[dict[str, Any]]:
    """Run the configured training; returns the metric history (also in ``metrics.jsonl``).

    Raises :class:`~trainers.gigpo.config.ConfigError` (or ``CheckpointError``) before loading
    anything if the config cannot run, and :class:`TrainingInterrupted` after Ctrl-C, once the
    resumable checkpoint is written.
    """
    t_start = time.perf_counter()
    check_env_id(config.env)  # before minutes of model loading, not after
    config.validate()
    skipped: list[str] = []  # damaged checkpoints of a run folder, passed over
    resume_dir = resolve_resume(config.resume, skipped) if config.resume else None
    out_dir = config.run_dir()
    resuming_in_place = resume_dir is not None and resume_dir.parent.resolve() == out_dir.resolve()
    state = checkpoint.load_state(resume_dir) if resume_dir else None
    loud = not config.quiet
    for line in skipped:
        print(line, file=sys.stderr)
    final_eval_only = False  # a finished run whose final evaluation a Ctrl-C cut off
    if state is not None and state["iteration"] >= config.iterations:
        done = state["iteration"]
        final_eval_only = config.eval_tasks() > 0 and not evaluated_at(state["history"], done)
    if state is not None and state["iteration"] >= config.iterations and not final_eval_only:
        # Nothing to train: say so (and how to go on) instead of "finished iterations 61-60".
        done = state["iteration"]
        print(
            f"the run in {resume_dir.parent} is finished: {resume_dir.name} has {done} "
            f"iterations and --iterations is {config.iterations}; to train it further, pass a "
            f"larger --iterations, e.g. --resume {resume_dir.parent} --iterations {2 * done}",
            flush=True,
        )
        return list(state["history"])

    console = Console()
    say = console.say
    if loud:
        say(run_folder_line(config, out_dir))
        if final_eval_only:
            say(
                f"resuming from {resume_dir} (iteration {state['iteration']}, the last): running "
                "the final evaluation, which the run stopped before"
            )
        elif resume_dir is not None:
            say(f"resuming from {resume_dir} (iteration {state['iteration']})")
    torch.manual_seed(config.seed)
    np.random.seed(config.seed)
    random.seed(config.seed)
    device, compute_dtype = resolve_device(config)

    with peft_deprecation_silenced():
        model, tokenizer = load_for_run(config, resume_dir)
    # BUILD -------------------------------------------------------------------------------
    learner = build_learner(config, model, tokenizer, device, compute_dtype)
    model, optimizer, autocast = learner.model, learner.optimizer, learner.autocast
    policy = build_policy(config, model, tokenizer, autocast, device, compute_dtype)
    params, eval_params = sampling_params(config)

    # The estimator chosen by name: its options come from the config, its inputs from the batch.
    estimator = advantage_estimator(config.advantage)
    advantage_options = estimator_options(config, estimator)
    # A judge scores rounds for an estimator that reads contributions, and stepwise candidates.
    judge = (
        make_judge(config, model, tokenizer)
        if "contributions" in estimator.inputs or config.rollout == "stepwise"
        else None
    )
    # SPA's progress estimator or OPRL's implicit PRM, trained beside the policy.
    credit = None
    if "process_rewards" in estimator.inputs:
        from agentgym.algorithms.learned_credit import LearnedCredit

        credit = LearnedCredit(config.advantage, seed=config.seed)
        if resume_dir is not None:  # checkpoints hold the policy only, not this model
            note = "its learned step-reward model is not in the checkpoint: it starts afresh"
            print(f"--advantage {config.advantage}: {note}", file=sys.stderr)
    # SLEA-RL's experience library: shared by the train and eval envs of this process.
    library = None
    if config.uses_experience_library():
        from agentgym.algorithms.slea_library import ExperienceLibrary

        library = ExperienceLibrary()
        if resume_dir is not None:  # as SPA's and OPRL's models: not in the checkpoint
            note = "its experience library is not in the checkpoint: it starts empty"
            print(f"--advantage {config.advantage}: {note}", file=sys.stderr)
    venv = make_run_envs(
        config, config.num_groups, config.group_size, evaluation=False, library=library
    )
    eval_venv = None
    if config.eval_tasks() > 0:
        eval_venv = make_run_envs(config, config.eval_tasks(), 1, evaluation=True, library=library)

    start, history = restore_state(state, optimizer) if state is not None else (0, [])
    if config.overwrite and not resuming_in_place:  # only now: a failed load keeps the old run
        checkpoint.remove_run(out_dir)
    logger = MetricLogger(
        out_dir, config.tensorboard, history, start if resume_dir is not None else None
    )
    last_saved = start if resuming_in_place else None  # iteration of the newest checkpoint here

    def emit(record: dict[str, Any]) -> None:
        history.append(record)
        logger.log(record)
        if loud and "eval/success_rate" in record:
            say(eval_line(record, eval_venv.num_envs))

    def save(iteration: int, rng: dict[str, Any] | None = None, upto: int | None = None) -> Path:
        nonlocal last_saved
        path = save_checkpoint(
            out_dir / f"checkpoint-{iteration}",
            model,
            tokenizer,
            optimizer,
            config,
            iteration,
            history[:upto],
            rng,
        )
        last_saved = iteration
        return path

    iterations = range(start, config.iterations)
    if loud and config.progress:
        console.show_progress(
            config.iterations, start, f"{config.advantage} {config.env}", venv.num_envs
        )
    threads_before = torch.get_num_threads()
    # The last state that a checkpoint can hold: (iterations done, history length, RNG), or
    # None while the weights are ahead of the history (inside an update).
    consistent: tuple[int, int, dict[str, Any]] | None = (start, len(history), rng_state())
    ctrl_c = CtrlC()
    try:
        ctrl_c.install()
        if device.type == "cpu" and config.cpu_threads:
            torch.set_num_threads(config.cpu_threads)  # restored in `finally`
        for it in iterations:
            consistent = (it, len(history), rng_state())

            # EVALUATE --------------------------------------------------------------------
            # Timed apart (time/eval, its own line), not in the iteration.
            if eval_venv is not None and it % config.eval_every == 0:
                if not evaluated_at(history, it):
                    samples = it * venv.num_envs
                    emit(
                        evaluate(config, eval_venv, policy, eval_params, console.phase, it, samples)
                    )
            t_iter = time.perf_counter()

            # ROLLOUT ---------------------------------------------------------------------
            progress = RolloutProgress(policy, console.phase, venv.num_envs, f"rollout {it + 1}")
            batch = collect_rollout(config, venv, progress, params, judge, it)
            record: dict[str, Any] = {"iteration": it + 1, "samples": (it + 1) * venv.num_envs}
            record.update(episode_metrics("rollout", batch))
            if isinstance(venv, MixedEnvs):  # and per env
                record.update(env_metrics("rollout", batch, venv.names, episode_metrics))
            record["rollout/actions"] = len(batch)
            record["rollout/invalid_rate"] = float(batch.invalid.mean())
            record["rollout/response_tokens"] = float(np.mean([len(r) for r in batch.response_ids]))
            if library is not None:  # SLEA-RL: the library evolves from every rollout
                record.update(
                    {f"slea/{k}": v for k, v in library.update(batch.trajectories).items()}
                )
                record["slea/experiences"] = len(library)

            # ADVANTAGE -------------------------------------------------------------------
            t0 = time.perf_counter()
            advantages, adv_record = compute_advantages(
                config, batch, estimator, advantage_options, credit or judge, tokenizer
            )
            time_advantage = time.perf_counter() - t0
            record.update(adv_record)

            # UPDATE ----------------------------------------------------------------------
            consistent, ctrl_c.must_finish = None, True  # weights move from here on
            t0 = time.perf_counter()
            record.update(update_policy(config, learner, batch, advantages, it, console))
            policy.sync_weights(model)
            if credit is not None:  # after the rewards of this batch were used (OPRL's "after")
                rows = {"group_ids": batch.group_ids, "traj_ids": batch.traj_ids}
                record.update(credit.update(row_texts(batch), **rows, rewards=batch.rewards))

            # LOG -------------------------------------------------------------------------
            record["time/generate"] = batch.timings["generate"]
            record["time/env"] = batch.timings["env"]
            record["time/advantage"] = time_advantage
            record["time/update"] = time.perf_counter() - t0
            record["time/iteration"] = time.perf_counter() - t_iter
            record["time/tokens_per_s"] = progress.tokens / max(batch.timings["generate"], 1e-9)
            record["time/update_tokens_per_s"] = float(
                row_lengths(batch, np.arange(len(batch))).sum()
            ) / max(record["time/update"], 1e-9)
            emit(record)
            if loud:
                say(iteration_line(record, config.iterations))
            console.iteration_done(record)

            # CHECKPOINT ------------------------------------------------------------------
            last = it + 1 == config.iterations
            if config.checkpoint_every and (it + 1) % config.checkpoint_every == 0 and not last:
                save(it + 1)  # the last one is saved after the final evaluation, below
            consistent = (it + 1, len(history), rng_state())
            ctrl_c.must_finish = False
            if ctrl_c.requested:
                raise KeyboardInterrupt

        # EVALUATE and CHECKPOINT the final policy --------------------------------------
        # Its checkpoint holds the final evaluation: a run stopped before it has none there,
        # and resuming it runs the evaluation (and this save) instead of calling it finished.
        done = max(config.iterations, start)
        evaluated = False
        if eval_venv is not None and not evaluated_at(history, done):
            samples = done * venv.num_envs
            emit(evaluate(config, eval_venv, policy, eval_params, console.phase, done, samples))
            evaluated = True
        scheduled = bool(config.checkpoint_every) and done % config.checkpoint_every == 0
        new_here = done > start or evaluated or not resuming_in_place
        if (config.save_final or scheduled) and new_here and (last_saved != done or evaluated):
            ctrl_c.must_finish = True  # a Ctrl-C now would only cut the final save short
            save(done)
    except KeyboardInterrupt:
        raise interrupted(consistent, last_saved, out_dir, save) from None
    finally:
        ctrl_c.restore()
        torch.set_num_threads(threads_before)
        console.close()
        logger.close()
        venv.close()
        if eval_venv is not None:
            eval_venv.close()
    print_summary(config, history, start, time.perf_counter() - t_start, out_dir, last_saved)
    return history


#: Packages the trainer imports only where they are needed, and the extra that installs each
#: (pyproject.toml): a missing one is one line naming the extra.
EXTRA_OF_MODULE = {
    "torch": "train", "transformers": "train", "tokenizers": "train", "safetensors": "train",
    "peft": "train", "vllm": "vllm",
}  # fmt: skip


def main(argv: list[str] | None = None, checked: tuple[Config, list[str]] | None = None) -> None:
    """The command line: config errors, refused or unreadable checkpoints, a chat template the
    sandbox stops and missing extras are one line and exit code 2, a checkpoint that cannot be
    written one line and exit code 1, Ctrl-C exit code 130.

    ``checked``: what :func:`~trainers.gigpo.config.command_line` returned for the command line
    already (run as a script, it is checked before torch is imported).
    """
    config, notes = checked if checked is not None else command_line(argv)
    for note in notes:
        print(note, file=sys.stderr)
    try:
        train(config)
    except (ConfigError, CheckpointError, MissingExtra) as err:  # found while loading
        fail(str(err))
    except ModuleNotFoundError as err:  # a package of an extra, imported where it is needed
        extra = EXTRA_OF_MODULE.get((err.name or "").split(".")[0])
        if extra is None:
            raise
        fail(str(missing_extra("training", err.name.split(".")[0], extra)))
    except CheckpointSaveError as err:  # a full disk: the run so far is in earlier checkpoints
        fail(str(err), code=1)
    except Exception as err:
        # A chat template (the base model's) that tried what jinja's sandbox forbids.
        sandbox = sys.modules.get("jinja2.exceptions")
        if sandbox is None or not isinstance(err, sandbox.SecurityError):
            raise
        fail(
            f"the chat template of {config.model} was refused by jinja's sandbox ({err}); use "
            "a model whose template only formats messages"
        )
    except KeyboardInterrupt as stop:  # not an error: one line saying where things stand
        message = getattr(stop, "message", "interrupted before training started: nothing saved")
        print(f"{PROG}: {message}", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main(checked=_CHECKED)
