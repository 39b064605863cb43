"""Search as RAGEN's WebShop runs it: top 50 of Lucene BM25 over the small set's documents.

``tests/fixtures/webshop_ragen/lucene_top50.json.gz`` was made once with Anserini 0.22.1
(pyserini 0.22.1's jar, ``SimpleSearcher`` defaults, as webshop-minimal calls it) on
webshop-minimal's own ``indexes_1k``: 1,000 lowercased queries (goal instructions, product
titles, instruction fragments, random word mixes and a few hand-written edge cases).
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

from turnpool.webshop.data import load_webshop
from turnpool.webshop.porter import stem
from turnpool.webshop.search import Bm25Search, analyze, lucene_length, tokenize

FIXTURE = (Path(__file__).resolve().parent.parent / "fixtures" / "webshop_ragen"
           / "lucene_top50.json.gz")


def test_top50_identical_to_lucene_for_every_query() -> None:
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as f:
        ref = json.load(f)
    data = load_webshop()
    search = Bm25Search([(p.asin, p.contents) for p in data.products])
    assert len(ref["queries"]) == 1000
    t0 = time.perf_counter()
    different = [q for q, top in zip(ref["queries"], ref["top50"]) if search(q) != top]
    assert different == []
    assert time.perf_counter() - t0 < 30


def test_analyzer_pieces() -> None:
    assert tokenize("men's t-shirts 4.25 oz, e.g. size:xl a_b _ ❤️x") == [
        "men's", "t", "shirts", "4.25", "oz", "e.g", "size:xl", "a_b", "❤️", "x"]
    ascii_text = "men's t-shirts 4.25 oz, e.g. size:xl a_b _ 1,000;2 x" + "y" * 300
    assert tokenize(ascii_text) == tokenize(ascii_text + " \u00e9")[:-1]  # fast == careful
    assert [len(t) for t in tokenize(ascii_text)[-2:]] == [255, 46]
    assert tokenize(ascii_text)[:9] == ["men's", "t", "shirts", "4.25", "oz", "e.g", "size:xl",
                                        "a_b", "1,000;2"]
    assert analyze("The Women's Running Shoes") == ["women", "run", "shoe"]
    assert [stem(w) for w in ("caresses", "ponies", "agreed", "hopping", "happy",
                              "relational", "archaeology", "generalization", "electrical",
                              "adjustment", "controll", "as")] == [
        "caress", "poni", "agre", "hop", "happi", "relat", "archaeolog", "gener", "electr",
        "adjust", "control", "as"]
    assert [lucene_length(n) for n in (0, 23, 24, 25, 40, 100, 1000)] == [
        0, 23, 24, 25, 40, 96, 984]


def test_hostile_queries_are_bounded() -> None:
    data = load_webshop()
    search = Bm25Search([(p.asin, p.contents) for p in data.products][:50])
    assert search("") == [] and search("the of and") == []
    t0 = time.perf_counter()
    assert len(search("shirt " * 50_000)) <= 50
    assert time.perf_counter() - t0 < 10
