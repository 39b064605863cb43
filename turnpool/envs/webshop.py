"""The ``webshop_lite`` env: an agent shops on the local synthetic WebShop service over HTTP.

The lighter task (a made-up catalog, its own pages and reward); RAGEN's WebShop task is the
``webshop`` env (`turnpool.envs.webshop_ragen`).

The observation is the shop's page text followed by ``Available actions: ...``; actions are
``search[<query>]`` (on the search page) and ``click[<name>]`` for a name in that list. The
episode ends with ``click[buy now]`` (reward = the purchase's score, see
``turnpool.webshop.catalog``) or after ``max_steps`` actions (truncated).

Goals by seed and split, as in WebShop (with its 3,000 bundled goals: test 0-499, val 500-1499,
train 1500-2999; smaller catalogs shrink the test/val blocks to a sixth and a third)::

    test  -> seed % n_test
    val   -> n_test + seed % n_val
    train -> n_test + n_val + seed % (n_goals - n_test - n_val)

Pages depend only on the goal and the actions taken, never on the session id, so group members
that reset with one seed see identical pages. The session lives on the server, so
``get_state`` is ``(seed, actions so far)`` and ``set_state`` replays it on this env's own
session. Invalid actions (not in the list, too long, no searchable words, not text) are checked
here, before any request: ``action_is_valid=False``, no state change, one step used.

With no ``server_url`` the env starts one shop per process in a background thread (stopped at
exit). Each env keeps one keep-alive connection (`ShopConnection`) with a timeout on every
wait; an unreachable service raises `WebShopUnavailable` with what to do about it.

Example:
    >>> import turnpool
    >>> from turnpool.envs.webshop import oracle
    >>> env = turnpool.make("webshop_lite", split="test")
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(oracle(obs)[0])
    >>> info["action_is_valid"]
    True
"""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from http.client import HTTPConnection, HTTPException, HTTPSConnection, RemoteDisconnected
from typing import Any
from urllib.parse import urlsplit

from turnpool.envs.base import TextEnv
from turnpool.webshop.shop import MAX_ACTION_CHARS, SEARCH_ACTION, parse_action, tokenize

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
_INSTRUCTION = (
    "You are shopping online. Follow the instruction to find and buy the right product. "
    "On the search page use search[keywords]; on other pages use click[name] with a name from "
    "the available actions (a product id, an option value, next >, < prev, back to search, "
    "description, features, buy now). The episode ends when you buy.")

_meta_cache: dict[str, dict[str, Any]] = {}
_meta_lock = threading.Lock()


class WebShopUnavailable(RuntimeError):
    """The shop service could not be reached (or answered with an error)."""


