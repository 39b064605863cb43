"""WebShop's pages, clickables and actions as RAGEN's WebShop env shows them, without HTML.

RAGEN's env renders webshop-minimal's HTML templates and reads them back: the observation is
the page's visible text pieces joined by `` [SEP] ``, and the clickables are the page's buttons
(lowercased text), product links (lowercased ASINs) and option radios (their value), in that
order, later duplicates keeping the first one's place. This module builds the same pieces
directly from the page state:

* search page: ``WebShop``, ``Instruction:``, the instruction, ``Search`` (search bar)
* results: ``Instruction:``, instruction, ``Back to Search``, ``Page N (Total results: T)``,
  ``< Prev`` (page > 1), ``Next >`` (always), then ASIN, title, price tag per product (10 per
  page, top 50); a page past the last shows no products
* item: ``Instruction:``, instruction, ``Back to Search``, ``< Prev``, each option's name and
  values, title, ``Price: ...``, ``Rating: N.A.``, ``Description``, ``Features``, ``Reviews``,
  ``Buy Now``; clickables: the buttons, then the option values
* description / features / reviews: ``Back to Search``, ``< Prev`` and the text (features: one
  piece per bullet; reviews: none in this data)
* done: the done page's fixed texts with the purchased ASIN, the clicked options (as JSON) and
  the reward

Actions follow webshop-minimal's ``WebAgentTextEnv.step``: ``name[arg]`` is read with the
pattern ``(.+)\\[(.+)\\]`` and ``arg`` lowercased; ``search[...]`` runs on *any* page (RAGEN marks
it invalid where the page has no search bar, but it still runs); ``click[x]`` runs when ``x`` is
a clickable of the page (other than ``search``); anything else does nothing. ``next >`` and
``< prev`` on results re-run the search for the new page; ``< prev`` on an item page goes back
to the results, on a sub page back to the item; clicking a product opens it with no options
selected, clicking an option value selects it; ``back to search`` returns to the search page;
``buy now`` ends the episode with WebShop's reward for the product and the options clicked on
its page (see `turnpool.webshop.reward`).

Search is pluggable: any ``query -> list of ASINs`` function (`turnpool.webshop.search`
provides the default).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turnpool.webshop.data import WebShopData, WsProduct, load_webshop
from turnpool.webshop.reward import TitleNouns, webshop_reward

PRODUCT_WINDOW = 10
SEARCH_RETURN_N = 50
SEP = " [SEP] "
#: Longest action text looked at; longer texts do nothing (bounds the parser's work).
MAX_ACTION_CHARS = 4096
SUB_PAGES = ("Description", "Features", "Reviews")

_ACTION = re.compile(r"(.+)\[(.+)\]")

Search = Callable[[str], list[str]]


@dataclass
class ShopState:
    """One session: the goal and the page being shown (``kind``: index, search_results,
    item_page, item_sub_page, done)."""

    goal: int
    kind: str = "index"
    keywords: list[str] = field(default_factory=list)
    page: int = 1
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub_page: str = ""
    reward: float = 0.0


@dataclass(frozen=True)
class Clickable:
    kind: str  # button | link | radio
    option: str = ""


@dataclass(frozen=True)
class Outcome:
    reward: float
    done: bool
    #: WebShop's reward parts (its ``verbose`` info) when the action was a purchase.
    parts: dict[str, Any] | None = None


def parse_action(action: str) -> tuple[str, str | None]:
    """webshop-minimal's parse: ``(name, arg)`` or ``(action, None)``."""
    m = _ACTION.match(action)
    if m is None:
        return action, None
    return m.group(1), m.group(2)


