"""The scored-action policy: choose among the env's admissible actions by the model's likelihood.

A small instruct model rarely writes a valid action as free text, so every trajectory of a group
fails alike and group RL gets no signal. With admissible actions listed by the env (ALFWorld,
WebShop, Sokoban, the corridor), the policy can instead be the model's distribution *restricted
to those actions*, as GLAM (Carta et al., 2023) did for online RL of LLMs in text worlds:

    score(a) = sum_j log p(a_j | prompt, a_<j)        (the action's tokens, end-of-turn included)
    pi(a | prompt) = softmax_a(score(a) / action_temperature)

The chosen action's tokens are the response the trainer trains, exactly as a sampled free-text
response: ``Generation.response_ids`` are its token ids and ``Generation.logprobs`` their per-token
log-probs under the model (at the trainer's sampling temperature), so GiGPO/GRPO, the PPO ratio
and ``rollout/logprob_diff`` are computed as for free text. The end-of-turn token is part of each
action: without it a short action that prefixes a longer one ("go" vs "go north") would be scored
as the more likely one for free.

Scoring is batched: each round, every env's prompt is run once (left-padded, with a KV cache),
the cache rows are repeated for each env's candidates, and all candidates of all envs are scored
in one more forward pass over their few tokens. Envs go in chunks under a token budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from agentgym.wrappers.llm import PromptTemplate
from trainers.gigpo.policy import Generation, _eos_ids, chat_prompt_ids

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


def scored_problem(env_id: str) -> str | None:
    """Why ``--policy scored`` cannot run on ``env_id`` (one line), or None: its family's
    ``FAMILY.lists_actions`` is False (actions are free text)."""
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


@torch.no_grad()
def score_candidates(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    candidates: Sequence[Sequence[list[int]]],
    *,
    pad_id: int,
    temperature: float = 1.0,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    token_budget: int = 4096,
) -> list[list[torch.Tensor]]:
    """Per-token log-probs of every candidate continuation of every prompt.

    Args:
        prompts: (B,) token ids of each prompt.
        candidates: (B,) lists of candidate continuations (token ids) of each prompt.
        temperature: logits are divided by it (the distribution the trainer scores), if > 0.
        token_budget: prompt tokens (padded) per forward pass; envs go in chunks under it.

    Returns:
        ``out[b][k]``: float32 tensor (len(candidates[b][k]),), CPU, the log-prob of each token
        of candidate k given prompt b and the candidate's earlier tokens.
    """
    out: list[list[torch.Tensor]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    chunk: list[int] = []
    for i in order:
        width = max([len(prompts[j]) for j in chunk] + [len(prompts[i])])
        if chunk and width * (len(chunk) + 1) > token_budget:
            _score_chunk(model, prompts, candidates, chunk, out, pad_id, temperature, autocast)
            chunk = []
        chunk.append(i)
    if chunk:
        _score_chunk(model, prompts, candidates, chunk, out, pad_id, temperature, autocast)
    return out


def _score_chunk(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    candidates: Sequence[Sequence[list[int]]],
    chunk: list[int],
    out: list[list[torch.Tensor]],
    pad_id: int,
    temperature: float,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> None:
    device = next(model.parameters()).device
    lengths = torch.tensor([len(prompts[i]) for i in chunk])
    width = int(lengths.max())
    ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(chunk), width), dtype=torch.long)
    for row, i in enumerate(chunk):
        ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
        attention[row, width - len(prompts[i]) :] = 1
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    with autocast():
        first = model(
            input_ids=ids.to(device),
            attention_mask=attention.to(device),
            position_ids=positions.to(device),
            use_cache=True,
            logits_to_keep=1,
        )
    scale = temperature if temperature > 0 else 1.0
    first_lp = torch.log_softmax(first.logits[:, -1].float() / scale, dim=-1)  # (B, V)
    # One row per candidate; the prompt's cache rows are repeated for its candidates.
    owner = [row for row, i in enumerate(chunk) for _ in candidates[i]]
    cand = [c for i in chunk for c in candidates[i]]
    if not cand:
        return
    if any(len(c) == 0 for c in cand):
        raise ValueError("a candidate action has no tokens")
    owner_t = torch.tensor(owner, device=device)
    span = max(len(c) for c in cand)
    cand_ids = torch.full((len(cand), span), pad_id, dtype=torch.long)
    cand_mask = torch.zeros((len(cand), span), dtype=torch.long)
    for k, c in enumerate(cand):
        cand_ids[k, : len(c)] = torch.tensor(c)
        cand_mask[k, : len(c)] = 1
    cand_ids, cand_mask = cand_ids.to(device), cand_mask.to(device)
    token_lp = first_lp[owner_t].gather(1, cand_ids[:, :1])  # (K, 1): each first token
    if span > 1:
        # ``cache`` in recent transformers (``past_key_values`` warns there), the old name before
        cache = first["cache"] if "cache" in first else first.past_key_values
        cache.reorder_cache(owner_t)  # (B, ...) -> (K, ...): each candidate its prompt's rows
        attn = torch.cat([attention.to(device)[owner_t], cand_mask], dim=1)
        pos = lengths.to(device)[owner_t, None] + torch.arange(span, device=device)[None]
        with autocast():
            rest = model(
                input_ids=cand_ids[:, :-1],
                attention_mask=attn[:, :-1],
                position_ids=pos[:, :-1],
                use_cache=True,
                **{_cache_kwarg(model): cache},
            )
        rest_lp = torch.log_softmax(rest.logits.float() / scale, dim=-1)  # (K, span - 1, V)
        token_lp = torch.cat([token_lp, rest_lp.gather(2, cand_ids[:, 1:, None])[..., 0]], dim=1)
    token_lp = token_lp.cpu()
    k = 0
    for i in chunk:
        for c in candidates[i]:
            out[i].append(token_lp[k, : len(c)].clone())
            k += 1


def _cache_kwarg(model: torch.nn.Module) -> str:
    """The forward argument that takes a KV cache: ``cache`` in recent transformers (which
    warns on the older name), ``past_key_values`` before."""
    import inspect

    forward = inspect.signature(type(model).forward).parameters
    if "cache" in forward and "past_key_values" not in forward:
        return "cache"
    base = getattr(model, "get_base_model", None)  # peft: the wrapped model's signature
    if base is not None and base() is not model:
        return _cache_kwarg(base())
    return "past_key_values"


class ScoredActionPolicy:
    """A trainer policy that picks one of each env's admissible actions (see the module doc).

    ``generate(prompts, admissible=...)`` returns one :class:`Generation` per prompt: the chosen
    action's text (what the env is stepped with; the env's parser should take plain text), the
    prompt ids, the action's token ids (end-of-turn included) and their log-probs.
    ``temperature`` there is the softmax temperature over the actions' summed log-probs
    (``action_temperature`` by default; 0 = the argmax, as evaluation uses).

    Args:
        model, tokenizer: the policy being trained and its tokenizer (chat template applied).
        token_temperature: divides the logits of the per-token log-probs (the trainer's sampling
            temperature, so the update's forward pass scores the same distribution).
        action_temperature: default softmax temperature over actions.
        max_prompt_tokens: prompts keep their tail beyond this many tokens.
        token_budget: padded prompt tokens per scoring forward pass.
    """

    #: ``collect`` passes each env's ``info["admissible_actions"]`` to policies that ask.
    needs_admissible = True

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        token_temperature: float = 1.0,
        action_temperature: float = 1.0,
        max_prompt_tokens: int | None = None,
        token_budget: int = 4096,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.token_temperature = token_temperature
        self.action_temperature = action_temperature
        self.max_prompt_tokens = max_prompt_tokens
        self.token_budget = token_budget
        self.autocast = autocast
        self.eos_id = _eos_ids(model, tokenizer)[0]
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self._action_ids: dict[str, list[int]] = {}  # action texts recur: tokenize each once

    def action_ids(self, action: str) -> list[int]:
        """The response ids of ``action``: its tokens, then the end-of-turn token."""
        ids = self._action_ids.get(action)
        if ids is None:
            ids = list(self.tokenizer(action, add_special_tokens=False)["input_ids"])
            ids.append(self.eos_id)
            self._action_ids[action] = ids
        return ids

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Nothing to do: scoring runs on the trained model itself."""

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        temperature: float | None = None,
        admissible: Sequence[Sequence[str] | None] | None = None,
    ) -> list[Generation]:
        if admissible is None or len(admissible) != len(prompts):
            raise ValueError("the scored-action policy needs each prompt's admissible actions")
        temperature = self.action_temperature if temperature is None else temperature
        actions: list[list[str]] = []
        for acts in admissible:
            if not acts:
                raise ValueError(
                    "the env gave no admissible actions: the scored-action policy cannot choose; "
                    "use --policy free for this env"
                )
            actions.append(list(dict.fromkeys(str(a) for a in acts)))  # duplicates once
        prompt_ids = [chat_prompt_ids(self.tokenizer, p, self.max_prompt_tokens) for p in prompts]
        candidates = [[self.action_ids(a) for a in acts] for acts in actions]
        was_training = self.model.training
        self.model.eval()
        try:
            scored = score_candidates(
                self.model,
                prompt_ids,
                candidates,
                pad_id=self.pad_id,
                temperature=self.token_temperature,
                autocast=self.autocast,
                token_budget=self.token_budget,
            )
        finally:
            self.model.train(was_training)
        out = []
        for b, acts in enumerate(actions):
            totals = torch.stack([lp.sum() for lp in scored[b]])
            k = choose(totals, temperature)
            out.append(Generation(acts[k], prompt_ids[b], candidates[b][k], scored[b][k].tolist()))
        return out


def choose(scores: torch.Tensor, temperature: float) -> int:
    """Index drawn from softmax(scores / temperature); the argmax when temperature is 0.

    Draws from torch's global generator (seeded by the trainer and saved in its checkpoints).
    """
    if temperature <= 0:
        return int(torch.argmax(scores))
    probs = torch.softmax(scores.double() / temperature, dim=0)
    return int(torch.multinomial(probs, 1))
