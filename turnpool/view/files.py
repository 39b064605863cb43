"""What ``turnpool view`` reads: any file turnpool writes, told apart by its content, and
read into one shape the page shows (`Run` of `Episode` of `Step`).

Kinds (`KINDS`), detected from the first line (a gzip file is opened as such, whatever its
name):

* ``rollout``: ``turnpool rollout --out`` JSONL, one `turnpool.rollout.trajectory.Trajectory`
  a line (a ``.parquet`` file is the same rows, nested values as JSON text);
* ``record``: ``turnpool rollout --record`` (`turnpool.rollout.record`), its header first;
* ``tree``: ``turnpool rollout --tree-out`` (`turnpool.rollout.tree.TreeNode` lines): each
  leaf's path from the reset state is an episode, and the nodes are kept for the tree view.

A `Step` is one turn: the observation the agent read before it, the reply (None in a record,
which keeps no text of the policy), the parsed and executed actions, validity, reward and
info. Episode ids are the order of the file (a record's own ``episode`` numbers), so a page
link names the same episode on every load.

    >>> import json, tempfile
    >>> from turnpool.rollout.trajectory import Trajectory, Turn, dumps
    >>> t = Trajectory(env_id=0, group_id=0, group_uid="0-0", tag="Bandit",
    ...                env_type="bandit", seed=3, turns=[Turn(state="pick", actions_left=1,
    ...                reward=1.0, executed=["phoenix"], format_valid=True)], success=True)
    >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as fh:
    ...     _ = fh.write(dumps(t) + "\\n")
    >>> run = load(fh.name)
    >>> run.kind, run.episodes[0].steps[0].obs, run.episodes[0].success
    ('rollout', 'pick', True)
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from turnpool.rollout.record import EpisodeRecord, RecordHeader, read_record
from turnpool.rollout.trajectory import Trajectory

KINDS = ("rollout", "record", "tree")
#: the Trajectory fields ``--out *.parquet`` stores as JSON text
_NESTED = ("turns", "messages", "rewards", "tokens", "token_samples")
_GZIP_MAGIC = b"\x1f\x8b"


class ViewError(ValueError):
    """A file ``turnpool view`` cannot read; the message names the file and why."""


@dataclass
class Step:
    """One turn as the page shows it."""

    turn: int
    obs: str
    reply: str | None
    actions: list[str]
    executed: list[str]
    valid: bool | None
    reward: float
    done: bool
    info: dict[str, Any]
    error: str | None = None
    node_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Episode:
    """One episode (a record's attempt, a tree's root-to-leaf path)."""

    id: int
    env_type: str | None
    tag: str
    group: str
    env_id: int
    seed: int | None
    steps: list[Step]
    final_obs: str
    success: bool | None
    score: float
    #: what RL consumes (``normalized_score``: penalty and group normalization); None if none
    advantage: float | None = None
    end_reason: str = ""
    chosen: bool | None = None
    error: str | None = None
    #: the env's keyword arguments where the file has them (a record's header)
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The episode list's row."""
        return {"id": self.id, "env_type": self.env_type, "tag": self.tag,
                "group": self.group, "env_id": self.env_id, "seed": self.seed,
                "success": self.success, "score": self.score, "advantage": self.advantage,
                "turns": len(self.steps), "end_reason": self.end_reason,
                "chosen": self.chosen, "error": self.error,
                "actions": [s.executed for s in self.steps]}

    def observations(self) -> list[str]:
        """Every observation in order: before each turn, then the last."""
        return [s.obs for s in self.steps] + [self.final_obs]


@dataclass
class Run:
    """A whole file, read."""

    path: str
    kind: str
    episodes: list[Episode]
    #: tree files: every node as written (`turnpool.rollout.tree.TreeNode.to_dict`)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    #: record files: the header, for a replay
    header: RecordHeader | None = None


