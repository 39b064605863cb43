"""WebShop's own data: products, instruction attributes, goals and prices, as RAGEN loads them.

RAGEN's WebShop env runs ``webshop-minimal`` on its "small" set: 1,000 real products and
``items_ins_v2_1000.json`` (per ASIN: the synthetic instruction and the attributes a goal
asks for). This module reads those files in WebShop's formats and rebuilds, from the same
rules, what WebShop's ``SimServer`` holds:

* products: WebShop's product list (``items_shuffle*.json``: a JSON array of raw records with
  ``pricing`` as text such as ``"$19.99 - $27.99"`` and ``customization_options``), or its
  search documents (``documents.jsonl``: one ``{"id", "contents", "product"}`` per line, the
  product already processed). Records with an ASIN of ``nan`` or longer than 10 characters and
  repeated ASINs are skipped; ``num_products`` keeps the first N records, as WebShop does.
  Option values are lowercased with ``/`` shown as `` | ``.
* prices: a single price as listed; a range draws ``uniform(low, high)``.
* synthetic goals: for every product with an instruction, every combination of its option
  values (options in name order), the instruction followed by ``" with name: value, and ..."``
  and ``", and price lower than X.00 dollars"`` where X is the larger of two draws from the
  first four multiples of 10 above the price (no bound when fewer than two exist).
  Human goals (``items_human_ins.json``) are one per written instruction that has attributes.
* order: the goal list shuffled by Python's generator seeded with 233 (here a local
  ``random.Random(233)``, which draws the same).

Prices and price bounds are random draws in WebShop, made from Python's process-global
generator, which RAGEN never seeds before building the server. turnpool makes the same draws,
in the same order, from a local ``random.Random(draw_seed)`` (0 by default): the goals equal
RAGEN's when RAGEN's process had seeded its global generator with ``draw_seed`` just before
building its WebShop server (the reference fixtures were recorded that way).

The small set ships inside the package (``turnpool/data/webshop_small/``), so nothing needs
to be downloaded; other data sets load from user paths with `load_webshop`.
"""

from __future__ import annotations

import gzip
import itertools
import json
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
GOAL_SHUFFLE_SEED = 233
DEFAULT_DRAW_SEED = 0
#: No price bound: WebShop's value when fewer than two round prices lie above the price.
NO_PRICE_BOUND = 1_000_000

_DATA = Path(__file__).resolve().parent.parent / "data" / "webshop_small"
SMALL_PRODUCTS = _DATA / "products_1000.jsonl.gz"
SMALL_ATTRIBUTES = _DATA / "items_ins_v2_1000.json.gz"
SMALL_TITLE_NOUNS = _DATA / "title_nouns.json.gz"


@dataclass(frozen=True)
class WsProduct:
    """A WebShop product after WebShop's own processing (``load_products``)."""

    asin: str
    title: str
    query: str
    category: str
    product_category: str
    description: str
    bullets: list[str]
    pricing: list[float]
    price_tag: str
    options: dict[str, list[str]]
    attributes: list[str]
    rating: str = "N.A."
    image: str = ""
    instruction: str | None = None
    instruction_attributes: list[str] | None = None
    #: The text the search index holds (``documents.jsonl``'s ``contents``).
    contents: str = ""


@dataclass(frozen=True)
class WsGoal:
    """One goal as WebShop builds it (``name`` is the product's title)."""

    asin: str
    instruction_text: str
    attributes: list[str]
    goal_options: dict[str, str] | list[str]
    price_upper: float
    name: str
    query: str
    category: str
    product_category: str


@dataclass
class WebShopData:
    """Products, their drawn prices and the shuffled goal list."""

    products: list[WsProduct]
    prices: dict[str, float]
    goals: list[WsGoal]
    by_asin: dict[str, WsProduct] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_asin = {p.asin: p for p in self.products}


# ---------------------------------------------------------------------------- reading files
def _read_bytes(path: str | Path) -> bytes:
    blob = Path(path).read_bytes()
    return gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob


def read_json(path: str | Path) -> Any:
    """A ``.json`` file, gzipped or not."""
    return json.loads(_read_bytes(path))


