"""WebShop env: page text parity with WebShop, every transition, invalid actions, rewards, sharing.

Expected page strings below were produced by rendering WebShop's own templates
(``web_agent_site/templates/*.html``, with Flask's ``render_template_string`` as ``engine.py``
calls it) and converting the HTML as ``WebAgentTextEnv.convert_html_to_text(simple=True)`` does
(BeautifulSoup ``html.parser``, ``tag_visible``, ``" [SEP] ".join(...)``), for the hand-made
products defined here.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import string
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest

import agentgym  # noqa: F401  (registers the ids)
from agentgym.core import ResetOptionError
from agentgym.envs.webshop import (
    SEARCH_ACTION,
    WebShopEnv,
    load_catalogue,
    pages,
    parse_action,
    product_search,
)
from agentgym.envs.webshop.reward import webshop_reward
from agentgym.envs.webshop.search import SEARCH_RETURN_N, ProductSearch

INS = "i need a navy blue shirt, and price lower than 30.00 dollars"
HEAD = f"Instruction: [SEP] {INS} [SEP] Back to Search"
SHIRT = {
    "asin": "B0TEST0001",
    "Title": "Acme <Deluxe> Shirt & Tie ",
    "Price": "$12.5 to $20.0",
    "Rating": "N.A.",
    "options": {"color": ["navy | blue", "red"], "size": ["x-large"]},
    "Description": None,
    "BulletPoints": ["  soft cotton ", " ", "\n", "machine wash"],
    "Reviews": [{"title": "Nice", "score": 4, "body": "Fits well."}],
    "Attributes": ["cotton"],
    "category": "fashion",
    "query": "men's shirts",
    "product_category": "Clothing › Men",
}
MUG = dict(SHIRT, asin="B0TEST0002", Title="Plain Mug", Price="$100.0", options={})
MUG.update(Description="", BulletPoints=[], Reviews=[])


def _goal_index(info: dict) -> int:
    """The goal index a ``webshop-<n>`` task id names."""
    return int(info["task_id"].removeprefix("webshop-"))


# -- page text, byte for byte ---------------------------------------------------------------


def test_search_page_is_webshops_first_observation():
    assert pages.search_page(INS) == f"WebShop [SEP] Instruction: [SEP] {INS} [SEP] Search"


def test_results_page_text():
    assert pages.results_page(INS, [SHIRT, MUG], 1, 2) == (
        f"{HEAD} [SEP] Page 1 (Total results: 2) [SEP] Next > [SEP] B0TEST0001 [SEP] "
        "Acme <Deluxe> Shirt & Tie [SEP] $12.5 to $20.0 [SEP] B0TEST0002 [SEP] Plain Mug "
        "[SEP] $100.0"
    )
    # past the last result: an empty page that still offers Next >
    assert pages.results_page(INS, [], 6, 50) == (
        f"{HEAD} [SEP] Page 6 (Total results: 50) [SEP] < Prev [SEP] Next >"
    )


def test_item_page_text():
    assert pages.item_page(INS, SHIRT) == (
        f"{HEAD} [SEP] < Prev [SEP] color [SEP] navy | blue [SEP] red [SEP] size [SEP] x-large "
        "[SEP] Acme <Deluxe> Shirt & Tie [SEP] Price: $12.5 to $20.0 [SEP] Rating: N.A. [SEP] "
        "Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert pages.item_page(INS, MUG, show_attrs=True) == (
        f"{HEAD} [SEP] < Prev [SEP] Plain Mug [SEP] Price: $100.0 [SEP] Rating: N.A. [SEP] "
        "Description [SEP] Features [SEP] Reviews [SEP] Attributes [SEP] Buy Now"
    )


@pytest.mark.parametrize(
    "product, name, tail",
    [
        (SHIRT, "description", " [SEP] None"),  # Jinja renders None as "None"
        (MUG, "description", ""),  # an empty field makes no text node
        # " " + "  soft cotton " is stripped; " " + " " is a blank node (an empty piece);
        # " " + "\n" collapses to "\n", which the text env drops
        (SHIRT, "features", " [SEP] soft cotton [SEP]  [SEP] machine wash"),
        (MUG, "features", ""),
        (SHIRT, "reviews", ' [SEP] "Nice" [SEP] 4 [SEP] Fits well.'),
        (MUG, "reviews", ""),
        (
            SHIRT,
            "attributes",
            " [SEP] cotton [SEP] fashion [SEP] men's shirts [SEP] Clothing › Men",
        ),
    ],
)
def test_sub_page_text(product, name, tail):
    assert pages.sub_page(INS, product, name) == f"{HEAD} [SEP] < Prev{tail}"


def test_done_page_text():
    options = {"size": "x-large", "color": "navy | blue <&'>"}
    assert pages.done_page(0.6666666666666666, "B0TEST0001", options) == (
        "Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your "
        "MTurk interface.) [SEP] Purchased [SEP] asin [SEP] B0TEST0001 [SEP] options [SEP] "
        '{"color": "navy | blue \\u003c\\u0026\\u0027\\u003e", "size": "x-large"} [SEP] attrs '
        "[SEP] None [SEP] category [SEP] None [SEP] query [SEP] None [SEP] product category "
        "[SEP] None [SEP] Target [SEP] asin [SEP] options [SEP] attrs [SEP] price upper [SEP] "
        "instuction text [SEP] category [SEP] product category [SEP] query [SEP] Goal [SEP] "
        "None [SEP] Reward [SEP] Your score (min 0.0, max 1.0) [SEP] 0.6666666666666666 [SEP] "
        "Reward Details [SEP] None"
    )


def test_clickables_follow_webshops_dict_of_texts():
    assert pages.results_clickables([SHIRT, MUG], 1) == [
        "back to search",
        "next >",
        "b0test0001",
        "b0test0002",
    ]
    assert pages.results_clickables([], 2) == ["back to search", "< prev", "next >"]
    names, group = pages.item_clickables(SHIRT)
    assert names == [
        "back to search",
        "< prev",
        "description",
        "features",
        "reviews",
        "buy now",
        "navy | blue",
        "red",
        "x-large",
    ]
    assert group == {"navy | blue": "color", "red": "color", "x-large": "size"}
    # a value shared by two groups is one clickable, bound to the last group (dict semantics)
    shared = dict(SHIRT, options={"color": ["black"], "trim": ["black", "gold"]})
    names, group = pages.item_clickables(shared)
    assert names.count("black") == 1 and group["black"] == "trim"


@pytest.mark.parametrize(
    "action, parsed",
    [
        ("search[red shirt]", ("search", "red shirt")),
        ("click[Buy Now]", ("click", "Buy Now")),
        ("search[a] and click[b]", ("search[a] and click", "b")),  # greedy, as re.match is
        ("click[b09] trailing", ("click", "b09")),
        ("click[]", ("click[]", None)),
        ("look", ("look", None)),
        ("click[a\nb]", ("click[a\nb]", None)),  # "." does not cross a newline
    ],
)
def test_parse_action_is_webshops(action, parsed):
    assert parse_action(action) == parsed


def test_parse_action_equals_webshops_regex_on_random_text():
    webshop = re.compile(r"(.+)\[(.+)\]")  # engine.py's pattern, used with re.match
    rng = random.Random(0)
    for _ in range(20_000):
        action = "".join(rng.choice("ab[]\n ") for _ in range(rng.randint(0, 12)))
        m = webshop.match(action)
        assert parse_action(action) == ((action, None) if m is None else m.groups()), action


def test_parse_action_is_linear_where_the_regex_is_quadratic():
    start = time.perf_counter()
    for action in ("[" * 100_000, "[" * 50_000 + "]", "a[" + "]" * 100_000):
        parse_action(action)
    assert time.perf_counter() - start < 0.5


# -- the env on the synthetic shop ------------------------------------------------------------
@pytest.fixture(scope="module")
def env() -> WebShopEnv:
    return WebShopEnv(synthetic=True)


def _goal_route(env: WebShopEnv, goal_index: int):
    """Reset on a goal and walk to its product: (obs, info) on the product's item page, or None."""
    obs, info = env.reset(options={"task": goal_index})
    goal = info["goal"]
    obs, _, _, _, info = env.step(f"search[{goal['instruction_text']}]")
    for _ in range(SEARCH_RETURN_N // pages.PRODUCT_WINDOW):
        if f"click[{goal['asin'].lower()}]" in info["admissible_actions"]:
            obs, _, _, _, info = env.step(f"click[{goal['asin'].lower()}]")
            return obs, info
        obs, _, _, _, info = env.step("click[next >]")
    return None


def test_first_observation_and_info(env):
    obs, info = env.reset(seed=4)
    goal = info["goal"]
    assert obs == f"WebShop [SEP] Instruction: [SEP] {goal['instruction_text']} [SEP] Search"
    assert info["admissible_actions"] == [SEARCH_ACTION]
    assert info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    assert info["synthetic"] is True and info["page"] == "search"
    assert goal == env.catalogue.goals[_goal_index(info)]
    assert goal["instruction_text"] not in obs.replace(goal["instruction_text"], "", 1)
    assert info["goal"] is not env.catalogue.goals[_goal_index(info)]  # a copy per info


def test_suggested_actions_are_concrete_and_valid_on_every_page(env):
    """Suggestions replace the search placeholder with the instruction's product words and the
    whole instruction (both valid searches) and keep every other admissible action."""
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=7)
    head, whole = info["suggested_actions"][:2]
    assert whole == f"search[{info['goal']['instruction_text'].lower()}]"
    assert head.startswith("search[") and 0 < len(head) < len(whole)
    assert head[7:-1] in info["goal"]["instruction_text"].lower()
    for _ in range(40):
        suggested = info["suggested_actions"]
        assert SEARCH_ACTION not in suggested
        assert [a for a in info["admissible_actions"] if a != SEARCH_ACTION] == [
            a for a in suggested if not a.startswith("search[")
        ]
        snap = env.snapshot()
        for action in suggested:
            env.restore(snap)
            assert env.step(action)[4]["action_valid"], action
        env.restore(snap)
        obs, _, term, trunc, info = env.step(suggested[int(rng.integers(len(suggested)))])
        if term or trunc:
            obs, info = env.reset()


