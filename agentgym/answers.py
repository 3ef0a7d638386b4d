"""Answer scoring for question answering: Search-R1's normalisation, exact match and token F1.

These are pure functions: no global random state, no printing (Search-R1's scorer prints one
sample in 64 through ``random.randint``, which moves the caller's random stream).

``normalize_answer`` is Search-R1's (``verl/utils/reward_score/qa_em.py``), itself SQuAD's:
lower-case, drop ASCII punctuation, drop the articles *a*, *an*, *the* as whole words, collapse
whitespace. Exact match compares normalised strings against every golden answer; F1 is SQuAD's
token F1 on the normalised strings, the best over the golden answers.

Golden answers may be one string or any sequence of strings (a list, a tuple, or the numpy
array that pyarrow / pandas give for a parquet list column).

The search-QA env scores answers with them and the search-QA rule judge
(:mod:`agentgym.algorithms.judges`) checks retrieved passages with them, so they live here,
importable by both.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable
from typing import Any

__all__ = ["normalize_answer", "as_answer_list", "exact_match", "f1"]

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
# str.translate with a deletion table: one C pass instead of a Python loop over characters.
_DROP_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Search-R1's answer normalisation (the order matters: punctuation goes before articles).

    >>> normalize_answer("  The Eiffel-Tower!  ")
    'eiffeltower'
    """
    text = text.lower().translate(_DROP_PUNCT)
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def as_answer_list(golden_answers: Any) -> list[str]:
    """Golden answers as a list of ``str``: a string becomes a one-item list; a sequence or a
    numpy array is listed item by item (non-string items, e.g. numbers, become ``str``)."""
    if isinstance(golden_answers, str):
        return [golden_answers]
    if golden_answers is None:
        return []
    tolist = getattr(golden_answers, "tolist", None)  # numpy arrays, pyarrow scalars
    items = tolist() if callable(tolist) else golden_answers
    if isinstance(items, str):
        return [items]
    if not isinstance(items, Iterable):
        return [str(items)]
    return [a if isinstance(a, str) else str(a) for a in items]


def exact_match(prediction: str, golden_answers: Any) -> float:
    """1.0 if the normalised ``prediction`` equals any normalised golden answer, else 0.0.

    Search-R1's ``em_check`` semantics; no golden answers gives 0.0.
    """
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) == pred for g in as_answer_list(golden_answers)))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, golden_answers: Any) -> float:
    """SQuAD token F1 between the normalised ``prediction`` and each golden answer; the best one.

    Tokens are the whitespace-separated words after :func:`normalize_answer`. Two answers that
    both normalise to nothing (e.g. "the", "!") score 1.0, as SQuAD scores them; one empty side
    scores 0.0. No golden answers gives 0.0.
    """
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in as_answer_list(golden_answers):
        gold_tokens = normalize_answer(gold).split()
        if not pred_tokens or not gold_tokens:
            score = float(pred_tokens == gold_tokens)
        else:
            score = _token_f1(pred_tokens, gold_tokens)
        best = max(best, score)
    return best
