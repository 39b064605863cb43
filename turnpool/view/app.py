"""The viewer's HTTP side: the page (static files shipped with the package) and the JSON it
reads, over one file read at start (`turnpool.view.files.Run`).

Routes:

* ``GET /``, ``GET /static/{name}``: the page (plain HTML, JS and CSS; nothing from outside);
* ``GET /api/summary``: the file, its kind, counts, and the envs, groups and tags to filter by;
* ``GET /api/episodes?env=&group=&success=&offset=&limit=``: the episode rows
  (``success``: ``true``, ``false`` or ``unknown``; ``env`` matches the env type or the tag);
* ``GET /api/episodes/{id}``: one episode turn by turn, and whether it has boards;
* ``GET /api/board/{id}/{k}.png``: the board of its ``k``-th observation (404: none);
* ``GET /api/groups/{group}``: a group's members side by side (rewards, advantages);
* ``GET /api/trees/{group}``: a tree file's nodes of one group (the chosen path marked);
* ``POST /api/replay``: a record replayed here (`turnpool.rollout.replay`, sequential) and
  its first divergence (episode, turn, field, recorded and replayed), kept after the first
  call.
"""

from __future__ import annotations

import threading
from collections import Counter
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse, Response

from turnpool.view.boards import board, board_way
from turnpool.view.files import Episode, Run

#: the static files the page is made of, and their content types
STATIC = {"view.js": "text/javascript; charset=utf-8", "view.css": "text/css; charset=utf-8"}
#: most episode rows one /api/episodes call returns
MAX_ROWS = 1000


def create_app(run: Run) -> FastAPI:
    """The viewer's app over ``run``."""
    app = FastAPI(title="turnpool view", docs_url=None, redoc_url=None, openapi_url=None)
    by_id = {e.id: e for e in run.episodes}
    replays = _Replays(run)

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        return HTMLResponse(_static("index.html"))

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC:
            raise HTTPException(404, f"no static file {name!r}")
        return Response(_static(name), media_type=STATIC[name])

    @app.get("/api/summary")
    def summary() -> dict[str, Any]:
        return summarize(run)

    @app.get("/api/episodes")
    def episodes(env: str = "", group: str = "", success: str = "", offset: int = 0,
                 limit: int = 200) -> dict[str, Any]:
        rows = [e for e in run.episodes if matches(e, env, group, success)]
        limit = max(0, min(limit, MAX_ROWS))
        return {"total": len(rows),
                "episodes": [e.summary() for e in rows[max(0, offset):][:limit]]}

    @app.get("/api/episodes/{episode_id}")
    def episode(episode_id: int) -> dict[str, Any]:
        return detail(_episode(by_id, episode_id))

    @app.get("/api/board/{episode_id}/{k}.png")
    def board_png(episode_id: int, k: int) -> Response:
        png = board(_episode(by_id, episode_id), k)
        if png is None:
            raise HTTPException(404, "no board for this observation")
        return Response(png, media_type="image/png",
                        headers={"Cache-Control": "max-age=3600"})

    @app.get("/api/groups/{group:path}")
    def group(group: str) -> dict[str, Any]:
        members = [e for e in run.episodes if e.group == group]
        if not members:
            raise HTTPException(404, f"no group {group!r}")
        return group_view(group, members)

    @app.get("/api/trees/{group:path}")
    def tree(group: str) -> dict[str, Any]:
        nodes = [n for n in run.nodes if str(n["group_uid"]) == group]
        if not nodes:
            raise HTTPException(404, f"no tree for group {group!r}")
        return tree_view(group, nodes, run.episodes)

    @app.post("/api/replay")
    def replay() -> dict[str, Any]:
        if run.kind != "record":
            raise HTTPException(400, "only a record (--record) can be replayed")
        return replays.result()

    return app


def _static(name: str) -> str:
    return (resources.files("turnpool.view") / "static" / name).read_text(encoding="utf-8")


