"""Train on agentgym envs with verl (>= 0.9): a multi-turn agent loop and a GiGPO estimator.

verl runs multi-turn agents through its *agent loop* (``verl.experimental.agent_loop``): for each
dataset row it awaits ``AgentLoopBase.run(sampling_params, **row) -> AgentLoopOutput``, which talks
to verl's LLM servers token in, token out. This module provides

- :data:`AGENT_NAME` (``"agentgym_agent"``), the agent loop :class:`AgentGymAgentLoop`: it plays one
  agentgym episode through the library's engine (:class:`agentgym.engine.RolloutEngine`; env id
  and seed from the row, prompts rendered by :func:`agentgym.wrappers.make_llm_env` through the
  tokenizer's chat template, verl's server manager as the policy) and returns the
  whole episode as one response whose ``response_mask`` is 1 on the model's tokens and 0 on the
  env's observations. ``extra_fields`` carry each turn's token span, ``state_key``, reward and
  validity (keys in :data:`EXTRA_KEYS`); ``reward_score`` is the episode's total reward;
- :data:`ESTIMATOR_NAME` (``"agentgym_gigpo"``), the advantage estimator
  :func:`compute_gigpo_advantage` with the signature verl's ``compute_advantage`` calls: it turns
  the spans and state keys into token-level advantages with the project's one GiGPO
  implementation (:mod:`agentgym.algorithms.advantage`);
- :func:`build_dataset`: dataset rows (one per task seed) verl's ``RLHFDataset`` reads;
- :class:`EpisodeRunner` and :class:`LocalHFServer`: the loop's verl-free core (one engine run
  per episode, its record turned into an :class:`Episode`) and a Hugging Face stand-in for
  verl's LLM server, to play and inspect episodes on a CPU.

Wiring it into a verl run (see ``examples/verl_agent_loop.py`` for the full command)::

    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.agent.default_agent_loop=agentgym_agent
    algorithm.adv_estimator=agentgym_gigpo algorithm.gamma=0.95
    algorithm.norm_adv_by_std_in_grpo=False   # the paper's mean_norm
    trainer.use_v1=False
    +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=agentgym.integrations.verl.setup_verl_worker

verl builds agent loops and computes advantages in Ray worker processes, so registration happens
there through :func:`setup_verl_worker` (Ray runs it when each worker starts). verl 0.9.1 hands a
custom estimator only token tensors and the group ``uid``; :func:`patch_compute_advantage` (called
by the hook) also hands it the batch's ``non_tensor_batch``, where the per-turn fields live. Its
v1 trainer fetches a fixed list of fields for the advantage step and cannot, hence
``trainer.use_v1=False``.

verl is imported only when an adapter needs it; without it, one line says what to install.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import uuid4

import numpy as np

from agentgym.algorithms.advantage import advantage_estimator, compute_advantage
from agentgym.engine import EpisodeSpec, RolloutEngine, SamplingParams
from agentgym.extras import missing_extra
from agentgym.integrations.chat import EPISODE, MODES, ChatPolicy, ChatTurns, EpisodeTokens
from agentgym.wrappers.llm import make_llm_env

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "AGENT_NAME",
    "ESTIMATOR_NAME",
    "EXTRA_KEYS",
    "Episode",
    "EpisodeRunner",
    "LocalHFServer",
    "build_dataset",
    "compute_gigpo_advantage",
    "episode_spec",
    "patch_compute_advantage",
    "register_verl_estimator",
    "setup_verl_worker",
]

logger = logging.getLogger(__name__)

AGENT_NAME = "agentgym_agent"
"""the agent loop's name in verl's registry (``rollout.agent.default_agent_loop``)"""
ESTIMATOR_NAME = "agentgym_gigpo"
"""the estimator's name in verl's registry (``algorithm.adv_estimator``)"""

#: ``extra_fields`` of every episode (they become columns of verl's ``non_tensor_batch``):
#: ``turn_spans`` list of (start, end) response-token ranges of the model's turns, end exclusive;
#: ``state_keys`` the ``state_key`` each turn acted from; ``turn_rewards`` the env reward of each
#: turn; ``turn_valid`` whether the env accepted each turn's action; ``episode_reward`` their
#: sum; ``won``, ``task_id``, ``env_id``: the episode's outcome and task.
EXTRA_KEYS = (
    "agentgym_turn_spans",
    "agentgym_state_keys",
    "agentgym_turn_rewards",
    "agentgym_turn_valid",
    "agentgym_episode_reward",
    "agentgym_won",
    "agentgym_task_id",
    "agentgym_env_id",
)
_SPANS, _KEYS, _REWARDS, _VALID = EXTRA_KEYS[:4]


def _require_verl() -> None:
    """Raise one line naming the extra when verl (or a module it needs) is not installed."""
    try:
        import verl.experimental.agent_loop.agent_loop  # noqa: F401
        import verl.trainer.ppo.core_algos  # noqa: F401
    except ImportError as exc:
        raise missing_extra("agentgym.integrations.verl", exc.name or "verl", "verl") from None


# ----------------------------------------------------------------------------------------------
# dataset rows
# ----------------------------------------------------------------------------------------------
def episode_spec(row: dict[str, Any]) -> dict[str, Any]:
    """``{"env_id", "seed", "task", "split", "env_kwargs"}`` from a dataset row's fields.

    The fields are read from the row itself or from its ``extra_info`` dict (where verl's
    ``RLHFDataset`` keeps per-row data). A row must name an ``env_id`` and a ``seed`` or ``task``:
    verl repeats a row ``rollout.n`` times, and the same seed (or task) is what makes every rollout
    of the group start from the same task and initial state, which GiGPO's groups rely on.
    """
    extra = row.get("extra_info")
    sources = [row, extra] if isinstance(extra, dict) else [row]

    def pick(key: str) -> Any:
        return next((s[key] for s in sources if s.get(key) is not None), None)

    env_id, seed, task = pick("env_id"), pick("seed"), pick("task")
    if env_id is None or (seed is None and task is None):
        raise ValueError(
            "the dataset row needs 'env_id' and a 'seed' or 'task' (top level or in "
            "'extra_info') so every rollout of a group plays the same task; build rows with "
            "agentgym.integrations.verl.build_dataset(env_id, num_tasks)"
        )
    return {
        "env_id": str(env_id),
        "seed": None if seed is None else int(seed),
        "task": task,
        "split": pick("split"),
        "env_kwargs": dict(pick("env_kwargs") or {}),
    }


def build_dataset(
    env_id: str,
    num_tasks: int,
    *,
    first_seed: int = 0,
    split: str | None = None,
    history_length: int = 0,
    env_kwargs: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Dataset rows for verl: one per task seed ``first_seed .. first_seed + num_tasks - 1``.

    Each row has ``prompt`` (the episode's first prompt as a chat, which verl's ``RLHFDataset``
    needs for its length filter and logs), ``agent_name`` (:data:`AGENT_NAME`), ``data_source``
    (the env id) and ``extra_info`` (``env_id``, ``seed``, and ``split`` and ``env_kwargs`` when
    given), the fields :func:`episode_spec` reads back. Write them to parquet with
    ``pandas.DataFrame(rows).to_parquet(path)``.
    """
    env = make_llm_env(env_id, history_length=history_length, env_kwargs=env_kwargs)
    rows = []
    try:
        for seed in range(first_seed, first_seed + num_tasks):
            options = {"split": split} if split is not None else None
            prompt, _ = env.reset(seed=seed, options=options)
            rows.append(
                {
                    "data_source": env_id,
                    "agent_name": AGENT_NAME,
                    "prompt": [{"role": "user", "content": prompt}],
                    # Only set fields: parquet cannot store an empty struct.
                    "extra_info": {
                        "env_id": env_id,
                        "seed": seed,
                        "index": seed,  # verl's RLHFDataset logs rows by this
                        **({"split": split} if split is not None else {}),
                        **({"env_kwargs": dict(env_kwargs)} if env_kwargs else {}),
                    },
                }
            )
    finally:
        env.close()
    return rows


