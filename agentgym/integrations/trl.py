"""Train on agentgym envs with TRL's ``GRPOTrainer`` (trl >= 1.16), two ways.

**``environment_factory``** (TRL runs the conversation; the env is a set of tools)::

    from trl import GRPOConfig, GRPOTrainer
    from agentgym.integrations.trl import build_dataset, environment_factory

    factory = environment_factory("AgentGym/Sokoban-v0")
    trainer = GRPOTrainer(
        model=...,
        args=GRPOConfig(num_generations=8, ...),
        train_dataset=build_dataset("AgentGym/Sokoban-v0", num_tasks=256),
        environment_factory=factory,
    )

TRL makes one :class:`AgentGymEnvironment` per rollout, calls ``reset(**row)`` with the dataset
row, exposes the public method :meth:`AgentGymEnvironment.act` as a tool, and scores the rollout
with :meth:`AgentGymEnvironment.get_reward` (the column is logged as ``AgentGymEnvironment``).
TRL itself does not make the rollouts of one GRPO group start from the same state; here every
row names its task and seed (:func:`build_dataset`), TRL repeats each row ``num_generations``
times, and ``reset`` starts the env from exactly that task and seed, so all generations of a
prompt play the same task from the same initial state.

**``rollout_func``** (we run the episodes; TRL trains on the tokens)::

    from agentgym.integrations.trl import GroupRollout, env_return_reward

    trainer = GRPOTrainer(
        model=...,
        reward_funcs=env_return_reward,
        train_dataset=build_dataset("AgentGym/Sokoban-v0", num_tasks=256),
        rollout_func=GroupRollout("AgentGym/Sokoban-v0", fmt="think_action"),
    )

:class:`GroupRollout` plays the prompts' episodes through the library's one engine
(:class:`agentgym.engine.RolloutEngine`; each group of ``num_generations`` prompts on the same
task from the same initial state), generating every turn with the trainer's model, and returns one multi-turn completion per prompt: the model's turns
(``env_mask`` 1) interleaved with the env's observations (``env_mask`` 0). Extra fields
(``env_return``, ``state_keys``, ``turn_spans``...) reach the reward functions, so a GiGPO-style
estimator can group turns by ``state_key``.

TRL is imported only when an adapter is used; without it, one line says what to install.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from agentgym.engine import EpisodeRecord as EngineEpisode
from agentgym.engine import EpisodeSpec, RolloutEngine, SamplingParams
from agentgym.extras import missing_extra
from agentgym.integrations.chat import EPISODE, ChatPolicy, ChatTurns
from agentgym.vector import Step, Trajectory
from agentgym.wrappers.llm import FORMAT_INSTRUCTIONS, ParseActions, parse_action

if TYPE_CHECKING:  # pragma: no cover - typing only
    from datasets import Dataset

__all__ = [
    "TASK_COLUMN",
    "SEED_COLUMN",
    "SPLIT_COLUMN",
    "ENV_COLUMN",
    "DEFAULT_INSTRUCTION",
    "build_dataset",
    "EpisodeRecord",
    "AgentGymEnvironment",
    "EnvironmentFactory",
    "environment_factory",
    "GroupRollout",
    "env_return_reward",
]

logger = logging.getLogger(__name__)

#: Dataset columns (and keys of the prompt's last message) naming a row's task, reset seed and split.
TASK_COLUMN = "task_id"
SEED_COLUMN = "seed"
SPLIT_COLUMN = "split"

#: The user message the env's first observation is appended to.
DEFAULT_INSTRUCTION = (
    "You are an agent in a text-based environment. Act until the task is solved.\n"
)


def _require_trl() -> None:
    """Raise one line naming the extra when TRL (or its ``datasets``) is not installed."""
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        raise missing_extra("agentgym.integrations.trl", exc.name or "TRL", "trl") from None


# ----------------------------------------------------------------------------------------------
# dataset
# ----------------------------------------------------------------------------------------------
def build_dataset(
    env_id: str | Sequence[str],
    num_tasks: int,
    *,
    seed: int = 0,
    split: str | None = None,
    instruction: str = DEFAULT_INSTRUCTION,
    env_kwargs: dict[str, Any] | None = None,
    weights: Sequence[float] | None = None,
) -> Dataset:
    """A TRL prompt dataset with one row per task: ``prompt``, ``task_id``, ``seed`` (and ``split``).

    Row ``i`` is the task the env draws on ``reset(seed=seed + i)`` (within ``split`` when given).
    ``prompt`` is a one-message conversation ``[{"role": "user", "content": instruction, ...}]``
    whose message also carries ``task_id`` and ``seed`` (``rollout_func`` only sees prompts);
    the env's first observation is appended to that message at rollout time.

    Both adapters reset the env from these fields, so every generation of a row plays the same
    task from the same initial state.

    **Several envs** (``env_id`` a list of ids): a mixed dataset for TRL's dict form of
    ``environment_factory`` (:func:`environment_factory` with the same list). The ``num_tasks``
    rows are shared between the envs by ``weights`` (default equal; every env at least one row),
    each env's rows built as above, and every row (and its prompt message) names its env in the
    ``environment`` column, which TRL reads to pick the row's factory: all generations of a row
    play the same env, task and initial state. Rows alternate between the envs.
    ``env_kwargs`` is then a dict from env id to that env's keyword arguments.
    """
    _require_trl()
    from datasets import Dataset
    from tqdm.auto import tqdm

    if not isinstance(env_id, str):
        return _mixed_dataset(
            list(env_id), num_tasks, seed=seed, split=split, instruction=instruction,
            env_kwargs=env_kwargs, weights=weights,
        )  # fmt: skip
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    env = gym.make(env_id, disable_env_checker=True, **(env_kwargs or {}))
    options = {"split": split} if split is not None else None
    rows: dict[str, list[Any]] = {"prompt": [], TASK_COLUMN: [], SEED_COLUMN: []}
    if split is not None:
        rows[SPLIT_COLUMN] = []
    try:
        for i in tqdm(range(num_tasks), desc="tasks", unit="task", disable=num_tasks < 512):
            _, info = env.reset(seed=seed + i, options=options)
            task_id = str(info["task_id"])
            message = {"role": "user", "content": instruction, TASK_COLUMN: task_id}
            message[SEED_COLUMN] = seed + i
            rows["prompt"].append([message])
            rows[TASK_COLUMN].append(task_id)
            rows[SEED_COLUMN].append(seed + i)
            if split is not None:
                rows[SPLIT_COLUMN].append(split)
    finally:
        env.close()
    return Dataset.from_dict(rows)


#: The dataset column (and prompt-message key) naming a row's env in a mixed dataset; TRL's
#: ``GRPOTrainer`` reads this column to route a row to its ``environment_factory`` entry.
ENV_COLUMN = "environment"


def _share(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split by ``weights`` (largest remainder), at least one each."""
    n = len(weights)
    if total < n:
        raise ValueError(f"{n} envs need at least {n} tasks (one each), got {total}")
    w = np.asarray(weights, dtype=float)
    if len(w) == 0 or (w <= 0).any() or not np.isfinite(w).all():
        raise ValueError(f"weights must be positive numbers, one per env; got {list(weights)}")
    share = (total - n) * w / w.sum()
    counts = np.floor(share).astype(int)
    order = np.argsort(-(share - counts), kind="stable")
    counts[order[: total - n - counts.sum()]] += 1
    return [int(c) + 1 for c in counts]


