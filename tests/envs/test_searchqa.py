"""Search-augmented QA: the synthetic knowledge base, the env's contract, Search-R1's formats,
real-data files (parquet and JSONL) over in-process, index-folder and HTTP retrievers, and the
LLM wrapper end to end."""

from __future__ import annotations

import functools
import json
import pickle
import random
import re
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym
from agentgym.core import ResetOptionError
from agentgym.envs.searchqa import (
    DATA_ENV,
    RETRIEVER_ENV,
    ScriptedSearchPolicy,
    SearchQAEnv,
    build_knowledge_base,
    data_status,
    knowledge_base,
    load_questions,
    parse_qa_action,
    parse_question,
    passages_to_string,
)
from agentgym.envs.searchqa.synthetic import QUESTION_TEMPLATES, RELATIONS
from agentgym.retrieval.base import Hit
from agentgym.retrieval.sparse import BM25Retriever
from agentgym.rollout import run_group_rollout
from agentgym.wrappers.llm import make_llm_env

INFO_RE = re.compile(r"<information>(.*)</information>", re.DOTALL)


def play(env, policy, seed=None, task=None, split=None):
    """One episode; returns (observations, actions, rewards, infos)."""
    options = {k: v for k, v in (("task", task), ("split", split)) if v is not None}
    obs, info = env.reset(seed=seed, options=options or None)
    observations, actions, rewards, infos = [obs], [], [], [info]
    done = False
    while not done:
        action = policy([obs], [info])[0]
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        observations.append(obs)
        actions.append(action)
        rewards.append(reward)
        infos.append(info)
    return observations, actions, rewards, infos


def random_suggested(rng):
    def policy(obs, infos):
        choices = infos[0]["suggested_actions"]
        return [choices[int(rng.integers(len(choices)))]]

    return policy


@pytest.fixture(scope="module")
def env():
    e = SearchQAEnv(synthetic=True)
    yield e
    e.close()


# ---------------------------------------------------------------------------------------------
# The synthetic knowledge base
# ---------------------------------------------------------------------------------------------


def test_build_is_seeded_fast_and_labelled():
    start = time.perf_counter()
    a = build_knowledge_base(seed=3)
    elapsed = time.perf_counter() - start
    b = build_knowledge_base(seed=3)
    c = build_knowledge_base(seed=4)
    assert elapsed < 1.0
    assert a.passages == b.passages and a.questions == b.questions
    assert a.passages != c.passages
    assert knowledge_base(0) is knowledge_base(0)  # one build per process
    assert all(q.record()["data_source"] == "synthetic" for q in a.questions)


def test_splits_never_overlap_and_cover_every_question():
    kb = knowledge_base(0)
    ids = {s: {q.id for q in kb.split(s)} for s in ("train", "valid", "test")}
    texts = {s: {q.question for q in kb.split(s)} for s in ("train", "valid", "test")}
    assert sum(map(len, ids.values())) == len(kb.questions) == len({q.id for q in kb.questions})
    for a, b in (("train", "valid"), ("train", "test"), ("valid", "test")):
        assert not ids[a] & ids[b] and not texts[a] & texts[b]
    assert len(ids["train"]) > 4 * len(ids["test"]) > 0


def test_questions_need_retrieval_and_every_hop_is_stated_in_a_passage():
    kb = knowledge_base(0)
    hops = {q.hops for q in kb.questions}
    assert hops == {1, 2, 3}
    texts = [p["contents"] for p in kb.passages]
    templates = {t.name: t for t in QUESTION_TEMPLATES}
    for q in kb.questions:
        assert q.golden_answers[0] not in q.question
        assert q.golden_answers[0] == q.bridges[-1]
        assert kb.answer_chain(q.start, templates[q.template].chain) == list(q.bridges)
        # every link (subject -> object) is written as the relation's sentence somewhere
        subject = q.start
        for rel, obj in zip(templates[q.template].chain, q.bridges, strict=True):
            pattern = re.compile(RELATIONS[rel][3].format(s=re.escape(subject)))
            assert any((m := pattern.search(t)) and m.group(1) == obj for t in texts), (
                rel,
                subject,
            )
            subject = obj


