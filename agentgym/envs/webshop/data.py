"""WebShop's catalogue and goals, loaded as WebShop loads them, with fixed prices and splits.

Files (as WebShop's ``setup.sh`` leaves them in its ``data/`` folder)::

    $WEBSHOP_DATA/items_shuffle_1000.json   (catalogue="small": 1000 products)
    $WEBSHOP_DATA/items_ins_v2_1000.json    (asin -> attributes, instruction, ...)
    $WEBSHOP_DATA/items_shuffle.json        (catalogue="full": 1.18M products)
    $WEBSHOP_DATA/items_ins_v2.json
    $WEBSHOP_DATA/items_human_ins.json      (optional: the 12k human-written goals)
    $WEBSHOP_DATA/reviews.json              (optional; WebShop's loader has it switched off)

:func:`load_catalogue` follows ``web_agent_site/engine/engine.py:load_products`` field by field
(the keys it drops, ``Title`` / ``Description`` / ``BulletPoints`` / ``Price`` / ``pricing`` /
``options`` / ``Attributes``, asin dedup, lower-cased option values with ``/`` turned into
``" | "``), then ``generate_product_prices`` and ``goal.py:get_synthetic_goals`` /
``get_human_goals``. Two differences, both deliberate:

- **Fixed prices.** WebShop draws each ranged product's price and each goal's price bound from
  the unseeded global ``random`` at every start, so two processes disagree on prices, price
  bounds and instruction texts. We make the same draws, in the same order, from
  ``random.Random(seed)``: the result equals a WebShop run preceded by ``random.seed(seed)``,
  and is the same in every process.
- **Fixed splits.** WebShop shuffles its goals with ``random.seed(233)``; the shuffle depends
  only on the number of goals, so our goal order is WebShop's. Goals 0-499 are ``test``,
  500-1499 ``valid`` and the rest ``train`` (WebShop's ``baseline_models/env.py``), whatever
  the env's seed: no test goal is ever drawn in training.

The product file is streamed (:func:`iter_json_array`), so the full catalogue never exists as one
JSON text plus its parse in memory. A loaded :class:`Catalogue` is cached per process and shared
by every env that asks for it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from agentgym.envs.cache import cache_dir
from agentgym.envs.webshop.nouns import titles_digest

__all__ = [
    "CATALOGUE_FILES",
    "DEFAULT_SEED",
    "GOAL_SHUFFLE_SEED",
    "PRICE_RANGE",
    "SPLITS",
    "Catalogue",
    "DataNotFoundError",
    "data_status",
    "default_cache_dir",
    "iter_json_array",
    "load_catalogue",
    "resolve_data_dir",
    "search_text",
]

#: catalogue name -> (product file, attribute file), WebShop's ``use_small`` and full files
CATALOGUE_FILES: dict[str, tuple[str, str]] = {
    "small": ("items_shuffle_1000.json", "items_ins_v2_1000.json"),
    "full": ("items_shuffle.json", "items_ins_v2.json"),
}
HUMAN_GOALS_FILE = "items_human_ins.json"
REVIEWS_FILE = "reviews.json"

#: seed of the price draws (WebShop's are unseeded; see the module docstring)
DEFAULT_SEED = 233
#: WebShop's ``SimServer``: ``random.seed(233); random.shuffle(self.goals)``
GOAL_SHUFFLE_SEED = 233
#: goal.py's candidate price bounds
PRICE_RANGE: list[float] = [10.0 * i for i in range(1, 100)]
#: split -> (first goal, end goal) in the shuffled goal list; ``None`` = to the end
SPLIT_BOUNDS: dict[str, tuple[int, int | None]] = {
    "test": (0, 500),
    "valid": (500, 1500),
    "train": (1500, None),
}
SPLITS: tuple[str, ...] = tuple(SPLIT_BOUNDS)

# engine.py:clean_product_keys drops these scraped fields
_DROPPED_KEYS = (
    "product_information",
    "brand",
    "brand_url",
    "list_price",
    "availability_quantity",
    "availability_status",
    "total_reviews",
    "total_answered_questions",
    "seller_id",
    "seller_name",
    "fulfilled_by_amazon",
    "fast_track_message",
    "aplus_present",
    "small_description_old",
)
_NOT_PRICE = re.compile(r"[^\d.]")


class DataNotFoundError(FileNotFoundError):
    """WebShop's data files are not where we looked; the message says what to set."""


