"""WebShop's purchase reward, as a pure function with WebShop's exact decisions.

:func:`webshop_reward` computes what WebShop's ``web_agent_site/engine/goal.py`` ``get_reward``
computes when the agent clicks *Buy Now*: the share of the goal's attributes, options and price
bound that the purchase meets, times a type factor saying whether it is the right kind of product
at all::

    total = (num_attr_matches + num_option_matches + r_price)
            / (len(goal["attributes"]) + len(goal["goal_options"]) + 1) * r_type

Because that number *is* the benchmark's score, WebShop's quirks are kept on purpose (each is
checked by a test):

- **Query match** compares the *catalogue* query of the purchased product with the goal's
  (``product["query"] == goal["query"]``), not whatever the agent typed into the search box.
- **Category match** needs at least two shared levels of the ``"a › b › c"`` category path,
  ignoring order and repeats.
- **Title score** is ``|set(nouns(product name)) & set(nouns(goal name))| / len(nouns(goal name))``:
  the denominator counts *repeated* nouns of the goal's title, so it can stay below 1 even when the
  titles are identical. With no goal nouns at all it is 0.2.
- **r_type** is 1.0, lowered to 0.5 when neither the query, the category nor a title score > 0.2
  matches; then 0.1 when the title score < 0.1, and 0.0 when it is exactly 0 (so a purchase sharing
  no title noun with the goal scores 0 even if everything else matches).
- **Attributes** match by a fuzzy token-set ratio > 85 against any of the product's
  ``Attributes``; failing that, by plain (case-sensitive on the goal side) substring search in the
  lower-cased ``Title``, the space-joined lower-cased ``BulletPoints`` and the lower-cased
  ``Description``.
- **Options**: the purchased values are colour-normalised (the first colour of
  :data:`COLOR_SET` contained in the value replaces it: ``"dark blue"`` becomes ``"blue"`` since
  ``blue`` precedes ``dark``). WebShop passes a synthetic goal's options as ``(name, value)`` pairs,
  so on the goal side the colour test is *tuple membership* (only a value exactly equal to a colour
  is normalised) and the fuzzy match sees the text of the pair: ``("size", "x-large")`` is compared
  as ``"size x large"``. Token-set ratio is 100 whenever one token set contains the other, so the
  purchased value ``"large"`` matches that goal option. A goal given as a list of strings (WebShop's
  human goals) is colour-normalised like the purchased values. Colour normalisation is a substring
  test, so it also fires inside other words: ``"rectangular"`` becomes ``"tan"`` and
  ``"fashion black"`` becomes ``"ash"``; buying the goal's own product with the goal's own options
  therefore scores below 1.0 on about 7% of WebShop's synthetic goals.
- **Price**: ``price <= goal["price_upper"]``, inclusive.

Fuzzy matching is :func:`token_set_ratio`, which reproduces ``thefuzz.fuzz.token_set_ratio``
(thefuzz >= 0.20, itself built on rapidfuzz) exactly: the same ``str()`` conversion, removal of
code points 128-255, rapidfuzz's ``default_process`` and rounding to an integer. Raw rapidfuzz
(no preprocessing, unrounded) decides differently near the threshold. WebShop's own pin,
thefuzz 0.19 without python-Levenshtein, scored with difflib's matcher instead of an edit
distance: on 170k attribute and option pairs drawn from WebShop's catalogue its match decisions
equal ours everywhere; on typo'd phrases built to sit near the threshold 2 in 20000 differ
(``"quick release"`` vs ``"quick relae"``: 92 here, 83 with difflib).

Title nouns come from a :class:`~agentgym.envs.webshop.nouns.NounExtractor`: spaCy's
``en_core_web_sm`` as WebShop uses it when that model is installed, else the project's
model-free :class:`~agentgym.envs.webshop.nouns.FallbackNouns` (see that module for how often the
two disagree).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from rapidfuzz.fuzz import token_set_ratio as _rf_token_set_ratio
from rapidfuzz.utils import default_process as _default_process

from agentgym.envs.webshop.nouns import NounExtractor, default_noun_extractor

__all__ = [
    "COLOR_SET",
    "FUZZY_MATCH_THRESHOLD",
    "attribute_reward",
    "normalize_color",
    "option_reward",
    "token_set_ratio",
    "type_reward",
    "webshop_reward",
]

#: A fuzzy score must be strictly above this to count as a match (WebShop: ``score > 85``).
FUZZY_MATCH_THRESHOLD = 85

#: WebShop's colour vocabulary, in WebShop's order: :func:`normalize_color` returns the *first*
#: entry contained in a value, so the order decides (``"dark"`` and ``"light"`` sit after most
#: hues, ``"navy blue"`` becomes ``"blue"``).
COLOR_SET: tuple[str, ...] = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure",
    "banana", "beige", "black", "blue", "blush", "bordeaux", "bronze",
    "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark",
    "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite",
    "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac",
    "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)  # fmt: skip

_COLOR_RANK = {color: rank for rank, color in enumerate(COLOR_SET)}

# thefuzz's force_ascii drops exactly the code points 128..255 (others survive into processing)
_LATIN1_DROP = dict.fromkeys(range(128, 256))
# attribute phrases, option values and category paths repeat across products, goals and steps
_CACHE_SIZE = 1 << 16


def _fuzz_process_uncached(value: Any) -> str:
    """thefuzz's ``full_process(value, force_ascii=True)``: str(), drop 128..255, default_process."""
    return _default_process(str(value).translate(_LATIN1_DROP))