# ----------------------------------------------------------------------------------------------
# the episode runner (verl-free core of the agent loop)
# ----------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class Episode(EpisodeTokens):
    """One played episode as verl trains on it: a prompt and a multi-turn response, laid out as
    :class:`~agentgym.integrations.chat.EpisodeTokens` says (in ``"episode"`` mode, the model's
    turns with ``response_mask`` 1 between the env's replies with 0; in ``"per_turn"`` mode,
    :meth:`sequences` gives one training sequence per turn), with each turn's reward, validity
    and text, and the episode's outcome.
    """

    turn_rewards: list[float]
    turn_valid: list[bool]
    turn_texts: list[str]
    won: bool
    terminated: bool
    truncated: bool
    task_id: str
    env_id: str
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def reward(self) -> float:
        """The episode's total env reward (``reward_score`` for verl)."""
        return float(sum(self.turn_rewards))

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)

    def extra_fields(self) -> dict[str, Any]:
        """The :data:`EXTRA_KEYS` fields, as the agent loop puts them in ``extra_fields``."""
        return dict(
            zip(
                EXTRA_KEYS,
                (
                    self.turn_spans,
                    self.state_keys,
                    self.turn_rewards,
                    self.turn_valid,
                    self.reward,
                    self.won,
                    self.task_id,
                    self.env_id,
                ),
                strict=True,
            )
        )