def test_every_transition(env):
    obs, info = env.reset(options={"task": 1600})
    goal = info["goal"]
    query = goal["query"]

    obs, r, term, trunc, info = env.step(f"search[{query.upper()}]")
    rows = env.search_engine.search(query)  # the query is lower-cased, as WebShop does
    first = [env.catalogue.products[i] for i in rows[:10]]
    assert obs == pages.results_page(goal["instruction_text"], first, 1, len(rows))
    assert info["page"] == "results" and not term and r == 0.0
    results_key = info["state_key"]
    assert results_key == (1600, "results", query, 1, None, (), None)
    assert info["admissible_actions"][:2] == ["click[back to search]", "click[next >]"]
    assert info["admissible_actions"][2:] == [f"click[{p['asin'].lower()}]" for p in first]

    obs, *_, info = env.step("click[next >]")
    assert "Page 2 (Total results:" in obs and info["state_key"][3] == 2
    assert info["admissible_actions"][:3] == [
        "click[back to search]",
        "click[< prev]",
        "click[next >]",
    ]
    obs, *_, info = env.step("click[< prev]")
    assert info["state_key"] == results_key

    product = first[0]
    obs, *_, info = env.step(f"click[{product['asin'].lower()}]")
    assert obs == pages.item_page(goal["instruction_text"], product)
    assert info["state_key"] == (1600, "item", query, 1, product["asin"], (), None)
    item_key = info["state_key"]

    options = {name: values[-1] for name, values in product["options"].items()}
    for value in options.values():
        obs, *_, info = env.step(f"click[{value}]")
        assert info["action_valid"]
    assert info["state_key"][5] == tuple(sorted(options.items()))
    with_options = info["state_key"]

    for sub in ("description", "features", "reviews"):
        obs, *_, info = env.step(f"click[{sub}]")
        assert obs == pages.sub_page(goal["instruction_text"], product, sub)
        assert info["admissible_actions"] == ["click[back to search]", "click[< prev]"]
        obs, *_, info = env.step("click[< prev]")  # back to the item, options kept
        assert info["state_key"] == with_options
    env_steps = env.elapsed_steps

    obs, *_, info = env.step("click[< prev]")  # item -> its results page, options cleared
    assert info["state_key"] == results_key
    obs, *_, info = env.step(f"click[{product['asin'].lower()}]")
    assert info["state_key"] == item_key  # the same page by another path: the same key

    obs, *_, info = env.step("click[back to search]")
    assert obs == pages.search_page(goal["instruction_text"])
    assert info["state_key"] == (1600, "search", None, None, None, (), None)
    assert env.elapsed_steps == env_steps + 3