def test_passages_are_in_search_r1_corpus_format():
    kb = knowledge_base(0)
    ids = [p["id"] for p in kb.passages]
    assert len(set(ids)) == len(ids)
    for p in kb.passages:
        title, _, text = p["contents"].partition("\n")
        assert title.startswith('"') and title.endswith('"') and text
        assert text.isascii()


# ---------------------------------------------------------------------------------------------
# Actions, observations, turns
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "action, expected",
    [
        ("search[Leivix Trousachan]", ("search", "Leivix Trousachan")),
        ("  Search [ who  wrote [Hamlet] ]  ", ("search", "who wrote [Hamlet]")),
        ("answer[Paris]", ("answer", "Paris")),
        ("ANSWER[ the  Eiffel\nTower ]", ("answer", "the Eiffel Tower")),
    ],
)
def test_parse_valid_actions(action, expected):
    assert parse_qa_action(action) == expected


@pytest.mark.parametrize(
    "action",
    ["look", "", "search", "search[]", "search[   ]", "answer[]", "ask[x]", "search x",
     "search[x", "x search[y]", "search[" + "q" * 3000 + "]"],
)  # fmt: skip
def test_parse_invalid_actions(action):
    assert isinstance(parse_qa_action(action), str)


def test_reset_gives_the_question_and_the_contract_info(env):
    obs, info = env.reset(seed=0)
    assert obs == info["question"] and obs.endswith("?")
    assert info["task_id"].startswith("synthetic-train-")
    assert info["admissible_actions"] is None
    assert info["synthetic"] is True and info["data_source"] == "synthetic"
    assert info["state_key"] == (info["task_id"], frozenset(), None)
    assert info["won"] is False and info["score"] == 0.0
    assert "golden_answers" not in info


def test_search_observation_is_search_r1s_information_block(env):
    obs, info = env.reset(options={"task": 0})
    query = parse_question(obs)[0]
    obs, reward, terminated, truncated, info = env.step(f"search[{query}]")
    hits = env.unwrapped._retriever.search([query], 3)[0]
    assert len(hits) == 3
    expected = "".join(
        f"Doc {i + 1}(Title: {h.document['contents'].split(chr(10))[0]}) "
        f"{h.document['contents'].split(chr(10), 1)[1]}\n"
        for i, h in enumerate(hits)
    )
    assert obs == f"<information>{expected.strip()}</information>"
    assert re.match(r'<information>Doc 1\(Title: "[^"]+"\) ', obs)
    assert obs.count("Doc ") == 3 and "Doc 4(" not in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["action_valid"] is True
    assert info["state_key"][1] == frozenset(h.doc_id for h in hits)


def test_passages_to_string_keeps_quotes_and_inner_newlines():
    hits = [
        Hit("7", 2.0, {"id": "7", "contents": '"Hamlet"\nHamlet is a tragedy.\nBy Shakespeare.'}),
        Hit("9", 1.0, {"id": "9", "contents": '"O\'Neil (film)"\nA "quoted" word.'}),
        Hit("3", 0.5, {"id": "3", "contents": "No newline at all"}),
    ]
    assert passages_to_string(hits) == (
        'Doc 1(Title: "Hamlet") Hamlet is a tragedy.\nBy Shakespeare.\n'
        'Doc 2(Title: "O\'Neil (film)") A "quoted" word.\n'
        "Doc 3(Title: No newline at all) \n"
    )


def test_topk_is_configurable():
    e = SearchQAEnv(synthetic=True, topk=5)
    obs, _ = e.reset(options={"task": 0})
    obs, *_ = e.step(f"search[{parse_question(obs)[0]}]")
    assert obs.count("(Title: ") == 5


def test_four_turns_then_truncated():
    env = gym.make("AgentGym/SearchQA-Synthetic-v0")  # the registered cap: 4 turns
    obs, info = env.reset(seed=1)
    for turn in range(1, 5):
        obs, reward, terminated, truncated, info = env.step(f"search[query number {turn}]")
        assert reward == 0.0 and not terminated
        assert truncated == (turn == 4)
    assert info["won"] is False and info["score"] == 0.0
    # a finished episode changes nothing
    obs2, reward, terminated, truncated, info2 = env.step("answer[anything]")
    assert (obs2, reward, terminated, truncated) == (obs, 0.0, False, True)
    assert info2["action_valid"] is False and info2["state_key"] == info["state_key"]


