"""The shop's logic without HTTP: BM25 search, per-session page state, actions and reward.

A session is a goal plus the page being shown. Pages are built as a list of blocks; the text
rendering (for agents) and the HTML rendering (for people, in ``server.py``) both walk the same
blocks, so the two can never disagree on what is on a page. Nothing on a page depends on the
session id, so two sessions with the same goal and the same actions see identical pages (group
members in GRPO-style training must).

Pages and their clickables, as in WebShop:

* search: ``search[<query>]``
* results (10 per page, top 50; items opened before are marked ``(viewed)``): ``back to
  search``, ``next >``, ``< prev``, one asin per item
* item: ``back to search``, ``< prev``, one value per option, ``description``, ``features``,
  ``buy now``
* description / features: ``back to search``, ``< prev``
* done: nothing (the reward is shown)
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from turnpool.webshop.catalog import Catalog, Goal, Product, score

RESULTS_PER_PAGE = 10
MAX_RESULTS = 50
#: Longest action text the shop looks at; anything longer is invalid without being parsed.
MAX_ACTION_CHARS = 2048
#: Search queries are cut to this many tokens before ranking (bounds BM25 work).
MAX_QUERY_TOKENS = 64
SEARCH_ACTION = "search[<your query>]"

_TOKEN = re.compile(r"[a-z0-9]+")
_ACTION = re.compile(r"\s*(search|click)\[(.*)\]\s*\Z", re.S | re.I)
_SPACES = re.compile(r"\s+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


@dataclass(frozen=True)
class Block:
    """One piece of a page: ``kind`` says how to draw it, ``key`` is its clickable name."""

    kind: str  # instruction | search | button | line | result | option
    text: str = ""
    key: str = ""
    values: tuple[str, ...] = ()
    selected: str = ""


@dataclass(frozen=True)
class Page:
    """What a session shows now: blocks to draw, and the actions it accepts."""

    kind: str
    blocks: tuple[Block, ...]
    clickables: tuple[str, ...]
    search: bool

    @property
    def actions(self) -> list[str]:
        head = [SEARCH_ACTION] if self.search else []
        return head + [f"click[{c}]" for c in self.clickables]

    @property
    def text(self) -> str:
        return "\n".join(_text_line(b) for b in self.blocks)


def _text_line(b: Block) -> str:
    if b.kind == "instruction":
        return f"Instruction: {b.text}"
    if b.kind == "search":
        return "[Search]"
    if b.kind == "button":
        return f"[{b.text}]"
    if b.kind == "result":
        return f"[{b.key.upper()}] {b.text}"
    if b.kind == "option":
        values = " ".join(f"[{v}]" for v in b.values)
        chosen = f" (selected: {b.selected})" if b.selected else ""
        return f"{b.text}: {values}{chosen}"
    return b.text


@dataclass
class Session:
    """Server-side state of one browsing session."""

    goal_index: int
    page: str = "search"
    query: str = ""
    results: tuple[int, ...] = ()
    page_no: int = 1
    product: int = -1
    selected: dict[str, str] = field(default_factory=dict)
    viewed: set[int] = field(default_factory=set)
    found: bool = False
    reward: float = 0.0
    bought: bool = False

    def key(self) -> tuple[Any, ...]:
        return (self.page, self.query, self.page_no, self.product, tuple(self.selected.items()))


@dataclass(frozen=True)
class Outcome:
    """The result of one action: the new page and what the action achieved."""

    page: Page
    valid: bool
    effective: bool
    done: bool
    reward: float
    info: dict[str, Any]


class Shop:
    """Catalog + BM25 index + sessions. Built once per server; not thread-safe by design
    (the server calls it from its single event-loop thread)."""

    def __init__(self, catalog: Catalog, max_sessions: int = 100_000,
                 search_cache: int = 4096) -> None:
        from rank_bm25 import BM25Okapi  # the env imports this module for parse_action only

        self.catalog = catalog
        corpus = [tokenize(" ".join([p.title, p.category, p.product_type,
                                     " ".join(p.attributes), p.description]))
                  for p in catalog.products]
        self.bm25 = BM25Okapi(corpus)
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.max_sessions = max_sessions
        self._cache: OrderedDict[tuple[str, ...], tuple[int, ...]] = OrderedDict()
        self._cache_size = search_cache

    # ------------------------------------------------------------------ sessions
    def reset(self, sid: str, goal_index: int) -> Page:
        if not 0 <= goal_index < len(self.catalog.goals):
            raise IndexError(f"goal {goal_index} out of range 0..{len(self.catalog.goals) - 1}")
        self.sessions.pop(sid, None)
        self.sessions[sid] = Session(goal_index)
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)
        return self.page(sid)

    def has(self, sid: str) -> bool:
        return sid in self.sessions

    def drop(self, sid: str) -> bool:
        return self.sessions.pop(sid, None) is not None

    def session(self, sid: str) -> Session:
        s = self.sessions[sid]
        self.sessions.move_to_end(sid)
        return s

    # ------------------------------------------------------------------ search
    def search(self, query: str) -> tuple[int, ...]:
        """Product indices ranked by BM25, best first, at most ``MAX_RESULTS``; cached."""
        tokens = tuple(tokenize(query)[:MAX_QUERY_TOKENS])
        hit = self._cache.get(tokens)
        if hit is not None:
            self._cache.move_to_end(tokens)
            return hit
        scores = self.bm25.get_scores(list(tokens))
        order = np.argsort(-scores, kind="stable")[:MAX_RESULTS]
        ranked = tuple(int(i) for i in order if scores[i] > 0)
        self._cache[tokens] = ranked
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return ranked

    # ------------------------------------------------------------------ actions
    def step(self, sid: str, action: str) -> Outcome:
        """Apply ``action`` to session ``sid``; invalid actions change nothing."""
        s = self.session(sid)
        before = self.page(sid)
        parsed = parse_action(action)
        if parsed is None or s.page == "done":
            return self._outcome(s, before, valid=False, effective=False)
        verb, arg = parsed
        if verb == "search":
            if not before.search or not tokenize(arg):
                return self._outcome(s, before, valid=False, effective=False)
            s.query, s.results, s.page_no, s.page = arg, self.search(arg), 1, "results"
            return self._outcome(s, self.page(sid), valid=True, effective=True)
        if arg not in before.clickables:
            return self._outcome(s, before, valid=False, effective=False)
        old = s.key()
        self._click(s, arg)
        return self._outcome(s, self.page(sid), valid=True, effective=s.key() != old)

    def _click(self, s: Session, name: str) -> None:
        if name == "back to search":
            s.page, s.query, s.results, s.page_no, s.product = "search", "", (), 1, -1
            s.selected = {}
        elif name == "next >":
            s.page_no += 1
        elif name == "< prev":
            if s.page == "results":
                s.page_no -= 1
            elif s.page == "item":
                s.page, s.product, s.selected = "results", -1, {}
            else:
                s.page = "item"
        elif name in ("description", "features"):
            s.page = name
        elif name == "buy now":
            self._buy(s)
        elif s.page == "results":
            s.page, s.product, s.selected = "item", self.catalog.by_asin[name.upper()], {}
            s.viewed.add(s.product)
            s.found = s.found or can_satisfy(self.goal(s), self.catalog.products[s.product])
        else:  # an option value on an item page
            for opt, values in self.catalog.products[s.product].options.items():
                if name in values:
                    s.selected[opt] = name

    def _buy(self, s: Session) -> None:
        result = score(self.goal(s), self.catalog.products[s.product], s.selected)
        s.page, s.bought, s.reward = "done", True, result.reward

    def _outcome(self, s: Session, page: Page, *, valid: bool, effective: bool) -> Outcome:
        info = {"success_find": s.found, "success_purchase": s.bought}
        done = s.page == "done"
        reward = s.reward if done and effective else 0.0
        return Outcome(page, valid, effective, done, reward, info)

    def goal(self, s: Session) -> Goal:
        return self.catalog.goals[s.goal_index]

    # ------------------------------------------------------------------ pages
    def page(self, sid: str) -> Page:
        s = self.sessions[sid]
        head = [Block("instruction", self.goal(s).instruction)]
        if s.page == "search":
            return Page("search", (*head, Block("search")), (), True)
        back = Block("button", "Back to Search", "back to search")
        prev = Block("button", "< Prev", "< prev")
        if s.page == "results":
            return self._results_page(s, head, back, prev)
        product = self.catalog.products[s.product]
        if s.page == "item":
            return self._item_page(s, product, head, back, prev)
        if s.page in ("description", "features"):
            body = [product.description] if s.page == "description" else product.features
            blocks = (*head, back, prev, *(Block("line", t) for t in body))
            return Page(s.page, blocks, ("back to search", "< prev"), False)
        chosen = ", ".join(f"{k}: {v}" for k, v in s.selected.items()) or "none"
        lines = ["Thank you for shopping with us!", f"Purchased: {product.title}",
                 f"Options: {chosen}", f"Your score (min 0.0, max 1.0): {s.reward:.4f}"]
        return Page("done", (*head, *(Block("line", t) for t in lines)), (), False)

    def _results_page(self, s: Session, head: list[Block], back: Block, prev: Block) -> Page:
        n = len(s.results)
        last = max(1, -(-n // RESULTS_PER_PAGE))
        blocks = [*head, back, Block("line", f"Page {s.page_no} (Total results: {n})")]
        clickables = ["back to search"]
        if s.page_no > 1:
            blocks.append(prev)
            clickables.append("< prev")
        if s.page_no < last:
            blocks.append(Block("button", "Next >", "next >"))
            clickables.append("next >")
        start = (s.page_no - 1) * RESULTS_PER_PAGE
        for idx in s.results[start:start + RESULTS_PER_PAGE]:
            p = self.catalog.products[idx]
            mark = " (viewed)" if idx in s.viewed else ""
            blocks.append(Block("result", f"{p.title} | ${p.price:.2f}{mark}", p.asin.lower()))
            clickables.append(p.asin.lower())
        if n == 0:
            blocks.append(Block("line", "No products match your search."))
        return Page("results", tuple(blocks), tuple(clickables), False)

    def _item_page(self, s: Session, p: Product, head: list[Block], back: Block,
                   prev: Block) -> Page:
        blocks = [*head, back, prev]
        clickables = ["back to search", "< prev"]
        for name, values in p.options.items():
            blocks.append(Block("option", name, values=tuple(values),
                                selected=s.selected.get(name, "")))
            clickables += values
        blocks += [Block("line", p.title), Block("line", f"Price: ${p.price:.2f}"),
                   Block("line", f"Rating: {p.rating:.1f}"),
                   Block("button", "Description", "description"),
                   Block("button", "Features", "features"),
                   Block("button", "Buy Now", "buy now")]
        clickables += ["description", "features", "buy now"]
        return Page("item", tuple(blocks), tuple(clickables), False)


def parse_action(action: object) -> tuple[str, str] | None:
    """``("search", query)`` or ``("click", normalized name)``; None for anything else."""
    if not isinstance(action, str) or len(action) > MAX_ACTION_CHARS:
        return None
    m = _ACTION.match(action)
    if m is None:
        return None
    verb, arg = m.group(1).lower(), m.group(2)
    if verb == "click":
        arg = _SPACES.sub(" ", arg).strip().lower()
    return verb, arg.strip()


def can_satisfy(goal: Goal, product: Product) -> bool:
    """Whether buying ``product`` with the right options would earn reward 1."""
    wanted = {name: value for name, value in goal.options.items()
              if value in product.options.get(name, [])}
    return score(goal, product, wanted).reward >= 1.0
