"""Search over WebShop's documents: BM25 with Anserini's parameters (k1 0.9, b 0.4).

webshop-minimal searches a Lucene index of each product's ``contents`` (lowercased title,
description, first bullet and options) with Lucene's English analyzer and BM25, top 50.
`Bm25Search` scores the same ``contents`` with Lucene's BM25 formula
``idf * tf / (tf + k1 * (1 - b + b * len / avg_len))``, ``idf = ln(1 + (N - n + 0.5) / (n +
0.5))``, over a simpler analyzer: lowercase words and numbers, English possessives removed,
Lucene's English stop words dropped, no stemming. Results therefore differ from RAGEN's
where stemming or Lucene's lossy length norms change the ranking; ties go to the earlier
document, as in Lucene.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

K1 = 0.9
B = 0.4
TOP_N = 50
#: Query words looked at (bounds the work of one search on hostile text).
MAX_QUERY_TERMS = 64

STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their "
    "then there these they this to was will with".split())
_TOKEN = re.compile(r"[a-z0-9]+(?:['.][a-z0-9]+)*")


def analyze(text: str) -> list[str]:
    out = []
    for tok in _TOKEN.findall(text.lower()):
        if tok.endswith("'s"):
            tok = tok[:-2]
        tok = tok.replace("'", "")
        if tok and tok not in STOP_WORDS:
            out.append(tok)
    return out


class Bm25Search:
    """``query -> ASINs`` (best first, at most ``TOP_N``) over ``(asin, contents)`` pairs."""

    def __init__(self, docs: Sequence[tuple[str, str]], k1: float = K1, b: float = B) -> None:
        self.asins = [a for a, _ in docs]
        self.k1, self.b = k1, b
        self.postings: dict[str, list[tuple[int, int]]] = {}
        self.lengths: list[int] = []
        for i, (_, text) in enumerate(docs):
            terms = analyze(text)
            self.lengths.append(len(terms))
            for term, tf in Counter(terms).items():
                self.postings.setdefault(term, []).append((i, tf))
        n = max(1, len(docs))
        self.avg = sum(self.lengths) / n if self.lengths else 1.0
        self.idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5))
                    for t, p in self.postings.items()}

    def __call__(self, query: str) -> list[str]:
        scores: dict[int, float] = {}
        for term in analyze(query)[:MAX_QUERY_TERMS]:
            idf = self.idf.get(term)
            if idf is None:
                continue
            for doc, tf in self.postings[term]:
                norm = self.k1 * (1 - self.b + self.b * self.lengths[doc] / self.avg)
                scores[doc] = scores.get(doc, 0.0) + idf * tf / (tf + norm)
        ranked = sorted(scores, key=lambda d: (-scores[d], d))[:TOP_N]
        return [self.asins[d] for d in ranked]
