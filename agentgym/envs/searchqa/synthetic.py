"""The embedded search-QA benchmark: a seeded knowledge base, its passages and its questions.

Nothing here is downloaded or copied from a real benchmark: :func:`build_knowledge_base`
invents people, cities, countries, companies and rivers with made-up names (syllables drawn
from a seeded generator), links them by functional relations, writes passages stating the
facts in English (in Search-R1's corpus format, ``{"id", "contents": '"Title"\\ntext'}``), and
asks single-hop and multi-hop questions whose answers must be retrieved:

============  =========================================================================
hops          example
============  =========================================================================
1             Where was Dovan Keltrix born?
2             In which country was Dovan Keltrix born?      (born_in, then located_in)
3             In which country was the founder of Zarnel Group born?
============  =========================================================================

The answer entity never appears in the question, and every bridge entity has to be found in
a passage. Passages hold a few facts each and are titled by their entity; events named after
cities and people who share a surname act as distractors for BM25.

Questions are split train / valid / test (80 / 10 / 10) by a seeded shuffle, never overlapping.
:func:`knowledge_base` caches one build per (seed, size) in the process, so every env shares it.
Everything is labelled synthetic (``data_source = "synthetic"``).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agentgym.io import atomic_open, atomic_path

__all__ = [
    "SPLITS",
    "RELATIONS",
    "QUESTION_TEMPLATES",
    "KnowledgeBase",
    "Question",
    "QuestionTemplate",
    "build_knowledge_base",
    "knowledge_base",
    "write_search_r1_files",
]

SPLITS: tuple[str, ...] = ("train", "valid", "test")
_SPLIT_FRACTIONS = (0.8, 0.1, 0.1)

#: relation -> (subject type, object type, keywords a searcher adds to the subject's name,
#: regex of the sentence stating it, with ``{s}`` for the escaped subject and one object group).
#: The passages below state each fact with exactly these sentences, so the scripted policy
#: (:mod:`.scripted`) can read them back.
_NAME = r"([A-Z][a-z]+(?: [A-Z][a-z]+)*)"
RELATIONS: dict[str, tuple[str, str, str, str]] = {
    "born_in": ("person", "city", "born", r"{s} was born in " + _NAME),
    "spouse": ("person", "person", "married", r"{s} is married to " + _NAME),
    "located_in": ("city", "country", "country", r"{s} is a city in the country of " + _NAME),
    "capital": ("country", "city", "capital", r"The capital of {s} is " + _NAME),
    "founded_by": ("company", "person", "founded", r"{s} was founded by " + _NAME),
    "headquartered_in": (
        "company",
        "city",
        "headquarters",
        r"{s} has its headquarters in " + _NAME,
    ),
    "source_in": ("river", "country", "rises", r"The {s} rises in " + _NAME),
}


@dataclass(frozen=True)
class QuestionTemplate:
    """A question form: the start entity's type, the relation chain, the wording."""

    name: str
    start_type: str
    chain: tuple[str, ...]
    text: str
    """``str.format`` string over ``{e}``, the start entity's name"""

    @property
    def hops(self) -> int:
        return len(self.chain)


QUESTION_TEMPLATES: tuple[QuestionTemplate, ...] = (
    # single-hop
    QuestionTemplate("birthplace", "person", ("born_in",), "Where was {e} born?"),
    QuestionTemplate("spouse", "person", ("spouse",), "Who is {e} married to?"),
    QuestionTemplate("city_country", "city", ("located_in",), "In which country is {e} located?"),
    QuestionTemplate("capital", "country", ("capital",), "What is the capital of {e}?"),
    QuestionTemplate("founder", "company", ("founded_by",), "Who founded {e}?"),
    QuestionTemplate(
        "headquarters", "company", ("headquartered_in",), "In which city is {e} headquartered?"
    ),
    QuestionTemplate(
        "river_source", "river", ("source_in",), "In which country does the {e} rise?"
    ),
    # two hops
    QuestionTemplate(
        "birth_country", "person", ("born_in", "located_in"), "In which country was {e} born?"
    ),
    QuestionTemplate(
        "founder_birthplace",
        "company",
        ("founded_by", "born_in"),
        "Where was the founder of {e} born?",
    ),
    QuestionTemplate(
        "hq_country",
        "company",
        ("headquartered_in", "located_in"),
        "In which country is the headquarters of {e}?",
    ),
    QuestionTemplate(
        "spouse_birthplace", "person", ("spouse", "born_in"), "Where was the spouse of {e} born?"
    ),
    QuestionTemplate(
        "city_capital",
        "city",
        ("located_in", "capital"),
        "What is the capital of the country where {e} is located?",
    ),
    QuestionTemplate(
        "river_capital",
        "river",
        ("source_in", "capital"),
        "What is the capital of the country where the {e} rises?",
    ),
    # three hops
    QuestionTemplate(
        "founder_birth_country",
        "company",
        ("founded_by", "born_in", "located_in"),
        "In which country was the founder of {e} born?",
    ),
    QuestionTemplate(
        "birth_capital",
        "person",
        ("born_in", "located_in", "capital"),
        "What is the capital of the country where {e} was born?",
    ),
    QuestionTemplate(
        "spouse_birth_country",
        "person",
        ("spouse", "born_in", "located_in"),
        "In which country was the spouse of {e} born?",
    ),
)


