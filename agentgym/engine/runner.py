"""The async rollout engine: every trajectory its own coroutine against a language model.

Each episode runs as ``reset -> generate -> step -> generate -> ...`` in its own coroutine, so a
long episode never holds up the others and many generation requests are in flight at once (what
a continuous-batching server wants). A semaphore bounds the requests in flight; env resets and
steps run in a thread pool, off the event loop, so a slow env never stalls generation. Envs are
never shared between running episodes (gymnasium envs are not thread-safe): a pool hands each
running episode its own and takes it back when the episode ends.

Groups: the ``group_size`` episodes of a task all reset with the same ``seed`` and
``options={"task": ...}``, so they start from the same initial state (``state_key``).

``lockstep=True`` plays rounds instead: every active episode's turn asked in one batch
(:meth:`~agentgym.engine.policies.Policy.act_batch`), then every one stepped, and again, so each
round waits for its slowest member. The trainer's group envs play the same rounds synchronously
through :mod:`agentgym.engine.lockstep`.

Example (the suite's SmolLM2 in-process, two Sokoban tasks, two episodes each)::

    import asyncio
    from agentgym.engine import RolloutEngine, SamplingParams, TransformersPolicy, make_episodes
    from agentgym.models import model_path

    policy = TransformersPolicy(model_path("smollm2-135m"), device="cpu")
    engine = RolloutEngine(policy, SamplingParams(temperature=1.0, max_tokens=32), max_turns=2)
    episodes = asyncio.run(engine.run(make_episodes("AgentGym/Sokoban-v0", tasks=[0, 1], group_size=2)))
    for ep in episodes:
        print(ep.task_id, ep.group, ep.won, [t.action for t in ep.turns])
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium as gym

from agentgym.core import InvalidAction
from agentgym.engine.policies import Policy, PolicyOutput, PolicyUnavailable, SamplingParams
from agentgym.wrappers.llm import make_llm_env

__all__ = [
    "EngineStats",
    "EpisodeRecord",
    "EpisodeSpec",
    "RolloutEngine",
    "Turn",
    "make_episodes",
    "state_key_text",
]


def state_key_text(key: Any) -> str | None:
    """A ``state_key`` as JSON-safe text: bytes as hex, everything else as ``repr``."""
    if key is None:
        return None
    if isinstance(key, bytes | bytearray):
        return key.hex()
    return repr(key)


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play: which env, which task, which group."""

    env_id: str
    """a registered id"""
    task: int | str | None = None
    """``reset(options={"task": task})``; None lets the seed choose"""
    seed: int | None = None
    """``reset(seed=seed)``; every member of a group gets the same"""
    group: int = 0
    """index of the group (the task) in the run"""
    member: int = 0
    """index of the episode in its group"""
    split: str | None = None
    """``reset(options={"split": split})`` where the family has splits"""
    env_kwargs: dict[str, Any] | None = None

    def reset_options(self) -> dict[str, Any] | None:
        options: dict[str, Any] = {}
        if self.task is not None:
            options["task"] = self.task
        if self.split is not None:
            options["split"] = self.split
        return options or None


def make_episodes(
    env_ids: str | Sequence[str],
    tasks: Sequence[int | str] | int,
    group_size: int = 1,
    *,
    seed: int = 0,
    split: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
) -> list[EpisodeSpec]:
    """``group_size`` episodes per task for each env id, one group per (env, task).

    ``tasks`` is a list of task indices or ids, or a count ``n`` for tasks ``0..n-1``. Group
    ``g`` resets with ``seed + g``, all its members alike.
    """
    ids = [env_ids] if isinstance(env_ids, str) else list(env_ids)
    task_list = list(range(tasks)) if isinstance(tasks, int) else list(tasks)
    specs = []
    group = 0
    for env_id in ids:
        for task in task_list:
            for member in range(group_size):
                specs.append(
                    EpisodeSpec(env_id, task, seed + group, group, member, split, env_kwargs)
                )
            group += 1
    return specs


