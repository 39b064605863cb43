"""The Porter stemmer (M. F. Porter, 1980), in the variant Lucene's ``PorterStemFilter`` uses.

Written from the published algorithm, with the two changes of Porter's own reference
implementation that Lucene keeps: step 2 maps ``-bli`` to ``-ble`` (instead of ``-abli`` to
``-able``) and ``-logi`` to ``-log``. Words of one or two letters are left alone.
"""

from __future__ import annotations

from functools import lru_cache

_VOWELS = frozenset("aeiou")


def _is_cons(w: str, i: int) -> bool:
    c = w[i]
    if c in _VOWELS:
        return False
    if c == "y":
        return i == 0 or not _is_cons(w, i - 1)
    return True


def _measure(stem: str) -> int:
    """m in [C](VC)^m[V]."""
    n, i, length = 0, 0, len(stem)
    while i < length and _is_cons(stem, i):
        i += 1
    while i < length:
        while i < length and not _is_cons(stem, i):
            i += 1
        if i >= length:
            break
        while i < length and _is_cons(stem, i):
            i += 1
        n += 1
    return n


def _has_vowel(stem: str) -> bool:
    return any(not _is_cons(stem, i) for i in range(len(stem)))


def _double_cons(w: str) -> bool:
    return len(w) >= 2 and w[-1] == w[-2] and _is_cons(w, len(w) - 1)


def _cvc(w: str) -> bool:
    """Ends consonant-vowel-consonant, the last not w, x or y."""
    if len(w) < 3:
        return False
    n = len(w)
    return (_is_cons(w, n - 3) and not _is_cons(w, n - 2) and _is_cons(w, n - 1)
            and w[-1] not in "wxy")


def _replace(w: str, suffix: str, repl: str, min_m: int) -> str | None:
    """``w`` with ``suffix`` replaced when the stem's measure > ``min_m``; None if no suffix."""
    if not w.endswith(suffix):
        return None
    stem = w[: len(w) - len(suffix)]
    return stem + repl if _measure(stem) > min_m else w


_STEP2 = [("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"),
          ("izer", "ize"), ("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"),
          ("ousli", "ous"), ("ization", "ize"), ("ation", "ate"), ("ator", "ate"),
          ("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous"),
          ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"), ("logi", "log")]
_STEP3 = [("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"),
          ("ful", ""), ("ness", "")]
_STEP4 = ["al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent",
          "ion", "ou", "ism", "ate", "iti", "ous", "ive", "ize"]


def _longest(w: str, rules: list[tuple[str, str]]) -> tuple[str, str] | None:
    best = None
    for suffix, repl in rules:
        if w.endswith(suffix) and (best is None or len(suffix) > len(best[0])):
            best = (suffix, repl)
    return best


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The Porter stem of a lowercase word."""
    w = word
    if len(w) <= 2:
        return w
    # step 1a
    if w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("ies"):
        w = w[:-2]
    elif w.endswith("ss"):
        pass
    elif w.endswith("s"):
        w = w[:-1]
    # step 1b
    extra = False
    if w.endswith("eed"):
        if _measure(w[:-3]) > 0:
            w = w[:-1]
    elif w.endswith("ed") and _has_vowel(w[:-2]):
        w, extra = w[:-2], True
    elif w.endswith("ing") and _has_vowel(w[:-3]):
        w, extra = w[:-3], True
    if extra:
        if w.endswith(("at", "bl", "iz")):
            w += "e"
        elif _double_cons(w) and w[-1] not in "lsz":
            w = w[:-1]
        elif _measure(w) == 1 and _cvc(w):
            w += "e"
    # step 1c
    if w.endswith("y") and _has_vowel(w[:-1]):
        w = w[:-1] + "i"
    # step 2
    rule = _longest(w, _STEP2)
    if rule is not None:
        w = _replace(w, rule[0], rule[1], 0) or w
    # step 3
    rule = _longest(w, _STEP3)
    if rule is not None:
        w = _replace(w, rule[0], rule[1], 0) or w
    # step 4
    suffix = max((s for s in _STEP4 if w.endswith(s)), key=len, default=None)
    if suffix is not None:
        stem_ = w[: len(w) - len(suffix)]
        if _measure(stem_) > 1 and (suffix != "ion" or stem_.endswith(("s", "t"))):
            w = stem_
    # step 5a
    if w.endswith("e"):
        m = _measure(w[:-1])
        if m > 1 or (m == 1 and not _cvc(w[:-1])):
            w = w[:-1]
    # step 5b
    if w.endswith("ll") and _measure(w) > 1:
        w = w[:-1]
    return w
