"""Search over WebShop's documents as RAGEN runs it: Lucene's English analyzer and BM25.

webshop-minimal searches a Lucene index of each product's ``contents`` (lowercased title,
description, first bullet and options) through pyserini (Anserini 0.22.1 defaults), top 50.
`Bm25Search` does the same in Python:

* analyzer (Anserini's default English analyzer): Unicode word-break tokens (letters and
  digits; ``'`` and ``.`` join letters to letters and digits to digits, ``:`` joins letters,
  ``,`` and ``;`` join digits), a trailing ``'s`` removed, lowercase, Lucene's English stop
  words dropped, Porter stems (`turnpool.webshop.porter`);
* ranking: Lucene's BM25 (k1 0.9, b 0.4) with its one-byte document-length norms, scores in
  single precision, one clause per distinct query term boosted by its count, ties broken by
  ASIN.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from turnpool.webshop.porter import stem

K1 = 0.9
B = 0.4
TOP_N = 50
#: Query terms looked at (bounds the work of one search on hostile text).
MAX_QUERY_TERMS = 1024
#: Lucene's longest token; longer runs are cut into pieces of this length.
MAX_TOKEN_CHARS = 255

STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their "
    "then there these they this to was will with".split())

_MID_LETTER = frozenset(":\u00b7\u0387\u055f\u05f4\u2027\ufe13\ufe55\uff1a")
_MID_NUM = frozenset(",;\u037e\u0589\u060c\u060d\u066c\u07f8\u2044\ufe10\ufe14\ufe50\ufe54"
                     "\uff0c\uff1b")
_MID_NUM_LET = frozenset(".'\u2018\u2019\u2024\ufe52\uff07\uff0e")


#: Unicode's Extended_Pictographic code points below U+1F000 (emoji-data), which Lucene's
#: tokenizer emits as emoji tokens.
_PICTO_RANGES = (
    (0xA9, 0xA9), (0xAE, 0xAE), (0x203C, 0x203C), (0x2049, 0x2049), (0x2122, 0x2122),
    (0x2139, 0x2139), (0x2194, 0x2199), (0x21A9, 0x21AA), (0x231A, 0x231B), (0x2328, 0x2328),
    (0x2388, 0x2388), (0x23CF, 0x23CF), (0x23E9, 0x23F3), (0x23F8, 0x23FA), (0x24C2, 0x24C2),
    (0x25AA, 0x25AB), (0x25B6, 0x25B6), (0x25C0, 0x25C0), (0x25FB, 0x25FE), (0x2600, 0x2605),
    (0x2607, 0x2612), (0x2614, 0x2685), (0x2690, 0x2705), (0x2708, 0x2712), (0x2714, 0x2714),
    (0x2716, 0x2716), (0x271D, 0x271D), (0x2721, 0x2721), (0x2728, 0x2728), (0x2733, 0x2734),
    (0x2744, 0x2744), (0x2747, 0x2747), (0x274C, 0x274C), (0x274E, 0x274E), (0x2753, 0x2755),
    (0x2757, 0x2757), (0x2763, 0x2767), (0x2795, 0x2797), (0x27A1, 0x27A1), (0x27B0, 0x27B0),
    (0x27BF, 0x27BF), (0x2934, 0x2935), (0x2B05, 0x2B07), (0x2B1B, 0x2B1C), (0x2B50, 0x2B50),
    (0x2B55, 0x2B55), (0x3030, 0x3030), (0x303D, 0x303D), (0x3297, 0x3297), (0x3299, 0x3299),
)
_EMOJI_TAIL = frozenset(range(0x1F3FB, 0x1F400)) | {0xFE0F, 0xFE0E, 0x20E3}


def _pictographic(o: int) -> bool:
    if o >= 0x1F000:
        return o <= 0x1FAFF or 0x1FC00 <= o <= 0x1FFFD
    return any(lo <= o <= hi for lo, hi in _PICTO_RANGES)


@lru_cache(maxsize=8192)
def _kind(c: str) -> str:
    if _pictographic(ord(c)) and not (0x1F3FB <= ord(c) <= 0x1F3FF):
        return "P"
    cat = unicodedata.category(c)
    if cat == "Nd":
        return "N"
    if c == "_":
        return "X"
    if cat in ("Mn", "Mc", "Me") or c in "\uff9e\uff9f":
        return "E"
    if cat[0] == "L":
        return "I" if _ideographic(c) else "L"
    if cat in ("Mn", "Mc", "Me"):
        return "E"
    return "O"


def _ideographic(c: str) -> bool:
    o = ord(c)
    return (0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF
            or 0xF900 <= o <= 0xFAFF or 0x20000 <= o <= 0x2FFFF)


#: The same rules for ASCII text, as one pattern (the common case, and much faster).
_ASCII_TOKEN = re.compile(r"[A-Za-z0-9_]+(?:(?:(?<=[A-Za-z])[:.'](?=[A-Za-z])"
                          r"|(?<=[0-9])[.,;'](?=[0-9]))[A-Za-z0-9_]+)*")


def tokenize(text: str) -> list[str]:
    """Word tokens as Lucene's StandardTokenizer cuts them (the cases that occur in product
    text; ideographs and kana are single-character tokens)."""
    if text.isascii():
        return [w[p:p + MAX_TOKEN_CHARS] for w in _ASCII_TOKEN.findall(text)
                if w.strip("_") for p in range(0, len(w), MAX_TOKEN_CHARS)]
    out: list[str] = []
    n, i = len(text), 0
    kinds = [_kind(c) for c in text]
    while i < n:
        k = kinds[i]
        if k == "I":
            out.append(text[i])
            i += 1
            continue
        if k == "P":  # an emoji and its presentation / modifier / joined parts
            j = i + 1
            while j < n and (ord(text[j]) in _EMOJI_TAIL or (
                    text[j] == "\u200d" and j + 1 < n and kinds[j + 1] == "P")):
                j += 2 if text[j] == "\u200d" else 1
            out.append(text[i:j])
            i = j
            continue
        if k not in ("L", "N", "X"):
            i += 1
            continue
        j = i + 1
        while j < n:
            kj = kinds[j]
            if kj in ("L", "N", "X", "E"):
                j += 1
                continue
            if j + 1 < n:
                prev, nxt, c = kinds[j - 1], kinds[j + 1], text[j]
                if prev == nxt == "L" and (c in _MID_LETTER or c in _MID_NUM_LET):
                    j += 1
                    continue
                if prev == nxt == "N" and (c in _MID_NUM or c in _MID_NUM_LET):
                    j += 1
                    continue
            break
        word = text[i:j]
        if not any(kinds[x] in ("L", "N") for x in range(i, j)):  # "_" alone is no word
            i = j
            continue
        out.extend(word[p:p + MAX_TOKEN_CHARS] for p in range(0, len(word), MAX_TOKEN_CHARS))
        i = j
    return out


def analyze(text: str) -> list[str]:
    """Anserini's default English analysis: tokens, possessives, lowercase, stop words, stems."""
    terms = []
    for tok in tokenize(text):
        if len(tok) >= 2 and tok[-1] in "sS" and tok[-2] in "'\u2019\uff07":
            tok = tok[:-2]
        tok = tok.lower()
        if tok and tok not in STOP_WORDS:
            terms.append(stem(tok))
    return terms


