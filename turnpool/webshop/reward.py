"""WebShop's reward for a purchase, with its fuzzy matching, colour normaliser and type score.

For a goal and a purchased product, with ``price`` the product's drawn price and ``selected``
the options clicked before buying (``{name: value}``)::

    attributes: a goal attribute counts when a product attribute matches it fuzzily (> 85),
                or else when it is a substring of the lowercased title, bullets or description
    options:    each goal option counts when some selected value matches it (> 85), both
                sides first passed through the colour normaliser
    price:      price <= price_upper (inclusive)
    reward   =  r_type * (attributes + options + price) / (n_attributes + n_options + 1)

Fuzzy matching is thefuzz's ``token_set_ratio`` (force_ascii, full_process): text made by
``str()``, characters 128-255 dropped, rapidfuzz's default processing (lowercase, non
alphanumerics to spaces, trimmed), rapidfuzz's token-set ratio rounded to an integer.

Quirks kept on purpose, because RAGEN's rewards have them:

* The normaliser maps a text to the first colour of its list that occurs in it as a substring,
  so ``"dash"`` becomes ``"ash"`` and ``"green2"`` becomes ``"green"``. Goal options reach it as
  ``(name, value)`` pairs, for which "occurs in" means "equals the name or the value", and
  a pair that is not normalised is matched as the text of the pair (``"('color', 'dash')"``,
  i.e. the words of the name and the value).
* Selected values are matched against goal options without looking at option names, so a
  size value can satisfy a colour wish if the words match.

This is webshop-minimal at ``ec82552``, the commit RAGEN pins. (Later commits of
webshop-minimal score a purchase on all of the product's option values instead of the clicked
ones; RAGEN does not use them.)

The type score compares the nouns (spaCy ``en_core_web_sm`` tags NOUN / PROPN) of the two
titles: ``title_score = |nouns(bought) & nouns(wanted)| / |nouns(wanted)|`` (0.2 if the wanted
title has none); ``r_type`` is 1, or 0.5 when neither the query, two category path parts nor a
title score > 0.2 match, 0.1 when ``title_score < 0.1`` and 0 when it is 0. The nouns of the
bundled products' titles ship with the package (tagged once with spaCy 3.8 and
``en_core_web_sm`` 3.8.0), so the small set needs no spaCy. For other titles, `TitleNouns`
uses spaCy when it and the model are installed (``pip install turnpool[webshop-spacy]`` and the
model), and otherwise falls back to every word of the title outside a short list of function
words, adjectives and numbers: an approximation that can give a different type score.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rapidfuzz.fuzz import token_set_ratio as _token_set_ratio
from rapidfuzz.utils import default_process

from turnpool.webshop.data import SMALL_TITLE_NOUNS, WsGoal, WsProduct, read_json

log = logging.getLogger(__name__)

FUZZY_THRESHOLD = 85

COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black",
    "blue", "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel",
    "champagne", "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee", "cognac",
    "copper", "coral", "cranberry", "cream", "crystal", "dark", "denim", "eggplant", "elephant",
    "espresso", "fuchsia", "gold", "granite", "grape", "graphite", "grass", "gray", "green",
    "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon", "leopard",
    "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint",
    "mocha", "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive", "orange",
    "peach", "pewter", "pink", "plum", "purple", "rainbow", "red", "rose", "royal", "rust",
    "sand", "sapphire", "seashell", "silver", "skull", "slate", "steel", "stone", "stonewash",
    "sunflower", "tan", "taupe", "teal", "tiger", "turquoise", "violet", "walnut", "wheat",
    "white", "wine", "yellow",
)

_HIGH_LATIN1 = {i: None for i in range(128, 256)}


def fuzzy_score(a: object, b: object) -> int:
    """thefuzz's ``token_set_ratio(a, b)`` with its defaults (module docstring)."""
    pa = default_process(str(a).translate(_HIGH_LATIN1))
    pb = default_process(str(b).translate(_HIGH_LATIN1))
    return int(round(_token_set_ratio(pa, pb)))