def read_product_records(path: str | Path) -> list[dict[str, Any]]:
    """Product records from a WebShop product list (JSON array) or ``documents.jsonl``."""
    text = _read_bytes(path).decode("utf-8")
    head = text.lstrip()[:1]
    if head == "[":
        records = json.loads(text)
    else:
        records = []
        for line in text.splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if "product" not in row:
                raise ValueError(f"{path}: a documents.jsonl line needs a 'product' field "
                                 "(WebShop's search documents carry the full product)")
            records.append({**row["product"], "_contents": row.get("contents")})
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{path}: expected a list of WebShop product records")
    return records


_NOT_PRICE = re.compile(r"[^\d.]")


def _pricing(raw: Any) -> tuple[list[float], str]:
    if isinstance(raw, list) and raw:  # an already processed record (documents.jsonl)
        pricing = [float(p) for p in raw][:2]
    elif isinstance(raw, str) and raw:
        pricing = [float(Decimal(_NOT_PRICE.sub("", part))) for part in raw.split("$")[1:]]
        pricing = pricing[:2] if len(pricing) > 1 else pricing
    else:
        pricing = []
    if not pricing:
        return [100.0], "$100.0"
    if len(pricing) == 1:
        return pricing, f"${pricing[0]}"
    return pricing, f"${pricing[0]} to ${pricing[1]}"


def _options(record: dict[str, Any]) -> dict[str, list[str]]:
    custom = record.get("customization_options")
    if not isinstance(custom, dict):
        processed = record.get("options")
        return ({str(k): [str(v) for v in vs] for k, vs in processed.items()}
                if isinstance(processed, dict) and not custom else {})
    options: dict[str, list[str]] = {}
    for name, contents in custom.items():
        if contents is None:
            continue
        options[name.lower()] = [str(c["value"]).strip().replace("/", " | ").lower()
                                 for c in contents]
    return options


def process_products(records: Iterable[dict[str, Any]], attributes: dict[str, Any],
                     num_products: int | None = None) -> list[WsProduct]:
    """WebShop's ``load_products`` on raw or processed records (module docstring)."""
    records = list(records)
    if num_products is not None:
        records = records[:num_products]
    seen: set[str] = set()
    out: list[WsProduct] = []
    for p in records:
        asin = str(p["asin"])
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing, tag = _pricing(p.get("pricing"))
        bullets = p.get("small_description", "")
        info = attributes.get(asin, {})
        images = p.get("images") or [""]
        options = _options(p)
        bullet_list = [str(b) for b in bullets] if isinstance(bullets, list) else [str(bullets)]
        contents = p.get("_contents")
        if not isinstance(contents, str):
            contents = _contents(str(p["name"]), str(p.get("full_description", "")),
                                 bullet_list, options)
        out.append(WsProduct(
            asin=asin, title=str(p["name"]), query=str(p["query"]).lower().strip(),
            category=str(p["category"]), product_category=str(p["product_category"]),
            description=str(p.get("full_description", "")),
            bullets=bullet_list, pricing=pricing, price_tag=tag, options=options,
            attributes=list(info["attributes"]) if "attributes" in info else ["DUMMY_ATTR"],
            image=str(images[0]) if isinstance(images, list) else "",
            instruction=info.get("instruction"),
            instruction_attributes=info.get("instruction_attributes"),
            contents=contents,
        ))
    return out


def _contents(title: str, description: str, bullets: list[str],
              options: dict[str, list[str]]) -> str:
    """What WebShop indexes when a product list has no search documents: title, description,
    first bullet and ``name: v1, v2, and name: ...``, lowercased."""
    option_text = ", and ".join(f"{k}: {', '.join(v)}" for k, v in options.items())
    first = bullets[0] if bullets else ""
    return " ".join([title, description, first, option_text]).lower()


def draw_prices(products: list[WsProduct], rng: random.Random) -> dict[str, float]:
    """WebShop's ``generate_product_prices``: one ``uniform`` draw per price range."""
    prices: dict[str, float] = {}
    for p in products:
        prices[p.asin] = p.pricing[0] if len(p.pricing) == 1 else rng.uniform(*p.pricing[:2])
    return prices


