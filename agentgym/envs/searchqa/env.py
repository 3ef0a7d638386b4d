"""The search-augmented QA env: Search-R1's setting (and the GiGPO paper's search setting)."""

from __future__ import annotations

import functools
import os
import re
import threading
import warnings
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from gymnasium import spaces

from agentgym.core import (
    MAX_OBS_CHARS,
    ResetOptionError,
    SnapshotMismatch,
    TextEnv,
    describe_action,
)
from agentgym.envs.searchqa.data import (
    DATA_ENV,
    RETRIEVER_ENV,
    QADataset,
    UnknownSplitError,
    load_questions,
)
from agentgym.envs.searchqa.qa import exact_match, f1, normalize_answer
from agentgym.envs.searchqa.synthetic import SPLITS, knowledge_base
from agentgym.retrieval.base import Hit, Retriever
from agentgym.retrieval.corpus import split_title

__all__ = [
    "SearchQAEnv",
    "parse_qa_action",
    "passages_to_string",
    "shared_retriever",
]

#: Longest query the env sends to the retriever; a longer one is an invalid action (a model that
#: pastes a whole passage into <search> should hear so, not stall the retriever).
MAX_QUERY_CHARS = 2000

_NO_DATA = (
    "SearchQA data not found: set {data_env} to a Search-R1-style question file (parquet or JSONL, "
    "e.g. nq_search/test.parquet) and {retriever_env} to a retrieval index folder (built by "
    "`agentgym retrieval index`) or a server URL such as http://127.0.0.1:8000/retrieve, or pass "
    "data=... and retriever=... to gym.make; or play the built-in synthetic questions, which need "
    "no download: gym.make('AgentGym/SearchQA-Synthetic-v0')"
)
_INVALID = (
    "Invalid action {action}: {why}. To search, send search[<query>]; to give the final answer, "
    "send answer[<answer>]."
)
_ACTION_RE = re.compile(r"\s*(search|answer)\s*\[(.*)\]\s*", re.IGNORECASE | re.DOTALL)
# Capitalised word runs ("Grethohurk Labs", "New York"): the entity mentions a searcher would try.
_MENTION_RE = re.compile(r"\b[A-Z][\w'-]*(?:\s+(?:of\s+|the\s+|de\s+)?[A-Z][\w'-]*)*")
_QUESTION_WORDS = {"who", "what", "where", "when", "which", "how", "why", "in", "the", "is", "was"}
_TRAILING_PAREN_RE = re.compile(r"\s*\([^()]*\)\s*$")


def parse_qa_action(action: str) -> tuple[str, str] | str:
    """``"search[q]"`` -> ``("search", "q")``, ``"answer[a]"`` -> ``("answer", "a")``; else the
    reason it is invalid (a ``str``).

    The verb is case-insensitive and surrounding whitespace is ignored; the content is everything
    between the first ``[`` and the last ``]`` (so it may hold brackets), stripped and
    whitespace-collapsed, and must not be empty.
    """
    m = _ACTION_RE.fullmatch(action)
    if m is None:
        return "expected search[<query>] or answer[<answer>]"
    verb, content = m.group(1).lower(), " ".join(m.group(2).split())
    if not content:
        return f"the {verb}[...] is empty"
    if verb == "search" and len(content) > MAX_QUERY_CHARS:
        return f"the query is {len(content)} characters long; keep it under {MAX_QUERY_CHARS}"
    return verb, content


def passages_to_string(hits: Sequence[Hit]) -> str:
    """Search-R1's ``_passages2string``: ``Doc i(Title: <title>) <text>\\n`` per hit.

    The title is the first line of the document's ``contents``, quotes kept; the text is the rest.
    """
    out = []
    for i, hit in enumerate(hits):
        title, text = split_title(str(hit.document.get("contents", "")))
        out.append(f"Doc {i + 1}(Title: {title}) {text}\n")
    return "".join(out)


class _PrintableText(spaces.Text):
    """A Text space whose members are any printable Unicode text (plus whitespace).

    Real corpora (Wikipedia) and questions hold accents and dashes that the ASCII charset of
    :data:`agentgym.core.TEXT_CHARSET` lacks; rewriting them would change what a model must
    answer. Sampling still draws from the ASCII charset.
    """

    def contains(self, x: Any) -> bool:
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        return x.isprintable() or all(c.isprintable() or c in "\n\t " for c in x)


# ---------------------------------------------------------------------------------------------
# Per-process shared resources
# ---------------------------------------------------------------------------------------------

_RETRIEVERS: dict[str, Retriever] = {}
_RETRIEVERS_LOCK = threading.Lock()


