"""A generated WebShop catalogue: the zero-download default, clearly labelled synthetic.

:func:`generate_catalogue` writes products, attribute/instruction records and reviews in
WebShop's own file formats (``items_shuffle.json``, ``items_ins_v2.json``, the ``reviews.json``
that WebShop's loader has switched off), so that :func:`agentgym.envs.webshop.data.load_catalogue`
reads them with the same code as the real files; :func:`write_synthetic_files` puts them on disk
for anyone who wants to point ``WEBSHOP_DATA`` (or WebShop itself) at them.

The shop has WebShop's five categories (beauty, electronics, garden, fashion, grocery), a few
product types each (WebShop's ``query``), Amazon-style category paths, titles built from a
brand, attributes and the product type, option groups (color, size, flavor, ...) with 2-4
values, prices (some ranged, ``$a$b`` as in the real file), bullet points, descriptions and
reviews. About 60% of products carry an instruction naming two or three of their attributes,
from which goals are made exactly as WebShop makes them (instruction x option combination x
price bound). ASINs are ``SYN`` + 7 digits, so a synthetic product is never mistaken for a real
one. Everything is drawn from ``random.Random(seed)``: the same seed gives the same shop.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from agentgym.io import atomic_write_json

__all__ = [
    "DEFAULT_NUM_PRODUCTS",
    "GENERATOR_VERSION",
    "generate_catalogue",
    "write_synthetic_files",
]

#: Bump when the generated shop changes, so cached indexes of an older shop are not reused.
GENERATOR_VERSION = 1
DEFAULT_NUM_PRODUCTS = 2000
INSTRUCTED_FRACTION = 0.6

# category -> product types: (query, category path, title noun, attribute pool, option groups)
_COLORS = ["black", "white", "red", "navy blue", "grey", "green", "pink", "beige", "brown"]
_SIZES = ["small", "medium", "large", "x-large", "xx-large"]
_SHOE_SIZES = ["7", "7.5", "8", "8.5", "9", "10", "11"]
_CATALOGUE: dict[str, list[tuple[str, str, str, list[str], dict[str, list[str]]]]] = {
    "beauty": [
        (
            "face wash",
            "Beauty & Personal Care › Skin Care › Face › Cleansers",
            "Face Wash",
            [
                "tea tree",
                "sensitive skin",
                "paraben free",
                "natural ingredients",
                "oil free",
                "cruelty free",
                "dermatologist tested",
            ],
            {"Size": ["4 fl oz", "8 fl oz", "16 fl oz"], "Scent": ["unscented", "citrus", "mint"]},
        ),
        (
            "hair extensions",
            "Beauty & Personal Care › Hair Care › Hair Extensions, Wigs & Accessories",
            "Clip in Hair Extensions",
            ["natural looking", "long lasting", "heat resistant", "human hair", "easy to use"],
            {"Color": ["black", "dark brown", "blonde", "auburn"], "Size": ["16 inch", "20 inch"]},
        ),
        (
            "deodorant",
            "Beauty & Personal Care › Personal Care › Deodorants & Antiperspirants",
            "Deodorant Stick",
            ["aluminum free", "sensitive skin", "long lasting", "natural ingredients", "vegan"],
            {"Scent": ["bright citrus", "lavender", "cedar"], "Size": ["2.6 ounce", "3 ounce"]},
        ),
    ],
    "electronics": [
        (
            "hdmi cables",
            "Electronics › Television & Video › Accessories › Cables › HDMI Cables",
            "HDMI Cable",
            ["high speed", "gold plated", "4k support", "braided", "ethernet"],
            {"Size": ["3 feet", "6 feet", "10 feet", "15 feet"]},
        ),
        (
            "bluetooth speakers",
            "Electronics › Portable Audio & Video › Portable Speakers & Docks",
            "Bluetooth Speaker",
            ["waterproof", "wireless bluetooth", "long battery life", "usb charging", "portable"],
            {"Color": ["black", "blue", "red", "grey"]},
        ),
        (
            "phone cases",
            "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
            "Phone Case",
            ["shockproof", "slim fit", "wireless charging", "scratch resistant", "tempered glass"],
            {
                "Color": ["clear", "black", "purple", "mint green"],
                "Style": ["iphone 13", "iphone 14", "galaxy s22"],
            },
        ),
    ],
    "garden": [
        (
            "sofa tables",
            "Home & Kitchen › Furniture › Living Room Furniture › Tables › Sofa & Console Tables",
            "Console Table",
            ["solid wood", "easy assembly", "storage space", "living room", "metal frame"],
            {"Color": ["walnut", "oak", "espresso", "white"]},
        ),
        (
            "window coverings",
            "Home & Kitchen › Home Décor › Window Treatments › Curtains & Drapes",
            "Blackout Curtains",
            ["thermal insulated", "machine washable", "easy install", "living room", "bedroom"],
            {"Color": ["grey", "navy blue", "beige"], "Size": ["52w x 63l", "52w x 84l"]},
        ),
        (
            "mattresses",
            "Home & Kitchen › Furniture › Bedroom Furniture › Mattresses & Box Springs",
            "Memory Foam Mattress",
            [
                "memory foam",
                "high density",
                "pressure relief",
                "certipur-us certified",
                "cooling gel",
            ],
            {"Size": ["twin", "full", "queen", "king"]},
        ),
    ],
    "fashion": [
        (
            "men's shorts",
            "Clothing, Shoes & Jewelry › Men › Clothing › Shorts",
            "Men's Cargo Shorts",
            ["quick drying", "elastic waist", "machine wash", "relaxed fit", "cotton spandex"],
            {"Color": _COLORS[:5], "Size": _SIZES},
        ),
        (
            "women's pumps",
            "Clothing, Shoes & Jewelry › Women › Shoes › Pumps",
            "Women's Pointed Toe Pumps",
            ["high heel", "rubber sole", "non slip", "faux leather", "comfortable fit"],
            {"Color": ["black", "nude", "red"], "Size": _SHOE_SIZES},
        ),
        (
            "men's t-shirts",
            "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
            "Men's Crew Neck T-Shirt",
            ["short sleeve", "cotton", "classic fit", "machine wash", "moisture wicking"],
            {"Color": _COLORS, "Size": _SIZES[:4]},
        ),
    ],
    "grocery": [
        (
            "green tea",
            "Grocery & Gourmet Food › Beverages › Tea › Green",
            "Organic Green Tea",
            ["gluten free", "non gmo", "usda organic", "caffeine free", "sugar free"],
            {"Flavor Name": ["jasmine", "mint", "lemon ginger"], "Size": ["20 count", "100 count"]},
        ),
        (
            "snack bars",
            "Grocery & Gourmet Food › Snacks & Sweets › Bars › Nutrition Bars",
            "Protein Snack Bars",
            ["high protein", "gluten free", "low sugar", "plant based", "keto friendly"],
            {"Flavor Name": ["chocolate", "peanut butter", "vanilla almond"]},
        ),
        (
            "coffee",
            "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee",
            "Whole Bean Coffee",
            ["medium roast", "fair trade", "single origin", "non gmo", "low acid"],
            {"Size": ["12 ounce", "2 pound"]},
        ),
    ],
}
_BRANDS = [
    "Lumora",
    "Brightfield",
    "Norvale",
    "Kestrel",
    "Auden & Co",
    "Pemberly",
    "Ostara",
    "Veloria",
    "Tamsin",
    "Quillon",
    "Harbor Lane",
    "Zephyra",
    "Calder",
    "Moxie Works",
]
_ADJECTIVES = ["Premium", "Classic", "Everyday", "Ultra", "Essential", "Deluxe", "Pro", "Lite"]
_PRICE_SPAN = {
    "beauty": (5, 60),
    "electronics": (8, 250),
    "garden": (20, 900),
    "fashion": (9, 80),
    "grocery": (4, 45),
}
_INSTRUCTION_OPENERS = ["i need", "i am looking for", "find me", "i want", "i would like"]
_REVIEW_TITLES = [
    "Great value",
    "Does the job",
    "Not what I expected",
    "Love it",
    "Good quality",
    "Would buy again",
]
_REVIEW_BODIES = ["Works exactly as described.", "Arrived quickly and well packed.",
                  "The quality could be better for the price.", "My family uses it every day.",
                  "Looks even better than the pictures."]  # fmt: skip


def _title(rng: random.Random, noun: str, attrs: list[str]) -> str:
    shown = " ".join(a.title() for a in attrs[:2])
    return f"{rng.choice(_BRANDS)} {rng.choice(_ADJECTIVES)} {shown} {noun}"


def _pricing(rng: random.Random, category: str) -> str:
    lo, hi = _PRICE_SPAN[category]
    roll = rng.random()
    if roll < 0.04:
        return ""  # WebShop prices these at $100.0
    low = round(rng.uniform(lo, hi), 2)
    if roll < 0.3:
        return f"${low:.2f}${low + round(rng.uniform(1, hi / 4), 2):.2f}"
    return f"${low:.2f}"


def generate_catalogue(
    num_products: int = DEFAULT_NUM_PRODUCTS, *, seed: int = 233
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Generate ``(products, attributes, reviews)`` in WebShop's file formats.

    ``products`` is the content of ``items_shuffle.json`` (raw scraped-product records),
    ``attributes`` that of ``items_ins_v2.json`` (asin -> ``attributes`` and, for instructed
    products, ``instruction`` and ``instruction_attributes``), ``reviews`` that of
    ``reviews.json`` (``[{"asin", "reviews": [{"title", "stars", "review"}], "average_rating"}]``).
    """
    rng = random.Random(seed)
    types = [(cat, t) for cat, ts in _CATALOGUE.items() for t in ts]
    products: list[dict[str, Any]] = []
    attributes: dict[str, dict[str, Any]] = {}
    reviews: list[dict[str, Any]] = []
    for i in range(num_products):
        category, (query, path, noun, pool, groups) = rng.choice(types)
        asin = f"SYN{i:07d}"
        attrs = rng.sample(pool, rng.randint(3, min(4, len(pool))))
        options: dict[str, list[dict[str, Any]]] = {}
        for name, values in groups.items():
            if rng.random() < 0.75:
                chosen = rng.sample(values, rng.randint(2, min(4, len(values))))
                options[name] = [{"value": v.title(), "image": None} for v in chosen]
        bullets = [f"{a.capitalize()}: made for {query} that last." for a in attrs]
        rng.shuffle(bullets)
        products.append(
            {
                "name": _title(rng, noun, attrs),
                "full_description": (
                    f"This {noun.lower()} is {', '.join(attrs[:-1])} and {attrs[-1]}. "
                    f"A synthetic product of the agentgym test shop."
                ),
                "pricing": _pricing(rng, category),
                "images": [f"synthetic://{asin}.jpg"],
                "product_category": path,
                "average_rating": "",
                "small_description": bullets,
                "customization_options": options or "",
                "asin": asin,
                "category": category,
                "query": query,
                "page": 1 + i // 100,
            }
        )
        record: dict[str, Any] = {"attributes": attrs}
        if rng.random() < INSTRUCTED_FRACTION:
            wanted = rng.sample(attrs, rng.randint(2, 3))
            record["instruction"] = (
                f"{rng.choice(_INSTRUCTION_OPENERS)} {query} with {', '.join(wanted)}"
            )
            record["instruction_attributes"] = wanted
        attributes[asin] = record
        if rng.random() < 0.5:
            stars = [rng.randint(1, 5) for _ in range(rng.randint(1, 3))]
            reviews.append(
                {
                    "asin": asin,
                    "reviews": [
                        {"title": rng.choice(_REVIEW_TITLES), "stars": s,
                         "review": rng.choice(_REVIEW_BODIES)}
                        for s in stars
                    ],
                    "average_rating": round(sum(stars) / len(stars), 1),
                }
            )  # fmt: skip
    return products, attributes, reviews


def write_synthetic_files(
    folder: str | os.PathLike, num_products: int = DEFAULT_NUM_PRODUCTS, *, seed: int = 233
) -> Path:
    """Write the generated shop as WebShop's data files into ``folder`` and return it.

    Files: ``items_shuffle.json`` and ``items_shuffle_1000.json`` (the same products, so both
    ``catalogue="full"`` and ``"small"`` read them), ``items_ins_v2.json`` /
    ``items_ins_v2_1000.json`` and ``reviews.json``. Each file is written atomically.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    products, attributes, reviews = generate_catalogue(num_products, seed=seed)
    for name in ("items_shuffle.json", "items_shuffle_1000.json"):
        atomic_write_json(folder / name, products)
    for name in ("items_ins_v2.json", "items_ins_v2_1000.json"):
        atomic_write_json(folder / name, attributes)
    atomic_write_json(folder / "reviews.json", reviews)
    return folder