#: Envs kept for reuse by every runner in the process (verl builds one agent loop per row), by
#: the runners' LLM-wrapper options; the engine keys each pool by env id and env kwargs. A
#: training run plays thousands of episodes: making an env builds wrappers and spaces.
_ENV_POOLS: dict[str, dict[tuple, list[Any]]] = {}


class EpisodeRunner:
    """Play agentgym episodes against an LLM server, token in, token out, through the engine.

    Each :meth:`run` plays one episode with :class:`~agentgym.engine.RolloutEngine`, whose
    policy is the server (:class:`~agentgym.integrations.chat.ChatPolicy`), and turns the
    engine's record into an :class:`Episode`.

    ``server`` is anything with verl's ``LLMServerClient.generate`` signature::

        await server.generate(request_id, *, prompt_ids=list[int], sampling_params=dict, ...)

    returning an object with ``token_ids`` (the new tokens) and optionally ``log_probs``. The
    loop sends the whole context (prompt and response so far) every turn, under one
    ``request_id`` per episode so verl's router keeps it on one server (prefix caching).

    Each turn's model text is decoded (special tokens dropped) and stepped through
    :func:`~agentgym.wrappers.make_llm_env`'s parser: text that does not parse is an invalid turn
    (``turn_valid`` False), never an error. The next observation joins the conversation as a
    user message, rendered by the env family's prompt template; ``history_length`` defaults to 0
    because the conversation itself already holds the earlier turns.

    **Modes** (:mod:`agentgym.integrations.chat`): in ``"episode"`` mode the context of each
    turn is the previous context, the sampled tokens and the observation's tokens, so the episode
    is one sequence; in ``"per_turn"`` mode each turn's prompt is the chat template's rendering
    of the conversation so far (the turns' decoded text as assistant messages), for templates
    that re-render earlier turns (Qwen3 drops earlier ``<think>`` blocks). ``mode="auto"`` picks
    per template (:attr:`ChatTurns.mode`, found once by rendering a probe chat) and logs it;
    :attr:`mode` says which runs.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        server: the LLM server, see above.
        prompt_length: most prompt tokens; a longer first prompt is cut from the left.
        response_length: most response tokens (model turns and observations together); the
            episode ends truncated when they run out.
        max_turns: most model turns (None: until the env ends the episode).
        max_turn_tokens: most tokens of one model turn (None: what is left of the budget).
        history_length, template, fmt: passed to :func:`~agentgym.wrappers.make_llm_env`.
        chat_template_kwargs: extra arguments of ``apply_chat_template``.
        mode: ``"auto"``, ``"episode"`` or ``"per_turn"`` (see above).
        end_ids: token ids that end a model turn besides the tokenizer's EOS.
    """

    def __init__(
        self,
        tokenizer: Any,
        server: Any,
        *,
        prompt_length: int,
        response_length: int,
        max_turns: int | None = None,
        max_turn_tokens: int | None = None,
        history_length: int = 0,
        template: str | None = None,
        fmt: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        mode: str = "auto",
        end_ids: Sequence[int] | None = None,
    ) -> None:
        if mode not in ("auto", *MODES):
            raise ValueError(f"mode must be 'auto', 'episode' or 'per_turn', got {mode!r}")
        if prompt_length <= 0 or response_length <= 0:
            raise ValueError(
                f"prompt_length and response_length must be positive, got {prompt_length} "
                f"and {response_length}"
            )
        self.tokenizer = tokenizer
        self.server = server
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.max_turns = max_turns
        self.max_turn_tokens = max_turn_tokens
        self.llm_kwargs = {"history_length": history_length, "template": template, "fmt": fmt}
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.eos_id = tokenizer.eos_token_id
        self.chat = ChatTurns(tokenizer, template_kwargs=chat_template_kwargs, end_ids=end_ids)
        self.mode = self.chat.mode if mode == "auto" else mode
        if self.mode == EPISODE:
            self.chat.observation_ids("")  # a template that cannot run this way fails here
        logger.info("EpisodeRunner plays %s mode (%s)", self.mode, self.chat.reason)

    def observation_ids(self, text: str) -> list[int]:
        """Tokens that follow a finished assistant turn: ``text`` as a user message, then the
        assistant header (:meth:`ChatTurns.observation_ids`)."""
        return self.chat.observation_ids(text)

    def _make_env(self, spec: EpisodeSpec) -> Any:
        return make_llm_env(spec.env_id, env_kwargs=spec.env_kwargs, **self.llm_kwargs)

    async def run(
        self,
        sampling_params: dict[str, Any],
        *,
        env_id: str,
        seed: int | None = None,
        task: Any = None,
        split: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        request_id: str | None = None,
    ) -> Episode:
        """Play one episode from ``env.reset(seed, options={"task", "split"})``; see the class.

        Raises:
            RuntimeError: the env failed to build, reset or step (its error is named).
        """
        policy = _ServerPolicy(self, sampling_params, request_id or uuid4().hex)
        engine = RolloutEngine(
            policy,
            SamplingParams(max_tokens=self.max_turn_tokens or self.response_length),
            concurrency=1,
            max_turns=self.max_turns,
            env_threads=1,
            make_env=self._make_env,
            env_pool=_ENV_POOLS.setdefault(repr(sorted(self.llm_kwargs.items())), {}),
        )
        spec = EpisodeSpec(env_id, task, seed, split=split, env_kwargs=dict(env_kwargs or {}))
        (record,) = await engine.run([spec])
        return Episode(
            **vars(policy.tokens(record)),
            turn_rewards=[t.reward for t in record.turns],
            turn_valid=[t.action_valid for t in record.turns],
            turn_texts=[t.text for t in record.turns],
            won=record.won,
            terminated=record.terminated,
            truncated=record.truncated,
            task_id=str(record.task_id or ""),
            env_id=env_id,
            timing={
                "generate_sequences": engine.stats.generation_s,
                "env_steps": engine.stats.env_s,
            },
        )


class _ServerPolicy(ChatPolicy):
    """A verl LLM server as the engine's policy for one :meth:`EpisodeRunner.run`: every turn
    goes to ``server.generate`` with verl's sampling parameters and the turn's token budget."""

    def __init__(self, runner: EpisodeRunner, sampling_params: dict[str, Any], request_id: str):
        super().__init__(
            runner.chat,
            response_length=runner.response_length,
            mode=runner.mode,
            prompt_length=runner.prompt_length,
            keep_cut_reply=True,  # verl's response ends with what fits of the last observation
        )
        self.server = runner.server
        self.sampling_params = dict(sampling_params)
        self.request_id = request_id

    async def sample(
        self, prompt_ids: list[int], max_tokens: int
    ) -> tuple[list[int], list[float] | None]:
        params = {**self.sampling_params, "max_tokens": max_tokens}
        out = await self.server.generate(
            self.request_id, prompt_ids=prompt_ids, sampling_params=params
        )
        logprobs = getattr(out, "log_probs", None)
        return list(out.token_ids), None if logprobs is None else list(logprobs)


class LocalHFServer:
    """A stand-in for verl's LLM server that generates with a Hugging Face causal LM in-process.

    Same ``generate`` signature as verl's ``LLMServerClient`` (the subset the agent loop uses),
    so :class:`EpisodeRunner` and :class:`AgentGymAgentLoop` run unchanged on a CPU: for
    debugging prompts and masks, tests and small examples. Reads ``max_tokens``,
    ``temperature`` (0 = greedy) and ``top_p`` from ``sampling_params``; returns an object with
    ``token_ids`` and ``log_probs`` (of the sampled tokens under the sampling distribution).
    One generation at a time (a lock), on the event loop's default executor.
    """

    def __init__(self, model: Any, tokenizer: Any, *, seed: int = 0) -> None:
        import torch

        self.model = model.eval()
        self.tokenizer = tokenizer
        self._generator = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **_: Any,
    ) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._generate, list(prompt_ids), sampling_params)

    def _generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        from types import SimpleNamespace

        import torch

        max_tokens = int(sampling_params.get("max_tokens", 64))
        temperature = float(sampling_params.get("temperature", 1.0))
        top_p = float(sampling_params.get("top_p", 1.0))
        eos = self.tokenizer.eos_token_id
        tokens: list[int] = []
        logprobs: list[float] = []
        with self._lock, torch.no_grad():
            ids = torch.tensor([prompt_ids])
            cache = None
            for _ in range(max_tokens):
                out = self.model(input_ids=ids, cache=cache, use_cache=True)
                cache = out.cache
                logits = out.logits[0, -1].float()
                if temperature <= 0:
                    probs = torch.zeros_like(logits)
                    probs[logits.argmax()] = 1.0
                else:
                    probs = torch.softmax(logits / temperature, dim=-1)
                    if top_p < 1.0:
                        sorted_p, order = probs.sort(descending=True)
                        drop = sorted_p.cumsum(0) - sorted_p > top_p
                        probs[order[drop]] = 0.0
                        probs /= probs.sum()
                token = int(torch.multinomial(probs, 1, generator=self._generator))
                tokens.append(token)
                logprobs.append(float(torch.log(probs[token])))
                if token == eos:
                    break
                ids = torch.tensor([[token]])
        return SimpleNamespace(token_ids=tokens, log_probs=logprobs, stop_reason="completed")