def test_answer_on_the_last_turn_terminates_rather_than_truncates(env):
    obs, info = env.reset(options={"task": 5})
    for _ in range(3):
        env.step("search[something]")
    golden = knowledge_base(0).split("train")[5].golden_answers[0]
    obs, reward, terminated, truncated, info = env.step(f"answer[{golden}]")
    assert (reward, terminated, truncated) == (1.0, True, False)


def test_max_episode_steps_is_configurable():
    e = SearchQAEnv(synthetic=True, max_episode_steps=2)
    e.reset(seed=0)
    assert e.step("search[a]")[3] is False
    assert e.step("search[b]")[3] is True
    assert SearchQAEnv(synthetic=True).max_episode_steps is None  # the registry holds the cap


def test_max_turns_is_the_deprecated_name_of_the_cap():
    with pytest.warns(DeprecationWarning, match="max_episode_steps"):
        e = SearchQAEnv(synthetic=True, max_turns=3)
    assert e.max_episode_steps == 3


def test_answer_scores_exact_match_and_reports_f1(env):
    kb = knowledge_base(0)
    q = kb.split("train")[3]
    obs, info = env.reset(options={"task": q.id})
    assert info["task_id"] == q.id
    obs, reward, terminated, truncated, info = env.step(f"answer[  the {q.golden_answers[0]}!! ]")
    assert obs == "" and (reward, terminated, truncated) == (1.0, True, False)
    assert info["won"] is True and info["score"] == 1.0 and info["f1"] == 1.0
    assert info["answer"] == f"the {q.golden_answers[0]}!!"
    assert info["golden_answers"] == list(q.golden_answers)
    assert info["state_key"] == (q.id, frozenset(), q.golden_answers[0].lower())

    env.reset(options={"task": q.id})
    obs, reward, terminated, truncated, info = env.step(f"answer[{q.golden_answers[0]} City]")
    assert (reward, terminated) == (0.0, True)
    assert info["won"] is False and info["score"] == 0.0
    assert info["f1"] == pytest.approx(2 / 3)


def test_reward_scale():
    e = SearchQAEnv(synthetic=True, reward_scale=10.0)
    q = knowledge_base(0).split("train")[0]
    e.reset(options={"task": q.id})
    assert e.step(f"answer[{q.golden_answers[0]}]")[1] == 10.0


@pytest.mark.parametrize(
    "action", ["look", "search[]", "search[   ]", "ask[Paris]", "search Paris", "answer[", None, 3]
)
def test_invalid_actions_change_nothing_but_cost_a_turn(env, action):
    obs, info = env.reset(seed=2)
    env.step("search[" + parse_question(obs)[0] + "]")
    key = env.unwrapped.state_key()
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["action_valid"] is False
    assert info["state_key"] == key
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.unwrapped.elapsed_steps == 2
    if isinstance(action, str):
        assert "search[<query>]" in obs and "answer[<answer>]" in obs
    assert "suggested_actions" in info and info["question"]


# ---------------------------------------------------------------------------------------------
# state_key
# ---------------------------------------------------------------------------------------------


def _hit_ids(env, query):
    return frozenset(h.doc_id for h in env.unwrapped._retriever.search([query], 3)[0])


def test_same_passages_by_different_query_words_give_the_same_state(env):
    obs, _ = env.reset(options={"task": 0})
    name = parse_question(obs)[0]
    variants = [name, f"who is {name}", f"{name} born", f"{name} biography", f"{name} person"]
    variants += [f"{name} married", f"{name} novelist", f"tell me about {name}"]
    groups: dict[frozenset, list[str]] = {}
    for v in variants:
        groups.setdefault(_hit_ids(env, v), []).append(v)
    # two queries with different words that retrieve the same passages
    a, b = next(vs for vs in groups.values() if len(vs) >= 2)[:2]
    assert set(a.lower().split()) != set(b.lower().split())
    env.reset(options={"task": 0})
    obs_a, *_, info_a = env.step(f"search[{a}]")
    env.reset(options={"task": 0})
    obs_b, *_, info_b = env.step(f"search[{b}]")
    assert info_a["state_key"] == info_b["state_key"]
    assert info_a["state_key"][1] == _hit_ids(env, a)


