"""The shop as a web service: FastAPI routes, HTML pages, and a uvicorn runner.

Routes (every page answers text for agents and HTML for people; pick with ``?format=text|html``
or the ``Accept`` header, text by default):

* ``GET /`` starts a browsing session for a person (``?goal=N``) and redirects to it;
* ``GET /s/{session}`` shows the session's page; ``GET /s/{session}/act?action=click[...]``
  (or ``?q=words`` for a search) applies an action and shows the new page;
* ``/ragen/...``: RAGEN's WebShop task on its real small set (`turnpool.webshop.ragen_web`);
* the agent API, JSON: ``GET /api/meta``, ``POST /api/reset {"session", "goal"}``,
  ``POST /api/step {"session", "action"}``, ``GET /api/page?session=``,
  ``DELETE /api/session/{session}``. Replies carry the page text, the available actions,
  ``valid``, ``effective``, ``done``, ``reward`` and ``info``.

The service binds 127.0.0.1 on a free port unless told otherwise. ``ShopServer`` runs uvicorn in
a background thread on a socket it bound itself, so the port is known before the first request
and early requests simply wait in the listen backlog.
"""

from __future__ import annotations

import asyncio
import atexit
import html
import itertools
import json
import logging
import os
import re
import threading
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

from turnpool.listen import UvicornThread, bind_socket
from turnpool.webshop.catalog import load_catalog
from turnpool.webshop.ragen_web import add_ragen_routes
from turnpool.webshop.shop import MAX_ACTION_CHARS, Outcome, Page, Shop

log = logging.getLogger(__name__)

_SESSION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}\Z")
_MAX_BODY = 64 * 1024