@dataclass(frozen=True)
class Question:
    """One synthetic question, in the fields Search-R1's data files carry."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    split: str
    template: str
    hops: int
    start: str
    """name of the entity the question names"""
    bridges: tuple[str, ...]
    """names of the entities found on the way (the answer last)"""

    def record(self) -> dict:
        """The question as a Search-R1-style row (``question``, ``golden_answers``, ...)."""
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "data_source": "synthetic",
            "split": self.split,
            "template": self.template,
            "hops": self.hops,
        }


@dataclass
class KnowledgeBase:
    """Entities, facts, passages and questions of one synthetic build (read-only once built)."""

    seed: int
    entities: dict[str, list[str]]
    """entity type -> names"""
    facts: dict[str, dict[str, str]]
    """relation -> {subject name: object name}"""
    passages: list[dict[str, str]]
    """corpus records: ``{"id": str, "contents": '"Title"\\ntext'}``"""
    questions: list[Question]
    by_split: dict[str, list[int]] = field(default_factory=dict)
    """split -> indices into ``questions``"""

    def split(self, name: str) -> list[Question]:
        return [self.questions[i] for i in self.by_split[name]]

    def answer_chain(self, start: str, chain: Sequence[str]) -> list[str]:
        """The entities reached from ``start`` along ``chain`` (raises KeyError if a link is missing)."""
        return _walk(self.facts, start, chain)


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------

_ONSETS = "b d f g h k l m n p r s t v z br dr gr kr tr st th sh ch".split()
_VOWELS = "a e i o u a e o ai ei ou".split()
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "x", "nd", "rk"]
# Words the templates and passages use; a made-up name equal to one would confuse retrieval.
_RESERVED = {
    "the", "city", "country", "capital", "born", "married", "founded", "river", "group", "labs",
    "works", "company", "rises", "where", "which", "what", "who", "spouse", "is", "was", "in",
}  # fmt: skip


def _word(rng: np.random.Generator, syllables: int) -> str:
    parts = []
    for k in range(syllables):
        parts.append(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))])
        if k == syllables - 1:
            parts.append(_CODAS[rng.integers(len(_CODAS))])
    return "".join(parts).capitalize()


class _Namer:
    """Unique made-up words; names never repeat a word used by another entity's name part."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.used: set[str] = set(_RESERVED)

    def word(self, low: int = 2, high: int = 3) -> str:
        while True:
            w = _word(self.rng, int(self.rng.integers(low, high + 1)))
            if w.lower() not in self.used and len(w) >= 4:
                self.used.add(w.lower())
                return w


# ---------------------------------------------------------------------------------------------
# The build
# ---------------------------------------------------------------------------------------------

_OCCUPATIONS = "painter engineer physician novelist architect chemist composer diplomat".split()
_INDUSTRIES = "shipping textile software mining publishing brewing aerospace insurance".split()
_COMPANY_SUFFIXES = ["Group", "Works", "Labs", "Holdings", "Industries", "Company"]
_EVENTS = ["Marathon", "Film Festival", "Book Fair", "Jazz Festival", "Regatta"]