def test_state_key_is_order_independent_and_passages_distinguish_states(env):
    kb = knowledge_base(0)
    q = next(q for q in kb.split("train") if q.hops == 2)
    first, second = q.start, q.bridges[0]
    assert _hit_ids(env, first) != _hit_ids(env, second)
    env.reset(options={"task": q.id})
    env.step(f"search[{first}]")
    only_first = env.unwrapped.state_key()
    *_, ab = env.step(f"search[{second}]")
    env.reset(options={"task": q.id})
    *_, b_only = env.step(f"search[{second}]")
    *_, ba = env.step(f"search[{first}]")
    assert ab["state_key"] == ba["state_key"]
    assert b_only["state_key"] != only_first
    assert ab["state_key"][1] == _hit_ids(env, first) | _hit_ids(env, second)
    # the same search twice adds nothing
    *_, again = env.step(f"search[{first}]")
    assert again["state_key"] == ba["state_key"]
    # another question with the same passages is another state
    other = kb.split("train")[1]
    env.reset(options={"task": other.id})
    *_, info = env.step(f"search[{first}]")
    assert info["state_key"] != only_first and info["state_key"][1] == only_first[1]


# ---------------------------------------------------------------------------------------------
# Tasks and splits
# ---------------------------------------------------------------------------------------------


def test_seeds_tasks_and_splits(env):
    a = env.reset(seed=11)[1]["task_id"]
    b = env.reset(seed=11)[1]["task_id"]
    assert a == b
    assert len({env.reset(seed=s)[1]["task_id"] for s in range(10)}) > 5
    info = env.reset(options={"task": "synthetic-test-00004"})[1]
    assert info["task_id"] == "synthetic-test-00004" and env.unwrapped.split == "test"
    assert env.unwrapped.num_tasks == len(knowledge_base(0).split("test"))
    info = env.reset(options={"split": "valid", "task": -1})[1]
    assert info["task_id"] == knowledge_base(0).split("valid")[-1].id
    for bad in ({"task": 10_000}, {"task": "no-such-question"}, {"split": "nope"}):
        with pytest.raises(ResetOptionError):
            env.reset(options=bad)
    env.reset(options={"split": "train"})


# ---------------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------------


def test_scripted_policy_wins_most_and_random_far_fewer():
    env = SearchQAEnv(synthetic=True, split="test")
    n = env.num_tasks
    scripted = ScriptedSearchPolicy()
    wins = [play(env, scripted, task=i)[3][-1]["won"] for i in range(n)]
    rng = np.random.default_rng(0)
    random_wins = [play(env, random_suggested(rng), task=i)[3][-1]["won"] for i in range(n)]
    scripted_rate, random_rate = float(np.mean(wins)), float(np.mean(random_wins))
    assert scripted_rate >= 0.9, scripted_rate
    assert random_rate <= 0.25, random_rate
    assert scripted_rate - random_rate >= 0.6


def test_scripted_policy_follows_the_hops_through_retrieval():
    env = SearchQAEnv(synthetic=True)
    q = next(q for q in knowledge_base(0).split("train") if q.hops == 3)
    observations, actions, rewards, infos = play(env, ScriptedSearchPolicy(), task=q.id)
    assert [a.split("[")[0] for a in actions] == ["search"] * 3 + ["answer"]
    assert actions[-1] == f"answer[{q.golden_answers[0]}]" and rewards[-1] == 1.0
    # it searched each bridge entity after reading it in a passage
    for bridge, action, seen in zip(q.bridges[:2], actions[1:3], observations[1:3], strict=True):
        assert bridge in seen and action.startswith(f"search[{bridge}")


def test_group_rollout_with_the_scripted_and_the_suggested_random_policy():
    report = run_group_rollout(
        "AgentGym/SearchQA-Synthetic-v0", 4, 3, seed=0, policy=ScriptedSearchPolicy()
    )
    assert report.success_rate >= 0.9 and report.invalid_fraction == 0.0
    # trajectories of a group that searched the same entities share anchor states
    assert report.state_groups.shared_fraction > 0.5

    def suggested(obs, infos, rng):
        return [
            i["suggested_actions"][int(rng.integers(len(i["suggested_actions"])))] for i in infos
        ]

    report = run_group_rollout("AgentGym/SearchQA-Synthetic-v0", 4, 3, seed=0, policy=suggested)
    assert report.invalid_fraction == 0.0 and report.mean_length <= 4