def test_search_works_from_any_page_as_in_webshop(env):
    env.reset(options={"task": 1500})
    env.step("search[shorts]")
    _, _, _, _, info = env.step(
        info_asin := "click[" + env._page_products()[0]["asin"].lower() + "]"
    )
    assert info["page"] == "item", info_asin
    obs, _, _, _, info = env.step("search[green tea]")
    assert info["action_valid"] and info["state_key"][1:4] == ("results", "green tea", 1)
    strict = WebShopEnv(synthetic=True, search_anywhere=False)
    strict.reset(options={"task": 1500})
    strict.step("search[shorts]")
    obs, _, _, _, info = strict.step("search[green tea]")
    assert not info["action_valid"] and "no search bar" in obs


@pytest.mark.parametrize(
    "setup, action",
    [
        ([], "click[next >]"),
        ([], "click[buy now]"),
        ([], "click[search]"),  # WebShop lists it, ignores it
        ([], "search[]"),
        ([], "buy[now]"),
        (["search[coffee]"], "click[buy now]"),
        (["search[coffee]"], "click[description]"),
        (["search[coffee]"], "click[< prev]"),  # page 1 has no Prev
        (["search[coffee]"], "click[b000000000]"),
        (["search[coffee]", "@first"], "click[next >]"),
        (["search[coffee]", "@first"], "click[not an option]"),
        (["search[coffee]", "@first", "click[features]"], "click[buy now]"),
        (["search[coffee]", "@first", "click[features]"], "click[reviews]"),
    ],
)
def test_invalid_actions_change_nothing(env, setup, action):
    obs, info = env.reset(options={"task": 1700})
    for a in setup:
        if a == "@first":
            a = f"click[{env._page_products()[0]['asin'].lower()}]"
        obs, _, _, _, info = env.step(a)
        assert info["action_valid"], a
    key, steps = info["state_key"], env.elapsed_steps
    bad_obs, reward, term, trunc, bad = env.step(action)
    assert bad["action_valid"] is False and reward == 0.0 and not term
    assert bad["state_key"] == key and bad_obs.startswith("Invalid action")
    assert env.elapsed_steps == steps + 1  # an invalid action still costs a turn
    assert bad["admissible_actions"] == info["admissible_actions"]
    # the page is still there: the same action as before works again
    assert env._render() == obs


