"""WebShop's pages as its text env shows them, rendered straight to text.

WebShop renders each page from a Jinja template (``web_agent_site/templates/*.html``) and its text
env turns the HTML into the observation with BeautifulSoup (``web_agent_text_env.py``,
``observation_mode="text"``)::

    texts = BeautifulSoup(html, "html.parser").findAll(text=True)
    " [SEP] ".join(t.strip() for t in filter(tag_visible, texts) if t != "\\n")

We skip the HTML and produce the same string from the same fields. The rules that make it
byte-identical, read off the templates and BeautifulSoup's ``html.parser`` tree builder:

- each template text node is one piece; Jinja's escaping and the parser's unescaping cancel, so
  a field's text comes back unchanged;
- a node of only ASCII whitespace becomes ``"\\n"`` if it holds a newline (then it is dropped) and
  ``" "`` otherwise (then it becomes an empty piece: ``"a [SEP]  [SEP] b"``); a field that
  renders as nothing makes no node at all (:func:`_piece`);
- Jinja renders ``None`` as ``"None"`` and a missing attribute as nothing;
- comments, ``<head>`` and ``<script>`` text are invisible, so the results page's commented-out
  category lines and the item page's script never show.

:func:`clickables` lists what ``get_available_actions`` finds on each page (buttons, product
links, option radios, in page order), which decides which ``click[...]`` actions WebShop accepts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BACK_TO_SEARCH",
    "BUY_NOW",
    "NEXT_PAGE",
    "PREV_PAGE",
    "PRODUCT_WINDOW",
    "SEP",
    "SUB_PAGES",
    "done_page",
    "item_page",
    "results_page",
    "search_page",
    "sub_page",
]

SEP = " [SEP] "
#: results per page (engine.py's PRODUCT_WINDOW)
PRODUCT_WINDOW = 10
# the lower-cased button texts the text env matches click[...] against
BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
SEARCH_BUTTON = "search"
#: sub-page button (lower-cased) -> its title (engine.py's ACTION_TO_TEMPLATE keys)
SUB_PAGES: dict[str, str] = {
    "description": "Description",
    "features": "Features",
    "reviews": "Reviews",
    "attributes": "Attributes",
}

_ASCII_SPACE = " \t\n\r\x0c"


def _piece(text: str) -> str | None:
    """The observation piece of one HTML text node (None: the node is dropped)."""
    if not text:
        return None  # Jinja rendered nothing: no text node
    if not text.strip(_ASCII_SPACE):
        # BeautifulSoup collapses whitespace-only strings to "\n" or " "; the env drops "\n"
        return None if "\n" in text else ""
    return text.strip()


def _jinja(value: Any) -> str:
    """``{{ value }}`` in a template: ``str()``, so None shows as "None"."""
    return value if isinstance(value, str) else str(value)


def _join(nodes: Sequence[str]) -> str:
    return SEP.join(p for p in map(_piece, nodes) if p is not None)


def _instruction_header(instruction: str) -> list[str]:
    # <h4>Instruction:<br>{{ instruction_text }}</h4> on every page but the search page
    return ["Instruction:", _jinja(instruction), "Back to Search"]


def search_page(instruction: str) -> str:
    """The start page: ``WebShop [SEP] Instruction: [SEP] <goal> [SEP] Search``."""
    return _join(["WebShop", "Instruction: ", _jinja(instruction), "Search"])


def results_page(
    instruction: str, products: Sequence[Mapping[str, Any]], page: int, total: int
) -> str:
    """A results page: header, ``Page p (Total results: n)``, Prev/Next, then asin/title/price."""
    nodes = _instruction_header(instruction)
    nodes.append(f"Page {page} (Total results: {total})")
    if page > 1:
        nodes.append("< Prev")
    nodes.append("Next >")
    for p in products:
        nodes += [_jinja(p["asin"]), _jinja(p["Title"]), _jinja(p["Price"])]
    return _join(nodes)


def item_page(instruction: str, product: Mapping[str, Any], *, show_attrs: bool = False) -> str:
    """A product page: header, ``< Prev``, option groups, title, price, rating, buttons."""
    nodes = _instruction_header(instruction)
    nodes.append("< Prev")
    for name, values in product["options"].items():
        nodes.append(_jinja(name))
        nodes += [_jinja(v) for v in values]
    nodes += [
        _jinja(product["Title"]),
        f"Price: {_jinja(product['Price'])}",
        f"Rating: {_jinja(product['Rating'])}",
        "Description",
        "Features",
        "Reviews",
    ]
    if show_attrs:
        nodes.append("Attributes")
    nodes.append("Buy Now")
    return _join(nodes)


def sub_page(instruction: str, product: Mapping[str, Any], name: str) -> str:
    """The Description / Features / Reviews / Attributes page of a product (``name`` lower-case)."""
    nodes = _instruction_header(instruction)
    nodes.append("< Prev")
    if name == "description":
        nodes.append(_jinja(product["Description"]))
    elif name == "features":
        nodes += [" " + _jinja(b) for b in product["BulletPoints"]]
    elif name == "reviews":
        for r in product["Reviews"]:
            nodes += [
                f'"{_jinja(r.get("title", ""))}"',
                _jinja(r.get("score", "")),
                _jinja(r.get("body", "")),
            ]
    elif name == "attributes":
        nodes += [" " + _jinja(a) for a in product["Attributes"]]
        nodes += [
            _jinja(product["category"]),
            _jinja(product["query"]),
            _jinja(product["product_category"]),
        ]
    else:
        raise ValueError(f"no sub-page {name!r}; WebShop has {sorted(SUB_PAGES)}")
    return _join(nodes)


def _tojson(value: Any) -> str:
    """Flask's ``tojson`` filter: sorted keys, ASCII, and <, >, &, ' escaped for HTML."""
    text = json.dumps(value, sort_keys=True)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("'", "\\u0027")
    )


def done_page(reward: float, asin: str, options: Mapping[str, str]) -> str:
    """The page after Buy Now, as the text env renders it (its hidden goal fields are empty)."""
    # done_page.html with the text env's arguments: no mturk code, attrs, goal or reward info
    # (Jinja shows them as "None"); the goal's fields are attributes of None, so empty.
    nodes = ["Thank you for shopping with us!", "Your code: ", "None"]
    nodes += [" (Paste it in your MTurk interface.)", "Purchased", "asin", _jinja(asin)]
    nodes += ["options", _tojson(dict(options))]
    for label in ("attrs", "category", "query", "product category"):
        nodes += [label, "None"]
    nodes.append("Target")
    nodes += ["asin", "options", "attrs", "price upper", "instuction text"]
    nodes += ["category", "product category", "query", "Goal ", "None", "Reward"]
    nodes += ["Your score (min 0.0, max 1.0)", _jinja(reward), "Reward Details ", "None"]
    return _join(nodes)


def results_clickables(products: Sequence[Mapping[str, Any]], page: int) -> list[str]:
    """Clickables of a results page: buttons in page order, then product links (lower-cased)."""
    buttons = [BACK_TO_SEARCH, PREV_PAGE, NEXT_PAGE] if page > 1 else [BACK_TO_SEARCH, NEXT_PAGE]
    return list(dict.fromkeys(buttons + [p["asin"].lower() for p in products]))


def item_clickables(
    product: Mapping[str, Any], *, show_attrs: bool = False
) -> tuple[list[str], dict[str, str]]:
    """Clickables of an item page and, for option values, the option group each one sets.

    WebShop keys its clickables by text in a dict, so a value shared by two groups (or equal to
    a button's text) is one clickable, bound to the last radio with that value.
    """
    buttons = [BACK_TO_SEARCH, PREV_PAGE, "description", "features", "reviews"]
    if show_attrs:
        buttons.append("attributes")
    buttons.append(BUY_NOW)
    names = dict.fromkeys(buttons)
    option_group: dict[str, str] = {}
    for name, values in product["options"].items():
        for value in values:
            names[value] = None
            option_group[value] = name
    return list(names), option_group