def test_env_never_touches_the_global_random_state():
    random.seed(5)
    np.random.seed(5)
    py_state, np_state = random.getstate(), np.random.get_state()[1].copy()
    env = SearchQAEnv(synthetic=True)
    play(env, ScriptedSearchPolicy(), seed=3)
    play(env, random_suggested(np.random.default_rng(1)), seed=4)
    assert random.getstate() == py_state
    assert np.array_equal(np.random.get_state()[1], np_state)


# ---------------------------------------------------------------------------------------------
# Sharing, pickling, errors
# ---------------------------------------------------------------------------------------------


def test_envs_of_a_process_share_one_dataset_and_one_retriever():
    a, b = SearchQAEnv(synthetic=True), SearchQAEnv(synthetic=True)
    assert a._retriever is b._retriever and a._dataset is b._dataset
    start = time.perf_counter()
    for _ in range(20):
        SearchQAEnv(synthetic=True)
    assert time.perf_counter() - start < 0.5  # nothing is rebuilt per env


def test_pickle_round_trip_mid_episode(env):
    obs, _ = env.reset(options={"task": 7})
    env.step(f"search[{parse_question(obs)[0]}]")
    clone = pickle.loads(pickle.dumps(env))
    assert clone.unwrapped._retriever is env.unwrapped._retriever  # reopened from the cache
    for action in ("search[capital]", "answer[x]"):
        a, b = env.step(action), clone.step(action)
        assert a[:4] == b[:4] and a[4]["state_key"] == b[4]["state_key"]


def test_missing_data_names_the_variables_and_the_synthetic_id(monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)
    monkeypatch.delenv(RETRIEVER_ENV, raising=False)
    with pytest.raises(FileNotFoundError) as err:
        gym.make("AgentGym/SearchQA-v0")
    for needle in (DATA_ENV, RETRIEVER_ENV, "AgentGym/SearchQA-Synthetic-v0"):
        assert needle in str(err.value)
    assert "SearchQA-Synthetic-v0" in data_status()


def test_data_status_describes_what_it_finds(monkeypatch, search_r1_dir):
    monkeypatch.setenv(DATA_ENV, str(search_r1_dir / "test.parquet"))
    monkeypatch.setenv(RETRIEVER_ENV, "http://127.0.0.1:9/retrieve")
    status = data_status()
    n = len(knowledge_base(0).split("test"))
    assert f"({n} questions)" in status and "server" in status
    assert agentgym.entry("AgentGym/SearchQA-v0").describe_data() == status


def test_retriever_argument_is_checked(search_r1_dir):
    with pytest.raises(FileNotFoundError, match="agentgym retrieval index"):
        SearchQAEnv(data=search_r1_dir / "test.parquet", retriever=search_r1_dir / "missing")
    with pytest.raises(TypeError, match="search"):
        SearchQAEnv(data=search_r1_dir / "test.parquet", retriever=42)


# ---------------------------------------------------------------------------------------------
# Real-data path: Search-R1's files, three kinds of retriever
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def search_r1_dir(searchqa_files) -> Path:
    """The synthetic benchmark as Search-R1's files (corpus.jsonl, <split>.parquet) and a BM25
    index folder (bm25/) built by the retrieval stack: see tests/conftest.py."""
    return searchqa_files


@pytest.fixture(scope="module")
def corpus_retriever(search_r1_dir) -> BM25Retriever:
    docs = [json.loads(line) for line in open(search_r1_dir / "corpus.jsonl", encoding="utf-8")]
    return BM25Retriever.from_documents(docs)