def _retriever_key(source: str | os.PathLike[str]) -> str:
    text = os.fspath(source)
    if text.startswith(("http://", "https://")):
        return text
    return str(Path(text).expanduser().resolve())


def shared_retriever(source: str | os.PathLike[str]) -> Retriever:
    """The process's one retriever over ``source`` (an index folder or a server URL).

    Opened with :func:`agentgym.retrieval.open_retriever` on first use and shared by every env of
    the process afterwards (an index is loaded once; a client keeps one connection pool).
    """
    key = _retriever_key(source)
    with _RETRIEVERS_LOCK:
        retriever = _RETRIEVERS.get(key)
        if retriever is None:
            if not key.startswith(("http://", "https://")) and not Path(key).is_dir():
                raise FileNotFoundError(
                    f"retrieval index folder {key} not found; build one with `agentgym retrieval "
                    "index`, or pass a server URL such as http://127.0.0.1:8000/retrieve"
                )
            from agentgym.retrieval import open_retriever

            retriever = _RETRIEVERS[key] = open_retriever(key)
    return retriever


@functools.lru_cache(maxsize=8)
def _synthetic_retriever(seed: int) -> Retriever:
    from agentgym.retrieval.sparse import BM25Retriever

    return BM25Retriever.from_documents(knowledge_base(seed).passages, backend="bm25s")


@functools.lru_cache(maxsize=32)
def _synthetic_dataset(seed: int, split: str) -> QADataset:
    qs = knowledge_base(seed).split(split)
    return QADataset(
        path=f"synthetic:{seed}",
        split=split,
        ids=tuple(q.id for q in qs),
        questions=tuple(q.question for q in qs),
        golden_answers=tuple(q.golden_answers for q in qs),
        data_sources=("synthetic",) * len(qs),
    )


def _search_mentions(question: str) -> list[str]:
    """Entity-like spans of the question, then the question itself: what a searcher tries first."""
    mentions = []
    for m in _MENTION_RE.finditer(question):
        words = m.group(0).split()
        while words and words[0].lower() in _QUESTION_WORDS:
            words = words[1:]  # "Where", "In", "The" open questions, not names
        span = " ".join(words)
        if span and span not in mentions:
            mentions.append(span)
    return mentions[:3] + [question]


# ---------------------------------------------------------------------------------------------
# The env
# ---------------------------------------------------------------------------------------------


class _SearchQAState(NamedTuple):
    """What a SearchQA step reads and changes (see ``SearchQAEnv``'s snapshot paragraph)."""

    split: str | None
    row: int
    question_id: str  # checked on restore: the same row must hold the same question
    retrieved: frozenset[str]
    titles: tuple[str, ...]
    answer: str | None
    answer_norm: str | None
    em: float
    f1: float
    mentions: tuple[str, ...]