def _mixed_dataset(
    env_ids: list[str],
    num_tasks: int,
    *,
    seed: int,
    split: str | None,
    instruction: str,
    env_kwargs: dict[str, Any] | None,
    weights: Sequence[float] | None,
) -> Dataset:
    from datasets import Dataset

    if not env_ids or len(set(env_ids)) != len(env_ids):
        raise ValueError(f"a mixed dataset needs distinct env ids, got {env_ids}")
    unknown = set(env_kwargs or {}) - set(env_ids)
    if unknown:
        raise ValueError(
            f"env_kwargs of a mixed dataset maps env ids to their kwargs; {sorted(unknown)} "
            f"are not among {env_ids}"
        )
    if weights is not None and len(weights) != len(env_ids):
        raise ValueError(f"weights: one per env ({len(env_ids)}), got {len(weights)}")
    counts = _share(num_tasks, weights or [1.0] * len(env_ids))
    parts = []
    for env_id, count in zip(env_ids, counts, strict=True):
        part = build_dataset(
            env_id, count, seed=seed, split=split, instruction=instruction,
            env_kwargs=(env_kwargs or {}).get(env_id),
        ).to_list()  # fmt: skip
        for row in part:
            row[ENV_COLUMN] = env_id
            row["prompt"][0][ENV_COLUMN] = env_id
        parts.append(part)
    rows = [row for i in range(max(counts)) for part in parts if i < len(part) for row in [part[i]]]
    return Dataset.from_list(rows)