def load(path: str | Path, env: str | None = None) -> Run:
    """Read ``path`` (kind detected); ``env`` names the env of a tree file, which does not
    (its boards are drawn only then). ViewError for anything else."""
    p = Path(path)
    try:
        first = _first_line(p)
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ViewError(f"{p}: cannot read ({exc})") from None
    if first is None:
        if p.suffix.lower() == ".parquet":
            return _load_rollout(p, _parquet_rows(p))
        raise ViewError(f"{p}: empty, or not a file turnpool writes")
    kind = detect(first, str(p))
    if kind == "record":
        return _load_record(p)
    rows = list(_json_lines(p))
    if kind == "tree":
        return _load_tree(p, _batched_nodes(rows), env)
    return _load_rollout(p, rows)


def detect(first: dict[str, Any], where: str = "file") -> str:
    """The kind of file whose first line is ``first``.

    >>> detect({"format": "turnpool-record", "version": 1})
    'record'
    >>> detect({"node_id": "0-0/0/1", "record": {}})
    'tree'
    """
    if first.get("format") == "turnpool-record":
        return "record"
    if "node_id" in first and "record" in first:
        return "tree"
    if "turns" in first and "env_id" in first:
        return "rollout"
    raise ViewError(f"{where}: not a rollout (--out), record (--record) or tree (--tree-out) "
                    f"file: its first line has none of their fields")


def _open_text(p: Path) -> IO[str]:
    with open(p, "rb") as probe:
        zipped = probe.read(2) == _GZIP_MAGIC
    return gzip.open(p, "rt", encoding="utf-8") if zipped else open(p, encoding="utf-8")


def _first_line(p: Path) -> dict[str, Any] | None:
    """The first non-empty line as JSON; None for an empty file or a parquet one."""
    with open(p, "rb") as probe:
        if probe.read(4) == b"PAR1":
            return None
    with _open_text(p) as fh:
        for line in fh:
            if line.strip():
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    raise ViewError(f"{p}: line 1 is not JSON") from None
                if not isinstance(d, dict):
                    raise ViewError(f"{p}: line 1 is not a JSON object")
                return d
    return None


def _json_lines(p: Path) -> Iterator[dict[str, Any]]:
    with _open_text(p) as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    raise ViewError(f"{p}: line {n} is not JSON") from None


def _parquet_rows(p: Path) -> list[dict[str, Any]]:
    from turnpool.extras import require

    pq = require("pyarrow.parquet", feature="turnpool view on .parquet", extra="data")
    rows: list[dict[str, Any]] = pq.read_table(p).to_pylist()
    for row in rows:
        for key in _NESTED:
            if isinstance(row.get(key), str):
                row[key] = json.loads(row[key])
    if rows and "turns" not in rows[0]:
        raise ViewError(f"{p}: a parquet file without trajectories (no turns column)")
    return rows


def _load_rollout(p: Path, rows: list[dict[str, Any]]) -> Run:
    """Trajectory rows as episodes. In files written before runs numbered their batches on,
    group ids start again in every batch (``--batches``), so where one id covers several
    seeds the seed joins the label."""
    episodes = [_episode_of(i, d) for i, d in enumerate(rows)]
    if len({(e.group, e.seed) for e in episodes}) > len({e.group for e in episodes}):
        for e in episodes:
            e.group = f"{e.group} seed {e.seed}"
    return Run(str(p), "rollout", episodes)