class SearchQAEnv(TextEnv):
    """Answer a question by searching a corpus: Search-R1's multi-turn setting as a text env.

    ``AgentGym/SearchQA-v0`` plays real Search-R1-style data (NQ, TriviaQA, PopQA, HotpotQA,
    2Wiki, MuSiQue, Bamboogle question files and a wiki-18 index or retrieval server);
    ``AgentGym/SearchQA-Synthetic-v0`` plays the project's generated knowledge base
    (:mod:`.synthetic`) over an in-process BM25 index, with no download.

    **Observations.** ``reset`` returns the question text (the prompt template, e.g. the LLM
    wrapper's ``"search"`` template, adds the instructions). A search returns the top ``topk``
    passages exactly as Search-R1 shows them: ``<information>Doc 1(Title: "...") text\\nDoc
    2(Title: "...") text</information>`` (titles keep the quotes of the corpus' first line;
    the block without the blank lines Search-R1 puts around it, as verl-agent strips them).
    An answer ends the episode with an empty observation, as Search-R1 appends nothing after it.

    **Actions.** ``search[<query>]`` and ``answer[<text>]`` (what the LLM wrapper's
    ``search_answer`` format makes of ``<search>``/``<answer>`` tags). Anything else (no
    brackets, an empty query, another verb) is invalid: the observation gives the format,
    ``info["action_valid"] = False``, the state is unchanged, and the turn is spent.

    **Episodes.** At most ``max_episode_steps`` actions (the registered ids' cap is 4, the GiGPO
    paper's setting; built directly, no cap unless given); if none of them
    answered, the episode is truncated with reward 0. An answer terminates it with reward
    ``reward_scale`` x exact match (Search-R1's normalisation, against any golden answer).

    A retriever that fails (a server that is down or answers 5xx) raises from ``step``: that is
    not the agent's doing, and an episode scored on missing passages would be wrong data.

    **Info.** ``state_key`` = ``(question id, frozenset of the passage ids retrieved so far,
    normalised answer or None)``: two trajectories that saw the same passages are in the same
    state whatever words their queries used and in whatever order they searched; the last
    member says whether (and what) the agent answered. ``task_id`` = the question id;
    ``admissible_actions`` = None (actions are free text); ``won`` = exact match; ``score`` =
    exact match (0.0 until answered). Also on every step: ``question``, ``data_source``,
    ``synthetic``, ``suggested_actions`` (a few plausible actions for random rollouts:
    ``search[...]`` of the question's entity mentions and of the question, ``answer[...]`` of
    the titles retrieved so far), ``retrieved_answer`` (True on a search round that brought a
    new passage containing a golden answer, the ground truth of the rule judge
    :class:`~agentgym.algorithms.judges.SearchQAJudge`), and after an answer ``answer``, ``f1``
    and ``golden_answers``. Golden answers are never in an observation.

    Args:
        data: Search-R1-style question file (parquet / JSONL) or a folder of ``<split>.parquet``
            files; default ``$SEARCHQA_DATA``. Ignored with ``synthetic=True``.
        retriever: an index folder, a server URL (``http://host:port[/retrieve]``) or a
            :class:`~agentgym.retrieval.base.Retriever`; default ``$SEARCHQA_RETRIEVER``, or the
            in-process BM25 over the synthetic passages with ``synthetic=True``.
        split: which questions: a split name (picks ``<split>.parquet`` in a folder, or filters a
            file by its split column); None uses every row of a file (``test`` for a folder,
            ``train`` for synthetic). ``reset(options={"split": ...})`` switches.
        synthetic: play the generated knowledge base (``info["synthetic"] = True``).
        kb_seed: which synthetic knowledge base.
        topk: passages per search (Search-R1's default 3).
        max_episode_steps: actions per episode, then truncation (None: no cap; 4 in the GiGPO
            paper's search setting; Search-R1's training scripts use 2 searches plus a final
            answer turn, i.e. 3).
        max_turns: deprecated name of ``max_episode_steps``.
        reward_scale: reward of a correct answer (exact match 1.0 -> ``reward_scale``).

    Tasks: ``reset(seed=s)`` draws a question with ``self.np_random``; ``options={"task": i}``
    picks row i of the split, ``options={"task": question_id}`` a question by id.

    **Snapshot** (:meth:`~agentgym.core.TextEnv.snapshot`): the split, the question's row and
    id, the passage ids retrieved so far (a frozenset, shared), the answer candidates' titles,
    the answer and its scores. The questions and the retriever are shared by every env of the
    process and never copied; a restore never searches. Identity: ``synthetic`` and
    ``kb_seed``, the question file and the retriever (path or URL, or the retriever object's
    class), ``topk`` and ``reward_scale``; a restore also checks that the row
    holds the same question id. Two states with equal ``state_key`` step alike; only the order
    of ``suggested_actions`` (titles in retrieval order) may differ.
    """

    family: ClassVar[str] = "searchqa"
    action_syntax: ClassVar[str] = (
        "search[<query>] to retrieve passages, answer[<answer>] to give the final answer"
    )

    def __init__(
        self,
        data: str | os.PathLike[str] | None = None,
        retriever: str | os.PathLike[str] | Retriever | None = None,
        split: str | None = None,
        synthetic: bool = False,
        kb_seed: int = 0,
        topk: int = 3,
        max_episode_steps: int | None = None,
        reward_scale: float = 1.0,
        render_mode: str | None = None,
        max_turns: int | None = None,
    ):
        if max_turns is not None:
            warnings.warn(
                "SearchQAEnv(max_turns=...) is deprecated: use max_episode_steps=...",
                DeprecationWarning,
                stacklevel=2,
            )
            if max_episode_steps is None:
                max_episode_steps = max_turns
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1 or None, got {max_episode_steps}")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        super().__init__(max_episode_steps=max_episode_steps, render_mode=render_mode)
        self.synthetic = bool(synthetic)
        self.kb_seed = int(kb_seed)
        self.topk = int(topk)
        self.reward_scale = float(reward_scale)
        if self.synthetic:
            self.data = None
            self.split = split or "train"
        else:
            data = data if data is not None else os.environ.get(DATA_ENV)
            retriever = retriever if retriever is not None else os.environ.get(RETRIEVER_ENV)
            if not data or retriever is None or retriever == "":
                raise FileNotFoundError(
                    _NO_DATA.format(data_env=DATA_ENV, retriever_env=RETRIEVER_ENV)
                )
            self.data = os.fspath(data)
            self.split = split
            # Real questions and passages are Unicode; see _PrintableText.
            self.observation_space = _PrintableText(
                max_length=MAX_OBS_CHARS, min_length=0, charset=self.observation_space.character_set
            )
        # A source string is reopened from the process cache after unpickling; an object is kept.
        self._retriever_source: str | None = None
        self._retriever_obj: Retriever | None = None
        if isinstance(retriever, (str, os.PathLike)):
            self._retriever_source = _retriever_key(retriever)
        elif retriever is not None:
            if not callable(getattr(retriever, "search", None)):
                raise TypeError(
                    f"retriever must be an index folder, a server URL or an object with "
                    f"search(queries, topk); got {type(retriever).__name__}"
                )
            self._retriever_obj = retriever
        self._retriever = self._open_retriever()
        try:
            self._dataset = self._load(self.split)
        except UnknownSplitError as exc:  # the constructor's caller chose data=: name it
            raise UnknownSplitError(f"{exc} (data={self.data})") from None
        # episode state
        self._row = 0
        self._retrieved: frozenset[str] = frozenset()
        self._titles: tuple[str, ...] = ()  # answer candidates, in retrieval order
        self._answer: str | None = None
        self._answer_norm: str | None = None
        self._em = 0.0
        self._f1 = 0.0
        self._mentions: list[str] = []

    # -- shared resources -------------------------------------------------------------------
    def _open_retriever(self) -> Retriever:
        if self._retriever_obj is not None:
            return self._retriever_obj
        if self._retriever_source is not None:
            return shared_retriever(self._retriever_source)
        return _synthetic_retriever(self.kb_seed)

    def _load(self, split: str | None) -> QADataset:
        if self.synthetic:
            if not isinstance(split, str) or split not in SPLITS:
                raise UnknownSplitError(
                    f"unknown split {describe_action(split)!r}; the synthetic questions have "
                    f"{', '.join(SPLITS)}"
                )
            return _synthetic_dataset(self.kb_seed, split)
        ds = load_questions(self.data, split)
        if len(ds) == 0:
            raise ValueError(f"no questions in {ds.path} for split {split!r}")
        return ds

    def _load_option_split(self, split: Any) -> QADataset:
        """:meth:`_load` for ``reset(options={"split": ...})``: every failure is a
        :class:`ResetOptionError` naming files by their name inside the data folder only, since
        options may come from a remote client (``agentgym serve``)."""
        try:
            return self._load(split)
        except ResetOptionError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            text = str(exc.args[0]) if len(exc.args) == 1 else str(exc)
            data = Path(self.data).expanduser()
            folder = data if data.is_dir() else data.parent
            for base in {str(folder.resolve()), str(folder.absolute()), str(folder)}:
                text = text.replace(base + os.sep, "").replace(base, "the data folder")
            raise ResetOptionError(
                f"split {describe_action(split)!r} cannot be used: {text}"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        # The dataset and a retriever opened from a source are process-wide shared objects:
        # pickle how to find them, not them (an HTTP client's connection pool cannot be pickled).
        state = self.__dict__.copy()
        state["_dataset"] = None
        if self._retriever_obj is None:
            state["_retriever"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._retriever = self._open_retriever()
        self._dataset = self._load(self.split)

    # -- tasks --------------------------------------------------------------------------------
    @property
    def num_tasks(self) -> int:
        """Questions in the current split."""
        return len(self._dataset)

    @property
    def task_ids(self) -> list[str]:
        return list(self._dataset.ids)

    def _pick(self, task: Any) -> int:
        n = len(self._dataset)
        if task is None:
            return int(self.np_random.integers(n))
        if isinstance(task, str):
            return self._dataset.index_of(task)
        if isinstance(task, bool) or not hasattr(task, "__index__"):
            raise TypeError(f"task must be a row index or a question id, got {task!r}")
        i = int(task)
        if not -n <= i < n:
            raise IndexError(f"task index {i} out of range for {n} questions")
        return i % n

    # -- TextEnv hooks ------------------------------------------------------------------------
    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        split = options.get("split")
        task = options.get("task")
        if split is None and self.synthetic and isinstance(task, str):
            parts = task.split("-")  # synthetic ids name their split: synthetic-test-00003
            if len(parts) == 3 and parts[1] in SPLITS:
                split = parts[1]
        if split is not None and split != self.split:
            self._dataset = self._load_option_split(split)
            self.split = split
        self._row = self._pick(task)
        self._retrieved = frozenset()
        self._titles = ()
        self._answer = self._answer_norm = None
        self._em = self._f1 = 0.0
        question = self._dataset.questions[self._row]
        self._mentions = _search_mentions(question)
        return question, self._info(True)

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        parsed = parse_qa_action(action)
        if isinstance(parsed, str):
            obs = _INVALID.format(action=repr(describe_action(action)), why=parsed)
            return obs, self.invalid_action_reward, False, self._info(False)
        verb, content = parsed
        if verb == "search":
            hits = self._retriever.search([content], self.topk)[0]
            # Ground truth for rule judges: did this round bring a new passage holding a golden
            # answer (normalised substring, as exact match normalises). New passages only, and
            # a handful per search, so this stays a few microseconds.
            golden = self._golden_norm()
            found = any(
                a in normalize_answer(str(h.document.get("contents", "")))
                for h in hits
                if h.doc_id not in self._retrieved
                for a in golden
            )
            self._retrieved = self._retrieved | {h.doc_id for h in hits}
            titles = dict.fromkeys(self._titles)
            for h in hits:
                title = split_title(str(h.document.get("contents", "")))[0].strip().strip('"')
                titles.setdefault(_TRAILING_PAREN_RE.sub("", title) or title)
            self._titles = tuple(titles)
            obs = f"<information>{passages_to_string(hits).strip()}</information>"
            return obs, 0.0, False, self._info(True, retrieved_answer=found)
        golden = self._dataset.golden_answers[self._row]
        self._answer, self._answer_norm = content, normalize_answer(content)
        self._em, self._f1 = exact_match(content, golden), f1(content, golden)
        info = self._info(True)
        info.update(answer=content, f1=self._f1, golden_answers=list(golden))
        return "", self._em * self.reward_scale, True, info

    def state_key(self) -> Hashable:
        """``(question id, frozenset of retrieved passage ids, normalised answer or None)``."""
        return (self._dataset.ids[self._row], self._retrieved, self._answer_norm)

    # -- snapshot / restore ---------------------------------------------------------------------
    def _snapshot_identity(self) -> Hashable:
        if self._retriever_source is not None:
            retriever = self._retriever_source
        elif self._retriever_obj is not None:
            kind = type(self._retriever_obj)
            retriever = f"{kind.__module__}.{kind.__qualname__}"
        else:
            retriever = None  # the synthetic knowledge base's own index, fixed by kb_seed
        data = None if self.data is None else os.path.abspath(self.data)
        return (self.synthetic, self.kb_seed, data, retriever, self.topk, self.reward_scale)

    def _snapshot_state(self) -> _SearchQAState:
        return _SearchQAState(
            self.split,
            self._row,
            self._dataset.ids[self._row],
            self._retrieved,
            self._titles,
            self._answer,
            self._answer_norm,
            self._em,
            self._f1,
            tuple(self._mentions),
        )

    def _restore_state(self, state: _SearchQAState) -> None:
        dataset = self._dataset if state.split == self.split else self._load(state.split)
        if not 0 <= state.row < len(dataset) or dataset.ids[state.row] != state.question_id:
            raise SnapshotMismatch(
                f"row {state.row} of {dataset.path} does not hold question {state.question_id!r}: "
                "the snapshot was taken on other questions"
            )
        self.split, self._dataset, self._row = state.split, dataset, state.row
        self._retrieved, self._titles = state.retrieved, state.titles
        self._answer, self._answer_norm = state.answer, state.answer_norm
        self._em, self._f1 = state.em, state.f1
        self._mentions = list(state.mentions)

    # -- helpers ------------------------------------------------------------------------------
    def suggested_actions(self) -> list[str]:
        """A few plausible actions now: searches for the question's mentions (and the question),
        and answers naming the titles retrieved so far (latest last, at most 8)."""
        searches = [f"search[{m}]" for m in self._mentions]
        return searches + [f"answer[{t}]" for t in self._titles[-8:]]

    def _golden_norm(self) -> tuple[str, ...]:
        """The normalised, non-empty golden answers of the current question."""
        return tuple(a for a in map(normalize_answer, self._dataset.golden_answers[self._row]) if a)

    def _info(self, valid: bool, retrieved_answer: bool = False) -> dict[str, Any]:
        answered = self._answer is not None
        return {
            "state_key": self.state_key(),
            "task_id": self._dataset.ids[self._row],
            "admissible_actions": None,
            "action_valid": valid,
            "won": bool(self._em) if answered else False,
            "score": self._em if answered else 0.0,
            "synthetic": self.synthetic,
            "question": self._dataset.questions[self._row],
            "data_source": self._dataset.data_sources[self._row],
            "split": self.split,
            "suggested_actions": self.suggested_actions(),
            "retrieved_answer": retrieved_answer,
        }