@dataclass
class Turn:
    """One turn of an episode: what the model saw and wrote, and what the env did with it."""

    index: int
    messages: list[dict[str, str]]
    """the chat messages sent (one user turn holding the rendered prompt)"""
    text: str
    """the model's raw text"""
    action: str | None
    """the action the env received, or None when the text did not parse (or no text came)"""
    action_valid: bool
    reward: float
    terminated: bool
    truncated: bool
    state_key: str | None
    """the state the turn was taken FROM (``info["state_key"]``, as :func:`state_key_text`)"""
    next_state_key: str | None
    policy_version: int | str | None
    latency_s: float
    """generation time, queueing for a request slot included"""
    step_s: float
    """env step time, in its thread"""
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_ids: list[int] | None = None
    """the token ids the turn was sampled from, when the policy gives them"""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    parse_error: str | None = None
    error: str | None = None
    """why the policy gave no answer (timeout, HTTP status...), else None"""
    error_kind: str | None = None
    finish_reason: str | None = None
    action_scores: dict[str, float] | None = None
    won: bool = False
    score: float = 0.0


@dataclass
class EpisodeRecord:
    """One finished (or cut-off) episode."""

    env_id: str
    group: int
    member: int
    task: int | str | None
    seed: int | None
    task_id: str | None = None
    task_type: str | None = None
    initial_state_key: str | None = None
    turns: list[Turn] = field(default_factory=list)
    total_reward: float = 0.0
    won: bool = False
    score: float = 0.0
    terminated: bool = False
    truncated: bool = False
    end_reason: str | None = None
    """why it ended: terminated, env_truncated, max_turns, policy_errors, env_error, cancelled,
    or the reason a policy gave for ending it (``PolicyOutput.end_episode``)"""
    error: str | None = None
    """the last error that ended the episode, if one did"""
    started_s: float = 0.0
    """seconds since the run started"""
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EngineStats:
    """Where a run's time went, and how many requests were in flight."""

    wall_s: float = 0.0
    episodes: int = 0
    turns: int = 0
    requests: int = 0
    generation_s: float = 0.0
    """summed over requests (they overlap, so this may exceed ``wall_s``)"""
    env_s: float = 0.0
    """summed env reset + step time in threads"""
    max_in_flight: int = 0
    mean_in_flight: float = 0.0
    """time-weighted mean of requests in flight over the run"""
    errors: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _InFlight:
    """Requests in flight, with their time-weighted mean."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self._area = 0.0
        self._since = time.perf_counter()
        self._start = self._since

    def _tick(self) -> None:
        t = time.perf_counter()
        self._area += self.now * (t - self._since)
        self._since = t

    def enter(self) -> None:
        self._tick()
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self._tick()
        self.now -= 1

    def mean(self) -> float:
        self._tick()
        span = self._since - self._start
        return self._area / span if span > 0 else 0.0


class _Live:
    """A running episode: its env, its policy, its record and its current prompt/info."""

    def __init__(self, spec: EpisodeSpec, env: gym.Env, record: EpisodeRecord, policy: Policy):
        self.spec = spec
        self.env = env
        self.record = record
        self.policy = policy
        self.prompt = ""
        self.info: dict[str, Any] = {}
        self.done = False
        self.errors_in_a_row = 0


class RolloutEngine:
    """Plays episodes against a :class:`~agentgym.engine.policies.Policy`, each in its own coroutine.

    Args:
        policy: the model.
        params: sampling per turn (temperature, top-p, max tokens).
        concurrency: most generation requests in flight at once.
        max_turns: turns per episode before it is cut (``end_reason="max_turns"``); None: the
            env's own step cap decides.
        max_active: most episodes running at once, each holding its own env (default
            ``2 * concurrency``: enough that a request slot freed by one episode stepping its env
            is taken by another).
        policy_version: recorded on every turn, as it was when the turn's request was sent;
            change it between runs (or set the attribute while running) to tag turns with the
            weights that produced them.
        lockstep: generate for all active episodes, then step them all, round after round.
        history_length: past (observation, action) pairs in each prompt.
        max_policy_errors: an episode whose policy fails this many turns in a row ends
            truncated (``end_reason="policy_errors"``); each failed turn before that is an
            invalid step.
        env_threads: threads for env resets and steps.
        make_env: ``make_env(spec) -> env`` building the LLM-wrapped env (default:
            :func:`~agentgym.wrappers.llm.make_llm_env` of ``spec.env_id``, in the plain action
            format for policies that answer with actions). Envs are reused by later episodes
            of the same ``env_id`` and ``env_kwargs`` (reset in between), so what ``make_env``
            builds should depend on those only.
        on_episode: called with each finished :class:`EpisodeRecord`, as it finishes.
        env_pool: where envs are kept for reuse between episodes and runs; pass one dict to
            several engines to share their envs (default: this engine's own).
    """

    def __init__(
        self,
        policy: Policy,
        params: SamplingParams | None = None,
        *,
        concurrency: int = 8,
        max_turns: int | None = None,
        max_active: int | None = None,
        policy_version: int | str | None = 0,
        lockstep: bool = False,
        history_length: int = 2,
        max_policy_errors: int = 2,
        env_threads: int | None = None,
        make_env: Callable[[EpisodeSpec], gym.Env] | None = None,
        on_episode: Callable[[EpisodeRecord], None] | None = None,
        env_pool: dict[tuple, list[gym.Env]] | None = None,
    ):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.policy = policy
        self.params = params or SamplingParams()
        self.concurrency = concurrency
        self.max_turns = max_turns
        self.max_active = max_active or 2 * concurrency
        self.policy_version = policy_version
        self.lockstep = lockstep
        self.history_length = history_length
        self.max_policy_errors = max_policy_errors
        self.env_threads = env_threads or min(32, self.max_active)
        self.make_env = make_env or self._default_make_env
        self.on_episode = on_episode
        self.stats = EngineStats()
        self._pools: dict[tuple, list[gym.Env]] = {} if env_pool is None else env_pool

    def _default_make_env(self, spec: EpisodeSpec) -> gym.Env:
        return make_llm_env(
            spec.env_id,
            fmt="plain" if self.policy.plain_actions else None,
            history_length=self.history_length,
            env_kwargs=spec.env_kwargs,
        )

    # -- the run -------------------------------------------------------------------------------
    async def run(self, specs: Iterable[EpisodeSpec]) -> list[EpisodeRecord]:
        """Play every episode; records come back in the order of ``specs``.

        Cancelling the run (Ctrl-C) cancels the episodes still running; those already finished
        have been handed to ``on_episode``.
        """
        specs = list(specs)
        self.stats = EngineStats()
        self._started = time.perf_counter()
        self._slots = asyncio.Semaphore(self.concurrency)
        self._active = asyncio.Semaphore(self.max_active)
        self._in_flight = _InFlight()
        self._executor = ThreadPoolExecutor(self.env_threads, thread_name_prefix="agentgym-env")
        try:
            if self.lockstep:
                records = await self._run_lockstep(specs)
            else:
                records = await self._run_async(specs)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self.stats.wall_s = time.perf_counter() - self._started
            self.stats.max_in_flight = self._in_flight.peak
            self.stats.mean_in_flight = self._in_flight.mean()
        return records

    async def _run_async(self, specs: list[EpisodeSpec]) -> list[EpisodeRecord]:
        try:
            # A TaskGroup cancels the other episodes when one raises (a policy that cannot work).
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._episode(s)) for s in specs]
        except BaseExceptionGroup as exc:
            raise exc.exceptions[0] from None
        return [t.result() for t in tasks]

    async def _episode(self, spec: EpisodeSpec) -> EpisodeRecord:
        async with self._active:
            live = await self._start(spec)
            try:
                while not live.done:
                    output = await self._generate(live)
                    await self._step(live, output)
            except asyncio.CancelledError:
                self._finish(live, "cancelled", notify=False)
                raise
            finally:
                self._release(live)
            return live.record

    async def _run_lockstep(self, specs: list[EpisodeSpec]) -> list[EpisodeRecord]:
        records: list[EpisodeRecord] = []
        for start in range(0, len(specs), self.max_active):
            wave = await asyncio.gather(
                *(self._start(s) for s in specs[start : start + self.max_active])
            )
            try:
                while True:
                    active = [live for live in wave if not live.done]
                    if not active:
                        break
                    outputs = await self._generate_round(active)
                    await asyncio.gather(
                        *(self._step(live, o) for live, o in zip(active, outputs, strict=True))
                    )
            finally:
                for live in wave:
                    if not live.done:
                        self._finish(live, "cancelled", notify=False)
                    self._release(live)
            records.extend(live.record for live in wave)
        return records

    # -- phases --------------------------------------------------------------------------------
    def _now(self) -> float:
        return time.perf_counter() - self._started

    async def _in_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))
        finally:
            self.stats.env_s += time.perf_counter() - started

    def _pool_key(self, spec: EpisodeSpec) -> tuple:
        return (spec.env_id, repr(sorted((spec.env_kwargs or {}).items())))

    async def _start(self, spec: EpisodeSpec) -> _Live:
        record = EpisodeRecord(
            spec.env_id, spec.group, spec.member, spec.task, spec.seed, started_s=self._now()
        )
        pool = self._pools.setdefault(self._pool_key(spec), [])
        env = pool.pop() if pool else None
        live = _Live(spec, env, record, self.policy.for_episode(spec))  # type: ignore[arg-type]
        try:
            if env is None:
                live.env = await self._in_thread(self.make_env, spec)
            prompt, info = await self._in_thread(
                live.env.reset, seed=spec.seed, options=spec.reset_options()
            )
        except Exception as exc:  # noqa: BLE001 - a bad task or env ends this episode only
            live.record.error = f"{type(exc).__name__}: {exc}"
            self._finish(live, "env_error")
            return live
        live.prompt, live.info = prompt, info
        record.task_id = info.get("task_id")
        record.task_type = info.get("task_type")
        record.initial_state_key = state_key_text(info.get("state_key"))
        return live

    async def _generate(self, live: _Live) -> PolicyOutput:
        """One episode's turn (async mode): a request slot, then :meth:`Policy.act`."""
        async with self._slots:
            return (await self._ask([live], batched=False))[0]

    async def _generate_round(self, active: list[_Live]) -> list[PolicyOutput]:
        """Every active episode's turn of a lockstep round in one :meth:`Policy.act_batch`."""
        return await self._ask(active, batched=True)

    async def _ask(self, lives: list[_Live], *, batched: bool) -> list[PolicyOutput]:
        messages = [[{"role": "user", "content": live.prompt}] for live in lives]
        # The version in force when the request is sent: a trainer may publish a new one while
        # the answer is on its way, and the turn was sampled from the weights asked.
        version = self.policy_version
        for _ in lives:
            self._in_flight.enter()
        started = time.perf_counter()
        try:
            if batched and all(live.policy is self.policy for live in lives):
                outputs = await self.policy.act_batch(
                    messages, self.params, [live.info for live in lives]
                )
            elif len(lives) == 1:  # an async episode's turn: awaited here, not in a new task
                outputs = [await lives[0].policy.act(messages[0], self.params, lives[0].info)]
            else:
                # per-episode policies (``Policy.for_episode``, e.g. an adapter's token context)
                # each answer their own turn; one that batches gathers the round itself
                outputs = list(
                    await asyncio.gather(
                        *(
                            live.policy.act(m, self.params, live.info)
                            for m, live in zip(messages, lives, strict=True)
                        )
                    )
                )
        except PolicyUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - a policy bug ends the turn, not the run
            error = f"{type(exc).__name__}: {exc}"
            outputs = [PolicyOutput("", error=error, error_kind="model_error") for _ in lives]
        finally:
            for _ in lives:
                self._in_flight.leave()
            self.stats.generation_s += time.perf_counter() - started
            self.stats.requests += len(lives)
        for output in outputs:
            output.latency_s = output.latency_s or (time.perf_counter() - started)
            output.policy_version = version
        return outputs

    async def _step(self, live: _Live, output: PolicyOutput) -> None:
        record = live.record
        if output.end_episode is not None:
            self._finish(live, output.end_episode)
            return
        from_key = state_key_text(live.info.get("state_key"))
        if output.error is not None:
            self.stats.errors[output.error_kind or "error"] = (
                self.stats.errors.get(output.error_kind or "error", 0) + 1
            )
            live.errors_in_a_row += 1
            action: Any = InvalidAction(f"No response from the model: {output.error}")
        else:
            live.errors_in_a_row = 0
            action = output.text
        started = time.perf_counter()
        try:
            prompt, reward, terminated, truncated, info = await self._in_thread(
                live.env.step, action
            )
        except Exception as exc:  # noqa: BLE001 - an env bug ends this episode only
            record.error = f"env step failed: {type(exc).__name__}: {exc}"
            self._finish(live, "env_error")
            return
        step_s = time.perf_counter() - started
        valid = bool(info.get("action_valid", True)) and output.error is None
        turn = Turn(
            index=len(record.turns),
            messages=output.messages or [{"role": "user", "content": live.prompt}],
            text=output.text,
            action=info.get("parsed_action") if output.error is None else None,
            action_valid=valid,
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            state_key=from_key,
            next_state_key=state_key_text(info.get("state_key")),
            policy_version=output.policy_version,
            latency_s=output.latency_s,
            step_s=step_s,
            token_ids=output.token_ids,
            logprobs=output.logprobs,
            prompt_ids=output.prompt_ids,
            prompt_tokens=output.prompt_tokens,
            completion_tokens=output.completion_tokens,
            parse_error=info.get("parse_error") if output.error is None else None,
            error=output.error,
            error_kind=output.error_kind,
            finish_reason=output.finish_reason,
            action_scores=output.action_scores,
            won=bool(info.get("won", False)),
            score=float(info.get("score", 0.0) or 0.0),
        )
        record.turns.append(turn)
        self.stats.turns += 1
        record.total_reward += turn.reward
        record.won = record.won or turn.won
        record.score = turn.score
        live.prompt, live.info = prompt, info
        if record.task_type is None and info.get("task_type"):
            record.task_type = info.get("task_type")
        if terminated:
            self._finish(live, "terminated")
        elif truncated:
            self._finish(live, "env_truncated")
        elif live.errors_in_a_row >= self.max_policy_errors:
            record.error = output.error
            self._finish(live, "policy_errors")
        elif self.max_turns is not None and len(record.turns) >= self.max_turns:
            self._finish(live, "max_turns")

    def _finish(self, live: _Live, reason: str, *, notify: bool = True) -> None:
        record = live.record
        live.done = True
        record.end_reason = reason
        record.terminated = reason == "terminated"
        record.truncated = reason != "terminated"
        record.wall_s = self._now() - record.started_s
        self.stats.episodes += 1
        if notify and self.on_episode is not None:
            self.on_episode(record)

    def _release(self, live: _Live) -> None:
        """Give the env back for the next episode (not after an env error: it may be broken)."""
        if live.env is not None and live.record.end_reason not in ("env_error", "cancelled"):
            self._pools.setdefault(self._pool_key(live.spec), []).append(live.env)

    def close(self) -> None:
        """Close the pooled envs."""
        for pool in self._pools.values():
            for env in pool:
                try:
                    env.close()
                except Exception:  # noqa: BLE001, S110 - closing is best effort
                    pass
        self._pools.clear()