def create_app(catalog_path: str | None = None, latency_ms: float = 0.0) -> FastAPI:
    """The FastAPI app over one ``Shop`` (catalog loaded and BM25 index built once, here).

    ``latency_ms`` delays every agent-API reply without using CPU, to imitate a shop that sits
    across a network; it is 0 unless asked for.
    """
    shop = Shop(load_catalog(catalog_path))
    app = FastAPI(title="turnpool webshop", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.shop = shop
    add_ragen_routes(app)  # RAGEN's WebShop on its small set, under /ragen/
    _add_agent_api(app, shop, max(0.0, float(latency_ms)) / 1000.0)
    _add_pages(app, shop)
    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _wants(request: Request) -> str:
    """The reply format a request asks for: ``?format=``, else its ``Accept`` header, else
    text."""
    fmt = request.query_params.get("format", "")
    if fmt in ("text", "html", "json"):
        return fmt
    accept = request.headers.get("accept", "")
    if "text/html" in accept:
        return "html"
    if "application/json" in accept:
        return "json"
    return "text"


def _payload(page: Page, out: Outcome | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"page": page.text, "kind": page.kind, "actions": page.actions}
    if out is not None:
        body.update(valid=out.valid, effective=out.effective, done=out.done,
                    reward=out.reward, info=out.info)
    return body


def _render(request: Request, sid: str, page: Page, out: Outcome | None = None) -> Response:
    fmt = _wants(request)
    if fmt == "html":
        return HTMLResponse(render_html(sid, page, out))
    if fmt == "json":
        return JSONResponse(_payload(page, out))
    return PlainTextResponse(page.text + "\n\nAvailable actions: " + ", ".join(page.actions))


async def _body_of(request: Request) -> dict[str, Any] | None:
    """The request's JSON object, None when it is not one or is over `_MAX_BODY` bytes."""
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > _MAX_BODY:
        return None
    raw = await request.body()
    if len(raw) > _MAX_BODY:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _add_agent_api(app: FastAPI, shop: Shop, delay: float) -> None:
    """The JSON agent API under ``/api/``; ``delay`` seconds before each reset and step reply."""

    @app.get("/api/meta")
    async def meta() -> dict[str, Any]:
        return {"n_goals": len(shop.catalog.goals), "n_products": len(shop.catalog.products),
                "max_action_chars": MAX_ACTION_CHARS}

    @app.post("/api/reset")
    async def api_reset(request: Request) -> Response:
        data = await _body_of(request)
        if data is None:
            return _error(400, "body must be a JSON object under 64 KiB")
        sid, goal = data.get("session"), data.get("goal")
        if not isinstance(sid, str) or not _SESSION_ID.match(sid):
            return _error(400, "session must match [A-Za-z0-9_.:-]{1,128}")
        if not isinstance(goal, int) or not 0 <= goal < len(shop.catalog.goals):
            return _error(400, f"goal must be an int in 0..{len(shop.catalog.goals) - 1}")
        drop = data.get("drop")
        if isinstance(drop, str) and drop != sid:
            shop.drop(drop)
        page = shop.reset(sid, goal)
        if delay:
            await asyncio.sleep(delay)
        return JSONResponse(_payload(page))

    @app.post("/api/step")
    async def api_step(request: Request) -> Response:
        data = await _body_of(request)
        if data is None:
            return _error(400, "body must be a JSON object under 64 KiB")
        sid = data.get("session")
        if not isinstance(sid, str) or not shop.has(sid):
            return _error(404, f"unknown session {str(sid)[:128]!r}")
        out = shop.step(sid, data.get("action"))  # type: ignore[arg-type]
        if delay:
            await asyncio.sleep(delay)
        return JSONResponse(_payload(out.page, out))

    @app.get("/api/page")
    async def api_page(session: str = "") -> Response:
        if not shop.has(session):
            return _error(404, f"unknown session {session[:128]!r}")
        return JSONResponse(_payload(shop.page(session)))

    @app.delete("/api/session/{sid}")
    async def api_drop(sid: str) -> dict[str, bool]:
        return {"dropped": shop.drop(sid)}


def _add_pages(app: FastAPI, shop: Shop) -> None:
    """The pages for people: ``/`` starts a session, ``/s/{sid}`` shows and acts on it."""
    human_ids = itertools.count()

    @app.get("/")
    async def index(request: Request, goal: int = -1) -> Response:
        n = len(shop.catalog.goals)
        sid = f"web-{next(human_ids)}"
        shop.reset(sid, goal % n if goal >= 0 else 0)
        fmt = _wants(request)
        suffix = "" if fmt == "html" else f"?format={fmt}"
        return RedirectResponse(f"/s/{sid}{suffix}", status_code=303)

    @app.get("/s/{sid}")
    async def show(request: Request, sid: str, goal: int = 0) -> Response:
        if not _SESSION_ID.match(sid):
            return _error(400, "bad session id")
        if not shop.has(sid):
            shop.reset(sid, goal % len(shop.catalog.goals))
        return _render(request, sid, shop.page(sid))

    @app.get("/s/{sid}/act")
    async def act(request: Request, sid: str, action: str = "", q: str = "") -> Response:
        if not _SESSION_ID.match(sid) or not shop.has(sid):
            return _error(404, "unknown session")
        out = shop.step(sid, action if action else f"search[{q}]")
        if _wants(request) == "html":  # post/redirect/get: a reload shows, never re-acts
            keep = "?format=html" if request.query_params.get("format") == "html" else ""
            return RedirectResponse(f"/s/{sid}{keep}", status_code=303)
        return _render(request, sid, out.page, out)


# ---------------------------------------------------------------------- HTML
_CSS = """body{font-family:sans-serif;max-width:860px;margin:2em auto;color:#222}
.instruction{background:#f3f0e6;padding:.8em;border-radius:6px}
a.button{display:inline-block;margin:.2em;padding:.3em .8em;border:1px solid #888;
border-radius:4px;text-decoration:none;color:#222;background:#fafafa}
a.option{margin:.15em;padding:.2em .6em;border:1px solid #aaa;border-radius:12px;
text-decoration:none;color:#222}a.option.selected{background:#2a6;color:#fff}
.option-group{margin:.6em 0;line-height:2.2}.result{margin:.5em 0}.muted{color:#666}"""


def render_html(sid: str, page: Page, out: Outcome | None = None) -> str:
    """The page for a person: the same blocks as the text, with links that act."""

    def link(name: str, label: str, cls: str) -> str:
        href = f"/s/{quote(sid)}/act?action={quote('click[' + name + ']', safe='')}"
        return f'<a class="{cls}" href="{href}">{html.escape(label)}</a>'

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>WebShop</title>"
             f"<style>{_CSS}</style></head><body><h2>WebShop</h2>"]
    if out is not None and not out.valid:
        parts.append("<p class='muted'>That action is not available on this page.</p>")
    for b in page.blocks:
        if b.kind == "instruction":
            parts.append(f"<div class='instruction' id='instruction'>Instruction: "
                         f"{html.escape(b.text)}</div>")
        elif b.kind == "search":
            parts.append(f"<form id='search-form' method='get' action='/s/{quote(sid)}/act'>"
                         "<input id='search-input' name='q' size='60' maxlength='500' autofocus>"
                         " <button id='search-button' type='submit'>Search</button></form>")
        elif b.kind == "button":
            parts.append(link(b.key, b.text, "button"))
        elif b.kind == "result":
            parts.append(f"<div class='result'>{link(b.key, b.key.upper(), 'product-link')} "
                         f"{html.escape(b.text)}</div>")
        elif b.kind == "option":
            opts = " ".join(link(v, v, "option selected" if v == b.selected else "option")
                            for v in b.values)
            parts.append(f"<div class='option-group' data-option='{html.escape(b.text)}'>"
                         f"<b>{html.escape(b.text)}</b>: {opts}</div>")
        else:
            parts.append(f"<p>{html.escape(b.text)}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


# ---------------------------------------------------------------------- running it
def _uvicorn_server(app: Any) -> Any:
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_keep_alive=300, loop="asyncio")
    return uvicorn.Server(config)