_fuzz_process_cached = lru_cache(maxsize=_CACHE_SIZE)(_fuzz_process_uncached)


def _fuzz_process(value: Any) -> str:
    # only plain strings are cached: 1 == 1.0 == True would share a cache entry but not a str()
    if type(value) is str:
        return _fuzz_process_cached(value)
    return _fuzz_process_uncached(value)


@lru_cache(maxsize=_CACHE_SIZE)
def _category_levels(path: str) -> frozenset[str]:
    return frozenset(level.strip() for level in path.split("›"))


def token_set_ratio(a: Any, b: Any) -> int:
    """``thefuzz.fuzz.token_set_ratio(a, b)``: an integer 0..100, computed with rapidfuzz.

    Non-strings are compared through ``str()`` (so a tuple is scored by its repr's words), and
    ``None`` on either side scores 0, as in thefuzz.
    """
    if a is None or b is None:
        return 0
    return int(round(_rf_token_set_ratio(_fuzz_process(a), _fuzz_process(b))))


def _matches_any(processed_goal: str, processed_candidates: Iterable[str]) -> bool:
    """Whether any candidate's thefuzz token-set ratio with the goal text exceeds 85."""
    for candidate in processed_candidates:
        if round(_rf_token_set_ratio(candidate, processed_goal)) > FUZZY_MATCH_THRESHOLD:
            return True
    return False


def normalize_color(value: Any) -> Any:
    """WebShop's ``normalize_color``: the first :data:`COLOR_SET` entry ``in`` the value, else it.

    For a string ``in`` is a substring test; for a ``(name, value)`` tuple it is membership, so
    only an element exactly equal to a colour is normalised (WebShop's goal-side behaviour).
    """
    if isinstance(value, str):
        return _normalize_color_text(value)
    # membership test: the contained colour that comes first in COLOR_SET
    ranks = [_COLOR_RANK[v] for v in value if isinstance(v, str) and v in _COLOR_RANK]
    return COLOR_SET[min(ranks)] if ranks else value


@lru_cache(maxsize=_CACHE_SIZE)
def _normalize_color_text(value: str) -> str:
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def type_reward(
    product: Mapping[str, Any], goal: Mapping[str, Any], noun_extractor: NounExtractor
) -> dict[str, float]:
    """The type factor: whether the purchase is the right kind of product (goal.py's r_type).

    Returns ``r_type`` (0.0, 0.1, 0.5 or 1.0), ``query_match`` and ``category_match`` (1.0/0.0)
    and ``title_score`` (0..1), from the catalogue queries, the ``›`` category paths and the title
    nouns of ``product["name"]`` and ``goal["name"]``.
    """
    query_match = product["query"] == goal["query"]

    shared_levels = _category_levels(product["product_category"]) & _category_levels(
        goal["product_category"]
    )
    category_match = len(shared_levels) >= 2

    product_nouns = noun_extractor(product["name"])
    goal_nouns = noun_extractor(goal["name"])
    if len(goal_nouns) == 0:
        title_score = 0.2
    else:
        # denominator counts repeated goal nouns; numerator counts distinct shared ones
        title_score = len(set(product_nouns) & set(goal_nouns)) / len(goal_nouns)

    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": float(query_match),
        "category_match": float(category_match),
        "title_score": title_score,
    }


