"""The WebShop catalog: products, goal instructions, and the reward for a purchase.

The catalog is synthetic but shaped like WebShop's: every product has a title, a category, a
product type, a description, bullet features, attributes (``"gluten free"``, ``"non slip"``),
options (``size``, ``color``, ``flavor`` ... each with a list of values) and a price. Every goal
is derived from one product: a few of its attributes, one value of each of its options and a
price bound above its price, phrased like WebShop's synthetic instructions::

    i need lightweight running shoes that are non slip, with color: black, and size: 9,
    and price lower than 60.00 dollars

``generate_catalog`` is deterministic (one seeded ``numpy.random.Generator``); the bundled file
is its output, written by ``scripts/gen_webshop_catalog.py``. The goal list is shuffled once at
generation time, so the seed -> goal split below can take goals in order.

Reward of buying ``product`` with ``selected`` options for ``goal`` (WebShop's formula, with our
own product-type rule)::

    r_type  = 1.0 if product.product_type == goal.product_type
              0.5 if only the category matches
              0.1 otherwise
    matched = |goal.attributes & product.attributes|
            + #{name: goal.options[name] == selected.get(name)}
            + (1 if product.price < goal.price_upper else 0)
    reward  = r_type * matched / (len(goal.attributes) + len(goal.options) + 1)

so reward is 1 exactly when a product of the right type has every wanted attribute, is bought
with every wanted option selected and costs less than the bound.
"""

from __future__ import annotations

import gzip
import io
import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

CATALOG_FILE = "webshop_catalog.json.gz"
CATALOG_VERSION = 1
DEFAULT_SEED = 20250917
DEFAULT_PRODUCTS = 1500
GOALS_PER_PRODUCT = 2


@dataclass(frozen=True)
class Product:
    """One item for sale. ``options`` maps an option name to its values, in display order."""

    asin: str
    title: str
    category: str
    product_type: str
    description: str
    features: list[str]
    attributes: list[str]
    options: dict[str, list[str]]
    price: float
    rating: float


@dataclass(frozen=True)
class Goal:
    """A shopping instruction and what a perfect purchase must satisfy."""

    instruction: str
    asin: str
    category: str
    product_type: str
    attributes: list[str]
    options: dict[str, str]
    price_upper: float


@dataclass(frozen=True)
class Score:
    """A purchase's reward and its parts (for the done page and for tests)."""

    reward: float
    r_type: float
    matched_attributes: int
    matched_options: int
    price_ok: bool
    total: int


@dataclass
class Catalog:
    """Products and goals, with an asin -> index map."""

    products: list[Product]
    goals: list[Goal]
    by_asin: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_asin = {p.asin: i for i, p in enumerate(self.products)}

    def product(self, asin: str) -> Product:
        return self.products[self.by_asin[asin]]


def score(goal: Goal, product: Product, selected: dict[str, str]) -> Score:
    """The reward of buying ``product`` with ``selected`` options for ``goal`` (module doc)."""
    if product.product_type == goal.product_type:
        r_type = 1.0
    elif product.category == goal.category:
        r_type = 0.5
    else:
        r_type = 0.1
    attrs = sum(1 for a in goal.attributes if a in product.attributes)
    opts = sum(1 for name, value in goal.options.items() if selected.get(name) == value)
    price_ok = product.price < goal.price_upper
    total = len(goal.attributes) + len(goal.options) + 1
    reward = r_type * (attrs + opts + int(price_ok)) / total
    return Score(reward, r_type, attrs, opts, price_ok, total)


# --------------------------------------------------------------------------- vocabulary
#: category -> (attributes, brands, {product type: (price low, price high, {option: values})}).
#: The vocabulary is data (turnpool/data/webshop_vocab.json): option values come from named
#: pools, unique across the options one product type uses, so a click on a value identifies its
#: option without ambiguity.
Vocab = dict[str, tuple[list[str], list[str], dict[str, tuple[float, float, dict[str, list[str]]]]]]
VOCAB_FILE = "webshop_vocab.json"


def _load_vocab() -> Vocab:
    path = Path(__file__).resolve().parent.parent / "data" / VOCAB_FILE
    raw = json.loads(path.read_text(encoding="utf-8"))
    pools: dict[str, list[str]] = raw["pools"]
    return {
        category: (
            list(entry["attributes"]),
            list(entry["brands"]),
            {name: (p["price"][0], p["price"][1],
                    {option: pools[pool] for option, pool in p["options"].items()})
             for name, p in entry["products"].items()},
        )
        for category, entry in raw["categories"].items()
    }


_VOCAB: Vocab = _load_vocab()

_DESCRIPTION_OPENERS = [
    "Meet the {title}, built for everyday use.",
    "The {title} is designed to make daily life easier.",
    "Upgrade your routine with the {title}.",
    "Our {title} combines quality materials with thoughtful design.",
]
_DESCRIPTION_MIDDLES = [
    "It is {a} and {b}, so you can count on it day after day.",
    "Customers choose it because it is {a} and {b}.",
    "Thanks to a {a} build and a {b} finish, it stands out in its class.",
]
_DESCRIPTION_CLOSERS = [
    "Backed by a 30 day satisfaction guarantee.",
    "A great gift for friends and family.",
    "Order today and see the difference.",
    "Ships in recyclable packaging.",
]
_FEATURE_TAILS = [
    "tested to meet our quality standards",
    "a customer favorite for this reason",
    "designed with real users in mind",
    "made to last through daily use",
]
_GOAL_OPENERS = ["i need", "i am looking for", "i want", "find me", "i would like"]
_ASIN_CHARS = np.array(list("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"))