def default_cache_dir() -> Path:
    """``$AGENTGYM_CACHE/webshop`` (default ``~/.cache/agentgym/webshop``)."""
    return cache_dir("webshop")


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """``data_dir``, else ``$WEBSHOP_DATA``, else None."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get("WEBSHOP_DATA")
    return Path(env).expanduser() if env else None


def _no_data_message(where: str, catalogue: str) -> str:
    product_file, attr_file = CATALOGUE_FILES[catalogue]
    return (
        f"WebShop data not found in {where} (looked for {product_file} and {attr_file}); set "
        "WEBSHOP_DATA to the folder holding WebShop's data files (its setup.sh downloads them "
        "into WebShop/data), or pass data_dir=..., or play the built-in synthetic catalogue: "
        "gym.make('AgentGym/WebShop-Synthetic-v0')"
    )


def data_status(data_dir: str | os.PathLike | None = None) -> str:
    """One line saying which WebShop catalogues were found (for ``agentgym list``)."""
    root = resolve_data_dir(data_dir)
    if root is None:
        return "not found: set WEBSHOP_DATA (or play AgentGym/WebShop-Synthetic-v0)"
    found = [
        f"{name} ({product_file})"
        for name, (product_file, attr_file) in CATALOGUE_FILES.items()
        if (root / product_file).is_file() and (root / attr_file).is_file()
    ]
    if not found:
        return f"not found in {root}: no items_shuffle*.json with its items_ins_v2*.json"
    human = ", human goals" if (root / HUMAN_GOALS_FILE).is_file() else ""
    return f"{root}: " + ", ".join(found) + human


# -- streaming JSON ---------------------------------------------------------------------------
_WS = frozenset(" \t\r\n")
_NUMBER_TAIL = frozenset("0123456789.eE+-")


def iter_json_array(path: str | os.PathLike, chunk_chars: int = 1 << 22) -> Iterator[Any]:
    """Yield the elements of the top-level JSON array in ``path`` one at a time.

    Memory stays at one element plus one chunk, so the 1.18M-product file (several GB) streams
    instead of being parsed whole. Raises ``ValueError`` naming the offset on malformed input.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, consumed, eof = "", 0, 0, False

        def refill() -> bool:
            nonlocal buf, pos, consumed, eof
            more = "" if eof else f.read(chunk_chars)
            if not more:
                eof = True
                return False
            consumed += pos
            buf, pos = buf[pos:] + more, 0
            return True

        def peek() -> str:  # the next non-blank character ("" at the end of the file)
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in _WS:
                    pos += 1
                if pos < len(buf):
                    return buf[pos]
                if not refill():
                    return ""

        def fail(what: str) -> ValueError:
            return ValueError(f"{path}: {what} at character {consumed + pos}")

        if peek() != "[":
            raise fail("expected the top-level JSON array")
        pos += 1
        if peek() == "]":
            return
        while True:
            peek()
            while True:  # decode one element, reading on until it is whole
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as exc:
                    if eof:
                        raise fail(f"malformed JSON ({exc.msg})") from exc
                else:
                    # a number cut at the chunk's edge ("2" of "2.5") decodes too early
                    if eof or (end < len(buf) and buf[end] not in _NUMBER_TAIL):
                        break
                refill()
            pos = end
            yield value
            sep = peek()
            if sep == "]":
                return
            if sep == "":
                raise fail("the array is not closed: the file ends")
            if sep != ",":
                raise fail("expected ',' or ']'")
            pos += 1