# ----------------------------------------------------------------------------------------------
# the verl agent loop (built on first use: verl is imported only then)
# ----------------------------------------------------------------------------------------------
@functools.cache
def _agent_loop_class() -> type:
    _require_verl()
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        register,
    )

    class AgentGymAgentLoop(AgentLoopBase):
        """verl agent loop that plays one agentgym episode per dataset row (see the module doc).

        Keyword options (set them as keys of the loop's entry in ``agent_loop_config_path``):
        ``max_episode_steps`` (the env's step cap, as ``gym.make(id, max_episode_steps=N)``;
        default: the id's; a row's ``env_kwargs`` may set its own; ``max_turns`` is its deprecated
        name), ``max_turn_tokens``,
        ``history_length`` (0), ``template`` and ``fmt`` (the env family's defaults), and
        ``end_ids`` (token ids that end a model turn besides EOS, e.g. Gemma 3's
        ``<end_of_turn>``; a template whose turns end otherwise is refused at start, saying so).
        """

        def __init__(
            self,
            *args: Any,
            max_episode_steps: int | None = None,
            max_turn_tokens: int | None = None,
            history_length: int = 0,
            template: str | None = None,
            fmt: str | None = None,
            end_ids: list[int] | None = None,
            max_turns: int | None = None,
            **kwargs: Any,
        ) -> None:
            if max_turns is not None:
                warnings.warn(
                    "the agent loop option max_turns is deprecated: use max_episode_steps",
                    DeprecationWarning,
                    stacklevel=2,
                )
                max_episode_steps = max_turns if max_episode_steps is None else max_episode_steps
            kwargs.pop("name", None)  # the entry's own name in agent_loop_config_path
            kwargs.pop("tools", None)  # verl's tool list; agentgym envs bring their own actions
            super().__init__(*args, **kwargs)
            self.max_episode_steps = max_episode_steps
            multi_turn = self.rollout_config.get("multi_turn", None)
            # verl's own cap on model turns; the env's step cap is max_episode_steps
            max_turns = None if multi_turn is None else multi_turn.get("max_assistant_turns", None)
            self.runner = EpisodeRunner(
                self.tokenizer,
                self.server_manager,
                prompt_length=self.rollout_config.prompt_length,
                response_length=self.rollout_config.response_length,
                max_turns=max_turns,
                max_turn_tokens=max_turn_tokens,
                history_length=history_length,
                template=template,
                fmt=fmt,
                chat_template_kwargs=dict(self.apply_chat_template_kwargs or {}),
                # verl's agent loop returns one sequence per dataset row, so episodes are played
                # as one: each turn sampled from the tokens trained (drift-free); a template that
                # re-renders earlier turns (Qwen3's <think>) keeps them as sampled (logged).
                mode=EPISODE,
                end_ids=end_ids,
            )

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            spec = episode_spec(kwargs)
            if self.max_episode_steps is not None:
                spec["env_kwargs"].setdefault("max_episode_steps", self.max_episode_steps)
            episode = await self.runner.run(sampling_params, **spec)
            metrics = AgentLoopMetrics(
                generate_sequences=episode.timing["generate_sequences"],
                tool_calls=episode.timing["env_steps"],
            )
            return AgentLoopOutput(
                prompt_ids=episode.prompt_ids,
                response_ids=episode.response_ids,
                response_mask=episode.response_mask,
                response_logprobs=episode.response_logprobs,
                reward_score=episode.reward,
                num_turns=2 * episode.num_turns + 1,  # user + assistant turns, as verl counts
                metrics=metrics,
                extra_fields=episode.extra_fields(),
            )

    # verl's registry stores the import path; make it the module attribute hydra resolves.
    AgentGymAgentLoop.__module__ = __name__
    AgentGymAgentLoop.__qualname__ = "AgentGymAgentLoop"
    return register(AGENT_NAME)(AgentGymAgentLoop)