def attribute_reward(
    product: Mapping[str, Any], goal_attributes: Sequence[str]
) -> tuple[float, int]:
    """``(r_att, num_attr_matches)``: the share of goal attributes the product has.

    A goal attribute matches a product ``Attributes`` entry by token-set ratio > 85, or else by
    substring in the lower-cased title, bullet points (space-joined, as WebShop joins them) or
    description.
    """
    processed_attrs = [_fuzz_process(attr) for attr in product["Attributes"]]
    # the lower-cased texts are built only when some attribute misses the fuzzy match
    texts: tuple[str, str, str] | None = None
    num_matches = 0
    for goal_attr in goal_attributes:
        if _matches_any(_fuzz_process(goal_attr), processed_attrs):
            num_matches += 1
            continue
        if texts is None:
            texts = (
                product["Title"].lower(),
                " ".join(product["BulletPoints"]).lower(),
                product["Description"].lower(),
            )
        if any(goal_attr in text for text in texts):
            num_matches += 1
    return num_matches / len(goal_attributes), num_matches


def option_reward(
    purchased_values: Iterable[Any], goal_options: Iterable[Any]
) -> tuple[float | None, int]:
    """``(r_option, num_option_matches)``: the share of goal options the purchase hit.

    ``purchased_values`` are the chosen option values; ``goal_options`` are what WebShop passes:
    a dict goal's ``.items()`` pairs, or a list of strings. ``r_option`` is None without goal
    options (WebShop then leaves it out of the verbose info).
    """
    processed_purchased = [_fuzz_process(normalize_color(v)) for v in purchased_values]
    goal_list = list(goal_options)
    num_matches = sum(
        _matches_any(_fuzz_process(normalize_color(option)), processed_purchased)
        for option in goal_list
    )
    r_option = num_matches / len(goal_list) if goal_list else None
    return r_option, num_matches


def webshop_reward(
    product: Mapping[str, Any],
    goal: Mapping[str, Any],
    price: float,
    options: Mapping[str, str],
    *,
    noun_extractor: NounExtractor | None = None,
) -> tuple[float, dict[str, float]]:
    """WebShop's reward for buying ``product`` at ``price`` with ``options`` chosen, for ``goal``.

    Args:
        product: a product dict as WebShop's ``load_products`` builds it: ``name``, ``query``
            (lower-cased, stripped), ``product_category``, ``Title``, ``BulletPoints`` (list),
            ``Description``, ``Attributes`` (``["DUMMY_ATTR"]`` when the catalogue has none).
        goal: a WebShop goal dict: ``query``, ``name``, ``product_category``, ``attributes``
            (non-empty), ``goal_options`` (dict name -> value, or a list of values),
            ``price_upper`` (> 0; WebShop uses 1000000 for "no bound").
        price: the price the product sold for (WebShop's ``product_prices[asin]``).
        options: the options the agent clicked, option name -> value.
        noun_extractor: title-noun extractor; default :func:`default_noun_extractor` (spaCy's
            ``en_core_web_sm`` when installed, else :class:`FallbackNouns`).

    Returns:
        ``(total, info)``: ``total`` in [0, 1]; ``info`` holds goal.py's verbose parts
        ``r_type, r_att, w_att, query_match, category_match, title_score, r_price, w_price`` and,
        when the goal has options, ``r_option, w_option``; plus the counts ``num_attr_matches``
        and ``num_option_matches``. Booleans are given as 1.0 / 0.0; every value is a float.

    Raises:
        ValueError: for a goal WebShop itself could not score (no attributes, price_upper <= 0).
    """
    goal_attributes = goal["attributes"]
    goal_options = goal["goal_options"]
    price_upper = goal["price_upper"]
    if len(goal_attributes) == 0:
        raise ValueError(
            "goal has no attributes; WebShop's goals always name at least one "
            "(goals built from products without instruction_attributes must be skipped)"
        )
    if not price_upper > 0:
        raise ValueError(
            f"goal price_upper must be > 0 (got {price_upper!r}); WebShop uses 1000000 for no bound"
        )
    extractor = noun_extractor if noun_extractor is not None else default_noun_extractor()

    type_parts = type_reward(product, goal, extractor)
    r_price = price <= price_upper
    r_att, num_attr_matches = attribute_reward(product, goal_attributes)
    r_option, num_option_matches = option_reward(
        options.values(),
        goal_options.items() if isinstance(goal_options, dict) else goal_options,
    )

    denominator = len(goal_attributes) + len(goal_options) + 1
    # same operation order as goal.py, so the float is bit-identical
    total = (num_attr_matches + num_option_matches + r_price) / denominator
    total *= type_parts["r_type"]

    info: dict[str, float] = {
        "r_type": type_parts["r_type"],
        "r_att": r_att,
        "w_att": len(goal_attributes) / denominator,
        "query_match": type_parts["query_match"],
        "category_match": type_parts["category_match"],
        "title_score": type_parts["title_score"],
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal_options) / denominator
    info["r_price"] = float(r_price)
    info["w_price"] = 1 / denominator
    info["num_attr_matches"] = float(num_attr_matches)
    info["num_option_matches"] = float(num_option_matches)
    return total, info