def _episode(by_id: dict[int, Episode], episode_id: int) -> Episode:
    e = by_id.get(episode_id)
    if e is None:
        raise HTTPException(404, f"no episode {episode_id}")
    return e


def summarize(run: Run) -> dict[str, Any]:
    """What the page's header and filters show."""
    eps = run.episodes
    return {"path": run.path, "kind": run.kind, "episodes": len(eps),
            "envs": dict(Counter(e.env_type or "?" for e in eps)),
            "tags": dict(Counter(e.tag for e in eps)),
            "groups": list(dict.fromkeys(e.group for e in eps)),
            "trees": list(dict.fromkeys(str(n["group_uid"]) for n in run.nodes)),
            "success": sum(1 for e in eps if e.success) / len(eps) if eps else 0.0,
            "has_success": any(e.success is not None for e in eps),
            "has_advantage": any(e.advantage is not None for e in eps),
            "replayable": run.kind == "record"}


def matches(e: Episode, env: str, group: str, success: str) -> bool:
    """Does episode ``e`` pass the filters (an empty filter passes all)?"""
    if env and env not in (e.env_type, e.tag):
        return False
    if group and e.group != group:
        return False
    wanted = {"true": True, "false": False, "unknown": None}.get(success.lower(), "any")
    return not success or wanted == "any" or e.success is wanted


def detail(e: Episode) -> dict[str, Any]:
    """One episode turn by turn."""
    return {**e.summary(), "steps": [s.to_dict() for s in e.steps], "final_obs": e.final_obs,
            "boards": board_way(e) is not None, "env_kwargs": e.env_kwargs}


def group_view(group: str, members: list[Episode]) -> dict[str, Any]:
    """A group side by side: each member's rewards per turn, score and advantage."""
    rewards = [e.score for e in members]
    return {"group": group, "mean_score": sum(rewards) / len(rewards),
            "members": [{**e.summary(), "rewards": [s.reward for s in e.steps],
                         "final_obs": e.final_obs, "boards": board_way(e) is not None}
                        for e in members]}


def tree_view(group: str, nodes: list[dict[str, Any]], episodes: list[Episode]
              ) -> dict[str, Any]:
    """A group's tree: every node (turn, env slot, actions, reward, score, kept, chosen)
    and, per node, an episode whose path runs through it (to open its turns)."""
    through: dict[str, int] = {}
    for e in episodes:
        if e.group == group:
            for s in e.steps:
                if s.node_id is not None:
                    # prefer the chosen path's episode for a node it shares with others
                    if s.node_id not in through or e.chosen:
                        through[s.node_id] = e.id
    out = []
    for n in nodes:
        r = n["record"]
        out.append({"node_id": n["node_id"], "parent_id": n["parent_id"], "turn": n["turn"],
                    "env_id": n["env_id"], "score": n["score"], "kept": n["kept"],
                    "chosen": n["chosen"], "actions": r.get("executed") or [],
                    "reward": r.get("reward"), "done": r.get("done"),
                    "episode": through.get(str(n["node_id"]))})
    return {"group": group, "nodes": out}


class _Replays:
    """A record's replay, run once on first request (others wait for it)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self._lock = threading.Lock()
        self._result: dict[str, Any] | None = None

    def result(self) -> dict[str, Any]:
        with self._lock:
            if self._result is None:
                self._result = self._replay()
            return self._result

    def _replay(self) -> dict[str, Any]:
        from turnpool.rollout.replay import replay

        try:
            report = replay(self.run.path, backend="sequential")
        except Exception as exc:  # noqa: BLE001 - an env that cannot be built, a bad file
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "first": None}
        first = report.first
        out: dict[str, Any] = {"ok": report.ok, "error": None, **report.to_dict(),
                               "first": None}
        if first is not None:
            out["first"] = {"episode": first.episode, "turn": first.turn,
                            "field": first.field, "recorded": first.recorded,
                            "replayed": first.replayed, "line": first.line,
                            "describe": first.describe()}
        return out


__all__ = ["create_app", "detail", "group_view", "matches", "summarize", "tree_view"]