# One long function on purpose: every name and fact is drawn from one generator in a fixed order,
# which is what makes a seed's build reproducible; split up, that order would be spread over
# functions that must never be called in another sequence.
def build_knowledge_base(
    seed: int = 0,
    num_countries: int = 10,
    cities_per_country: int = 5,
    num_people: int = 120,
    num_companies: int = 40,
    num_rivers: int = 12,
    num_surnames: int = 45,
) -> KnowledgeBase:
    """Generate one knowledge base, its passages and its questions from ``seed``.

    The same arguments always give the same build (names, facts, passage ids, question ids and
    splits). The default size makes ~300 passages and ~900 questions in well under a second.
    """
    rng = np.random.default_rng(seed)
    namer = _Namer(rng)

    countries = [namer.word(2, 3) for _ in range(num_countries)]
    cities, city_country = [], {}
    for country in countries:
        for _ in range(cities_per_country):
            city = namer.word(2, 3)
            cities.append(city)
            city_country[city] = country
    capital = {k: cities[i * cities_per_country] for i, k in enumerate(countries)}

    # People share surnames: a query by full name then also finds namesakes (distractors).
    surnames = [namer.word(2, 3) for _ in range(num_surnames)]
    people: list[str] = []
    while len(people) < num_people:
        name = f"{namer.word(2, 2)} {surnames[rng.integers(num_surnames)]}"
        if name not in people:
            people.append(name)
    born_in = {p: cities[rng.integers(len(cities))] for p in people}
    # Marry off a random two thirds of the people in pairs.
    order = rng.permutation(len(people))
    married = order[: (2 * len(people) // 3) // 2 * 2]
    spouse: dict[str, str] = {}
    for a, b in married.reshape(-1, 2):
        spouse[people[a]], spouse[people[b]] = people[b], people[a]

    companies = [
        f"{namer.word(2, 3)} {_COMPANY_SUFFIXES[rng.integers(len(_COMPANY_SUFFIXES))]}"
        for _ in range(num_companies)
    ]
    founder_pool = rng.permutation(len(people))  # distinct founders
    founded_by = {c: people[founder_pool[i % len(people)]] for i, c in enumerate(companies)}
    hq = {c: cities[rng.integers(len(cities))] for c in companies}
    rivers = [f"{namer.word(2, 3)} River" for _ in range(num_rivers)]
    source_in = {r: countries[rng.integers(len(countries))] for r in rivers}
    river_cities = {r: [c for c in cities if city_country[c] == source_in[r]] for r in rivers}

    facts = {
        "born_in": born_in,
        "spouse": spouse,
        "located_in": city_country,
        "capital": capital,
        "founded_by": founded_by,
        "headquartered_in": hq,
        "source_in": source_in,
    }
    entities = {
        "person": people,
        "city": cities,
        "country": countries,
        "company": companies,
        "river": rivers,
    }

    # -- passages: a few facts each, titled by their entity, Search-R1's contents format ------
    texts: list[tuple[str, str]] = []
    founded_companies: dict[str, list[str]] = {}
    for c, p in founded_by.items():
        founded_companies.setdefault(p, []).append(c)
    for p in people:
        occupation = _OCCUPATIONS[rng.integers(len(_OCCUPATIONS))]
        year = int(rng.integers(1900, 1990))
        bio = f"{p} is {_a(occupation)}. {p} was born in {born_in[p]} in {year}."
        if p in spouse:
            bio += f" {p} is married to {spouse[p]}."
        texts.append((p, bio))
        if p in founded_companies:
            names = " and ".join(founded_companies[p])
            texts.append(
                (f"{p} (businessperson)", f"{p} started {names} after working as {_a(occupation)}.")
            )
    for k in countries:
        population = int(rng.integers(2, 90))
        texts.append(
            (k, f"{k} is a sovereign state with about {population} million inhabitants. "
                f"The capital of {k} is {capital[k]}."),
        )  # fmt: skip
    for c in cities:
        k = city_country[c]
        role = f" {c} is the capital of {k}." if capital[k] == c else ""
        population = int(rng.integers(20, 3000)) * 1000
        texts.append(
            (c, f"{c} is a city in the country of {k}.{role} It has {population} residents.")
        )
        if rng.random() < 0.6:  # an event named after the city: a distractor for city queries
            event = _EVENTS[rng.integers(len(_EVENTS))]
            since = int(rng.integers(1950, 2015))
            texts.append(
                (f"{c} {event}", f"The {c} {event} is held every year in {c} since {since}.")
            )
    for m in companies:
        industry = _INDUSTRIES[rng.integers(len(_INDUSTRIES))]
        year = int(rng.integers(1890, 2015))
        texts.append(
            (m, f"{m} is {_a(industry)} company. {m} was founded by {founded_by[m]} in {year}. "
                f"{m} has its headquarters in {hq[m]}."),
        )  # fmt: skip
    for r in rivers:
        length = int(rng.integers(80, 2500))
        towns = river_cities[r][: 1 + int(rng.integers(2))]
        past = " and ".join(towns)
        texts.append(
            (
                r,
                f"The {r} rises in {source_in[r]}. The {r} is {length} km long and flows past {past}.",
            )
        )
    passages = [
        {"id": str(i), "contents": f'"{title}"\n{text}'} for i, (title, text) in enumerate(texts)
    ]

    # -- questions ------------------------------------------------------------------------------
    drafts: list[tuple[QuestionTemplate, str, list[str]]] = []
    for tpl in QUESTION_TEMPLATES:
        for start in entities[tpl.start_type]:
            try:
                path = _walk(facts, start, tpl.chain)
            except KeyError:  # e.g. an unmarried person has no spouse question
                continue
            answer = path[-1]
            question = tpl.text.format(e=start)
            if re.search(rf"\b{re.escape(answer)}\b", question):
                continue  # the answer must not be given away by the question
            drafts.append((tpl, start, path))
    perm = rng.permutation(len(drafts))
    bounds = np.cumsum([int(round(f * len(drafts))) for f in _SPLIT_FRACTIONS[:-1]])
    split_of = np.searchsorted(bounds, np.arange(len(drafts)), side="right")
    questions: list[Question] = []
    by_split: dict[str, list[int]] = {s: [] for s in SPLITS}
    counters = dict.fromkeys(SPLITS, 0)
    for rank, d in enumerate(perm):
        tpl, start, path = drafts[d]
        split = SPLITS[int(split_of[rank])]
        qid = f"synthetic-{split}-{counters[split]:05d}"
        counters[split] += 1
        by_split[split].append(len(questions))
        questions.append(
            Question(
                id=qid,
                question=tpl.text.format(e=start),
                golden_answers=(path[-1],),
                split=split,
                template=tpl.name,
                hops=tpl.hops,
                start=start,
                bridges=tuple(path),
            )
        )
    return KnowledgeBase(seed, entities, facts, passages, questions, by_split)


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _walk(facts: dict[str, dict[str, str]], start: str, chain: Sequence[str]) -> list[str]:
    out, entity = [], start
    for rel in chain:
        entity = facts[rel][entity]
        out.append(entity)
    return out


@functools.lru_cache(maxsize=8)
def knowledge_base(seed: int = 0) -> KnowledgeBase:
    """The default-size :func:`build_knowledge_base` for ``seed``, built once per process."""
    return build_knowledge_base(seed)


# Our own instruction (the env never reads it); it ends with "Question: ..." as Search-R1's does,
# so a file without a question column still gives the question back.
_PROMPT = (
    "Answer the question. Search with <search> query </search>; results come back between "
    "<information> and </information>. Give the final answer inside <answer> and </answer>. "
    "Question: {question}\n"
)


def write_search_r1_files(
    out_dir: str | os.PathLike[str], seed: int = 0, splits: Sequence[str] = SPLITS
) -> dict[str, Path]:
    """Write the synthetic benchmark as Search-R1's files, for any tool that reads them.

    Writes ``corpus.jsonl`` (wiki-18 records: ``{"id", "contents"}``) and one
    ``<split>.parquet`` per split with Search-R1's columns (``id``, ``question``,
    ``golden_answers``, ``data_source``, ``prompt``, ``ability``,
    ``reward_model.ground_truth.target``, ``extra_info.split`` / ``index``). Each file is
    written to a temporary name and renamed, so an interrupted run leaves no half file.
    Returns ``{"corpus": path, split: path, ...}``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    kb = knowledge_base(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"corpus": out / "corpus.jsonl"}

    with atomic_open(paths["corpus"], "w") as f:
        for doc in kb.passages:
            f.write(json.dumps(doc) + "\n")
    for split in splits:
        rows = [
            {
                "id": q.id,
                "question": q.question,
                "golden_answers": list(q.golden_answers),
                "data_source": "synthetic",
                "prompt": [{"role": "user", "content": _PROMPT.format(question=q.question)}],
                "ability": "fact-reasoning",
                "reward_model": {
                    "style": "rule",
                    "ground_truth": {"target": list(q.golden_answers)},
                },
                "extra_info": {"split": split, "index": i},
            }
            for i, q in enumerate(kb.split(split))
        ]
        paths[split] = out / f"{split}.parquet"
        table = pa.Table.from_pylist(rows)
        with atomic_path(paths[split]) as tmp:
            pq.write_table(table, tmp)
    return paths