def test_search_r1_parquet_is_read_as_written(search_r1_dir):
    ds = load_questions(search_r1_dir / "test.parquet")
    kb_test = knowledge_base(0).split("test")
    assert [q for q in ds.questions] == [q.question for q in kb_test]
    assert [list(a) for a in ds.golden_answers] == [list(q.golden_answers) for q in kb_test]
    assert ds.ids[0] == f"synthetic/{kb_test[0].id}" and set(ds.data_sources) == {"synthetic"}
    assert load_questions(search_r1_dir / "test.parquet") is ds  # cached per process
    # a folder picks <split>.parquet; "valid" also finds dev.parquet
    assert load_questions(search_r1_dir, "test").questions == ds.questions
    assert len(load_questions(search_r1_dir, "valid")) == len(knowledge_base(0).split("valid"))


def test_files_without_question_or_golden_answers_columns(tmp_path):
    """Search-R1's required columns are prompt and reward_model; question/golden_answers are
    FlashRAG's columns that its scripts keep. Either source works."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": "Answer it. Question: who wrote hamlet?\n"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}},
            "extra_info": {"split": "test", "index": 0},
        },
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": "Answer it. Question: capital of peru?\n"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": ["Lima"]}},
            "extra_info": {"split": "train", "index": 1},
        },
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "nq.parquet")
    ds = load_questions(tmp_path / "nq.parquet")
    assert ds.questions == ("who wrote hamlet?", "capital of peru?")
    assert ds.golden_answers == (("Shakespeare",), ("Lima",))
    assert ds.ids == ("nq/0", "nq/1")
    assert load_questions(tmp_path / "nq.parquet", "train").questions == ("capital of peru?",)


def test_jsonl_questions_with_merged_sources_and_repeated_ids(tmp_path, corpus_retriever):
    path = tmp_path / "mixed.jsonl"
    rows = [
        {"id": "test_0", "question": "Where was Mamom Zoufork born?", "golden_answers": "Feveimeim",
         "data_source": "hotpotqa"},
        {"id": "test_0", "question": "Where was Mamom Zoufork born?", "golden_answers": ["Feveimeim"],
         "data_source": "bamboogle"},
        {"id": "test_0", "question": "Where was Mamom Zoufork born?", "golden_answers": ["x"],
         "data_source": "bamboogle"},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    env = SearchQAEnv(data=path, retriever=corpus_retriever)
    assert env.task_ids == ["hotpotqa/test_0@0", "bamboogle/test_0@1", "bamboogle/test_0@2"]
    obs, info = env.reset(options={"task": 1})
    assert info["data_source"] == "bamboogle" and info["synthetic"] is False
    assert env.step("answer[feveimeim]")[1] == 1.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "golden_answers": ["a"]}\n{not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_questions(bad)


def test_split_selection_on_files_and_folders(search_r1_dir, corpus_retriever, tmp_path):
    env = SearchQAEnv(data=search_r1_dir, retriever=corpus_retriever)  # folder: test by default
    assert env.num_tasks == len(knowledge_base(0).split("test"))
    env.reset(options={"split": "train"})
    assert env.num_tasks == len(knowledge_base(0).split("train"))
    # one file holding two splits, told apart by extra_info.split
    env = SearchQAEnv(
        data=search_r1_dir / "valid.parquet", retriever=corpus_retriever, split="valid"
    )
    assert env.num_tasks == len(knowledge_base(0).split("valid"))
    jsonl = tmp_path / "nosplit.jsonl"
    jsonl.write_text(json.dumps({"question": "q?", "golden_answers": ["a"]}) + "\n")
    env = SearchQAEnv(data=jsonl, retriever=corpus_retriever)
    with pytest.raises(ResetOptionError, match="no split column"):
        env.reset(options={"split": "train"})


def test_split_option_never_reads_outside_the_data_folder(
    search_r1_dir, corpus_retriever, tmp_path
):
    """A split names a question file inside the data folder; nothing else reaches the disk, and
    no refusal shows a path of this machine or whether a file exists."""
    import shutil

    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("train.parquet", "test.parquet"):
        shutil.copy(search_r1_dir / name, folder / name)
    (folder / "broken.jsonl").write_text("{not json\n", encoding="utf-8")
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = {"question": "THE SECRET QUESTION?", "golden_answers": ["hush"]}
    (outside / "secret.jsonl").write_text(json.dumps(secret) + "\n", encoding="utf-8")
    (tmp_path / "data.jsonl").write_text(json.dumps(secret) + "\n", encoding="utf-8")
    env = SearchQAEnv(data=folder, retriever=corpus_retriever)
    env.reset(seed=0)
    n_test = env.num_tasks
    refused = [
        "../outside/secret",
        "../data",
        "..",
        "a/b",
        "/etc/passwd",
        "no-such-split",
        "broken",
        ["train"],
        "",
    ]
    for split in refused:
        with pytest.raises(ResetOptionError) as err:
            env.reset(seed=0, options={"split": split})
        message = str(err.value)
        assert str(tmp_path) not in message and "SECRET" not in message, message
        assert env.split is None and env.num_tasks == n_test  # a refusal leaves the env as it was
    # the message of an unknown split lists the splits present, by name
    with pytest.raises(ResetOptionError, match="'broken', 'test', 'train'"):
        env.reset(options={"split": "valid"})
    # a split present in the folder still works, and so does its alias
    obs, info = env.reset(seed=0, options={"split": "train"})
    assert info["split"] == "train" and "SECRET" not in obs
    # a question id of another file is refused by name, not by path
    with pytest.raises(ResetOptionError) as err:
        env.reset(options={"task": "../outside/secret"})
    assert str(tmp_path) not in str(err.value) and "train.parquet" in str(err.value)
    # a single file: the split filters rows; an unknown one is refused without the path
    env = SearchQAEnv(
        data=search_r1_dir / "valid.parquet", retriever=corpus_retriever, split="valid"
    )
    with pytest.raises(ResetOptionError) as err:
        env.reset(options={"split": "../outside/secret"})
    assert str(search_r1_dir) not in str(err.value)


def test_real_path_matches_the_synthetic_env_step_for_step(search_r1_dir, corpus_retriever):
    """Search-R1 files + the same BM25 over the written corpus = the synthetic env's episodes."""
    real = SearchQAEnv(data=search_r1_dir / "test.parquet", retriever=corpus_retriever)
    synthetic = SearchQAEnv(synthetic=True, split="test")
    for task in range(0, real.num_tasks, 9):
        a = play(real, ScriptedSearchPolicy(), task=task)
        b = play(synthetic, ScriptedSearchPolicy(), task=task)
        assert a[0] == b[0] and a[1] == b[1] and a[2] == b[2]
        assert a[3][-1]["state_key"][1:] == b[3][-1]["state_key"][1:]
        assert a[3][-1]["task_id"] == "synthetic/" + b[3][-1]["task_id"]


