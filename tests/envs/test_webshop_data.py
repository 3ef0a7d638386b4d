"""WebShop data: the streaming reader, WebShop's loader and goals, fixed prices and splits."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from agentgym.envs.webshop import data as wsdata
from agentgym.envs.webshop.data import (
    PRICE_RANGE,
    DataNotFoundError,
    data_status,
    iter_json_array,
    load_catalogue,
    search_text,
)
from agentgym.envs.webshop.synthetic import generate_catalogue, write_synthetic_files


# -- streaming ----------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_iter_json_array_round_trips_at_every_chunk_size(tmp_path, chunk):
    values = [{"asin": f"B{i:09d}", "s": "é" * (i % 5), "n": [i, -1.5e-3]} for i in range(40)]
    values += [12345678, 2.5, "text", None, True, [], {}]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(values, indent=1, ensure_ascii=False), encoding="utf-8")
    assert list(iter_json_array(path, chunk_chars=chunk)) == values


@pytest.mark.parametrize(
    "text, where",
    [
        ("[1, 2", "not closed"),
        ("[1, {", "malformed"),
        ("[1 2]", "expected ','"),
        ('{"a": 1}', "top-level JSON array"),
        ("[1,]", "malformed"),
        ("", "top-level JSON array"),
        ('[{"a": "unterminated}]', "malformed"),
    ],
)
def test_iter_json_array_rejects_malformed_input(tmp_path, text, where):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=where):
        list(iter_json_array(path, chunk_chars=2))


def test_iter_json_array_is_lazy(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("[" + ",".join(["1"] * 10) + ", oops]")
    stream = iter_json_array(path, chunk_chars=4)
    assert list(itertools.islice(stream, 10)) == [1] * 10  # the bad tail is not read yet
    with pytest.raises(ValueError):
        next(stream)


# -- WebShop's loader rules ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, pricing, tag",
    [
        ("$877.80", [877.8], "$877.8"),
        ("", [100.0], "$100.0"),
        (None, [100.0], "$100.0"),
        ("$19.99$27.99", [19.99, 27.99], "$19.99 to $27.99"),
        ("$1,299.00 - $1,499.00", [1299.0, 1499.0], "$1299.0 to $1499.0"),
        ("$5.00 - $6.00 - $7.00", [5.0, 6.0], "$5.0 to $6.0"),
        ("$ - $3", [3.0], "$3.0"),  # WebShop would raise on the empty piece
    ],
)
def test_pricing_as_engine_py_parses_it(raw, pricing, tag):
    assert wsdata._parse_pricing(raw) == (pricing, tag)


def test_search_text_is_webshops_indexed_contents():
    product = {
        "Title": "Red Shirt",
        "Description": "Soft COTTON.",
        "BulletPoints": ["Machine Wash", "ignored"],
        "options": {"color": ["red", "navy | blue"], "size": ["l"]},
    }
    assert search_text(product) == (
        "red shirt soft cotton. machine wash color: red, navy | blue, and size: l"
    )
    assert search_text(dict(product, BulletPoints=[], options={})) == "red shirt soft cotton.  "


@pytest.fixture(scope="module")
def raw_real(webshop_real_data):
    with open(webshop_real_data / "items_shuffle_1000.json") as f:
        products = json.load(f)
    with open(webshop_real_data / "items_ins_v2_1000.json") as f:
        attributes = json.load(f)
    return products, attributes


@pytest.fixture(scope="module")
def real(webshop_real_data):
    return load_catalogue(webshop_real_data)


def test_real_products_are_webshops_dicts(real, raw_real):
    raw_products, attributes = raw_real
    assert len(real.products) == 1000 and real.synthetic is False
    assert real.product_by_asin.keys() == {p["asin"] for p in raw_products}
    for raw, p in zip(raw_products, real.products, strict=True):
        assert p["asin"] == raw["asin"] and p["Title"] == raw["name"]
        assert p["Description"] == raw["full_description"]
        bullets = raw["small_description"]
        assert p["BulletPoints"] == (bullets if isinstance(bullets, list) else [bullets])
        assert p["query"] == raw["query"].lower().strip()
        assert p["Reviews"] == [] and p["Rating"] == "N.A."
        assert p["Attributes"] == attributes[raw["asin"]].get("attributes", ["DUMMY_ATTR"])
        assert p["instruction_text"] == attributes[raw["asin"]].get("instruction")
        assert "seller_id" not in p and "product_information" not in p and "brand" not in p
        for name, contents in (raw["customization_options"] or {}).items():
            if contents is None:
                continue
            assert p["options"][name.lower()] == [
                c["value"].strip().replace("/", " | ").lower() for c in contents
            ]


def test_real_goal_count_and_fields(real, raw_real):
    raw_products, attributes = raw_real
    expected = 0  # goal.py: one goal per option combination of each instructed product
    for raw in raw_products:
        record = attributes[raw["asin"]]
        if record.get("instruction") is None:
            continue
        groups = [c for c in (raw["customization_options"] or {}).values() if c is not None]
        expected += math.prod(len(c) for c in groups)
    assert len(real.goals) == expected == 6910
    assert len({g["asin"] for g in real.goals}) == 415  # the small file's instructed products
    for g in real.goals[:200]:
        assert list(g) == [
            "asin",
            "category",
            "query",
            "name",
            "product_category",
            "instruction_text",
            "attributes",
            "price_upper",
            "goal_options",
            "weight",
        ]
        product = real.product_by_asin[g["asin"]]
        assert g["name"] == product["Title"] and g["attributes"]
        assert set(g["goal_options"]) == set(product["options"])
        assert g["instruction_text"].startswith(product["instruction_text"])


def test_prices_and_bounds_are_drawn_as_webshop_draws_them(real):
    for p in real.products:
        price = real.product_prices[p["asin"]]
        # random.uniform(a, b) also covers a > b, which the real file has ("$44.99$44.38")
        assert min(p["pricing"]) <= price <= max(p["pricing"])
    for g in real.goals:
        price = real.product_prices[g["asin"]]
        candidates = [x for x in PRICE_RANGE if x > price][:4]
        if len(candidates) >= 2:
            # the larger of two distinct draws among the next four multiples of ten
            assert g["price_upper"] in candidates[1:]
            assert g["instruction_text"].endswith(
                f", and price lower than {g['price_upper']:.2f} dollars"
            )
        else:
            assert g["price_upper"] == 1000000 and "price lower than" not in g["instruction_text"]


def test_prices_are_the_same_in_every_process(real, webshop_real_data):
    code = (
        "import json, sys; from agentgym.envs.webshop import load_catalogue;"
        f"c = load_catalogue({str(webshop_real_data)!r});"
        "print(json.dumps([c.product_prices, [g['instruction_text'] for g in c.goals]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    prices, texts = json.loads(out.stdout)
    assert prices == real.product_prices
    assert texts == [g["instruction_text"] for g in real.goals]


def test_goal_order_is_webshops_shuffle_whatever_the_price_seed(webshop_real_data, real):
    other = load_catalogue(webshop_real_data, seed=7)
    assert other is not real
    assert [(g["asin"], g["goal_options"]) for g in other.goals] == [
        (g["asin"], g["goal_options"]) for g in real.goals
    ]
    assert other.product_prices != real.product_prices  # the seed does move ranged prices


def test_splits_are_fixed_and_disjoint(real):
    n = len(real.goals)
    assert np.array_equal(real.splits["test"], np.arange(500))
    assert np.array_equal(real.splits["valid"], np.arange(500, 1500))
    assert np.array_equal(real.splits["train"], np.arange(1500, n))
    joined = np.concatenate(list(real.splits.values()))
    assert len(np.unique(joined)) == n


def test_catalogue_is_loaded_once_per_process(webshop_real_data, real):
    assert load_catalogue(webshop_real_data) is real
    assert load_catalogue(str(webshop_real_data)) is real


def test_human_goals(tmp_path):
    write_synthetic_files(tmp_path, 50, seed=3)
    products = json.loads((tmp_path / "items_shuffle_1000.json").read_text())
    human = {
        products[0]["asin"]: [
            {
                "instruction": "i want something nice.",
                "instruction_attributes": ["nice"],
                "instruction_options": ["red"],
            },
            {"instruction": "skipped", "instruction_attributes": [], "instruction_options": []},
        ],
        products[1]["asin"]: [
            {
                "instruction": "a second one",
                "instruction_attributes": ["a", "b"],
                "instruction_options": [],
            }
        ],
    }
    (tmp_path / "items_human_ins.json").write_text(json.dumps(human))
    cat = load_catalogue(tmp_path)  # "auto" picks human goals when the file is there
    assert cat.goal_kind == "human" and len(cat.goals) == 2
    by_asin = {g["asin"]: g for g in cat.goals}
    first = by_asin[products[0]["asin"]]
    assert first["instruction_text"].startswith("i want something nice")
    assert first["instruction_text"][len("i want something nice") :] in (
        "",
        f", and price lower than {first['price_upper']:.2f} dollars",
    )
    assert first["goal_options"] == ["red"] and first["weight"] == 1
    assert "instructions" in cat.product_by_asin[products[0]["asin"]]
    synthetic_goals = load_catalogue(tmp_path, goals="synthetic")
    assert synthetic_goals.goal_kind == "synthetic" and len(synthetic_goals.goals) > 2


def test_missing_files_say_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    with pytest.raises(DataNotFoundError, match="set WEBSHOP_DATA"):
        load_catalogue()
    with pytest.raises(FileNotFoundError, match="items_shuffle.json.*WebShop-Synthetic-v0"):
        load_catalogue(tmp_path, catalogue="full")
    with pytest.raises(DataNotFoundError, match="goals='synthetic'"):
        write_synthetic_files(tmp_path, 20)
        load_catalogue(tmp_path, goals="human")
    with pytest.raises(ValueError, match="catalogue="):
        load_catalogue(tmp_path, catalogue="medium")
    assert data_status().startswith("not found")
    assert "small (items_shuffle_1000.json)" in data_status(tmp_path)
    assert "full (items_shuffle.json)" in data_status(tmp_path)


# -- the synthetic shop -------------------------------------------------------------------------
def test_synthetic_shop_is_seeded_and_labelled():
    a = generate_catalogue(200, seed=1)
    assert a == generate_catalogue(200, seed=1)
    assert a != generate_catalogue(200, seed=2)
    cat = load_catalogue(synthetic=True)
    assert cat.synthetic and cat.source.startswith("synthetic")
    assert all(p["asin"].startswith("SYN") and len(p["asin"]) == 10 for p in cat.products)
    assert len(cat.splits["train"]) > 1000 and len(cat.splits["test"]) == 500
    # instructed attributes appear in the product's text, so every goal can be met
    for g in cat.goals[:300]:
        p = cat.product_by_asin[g["asin"]]
        assert all(a in p["Description"] for a in g["attributes"])


def test_synthetic_files_read_by_the_same_loader(tmp_path):
    write_synthetic_files(tmp_path, 300, seed=5)
    from_files = load_catalogue(tmp_path, seed=5)
    in_memory = load_catalogue(synthetic=True, num_products=300, seed=5)
    assert from_files.products == in_memory.products
    assert from_files.goals == in_memory.goals
    assert from_files.product_prices == in_memory.product_prices
    # the full catalogue's name is streamed; num_products keeps the first N, as WebShop does
    full = load_catalogue(tmp_path, catalogue="full", seed=5, num_products=120)
    assert full.products == in_memory.products[:120]
    reviewed = [p for p in in_memory.products if p["Reviews"]]
    assert reviewed and all("score" in r and "body" in r for r in reviewed[0]["Reviews"])
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []
