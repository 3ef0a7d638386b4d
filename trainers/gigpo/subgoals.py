"""HiPER in the bundled trainer: envs that read subgoals, and per-token plan/execute advantages.

An estimator that reads ``segment_starts`` (``--advantage hiper``, see
:mod:`agentgym.algorithms.hiper`) switches the trainer into plan-execute mode; nothing else
does, and there is no separate flag (a subgoal the estimator ignores would only cost prompt
tokens). In that mode

* every env is ``PromptRenderer(SubgoalActions(ParseActions(env)))``
  (:func:`make_subgoal_llm_env`): a reply may start with ``<switch>KEEP|SWITCH</switch>`` and
  ``<subgoal>...</subgoal>``, the family's parser reads the rest, and each step's
  ``info["subgoal_start"]`` is the estimator's ``segment_starts`` input; prompts that show the
  format instruction show :data:`~agentgym.algorithms.hiper.SUBGOAL_INSTRUCTION` after it (the
  tiny-model templates show neither: every prompt token costs update time, and a random model
  reads none);
* the loss weights tokens, not rows (:func:`plan_execute_advantages`): on a planner turn (a
  segment's first turn) the tokens of the plan blocks get the planner advantage ``A_H`` and
  the other response tokens the executor advantage ``A_L``; on an executor turn every token
  gets ``A_L`` (a ``KEEP`` is the executor's choice to go on; HiPER's separate termination
  head, which would credit it, is not implemented);
* the tiny model's word-level vocabulary is the env's words (as without subgoals) plus
  :data:`PLAN_WORDS` kept whole, so a random tiny model can state a plan at all:
  ``<switch>SWITCH</switch>`` is one word, and a two-token reply ``<switch>SWITCH</switch>
  north`` starts a new segment and moves. The instruction's other words stay out of its
  vocabulary (it cannot read them, and every word it may write dilutes its valid replies).
  The corridor's tiny preset generates one token per turn (``max_new_tokens`` 1), room for
  the action only: give a HiPER run ``max_new_tokens`` 2 or more there (the credit
  benchmark does).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from agentgym.algorithms.advantage import AdvantageResult
from agentgym.algorithms.hiper import (
    SUBGOAL_INSTRUCTION,
    SubgoalActions,
    parse_subgoal,
    plan_execute_token_advantages,
)
from agentgym.wrappers.llm import (
    FORMAT_INSTRUCTIONS,
    PROMPT_TEMPLATES,
    ParseActions,
    PromptRenderer,
    PromptTemplate,
    make_llm_env,
    template_for_family,
)
from trainers.gigpo.advantage import advantage_estimator
from trainers.gigpo.logprobs import pad_right_aligned
from trainers.gigpo.multienv import subset_rows
from trainers.gigpo.rollout import RolloutBatch

__all__ = [
    "PLAN_WORDS",
    "llm_env_for",
    "make_subgoal_llm_env",
    "micro_batch_advantages",
    "plan_execute_advantages",
    "plan_token_mask",
    "segments_per_episode",
    "subgoal_template",
    "uses_subgoals",
]

#: What the tiny word-level tokenizer keeps as single words in plan-execute mode: a whole
#: switch block (one token decides KEEP or SWITCH) and the subgoal tags (a subgoal's words are
#: the env's own words between them).
PLAN_WORDS: tuple[str, ...] = (
    "<switch>SWITCH</switch>",
    "<switch>KEEP</switch>",
    "<subgoal>",
    "</subgoal>",
)

# A plan block of a well-formed reply (parse_subgoal checks the form first).
_PLAN_BLOCK = re.compile(r"<(switch|subgoal)>.*?</\1>", re.IGNORECASE | re.DOTALL)


def uses_subgoals(advantage: str) -> bool:
    """Whether the estimator named ``advantage`` trains in plan-execute mode (it reads
    ``segment_starts``)."""
    return "segment_starts" in advantage_estimator(advantage).inputs


def subgoal_template(template: PromptTemplate, fmt: str) -> PromptTemplate:
    """``template`` asking for subgoals too: :data:`SUBGOAL_INSTRUCTION` after the format
    instruction. A template that shows no format instruction (``compact``, ``actions``: short
    prompts for tiny models, which cannot read one) is returned as it is."""
    if "{instruction}" not in template.first + template.later:
        return template
    own = dict(template.instructions)
    own[fmt] = f"{own.get(fmt, FORMAT_INSTRUCTIONS[fmt])}\n{SUBGOAL_INSTRUCTION}"
    return dataclasses.replace(template, instructions=tuple(own.items()))


def make_subgoal_llm_env(
    env: gym.Env | str,
    fmt: str | None = None,
    history_length: int = 2,
    template: str | PromptTemplate | None = None,
    *,
    env_kwargs: dict[str, Any] | None = None,
) -> PromptRenderer:
    """``PromptRenderer(SubgoalActions(ParseActions(env)))``: what
    :func:`agentgym.wrappers.llm.make_llm_env` builds, with the subgoal parser between the
    family's parser and the prompts, and prompts that ask for subgoals
    (:func:`subgoal_template`). Same arguments; usable as a ``GroupVectorEnv`` wrapper."""
    if isinstance(env, str):
        env = gym.make(env, **(env_kwargs or {}))
    if template is None:
        tpl = template_for_family(getattr(env.unwrapped, "family", None))
    elif isinstance(template, str):
        tpl = PROMPT_TEMPLATES[template]
    else:
        tpl = template
    fmt = tpl.default_fmt if fmt is None else fmt
    parser = SubgoalActions(ParseActions(env, fmt))
    return PromptRenderer(parser, history_length, subgoal_template(tpl, fmt), fmt=fmt)


def llm_env_for(advantage: str) -> Callable[..., gym.Env]:
    """The wrapper that makes the trainer's envs take model text under the estimator named
    ``advantage``: :func:`make_subgoal_llm_env` in plan-execute mode, else
    :func:`~agentgym.wrappers.llm.make_llm_env`."""
    return make_subgoal_llm_env if uses_subgoals(advantage) else make_llm_env


def plan_token_mask(tokenizer: Any, token_ids: Sequence[int]) -> np.ndarray:
    """bool (len(token_ids),): the response tokens that belong to its plan blocks.

    The reply is decoded as the policy decodes it (special tokens skipped); a token is a plan
    token when the characters it adds to the decoded prefix overlap a ``<switch>`` or
    ``<subgoal>`` block (tags included). A reply without well-formed plan blocks has none.
    Decodes one prefix per token up to the last plan block (plans come first, so that is
    usually a few tokens).
    """
    ids = list(token_ids)
    mask = np.zeros(len(ids), dtype=bool)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if "<" not in text or parse_subgoal(text).error is not None:
        return mask
    spans = [m.span() for m in _PLAN_BLOCK.finditer(text)]
    if not spans:
        return mask
    last = max(end for _, end in spans)
    before = 0
    for k in range(len(ids)):
        after = len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True))
        mask[k] = after > before and any(s < after and before < e for s, e in spans)
        before = max(before, after)
        if before >= last:
            break
    return mask


def plan_execute_advantages(
    batch: RolloutBatch,
    compute: Callable[[RolloutBatch], AdvantageResult],
    segment_starts: np.ndarray,
    tokenizer: Any,
) -> list[torch.Tensor]:
    """Per-token advantages of every row: float32 ``(len(response_ids[i]),)`` for row i.

    ``compute(sub_batch)`` is the ``hiper`` estimator's result for a batch (each env's rows
    alone in a run over several envs, as for row advantages); ``segment_starts`` bool (N,) marks
    the planner turns (a trajectory's first turn is one whatever it says). Planner turns'
    plan tokens (:func:`plan_token_mask`) get ``episode_advantage`` (``A_H``), every other
    token ``step_advantage`` (``A_L``), through
    :func:`~agentgym.algorithms.hiper.plan_execute_token_advantages`.
    """
    n = len(batch)
    if n == 0:
        return []
    if batch.env_ids is None:
        result = compute(batch)
        low, high = result.step_advantage, result.episode_advantage
    else:  # several envs: each env's rows alone, as their row advantages are
        low, high = np.zeros(n), np.zeros(n)
        for k in np.unique(batch.env_ids):
            rows = np.flatnonzero(batch.env_ids == k)
            result = compute(subset_rows(batch, rows))
            low[rows], high[rows] = result.step_advantage, result.episode_advantage
    planner = np.asarray(segment_starts, dtype=bool) | (batch.step_ids == 0)
    lengths = [len(r) for r in batch.response_ids]
    width = max(lengths)
    # (N, width) masks, each row's tokens from column 0
    plan = torch.zeros((n, width))
    for i, ids in enumerate(batch.response_ids):
        if planner[i] and ids:
            plan[i, : len(ids)] = torch.from_numpy(plan_token_mask(tokenizer, ids)).float()
    present = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    levels = AdvantageResult(
        advantages=np.asarray(low, dtype=np.float32),
        returns=np.zeros(n),
        episode_advantage=np.asarray(high, dtype=np.float64),
        step_advantage=np.asarray(low, dtype=np.float64),
        stats={},
    )
    tokens = plan_execute_token_advantages(levels, present - plan, plan)
    return [tokens[i, : lengths[i]].clone() for i in range(n)]


def segments_per_episode(batch: RolloutBatch) -> float:
    """Mean segments per episode of a rollout (a first turn always starts one); 1.0 means the
    model never planned after its first turn, and the two levels' credit then coincides."""
    counts = [
        sum(t == 0 or bool(s.info.get("subgoal_start")) for t, s in enumerate(traj.steps))
        for traj in batch.trajectories
    ]
    return float(np.mean(counts)) if counts else 0.0


def micro_batch_advantages(
    advantages: torch.Tensor | list[torch.Tensor],
    idx: np.ndarray,
    width: int,
    device: torch.device,
) -> torch.Tensor:
    """(B, width) advantages of the micro-batch's rows ``idx``, laid out as the forward lays
    out the responses (right-aligned): an (N,) tensor of row advantages is broadcast over each
    row's tokens; a list of per-token tensors (:func:`plan_execute_advantages`) is padded."""
    if isinstance(advantages, torch.Tensor):
        return advantages[torch.as_tensor(idx)].to(device)[:, None].expand(-1, width)
    return pad_right_aligned([advantages[i] for i in idx], width, device)