def test_buying_the_goal_wins(env):
    for goal_index in range(1500, 1540):
        route = _goal_route(env, goal_index)
        if route is not None:
            break
    else:
        pytest.fail("no goal product found among the top 50 of its own instruction")
    obs, info = route
    goal = info["goal"]
    for value in goal["goal_options"].values():
        obs, *_, info = env.step(f"click[{value}]")
    obs, reward, term, trunc, info = env.step("click[buy now]")
    expected, parts = webshop_reward(
        env.catalogue.product_by_asin[goal["asin"]],
        goal,
        env.catalogue.product_prices[goal["asin"]],
        goal["goal_options"],
    )
    assert info["score"] == expected == 1.0 and info["won"] is True
    assert reward == 10.0 and term and not trunc
    assert info["reward_info"] == parts and info["page"] == "done"
    assert obs == pages.done_page(1.0, goal["asin"], goal["goal_options"])
    assert info["admissible_actions"] == []
    # the episode is over: further steps are refused
    _, reward, term, _, info = env.step("click[back to search]")
    assert reward == 0.0 and term and info["action_valid"] is False


def test_raw_reward_mode_and_a_partial_purchase():
    env = WebShopEnv(synthetic=True, reward_mode="raw")
    obs, info = env.reset(options={"task": 1500})
    goal = info["goal"]
    env.step("search[hdmi cable gold plated]")
    wrong = next(p for p in env._page_products() if p["asin"] != goal["asin"])
    env.step(f"click[{wrong['asin'].lower()}]")
    _, reward, term, _, info = env.step("click[buy now]")
    expected, _ = webshop_reward(wrong, goal, env.catalogue.product_prices[wrong["asin"]], {})
    assert term and reward == info["score"] == expected < 1.0 and info["won"] is False