def _price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return NO_PRICE_BOUND, ""
    _, upper = sorted(rng.sample(above, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def synthetic_goals(products: list[WsProduct], prices: dict[str, float],
                    rng: random.Random) -> list[WsGoal]:
    """WebShop's ``get_synthetic_goals`` (before the shuffle)."""
    goals: list[WsGoal] = []
    for p in products:
        if p.instruction is None:
            continue
        attrs = list(p.instruction_attributes or [])
        if not attrs:
            raise ValueError(f"product {p.asin} has an instruction but no instruction_attributes")
        upper, price_text = _price_bound(prices[p.asin], rng)
        names = sorted(p.options)
        for combo in itertools.product(*(p.options[n] for n in names)):
            wanted = dict(zip(names, combo))
            text = ", and ".join(f"{k}: {v}" for k, v in wanted.items())
            text = f" with {text}" if text else ""
            goals.append(WsGoal(p.asin, f"{p.instruction}{text}{price_text}", attrs, wanted,
                                upper, p.title, p.query, p.category, p.product_category))
    return goals


def human_goals(products: list[WsProduct], prices: dict[str, float],
                human: dict[str, list[dict[str, Any]]], rng: random.Random) -> list[WsGoal]:
    """WebShop's ``get_human_goals``: one goal per written instruction with attributes."""
    goals: list[WsGoal] = []
    for p in products:
        for written in human.get(p.asin, []):
            attrs = list(written.get("instruction_attributes") or [])
            if not attrs:
                continue
            upper, price_text = _price_bound(prices[p.asin], rng)
            goals.append(WsGoal(
                p.asin, str(written["instruction"]).strip(".") + price_text, attrs,
                list(written.get("instruction_options") or []), upper, p.title, p.query,
                p.category, p.product_category))
    return goals


def build(products: list[WsProduct], draw_seed: int = DEFAULT_DRAW_SEED,
          human: dict[str, list[dict[str, Any]]] | None = None) -> WebShopData:
    """Prices, goals and their shuffle, drawn as WebShop's ``SimServer`` draws them."""
    rng = random.Random(draw_seed)
    prices = draw_prices(products, rng)
    goals = (human_goals(products, prices, human, rng) if human is not None
             else synthetic_goals(products, prices, rng))
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return WebShopData(products, prices, goals)


@lru_cache(maxsize=4)
def load_webshop(products: str | None = None, attributes: str | None = None,
                 human_instructions: str | None = None, num_products: int | None = None,
                 draw_seed: int = DEFAULT_DRAW_SEED) -> WebShopData:
    """Load a WebShop data set; the bundled small set (RAGEN's default) when no path is given.

    ``products``: a product list (``items_shuffle*.json``) or ``documents.jsonl`` (gzipped or
    not); ``attributes``: ``items_ins_v2*.json``; ``human_instructions``:
    ``items_human_ins.json`` to use WebShop's human goals instead of the synthetic ones.
    Cached per arguments.
    """
    records = read_product_records(products or SMALL_PRODUCTS)
    attrs = read_json(attributes or SMALL_ATTRIBUTES)
    human = read_json(human_instructions) if human_instructions else None
    return build(process_products(records, attrs, num_products), draw_seed, human)


def iter_goal_rows(data: WebShopData) -> Iterator[dict[str, Any]]:
    """Goals as plain dicts (for fixtures and tools)."""
    for g in data.goals:
        yield {"asin": g.asin, "instruction_text": g.instruction_text,
               "attributes": g.attributes, "goal_options": g.goal_options,
               "price_upper": g.price_upper}


@lru_cache(maxsize=8)
def _permutation(n_goals: int, seed: int = 42) -> tuple[int, ...]:
    order = list(range(n_goals))
    random.Random(seed).shuffle(order)
    return tuple(order)


def goal_for_seed(seed: int, split: str, n_goals: int) -> int:
    """RAGEN's seed -> goal index: test ``seed % 500``, val ``seed % 1000 + 500``, train
    ``seed % (n - 1500) + 1500``, then a fixed permutation (``random.Random(42).shuffle``).

    Raises `ValueError` exactly where RAGEN fails: train with 1,500 goals or fewer, and any
    seed whose index is past the last goal (test from 500 goals always works, val where
    ``seed % 1000 + 500 < n``).
    """
    if split == "test":
        index = seed % 500
    elif split == "val":
        index = seed % 1000 + 500
    elif split == "train":
        if n_goals <= 1500:
            raise ValueError(f"RAGEN's train split needs more than 1500 goals, got {n_goals}")
        index = seed % (n_goals - 1500) + 1500
    else:
        raise ValueError(f"split must be train, val or test, got {split!r}")
    if index >= n_goals:
        raise ValueError(f"RAGEN's {split} split maps seed {seed} to goal {index}, past the "
                         f"{n_goals} goals there are")
    return _permutation(n_goals)[index]
