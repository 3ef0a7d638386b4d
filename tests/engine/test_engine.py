"""The engine's structure: groups share their initial state, episodes do not wait for each
other, requests in flight stay under the limit, and bad envs or tasks end one episode only.

The policy here is a scripted one (it answers the first admissible action) so that these tests
look at the engine's scheduling alone; the real model's paths are in test_realmodel.py.
"""

from __future__ import annotations

import asyncio
import threading

import gymnasium as gym
import pytest

from agentgym.engine import (
    EpisodeSpec,
    Policy,
    PolicyOutput,
    PolicyUnavailable,
    RolloutEngine,
    SamplingParams,
    make_episodes,
)
from agentgym.wrappers.llm import make_llm_env


class FirstAdmissible(Policy):
    """Answers ``<think>..</think><action>{first admissible}</action>``; logs every request."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.log: list[tuple[str, int]] = []  # (event, episode id) in order
        self.now = 0
        self.peak = 0
        self.served = 0
        self.served_event = threading.Event()
        self.serve_target = None

    async def act(self, messages, params, info=None):
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.now -= 1
        self.served += 1
        if self.serve_target is not None and self.served >= self.serve_target:
            self.served_event.set()
        action = (info or {}).get("admissible_actions", ["look"])[0]
        return PolicyOutput(f"<think>ok</think><action>{action}</action>", completion_tokens=3)


def _run(engine, specs):
    return asyncio.run(engine.run(specs))


def test_group_members_share_the_initial_state():
    specs = make_episodes("AgentGym/Sokoban-v0", tasks=[0, 3], group_size=3, seed=5)
    records = _run(RolloutEngine(FirstAdmissible(), max_turns=2, concurrency=4), specs)
    by_group = {}
    for rec in records:
        by_group.setdefault(rec.group, set()).add(rec.initial_state_key)
        assert rec.turns[0].state_key == rec.initial_state_key
    assert all(len(keys) == 1 for keys in by_group.values())
    assert by_group[0] != by_group[1]  # different tasks, different rooms
    assert [(r.group, r.member) for r in records] == [(g, m) for g in (0, 1) for m in range(3)]
    assert {r.turns[0].policy_version for r in records} == {0}


class BlockingStep(gym.Wrapper):
    """Its first step blocks until ``release`` is set (or 10 s pass)."""

    def __init__(self, env, release: threading.Event, flag: list):
        super().__init__(env)
        self.release = release
        self.flag = flag

    def step(self, action):
        if not self.flag:
            self.flag.append("blocked")
            self.flag.append(self.release.wait(timeout=10))  # False: nobody released it
        return self.env.step(action)


def _blocking_engine(policy, lockstep: bool, release, flag):
    def make_env(spec: EpisodeSpec):
        env = gym.make(spec.env_id)
        if spec.group == 0:
            env = BlockingStep(env, release, flag)
        return make_llm_env(env)

    return RolloutEngine(
        policy, SamplingParams(), max_turns=4, concurrency=4, lockstep=lockstep, make_env=make_env
    )


def test_a_slow_env_does_not_stall_the_other_episodes():
    # Episode 0's first step blocks until the other three episodes have been served 6 more
    # requests: only an engine that keeps generating for them while that step runs gets there.
    policy = FirstAdmissible()
    release, flag = threading.Event(), []
    policy.serve_target = 4 + 6  # 4 first turns, then 6 turns of the other episodes
    policy.served_event = release
    specs = make_episodes("AgentGym/Corridor-v0", tasks=4, group_size=1)
    records = _run(_blocking_engine(policy, False, release, flag), specs)
    assert flag == ["blocked", True]  # released by the policy, not by the 10 s guard
    assert all(len(r.turns) >= 1 for r in records)
    # the blocked episode finished after the others had run ahead of it
    assert len(records[0].turns) >= 1 and max(len(r.turns) for r in records[1:]) >= 3


def test_lockstep_waits_for_the_slowest_env():
    # The same setup in lockstep: no request is served while episode 0's step blocks (the
    # round waits for it), so a watchdog releases the step after looking at the count.
    policy = FirstAdmissible()
    release, flag = threading.Event(), []
    policy.serve_target = 4 + 1  # would be reached only if a request were served during the step
    served_during_block: list[int] = []

    def watchdog():
        # wait for the step to block, then check nothing was generated meanwhile and release
        while not flag:
            threading.Event().wait(0.01)
        threading.Event().wait(0.5)
        served_during_block.append(policy.served)
        release.set()

    threading.Thread(target=watchdog, daemon=True).start()
    policy.served_event = threading.Event()  # the policy must not release the step here
    specs = make_episodes("AgentGym/Corridor-v0", tasks=4, group_size=1)
    _run(_blocking_engine(policy, True, release, flag), specs)
    assert served_during_block == [4]  # only the first round: the others waited for episode 0


def test_requests_in_flight_stay_under_the_limit():
    policy = FirstAdmissible(delay=0.01)
    engine = RolloutEngine(policy, max_turns=3, concurrency=3)
    records = _run(engine, make_episodes("AgentGym/Corridor-v0", tasks=4, group_size=3))
    assert len(records) == 12
    assert policy.peak == 3 and engine.stats.max_in_flight == 3
    assert engine.stats.requests == sum(len(r.turns) for r in records)


def test_a_bad_task_ends_only_its_episode():
    specs = [
        EpisodeSpec("AgentGym/Corridor-v0", task=0, group=0),
        EpisodeSpec("AgentGym/Corridor-v0", task="no-such-task", group=1),
    ]
    records = _run(RolloutEngine(FirstAdmissible(), max_turns=2), specs)
    assert records[0].end_reason == "max_turns" and len(records[0].turns) == 2
    assert records[1].end_reason == "env_error" and records[1].turns == []
    assert "no-such-task" in records[1].error


def test_an_unusable_policy_fails_the_run_once():
    class Unusable(Policy):
        calls = 0

        async def act(self, messages, params, info=None):
            Unusable.calls += 1
            raise PolicyUnavailable("this policy needs prompt log-probs")

    with pytest.raises(PolicyUnavailable, match="prompt log-probs"):
        _run(RolloutEngine(Unusable()), make_episodes("AgentGym/Corridor-v0", tasks=3))


def test_alfworld_games_first_loaded_by_concurrent_resets_all_play():
    """The engine resets envs in a thread pool; ALFWorld's shared per-game caches parse
    TextWorld grammar on first use, with parsers that are not thread-safe. Cold caches and many
    concurrent resets on the same games: every episode must play, none end in an env error."""
    from agentgym.envs.alfworld.engine import clear_game_cache
    from agentgym.envs.alfworld.grammar import parse_query, parse_symbols

    for attempt in range(3):  # a race: cold caches each time, so each attempt can catch it
        clear_game_cache()
        parse_symbols.cache_clear()
        parse_query.cache_clear()
        specs = make_episodes("AgentGym/ALFWorld-Synthetic-v0", tasks=[0, 1, 2], group_size=4)
        records = _run(RolloutEngine(FirstAdmissible(), max_turns=1, concurrency=16), specs)
        errors = [r.error for r in records if r.end_reason == "env_error"]
        assert not errors, f"attempt {attempt}: {errors}"
        assert all(len(r.turns) == 1 for r in records)


class PublishesMidRequest(Policy):
    """Answers after the trainer publishes a new version: each request, once sent, bumps the
    engine's ``policy_version`` (as a trainer finishing an update meanwhile would), then answers
    with the version it was sent under."""

    def __init__(self):
        self.engine = None
        self.sent_under: list[int] = []

    async def act(self, messages, params, info=None):
        self.sent_under.append(self.engine.policy_version)
        await asyncio.sleep(0)
        self.engine.policy_version += 1  # a new version published while the answer is on its way
        await asyncio.sleep(0)
        action = (info or {}).get("admissible_actions", ["look"])[0]
        return PolicyOutput(f"<think>ok</think><action>{action}</action>")


@pytest.mark.parametrize("lockstep", [False, True])
def test_turns_carry_the_version_their_request_was_sent_under(lockstep):
    policy = PublishesMidRequest()
    engine = RolloutEngine(policy, max_turns=3, concurrency=1, lockstep=lockstep)
    policy.engine = engine
    engine.policy_version = 0
    (record,) = _run(engine, make_episodes("AgentGym/Sokoban-v0", tasks=[0]))
    versions = [t.policy_version for t in record.turns]
    assert len(versions) == 3
    # Tagged with the version in force when each request went out, not when its answer came.
    assert versions == policy.sent_under == [0, 1, 2]


def test_the_local_models_batches_keep_padding_small():
    """The in-process model's worker batches the oldest request with those of similar prompt
    length: a batch is computed at its longest prompt's length, so a 170-token prompt batched
    with a 720-token one would cost 720 tokens (what a mixed-family eval did on CPU)."""
    from agentgym.engine.policies.transformers import (
        MAX_PADDING_TOKENS,
        _Job,
        padding_bounded_batch,
    )

    def job(length):
        return _Job("generate", [0] * length, SamplingParams(), None, None, None)

    head, *others = [job(n) for n in (169, 720, 198, 610, 245, 524)]
    batch = padding_bounded_batch(head, others, max_batch=32)
    assert batch[0] is head  # the oldest request is always served
    assert sorted(len(j.prompt_ids) for j in batch) == [169, 198, 245]
    lengths = [len(j.prompt_ids) for j in batch]
    assert max(lengths) * len(lengths) - sum(lengths) <= 0.25 * sum(lengths)
    # the long ones batch with each other when one of them is the oldest
    long = padding_bounded_batch(others[0], [others[2], others[4]], max_batch=32)
    assert sorted(len(j.prompt_ids) for j in long) == [524, 610, 720]
    # short prompts batch whatever their spread (a few padded tokens cost less than a pass)
    short = [job(n) for n in (10, 40, 50)]
    assert padding_bounded_batch(short[0], short[1:], max_batch=32) == short
    assert sum(50 - n for n in (10, 40, 50)) <= MAX_PADDING_TOKENS
    # and never past max_batch
    same = [job(100) for _ in range(10)]
    assert len(padding_bounded_batch(same[0], same[1:], max_batch=4)) == 4


def test_the_local_model_renders_each_distinct_prompt_once():
    """Group members share their first prompt and small envs revisit states: the chat template
    (most of a tiny model's turn on CPU) is rendered once per distinct conversation, and the
    ids are those a fresh rendering gives."""
    from agentgym.engine import TransformersPolicy
    from agentgym.engine.policies.transformers import chat_prompt_ids
    from trainers.gigpo.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer(["go up down left right you are in a room"])
    policy = TransformersPolicy(build_model(tokenizer), tokenizer, seed=None)
    room = [{"role": "user", "content": "you are in a room"}]
    reference = chat_prompt_ids(tokenizer, room)
    renders = []
    template = tokenizer.apply_chat_template

    def counting(*args, **kwargs):
        renders.append(args[0])
        return template(*args, **kwargs)

    tokenizer.apply_chat_template = counting
    first = policy.prompt_ids(room)
    first.append(-1)  # a caller's change never reaches the memo
    again = policy.prompt_ids([dict(m) for m in room])
    assert len(renders) == 1 and again == reference
    other = policy.prompt_ids([*room, {"role": "assistant", "content": "go up"}])
    assert len(renders) == 2 and other != again
    # a new chat template is a new rendering
    tokenizer.chat_template = tokenizer.chat_template + " "
    assert policy.prompt_ids(room) == reference and len(renders) == 3