def test_step_cap_truncates():
    env = gym.make("AgentGym/WebShop-Synthetic-v0")  # the registered cap: 15 steps
    env.reset(seed=0)
    for i in range(15):
        _, _, term, trunc, _ = env.step("search[tea]")
        assert not term and trunc == (i == 14)


# -- tasks and splits --------------------------------------------------------------------------
def test_splits_never_leak_whatever_the_seed(env):
    test, valid = set(range(500)), set(range(500, 1500))
    for seed in range(60):
        _, info = env.reset(seed=seed)  # default split: train
        assert _goal_index(info) >= 1500
        _, info = env.reset(seed=seed, options={"split": "test"})
        assert _goal_index(info) in test
        _, info = env.reset(seed=seed, options={"split": "valid"})
        assert _goal_index(info) in valid


def test_task_options(env):
    _, info = env.reset(options={"task": 7})
    assert info["task_id"] == "webshop-7" and info["goal"] == env.catalogue.goals[7]
    _, again = env.reset(options={"task": info["task_id"]})  # a task id round-trips
    assert again["state_key"] == info["state_key"]
    _, info = env.reset(options={"task": 7, "split": "test"})
    with pytest.raises(ResetOptionError, match="split 'test'"):
        env.reset(options={"task": 7, "split": "train"})
    for bad in (-1, len(env.catalogue.goals), "seven", 2.5, True):
        with pytest.raises(ResetOptionError):
            env.reset(options={"task": bad})
    with pytest.raises(ResetOptionError, match="unknown split"):
        env.reset(options={"split": "dev"})


def test_same_seed_same_goal_and_text(env):
    other = WebShopEnv(synthetic=True)
    for seed in (0, 1, 99):
        assert env.reset(seed=seed) == other.reset(seed=seed)
        assert env.step("search[protein bars]") == other.step("search[protein bars]")


def test_pickle_keeps_state_and_shares_the_catalogue(env):
    env.reset(options={"task": 1555})
    env.step("search[mattress memory foam]")
    clone = pickle.loads(pickle.dumps(env))
    assert clone.catalogue is env.catalogue and clone.search_engine is env.search_engine
    assert clone.step("click[next >]") == env.step("click[next >]")
    assert len(pickle.dumps(env)) < 20_000  # arguments and page state, not the shop


def test_missing_data_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="WEBSHOP_DATA.*WebShop-Synthetic-v0"):
        gym.make("AgentGym/WebShop-v0")
    with pytest.raises(FileNotFoundError, match="items_shuffle_1000.json"):
        WebShopEnv(data_dir=tmp_path)


# -- sharing and search ------------------------------------------------------------------------
def test_envs_share_one_catalogue_and_index():
    envs = [WebShopEnv(synthetic=True) for _ in range(8)]
    assert all(e.catalogue is envs[0].catalogue for e in envs)
    assert all(e.search_engine is envs[0].search_engine for e in envs)
    assert all(e.catalogue.products is envs[0].catalogue.products for e in envs)


