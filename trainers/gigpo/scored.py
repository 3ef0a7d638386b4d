"""The scored-action policy: choose among the env's admissible actions by the model's likelihood.

A small instruct model rarely writes a valid action as free text, so every trajectory of a group
fails alike and group RL gets no signal. With admissible actions listed by the env (ALFWorld,
WebShop, Sokoban, the corridor), the policy can instead be the model's distribution *restricted
to those actions*, as GLAM (Carta et al., 2023) did for online RL of LLMs in text worlds:

    score(a) = sum_j log p(a_j | prompt, a_<j)        (the action's tokens, end-of-turn included)
    pi(a | prompt) = softmax_a(score(a) / action_temperature)

The policy is the engine's :class:`agentgym.engine.ScoredActionPolicy` over the trained model
(a :class:`agentgym.engine.TransformersPolicy`). The chosen action's tokens are the response the
trainer trains, exactly as a sampled free-text response: the output's ``token_ids`` are its token
ids (ending with the token the chat template closes a reply with) and ``logprobs`` their per-token
log-probs under the model (at the trainer's sampling temperature), so GiGPO/GRPO, the PPO ratio
and ``rollout/logprob_diff`` are computed as for free text.

Scoring is batched: each round, every env's prompt is run once (left-padded, with a KV cache),
the cache rows are repeated for each env's candidates, and all candidates of all envs are scored
in one more forward pass over their few tokens. Envs go in chunks under a token budget.

This module keeps what is the trainer's: the short prompt template. Which envs can use it is
:func:`trainers.gigpo.config.scored_problem` (re-exported here), checked before torch is imported.
"""

from __future__ import annotations

from agentgym.wrappers.llm import PromptTemplate
from trainers.gigpo.config import scored_problem as scored_problem  # re-exported

#: A short prompt for scored actions: the observation (the task first, where the env names
#: one) and the valid actions, nothing else. Every prompt token costs update time on a CPU.
ACTIONS_TEMPLATE = PromptTemplate(
    first="{task_line}{observation}\n{admissible_line}",
    later="{task_line}{history}\n{observation}\n{admissible_line}",
    task_prefix="Task: ",
    admissible_line="Valid actions: {actions}.\n",
    admissible_style="json",
    default_admissible=None,
)