class RagenShop:
    """The shop's pages over a `WebShopData` (shared, read-only) with a search function."""

    def __init__(self, data: WebShopData, search: Search, nouns: TitleNouns | None = None
                 ) -> None:
        self.data = data
        self.search_fn = search
        self.nouns = nouns
        self._cache: dict[str, list[WsProduct]] = {}

    # ------------------------------------------------------------------ search
    def top_products(self, keywords: list[str]) -> list[WsProduct]:
        query = " ".join(keywords)
        hit = self._cache.get(query)
        if hit is None:
            by = self.data.by_asin
            hit = [by[a] for a in self.search_fn(query)[:SEARCH_RETURN_N] if a in by]
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[query] = hit
        return hit

    # ------------------------------------------------------------------ pages
    def instruction(self, s: ShopState) -> str:
        return self.data.goals[s.goal].instruction_text

    def page(self, s: ShopState) -> tuple[list[str], bool, dict[str, Clickable]]:
        """``(text pieces, has search bar, clickables in order)`` of the current page."""
        head = ["Instruction:", self.instruction(s)]
        clicks: dict[str, Clickable] = {}

        def button(text: str) -> str:
            clicks[text.lower()] = Clickable("button")
            return text

        if s.kind == "index":
            return ["WebShop", *head, button("Search")], True, clicks
        if s.kind == "done":
            return self._done_page(s), False, clicks
        pieces = [*head, button("Back to Search")]
        if s.kind == "search_results":
            products = self.top_products(s.keywords)
            shown = products[(s.page - 1) * PRODUCT_WINDOW:s.page * PRODUCT_WINDOW]
            pieces.append(f"Page {s.page} (Total results: {len(products)})")
            if s.page > 1:
                pieces.append(button("< Prev"))
            pieces.append(button("Next >"))
            for p in shown:
                clicks[p.asin.lower()] = Clickable("link")
                pieces += [p.asin, p.title, p.price_tag]
            return _visible(pieces), False, clicks
        pieces.append(button("< Prev"))
        product = self.data.by_asin[str(s.asin)]
        if s.kind == "item_sub_page":
            if s.sub_page == "Description":
                pieces.append(product.description)
            elif s.sub_page == "Features":
                pieces += [f" {b}" for b in product.bullets]  # the template's " {{bullet}}"
            return _visible(pieces), False, clicks
        radios: dict[str, Clickable] = {}
        for name, values in product.options.items():
            pieces.append(name)
            for value in values:
                pieces.append(value)
                radios[value] = Clickable("radio", name)
        pieces += [product.title, f"Price: {product.price_tag}", f"Rating: {product.rating}"]
        pieces += [button(t) for t in SUB_PAGES]
        pieces.append(button("Buy Now"))
        for value, element in radios.items():
            clicks[value] = element
        return _visible(pieces), False, clicks

    def _done_page(self, s: ShopState) -> list[str]:
        chosen = _html_safe_json(s.options)
        return ["Thank you for shopping with us!", "Your code:", "None",
                "(Paste it in your MTurk interface.)", "Purchased", "asin", str(s.asin),
                "options", chosen, "attrs", "None", "category", "None", "query", "None",
                "product category", "None", "Target", "asin", "options", "attrs",
                "price upper", "instuction text", "category", "product category", "query",
                "Goal", "None", "Reward", "Your score (min 0.0, max 1.0)", repr(s.reward),
                "Reward Details", "None"]

    def observation(self, s: ShopState) -> str:
        return SEP.join(self.page(s)[0])

    # ------------------------------------------------------------------ actions
    def step(self, s: ShopState, action: str) -> Outcome:
        """Apply ``action`` (module docstring); ``s`` is changed in place."""
        if len(action) > MAX_ACTION_CHARS:
            return Outcome(0.0, False)
        name, arg = parse_action(action)
        if arg is not None:
            arg = arg.lower()
        if name == "search" and arg:
            self._search(s, arg.split(" "), 1)
            return Outcome(0.0, False)
        if name != "click" or arg is None or arg == "search":
            return Outcome(0.0, False)
        clicks = self.page(s)[2]
        if arg not in clicks:
            return Outcome(0.0, False)
        return self._click(s, arg, clicks[arg])

    def _search(self, s: ShopState, keywords: list[str], page: int) -> None:
        s.kind, s.keywords, s.page, s.asin, s.options = "search_results", keywords, page, None, {}

    def _click(self, s: ShopState, name: str, element: Clickable) -> Outcome:
        where = s.kind
        if name == "buy now":
            product = self.data.by_asin[str(s.asin)]
            goal = self.data.goals[s.goal]
            result = webshop_reward(product, goal, self.data.prices[product.asin],
                                    s.options, self.nouns)
            s.kind, s.reward = "done", result.reward
            n = len(goal.attributes) + len(goal.goal_options) + 1
            parts: dict[str, Any] = {
                "r_type": result.r_type, "r_att": result.attribute_matches / len(goal.attributes),
                "w_att": len(goal.attributes) / n, "query_match": result.query_match,
                "category_match": result.category_match, "title_score": result.title_score}
            if goal.goal_options:
                parts.update(r_option=result.option_matches / len(goal.goal_options),
                             w_option=len(goal.goal_options) / n)
            parts.update(r_price=result.price_ok, w_price=1 / n)
            return Outcome(result.reward, True, parts)
        if name == "back to search":
            s.kind, s.keywords, s.page, s.asin, s.options = "index", [], 1, None, {}
        elif name == "next >" and where == "search_results":
            self._search(s, s.keywords, s.page + 1)
        elif name == "< prev" and where == "search_results":
            self._search(s, s.keywords, s.page - 1)
        elif name == "< prev" and where == "item_sub_page":
            s.kind = "item_page"
        elif name == "< prev" and where == "item_page":
            self._search(s, s.keywords, s.page)
        elif name in ("description", "features", "reviews", "attributes"):
            s.kind, s.sub_page = "item_sub_page", name.capitalize()
        else:
            if element.kind == "link":
                s.asin = name.upper()
            elif element.kind == "radio":
                s.options[element.option.lower()] = name
            s.kind = "item_page"
        return Outcome(0.0, False)

    def accepts(self, s: ShopState, action: str) -> bool:
        """RAGEN v2's validity: a ``search[...]`` with text where the page has a search bar,
        or a ``click[x]`` on one of the page's clickables (before ``next >`` is dropped)."""
        if len(action) > MAX_ACTION_CHARS:
            return False
        name, arg = parse_action(action)
        if arg is None:
            return False
        _, has_search, clicks = self.page(s)
        if name == "search":
            return has_search
        return name == "click" and arg.lower() != "search" and arg.lower() in clicks

    def actions(self, s: ShopState) -> list[str]:
        """RAGEN's available actions: ``search[<content>]`` with a search bar, then
        ``click[x]`` per clickable; ``next >`` is dropped on a page past the last."""
        _, has_search, clicks = self.page(s)
        out = ["search[<content>]"] if has_search else []
        out += [f"click[{c}]" for c in clicks if c != "search"]
        if tuple(out) == ("click[back to search]", "click[< prev]", "click[next >]"):
            out.remove("click[next >]")
        return out