def test_128_envs_cost_little_memory_beyond_one(tmp_path):
    """RSS growth for 128 envs is at most 1.5x that of one env with its catalogue and index."""
    code = textwrap.dedent(
        """
        import gc, json, resource
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * resource.getpagesize()
        import agentgym.envs.webshop as ws
        from agentgym.envs.webshop.nouns import FallbackNouns
        nouns = FallbackNouns()  # (spaCy's model is the reward's cost, not the catalogue's)
        base = rss()
        envs = [ws.WebShopEnv(synthetic=True, noun_extractor=nouns)]
        envs[0].reset(seed=0); envs[0].step("search[tea]")
        one = rss()
        for i in range(127):
            e = ws.WebShopEnv(synthetic=True, noun_extractor=nouns)
            e.reset(seed=i); e.step("search[tea]")
            envs.append(e)
        gc.collect()
        print(json.dumps({"base": base, "one": one, "all": rss()}))
        """
    )
    env = dict(os.environ, AGENTGYM_CACHE=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    m = json.loads(out.stdout.strip().splitlines()[-1])
    one, all_ = m["one"] - m["base"], m["all"] - m["base"]
    assert one > 0
    assert all_ <= 1.5 * one, (one, all_)


def test_search_returns_webshops_top_50(env):
    search = env.search_engine
    rows = search.search("green tea")
    assert 0 < len(rows) <= SEARCH_RETURN_N and rows.dtype == np.int64
    assert len(set(rows.tolist())) == len(rows)
    texts = env.catalogue.search_texts
    # every hit shares a term with the query; the best ones mention both words
    assert all("tea" in texts[r] or "green" in texts[r] for r in rows)
    assert "green tea" in texts[rows[0]]
    assert search.search("green tea") is rows  # memoised: groups repeat queries
    assert len(search.search("zzzz qqqq")) == 0
    assert search is product_search(env.catalogue)


def test_an_unwritable_cache_keeps_the_index_in_memory(tmp_path, monkeypatch, caplog):
    cat = load_catalogue(synthetic=True, num_products=300)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # no folder can be made under it, even by root
    monkeypatch.setenv("AGENTGYM_CACHE", str(blocker / "cache"))
    with caplog.at_level("WARNING", logger="agentgym"):
        search = ProductSearch(cat, persist=True)  # the default folder: $AGENTGYM_CACHE/webshop
    assert search.path is None and len(search.search("coffee"))
    warnings = [r.getMessage() for r in caplog.records if r.name == "agentgym"]
    assert len(warnings) == 1 and "AGENTGYM_CACHE" in warnings[0], warnings


def test_saved_index_is_reused(tmp_path):
    cat = load_catalogue(synthetic=True, num_products=300)
    built = ProductSearch(cat, cache_dir=tmp_path, persist=True)
    assert built.path is not None and built.path.is_dir()
    reopened = ProductSearch(cat, cache_dir=tmp_path, persist=True)
    queries = ["coffee", "black shorts x-large", "waterproof bluetooth speaker"]
    for a, b in zip(built.search_many(queries), reopened.search_many(queries), strict=True):
        assert np.array_equal(a, b) and len(a)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # written through a temp folder, nothing half-written left


# -- the real catalogue -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_env(webshop_real_data) -> WebShopEnv:
    return WebShopEnv(data_dir=webshop_real_data)


def test_real_first_observation_and_walk(real_env):
    obs, info = real_env.reset(options={"task": 0})
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ")
    assert info["synthetic"] is False and info["task_id"] == "webshop-0"
    goal = info["goal"]
    obs, *_, info = real_env.step(f"search[{goal['query']}]")
    assert "Total results: 50" in obs
    obs, *_, info = real_env.step(info["admissible_actions"][2])
    assert info["page"] == "item" and real_env.observation_space.contains(obs)


def test_every_real_page_is_inside_the_observation_space(webshop_real_data):
    env = WebShopEnv(data_dir=webshop_real_data, show_attrs=True)
    space, cat = env.observation_space, env.catalogue
    assert not set("".join(p["Title"] for p in cat.products)) <= set(string.printable)
    for i, p in enumerate(cat.products):
        ins = cat.goals[i]["instruction_text"]
        texts = [pages.item_page(ins, p, show_attrs=True), pages.search_page(ins)]
        texts += [pages.sub_page(ins, p, name) for name in pages.SUB_PAGES]
        texts.append(pages.results_page(ins, cat.products[i : i + 10], 1, 50))
        assert all(space.contains(t) for t in texts), p["asin"]


@pytest.mark.slow
def test_bm25s_ranks_like_pyserini_on_the_real_catalogue(webshop_real_data, tmp_path):
    """The default backend returns the stock engine's (Lucene's) top 50 for real goal queries."""
    pytest.importorskip("pyserini")
    cat = load_catalogue(webshop_real_data)
    fast = ProductSearch(cat, "bm25s", persist=False)
    lucene = ProductSearch(cat, "pyserini", cache_dir=tmp_path)
    queries = sorted({g["instruction_text"].lower() for g in cat.goals[:40]})
    queries += sorted({g["query"] for g in cat.goals})[:40]
    for q, a, b in zip(
        queries, fast.search_many(queries), lucene.search_many(queries), strict=True
    ):
        assert a.tolist() == b.tolist(), q
