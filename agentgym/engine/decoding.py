"""Sampling from a local transformers model: ``generate`` with the sampled tokens' log-probs
recorded (:func:`generate_left_padded`), and a faster decoder with a static KV cache, its own
decode loop and compaction (:class:`StaticDecoder`).

Both take left-padded batches of prompt ids and return, per row, the sampled ids up to and
including the first end token and the log-prob of each under the full distribution at the
sampling temperature (before top-p): the distribution a training forward pass scores.

``transformers``' ``generate`` grows a dynamic KV cache by concatenation, runs Python logits
processors every token and keeps decoding rows that have already finished. Decoding is
memory-bound (every step reads all weights plus the KV cache), so what matters is steps per
second at a large batch. :class:`StaticDecoder` therefore:

- prefills a length-sorted chunk of prompts (left-padded, so every prompt ends in the same
  cache column) into one preallocated :class:`transformers.StaticCache` of width
  ``prompt width + max_new_tokens``, computing logits for the last position only;
- decodes one token per step for the whole chunk with fixed shapes (``(B, 1)`` ids, a
  ``(B, cache width)`` attention mask updated in place), which is what lets CUDA graphs
  replay the step (``torch.compile(mode="reduce-overhead")`` on CUDA; eager elsewhere);
- samples on the device (temperature, optional top-p, ``torch.multinomial``, exactly the
  operations ``generate`` performs, in the same order) and records log p(token) under the
  temperature-scaled full distribution without leaving the device;
- looks at which rows finished only every ``check_every`` steps (one host sync), and drops
  them from the batch and the KV cache when the live rows fit a batch half the size (so a
  compiled step sees at most log2(B) distinct batch shapes).

Same distribution as ``generate``: greedy decoding gives ``generate``'s tokens, and with
compaction off a sampled run draws ``generate``'s very tokens from the same random state (the
same ``multinomial`` calls over the same rows); ``tests/trainers/test_generation.py`` checks
both, and the sampled distribution with compaction on.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

#: Steps between looks at which rows finished (each look is one device-to-host sync).
CHECK_EVERY = 16
#: A compiled step's cache widths are rounded up to a multiple of this.
WIDTH_STEP = 128
#: Distinct input shapes a compiled step may be captured for (batch sizes x cache widths);
#: torch's default (8) would fall back to eager after a few rounds of a rollout.
RECOMPILE_LIMIT = 64
#: With ``compile=None``, the step is compiled on CUDA when a call decodes at least this many
#: tokens; shorter decodes cannot repay the compile time.
COMPILE_MIN_NEW_TOKENS = 64


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from ``logits (B, V)`` as ``generate`` does; all on the device.

    Returns ``(tokens (B,), logprobs (B,))``; the log-probs are of the full distribution at
    ``temperature`` (before top-p), the distribution the update's forward pass scores.
    ``temperature <= 0`` is greedy (argmax; log-probs at temperature 1).
    """
    scores = logits.float()
    if temperature <= 0:
        tokens = scores.argmax(dim=-1)
        logp = torch.log_softmax(scores, dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    scores = scores / temperature  # transformers' TemperatureLogitsWarper
    logp = torch.log_softmax(scores, dim=-1)
    if top_p < 1.0:  # transformers' TopPLogitsWarper (min_tokens_to_keep=1)
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        remove = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(1, sorted_idx, remove), -float("inf"))
    tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class StaticDecoder:
    """Generates for left-padded prompt batches with a static KV cache (see the module doc).

    Args:
        model: a causal LM from ``transformers`` (a peft wrapper is fine) whose cache layers
            are static-cache capable (Qwen2, Llama and most decoder-only models).
        eos_ids: tokens that end a response (kept in the output).
        pad_id: written after a row's end (never returned).
        compile: wrap the decode step in ``torch.compile(mode="reduce-overhead")`` (CUDA graphs).
            None: on CUDA, for decodes of at least :data:`COMPILE_MIN_NEW_TOKENS`. A step that fails to compile falls back to eager, once, with a
            warning.
        compact: drop finished rows from the batch (and its KV cache) as they end. Off, every
            row decodes to the longest response, as ``generate`` does.
        check_every: decode steps between looks at which rows finished.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_ids: Sequence[int],
        pad_id: int,
        compile: bool | None = None,
        compact: bool = True,
        check_every: int = CHECK_EVERY,
    ):
        self.model = model
        self.eos_ids = list(eos_ids)
        self.pad_id = pad_id
        self.compile = compile
        self.compact = compact
        self.check_every = max(1, check_every)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.config = base.config
        params = inspect.signature(base.forward).parameters
        # transformers renamed `past_key_values` to `cache` and dropped `cache_position` in 5.x;
        # both spellings are supported so the decoder runs on either side of the change.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._needs_cache_position = "cache_position" in params
        self._compiled: Callable[..., torch.Tensor] | None = None
        self._compile_failed = False
        self._pool: dict[int, Any] = {}  # batch rows -> StaticCache, all `width` wide
        self.width = 0  # cache width (tokens) of the pooled caches

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """Whether this transformers version and ``model`` give the static cache the decoder
        works with (layered caches, transformers >= 4.56; decoder-only full attention)."""
        from transformers import StaticCache

        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        try:
            cache = StaticCache(config=base.config, max_cache_len=8)
        except Exception:  # noqa: BLE001 - an older signature or an unsupported config
            return False
        return all(
            hasattr(layer, "lazy_initialization") for layer in getattr(cache, "layers", [None])
        )

    # ------------------------------------------------------------------------------------------
    def _forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        cache_position: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``(B, V)`` of the last position of ``ids (B, S)``, written at cache columns
        ``cache_position (S,)`` (read by transformers versions that take it)."""
        kwargs: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": positions,
            self._cache_kw: cache,
            "use_cache": True,
            "logits_to_keep": 1,
        }
        if self._needs_cache_position:
            kwargs["cache_position"] = cache_position
        return self.model(**kwargs).logits[:, -1]

    def _step(self, device: torch.device, max_new_tokens: int) -> Callable[..., torch.Tensor]:
        use_compile = self.compile
        if use_compile is None:  # compiling takes tens of seconds: worth it for long decodes
            use_compile = device.type == "cuda" and max_new_tokens >= COMPILE_MIN_NEW_TOKENS
        if not use_compile or self._compile_failed:
            return self._forward
        if self._compiled is None:
            for name in ("recompile_limit", "cache_size_limit"):  # renamed in torch 2.6
                if hasattr(torch._dynamo.config, name):
                    limit = max(getattr(torch._dynamo.config, name), RECOMPILE_LIMIT)
                    setattr(torch._dynamo.config, name, limit)
            self._compiled = torch.compile(self._forward, mode="reduce-overhead", dynamic=False)
        return self._compiled

    def _cache(self, rows: int, width: int, grow_only: bool) -> Any:
        """A reset :class:`~transformers.StaticCache` for ``rows`` rows from the pool.

        Caches are kept between calls because a compiled step is captured with its cache
        tensors' addresses: a new cache per call would mean a new capture per rollout round.
        All pooled caches share one width, :attr:`width`, which only ever grows (a wider cache
        serves a narrower batch, its extra columns masked). Without ``grow_only`` (eager
        decoding) the cache is a new one of exactly ``width``.
        """
        from transformers import StaticCache

        if not grow_only:  # eager: nothing captured, so a fresh cache of the exact size
            self.width = width
            return StaticCache(config=self.config, max_cache_len=width)
        if width > self.width:
            self._pool.clear()
            self.width = width
        cache = self._pool.get(rows)
        if cache is None:
            cache = self._pool[rows] = StaticCache(config=self.config, max_cache_len=self.width)
        else:
            cache.reset()
        return cache

    def _compacted(self, cache: Any, keep: torch.Tensor, grow_only: bool) -> Any:
        """The pooled cache for ``len(keep)`` rows holding rows ``keep`` of ``cache``."""
        small = self._cache(len(keep), self.width, grow_only)
        for big, layer in zip(cache.layers, small.layers, strict=True):
            keys, values = big.keys.index_select(0, keep), big.values.index_select(0, keep)
            if not layer.is_initialized:  # allocates static tensors of this shape and dtype
                try:
                    layer.lazy_initialization(keys, values)
                except TypeError:  # transformers versions whose layers take the keys only
                    layer.lazy_initialization(keys)
            layer.keys.copy_(keys)
            layer.values.copy_(values)
            if isinstance(getattr(big, "cumulative_length", None), torch.Tensor):
                layer.cumulative_length.copy_(big.cumulative_length)
        return small

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        batch: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample up to ``max_new_tokens`` after each prompt of ``batch`` (token id lists).

        Returns per row the response ids (up to and including the first end token) and their
        log-probs. The model must be in eval mode (the caller's job, as for ``generate``).
        """
        if max_new_tokens < 1 or not batch or min(len(p) for p in batch) < 1:
            raise ValueError(
                f"need max_new_tokens >= 1 (got {max_new_tokens}) and at least one prompt, "
                "each of at least one token"
            )
        device = next(self.model.parameters()).device
        step_fn = self._step(device, max_new_tokens)
        compiled = step_fn != self._forward  # bound methods: equal, never identical
        n = len(batch)
        width = max(len(p) for p in batch)
        total = width + max_new_tokens
        if compiled:
            # A compiled step is captured once per input shape: batch sizes are powers of two
            # (filler rows start finished) and cache widths multiples of WIDTH_STEP, so
            # rounds of different sizes reuse a few graphs.
            n_rows = 1 << (n - 1).bit_length()
            total = -(-total // WIDTH_STEP) * WIDTH_STEP
        else:
            n_rows = n
        cache = self._cache(n_rows, total, grow_only=compiled)
        total = self.width
        ids = torch.full((n_rows, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n_rows, total), dtype=torch.long)
        mask[n:, width - 1] = 1  # a filler row is one padding token (attention needs one key)
        for row, p in enumerate(batch):
            ids[row, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[row, width - len(p) : width] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask[:, :width].cumsum(dim=1) - 1).clamp(min=0)
        next_pos = mask[:, :width].sum(dim=1, keepdim=True)  # (B, 1) position of the next token
        eos = torch.tensor(self.eos_ids, device=device)

        shape = (n_rows, max_new_tokens)
        tokens_out = torch.full(shape, self.pad_id, dtype=torch.long, device=device)
        logp_out = torch.zeros(shape, dtype=torch.float32, device=device)
        rows = torch.arange(n_rows, device=device)  # original row of each batch row
        done = rows >= n
        with autocast():
            logits = self._forward(
                ids, mask[:, :width], positions, cache, torch.arange(width, device=device)
            )
        cache_position = torch.full((1,), width, dtype=torch.long, device=device)
        for t in range(max_new_tokens):
            tok, lp = sample_next(logits, temperature, top_p)
            # A finished row keeps sampling (like generate) but writes padding.
            tok = torch.where(done, self.pad_id, tok)
            tokens_out[rows, t] = tok
            logp_out[rows, t] = torch.where(done, 0.0, lp)
            done = done | torch.isin(tok, eos)
            if t + 1 == max_new_tokens:
                break
            if (t + 1) % self.check_every == 0:
                live = int((~done).sum())  # the one sync per `check_every` steps
                if live == 0:
                    break
                if self.compact and live <= len(rows) // 2:
                    if compiled:  # exactly half: live rows first, finished ones as filler
                        keep = torch.argsort(done.int(), stable=True)[: len(rows) // 2]
                        keep = keep.sort().values
                    else:
                        keep = (~done).nonzero().squeeze(1)
                    cache = self._compacted(cache, keep, grow_only=compiled)
                    rows, done, tok = rows[keep], done[keep], tok[keep]
                    mask, next_pos = mask[keep], next_pos[keep]
            mask[:, width + t] = 1
            with autocast():
                logits = self._run_step(
                    step_fn, tok[:, None], mask, next_pos, cache, cache_position
                )
            next_pos = next_pos + 1
            cache_position = cache_position + 1

        # A response runs to its first end token (kept), or to the cap if it has none.
        ends = torch.isin(tokens_out, eos)
        first_end = ends.long().argmax(dim=1) + 1
        lengths = torch.where(
            ends.any(dim=1), first_end, torch.full_like(first_end, max_new_tokens)
        )
        tok_l = tokens_out[:n].tolist()
        lp_l, len_l = logp_out[:n].tolist(), lengths[:n].tolist()
        return (
            [tok_l[r][: len_l[r]] for r in range(n)],
            [lp_l[r][: len_l[r]] for r in range(n)],
        )

    def _run_step(
        self,
        step_fn: Callable[..., torch.Tensor],
        tok: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        cache_position: torch.Tensor,
    ) -> torch.Tensor:
        if step_fn == self._forward:
            return self._forward(tok, mask, positions, cache, cache_position)
        try:
            # Cloned: a CUDA-graph output is overwritten by the next replay.
            return step_fn(tok, mask, positions, cache, cache_position).clone()
        except Exception as err:  # noqa: BLE001 - any compile failure: decode eagerly instead
            import warnings

            warnings.warn(
                f"compiling the decode step failed ({type(err).__name__}: {err}); decoding "
                "eagerly (pass compile=False to skip the attempt)",
                stacklevel=3,
            )
            self._compile_failed = True
            return self._forward(tok, mask, positions, cache, cache_position)


def left_pad(batch: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids (B, S), attention_mask (B, S))`` of prompts left-padded to the longest, so
    that every prompt ends in the last column (where generation continues)."""
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
        attention[row, width - len(ids) :] = 1
    return input_ids, attention


@torch.no_grad()
def generate_left_padded(
    model: torch.nn.Module,
    batch: Sequence[Sequence[int]],
    *,
    eos_ids: Sequence[int],
    pad_id: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> tuple[list[list[int]], list[list[float]]]:
    """Sample after each prompt of ``batch`` with ``model.generate`` (the reference path).

    The full distribution at ``temperature`` is sampled (``top_k`` off, ``top_p`` as given, no
    repetition penalty: the model's own generation defaults that reshape the distribution, such
    as Qwen's ``repetition_penalty=1.05, top_k=20``, are overridden, so the tokens come from the
    policy a training step scores); ``temperature <= 0`` is greedy. Returns per row the new ids
    up to and including the first of ``eos_ids`` and their log-probs (float32). The model must
    be in eval mode (the caller's job).
    """
    device = next(model.parameters()).device
    input_ids, attention = left_pad(batch, pad_id)
    greedy = temperature <= 0
    sampling: dict[str, Any] = (
        {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        if greedy
        else {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    )
    recorder = SampledLogprobs(1.0 if greedy else temperature)
    with autocast():
        sequences = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_id,
            eos_token_id=list(eos_ids),
            repetition_penalty=1.0,
            logits_processor=LogitsProcessorList([recorder]),
            **sampling,
        )
    new = sequences[:, input_ids.shape[1] :]  # (B, T_new)
    logp = recorder.finish(new)  # (B, T_new), float32
    # Keep tokens up to and including the first end token; the rest is padding.
    is_eos = torch.isin(new, torch.tensor(list(eos_ids), device=new.device))
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    lengths = (~after_eos).sum(dim=1).tolist()
    new_l, logp_l = new.tolist(), logp.tolist()
    return [new_l[r][:n] for r, n in enumerate(lengths)], [
        logp_l[r][:n] for r, n in enumerate(lengths)
    ]


class SampledLogprobs(LogitsProcessor):
    """Records log p(sampled token) at every generation step, one (B, V) step at a time.

    ``generate`` calls it with the model's logits before sampling; the token drawn from them is
    the last column of ``input_ids`` at the next call (and of the output after the last one).
    Keeping only the previous step's log-softmax costs O(B * V) memory, where
    ``output_logits=True`` would keep every step's logits (O(B * T * V): about 20 GB for 64
    responses of 512 tokens over Qwen's 152k-token vocabulary). It runs before the sampling
    warpers, so the log-probs are of the full distribution at ``temperature``, the distribution
    the update's forward pass scores.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None  # (B, V) log-softmax of the last step
        self.steps: list[torch.Tensor] = []  # (B,) per generated token

    def _take(self, tokens: torch.Tensor) -> None:
        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
            self.previous = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(B, T_new) log-probs of ``new_tokens``, the generated part of the sequences."""
        if new_tokens.shape[1]:
            self._take(new_tokens[:, -1])
        if not self.steps:
            return torch.zeros(new_tokens.shape, dtype=torch.float32, device=new_tokens.device)
        return torch.stack(self.steps, dim=1)


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
    ids, attention = left_pad([prompts[i] for i in chunk], pad_id)
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


def choose(
    scores: torch.Tensor, temperature: float, generator: torch.Generator | None = None
) -> int:
    """Index drawn from softmax(scores / temperature); the argmax when temperature is 0.

    Draws from ``generator``, by default torch's global generator (which the trainer seeds and
    saves in its checkpoints).
    """
    if temperature <= 0:
        return int(torch.argmax(scores))
    probs = torch.softmax(scores.double() / temperature, dim=0)
    return int(torch.multinomial(probs, 1, generator=generator))