def test_real_path_over_a_retrieval_server(search_r1_dir, corpus_retriever):
    from agentgym.retrieval.server import create_app, serve_in_thread

    with serve_in_thread(create_app(corpus_retriever)) as server:
        env = SearchQAEnv(data=search_r1_dir / "test.parquet", retriever=server.url + "/retrieve")
        local = SearchQAEnv(data=search_r1_dir / "test.parquet", retriever=corpus_retriever)
        for task in (0, 1, 2):
            assert (
                play(env, ScriptedSearchPolicy(), task=task)[:3]
                == play(local, ScriptedSearchPolicy(), task=task)[:3]
            )
        # the client cannot be pickled; the env pickles the URL and reopens it
        env.reset(options={"task": 0})
        clone = pickle.loads(pickle.dumps(env))
        assert clone.step("search[capital]")[0] == env.step("search[capital]")[0]


def test_real_path_over_an_index_folder(search_r1_dir):
    env = SearchQAEnv(data=search_r1_dir / "test.parquet", retriever=search_r1_dir / "bm25")
    assert type(env._retriever).__name__ == "BM25Retriever"
    wins = [play(env, ScriptedSearchPolicy(), task=i)[3][-1]["won"] for i in range(env.num_tasks)]
    assert np.mean(wins) >= 0.9


def test_unicode_passages_and_questions_stay_in_the_observation_space(tmp_path):
    docs = [
        {"id": "1", "contents": '"Zürich"\nZürich – the largest city in Switzerland.'},
        {"id": "2", "contents": '"Genève"\nGenève is French-speaking.'},
    ]
    path = tmp_path / "q.jsonl"
    path.write_text(
        json.dumps({"question": "Größte Stadt der Schweiz?", "golden_answers": ["Zürich"]})
    )
    env = SearchQAEnv(data=path, retriever=BM25Retriever.from_documents(docs))
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    obs, *_ = env.step("search[Zürich city]")
    assert 'Doc 1(Title: "Zürich") Zürich – the largest' in obs
    assert env.observation_space.contains(obs)
    assert not env.observation_space.contains("bell\x07")
    assert env.step("answer[zürich]")[1] == 1.0