def _int4(i: int) -> int:
    bits = i.bit_length()
    if bits < 4:
        return i
    shift = bits - 4
    return ((i >> shift) & 0x07) | ((shift + 1) << 3)


def _from_int4(i: int) -> int:
    shift = (i >> 3) - 1
    return i & 0x07 if shift == -1 else ((i & 0x07) | 0x08) << shift


_FREE = 255 - _int4(2**31 - 1)


def lucene_length(n: int) -> int:
    """A document length as Lucene's one-byte norm keeps it (exact below 24, then ~3 bits)."""
    if n < _FREE:
        return n
    return _FREE + _from_int4(_int4(n - _FREE))


class Bm25Search:
    """``query -> ASINs`` (best first, at most ``TOP_N``) over ``(asin, contents)`` pairs."""

    def __init__(self, docs: Sequence[tuple[str, str]], k1: float = K1, b: float = B) -> None:
        self.asins = [a for a, _ in docs]
        self.postings: dict[str, list[tuple[int, int]]] = {}
        lengths: list[int] = []
        for i, (_, text) in enumerate(docs):
            terms = analyze(text)
            lengths.append(len(terms))
            for term, tf in Counter(terms).items():
                self.postings.setdefault(term, []).append((i, tf))
        n = len(docs)
        avg = np.float32(sum(lengths) / n) if n else np.float32(1.0)
        self.norm_inverse = [
            float(np.float32(1.0) / (np.float32(k1) * (np.float32(1 - b) + np.float32(b)
                                                       * np.float32(lucene_length(x)) / avg)))
            for x in lengths]
        self.idf = {t: float(np.float32(math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5))))
                    for t, p in self.postings.items()}

    def __call__(self, query: str) -> list[str]:
        counts = Counter(analyze(query)[:MAX_QUERY_TERMS])
        scores: dict[int, float] = {}
        for term, boost in counts.items():
            idf = self.idf.get(term)
            if idf is None:
                continue
            weight = float(np.float32(boost * idf))
            for doc, tf in self.postings[term]:
                s = np.float32(weight - weight / (1.0 + tf * self.norm_inverse[doc]))
                scores[doc] = scores.get(doc, 0.0) + float(s)
        ranked = sorted(scores, key=lambda d: (-float(np.float32(scores[d])), self.asins[d]))
        return [self.asins[d] for d in ranked[:TOP_N]]