class ShopServer:
    """The shop on ``host:port`` in a background thread; ``stop()`` is idempotent.

    Example:
        >>> with ShopServer() as server:
        ...     import httpx
        ...     httpx.get(server.url + "/api/meta").json()["n_goals"] > 0
        True
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 catalog_path: str | None = None, latency_ms: float = 0.0) -> None:
        self._runner = UvicornThread(_uvicorn_server(create_app(catalog_path, latency_ms)),
                                     bind_socket(host, port), "webshop")
        self.host, self.port, self.url = self._runner.host, self._runner.port, self._runner.url

    def stop(self, timeout: float = 5.0) -> None:
        self._runner.stop(timeout)

    def __enter__(self) -> ShopServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(host: str = "127.0.0.1", port: int = 0, catalog_path: str | None = None,
          latency_ms: float = 0.0, on_ready: Any = None) -> None:
    """Run the shop in the foreground until interrupted (Ctrl-C / SIGTERM)."""
    sock = bind_socket(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    server = _uvicorn_server(create_app(catalog_path, latency_ms))
    if on_ready is not None:
        on_ready(f"http://{bound_host}:{bound_port}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


_shared: ShopServer | None = None
_shared_pid = -1
_shared_lock = threading.Lock()


def shared_server_url() -> str:
    """The URL of this process's own shop, started on first use and stopped at exit.

    Keyed by process id: a forked child starts its own instead of talking to a thread that
    only exists in its parent.
    """
    global _shared, _shared_pid
    with _shared_lock:
        if _shared is None or _shared_pid != os.getpid():
            _shared = ShopServer()
            _shared_pid = os.getpid()
            atexit.register(_shared.stop)
            log.info("started a shared webshop server at %s", _shared.url)
        return _shared.url