def _choose(rng: np.random.Generator, items: list[str], k: int) -> list[str]:
    """``k`` distinct items in their original order (stable across numpy versions)."""
    idx = sorted(int(i) for i in rng.choice(len(items), size=k, replace=False))
    return [items[i] for i in idx]


def _pick(rng: np.random.Generator, items: list[str]) -> str:
    return items[int(rng.integers(len(items)))]


def _price_bound(price: float, rng: np.random.Generator) -> float:
    """A round bound above ``price``, like WebShop's "price lower than 40.00 dollars"."""
    step = 10.0 if price >= 20 else 5.0
    raw = price * float(rng.uniform(1.02, 1.6))
    return float(math.ceil(raw / step) * step)


def _make_product(rng: np.random.Generator, asin: str, category: str) -> Product:
    attributes_pool, brands, types = _VOCAB[category]
    type_names = list(types)
    product_type = _pick(rng, type_names)
    low, high, option_pools = types[product_type]
    attributes = _choose(rng, attributes_pool, int(rng.integers(2, 5)))
    options: dict[str, list[str]] = {}
    for name, pool in option_pools.items():
        k = int(rng.integers(min(3, len(pool)), len(pool) + 1))
        options[name] = _choose(rng, pool, k)
    brand = _pick(rng, brands)
    # Titles name the first two or three attributes, as real listings front-load selling points.
    shown = attributes[: int(rng.integers(2, len(attributes) + 1))]
    title = f"{brand} {' '.join(shown)} {product_type}".title().replace("'S ", "'s ")
    price = float(int(rng.uniform(low, high))) + float(_pick(rng, ["0.99", "0.49", "0.95"]))
    rating = round(float(rng.uniform(3.0, 5.0)) * 2) / 2
    a, b = (attributes + attributes)[:2]
    description = " ".join([
        _pick(rng, _DESCRIPTION_OPENERS).format(title=title),
        _pick(rng, _DESCRIPTION_MIDDLES).format(a=a, b=b),
        _pick(rng, _DESCRIPTION_CLOSERS),
    ])
    features = [f"{attr.upper()}: {_pick(rng, _FEATURE_TAILS)}" for attr in attributes]
    return Product(asin, title, category, product_type, description, features, attributes,
                   options, round(price, 2), rating)


def _make_goal(rng: np.random.Generator, product: Product) -> Goal:
    # Wanted attributes come from those the title names, as a shopper reading listings would.
    shown = [a for a in product.attributes if a in product.title.lower()]
    k = int(rng.integers(1, min(3, len(shown)) + 1))
    attrs = _choose(rng, shown, k)
    options = {name: _pick(rng, values) for name, values in product.options.items()}
    bound = _price_bound(product.price, rng)
    head = f"{_pick(rng, _GOAL_OPENERS)} {product.product_type}"
    if len(attrs) == 1:
        body = f"that is {attrs[0]}"
    else:
        body = f"that is {', '.join(attrs[:-1])} and {attrs[-1]}"
    parts = [f"{head} {body}"]
    parts += [f"{name}: {value}" for name, value in options.items()]
    parts.append(f"price lower than {bound:.2f} dollars")
    instruction = parts[0] + "".join(
        (", with " if i == 1 else ", and ") + p for i, p in enumerate(parts[1:], start=1))
    return Goal(instruction, product.asin, product.category, product.product_type, attrs,
                options, bound)


def generate_catalog(seed: int = DEFAULT_SEED, n_products: int = DEFAULT_PRODUCTS,
                     goals_per_product: int = GOALS_PER_PRODUCT) -> Catalog:
    """Build the catalog deterministically from ``seed`` (one numpy Generator, no globals)."""
    rng = np.random.default_rng(seed)
    categories = list(_VOCAB)
    products: list[Product] = []
    seen: set[str] = set()
    for i in range(n_products):
        while True:
            asin = "B0" + "".join(rng.choice(_ASIN_CHARS, size=8).tolist())
            if asin not in seen:
                seen.add(asin)
                break
        products.append(_make_product(rng, asin, categories[i % len(categories)]))
    goals = [_make_goal(rng, p) for p in products for _ in range(goals_per_product)]
    order = rng.permutation(len(goals))
    return Catalog(products, [goals[int(i)] for i in order])


# --------------------------------------------------------------------------- files
def to_json(catalog: Catalog) -> dict[str, Any]:
    return {"version": CATALOG_VERSION,
            "products": [asdict(p) for p in catalog.products],
            "goals": [asdict(g) for g in catalog.goals]}


def from_json(data: dict[str, Any]) -> Catalog:
    if data.get("version") != CATALOG_VERSION:
        raise ValueError(f"unsupported webshop catalog version {data.get('version')!r}")
    return Catalog([Product(**p) for p in data["products"]], [Goal(**g) for g in data["goals"]])


def dump_gzip(catalog: Catalog, path: Path) -> None:
    """Write byte-identical output for identical catalogs (gzip mtime pinned to 0)."""
    raw = json.dumps(to_json(catalog), separators=(",", ":"), sort_keys=True).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(raw)
    path.write_bytes(buf.getvalue())


def bundled_path() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / CATALOG_FILE


@lru_cache(maxsize=4)
def load_catalog(path: str | None = None) -> Catalog:
    """Load a catalog file (``.json`` or ``.json.gz``); the bundled one by default. Cached."""
    blob = Path(path or bundled_path()).read_bytes()
    if blob[:2] == b"\x1f\x8b":
        blob = gzip.decompress(blob)
    return from_json(json.loads(blob))