def __getattr__(name: str) -> Any:
    # ``AgentGymAgentLoop`` subclasses verl's AgentLoopBase, so it exists only once verl imports;
    # hydra's ``_target_: agentgym.integrations.verl.AgentGymAgentLoop`` resolves it here.
    if name == "AgentGymAgentLoop":
        return _agent_loop_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------
# the GiGPO estimator
# ----------------------------------------------------------------------------------------------
def _option(config: Any, key: str, default: Any) -> Any:
    """``config.gigpo[key]`` where verl's algorithm config carries a ``gigpo`` section."""
    section = None
    if config is not None:
        getter = getattr(config, "get", None)
        section = getter("gigpo", None) if callable(getter) else getattr(config, "gigpo", None)
    if section is None:
        return default
    value = section.get(key, None) if hasattr(section, "get") else getattr(section, key, None)
    return default if value is None else value


def _option_attr(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    value = getter(key, None) if callable(getter) else getattr(config, key, None)
    return default if value is None else value


def compute_gigpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | Sequence[Any] | None = None,
    config: Any = None,
    non_tensor_batch: dict[str, np.ndarray] | None = None,
    gamma: float | None = None,
    norm_adv_by_std_in_grpo: bool | None = None,
    estimator: str = "gigpo",
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO token-level advantages for episodes played by :class:`AgentGymAgentLoop`.

    Every model turn of every episode is one row of :func:`agentgym.algorithms.compute_advantage`
    (group = the row's ``uid``, trajectory = the batch row, step = the turn, reward = the turn's
    env reward, anchor state = its ``state_key``, invalid = not ``turn_valid``); each turn's
    advantage ``A_episode + omega * A_step`` (Eq. 8) then goes to every token of its span.

    Args:
        token_level_rewards: (bs, response_length); only its shape is checked: the per-turn
            rewards come from ``non_tensor_batch`` (verl's copy holds their sum on the last token).
        response_mask: (bs, response_length), 1 on model tokens.
        index: (bs,) group ids (verl's ``uid``: the rollouts of one dataset row).
        config: verl's algorithm config; reads ``gamma`` and ``norm_adv_by_std_in_grpo`` when not
            given, and ``gigpo.{omega, invalid_penalty, episode_stats_over, norm}`` when present
            (``+algorithm.gigpo.omega=0.5``; ``gigpo.norm`` overrides the std switch).
        non_tensor_batch: the batch's per-row fields, holding :data:`EXTRA_KEYS`.
        gamma: discount of step returns (Eq. 5); default ``config.gamma``, else 0.95.
        norm_adv_by_std_in_grpo: ``mean_std_norm`` when true (verl's default), else ``mean_norm``.
        estimator: ``"gigpo"``, or ``"grpo"`` for the episode advantage alone.

    Returns:
        ``(advantages, returns)``: float32 (bs, response_length) on ``response_mask``'s device,
        zero outside model tokens; ``returns`` holds each turn's discounted return.

    Raises:
        ValueError: ``non_tensor_batch`` lacks the agentgym fields (with how to provide them),
            or they do not match the batch.
    """
    import torch

    if non_tensor_batch is None or _SPANS not in non_tensor_batch:
        raise ValueError(
            f"the {ESTIMATOR_NAME} estimator needs the per-turn fields of agentgym episodes "
            f"({', '.join(EXTRA_KEYS[:4])}) from non_tensor_batch: roll out with the "
            f"'{AGENT_NAME}' agent loop and call agentgym.integrations.verl."
            "patch_compute_advantage() in the trainer process (setup_verl_worker does; verl's "
            "v1 trainer does not pass these fields, set trainer.use_v1=False)"
        )
    if index is None:
        index = non_tensor_batch.get("uid")
    bs, length = response_mask.shape
    if tuple(token_level_rewards.shape) != (bs, length):
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{(bs, length)} must have the same shape (bs, response_length)"
        )
    spans_per_row = non_tensor_batch[_SPANS]
    if index is None or len(index) != bs or len(spans_per_row) != bs:
        raise ValueError(
            f"index (uid) and {_SPANS} must have one entry per batch row ({bs}); "
            f"got {None if index is None else len(index)} and {len(spans_per_row)}"
        )
    if gamma is None:
        gamma = float(_option_attr(config, "gamma", 0.95))
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = bool(_option_attr(config, "norm_adv_by_std_in_grpo", True))
    norm = _option(config, "norm", "mean_std_norm" if norm_adv_by_std_in_grpo else "mean_norm")
    # The options this estimator takes (grpo has no omega), from the gigpo section or defaults.
    spec = advantage_estimator(estimator)
    defaults = spec.options()
    options: dict[str, Any] = {"gamma": gamma, "norm": norm}
    for key, cast in (("omega", float), ("invalid_penalty", float), ("episode_stats_over", str)):
        if key in spec.option_names():
            options[key] = cast(_option(config, key, getattr(defaults, key)))

    # Flat turn rows, row-major (C-level chains; no Python loop over turns).
    turns = np.fromiter(map(len, spans_per_row), np.int64, count=bs)
    n = int(turns.sum())
    row_of_turn = np.repeat(np.arange(bs), turns)
    step_ids = np.arange(n) - np.repeat(np.cumsum(turns) - turns, turns)
    spans = np.fromiter(
        itertools.chain.from_iterable(itertools.chain.from_iterable(spans_per_row)),
        np.int64,
        count=2 * n,
    ).reshape(n, 2)
    rewards = np.fromiter(
        itertools.chain.from_iterable(non_tensor_batch[_REWARDS]), np.float64, count=n
    )
    valid = np.fromiter(itertools.chain.from_iterable(non_tensor_batch[_VALID]), np.bool_, count=n)
    keys = list(itertools.chain.from_iterable(non_tensor_batch[_KEYS]))
    if len(keys) != n:
        raise ValueError(f"{_KEYS} holds {len(keys)} keys for {n} turns; one per turn is needed")
    _, group_of_row = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
    result = compute_advantage(
        estimator,
        group_ids=group_of_row.reshape(-1)[row_of_turn],
        traj_ids=row_of_turn,
        step_ids=step_ids,
        rewards=rewards,
        state_keys=keys,
        invalid=~valid,
        **options,
    )

    # Broadcast turn values to their spans, touching span tokens only: the flat positions of all
    # span tokens are one repeat + arange (each turn's run restarts at its start).
    starts = np.clip(spans[:, 0], 0, length)
    sizes = np.clip(spans[:, 1], starts, length) - starts
    total = int(sizes.sum())
    run_start = np.cumsum(sizes) - sizes
    cols = torch.from_numpy(np.repeat(starts - run_start, sizes) + np.arange(total))
    rows = torch.from_numpy(np.repeat(row_of_turn, sizes))
    mask = response_mask.to(torch.float32).cpu()
    out = []
    for per_turn in (result.advantages, result.returns):
        tokens = torch.zeros(bs, length, dtype=torch.float32)
        tokens[rows, cols] = torch.from_numpy(np.repeat(per_turn.astype(np.float32), sizes))
        out.append((tokens * mask).to(response_mask.device))
    return out[0], out[1]


def register_verl_estimator() -> Callable[..., Any]:
    """Register :func:`compute_gigpo_advantage` in verl as :data:`ESTIMATOR_NAME` (idempotent)."""
    _require_verl()
    from verl.trainer.ppo import core_algos

    return core_algos.register_adv_est(ESTIMATOR_NAME)(compute_gigpo_advantage)


def patch_compute_advantage() -> None:
    """Let verl's ``compute_advantage`` give :data:`ESTIMATOR_NAME` the whole batch.

    verl 0.9.1 calls a registered estimator with token tensors and ``uid`` only (it passes
    ``non_tensor_batch`` to its own ``gdpo`` alone). This wraps ``compute_advantage`` in verl's
    trainer modules: batches for :data:`ESTIMATOR_NAME` are computed here with their
    ``non_tensor_batch``; every other estimator goes to verl's function unchanged. Idempotent.
    """
    _require_verl()
    import verl.trainer.ppo.ray_trainer as ray_trainer

    modules = [ray_trainer]
    try:
        import verl.trainer.ppo.v1.utils as v1_utils

        modules.append(v1_utils)
    except ImportError:  # pragma: no cover - releases without the v1 trainer
        pass
    for module in modules:
        original = module.compute_advantage
        if getattr(original, "_agentgym_patched", False):
            continue
        module.compute_advantage = _wrap_compute_advantage(original)


def _wrap_compute_advantage(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(adv_estimator, "value", adv_estimator)
        if name != ESTIMATOR_NAME:
            return original(data, adv_estimator, *args, **kwargs)
        from verl.trainer.ppo.ray_trainer import compute_response_mask

        # verl's positional order after adv_estimator (ray_trainer.compute_advantage).
        names = ("gamma", "lam", "num_repeat", "norm_adv_by_std_in_grpo", "config")
        bound = dict(zip(names, args, strict=False))
        bound.update(kwargs)
        if "response_mask" not in data.batch.keys():
            data.batch["response_mask"] = compute_response_mask(data)
        advantages, returns = compute_gigpo_advantage(
            token_level_rewards=data.batch["token_level_rewards"],
            response_mask=data.batch["response_mask"],
            index=data.non_tensor_batch.get("uid"),
            config=bound.get("config"),
            non_tensor_batch=data.non_tensor_batch,
            gamma=bound.get("gamma"),
            norm_adv_by_std_in_grpo=bound.get("norm_adv_by_std_in_grpo"),
        )
        data.batch["advantages"] = advantages
        data.batch["returns"] = returns
        return data

    compute_advantage._agentgym_patched = True  # type: ignore[attr-defined]
    return compute_advantage


def setup_verl_worker() -> None:
    """Ray ``worker_process_setup_hook``: register the agent loop and the estimator, and patch
    ``compute_advantage``, in every verl worker process (agent-loop workers and the trainer)."""
    _agent_loop_class()
    register_verl_estimator()
    patch_compute_advantage()
