"""Title nouns are computed once per catalogue, so no WebShop step runs the tagger.

The spaCy tests use the real ``en_core_web_sm`` folder from ../shared/data and the real
1000-product catalogue, and skip when either is absent; the fallback tests always run.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from agentgym.envs.webshop.data import load_catalogue
from agentgym.envs.webshop.env import WebShopEnv
from agentgym.envs.webshop.nouns import (
    FallbackNouns,
    SpacyNouns,
    prepare_title_nouns,
    titles_digest,
)
from agentgym.envs.webshop.reward import webshop_reward

SHARED_DATA = Path(
    os.environ.get(
        "AGENTGYM_SHARED_DATA", Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    )
)
SPACY_MODEL_DIR = SHARED_DATA / "spacy" / "en_core_web_sm-3.8.0"


class CountingPipeline:
    """Wraps a real spaCy pipeline and counts the texts it is asked to tag."""

    def __init__(self, nlp) -> None:
        self.nlp = nlp
        self.texts = 0

    def __call__(self, text):
        self.texts += 1
        return self.nlp(text)

    def pipe(self, texts, **kwargs):
        for text in texts:
            self.texts += 1
            yield from self.nlp.pipe([text], **kwargs)

    def __getattr__(self, name):
        return getattr(self.nlp, name)


@pytest.fixture
def counted_spacy() -> SpacyNouns:
    if not SPACY_MODEL_DIR.is_dir():
        pytest.skip(f"spaCy model folder {SPACY_MODEL_DIR} absent")
    pytest.importorskip("spacy")
    extractor = SpacyNouns(SPACY_MODEL_DIR)
    extractor._nlp = CountingPipeline(extractor._nlp)
    return extractor


def _buy_episodes(env: WebShopEnv, n: int, seed: int):
    """Play ``n`` goals: search the goal's words, open a random result, pick random options, buy.
    Yields (goal, product, options, score) per purchase."""
    rng = random.Random(seed)
    catalogue = env.unwrapped.catalogue
    by_asin = catalogue.product_by_asin
    goal_rows = rng.sample(range(len(catalogue.goals)), n)
    for row in goal_rows:
        _, info = env.reset(options={"task": row})
        goal = catalogue.goals[row]
        _, _, _, _, info = env.step(f"search[{goal['instruction_text'][:60]}]")
        products = [
            a for a in info["admissible_actions"] if a[len("click[") : -1].upper() in by_asin
        ]
        action = rng.choice(products)
        _, _, _, _, info = env.step(action)
        asin = action[len("click[") : -1].upper()
        product = catalogue.product_by_asin[asin]
        options = {}
        for name, values in product["options"].items():
            if values and rng.random() < 0.7:
                value = rng.choice(values)
                _, _, _, _, info = env.step(f"click[{value}]")
                if info["action_valid"]:
                    options[name] = value
        _, _, terminated, _, info = env.step("click[buy now]")
        assert terminated and info["action_valid"]
        yield goal, product, options, info["score"]


@pytest.mark.realdata
def test_no_step_runs_spacy_after_load_and_rewards_are_unchanged(
    counted_spacy, webshop_real_data, tmp_path, monkeypatch
):
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    env = WebShopEnv(webshop_real_data, noun_extractor=counted_spacy, reward_mode="raw")
    catalogue = env.catalogue
    # loading tagged every distinct title once, in batches
    assert counted_spacy._nlp.texts == len(catalogue.titles) >= 1000
    assert list(tmp_path.glob("webshop/nouns-spacy*.json"))
    counted_spacy._nlp.texts = 0
    # a second env on the same catalogue and extractor does not tag again
    WebShopEnv(webshop_real_data, noun_extractor=counted_spacy)
    assert counted_spacy._nlp.texts == 0

    reference = SpacyNouns(SPACY_MODEL_DIR)  # never prepared: tags each title when asked
    purchases = list(_buy_episodes(env, n=40, seed=0))
    assert counted_spacy._nlp.texts == 0, "a step ran spaCy"
    assert len({score for *_, score in purchases}) > 3  # purchases of varied quality
    for goal, product, options, score in purchases:
        price = catalogue.product_prices[product["asin"]]
        expected, _ = webshop_reward(product, goal, price, options, noun_extractor=reference)
        assert score == expected


@pytest.mark.realdata
def test_the_noun_table_is_what_tagging_each_title_alone_gives(counted_spacy, webshop_real_data):
    # a third of the real catalogue, spread over it: batching is what is tested, not the titles
    titles = load_catalogue(webshop_real_data).titles[::3]
    batched = counted_spacy.extract_many(titles)
    one_by_one = [counted_spacy._extract(t) for t in titles]
    assert batched == one_by_one


@pytest.mark.realdata
def test_a_second_process_loads_the_table_from_disk_without_tagging(
    counted_spacy, webshop_real_data, tmp_path
):
    titles = load_catalogue(webshop_real_data).titles[:300]
    assert prepare_title_nouns(counted_spacy, titles, cache_dir=tmp_path) == 300
    fresh = SpacyNouns(SPACY_MODEL_DIR)  # as a new process would have
    fresh._nlp = CountingPipeline(fresh._nlp)
    assert prepare_title_nouns(fresh, titles, cache_dir=tmp_path) == 0
    assert [fresh(t) for t in titles] == [counted_spacy(t) for t in titles]
    assert fresh._nlp.texts == 0


def test_cache_is_keyed_by_titles_and_extractor(tmp_path):
    nouns = FallbackNouns()
    a = ["Red Cotton Shirt for Men", "Organic Green Tea Bags, 100 Count"]
    b = a + ["Stainless Steel Water Bottle"]
    prepare_title_nouns(nouns, a, cache_dir=tmp_path)
    prepare_title_nouns(nouns, b, cache_dir=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(
        f"nouns-{FallbackNouns.cache_tag}-{titles_digest(t)}.json" for t in (a, b)
    )
    assert titles_digest(a) != titles_digest(list(reversed(a)))
    assert FallbackNouns.cache_tag.startswith("fallback-")


def test_a_table_on_disk_is_used_as_is_and_a_corrupt_one_is_rebuilt(tmp_path):
    titles = ["Red Cotton Shirt for Men", "Organic Green Tea Bags"]
    nouns = FallbackNouns()
    assert prepare_title_nouns(nouns, titles, cache_dir=tmp_path) == 2
    (path,) = tmp_path.iterdir()
    # doctor the file: a new extractor must answer from it, proving it was read
    version, table = json.loads(path.read_text())
    path.write_text(json.dumps([version, [["doctored"], []]]))
    reader = FallbackNouns()
    assert prepare_title_nouns(reader, titles, cache_dir=tmp_path) == 0
    assert reader(titles[0]) == ("doctored",)
    # a truncated file is tagged again and replaced atomically
    path.write_bytes(path.read_bytes()[:10])
    again = FallbackNouns()
    assert prepare_title_nouns(again, titles, cache_dir=tmp_path) == 2
    assert again(titles[0]) == tuple(table[0]) == FallbackNouns()(titles[0])
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_an_unwritable_cache_keeps_the_table_in_memory(tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # a file where the cache folder should be: nothing can be written
    nouns = FallbackNouns()
    titles = ["Red Cotton Shirt for Men"]
    assert prepare_title_nouns(nouns, titles, cache_dir=blocker / "webshop") == 1
    assert "kept in memory only" in capsys.readouterr().err
    assert titles[0] in nouns._memo._pinned
    assert nouns(titles[0]) == FallbackNouns()(titles[0])


def test_pinned_titles_survive_the_bounded_memo_being_cleared(tmp_path, monkeypatch):
    from agentgym.envs.webshop import nouns as nouns_module

    monkeypatch.setattr(nouns_module, "_MEMO_LIMIT", 4)
    nouns = FallbackNouns()
    titles = [f"Title Number {i} Shirt" for i in range(10)]
    prepare_title_nouns(nouns, titles, cache_dir=tmp_path)
    for i in range(20):  # other titles fill and clear the bounded memo
        nouns(f"Other Thing {i} Mug")
    assert all(t in nouns._memo._pinned for t in titles)


def test_extractors_without_prepare_are_left_alone():
    def every_word(text: str) -> tuple[str, ...]:
        return tuple(text.lower().split())

    assert prepare_title_nouns(every_word, ["A Title"]) == 0