_ASCII_SPACE = " \t\n\r\f"


def _visible(pieces: list[str]) -> list[str]:
    """Text pieces as RAGEN's page reader sees them: an empty value makes no text node; a
    node of ASCII blanks reads as a newline (then skipped) when it holds one, else as a space,
    which strips to an empty piece; anything else is stripped."""
    out = []
    for t in pieces:
        if not t or (not t.strip(_ASCII_SPACE) and "\n" in t):
            continue
        out.append(t.strip())
    return out


def _html_safe_json(value: object) -> str:
    """Flask's ``tojson`` filter: sorted keys, ASCII, ``<>&'`` as unicode escapes."""
    text = json.dumps(value, sort_keys=True)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("'", "\\u0027"))


_shops: dict[tuple[Any, ...], RagenShop] = {}
_shops_lock = threading.Lock()


def shared_shop(file_path: str | None = None, attr_path: str | None = None,
                human_goals_path: str | None = None, num_products: int | None = None,
                draw_seed: int = 0) -> RagenShop:
    """One shop (data + search index) per data set and process, shared by its envs and the
    web service; the bundled small set with no paths."""
    key = (file_path, attr_path, human_goals_path, num_products, draw_seed)
    with _shops_lock:
        shop = _shops.get(key)
        if shop is None:
            from turnpool.webshop.search import Bm25Search

            data = load_webshop(file_path, attr_path, human_goals_path, num_products, draw_seed)
            search = Bm25Search([(p.asin, p.contents) for p in data.products])
            shop = _shops[key] = RagenShop(data, search)
        return shop
