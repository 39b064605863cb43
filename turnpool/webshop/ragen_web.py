"""RAGEN's WebShop (the small set) on the shop service, for people and for scripts.

Routes, added to the app of `turnpool.webshop.server` (text by default, HTML with
``?format=html`` or an ``Accept: text/html`` header):

* ``GET /ragen/?seed=N&split=test`` starts a session on the goal RAGEN gives that seed in that
  split and redirects to it;
* ``GET /ragen/s/{session}`` shows the page: RAGEN's ``[SEP]`` page text and its available
  actions (HTML: the same pieces, a search box when the page has one, a link per action);
* ``GET /ragen/s/{session}/act?action=click[...]`` (or ``?q=words``) applies an action.

Pages, actions and rewards are those of the ``webshop`` env (`turnpool.webshop.ragen_shop`).
"""

from __future__ import annotations

import html
import itertools
from collections import OrderedDict
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)

from turnpool.webshop.data import goal_for_seed
from turnpool.webshop.ragen_shop import MAX_ACTION_CHARS, RagenShop, ShopState, shared_shop

SPLITS = ("train", "val", "test")


def add_ragen_routes(app: FastAPI, max_sessions: int = 10_000) -> None:
    """Add the ``/ragen/`` pages to ``app`` (the shop is built on the first request)."""
    sessions: OrderedDict[str, ShopState] = OrderedDict()
    ids = itertools.count()

    def fmt(request: Request) -> str:
        chosen = request.query_params.get("format", "")
        if chosen in ("text", "html"):
            return chosen
        return "html" if "text/html" in request.headers.get("accept", "") else "text"

    def show(request: Request, sid: str, shop: RagenShop, state: ShopState,
             note: str = "") -> Response:
        if fmt(request) == "html":
            return HTMLResponse(_html(sid, shop, state, note))
        text = shop.observation(state) + "\n\nAvailable actions: " + ", ".join(
            shop.actions(state))
        return PlainTextResponse(text + (f"\n\n{note}" if note else ""))

    @app.get("/ragen/")
    async def ragen_index(request: Request, seed: int = 0, split: str = "test") -> Response:
        if split not in SPLITS:
            return JSONResponse({"error": f"split must be one of {SPLITS}"}, status_code=400)
        shop = shared_shop()
        sid = f"ragen-{next(ids)}"
        sessions[sid] = ShopState(goal_for_seed(abs(seed), split, len(shop.data.goals)))
        while len(sessions) > max_sessions:
            sessions.popitem(last=False)
        keep = "?format=html" if request.query_params.get("format") == "html" else ""
        return RedirectResponse(f"/ragen/s/{sid}{keep}", status_code=303)

    @app.get("/ragen/s/{sid}")
    async def ragen_show(request: Request, sid: str) -> Response:
        state = sessions.get(sid)
        if state is None:
            return JSONResponse({"error": "unknown session"}, status_code=404)
        return show(request, sid, shared_shop(), state)

    @app.get("/ragen/s/{sid}/act")
    async def ragen_act(request: Request, sid: str, action: str = "", q: str = ""
                        ) -> Response:
        state = sessions.get(sid)
        if state is None:
            return JSONResponse({"error": "unknown session"}, status_code=404)
        shop = shared_shop()
        text = action if action else f"search[{q}]"
        out = shop.step(state, text[:MAX_ACTION_CHARS + 1])
        if fmt(request) == "html":  # post/redirect/get: a reload shows, never re-acts
            keep = "?format=html" if request.query_params.get("format") == "html" else ""
            return RedirectResponse(f"/ragen/s/{sid}{keep}", status_code=303)
        note = f"reward: {out.reward!r}, done: {out.done}" if out.done else ""
        return show(request, sid, shop, state, note)


def _html(sid: str, shop: RagenShop, state: ShopState, note: str) -> str:
    pieces, has_search, _ = shop.page(state)
    actions = shop.actions(state)
    base = f"/ragen/s/{quote(sid)}/act"
    parts: list[Any] = ["<!doctype html><html><head><meta charset='utf-8'>",
                        "<title>WebShop (RAGEN)</title></head><body>"]
    parts += [f"<p>{html.escape(p)}</p>" for p in pieces]
    if has_search:
        parts.append(f"<form action='{base}' method='get'><input type='hidden' name='format' "
                     "value='html'><input name='q' placeholder='Search...'>"
                     "<button type='submit'>Search</button></form>")
    for a in actions:
        if a.startswith("click["):
            href = f"{base}?format=html&action={quote(a, safe='')}"
            parts.append(f"<a href='{href}'>{html.escape(a[6:-1])}</a> ")
    if state.kind == "done":
        parts.append(f"<p>Reward: {state.reward!r}</p><p><a href='/ragen/?format=html'>"
                     "Next goal</a></p>")
    if note:
        parts.append(f"<p>{html.escape(note)}</p>")
    parts.append("</body></html>")
    return "".join(parts)
