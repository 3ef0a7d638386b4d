"""Search-R1's answer normalisation, exact match and SQuAD token F1, on hand-made cases."""

from __future__ import annotations

import random
import string

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentgym.envs.searchqa.qa import as_answer_list, exact_match, f1, normalize_answer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Paris", "paris"),
        ("  The   Eiffel Tower ", "eiffel tower"),
        ("an apple a day", "apple day"),
        ("The Beatles!", "beatles"),
        ("U.S.A.", "usa"),
        ("rock'n'roll", "rocknroll"),
        ("Theatre", "theatre"),  # "the" only as a whole word
        ("Anand", "anand"),  # "an" only as a whole word
        ("a", ""),
        ("\tNew\nYork\r\n", "new york"),
        ("A-ha", "aha"),  # punctuation goes first, then articles: "a-ha" -> "aha", kept
        ("the-end", "theend"),
        ("Zürich", "zürich"),  # only ASCII punctuation is dropped; letters keep their accents
        ("“quoted”", "“quoted”"),  # typographic quotes are not ASCII punctuation
        ("1,000", "1000"),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_case_punctuation_articles_whitespace():
    assert exact_match("the  eiffel tower.", "Eiffel Tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert exact_match("", "") == 1.0
    assert exact_match("", "the") == 1.0  # both normalise to nothing, as in Search-R1
    assert exact_match("Paris", []) == 0.0


def test_exact_match_any_golden_answer_in_a_list_or_array():
    golden = ["Barack Obama", "Obama", "Barack Hussein Obama II"]
    assert exact_match("obama", golden) == 1.0
    assert exact_match("Barack Hussein Obama II.", golden) == 1.0
    assert exact_match("Michelle Obama", golden) == 0.0
    # parquet list columns come back as numpy object arrays
    arr = np.array(golden, dtype=object)
    assert exact_match("obama", arr) == 1.0
    assert exact_match("Michelle Obama", arr) == 0.0
    assert exact_match("obama", tuple(golden)) == 1.0


def test_as_answer_list_shapes():
    assert as_answer_list("x") == ["x"]
    assert as_answer_list(np.array(["a", "b"])) == ["a", "b"]
    assert as_answer_list(np.array("a")) == ["a"]
    assert as_answer_list([1984, "x"]) == ["1984", "x"]
    assert as_answer_list(None) == []


def test_f1_hand_made():
    assert f1("Eiffel Tower", "the Eiffel Tower") == 1.0
    # pred {eiffel}, gold {eiffel, tower}: p = 1, r = 1/2, f1 = 2/3
    assert f1("Eiffel", "Eiffel Tower") == pytest.approx(2 / 3)
    # pred {new, york, city}, gold {new, york}: p = 2/3, r = 1, f1 = 0.8
    assert f1("New York City", "new york") == pytest.approx(0.8)
    assert f1("London", "Paris") == 0.0
    # repeated tokens count once per occurrence (SQuAD's Counter intersection):
    # pred [b, b] vs gold [b]: common 1, p = 1/2, r = 1
    assert f1("b b", "b") == pytest.approx(2 / 3)


def test_f1_takes_the_best_golden_answer():
    golden = np.array(["New York", "New York City", "NYC"], dtype=object)
    assert f1("New York City", golden) == 1.0
    assert f1("the city of New York", golden) == pytest.approx(2 * 0.75 * 1 / 1.75)
    assert f1("x", []) == 0.0


def test_f1_empty_sides():
    assert f1("the", "a") == 1.0  # both empty after normalisation
    assert f1("the", "Paris") == 0.0
    assert f1("Paris", "!!") == 0.0


def test_scoring_never_touches_the_global_random_state():
    random.seed(123)
    np.random.seed(123)
    py_state, np_state = random.getstate(), np.random.get_state()
    for _ in range(200):
        exact_match("Paris", ["paris", "Paris, France"])
        f1("Paris", ["paris", "Paris, France"])
    assert random.getstate() == py_state
    after = np.random.get_state()
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1])
    assert after[2:] == np_state[2:]


@given(st.text(max_size=40), st.lists(st.text(max_size=40), max_size=4))
def test_em_implies_full_f1_and_scores_are_bounded(prediction, golden):
    em, score = exact_match(prediction, golden), f1(prediction, golden)
    assert em in (0.0, 1.0)
    assert 0.0 <= score <= 1.0
    if em == 1.0:
        assert score == 1.0


@given(st.text(alphabet=st.sampled_from(list("aAnNtThHeE .,!'-\t\nxyz")), max_size=60))
def test_normalised_text_has_no_punctuation_articles_or_extra_spaces(text):
    once = normalize_answer(text)
    assert normalize_answer(once) == once
    words = once.split(" ")
    assert once == "" or all(words), "leading, trailing or double spaces"
    assert not set(once) & set(string.punctuation + "\t\n")
    assert not {"a", "an", "the"} & set(words)
    assert once == once.lower()