# -- WebShop's loader -------------------------------------------------------------------------
def _parse_pricing(raw: Any) -> tuple[list[float], str]:
    """engine.py: ``"$12.99 - $15.00"`` -> ([12.99, 15.0], "$12.99 to $15.0"); none -> $100.0.

    WebShop raises on a price piece with no digits; we skip such pieces instead.
    """
    pricing: list[float] = []
    if raw:
        for piece in str(raw).split("$")[1:]:
            try:
                pricing.append(float(Decimal(_NOT_PRICE.sub("", piece))))
            except InvalidOperation:
                continue
    if not pricing:
        return [100.0], "$100.0"
    if len(pricing) == 1:
        return pricing, f"${pricing[0]}"
    return pricing[:2], f"${pricing[0]} to ${pricing[1]}"


def _build_product(
    p: dict[str, Any],
    attributes: dict[str, Any],
    human_attributes: dict[str, Any] | None,
    reviews: dict[str, tuple[list, Any]],
) -> dict[str, Any]:
    """One product dict exactly as engine.py:load_products leaves it (in place, like WebShop)."""
    for key in _DROPPED_KEYS:
        p.pop(key, None)
    asin = p["asin"]
    p["category"] = p["category"]
    p["query"] = p["query"]
    p["product_category"] = p["product_category"]
    p["Title"] = p["name"]
    p["Description"] = p["full_description"]
    product_reviews, rating = reviews.get(asin, ([], "N.A."))
    p["Reviews"] = product_reviews
    p["Rating"] = rating
    for r in p["Reviews"]:
        if "score" not in r:
            r["score"] = r.pop("stars")
        if "review" not in r:
            r["body"] = ""
        else:
            r["body"] = r.pop("review")
    small = p["small_description"]
    p["BulletPoints"] = small if isinstance(small, list) else [small]
    p["pricing"], p["Price"] = _parse_pricing(p.get("pricing"))

    options: dict[str, list[str]] = {}
    option_to_image: dict[str, Any] = {}
    if p["customization_options"]:
        for option_name, option_contents in p["customization_options"].items():
            if option_contents is None:
                continue
            values = []
            for content in option_contents:
                value = content["value"].strip().replace("/", " | ").lower()
                values.append(value)
                option_to_image[value] = content.get("image", None)
            options[option_name.lower()] = values
    p["options"] = options
    p["option_to_image"] = option_to_image

    attrs = attributes.get(asin, {})
    p["Attributes"] = attrs["attributes"] if "attributes" in attrs else ["DUMMY_ATTR"]
    if human_attributes is not None:
        if asin in human_attributes:
            p["instructions"] = human_attributes[asin]
    else:
        p["instruction_text"] = attrs.get("instruction", None)
        p["instruction_attributes"] = attrs.get("instruction_attributes", None)
    p["MainImage"] = p["images"][0] if p.get("images") else None
    p["query"] = p["query"].lower().strip()
    return p


