"""WebShop's small set as RAGEN loads it: products, goals in order, seed -> goal, formats.

The reference (``tests/fixtures/webshop_ragen``) was recorded once by running webshop-minimal's
own loading code (``SimServer``) outside the repo, with ``random.seed(0)`` before it (the draw
seed turnpool uses by default); see docs/ragen.md, item 12.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from turnpool.webshop.data import (
    SMALL_ATTRIBUTES,
    SMALL_PRODUCTS,
    iter_goal_rows,
    load_webshop,
    read_json,
    read_product_records,
)
from turnpool.webshop.data import (
    goal_for_seed as ragen_goal,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "webshop_ragen"


@cache
def reference(name: str) -> Any:
    with gzip.open(FIXTURES / name, "rt", encoding="utf-8") as f:
        return json.load(f)


def test_small_set_goals_equal_ragen_in_order() -> None:
    ref = reference("goals.json.gz")
    data = load_webshop()
    assert len(data.products) == 1000
    assert len(data.goals) == ref["n_goals"] == 6910
    assert list(iter_goal_rows(data)) == ref["goals"]
    assert data.prices == ref["prices"]


def test_seed_to_goal_every_split() -> None:
    ref = reference("goals.json.gz")["seed_to_goal"]
    n = len(load_webshop().goals)
    for split in ("train", "val", "test"):
        assert [ragen_goal(s, split, n) for s in range(10_000)] == ref[split], split
    with pytest.raises(ValueError):
        ragen_goal(0, "dev", n)


def test_draw_seed_changes_price_draws_only() -> None:
    a, b = load_webshop(), load_webshop(draw_seed=1)
    assert [g.asin for g in a.goals] == [g.asin for g in b.goals]  # same shuffle (seed 233)
    assert [g.goal_options for g in a.goals] == [g.goal_options for g in b.goals]
    assert sum(x.price_upper != y.price_upper for x, y in zip(a.goals, b.goals)) > 1000
    fixed = [p.asin for p in a.products if len(p.pricing) == 1]
    assert fixed and all(a.prices[k] == b.prices[k] for k in fixed)
    ranged = [p for p in a.products if len(p.pricing) == 2]
    assert all(min(p.pricing) <= a.prices[p.asin] <= max(p.pricing) for p in ranged)


def _raw_record(doc: dict[str, Any]) -> dict[str, Any]:
    """A processed record turned back into WebShop's raw product-list shape."""
    pricing = doc["pricing"]
    return {"asin": doc["asin"], "name": doc["name"], "query": doc["query"],
            "category": doc["category"], "product_category": doc["product_category"],
            "full_description": doc["full_description"],
            "small_description": doc["small_description"], "images": doc["images"],
            "customization_options": doc["customization_options"],
            "pricing": " - ".join(f"${p}" for p in pricing)}


def test_webshop_formats_load_from_user_paths(tmp_path: Path) -> None:
    records = read_product_records(SMALL_PRODUCTS)
    docs = tmp_path / "documents.jsonl"
    docs.write_text("\n".join(json.dumps({"id": r["asin"], "contents": "", "product": r})
                              for r in records[:200]) + "\n", encoding="utf-8")
    raw = [_raw_record(r) for r in records[:200]]
    raw.append(dict(raw[0]))  # a repeated asin is skipped
    raw.append({**raw[1], "asin": "nan"})
    items = tmp_path / "items_shuffle.json"
    items.write_text(json.dumps(raw), encoding="utf-8")
    attrs = tmp_path / "items_ins_v2.json"
    attrs.write_text(json.dumps(read_json(SMALL_ATTRIBUTES)), encoding="utf-8")

    from_docs = load_webshop(str(docs), str(attrs))
    from_items = load_webshop(str(items), str(attrs))
    assert len(from_docs.products) == len(from_items.products) == 200
    no_text = [dataclasses.replace(p, contents="") for p in from_items.products]
    assert from_docs.products == no_text  # the documents here carry empty contents
    assert from_items.products[0].contents.startswith(from_items.products[0].title.lower())
    assert list(iter_goal_rows(from_docs)) == list(iter_goal_rows(from_items))
    assert len(load_webshop(str(items), str(attrs), num_products=50).products) == 50

    human = tmp_path / "items_human_ins.json"
    asin = from_items.products[0].asin
    human.write_text(json.dumps({asin: [
        {"instruction": "i want a thing.", "instruction_attributes": ["solid wood"],
         "instruction_options": ["black"]},
        {"instruction": "no attributes", "instruction_attributes": [],
         "instruction_options": []}]}), encoding="utf-8")
    hum = load_webshop(str(items), str(attrs), human_instructions=str(human))
    assert len(hum.goals) == 1
    assert hum.goals[0].instruction_text.startswith("i want a thing, and price lower than")
    assert hum.goals[0].goal_options == ["black"]


def test_bad_files_fail_clearly(tmp_path: Path) -> None:
    bad = tmp_path / "documents.jsonl"
    bad.write_text('{"id": "B0", "contents": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="product"):
        read_product_records(bad)