# ---------------------------------------------------------------------------------------------
# The LLM wrapper, end to end
# ---------------------------------------------------------------------------------------------


def test_llm_wrapper_end_to_end():
    kb = knowledge_base(0)
    q = next(q for q in kb.split("train") if q.hops == 2)
    env = make_llm_env("AgentGym/SearchQA-Synthetic-v0", history_length=4)
    prompt, info = env.reset(options={"task": q.id})
    assert f"Your question: {q.question}" in prompt and "<search> your query </search>" in prompt

    prompt, reward, terminated, truncated, info = env.step(
        f"<think>I need {q.start} first.</think>\n<search> {q.start} </search>"
    )
    assert info["parsed_action"] == f"search[{q.start}]" and info["action_valid"] is True
    raw = info["raw_observation"]
    assert raw.startswith("<information>Doc 1(Title: ")
    assert f"<search> {q.start} </search>\n{raw}" in prompt
    # the history intro names the tag once; the result appears in one block, not nested
    assert prompt.count("<information>") == 2 and "<information> <information>" not in prompt

    prompt, reward, terminated, truncated, info = env.step("<search>a</search><answer>b</answer>")
    assert info["action_valid"] is False and "not both" in info["parse_error"]
    assert reward == 0.0 and not terminated

    prompt, reward, terminated, truncated, info = env.step(
        f"<think>so</think><answer> {q.golden_answers[0]} </answer>"
    )
    assert info["parsed_action"] == f"answer[{q.golden_answers[0]}]"
    assert (reward, terminated, truncated) == (1.0, True, False) and info["won"] is True


def test_llm_wrapper_turn_limit_counts_unparseable_responses():
    env = make_llm_env("AgentGym/SearchQA-Synthetic-v0")
    env.reset(seed=0)
    flags = [env.step("I don't know the format")[2:4] for _ in range(4)]
    assert flags == [(False, False)] * 3 + [(False, True)]


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.text(max_size=80),
        st.builds(lambda v, c: f"{v}[{c}]", st.sampled_from(["search", "answer", "ask", ""]),
                  st.text(max_size=40)),
    )
)  # fmt: skip
def test_any_text_action_is_handled(action):
    env = _fuzz_env()
    obs, info = env.reset(options={"task": 0})
    key = info["state_key"]
    obs, reward, terminated, truncated, info = env.step(action)
    assert env.observation_space.contains(obs)
    parsed = parse_qa_action(action)
    assert info["action_valid"] is (not isinstance(parsed, str))
    if isinstance(parsed, str):
        assert info["state_key"] == key and reward == 0.0 and not terminated
    elif parsed[0] == "answer":
        assert terminated and reward in (0.0, 1.0)
    else:
        assert obs.startswith("<information>") and obs.endswith("</information>")


@functools.cache
def _fuzz_env() -> SearchQAEnv:
    return SearchQAEnv(synthetic=True)  # one env for every example (hypothesis and fixtures)


def test_benchmark_script_runs_and_writes_its_json(tmp_path):
    """bench_searchqa.py end to end with a tiny budget: its server child, all three scenarios."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_searchqa.py"
    out = tmp_path / "searchqa.json"
    cmd = [sys.executable, str(script), "--repeats", "1", "--corpus-size", "300", "--questions",
           "12", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    for scenario in ("synthetic_inprocess", "bigcorpus_inprocess"):
        r = results[scenario]
        assert r["em"] == 1.0 and r["steps_per_repeat"] > 12
        assert 0 < r["search_median_ms"] <= r["search_p99_ms"]
    assert results["bigcorpus_inprocess"]["passages"] == len(knowledge_base(0).passages) + 300
    http = results["http_server"]
    assert set(http["per_query_median_ms"]) == {"search_r1_request", "client_request", "inprocess"}
    assert http["env_step_via_client"]["em"] == 1.0