def normalize_color(value: str | tuple[str, ...]) -> str | tuple[str, ...]:
    """The first colour "in" ``value`` (substring for text, element for a pair), else itself."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


# ---------------------------------------------------------------------------- type score
_FALLBACK_SKIP = frozenset("""
a an the and or of for with in on to by from at as is are be this that these those it its
your our my his her their new set pack pcs piece pieces inch inches x men women mens womens
men's women's kid kids size large small medium big mini extra high low long short soft
""".split())
_WORD = re.compile(r"[a-z][a-z']*")


class TitleNouns:
    """Title -> lowercased noun tokens (NOUN, PROPN), as spaCy ``en_core_web_sm`` tags them."""

    def __init__(self, table: Mapping[str, Sequence[str]] | None = None) -> None:
        self.table: dict[str, list[str]] = {str(k): list(v) for k, v in (table or {}).items()}
        self._nlp: Any = None
        self._tried = False
        self._lock = threading.Lock()

    def __call__(self, title: str) -> list[str]:
        hit = self.table.get(title)
        if hit is not None:
            return hit
        nouns = self._tag(title)
        self.table[title] = nouns
        return nouns

    def _tag(self, title: str) -> list[str]:
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    import spacy

                    self._nlp = spacy.load("en_core_web_sm")
                except (ImportError, OSError) as exc:
                    log.warning("spaCy's en_core_web_sm is not available (%s); WebShop type "
                                "scores of titles outside the bundled set are approximate", exc)
        if self._nlp is not None:
            return [t.text.lower() for t in self._nlp(title) if t.pos_ in ("NOUN", "PROPN")]
        return [w for w in _WORD.findall(title.lower()) if w not in _FALLBACK_SKIP]


_bundled: TitleNouns | None = None


def bundled_title_nouns() -> TitleNouns:
    """The shipped noun table of the small set's titles (spaCy for anything else)."""
    global _bundled
    if _bundled is None:
        _bundled = TitleNouns(read_json(SMALL_TITLE_NOUNS))
    return _bundled


@dataclass(frozen=True)
class Reward:
    """A purchase's reward and its parts (WebShop's ``verbose`` info)."""

    reward: float
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float
    attribute_matches: int
    option_matches: int
    price_ok: bool


def type_score(bought: WsProduct, goal: WsGoal, nouns: TitleNouns
               ) -> tuple[float, bool, bool, float]:
    """``(r_type, query_match, category_match, title_score)``."""
    query_match = bought.query == goal.query
    have = {x.strip() for x in bought.product_category.split("›")}
    want = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(have & want) >= 2
    wanted = nouns(goal.name)
    if not wanted:
        title_score = 0.2
    else:
        title_score = len(set(nouns(bought.title)) & set(wanted)) / len(wanted)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def attribute_matches(bought: WsProduct, wanted: Iterable[str]) -> int:
    text = (bought.title.lower(), " ".join(bought.bullets).lower(), bought.description.lower())
    n = 0
    for attr in wanted:
        if any(fuzzy_score(p, attr) > FUZZY_THRESHOLD for p in bought.attributes):
            n += 1
        elif any(attr in t for t in text):
            n += 1
    return n


def option_matches(bought_values: Iterable[str],
                   wanted: Mapping[str, str] | Sequence[str]) -> int:
    have = [normalize_color(v) for v in bought_values]
    items: Iterable[Any] = wanted.items() if isinstance(wanted, Mapping) else wanted
    n = 0
    for g in (normalize_color(w) for w in items):
        if any(fuzzy_score(p, g) > FUZZY_THRESHOLD for p in have):
            n += 1
    return n


def webshop_reward(bought: WsProduct, goal: WsGoal, price: float,
                   selected: Mapping[str, str],
                   nouns: TitleNouns | None = None) -> Reward:
    """WebShop's ``get_reward`` for buying ``bought`` at ``price`` with ``selected`` options."""
    nouns = nouns or bundled_title_nouns()
    r_type, query_match, category_match, title_score = type_score(bought, goal, nouns)
    price_ok = bool(price <= goal.price_upper) if goal.price_upper > 0 else False
    n_attr = attribute_matches(bought, goal.attributes)
    n_opt = option_matches(list(selected.values()), goal.goal_options)
    total = (n_attr + n_opt + int(price_ok)) / (len(goal.attributes) + len(goal.goal_options) + 1)
    return Reward(total * r_type, r_type, query_match, category_match, title_score, n_attr,
                  n_opt, price_ok)
