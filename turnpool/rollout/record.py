"""Record files: every env transition of a rollout, kept so that it can be replayed
(``turnpool rollout --record FILE``, ``turnpool replay FILE``, `turnpool.rollout.replay`).

In an async rollout env steps interleave with generation in an order that depends on timing,
but each env's transitions are a function of its seed and of the actions it was sent. A record
keeps, per episode attempt, exactly that: which env (its id in the recorded pool layout, whose
type and kwargs the header holds), the seed of its reset, and for every pool call of its
episode the actions sent and what the pool returned. The hook is
`turnpool.rollout.episode.TurnRunner.record`, which the lock-step collector and the async
driver both call with the pool's `TurnResult`, so both modes record the same lines for the
same episodes (the header's ``collector_mode`` aside).

The file is JSON lines, gzip-compressed when its name ends in ``.gz`` (read either way).
Line 1 is the header; then one line per episode attempt, in the order the collector finished
them (a batch's envs in env id order, then their retries), every line canonical JSON
(`turnpool.rollout.trajectory.canonical`)::

    {"collector_mode": "async", "format": "turnpool-record", "group_n": 8,
     "max_actions_per_turn": 1, "max_turn": 1, "ragen_version": "v1",
     "specs": [{"env_kwargs": {...}, "env_type": "bandit", "member_kwargs": [],
                "n_groups": 1250, "tag": "Bandit"}], "turnpool": "0.1.0", "version": 1}
    {"attempt": 0, "batch": 0, "env_id": 0, "env_type": "bandit", "episode": 0,
     "reset": {"info_sha256": "...", "obs": "..."}, "seed": 10000,
     "steps": [{"actions": ["phoenix"], "error": null, "failure": null, "info_sha256": "...",
                "n_executed": 1, "obs": "...", "reward": 1.0, "terminated": true,
                "truncated": false, "turn": 0}], "tag": "Bandit"}

A step is one turn's pool call (under RAGEN v2 each action of the turn is its own call and
the results are merged, as the collector merges them; the header's ``ragen_version`` says
so); a turn whose reply executed nothing called nothing and has no step, so ``turn`` counts
the episode's turns, not its steps. Failed attempts are recorded too (a retried episode has
one line per attempt): what came back before the failure is as much the env's as any other
transition. ``obs`` is kept as text: it is what the agent read and what a divergence report
shows. ``info`` is kept as the first 128 bits of the sha256 of its canonical JSON: infos repeat
the observation (``anchor_obs``) and some envs put whole pages in them, and the digest keeps
the file about the size of the observations while any changed byte still shows. An env whose
reset failed has ``seed`` null and nothing to replay.

    >>> import io
    >>> from turnpool.pool import EnvGroupSpec
    >>> spec = EnvGroupSpec("Bandit", "bandit", 2, {"lo_arm_name": "phoenix"})
    >>> buf = io.StringIO()
    >>> header = record_header([spec], group_n=1, collector_mode="async", ragen_version="v1",
    ...                        max_turn=1, max_actions_per_turn=1, version="0.1.0")
    >>> Recorder(buf, header).episodes
    0
    >>> parse_header(json.loads(buf.getvalue()), "f.jsonl").specs[0].env_kwargs
    {'lo_arm_name': 'phoenix'}
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from turnpool.pool import EnvGroupSpec, TurnResult
from turnpool.rollout.episode import EpisodeState
from turnpool.rollout.trajectory import canonical, dumps_plain, plain_json
from turnpool.worker.failures import failure_of

#: the ``format`` of a record's header line, and the versions this module reads
FORMAT = "turnpool-record"
VERSION = 1
#: what a step compares, in the order a divergence is looked for (``turn`` and ``actions``
#: are the step's input, not its result)
STEP_FIELDS = ("obs", "reward", "terminated", "truncated", "n_executed", "error", "failure",
               "info_sha256")
RESET_FIELDS = ("obs", "info_sha256")
_GZIP_MAGIC = b"\x1f\x8b"


class RecordError(ValueError):
    """A file that is not a turnpool record, or a damaged one; the message names the file
    and line."""


def info_digest(info: Mapping[str, Any]) -> str:
    """The first 128 bits (hex) of the sha256 of ``info``'s canonical JSON."""
    return hashlib.sha256(canonical(info).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def step_fields(result: TurnResult) -> dict[str, Any]:
    """What a step records of a pool result, as plain JSON values (`STEP_FIELDS`)."""
    info = result.info
    return {"obs": plain_json(result.obs), "reward": plain_json(result.reward_sum),
            "terminated": plain_json(result.terminated),
            "truncated": plain_json(result.truncated),
            "n_executed": plain_json(result.n_executed), "error": plain_json(result.error),
            "failure": None if result.error is None else failure_of(info).value,
            "info_sha256": info_digest(info)}


def reset_fields(obs: Any, info: Mapping[str, Any]) -> dict[str, Any]:
    """What a record keeps of a reset (`RESET_FIELDS`)."""
    return {"obs": plain_json(obs), "info_sha256": info_digest(info)}


def record_header(specs: Sequence[EnvGroupSpec], *, group_n: int, collector_mode: str,
                  ragen_version: str, max_turn: int, max_actions_per_turn: int,
                  version: str) -> dict[str, Any]:
    """The header line: the pool layout to rebuild (``specs``, ``group_n``) and the settings
    that decide how a turn steps (``ragen_version``: v2 steps one action per call); the rest
    says what produced the file. ValueError for a spec that a file cannot hold (an env given
    as a factory, kwargs that are not JSON)."""
    out = []
    for spec in specs:
        if not isinstance(spec.env_type, str):
            raise ValueError(f"tag {spec.tag!r}: an env built from a factory cannot be "
                             f"recorded; register it and name it")
        try:
            kwargs = json.loads(json.dumps(dict(spec.env_kwargs), allow_nan=False))
            members = json.loads(json.dumps([dict(m) for m in spec.member_kwargs],
                                            allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tag {spec.tag!r}: its env kwargs cannot be recorded as JSON "
                             f"({exc})") from None
        out.append({"tag": spec.tag, "env_type": spec.env_type, "n_groups": spec.n_groups,
                    "env_kwargs": kwargs, "member_kwargs": members})
    return {"format": FORMAT, "version": VERSION, "turnpool": version,
            "collector_mode": collector_mode, "ragen_version": ragen_version,
            "max_turn": max_turn, "max_actions_per_turn": max_actions_per_turn,
            "group_n": group_n, "specs": out}


class Recorder:
    """Writes a record to ``dest``: the header at once, then one line per episode attempt
    when the collector finishes it (`turnpool.rollout.collector.TrajectoryCollector.record_to`
    calls `begin` after each reset and `finish` after each round of play; `TurnRunner` calls
    `step`). ``episodes`` counts the lines written."""

    def __init__(self, dest: IO[str], header: Mapping[str, Any]) -> None:
        self.dest = dest
        self.episodes = 0
        self.batches = 0
        self._open: dict[int, tuple[EpisodeState, dict[str, Any]]] = {}
        dest.write(canonical(header) + "\n")

    def begin(self, eps: Sequence[EpisodeState], obs: Sequence[Any],
              infos: Sequence[Mapping[str, Any]], attempt: int) -> None:
        """Episodes just reset (``obs``/``infos`` as the pool returned them); ``attempt`` 0
        starts a batch, a retry counts up."""
        if attempt == 0:
            self.batches += 1
        for ep, o, info in zip(eps, obs, infos):
            self._open[id(ep)] = (ep, {
                "batch": self.batches - 1, "attempt": attempt, "env_id": ep.env_id,
                "tag": ep.tag, "env_type": ep.prompt.spec.env_type,
                "seed": plain_json(ep.seed),
                "reset": reset_fields(o, info), "steps": []})

    def step(self, ep: EpisodeState, actions: Sequence[Any], result: TurnResult) -> None:
        """One pool call of ``ep``'s latest turn: the actions sent, what came back."""
        entry = self._open.get(id(ep))
        if entry is None:  # an episode begun before recording started
            return
        entry[1]["steps"].append({"turn": len(ep.turns) - 1, "actions": plain_json(actions),
                                  **step_fields(result)})

    def finish(self, eps: Sequence[EpisodeState]) -> None:
        """Write the lines of ``eps`` (played to their end), in order, and flush."""
        for ep in eps:
            entry = self._open.pop(id(ep), None)
            if entry is None:
                continue
            line = entry[1]
            line["episode"] = self.episodes
            self.episodes += 1
            self.dest.write(dumps_plain(line) + "\n")  # built of plain values
        self.dest.flush()


def open_for_writing(path: str | Path) -> IO[str]:
    """A text file to write a record to (gzip when ``path`` ends in ``.gz``); the caller
    closes it."""
    p = Path(path)
    if p.suffix.lower() == ".gz":
        return gzip.open(p, "wt", encoding="utf-8")
    return open(p, "w", encoding="utf-8")  # noqa: SIM115 - returned open


# ---------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class RecordHeader:
    """A record's header line, read back (`parse_header`)."""

    specs: list[EnvGroupSpec]
    group_n: int
    ragen_version: str
    collector_mode: str
    turnpool: str
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def singly(self) -> bool:
        """Each action of a turn was its own pool call (RAGEN v2)."""
        return self.ragen_version == "v2"

    @property
    def num_envs(self) -> int:
        return sum(s.n_groups for s in self.specs) * self.group_n


@dataclass
class EpisodeRecord:
    """One episode attempt of a record: env, seed, the reset and the steps, as read."""

    episode: int
    env_id: int
    tag: str
    env_type: str
    seed: int | None
    reset: dict[str, Any]
    steps: list[dict[str, Any]]
    line: int


def read_record(path: str | Path
                ) -> tuple[RecordHeader, Generator[EpisodeRecord, None, None]]:
    """The header of the record at ``path`` and an iterator over its episodes (read as
    they are consumed). RecordError names the file and line of anything that is not a
    record; OSError is left to the caller (a file that cannot be opened)."""
    p = Path(path)
    with open(p, "rb") as probe:
        zipped = probe.read(2) == _GZIP_MAGIC
    fh: IO[str] = (gzip.open(p, "rt", encoding="utf-8") if zipped
                   else open(p, encoding="utf-8"))
    try:
        first = _line(fh, p, 1)
        if first is None:
            raise RecordError(f"{p}: empty file, not a turnpool record")
        header = parse_header(_json(first, p, 1), str(p))
    except BaseException:
        fh.close()
        raise
    return header, _episodes(fh, p, header)


def parse_header(d: Any, where: str) -> RecordHeader:
    """The header line ``d`` (parsed JSON) as a `RecordHeader`; RecordError if it is none."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise RecordError(f"{where}: not a turnpool record (line 1 has no "
                          f"\"format\": \"{FORMAT}\"; write one with turnpool rollout --record)")
    if d.get("version") != VERSION:
        raise RecordError(f"{where}: record version {d.get('version')!r}; this turnpool "
                          f"reads version {VERSION}")
    try:
        specs = [EnvGroupSpec(str(s["tag"]), _str(s["env_type"]), _int(s["n_groups"]),
                              _dict(s["env_kwargs"]),
                              tuple(_dict(m) for m in s["member_kwargs"]))
                 for s in d["specs"]]
        header = RecordHeader(specs=specs, group_n=_int(d["group_n"]),
                              ragen_version=_str(d["ragen_version"]),
                              collector_mode=_str(d["collector_mode"]),
                              turnpool=_str(d["turnpool"]), raw=d)
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"{where}: line 1: a damaged record header ({_what(exc)})") from None
    if not specs or header.group_n < 1:
        raise RecordError(f"{where}: line 1: the header names no envs")
    return header


def _episodes(fh: IO[str], p: Path, header: RecordHeader
              ) -> Generator[EpisodeRecord, None, None]:
    with fh:
        n = 1
        while True:
            n += 1
            text = _line(fh, p, n)
            if text is None:
                return
            yield _episode(_json(text, p, n), p, n, header)


def _episode(d: Any, p: Path, n: int, header: RecordHeader) -> EpisodeRecord:
    try:
        if not isinstance(d, dict):
            raise TypeError("not an object")
        seed = d["seed"]
        rec = EpisodeRecord(episode=_int(d["episode"]), env_id=_int(d["env_id"]),
                            tag=_str(d["tag"]), env_type=_str(d["env_type"]),
                            seed=None if seed is None else _int(seed), reset=_dict(d["reset"]),
                            steps=[_dict(s) for s in d["steps"]], line=n)
        for key in RESET_FIELDS:
            rec.reset[key]  # noqa: B018 - a missing field is a damaged line
        for step in rec.steps:
            _int(step["turn"])
            if not isinstance(step["actions"], list) or not step["actions"]:
                raise ValueError("a step without actions")
            for key in STEP_FIELDS:
                step[key]  # noqa: B018
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"{p}: line {n}: a damaged episode line ({_what(exc)})") from None
    if not 0 <= rec.env_id < header.num_envs:
        raise RecordError(f"{p}: line {n}: env {rec.env_id} is not in the recorded pool "
                          f"({header.num_envs} envs)")
    return rec


def _line(fh: IO[str], p: Path, n: int) -> str | None:
    """The next non-empty line (None at the end); RecordError for bytes that are no text."""
    try:
        while True:
            text = fh.readline()
            if not text:
                return None
            if text.strip():
                return text
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, OSError) as exc:
        raise RecordError(f"{p}: line {n}: not a turnpool record ({_what(exc)})") from None


def _json(text: str, p: Path, n: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{p}: line {n}: not JSON ({exc.msg}); not a turnpool record"
                          ) from None


def _what(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"no field {exc.args[0]!r}"
    return f"{type(exc).__name__}: {exc}"


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an integer, got {v!r}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {v!r}")
    return v


def _dict(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise TypeError(f"expected an object, got {type(v).__name__}")
    return v