def _load_products(
    raw_products: Iterator[dict[str, Any]],
    attributes: dict[str, Any],
    human_attributes: dict[str, Any] | None,
    reviews: dict[str, tuple[list, Any]],
    num_products: int | None,
    total: int | None,
    desc: str,
) -> list[dict[str, Any]]:
    seen: set[str] = set()
    products = []
    if num_products is not None:  # WebShop: products[:num_products] before the dedup
        raw_products = itertools.islice(raw_products, num_products)
        total = num_products if total is None else min(total, num_products)
    for p in tqdm(raw_products, total=total, desc=desc, unit=" products", mininterval=1.0):
        asin = p["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        products.append(_build_product(p, attributes, human_attributes, reviews))
    return products


def _product_prices(products: list[dict[str, Any]], rng: random.Random) -> dict[str, float]:
    """engine.py:generate_product_prices, drawing from ``rng``."""
    prices = {}
    for product in products:
        pricing = product["pricing"]
        if not pricing:
            price = 100.0
        elif len(pricing) == 1:
            price = pricing[0]
        else:
            price = rng.uniform(*pricing[:2])
        prices[product["asin"]] = price
    return prices


def _price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """goal.py: a bound drawn among the next four multiples of 10 above the price."""
    price_range = [p for p in PRICE_RANGE if p > price][:4]
    if len(price_range) >= 2:
        _, price_upper = sorted(rng.sample(price_range, 2))
        return price_upper, f", and price lower than {price_upper:.2f} dollars"
    return 1000000, ""


def _synthetic_goals(products, prices, rng: random.Random) -> list[dict[str, Any]]:
    """goal.py:get_synthetic_goals: one goal per option combination of each instructed product."""
    goals = []
    cnt_atts: dict[str, int] = defaultdict(int)
    for product in products:
        if product.get("instruction_text") is None:
            continue
        asin = product["asin"]
        attributes = product["instruction_attributes"]
        if not attributes:  # WebShop asserts here; a goal with no attribute cannot be scored
            continue
        price_upper, price_text = _price_bound(prices[asin], rng)
        instruction_text = product["instruction_text"]
        options = product["options"]
        option_names = sorted(options)
        for combination in itertools.product(*(options[name] for name in option_names)):
            goal_options = dict(zip(option_names, combination, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append(
                {
                    "asin": asin,
                    "category": product["category"],
                    "query": product["query"],
                    "name": product["Title"],  # goal.py sets name twice; the Title wins
                    "product_category": product["product_category"],
                    "instruction_text": f"{instruction_text}{option_text}{price_text}",
                    "attributes": attributes,
                    "price_upper": price_upper,
                    "goal_options": goal_options,
                }
            )
            for att in attributes:
                cnt_atts[att] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / cnt_atts[a] for a in goal["attributes"]) / len(
            goal["attributes"]
        )
    return goals


def _human_goals(products, prices, rng: random.Random) -> list[dict[str, Any]]:
    """goal.py:get_human_goals: one goal per human instruction with attributes."""
    goals = []
    for item in products:
        if "instructions" not in item:
            continue
        asin = item["asin"]
        for product in item["instructions"]:
            attributes = product["instruction_attributes"]
            if len(attributes) == 0:
                continue
            price_upper, price_text = _price_bound(prices[asin], rng)
            goals.append(
                {
                    "asin": asin,
                    "category": item["category"],
                    "query": item["query"],
                    "name": item["name"],
                    "product_category": item["product_category"],
                    "instruction_text": product["instruction"].strip(".") + price_text,
                    "attributes": attributes,
                    "price_upper": price_upper,
                    "goal_options": product["instruction_options"],
                    "weight": 1,
                }
            )
    return goals


def _shuffled(goals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """WebShop's ``random.seed(233); random.shuffle(goals)``, without touching global random."""
    goals = list(goals)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return goals


def _splits(n_goals: int) -> dict[str, np.ndarray]:
    return {
        name: np.arange(start, n_goals if end is None else min(end, n_goals), dtype=np.int64)
        if start < n_goals
        else np.zeros(0, dtype=np.int64)
        for name, (start, end) in SPLIT_BOUNDS.items()
    }


def search_text(product: dict[str, Any]) -> str:
    """The text WebShop indexes for a product (search_engine/convert_product_file_format.py).

    ``Title, Description, first bullet point, "name: v1, v2, and name2: ..."``, space-joined and
    lower-cased. (WebShop would fail on a product with no bullet point; we index "".)
    """
    option_text = ", and ".join(
        f"{name}: {', '.join(values)}" for name, values in product.get("options", {}).items()
    )
    bullets = product["BulletPoints"]
    return " ".join(
        [
            product["Title"] or "",
            product["Description"] or "",
            (bullets[0] if bullets else "") or "",
            option_text,
        ]
    ).lower()


@dataclass(eq=False)
class Catalogue:
    """A loaded WebShop catalogue: products, their fixed prices, goals and splits.

    One per data source per process (see :func:`load_catalogue`); envs hold a reference and
    never modify it.
    """

    products: list[dict[str, Any]]
    """WebShop's product dicts (engine.py:load_products), in file order"""
    product_by_asin: dict[str, dict[str, Any]]
    """asin (upper case, as in the files) -> product"""
    product_prices: dict[str, float]
    """asin -> the price the reward compares against (fixed draw, see the module docstring)"""
    goals: list[dict[str, Any]]
    """WebShop's goal dicts, in WebShop's shuffled order"""
    splits: dict[str, np.ndarray]
    """split name -> goal indices (int64): test 0-499, valid 500-1499, train the rest"""
    source: str
    """where it came from: the data folder, or ``synthetic(seed=..., n=...)``"""
    synthetic: bool = False
    goal_kind: str = "synthetic"
    """``"synthetic"`` (items_ins_v2's instructions x option combinations) or ``"human"``"""
    key: tuple = field(default=(), repr=False)
    """the cache key it was loaded under (envs pickle this instead of the catalogue)"""

    def __repr__(self) -> str:
        return (
            f"Catalogue({self.source!r}, {len(self.products)} products, {len(self.goals)} "
            f"{self.goal_kind} goals, splits "
            + ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
            + ")"
        )

    @cached_property
    def row_of_asin(self) -> dict[str, int]:
        """asin -> row in :attr:`products` (the search index's document order)."""
        return {p["asin"]: i for i, p in enumerate(self.products)}

    @cached_property
    def search_texts(self) -> list[str]:
        """:func:`search_text` of every product, in row order."""
        return [search_text(p) for p in self.products]

    @cached_property
    def fingerprint(self) -> str:
        """A digest of what the search index reads: names on-disk index caches."""
        h = hashlib.blake2b(digest_size=12)
        for p, text in zip(self.products, self.search_texts, strict=True):
            h.update(p["asin"].encode())
            h.update(b"\0")
            h.update(text.encode("utf-8", "surrogatepass"))
            h.update(b"\1")
        return h.hexdigest()

    @cached_property
    def titles(self) -> list[str]:
        """Every distinct product and goal title (what the reward takes nouns of), first-seen order."""
        return list(
            dict.fromkeys([p["name"] for p in self.products] + [g["name"] for g in self.goals])
        )

    @cached_property
    def titles_digest(self) -> str:
        """A digest of :attr:`titles`: names the on-disk title-noun table (see ``nouns.py``)."""
        return titles_digest(self.titles)

    @cached_property
    def charset(self) -> frozenset[str]:
        """Every character any page of this catalogue can show (for the observation space)."""
        chars: set[str] = set()
        for p in self.products:
            for key in ("Title", "Price", "Description", "category", "query", "product_category"):
                if isinstance(p.get(key), str):
                    chars.update(p[key])
            for a in p["Attributes"]:  # the Attributes page (show_attrs=True)
                chars.update(str(a))
            for b in p["BulletPoints"]:
                if isinstance(b, str):
                    chars.update(b)
            for name, values in p["options"].items():
                chars.update(name)
                for v in values:
                    chars.update(v)
            for r in p["Reviews"]:
                chars.update(str(r.get("title", "")))
                chars.update(str(r.get("score", "")))
                chars.update(str(r.get("body", "")))
            chars.update(str(p["Rating"]))
        for g in self.goals:
            chars.update(g["instruction_text"])
        return frozenset(chars)


_CACHE: dict[tuple, Catalogue] = {}
_CACHE_LOCK = threading.Lock()


def _file_id(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _reviews_by_asin(path: Path) -> dict[str, tuple[list, Any]]:
    """The commented-out review loading of engine.py: asin -> (reviews, average_rating)."""
    if not path.is_file():
        return {}
    return {r["asin"]: (r["reviews"], r["average_rating"]) for r in _read_json(path)}


def load_catalogue(
    data_dir: str | os.PathLike | None = None,
    *,
    catalogue: Literal["small", "full"] = "small",
    synthetic: bool = False,
    seed: int = DEFAULT_SEED,
    goals: Literal["auto", "synthetic", "human"] = "auto",
    num_products: int | None = None,
) -> Catalogue:
    """Load (once per process) a WebShop catalogue with its goals and fixed splits.

    Args:
        data_dir: folder holding WebShop's data files; default ``$WEBSHOP_DATA``. Ignored when
            ``synthetic=True``.
        catalogue: ``"small"`` (``items_shuffle_1000.json``) or ``"full"``
            (``items_shuffle.json``, streamed).
        synthetic: the project's generated catalogue (:mod:`.synthetic`) instead of real files;
            ``num_products`` sets its size (default 1000).
        seed: seed of the price draws (the same everywhere; WebShop's are unseeded). For the
            synthetic catalogue, also the generator's seed.
        goals: ``"synthetic"`` (WebShop's ``human_goals=False``: items_ins_v2 instructions
            times option combinations), ``"human"`` (``items_human_ins.json``), or ``"auto"``:
            human goals when that file is there, synthetic ones otherwise.
        num_products: keep the first N products of the file (WebShop's ``num_products``).

    Returns the process-wide :class:`Catalogue` for these arguments (the same object on every
    call). Raises :class:`DataNotFoundError` (a ``FileNotFoundError``) saying what to set when
    the files are missing.
    """
    if catalogue not in CATALOGUE_FILES:
        raise ValueError(f"catalogue={catalogue!r}: choose 'small' or 'full'")
    if goals not in ("auto", "synthetic", "human"):
        raise ValueError(f"goals={goals!r}: choose 'auto', 'synthetic' or 'human'")
    if synthetic:
        from agentgym.envs.webshop.synthetic import DEFAULT_NUM_PRODUCTS, GENERATOR_VERSION

        n = DEFAULT_NUM_PRODUCTS if num_products is None else int(num_products)
        key: tuple = ("synthetic", GENERATOR_VERSION, seed, n)
        with _CACHE_LOCK:
            if key in _CACHE:
                return _CACHE[key]
        from agentgym.envs.webshop.synthetic import generate_catalogue

        raw, attributes, reviews = generate_catalogue(n, seed=seed)
        loaded = _assemble(
            iter(raw),
            attributes,
            None,
            {r["asin"]: (r["reviews"], r["average_rating"]) for r in reviews},
            num_products=None,
            total=len(raw),
            seed=seed,
            source=f"synthetic(seed={seed}, n={n})",
            synthetic=True,
            key=key,
        )
        with _CACHE_LOCK:
            return _CACHE.setdefault(key, loaded)

    root = resolve_data_dir(data_dir)
    if root is None:
        raise DataNotFoundError(_no_data_message("$WEBSHOP_DATA (unset)", catalogue))
    product_file, attr_file = (root / name for name in CATALOGUE_FILES[catalogue])
    if not (product_file.is_file() and attr_file.is_file()):
        raise DataNotFoundError(_no_data_message(str(root), catalogue))
    human_file = root / HUMAN_GOALS_FILE
    use_human = goals == "human" or (goals == "auto" and human_file.is_file())
    if use_human and not human_file.is_file():
        raise DataNotFoundError(
            f"goals='human' needs {human_file} (WebShop's human instructions); pass "
            "goals='synthetic' to use the instructions in the attribute file"
        )
    reviews_file = root / REVIEWS_FILE
    key = (
        "files",
        _file_id(product_file),
        _file_id(attr_file),
        _file_id(human_file) if use_human else None,
        _file_id(reviews_file) if reviews_file.is_file() else None,
        seed,
        num_products,
    )
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    loaded = _assemble(
        iter_json_array(product_file),
        _read_json(attr_file),
        _read_json(human_file) if use_human else None,
        _reviews_by_asin(reviews_file),
        num_products=num_products,
        total=1000 if catalogue == "small" else None,
        seed=seed,
        source=str(root),
        synthetic=False,
        key=key,
    )
    with _CACHE_LOCK:
        return _CACHE.setdefault(key, loaded)


def _assemble(
    raw_products, attributes, human_attributes, reviews, *, num_products, total, seed, source,
    synthetic, key,
) -> Catalogue:  # fmt: skip
    products = _load_products(
        raw_products,
        attributes,
        human_attributes,
        reviews,
        num_products,
        total,
        "WebShop catalogue",
    )
    rng = random.Random(seed)  # prices first, then goal price bounds: WebShop's draw order
    prices = _product_prices(products, rng)
    if human_attributes is not None:
        goal_list, kind = _human_goals(products, prices, rng), "human"
    else:
        goal_list, kind = _synthetic_goals(products, prices, rng), "synthetic"
    goal_list = _shuffled(goal_list)
    return Catalogue(
        products=products,
        product_by_asin={p["asin"]: p for p in products},
        product_prices=prices,
        goals=goal_list,
        splits=_splits(len(goal_list)),
        source=source,
        synthetic=synthetic,
        goal_kind=kind,
        key=key,
    )