class ShopConnection:
    """One keep-alive HTTP/1.1 connection to the shop, with a timeout on every socket wait.

    ``http.client`` rather than httpx, because the env's step *is* this round trip and the
    lighter client costs several times less latency and CPU per request (measured in
    docs/performance.md, WebShop). A request on a reused connection that the
    server had closed while idle is retried once on a new connection (the server never saw
    it); nothing else is retried, so an action is never applied twice.
    """

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server_url must look like http://host:port, got {url!r}")
        self.url = url
        self.prefix = parts.path.rstrip("/")
        self.host: str = parts.hostname
        self.port = parts.port
        self.timeout = timeout
        self.https = parts.scheme == "https"
        self._conn: HTTPConnection | None = None
        self._used = False

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                timeout: float | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        for attempt in (0, 1):
            if self._conn is None:
                factory = HTTPSConnection if self.https else HTTPConnection
                self._conn = factory(self.host, self.port, timeout=self.timeout)
                self._used = False
            if timeout is not None:  # this call only: the connection is closed after it
                self._conn.timeout = timeout
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(timeout)
            reused = self._used
            try:
                self._conn.request(method, self.prefix + path, body=data, headers=headers)
                reply = self._conn.getresponse()
                raw = reply.read()
            except (RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if reused and attempt == 0:
                    continue
                raise self._unreachable(exc) from exc
            except (OSError, HTTPException) as exc:
                self.close()
                raise self._unreachable(exc) from exc
            self._used = True
            if reply.status != 200:
                raise WebShopUnavailable(
                    f"webshop service at {self.url} answered {reply.status} to {method} "
                    f"{path}: {raw[:200].decode('utf-8', 'replace')}")
            return json.loads(raw)
        raise AssertionError("unreachable")

    def _unreachable(self, exc: BaseException) -> WebShopUnavailable:
        return WebShopUnavailable(
            f"webshop service at {self.url} is unreachable ({type(exc).__name__}: {exc}); "
            "start one with `turnpool webshop serve` and pass its URL as server_url, or leave "
            "server_url unset to start one in this process")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def split_sizes(n_goals: int) -> tuple[int, int]:
    """``(n_test, n_val)``: WebShop's 500 / 1000 when there are enough goals."""
    if n_goals < 3:
        raise ValueError(f"a webshop catalog needs at least 3 goals, got {n_goals}")
    return max(1, min(500, n_goals // 6)), max(1, min(1000, n_goals // 3))


def goal_index(seed: int, split: str, n_goals: int) -> int:
    """The goal a seed maps to in ``split`` (module docstring)."""
    n_test, n_val = split_sizes(n_goals)
    if split == "test":
        return seed % n_test
    if split == "val":
        return n_test + seed % n_val
    if split == "train":
        return n_test + n_val + seed % (n_goals - n_test - n_val)
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


class WebShopEnv(TextEnv):
    """Browse and buy on the WebShop service.

    Config: ``server_url`` (None: a shop started in this process), ``split`` or its RAGEN
    alias ``mode`` ("train" | "val" | "test"), ``max_steps`` (15), ``timeout`` (seconds per
    HTTP call, 10), ``max_search_chars`` (500), ``env_id`` (names this env's sessions; a random
    id by default, which never changes what pages show).
    """

    action_kind = "webshop"
    instruction = _INSTRUCTION

    def __init__(self, server_url: str | None = None, split: str | None = None,
                 mode: str | None = None, max_steps: int = 15, timeout: float = 10.0,
                 max_search_chars: int = 500, env_id: str | None = None,
                 **config: Any) -> None:
        split = split or mode or "train"
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        super().__init__(server_url=server_url, split=split, max_steps=max_steps,
                         timeout=timeout, max_search_chars=max_search_chars, **config)
        self.server_url = server_url.rstrip("/") if server_url else None
        self.split = split
        self.max_steps = int(max_steps)
        self.timeout = float(timeout)
        self.max_search_chars = int(max_search_chars)
        self.instance_id = env_id or uuid.uuid4().hex[:12]
        self._client: ShopConnection | None = None
        self.session: str | None = None
        self.goal: int = -1
        self.page = ""
        self.actions: list[str] = []
        self.history: list[str | None] = []
        self.terminated = False
        self.truncated = False
        self.found = False
        self.bought = False

    # ------------------------------------------------------------------ HTTP
    def _url(self) -> str:
        if self.server_url is None:
            from turnpool.webshop.server import shared_server_url

            self.server_url = shared_server_url()
        return self.server_url

    def _http(self) -> ShopConnection:
        if self._client is None:
            self._client = ShopConnection(self._url(), self.timeout)
        return self._client

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._http().request(method, path, body)

    def _n_goals(self) -> int:
        url = self._url()
        with _meta_lock:
            meta = _meta_cache.get(url)
        if meta is None:
            meta = self._call("GET", "/api/meta")
            with _meta_lock:
                _meta_cache[url] = meta
        return int(meta["n_goals"])

    # ------------------------------------------------------------------ env API
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        info.update(success_find=False, success_purchase=False, goal_index=self.goal)
        return obs, info

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.goal = goal_index(seed, self.split, self._n_goals())
        previous = self.session
        self.session = f"{self.instance_id}-{seed}"
        body: dict[str, Any] = {"session": self.session, "goal": self.goal}
        if previous and previous != self.session:
            body["drop"] = previous
        data = self._call("POST", "/api/reset", body)
        self.page, self.actions = data["page"], list(data["actions"])
        self.history = []
        self.terminated = self.truncated = self.found = self.bought = False
        return self._render_text()

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.session is None:
            raise RuntimeError("call reset() before step()")
        if self.terminated or self.truncated:
            return self._render_text(), 0.0, self.terminated, self.truncated, self._extra(
                valid=False, effective=False)
        text = action if self.is_valid_action(action) else None
        self.history.append(text)
        reward, valid, effective = 0.0, False, False
        if text is not None:
            data = self._call("POST", "/api/step", {"session": self.session, "action": text})
            self.page, self.actions = data["page"], list(data["actions"])
            valid, effective = bool(data["valid"]), bool(data["effective"])
            reward = float(data["reward"])
            self.terminated = bool(data["done"])
            self.found = bool(data["info"].get("success_find", False))
            self.bought = bool(data["info"].get("success_purchase", False))
        self.truncated = not self.terminated and len(self.history) >= self.max_steps
        info = self._extra(valid=valid, effective=effective)
        info["success"] = self.terminated and reward >= 1.0 - 1e-9
        return self._render_text(), reward, self.terminated, self.truncated, info

    def _extra(self, *, valid: bool, effective: bool) -> dict[str, Any]:
        return {"action_is_valid": valid, "action_is_effective": effective,
                "success_find": self.found, "success_purchase": self.bought}

    def is_valid_action(self, action: Any) -> bool:
        """Whether ``action`` is acceptable on the current page (no request is made)."""
        if not isinstance(action, str) or len(action) > MAX_ACTION_CHARS:
            return False
        try:
            action.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates cannot travel as JSON text
            return False
        parsed = parse_action(action)
        if parsed is None:
            return False
        verb, arg = parsed
        if verb == "search":
            return (SEARCH_ACTION in self.actions and len(arg) <= self.max_search_chars
                    and bool(tokenize(arg)))
        return f"click[{arg}]" in self.actions

    def _render_text(self) -> str:
        return f"{self.page}\n\nAvailable actions: {', '.join(self.actions)}"

    def anchor_obs(self) -> str:
        return self.page

    def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        if self.session is not None:
            try:
                client.request("DELETE", f"/api/session/{self.session}",
                               timeout=min(self.timeout, 2.0))
            except WebShopUnavailable as exc:  # best effort: the server may already be gone
                log.debug("could not drop webshop session %s: %s", self.session, exc)
        client.close()

    # ------------------------------------------------------------------ group copying
    def get_state(self) -> dict[str, Any]:
        """``{"seed", "history"}``: enough to rebuild the episode on another session."""
        return {"seed": self.seed, "history": list(self.history)}

    def set_state(self, state: Any) -> None:
        """Reset to the snapshot's seed and replay its actions on this env's own session."""
        if state.get("seed") is None:
            raise ValueError("cannot restore a webshop env that was never reset")
        self.reset(seed=int(state["seed"]))
        for action in state["history"]:
            self.step(action)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # sockets do not pickle; a copy opens its own connection
        return state


# ---------------------------------------------------------------------- scripted policy
_LINE_INSTRUCTION = re.compile(r"^Instruction: (.*)$", re.M)
_LINE_RESULT = re.compile(r"^\[([A-Z0-9]{10})\] (.*) \| \$([0-9.]+)( \(viewed\))?$", re.M)
_LINE_OPTION = re.compile(r"^([a-z][a-z ]*): ((?:\[[^\]]*\] ?)+)(?:\(selected: (.*)\))?$", re.M)
_GOAL = re.compile(
    r"^(?:i need|i am looking for|i want|find me|i would like) (?P<type>.+?) that is "
    r"(?P<attrs>.+?)(?:, with (?P<opts>.+?))?, and price lower than (?P<price>[0-9.]+) dollars$")
_GOAL_OPTION = re.compile(r"(?:^|, and )([a-z][a-z ]*): ([^,]+)")


def oracle(obs: str, env_config: dict[str, Any] | None = None) -> list[str]:
    """The next action for a page, from the page text alone (a scripted policy for tests).

    Search with the goal's product words, open the result that best matches them under the price
    bound, select the wanted options, buy. Returns ``[]`` when nothing is left to do.
    """
    m = _LINE_INSTRUCTION.search(obs)
    goal = _GOAL.match(m.group(1)) if m else None
    if goal is None:
        return []
    if SEARCH_ACTION in obs:
        return [f"search[{goal.group('type')} {goal.group('attrs')}]"]
    if "click[buy now]" in obs:
        wanted = dict(_GOAL_OPTION.findall(goal.group("opts") or ""))
        for name, values, selected in _LINE_OPTION.findall(obs):
            want = wanted.get(name)
            if want and f"[{want}]" in values and selected != want:
                return [f"click[{want}]"]
        return ["click[buy now]"]
    results = _LINE_RESULT.findall(obs)
    if results:
        kind = " ".join(tokenize(goal.group("type")))
        attrs = [set(tokenize(a)) for a in re.split(r", | and ", goal.group("attrs"))]
        bound = float(goal.group("price"))

        def rank(item: tuple[str, str, str, str]) -> tuple[bool, int, bool]:
            words = tokenize(item[1])
            return (f" {kind} " in f" {' '.join(words)} ", sum(a <= set(words) for a in attrs),
                    float(item[2]) < bound)

        best = max(results, key=rank)  # max keeps the first of equals: BM25 order breaks ties
        return [f"click[{best[0].lower()}]"]
    if "click[< prev]" in obs:
        return ["click[< prev]"]
    if "click[back to search]" in obs:
        return ["click[back to search]"]
    return []


WebShopEnv.oracle = staticmethod(oracle)