def _batched_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tree nodes with ids unique over the file. In older files node ids repeat in every
    batch of a multi-batch run, which writes batch after batch; a repeated id starts the next batch,
    whose nodes (and groups) then get a ``b<k>:`` prefix."""
    batches: list[int] = []
    batch, seen = 0, set[str]()
    for n in nodes:
        if n["node_id"] in seen:
            batch, seen = batch + 1, set()
        seen.add(n["node_id"])
        batches.append(batch)
    if not batch:
        return nodes

    def tagged(b: int, x: Any) -> Any:
        return None if x is None else f"b{b}:{x}"

    return [{**n, "node_id": tagged(b, n["node_id"]), "parent_id": tagged(b, n["parent_id"]),
             "group_uid": tagged(b, n["group_uid"])} for b, n in zip(batches, nodes)]


def _episode_of(i: int, d: dict[str, Any]) -> Episode:
    """A trajectory line as an episode."""
    try:
        t = Trajectory.from_dict(d)
    except TypeError as exc:
        raise ViewError(f"line {i + 1}: not a trajectory ({exc})") from None
    steps = [Step(k, turn.state, turn.llm_response, list(turn.actions), list(turn.executed),
                  turn.format_valid, float(turn.reward), turn.done, dict(turn.info),
                  turn.error, turn.node_id) for k, turn in enumerate(t.turns)]
    return Episode(i, t.env_type, t.tag, t.group_uid, t.env_id, t.seed, steps, t.final_state,
                   t.success, float(t.score), float(t.normalized_score), t.end_reason,
                   t.chosen, t.error)


def _load_record(p: Path) -> Run:
    from turnpool.rollout.record import RecordError

    try:
        header, records = read_record(p)
        episodes = [_record_episode(r, header) for r in records]
    except RecordError as exc:
        raise ViewError(str(exc)) from None
    return Run(str(p), "record", episodes, header=header)


def _record_episode(r: EpisodeRecord, header: RecordHeader) -> Episode:
    obs = [str(r.reset["obs"])] + [str(s["obs"]) for s in r.steps]
    steps = []
    for k, s in enumerate(r.steps):
        sent = [str(a) for a in s["actions"]]
        info = {"info_sha256": s["info_sha256"], "n_executed": s["n_executed"],
                "failure": s["failure"], "terminated": s["terminated"],
                "truncated": s["truncated"]}
        steps.append(Step(int(s["turn"]), obs[k], None, sent, sent[: int(s["n_executed"])],
                          None, float(s["reward"]), bool(s["terminated"] or s["truncated"]),
                          info, s["error"]))
    last = r.steps[-1] if r.steps else {}
    reason = ("terminated" if last.get("terminated") else "truncated" if last.get("truncated")
              else "error" if last.get("error") else "")
    # a group is its pool group and its seed (the group's seed names its batch)
    group = f"{r.env_id // header.group_n}/seed {r.seed}"
    return Episode(r.episode, r.env_type, r.tag, group, r.env_id, r.seed, steps, obs[-1],
                   None, float(sum(s.reward for s in steps)), None, reason, None,
                   last.get("error"), _kwargs_of(header, r.env_id))


def _kwargs_of(header: RecordHeader, env_id: int) -> dict[str, Any]:
    """The kwargs ``env_id`` was built with in the recorded layout (its spec's and its
    member's)."""
    start = 0
    for spec in header.specs:
        size = spec.n_groups * header.group_n
        if env_id < start + size:
            member = (env_id - start) % header.group_n
            extra = spec.member_kwargs[member] if member < len(spec.member_kwargs) else {}
            return {**spec.env_kwargs, **extra}
        start += size
    return {}


def _load_tree(p: Path, nodes: list[dict[str, Any]], env: str | None) -> Run:
    """Each leaf's path as an episode; nodes kept for the tree view."""
    by_id = {n["node_id"]: n for n in nodes}
    parents = {n["parent_id"] for n in nodes}
    episodes: list[Episode] = []
    for leaf in (n for n in nodes if n["node_id"] not in parents):
        path = [leaf]
        while path[-1].get("parent_id") in by_id:
            path.append(by_id[path[-1]["parent_id"]])
        path.reverse()
        steps = [_node_step(n) for n in path]
        info = leaf["record"].get("info") or {}
        # a node keeps the observation before its turn; the env's info has the one after
        final = info.get("anchor_obs")
        episodes.append(Episode(
            len(episodes), env, "tree", str(leaf["group_uid"]), int(leaf["env_id"]), None,
            steps, final if isinstance(final, str) else "",
            bool(info["success"]) if "success" in info else None,
            float(sum(s.reward for s in steps)), None, "", bool(leaf.get("chosen")),
            leaf["record"].get("error")))
    return Run(str(p), "tree", episodes, nodes=nodes)


def _node_step(n: dict[str, Any]) -> Step:
    r = n["record"]
    return Step(int(n["turn"]), str(r.get("state", "")), r.get("llm_response"),
                list(r.get("actions") or []), list(r.get("executed") or []),
                r.get("format_valid"), float(r.get("reward") or 0.0), bool(r.get("done")),
                dict(r.get("info") or {}), r.get("error"), str(n["node_id"]))


__all__ = ["KINDS", "Episode", "Run", "Step", "ViewError", "detect", "load"]
