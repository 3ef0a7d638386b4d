"""The trainer's configuration: one dataclass, a docstring under each field, presets per env.

Defaults follow the GiGPO paper (arXiv 2505.10978) and verl-agent's GiGPO example scripts:
16 groups of 8 trajectories, learning rate 1e-6, history of 2 steps, gamma 0.95, omega 1.0,
``mean_norm`` group normalisation, invalid-action penalty 0.1, PPO clip 0.2, KL to the reference
(low-variance estimator) with coefficient 0.01, prompts up to 2048 tokens and responses up to
512. :data:`PRESETS` holds what differs per env (step cap, eval split, action format...), read
from agentgym's registry: each family declares its own (``FAMILY.trainer_defaults``).

Build one with :meth:`Config.for_env` (preset, then your overrides) or from the command line
with :func:`parse_args`. :meth:`Config.validate` checks names and ranges before anything loads;
the command line turns its :class:`ConfigError` into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
import re
import sys
import types
import typing
import warnings
from collections.abc import Collection, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

# checkpoint.py needs nothing from here (the dependency goes one way) and imports only the
# standard library at load time, so that the command line answers before torch is imported.
from trainers.gigpo.checkpoint import (
    RUN_FILES as RUN_FILES,  # re-exported: what a run writes into its folder
)
from trainers.gigpo.checkpoint import CheckpointError, read_config, resolve_resume

PROG = "python -m trainers.gigpo.train"

#: The env the command line trains when no ``--env`` is given: the corridor learns with the
#: tiny model on a CPU in about a minute, and needs no data download.
DEFAULT_ENV = "AgentGym/Corridor-v0"

#: Where runs go unless ``out_dir`` says otherwise.
DEFAULT_OUT_DIR = "runs/gigpo"

DTYPES = ("auto", "bfloat16", "float16", "float32")
GENERATION_BACKENDS = ("hf", "vllm")
HF_GENERATION = ("static", "generate")
UPDATE_BATCHING = ("auto", "tokens", "packed", "rows")
ENV_BACKENDS = ("inprocess", "process")
EPISODE_STATS = ("trajectories", "steps")
POLICIES = ("free", "scored")

#: What ``--policy scored`` changes in an env's preset (flags given still win): the env parses
#: the chosen action as plain text, and the short prompt lists the admissible actions.
SCORED_PRESET: dict[str, Any] = {"fmt": "plain", "prompt_template": "actions"}

#: Fields a resumed run does not take from the checkpoint's saved config: they say where and
#: how this invocation runs, not what is trained.
RUN_FIELDS = ("resume", "overwrite", "out_dir")


class ConfigError(ValueError):
    """A config that cannot run; the message is one line saying what to pass instead."""


@dataclass
class Config:
    # --- environment -------------------------------------------------------------------------
    env: str = DEFAULT_ENV
    """registered agentgym env id (the command line without ``--env`` trains the corridor, with
    its preset)"""
    extra_envs: list[str] = field(default_factory=list)
    """further env ids trained in the same run (the command line: ``--env`` given again); each
    group is drawn from one env, advantages are computed within each env's groups, metrics and
    evaluation are reported per env too; each extra env takes its own preset's env settings
    (``env_kwargs``, ``max_episode_steps``, ``fmt``, ``history_length``, ``prompt_template``, splits)"""
    env_weights: list[float] | None = None
    """share of the ``num_groups`` groups each env gets, in ``--env`` order (``--env-weight``
    given once per env); None: equal shares. Every env gets at least one group"""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """extra constructor arguments for the env (JSON on the command line); replaces the preset's"""
    max_episode_steps: int | None = None
    """episode step cap (``gym.make``'s ``max_episode_steps``); None keeps the registered one"""
    fmt: str | None = None
    """action format the model answers in (``think_action``, ``search_answer``, ``plain``);
    None: the env family's default"""
    history_length: int = 2
    """past (observation, action) pairs shown in each prompt"""
    prompt_template: str | None = None
    """a name in ``agentgym.wrappers.llm.PROMPT_TEMPLATES``, or ``compact`` (observation and
    history only, for tiny models); None: the env family's template"""
    train_split: str | None = None
    """``options={"split": ...}`` for training episodes; None where the family has no splits"""
    eval_split: str | None = None
    """held-out split for evaluation; None: evaluate on other seeds of the training tasks"""
    env_backend: str = "inprocess"
    """GroupVectorEnv backend: ``inprocess`` or ``process`` (for heavy envs such as ALFWorld)"""
    env_workers: int | None = None
    """worker processes for ``env_backend="process"``; None: one per CPU core"""

    # --- model and generation ----------------------------------------------------------------
    model: str = "tiny"
    """a local path or hub name loaded with ``AutoModelForCausalLM``, or ``tiny``: a randomly
    initialised tiny Qwen2 with a word-level tokenizer built offline from the env's texts"""
    tiny_layers: int = 2
    """layers of the tiny model"""
    tiny_hidden: int = 64
    """hidden size of the tiny model"""
    generation_backend: str = "hf"
    """``hf`` (transformers ``generate``; any device) or ``vllm`` (GPU; weights synced after
    every update)"""
    temperature: float = 1.0
    """sampling temperature for rollouts"""
    top_p: float = 1.0
    """nucleus sampling threshold for rollouts"""
    max_new_tokens: int = 512
    """response length cap per step. With several envs, each env takes its own preset's cap
    (the corridor's 1 token would leave no room for another env's ``<action>`` tags); a value
    other than the first env's preset, such as a flag, applies to every env"""
    max_prompt_tokens: int = 2048
    """prompt length cap; longer prompts keep their tail"""
    generation_batch_size: int = 128
    """prompts per ``generate`` call (HF backend)"""
    hf_generation: str = "static"
    """HF backend decoding: ``static`` (static KV cache, on-device sampling, finished rows
    dropped as they end, a CUDA-graph decode step on GPU; ``agentgym/engine/decoding.py``) or
    ``generate`` (transformers' ``generate``, the reference it is tested against)"""
    compile_decode: bool | None = None
    """compile the static decoder's step (CUDA graphs); None: on CUDA only"""
    vllm_gpu_memory_utilization: float = 0.4
    """share of GPU memory vLLM may take (the trainer needs the rest)"""
    policy: str = "free"
    """``free``: the model writes its action as text; ``scored``: it chooses among the env's
    admissible actions with probability softmax(summed token log-probs / ``action_temperature``),
    the chosen action's tokens being the trained response (``trainers/gigpo/scored.py``; HF
    backend; the env parses plain text and prompts list the actions: ``fmt`` ``plain`` and
    ``prompt_template`` ``actions`` unless given)"""
    action_temperature: float = 1.0
    """``--policy scored``: softmax temperature over the actions' summed log-probs in rollouts
    (evaluation uses ``eval_temperature``; 0 = the most likely action)"""

    # --- advantage ---------------------------------------------------------------------------
    advantage: str = "gigpo"
    """estimator registered in ``trainers.gigpo.advantage`` (``gigpo``, ``grpo``, ``rloo``,
    ``slate``, ``cw_grpo``, ``slea_rl``; ``spa`` and ``oprl`` train a learned step-reward model
    beside the policy)"""
    experience_library: bool = True
    """``--advantage slea_rl``: SLEA-RL's self-evolving experience library
    (``agentgym.algorithms.slea_library``) puts the experiences retrieved for each step's
    ``state_key`` before its prompt and evolves from every rollout (False: the advantage
    alone). It lives in the trainer's process, so it needs ``env_backend="inprocess"``"""
    gamma: float = 0.95
    """discount of step returns, R_t = r_t + gamma * R_{t+1}"""
    omega: float = 1.0
    """weight of the step-level advantage: A = A_episode + omega * A_step"""
    norm: str = "mean_norm"
    """group normalisation: ``mean_norm`` (subtract the mean) or ``mean_std_norm``"""
    invalid_penalty: float = 0.1
    """subtracted from the reward of a step whose action was invalid"""
    episode_stats_over: str = "trajectories"
    """episode-group statistics over ``trajectories`` (the paper) or ``steps`` (verl-agent's
    implementation, which weighs long trajectories more)"""
    judge: str = "rule"
    """per-round judge of ``cw_grpo`` (contributions) and of ``--rollout stepwise`` (dense
    rewards): ``rule`` (the env family's ground truth: a room passed on the corridor, a goal
    fact made true in ALFWorld, a box onto a target in Sokoban, a passage holding the answer in
    search-QA) or ``llm`` (a language model asked whether the round helped)"""
    judge_model: str = "policy"
    """``--judge llm``'s model: ``policy`` (the model being trained judges, in eval mode) or a
    local path / hub name of a causal LM"""
    contribution_gamma: float = float("inf")
    """``cw_grpo``: sharpness of the contribution weights over a trajectory's rounds (``inf``:
    proportional to the judge's scores, the paper's default; finite: softmax(gamma * score))"""

    # --- rollout shape -----------------------------------------------------------------------
    rollout: str = "flat"
    """``flat`` (every env plays one episode from the reset state), ``tree`` (branching at equal
    samples: roots copied into sibling continuations at sampled steps, each played to the end)
    or ``stepwise`` (SLATE's truncated step-level sampling: every step, the group's envs sample
    one candidate each from a shared prefix, the judge scores them, one is drawn to continue);
    ``slate`` trains on ``tree`` or ``stepwise`` rollouts"""
    selection_temperature: float = 0.7
    """stepwise rollout: the next prefix is drawn with probability softmax(advantage / this)"""
    branch_points: int = 1
    """tree rollout: branch steps per trajectory"""
    continuations: int = 2
    """tree rollout: siblings per branch (``group_size`` must be a multiple of
    ``continuations ** branch_points``)"""
    branch_span: int = 3
    """tree rollout: gaps between branch steps are drawn uniformly from 1..branch_span"""

    # --- rollout size ------------------------------------------------------------------------
    num_groups: int = 16
    """tasks per iteration"""
    group_size: int = 8
    """trajectories per task; all start from the same initial state"""

    # --- optimisation ------------------------------------------------------------------------
    iterations: int = 150
    """training iterations (rollout + update)"""
    lr: float = 1e-6
    """AdamW learning rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm"""
    ppo_epochs: int = 1
    """passes over each iteration's rows"""
    mini_batch_size: int = 256
    """rows per optimizer step (verl's ``ppo_mini_batch_size``)"""
    micro_batch_size: int = 16
    """rows per forward/backward; gradients accumulate over a mini-batch (with
    ``update_batching`` ``tokens`` or ``packed``: the most rows in one)"""
    micro_batch_tokens: int | None = None
    """token budget per forward/backward (rows x longest row); None: sized from the model's
    shape and the GPU's memory (``trainers.gigpo.packing.auto_token_budget``), 4x larger for
    the no-gradient old and reference forwards"""
    update_batching: str = "auto"
    """how the update groups rows: ``tokens`` (length-sorted micro-batches under
    ``micro_batch_tokens``), ``packed`` (the same groups, each packed into one sequence with no
    padding at all: for flash-attention models), ``rows`` (``micro_batch_size`` rows in
    shuffled order, with padding), ``auto`` (``packed`` where the model's attention is
    flash-attention, else ``tokens``)"""
    clip_ratio: float = 0.2
    """PPO clip range epsilon"""
    kl_coef: float = 0.01
    """weight of the k3 KL to the frozen initial policy; 0 disables it (and the reference copy)"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus"""
    lora_rank: int = 0
    """LoRA rank (peft); 0 trains all weights. With LoRA the reference is the base model."""
    lora_alpha: int = 32
    """LoRA alpha"""
    lora_layers: int = 0
    """LoRA on the top N decoder layers only (0: all). The backward pass stops at the lowest
    adapted layer: on CPU, SmolLM2 with 8 of its 30 layers adapted costs 0.62 s of a core per
    update row against 0.83-0.95 s with all 30 (the forward pass still runs every layer)"""
    gradient_checkpointing: bool | None = None
    """activation checkpointing during the update (memory for compute); None: on CUDA only"""
    dtype: str = "auto"
    """``auto`` (bf16 on GPU, fp32 on CPU), ``bfloat16`` or ``float32``"""
    device: str = "auto"
    """``auto``, ``cpu`` or ``cuda``"""
    cpu_threads: int | None = None
    """torch intra-op threads while training on CPU (None: torch's default). Tiny models run
    fastest on 1: their matrices are too small to split, and spare cores go to the envs"""

    # --- evaluation, logging, checkpoints ------------------------------------------------------
    eval_every: int = 10
    """evaluate every this many iterations (and before the first and after the last); 0: never"""
    eval_groups: int | None = None
    """evaluation episodes (one greedy trajectory per task); None (every env's preset leaves it
    unset): sized to the run, as many as one iteration's rollout plays (``num_groups x
    group_size``) up to 64, so that an evaluation costs about one rollout; a number given wins"""
    eval_temperature: float = 0.0
    """sampling temperature at evaluation; 0 is greedy"""
    seed: int = 0
    """seeds torch, the env tasks and the evaluation tasks"""
    out_dir: str | None = None
    """the run folder: metrics.jsonl, TensorBoard events (tb/), checkpoints, curve.png. None:
    ``runs/gigpo``, or when resuming, the folder of the checkpoint resumed from. A new run
    refuses a folder that is not empty unless ``overwrite`` is set"""
    overwrite: bool = False
    """replace the run in ``out_dir`` (its metrics, events, checkpoints and curve; other files
    stay)"""
    checkpoint_every: int = 0
    """save a checkpoint every this many iterations (and at the end); 0: only at the end"""
    save_final: bool = True
    """save a checkpoint after the last iteration"""
    resume: str | None = None
    """a checkpoint folder, or a run folder (its latest complete checkpoint), to resume from:
    model, optimizer, RNG, iteration and metric history. On the command line, flags not given
    take the checkpoint's saved config"""
    tensorboard: bool = True
    """also log to TensorBoard when it is installed"""
    progress: bool = True
    """tqdm progress bars on stderr: iterations, and rollout rounds / update steps inside one"""
    quiet: bool = False
    """print only the final summary and errors: no per-iteration lines, no progress bars"""
    plot: bool = True
    """draw the learning curve to ``<out_dir>/curve.png`` at the end (needs matplotlib)"""

    @property
    def max_steps(self) -> int | None:
        """Deprecated name of :attr:`max_episode_steps`."""
        _warn_old_name()
        return self.max_episode_steps

    @max_steps.setter
    def max_steps(self, value: int | None) -> None:
        _warn_old_name()
        self.max_episode_steps = value

    @classmethod
    def for_env(cls, env: str, **overrides: Any) -> Config:
        """The config for ``env``: defaults, then the env's preset (:data:`PRESETS`: its family's
        trainer defaults and its registered step cap), then ``overrides``."""
        overrides = _renamed(overrides)
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown config fields: {sorted(unknown)}")
        preset = dict(PRESETS.get(env, {}))
        if overrides.get("policy") == "scored":  # the env parses the chosen action's plain text
            preset.update(SCORED_PRESET)
        return cls(**{**preset, "env": env, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def eval_tasks(self) -> int:
        """Evaluation episodes per evaluation: ``eval_groups``, or when None, one rollout's
        worth (``num_groups x group_size``) up to :data:`EVAL_TASKS_CAP`; 0 when evaluation is
        off (``eval_every`` 0)."""
        if self.eval_every <= 0:
            return 0
        if self.eval_groups is not None:
            return self.eval_groups
        return min(EVAL_TASKS_CAP, self.num_groups * self.group_size)

    def run_dir(self) -> Path:
        """The folder this run writes to (see ``out_dir``)."""
        if self.out_dir is not None:
            return Path(self.out_dir)
        if self.resume is not None:
            from trainers.gigpo.checkpoint import resolve_resume

            return resolve_resume(self.resume).parent
        return Path(DEFAULT_OUT_DIR)

    def uses_experience_library(self) -> bool:
        """SLEA-RL's experience library is on: ``--advantage slea_rl`` with the library."""
        return self.advantage == "slea_rl" and self.experience_library

    def validate(self, cli: bool = False) -> None:
        """Raise :class:`ConfigError` (one line naming the valid choices) if this config cannot
        run: unknown names, sizes below 1, a missing model or checkpoint, a used ``out_dir``.

        Cheap: nothing is loaded (a hub model name not in the local cache costs one request to
        the hub, unless ``HF_HUB_OFFLINE`` is set). ``cli``: name fields as ``--flags``. The
        checks run in :data:`VALIDATION_CHECKS` order, cheapest first; the env's data is read
        last, so a config error is never hidden behind a slow data check.
        """
        for name in VALIDATION_CHECKS:
            getattr(self, name)(cli)

    @staticmethod
    def _flag(name: str, cli: bool) -> str:
        return "--" + name.replace("_", "-") if cli else name

    def _choose(self, name: str, choices: tuple[str, ...] | list[str], cli: bool) -> None:
        value = getattr(self, name)
        if value not in choices:
            raise ConfigError(
                f"{self._flag(name, cli)} {value!r} is not known; choose one of: "
                f"{', '.join(choices)}"
            )

    def check_choices(self, cli: bool = False) -> None:
        """Every named choice is one the trainer knows (estimator, norm, backends, formats...)."""
        from agentgym.algorithms import NORMS, available_advantages
        from agentgym.wrappers.llm import FORMATS, PROMPT_TEMPLATES

        self._choose("advantage", available_advantages(), cli)
        self._choose("norm", NORMS, cli)
        self._choose("dtype", DTYPES, cli)
        self._choose("generation_backend", GENERATION_BACKENDS, cli)
        self._choose("hf_generation", HF_GENERATION, cli)
        self._choose("update_batching", UPDATE_BATCHING, cli)
        self._choose("policy", POLICIES, cli)
        self._choose("env_backend", ENV_BACKENDS, cli)
        self._choose("episode_stats_over", EPISODE_STATS, cli)
        self._choose("rollout", ("flat", "tree", "stepwise"), cli)
        if self.judge == "progress":  # the rule judge's name in earlier configs
            self.judge = "rule"
        self._choose("judge", ("rule", "llm"), cli)
        if self.fmt is not None:
            self._choose("fmt", FORMATS, cli)
        if self.prompt_template is not None:
            self._choose("prompt_template", ["actions", "compact", *sorted(PROMPT_TEMPLATES)], cli)
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"{self._flag('device', cli)} {self.device!r} is not known; "
                              "choose one of: auto, cpu, cuda, cuda:N")  # fmt: skip

    def check_ranges(self, cli: bool = False) -> None:
        """Sizes, rates and temperatures lie in their ranges."""
        flag = functools.partial(self._flag, cli=cli)
        if self.action_temperature < 0:
            raise ConfigError(
                f"{flag('action_temperature')} must be at least 0, got {self.action_temperature}"
            )
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ConfigError(f"{flag('micro_batch_tokens')} must be at least 1 (or None: "
                              f"sized from the model), got {self.micro_batch_tokens}")  # fmt: skip
        for name in ("num_groups", "group_size", "iterations", "max_new_tokens",
                     "max_prompt_tokens", "generation_batch_size", "ppo_epochs",
                     "mini_batch_size", "micro_batch_size", "tiny_layers", "tiny_hidden"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(name)} must be at least 1, got {getattr(self, name)}")
        for name in ("eval_every", "eval_groups", "checkpoint_every", "lora_rank", "lora_layers",
                     "history_length", "temperature", "kl_coef", "entropy_coef"):  # fmt: skip
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ConfigError(f"{flag(name)} must be at least 0, got {getattr(self, name)}")
        if self.uses_experience_library() and self.env_backend != "inprocess":
            raise ConfigError(
                f"{flag('advantage')} slea_rl keeps its experience library in the trainer's "
                f"process: use {flag('env_backend')} inprocess, or leave the library out ("
                + ("--no-experience-library)" if cli else "experience_library=False)")
            )
        if self.lora_layers and not self.lora_rank:
            raise ConfigError(f"{flag('lora_layers')} needs {flag('lora_rank')} > 0")
        if not 0 <= self.gamma <= 1:
            raise ConfigError(f"{flag('gamma')} must be in [0, 1], got {self.gamma}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"{flag('top_p')} must be in (0, 1], got {self.top_p}")
        if self.lr <= 0 or self.clip_ratio <= 0:
            raise ConfigError(f"{flag('lr')} and {flag('clip_ratio')} must be positive")
        if not self.selection_temperature > 0:
            raise ConfigError(
                f"{flag('selection_temperature')} must be > 0, got {self.selection_temperature}"
            )
        if not self.contribution_gamma > 0:
            raise ConfigError(
                f"{flag('contribution_gamma')} must be > 0 (inf: proportional weights), got "
                f"{self.contribution_gamma}"
            )

    def check_envs(self, cli: bool = False) -> None:
        """The envs of a run: each once, one positive weight each, every one with a group; several
        envs train on flat rollouts with an estimator that reads no judge."""
        from agentgym.algorithms import advantage_estimator

        flag = functools.partial(self._flag, cli=cli)
        envs = [self.env, *self.extra_envs]
        if len(set(envs)) != len(envs):
            raise ConfigError(f"{flag('env')} names an env twice: {', '.join(envs)}")
        if self.env_weights is not None:
            if len(self.env_weights) != len(envs) or not all(w > 0 for w in self.env_weights):
                raise ConfigError(
                    f"{flag('env_weights') if not cli else '--env-weight'} takes one positive "
                    f"weight per env ({len(envs)}: {', '.join(envs)}), got {self.env_weights}"
                )
        if not self.extra_envs:
            return
        for env_id in self.extra_envs:
            check_env_id(env_id)
        if self.num_groups < len(envs):
            raise ConfigError(f"{flag('num_groups')} {self.num_groups} is below the number "
                              f"of envs ({len(envs)}): every env needs a group")  # fmt: skip
        # Rows of several envs are split per env without these per-row inputs (judge
        # contributions, learned rewards, HiPER's subgoal segments) following them.
        judged = {"contributions", "process_rewards", "segment_starts"} & set(
            advantage_estimator(self.advantage).inputs
        )
        if self.rollout != "flat" or judged:
            raise ConfigError(
                f"several envs in one run train with {flag('rollout')} flat and an estimator "
                f"that reads no judge's contributions, learned rewards or subgoal segments; got "
                f"{self.rollout}, {self.advantage}"
            )

    def check_policy(self, cli: bool = False) -> None:
        """``policy scored`` needs envs that list their actions, the hf backend, flat rollouts."""
        if self.policy != "scored":
            return
        flag = functools.partial(self._flag, cli=cli)
        for env_id in [self.env, *self.extra_envs]:
            problem = scored_problem(env_id)
            if problem:
                raise ConfigError(problem if cli else problem.replace("--policy", "policy"))
        if self.generation_backend != "hf":
            raise ConfigError(f"{flag('policy')} scored runs on {flag('generation_backend')} "
                              "hf only (it scores with the trained model itself)")  # fmt: skip
        if self.rollout != "flat":
            raise ConfigError(f"{flag('policy')} scored supports {flag('rollout')} flat only")

    def check_estimator(self, cli: bool = False) -> None:
        """The rollout makes the rows the estimator declares it reads (``branch_ids``: sibling
        continuations; ``contributions``: a judge that can score this env's rounds)."""
        from agentgym.algorithms import advantage_estimator

        flag = functools.partial(self._flag, cli=cli)
        inputs = advantage_estimator(self.advantage).inputs
        if ("branch_ids" in inputs) != (self.rollout in ("tree", "stepwise")):
            raise ConfigError(
                f"{flag('advantage')} {self.advantage} trains on sibling continuations, which "
                f"only {flag('rollout')} tree or stepwise makes (and their rows suit only an "
                "estimator that reads them, such as slate): use both or neither"
                if "branch_ids" in inputs
                else f"{flag('rollout')} {self.rollout} makes sibling continuations, which "
                f"{flag('advantage')} {self.advantage} does not read (slate does): use both or "
                "neither"
            )
        if self.rollout == "stepwise" and self.group_size < 2:
            raise ConfigError(
                f"{flag('rollout')} stepwise draws {flag('group_size')} candidates per step: it "
                f"needs at least 2, got {self.group_size}"
            )
        if self.rollout == "tree" and (
            self.continuations < 2
            or self.branch_points < 1
            or self.group_size % self.continuations**self.branch_points
        ):
            raise ConfigError(
                f"{flag('group_size')} must be a multiple of {flag('continuations')} ** "
                f"{flag('branch_points')} (continuations >= 2, branch_points >= 1); got "
                f"{self.group_size}, {self.continuations}, {self.branch_points}"
            )
        judged = "contributions" in inputs
        if (judged or self.rollout == "stepwise") and self.judge == "rule":
            from agentgym.algorithms.judges import RULE_JUDGES
            from agentgym.envs import entry

            try:
                family = entry(self.env).family
            except KeyError:  # an unknown id is reported where the env is made
                family = None
            if family is not None and family not in RULE_JUDGES:
                raise ConfigError(
                    f"{flag('judge')} rule: the {family!r} family reports no per-round ground "
                    f"truth (rule judges: {', '.join(sorted(RULE_JUDGES))}); use "
                    f"{flag('judge')} llm"
                )

    def check_model(self, cli: bool = False) -> None:
        """The model exists (a path, the local cache or ``tiny``) and suits the backend."""
        flag = functools.partial(self._flag, cli=cli)
        if self.generation_backend == "vllm" and self.model == "tiny":
            raise ConfigError(f"{flag('generation_backend')} vllm needs a real model "
                              f"({flag('model')} PATH or hub name), not 'tiny'")  # fmt: skip
        problem = model_problem(self.model)
        if problem:
            raise ConfigError(f"{flag('model')} {self.model}: {problem}")

    def check_output(self, cli: bool = False) -> None:
        """The checkpoint to resume exists, and the run folder is free (or may be reused)."""
        resume = None
        if self.resume is not None:
            resume = resolve_resume(self.resume)  # CheckpointError says what to pass instead
        problem = out_dir_problem(self.run_dir(), resume, self.overwrite)
        if problem:
            raise ConfigError(problem)

    def check_env_data(self, cli: bool = False) -> None:
        """Each env can be built: its packages and data are here (it may read the data)."""
        # A family whose data or packages are missing is a one-line error now, not a traceback
        # after the model has loaded.
        flag = functools.partial(self._flag, cli=cli)
        problem = env_problem(self.env, self.env_kwargs, (self.train_split, self.eval_split))
        if problem:
            raise ConfigError(f"{flag('env')} {self.env}: {problem}")
        for env_id in self.extra_envs:
            problem = env_problem(env_id, {}, ())
            if problem:
                raise ConfigError(f"{flag('env')} {env_id}: {problem}")


#: The named checks of :meth:`Config.validate`, in the order it runs them.
VALIDATION_CHECKS: tuple[str, ...] = (
    "check_choices",
    "check_ranges",
    "check_envs",
    "check_policy",
    "check_estimator",
    "check_model",
    "check_output",
    "check_env_data",
)


#: Per-turn generation settings of a run with several envs: every env takes its own preset's,
#: unless the run's value differs from the first env's preset (a flag, or a value given in
#: Python): then that value is the user's, for every env. Without this, one env's cap (the
#: corridor's single token) would leave another env no room to answer (Sokoban's
#: ``<action>...</action>``).
GENERATION_FIELDS = ("max_new_tokens",)


def generation_per_env(config: Config) -> list[dict[str, Any]]:
    """:data:`GENERATION_FIELDS` of each env of the run (``env``, then ``extra_envs``); the
    run's own for all under ``policy scored``, whose answer is the chosen action whatever the cap
    (so that every env's turns stay in one scoring batch)."""
    first = {f: getattr(config, f) for f in GENERATION_FIELDS}
    if config.policy == "scored":
        return [first] * (1 + len(config.extra_envs))
    defaults = Config()

    def preset(env_id: str) -> dict[str, Any]:
        own = PRESETS.get(env_id, {})
        return {f: own.get(f, getattr(defaults, f)) for f in GENERATION_FIELDS}

    given = {
        f: getattr(config, f) for f, v in preset(config.env).items() if getattr(config, f) != v
    }
    return [first, *({**preset(env_id), **given} for env_id in config.extra_envs)]


def scored_problem(env_id: str) -> str | None:
    """Why ``--policy scored`` cannot run on ``env_id`` (one line), or None: its family's
    ``FAMILY.lists_actions`` is False (actions are free text).

    Here, not beside the scored policy's code, so that the check never imports what the policy
    needs (torch): a refused config is answered as fast as any other bad flag.
    """
    from agentgym.envs import entry
    from agentgym.family import family_spec

    try:
        family = entry(env_id).family
    except KeyError:  # an unknown id is reported where the env is made
        return None
    spec = family_spec(family)
    if spec is not None and not spec.lists_actions:
        return (
            f"--policy scored chooses among the env's admissible actions, and the {family!r} "
            f"family ({env_id}) lists none; use --policy free"
        )
    return None


def check_env_id(env: str) -> None:
    """Raise ValueError naming the registered agentgym ids if ``env`` is not a registered id."""
    import gymnasium as gym

    import agentgym  # noqa: F401  (registers the AgentGym/ ids)

    if env not in gym.registry:
        ids = sorted(k for k in gym.registry if k.startswith("AgentGym/"))
        raise ValueError(f"unknown env id {env!r}; agentgym registers: {', '.join(ids)}")


def env_problem(
    env: str, env_kwargs: dict[str, Any], splits: tuple[str | None, ...] = ()
) -> str | None:
    """Why ``env`` cannot be played here (its optional packages or its data are missing), as
    the env's own one-line message, or None.

    Only ids that play real benchmark data are built (once, in this process) and reset on each
    of ``splits``: the others generate their tasks and have nothing to miss but packages.
    """
    import gymnasium as gym

    from agentgym.envs import MissingExtra, entry

    try:
        spec = entry(env)
    except KeyError:  # not an agentgym id: reported by check_env_id
        return None
    try:
        spec.check_available()
    except MissingExtra as err:
        return str(err)
    if not spec.real_data:
        return None
    try:
        made = gym.make(env, **env_kwargs)
        try:
            for split in dict.fromkeys(s for s in splits if s):
                made.reset(seed=0, options={"split": split})
        finally:
            made.close()
    except (OSError, ImportError, ValueError, KeyError) as err:  # data missing or unusable
        return " ".join(str(err).split()) or type(err).__name__
    return None


def command_line(argv: list[str] | None = None) -> tuple[Config, list[str]]:
    """The command line's config, checked: parsed, env id known, :meth:`Config.validate`
    passed; otherwise the one-line error and exit code 2 (:func:`fail`).

    Needs neither torch nor transformers, so that a mistyped flag is answered in well under a
    second. Returns the config and the notes to print once training starts.
    """
    notes: list[str] = []
    try:
        config = parse_args(argv, notes)
        check_env_id(config.env)
        config.validate(cli=True)
    except (ConfigError, CheckpointError, ValueError) as err:
        fail(str(err))
    if config.extra_envs and config.policy != "scored":  # a scored response is its action
        caps = {
            env.split("/", 1)[-1]: values["max_new_tokens"]
            for env, values in zip(
                [config.env, *config.extra_envs], generation_per_env(config), strict=True
            )
        }
        if len(set(caps.values())) > 1:
            shown = ", ".join(f"{name} {cap}" for name, cap in caps.items())
            notes.append(f"responses up to {shown} tokens (each env's preset; "
                         "--max-new-tokens N sets one cap for all)")  # fmt: skip
    return config, notes


def model_problem(model: str) -> str | None:
    """Why ``model`` (``tiny``, a folder, or a hub name) cannot be loaded here, or None."""
    if model == "tiny":
        return None
    path = Path(model).expanduser()
    hint = "pass --model tiny, a folder holding a saved model, or a Hugging Face hub name"
    if path.is_dir():
        return None if (path / "config.json").is_file() else f"no config.json in it; {hint}"
    first_part = Path(model.split("/")[0]).expanduser()
    if model.startswith((".", "/", "~")) or model.count("/") != 1 or first_part.is_dir():
        return f"no such folder; {hint}"
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return None  # downloaded before: loads offline
    offline = any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    advice = "download it while online (huggingface-cli download NAME) or pass --model FOLDER"
    if offline:
        return f"not in the Hugging Face cache, and the hub is offline (HF_HUB_OFFLINE); {advice}"
    from huggingface_hub import model_info

    try:
        model_info(model, timeout=10)
    except Exception as err:  # noqa: BLE001  (offline, unknown name, gated: all end the run)
        return (
            f"not in the Hugging Face cache, and the hub cannot be reached from here "
            f"({type(err).__name__}); {advice}"
        )
    return None


def out_dir_problem(run_dir: Path, resume: Path | None, overwrite: bool) -> str | None:
    """Why a run cannot write to ``run_dir``, or None.

    A new run needs an empty (or missing) folder, or ``overwrite``; a run resumed from one of
    ``run_dir``'s own checkpoints continues it in place (``overwrite`` would delete it).
    """
    resuming_in_place = resume is not None and resume.parent.resolve() == run_dir.resolve()
    if resuming_in_place:
        if overwrite:
            return (f"--overwrite would delete {resume}, the checkpoint --resume continues "
                    "from; drop --overwrite, or pass another --out-dir")  # fmt: skip
        return None
    if overwrite or not run_dir.is_dir():
        return None
    entries = sorted(p.name for p in run_dir.iterdir())
    if not entries:
        return None
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    return (
        f"--out-dir {run_dir} is not empty ({shown}); pass --resume {run_dir} to continue its "
        f"run, --overwrite to replace it, or another --out-dir"
    )


#: Config fields under their old names, accepted for one release with a DeprecationWarning.
OLD_NAMES = {"max_steps": "max_episode_steps"}


def _warn_old_name(old: str = "max_steps") -> None:
    warnings.warn(
        f"Config.{old} is deprecated: use {OLD_NAMES[old]}", DeprecationWarning, stacklevel=3
    )


def _renamed(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with old field names (:data:`OLD_NAMES`) under their new ones, warned about;
    a new name given too wins."""
    values = dict(values)
    for old, new in OLD_NAMES.items():
        if old in values:
            _warn_old_name(old)
            value = values.pop(old)
            values.setdefault(new, value)
    return values


_dataclass_init = Config.__init__


def _init_accepting_old_names(self: Config, *args: Any, **kwargs: Any) -> None:
    _dataclass_init(self, *args, **_renamed(kwargs))


_init_accepting_old_names.__doc__ = _dataclass_init.__doc__
Config.__init__ = _init_accepting_old_names  # type: ignore[method-assign]


class Presets(MutableMapping[str, dict[str, Any]]):
    """``env id -> the config fields that differ from the defaults there``, read from agentgym's
    registry: the family's ``FAMILY.trainer_defaults`` (declared in its package, e.g. the
    corridor's tiny-model setup) and, as ``max_episode_steps``, the id's registered step cap (the
    paper's: ALFWorld 50, WebShop 15, Sokoban 15, search QA 4 turns), so no cap is stated twice.
    ``PRESETS[id] = {...}`` sets one for an id of your own; each read is a fresh copy.
    """

    def __init__(self) -> None:
        self._own: dict[str, dict[str, Any]] = {}

    def __getitem__(self, env: str) -> dict[str, Any]:
        if env in self._own:
            return copy.deepcopy(self._own[env])
        from agentgym.envs import entry
        from agentgym.family import family_spec

        try:
            registered = entry(env)
        except KeyError:
            raise KeyError(env) from None
        spec = family_spec(registered.family)
        # a copy: a config must never share the preset's env_kwargs dict with the next one
        preset = copy.deepcopy(dict(spec.trainer_defaults)) if spec is not None else {}
        if registered.max_episode_steps is not None:
            preset["max_episode_steps"] = registered.max_episode_steps  # the registry's, no copy
        return preset

    def __setitem__(self, env: str, preset: dict[str, Any]) -> None:
        self._own[env] = dict(preset)

    def __delitem__(self, env: str) -> None:
        del self._own[env]

    def __iter__(self) -> Iterator[str]:
        from agentgym.envs import ENTRIES

        return iter(dict.fromkeys([*self._own, *(e.id for e in ENTRIES)]))

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: Per-env settings that differ from the defaults (see :class:`Presets`).
PRESETS = Presets()

#: The most evaluation episodes ``eval_groups=None`` sizes an evaluation to.
EVAL_TASKS_CAP = 64

#: What the corridor demo (the command line without ``--env``) costs, start to end: 94 s of
#: CPU time (user + sys) under ``/usr/bin/time python -m trainers.gigpo.train --no-progress``;
#: it runs on one core, so a busy machine stretches the wall-clock time.
DEMO_DURATION = "about 2 minutes of CPU time"


# --- command line ------------------------------------------------------------------------------
def _field_docs() -> dict[str, str]:
    """Field docstrings, read from the source (what ``--help`` shows)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(Config)))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[union-attr]
    return docs


def _parser_type(tp: Any) -> tuple[Any, bool]:
    """(converter, is_bool) for a field annotation such as ``int | None`` or ``dict[str, Any]``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner, is_bool = _parser_type(args[0])
        return (lambda s: None if s.lower() == "none" else inner(s)), is_bool
    if tp is bool:
        return bool, True
    if origin is dict or tp is dict:
        return json.loads, False
    return tp, False


class _OneLineParser(argparse.ArgumentParser):
    """Errors as one line (the usage of ~60 flags would bury it), exit code 2."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see --help)")


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` as the command's one-line error and exit with ``code``."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(code)


def demo_summary() -> str:
    """What the corridor demo (no ``--env``) runs, from its preset: said by ``--help`` and by
    the note a run without ``--env`` prints, so the two cannot disagree."""
    demo = PRESETS[DEFAULT_ENV]
    return (
        f"a tiny model learns it in {demo['iterations']} iterations of {demo['num_groups']} x "
        f"{demo['group_size']} episodes, {DEMO_DURATION}"
    )


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one ``--flag`` per :class:`Config` field (defaults suppressed).

    Each flag's help shows its default and, where the demo's preset sets it otherwise, the
    value a run without ``--env`` takes."""
    parser = _OneLineParser(
        prog=PROG,
        description="Train an LLM agent on an agentgym env with GiGPO (or GRPO). Unset flags "
        f"take the env's preset, then the paper's defaults. Without --env: {DEFAULT_ENV}, the "
        f"CPU demo ({demo_summary()}).",
        argument_default=argparse.SUPPRESS,
    )
    demo = PRESETS[DEFAULT_ENV]
    hints = typing.get_type_hints(Config)
    docs = _field_docs()
    for f in dataclasses.fields(Config):
        conv, is_bool = _parser_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        shown = f"default: {default!r}"
        if f.name in demo and demo[f.name] != default:
            shown += f"; without --env, the demo's: {demo[f.name]!r}"
        help_text = f"{docs.get(f.name, '')} ({shown})".replace("%", "%%")
        if f.name in ("extra_envs", "env_weights"):  # spelt --env again, --env-weight
            continue
        if f.name == "env":  # repeatable: several envs in one run
            parser.add_argument(
                flag, dest="env", action="append", help=help_text + " Repeat for several envs."
            )
            parser.add_argument(
                "--env-weight",
                dest="env_weights",
                action="append",
                type=float,
                help=docs.get("env_weights", "").replace("%", "%%") + " (default: equal)",
            )
        elif is_bool:
            parser.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, help=help_text
            )
        else:
            parser.add_argument(flag, dest=f.name, type=conv, help=help_text)
    for old, new in OLD_NAMES.items():  # accepted for one release, not shown in --help
        parser.add_argument(
            "--" + old.replace("_", "-"),
            dest=new,
            type=_parser_type(hints[new])[0],
            action=_OldFlag,
            help=argparse.SUPPRESS,
        )
    return parser


class _OldFlag(argparse.Action):
    """A flag's old name: stores under the new one and says so in one line on stderr."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        new = "--" + self.dest.replace("_", "-")
        print(f"{PROG}: warning: {option} is deprecated: use {new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def parse_args(argv: list[str] | None = None, notes: list[str] | None = None) -> Config:
    """Parse the command line into a :class:`Config`.

    A new run: the env's preset under the flags (no ``--env``: :data:`DEFAULT_ENV`, said on
    stderr). ``--resume``: the checkpoint's saved config under the flags, ``resume`` resolved to
    the checkpoint folder and ``out_dir`` defaulting to its run folder. Raises
    :class:`ConfigError` (or ``CheckpointError``) for a ``--resume`` that cannot be resumed.
    ``notes``: collect what would be said on stderr here instead (the CLI says it once the
    config is known to be valid, so that an error stays one line).
    """
    given = vars(build_parser().parse_args(argv))
    if "env" in given:  # --env A --env B: the first is `env`, the others `extra_envs`
        envs = given.pop("env")
        given["env"], given["extra_envs"] = envs[0], envs[1:]
    if given.get("resume") is not None:
        skipped: list[str] = []
        checkpoint = resolve_resume(given["resume"], skipped)  # past damaged checkpoints
        if notes is None:
            for line in skipped:
                print(line, file=sys.stderr)
        else:
            notes.extend(skipped)
        names = {f.name for f in dataclasses.fields(Config)}
        with warnings.catch_warnings():  # a run saved under an old name: nothing to warn about
            warnings.simplefilter("ignore", DeprecationWarning)
            saved = _renamed(read_config(checkpoint))
        saved = {k: v for k, v in saved.items() if k in names}
        for name in RUN_FIELDS:
            saved.pop(name, None)
        given["resume"] = str(checkpoint)
        return Config(**{**saved, "out_dir": str(checkpoint.parent), **given})
    if "env" not in given:
        note = (
            f"no --env given: training {DEFAULT_ENV}, the CPU demo ({demo_summary()}); pass "
            "--env ID for another env"
        )
        if notes is None:
            print(note, file=sys.stderr)
        else:
            notes.append(note)
    env = given.pop("env", DEFAULT_ENV)
    config = Config.for_env(env, **given)
    note = tiny_preset_note(config, given)
    if note and notes is None:
        print(note, file=sys.stderr)
    elif note:
        notes.append(note)
    return config


#: Preset fields that suit only the tiny model, where a preset names ``model: tiny`` (the
#: corridor's one-token answers, compact prompt and large learning rate): a real ``--model``
#: runs with them too unless flags say otherwise, and the command line says so in one line.
TINY_MODEL_FIELDS = ("max_new_tokens", "prompt_template", "history_length", "lr")


def tiny_preset_note(config: Config, given: Collection[str] = ()) -> str | None:
    """The line naming the tiny-model settings (:data:`TINY_MODEL_FIELDS`) of ``config.env``'s
    preset that a real ``--model`` runs with, the fields in ``given`` excepted; None when
    there are none (the tiny model, or a preset made for any model)."""
    preset = PRESETS.get(config.env, {})
    if config.model == "tiny" or preset.get("model") != "tiny":
        return None
    kept = [
        f
        for f in TINY_MODEL_FIELDS
        if f in preset
        and f not in given
        and getattr(config, f) == preset[f]
        # the scored policy writes no free text: its response is the chosen action's tokens
        and not (f == "max_new_tokens" and config.policy == "scored")
    ]
    if not kept:
        return None
    settings = ", ".join(f"{Config._flag(f, True)} {preset[f]}" for f in kept)
    return (
        f"--model {config.model}: the {config.env} preset, made for the tiny model, sets "
        f"{settings}; pass those flags to change them"
    )