def _reset_args(row: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    """``(seed, options)`` for ``env.reset`` from a dataset row (or a prompt's last message)."""
    task, seed, split = row.get(TASK_COLUMN), row.get(SEED_COLUMN), row.get(SPLIT_COLUMN)
    if task is None and seed is None:
        raise ValueError(
            f"the dataset row names no task: it needs a {TASK_COLUMN!r} or {SEED_COLUMN!r} column "
            "so that every generation of a prompt plays the same task; build the dataset with "
            "agentgym.integrations.trl.build_dataset(env_id, num_tasks)"
        )
    options: dict[str, Any] = {}
    if task is not None:
        options["task"] = task
    if split is not None:
        options["split"] = split
    return (None if seed is None else int(seed)), (options or None)


# ----------------------------------------------------------------------------------------------
# environment_factory
# ----------------------------------------------------------------------------------------------
@dataclass
class EpisodeRecord:
    """One finished rollout of an :class:`AgentGymEnvironment`, as scored by ``get_reward``."""

    task_id: str
    seed: int | None
    initial_state_key: Hashable
    trajectory: Trajectory
    reward: float
    """what ``get_reward`` returned"""

    @property
    def actions(self) -> list[str]:
        return [s.action for s in self.trajectory.steps]


class AgentGymEnvironment:
    """One agentgym env as a TRL ``environment_factory`` environment.

    TRL's contract: ``reset(**row)`` starts an episode and returns text appended to the prompt;
    every public method other than ``reset`` / ``get_reward`` is a tool the model may call (its
    type hints and docstring become the tool schema); ``get_reward()`` scores the rollout once
    it is over. Helpers here are therefore properties or private.

    Args:
        env_id: a registered agentgym id.
        env_kwargs: keyword arguments for ``gym.make``.
        reward: what :meth:`get_reward` returns: ``"return"`` (sum of the env's rewards, default),
            ``"score"`` (the family's native score, ``info["score"]``) or ``"won"`` (1.0 or 0.0).
        show_admissible: end each observation with the admissible actions, where the env lists them.
        episode_log: finished episodes are appended here by :meth:`get_reward` (see
            :class:`EnvironmentFactory`).
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        reward: str = "return",
        show_admissible: bool = True,
        episode_log: list[EpisodeRecord] | None = None,
    ):
        if reward not in ("return", "score", "won"):
            raise ValueError(f"reward must be 'return', 'score' or 'won', got {reward!r}")
        self._env = gym.make(env_id, disable_env_checker=True, **(env_kwargs or {}))
        self._reward_kind = reward
        self._show_admissible = show_admissible
        self._episode_log = episode_log
        self._trajectory: Trajectory | None = None
        self._seed: int | None = None
        self._initial_state_key: Hashable = None
        self._info: dict[str, Any] = {}
        self._obs = ""

    def reset(self, **row: Any) -> str:
        """Start the episode the dataset row names (``task_id`` / ``seed`` / ``split``).

        Returns the first observation (TRL appends it to the prompt's last message).
        """
        seed, options = _reset_args(row)
        obs, info = self._env.reset(seed=seed, options=options)
        self._seed = seed
        self._info, self._obs = info, obs
        self._initial_state_key = info.get("state_key")
        self._trajectory = Trajectory(group_id=0, traj_id=0, task_id=str(info.get("task_id", "")))
        return self._describe(obs, info)

    def act(self, action: str) -> str:
        """Take one action in the environment and see what happens.

        Args:
            action: The action to take, written as the observation asks (for example one of the
                admissible actions it lists).

        Returns:
            The environment's observation after the action.
        """
        traj = self._trajectory
        if traj is None:
            return "No episode is running."
        if traj.done:
            return "The episode is over; no more actions are taken."
        anchor = self._info.get("state_key")
        obs, reward, terminated, truncated, info = self._env.step(action)
        traj.steps.append(
            Step(
                observation=self._obs,
                action=action if isinstance(action, str) else repr(action),
                reward=float(reward),
                state_key=anchor,
                action_valid=bool(info.get("action_valid", True)),
                info=info,
            )
        )
        self._info, self._obs = info, obs
        if terminated or truncated:
            traj.terminated, traj.truncated = bool(terminated), bool(truncated)
            traj.won = bool(info.get("won", False))
        return self._describe(obs, info)

    def get_reward(self) -> float:
        """The finished (or cut) episode's reward; also appends it to the episode log."""
        traj = self._trajectory
        if traj is None:
            raise RuntimeError("get_reward() before reset(): no episode was played")
        if self._reward_kind == "return":
            value = traj.total_return
        elif self._reward_kind == "score":
            value = float(self._info.get("score", 0.0))
        else:
            value = 1.0 if traj.won else 0.0
        if self._episode_log is not None:
            self._episode_log.append(
                EpisodeRecord(traj.task_id, self._seed, self._initial_state_key, traj, value)
            )
        return value

    # properties: not functions on the class, so TRL does not turn them into tools
    @property
    def trajectory(self) -> Trajectory | None:
        """The current episode (steps, return, won)."""
        return self._trajectory

    @property
    def info(self) -> dict[str, Any]:
        """The env's info from the last reset or action (``admissible_actions``, ``state_key``...)."""
        return self._info

    @property
    def initial_state_key(self) -> Hashable:
        """``state_key`` right after the last reset."""
        return self._initial_state_key

    def _describe(self, obs: str, info: dict[str, Any]) -> str:
        text = obs
        admissible = info.get("admissible_actions")
        traj = self._trajectory
        if traj is not None and traj.done:
            text += "\nThe episode is over" + (": you won." if traj.won else ".")
        elif self._show_admissible and admissible:
            text += "\nAdmissible actions: " + ", ".join(admissible)
        return text


@dataclass
class EnvironmentFactory:
    """``environment_factory=`` for ``GRPOTrainer``: builds :class:`AgentGymEnvironment` s.

    Every environment it builds appends its scored episodes to :attr:`episodes` (in the order
    TRL scores them: the order of the generation batch), so a run can be audited afterwards.
    """

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    reward: str = "return"
    show_admissible: bool = True
    keep_episodes: bool = True
    """record episodes in :attr:`episodes` (off for long runs that do not need them)"""
    episodes: list[EpisodeRecord] = field(default_factory=list)

    def __call__(self) -> AgentGymEnvironment:
        return AgentGymEnvironment(
            self.env_id,
            self.env_kwargs,
            reward=self.reward,
            show_admissible=self.show_admissible,
            episode_log=self.episodes if self.keep_episodes else None,
        )


def environment_factory(
    env_id: str | Sequence[str],
    env_kwargs: dict[str, Any] | None = None,
    *,
    reward: str = "return",
    show_admissible: bool = True,
    keep_episodes: bool = True,
) -> EnvironmentFactory | dict[str, EnvironmentFactory]:
    """An ``environment_factory`` for ``GRPOTrainer`` playing ``env_id`` (see the module doc).

    With a list of env ids: TRL's dict form, ``{env_id: EnvironmentFactory}``, for a dataset
    from :func:`build_dataset` over the same list (its ``environment`` column names each row's
    env); ``env_kwargs`` then maps each env id to its keyword arguments.
    """
    _require_trl()
    if not isinstance(env_id, str):
        kwargs = env_kwargs or {}
        unknown = set(kwargs) - set(env_id)
        if unknown:
            raise ValueError(
                f"env_kwargs for several envs maps env ids to their kwargs; {sorted(unknown)} "
                f"are not among {list(env_id)}"
            )
        return {
            e: environment_factory(
                e,
                kwargs.get(e),
                reward=reward,
                show_admissible=show_admissible,
                keep_episodes=keep_episodes,
            )  # fmt: skip
            for e in env_id
        }
    if env_id not in gym.registry:
        raise ValueError(f"unknown env id {env_id!r}; see agentgym.env_ids()")
    return EnvironmentFactory(
        env_id, dict(env_kwargs or {}), reward, show_admissible, keep_episodes
    )


# ----------------------------------------------------------------------------------------------
# rollout_func
# ----------------------------------------------------------------------------------------------
def env_return_reward(
    completions: list[Any], env_return: list[float], **kwargs: Any
) -> list[float]:
    """Reward function for :class:`GroupRollout`: each completion's episode return."""
    return [float(r) for r in env_return]


class GroupRollout:
    """``rollout_func=`` for ``GRPOTrainer``: multi-turn episodes played by the library's engine.

    ``__call__(prompts, trainer)`` receives the process's prompts (each repeated
    ``num_generations`` times in a row, as TRL's sampler lays them out) and plays one episode per
    prompt with :class:`~agentgym.engine.RolloutEngine` (lockstep: every turn of every running
    episode generated in one batch with ``trainer``'s model and generation config, at most
    ``max_turn_tokens`` new tokens each). Each run of repeats is one group; every episode resets
    from its prompt's task and seed (named by the prompt's last message, see
    :func:`build_dataset`), so a group (or a run split between processes) starts from one state.
    The chat is the prompt with the first observation appended to its last message, then one
    assistant message per action and one user message per observation
    (:class:`~agentgym.integrations.chat.ChatPolicy` in ``"episode"`` mode).

    Returns (lists of length ``len(prompts)``):

    - ``prompt_ids``: the chat-templated first prompt;
    - ``completion_ids``: model turns and env turns concatenated, at most
      ``trainer.max_completion_length`` tokens;
    - ``logprobs``: the sampling log-prob of each model token, 0.0 on env tokens;
    - ``env_mask``: 1 on model tokens, 0 on env tokens (TRL trains on the 1s only);
    - extra fields for the reward functions: ``env_return`` (float), ``won`` (bool),
      ``task_id`` (str), ``initial_state_key``, ``state_keys`` (the anchor ``state_key`` of
      each turn), ``step_rewards`` (per turn) and ``turn_spans`` (``[start, end)`` of each model
      turn in ``completion_ids``).

    An episode stops when it ends, after ``max_turns`` turns, or when the token budget leaves
    no room for another turn; its return counts the turns taken. :attr:`records` holds the
    last call's :class:`~agentgym.engine.EpisodeRecord` s (tagged with the trainer's
    ``global_step`` as ``policy_version``).

    Args:
        env_id: a registered agentgym id.
        env_kwargs: keyword arguments for ``gym.make``.
        fmt: how model text becomes an action (:func:`agentgym.wrappers.llm.parse_action`
            formats: ``"think_action"``, ``"search_answer"``, ``"plain"``).
        max_turns: turns per episode at most (default: until the env ends it).
        max_turn_tokens: new tokens per turn at most.
        show_admissible: end each observation with the admissible actions.
        format_instruction: end the first prompt with what the reply must look like
            (:data:`agentgym.wrappers.llm.FORMAT_INSTRUCTIONS` of ``fmt``).
        env_threads: threads stepping the envs (the engine's default when None).
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        fmt: str = "think_action",
        max_turns: int | None = None,
        max_turn_tokens: int = 256,
        show_admissible: bool = False,
        format_instruction: bool = True,
        env_threads: int | None = None,
        parse_options: dict[str, Any] | None = None,
    ):
        _require_trl()
        if max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1, got {max_turn_tokens}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 or None, got {max_turns}")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.fmt = fmt
        self.max_turns = max_turns
        self.max_turn_tokens = max_turn_tokens
        self.show_admissible = show_admissible
        self.format_instruction = format_instruction
        self.env_threads = env_threads
        self.parse_options = dict(parse_options or {})
        if env_id not in gym.registry:
            raise ValueError(f"unknown env id {env_id!r}; see agentgym.env_ids()")
        parse_action("", fmt, **self.parse_options)  # a bad format or option fails here
        self._env_pool: dict[tuple, list[gym.Env]] = {}
        self._chat: ChatTurns | None = None
        self._chat_key: tuple | None = None
        self.mode = EPISODE
        """how episodes are trained: ``"episode"`` (one sequence each; TRL's ``rollout_func``
        takes one completion per prompt)"""
        self.prefix_preserving: bool | None = None
        """whether the chat template renders earlier turns as sampled (set on the first call)"""
        self.records: list[EngineEpisode] = []
        """the last call's episodes as the engine recorded them"""

    # -- envs ------------------------------------------------------------------------------------
    def _make_env(self, spec: EpisodeSpec) -> gym.Env:
        env = gym.make(spec.env_id, disable_env_checker=True, **(spec.env_kwargs or {}))
        return ParseActions(env, self.fmt, **self.parse_options)

    def close(self) -> None:
        """Close the envs kept between calls (a later call builds them again)."""
        for pool in self._env_pool.values():
            for env in pool:
                env.close()
        self._env_pool.clear()

    # -- tokens ----------------------------------------------------------------------------------
    def chat(self, tokenizer: Any, trainer: Any) -> ChatTurns:
        """The trainer's chat template as :class:`~agentgym.integrations.chat.ChatTurns`, built
        once per tokenizer and template (its probe runs then, and its mode is logged).

        TRL's ``rollout_func`` takes one completion per prompt, so episodes are played as one
        sequence: each turn is sampled from the tokens trained (drift-free). A template that
        re-renders earlier turns (Qwen3 drops earlier ``<think>`` blocks) is played the same
        way, with the earlier turns kept as sampled; :attr:`prefix_preserving` says which.
        """
        template = getattr(trainer, "chat_template", None)
        kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
        key = (id(tokenizer), template, repr(sorted(kwargs.items())))
        if self._chat is None or self._chat_key != key:
            self._chat = ChatTurns(
                tokenizer,
                chat_template=template,
                template_kwargs=kwargs,
                end_ids=_as_list(getattr(trainer, "eos_token_ids", None)),
            )
            self._chat_key = key
            self.prefix_preserving = self._chat.prefix_preserving
            self._chat.observation_ids("")  # a template that cannot run as one sequence fails here
            logger.info(
                "GroupRollout: one sequence per episode; the chat template %s (%s)",
                "keeps earlier turns"
                if self._chat.prefix_preserving
                else "re-renders earlier turns, which are kept as sampled",
                self._chat.reason,
            )
        return self._chat

    # -- the rollout -----------------------------------------------------------------------------
    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        if getattr(trainer, "use_vllm", False):
            raise NotImplementedError(
                "GroupRollout generates with the trainer's transformers model; run with "
                "use_vllm=False, or use environment_factory (which TRL runs on vLLM)"
            )
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        training = trainer.model.training
        group_size = trainer.num_generations if training else trainer.num_generations_eval
        group_rows, group_size = _group_tasks(prompts, group_size)
        specs = []
        for g, row in enumerate(group_rows):
            seed, options = _reset_args(row)
            options = options or {}
            for m in range(group_size):
                spec = EpisodeSpec(
                    self.env_id, options.get("task"), seed, g, m, options.get("split"),
                    self.env_kwargs,
                )  # fmt: skip
                specs.append(spec)
        policy = _TrainerPolicy(self, trainer, tokenizer, prompts, group_size)
        engine = RolloutEngine(
            policy,
            SamplingParams(max_tokens=self.max_turn_tokens),
            concurrency=len(specs),
            max_turns=self.max_turns,
            lockstep=True,  # every turn of the running episodes in one generate call
            policy_version=getattr(getattr(trainer, "state", None), "global_step", None),
            env_threads=self.env_threads,
            make_env=self._make_env,
            env_pool=self._env_pool,
        )
        self.records = records = _run_sync(engine.run(specs))
        tokens = [policy.tokens(record) for record in records]
        rewards = [[turn.reward for turn in record.turns] for record in records]
        return {
            "prompt_ids": [t.prompt_ids for t in tokens],
            "completion_ids": [t.response_ids for t in tokens],
            "logprobs": [t.response_logprobs for t in tokens],
            "env_mask": [t.response_mask for t in tokens],
            "env_return": [float(sum(r)) for r in rewards],
            "won": [record.won for record in records],
            "task_id": [record.task_id for record in records],
            "initial_state_key": [t.state_keys[0] if t.state_keys else None for t in tokens],
            "state_keys": [t.state_keys for t in tokens],
            "step_rewards": rewards,
            "turn_spans": [[list(span) for span in t.turn_spans] for t in tokens],
        }


def _run_sync(coroutine: Any) -> Any:
    """Run ``coroutine`` to the end from synchronous code (in a thread of its own when this
    thread already runs an event loop, as in a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class _TrainerPolicy(ChatPolicy):
    """``trainer``'s model as the engine's policy for one :class:`GroupRollout` call.

    The turns the engine asks for together (lockstep: all running episodes) are gathered into
    one left-padded ``generate`` call, run when the event loop has queued them all.
    """

    def __init__(
        self, rollout: GroupRollout, trainer: Any, tokenizer: Any, prompts: list[Any], size: int
    ):
        super().__init__(
            rollout.chat(tokenizer, trainer), response_length=int(trainer.max_completion_length)
        )
        self.rollout = rollout
        self.trainer = trainer
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.group_size = size
        self._pending: list[tuple[list[int], int, asyncio.Future]] = []

    def first_messages(
        self, spec: EpisodeSpec, observation: str, info: dict[str, Any]
    ) -> list[dict[str, Any]]:
        prompt = self.prompts[spec.group * self.group_size + spec.member]
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
        messages[-1]["content"] += self.observation_text(observation, info)
        if self.rollout.format_instruction:
            messages[-1]["content"] += "\n" + FORMAT_INSTRUCTIONS[self.rollout.fmt]
        return messages

    def observation_text(self, observation: str, info: dict[str, Any]) -> str:
        admissible = info.get("admissible_actions")
        if self.rollout.show_admissible and admissible:
            return f"{observation}\nAdmissible actions: {', '.join(admissible)}"
        return observation

    async def sample(
        self, prompt_ids: list[int], max_tokens: int
    ) -> tuple[list[int], list[float] | None]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((prompt_ids, max_tokens, future))
        if len(self._pending) == 1:  # after the turns queued in this round of the loop
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        try:
            results = self._generate([b[0] for b in batch], max(b[1] for b in batch))
        except Exception as exc:  # noqa: BLE001 - every waiting turn gets the failure
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, _, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    def _generate(
        self, contexts: list[list[int]], max_new_tokens: int
    ) -> list[tuple[list[int], list[float]]]:
        """One turn for each context: new token ids (up to and including EOS) and their log-probs."""
        import torch
        from trl.models import unwrap_model_for_generation

        trainer, tokenizer = self.trainer, self.tokenizer
        device = trainer.accelerator.device
        width = max(len(c) for c in contexts)
        pad = tokenizer.pad_token_id
        input_ids = torch.full((len(contexts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(contexts), width), dtype=torch.long)
        for row, ids in enumerate(contexts):  # left padding: generation continues at the right
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        config = copy.deepcopy(trainer.generation_config)
        config.max_new_tokens = max_new_tokens
        recorder = _SampledLogProbs(float(config.temperature or 1.0))
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                generation_kwargs=getattr(trainer, "generation_kwargs", None),
            ) as model,
            torch.no_grad(),
        ):
            sequences = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                generation_config=config,
                logits_processor=[recorder],
            )
        new = sequences[:, width:]
        logps = recorder.result(new).cpu()
        new = new.cpu()
        out = []
        eos = torch.tensor(sorted(self.chat.end_ids))
        for row in range(new.shape[0]):
            hits = torch.isin(new[row], eos).nonzero()
            end = int(hits[0]) + 1 if len(hits) else new.shape[1]
            out.append((new[row, :end].tolist(), logps[row, :end].tolist()))
        return out


class _SampledLogProbs:
    """A logits processor that keeps the log-prob of each sampled token, ``(B, T)`` in the end.

    Log-probs are of ``logits / temperature``, as TRL scores tokens in training (custom
    processors run before the sampling warpers). Holding one step's ``(B, vocab)`` at a time
    instead of asking ``generate`` for all scores keeps memory at ``B x vocab``, not
    ``B x T x vocab`` (gigabytes for a real vocabulary and long turns).
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous = None  # log-softmax of the last step, until its token is known
        self.picked: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.previous is not None:  # input_ids now ends with the token sampled last step
            self.picked.append(self.previous.gather(-1, input_ids[:, -1:])[:, 0])
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def result(self, new_tokens: Any) -> Any:
        """``(B, T)`` log-probs of ``new_tokens`` (the last token's step has no later call)."""
        import torch

        if self.previous is not None and len(self.picked) < new_tokens.shape[1]:
            last = new_tokens[:, len(self.picked) : len(self.picked) + 1]
            self.picked.append(self.previous.gather(-1, last)[:, 0])
        return torch.stack(self.picked, dim=1)


def _prompt_task(prompt: Any) -> dict[str, Any]:
    """The task fields (``task_id`` / ``seed`` / ``split``) carried by a prompt's last message."""
    if not isinstance(prompt, Sequence) or isinstance(prompt, str) or not prompt:
        raise ValueError(
            "GroupRollout needs conversational prompts whose last message names the task; "
            "build the dataset with agentgym.integrations.trl.build_dataset(env_id, num_tasks)"
        )
    last = prompt[-1]
    row = {k: last.get(k) for k in (TASK_COLUMN, SEED_COLUMN, SPLIT_COLUMN)}
    _reset_args(row)  # a prompt that names no task is refused here, with what to do
    return row


def _group_tasks(prompts: list[Any], num_generations: int) -> tuple[list[dict[str, Any]], int]:
    """``(task of each group, group size)`` for a process's prompts.

    TRL's sampler repeats each prompt ``num_generations`` times in a row; with several processes,
    one process may hold only part of a prompt's repeats. Groups are therefore runs of
    ``gcd(len(prompts), num_generations)`` prompts, each run one task; a prompt split over two
    runs (or two processes) still starts every env from the same state, since every agentgym
    family's initial state is fixed by its task.
    """
    if not prompts:
        raise ValueError("got no prompts")
    rows = [_prompt_task(p) for p in prompts]
    size = math.gcd(len(rows), num_generations)
    groups = []
    for start in range(0, len(rows), size):
        members = rows[start : start + size]
        if any(m != members[0] for m in members):
            raise ValueError(
                f"prompts {start}..{start + size - 1} should repeat one prompt (TRL repeats each "
                f"prompt num_generations={num_generations} times in a row), got tasks {members}"
            )
        groups.append(members[0])
    return groups, size


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple, set)) else [value]
