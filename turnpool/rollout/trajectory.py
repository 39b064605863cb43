"""Trajectories as Python objects and as JSONL (one trajectory per line).

The JSONL form is canonical (sorted keys, no timing data), so the same config and seed give a
byte-identical file on every backend, worker count and start method.

    >>> t = Trajectory(env_id=0, group_id=0, group_uid="0-0", tag="SimpleSokoban",
    ...                env_type="sokoban", seed=10000)
    >>> Trajectory.from_dict(t.to_dict()) == t
    True

Token level: when the policy reports tokens (`turnpool.policies.base.TokenPolicy`), each
`Turn` carries ``prompt_ids`` (the tokens added before its reply: the whole prompt on the first
turn, the env/template tokens since the previous reply after that), ``response_ids`` and
``logprobs``; `Trajectory.token_view` joins them into the one sequence a trainer consumes,
with ``loss_mask`` 1 on model tokens and 0 on env/template tokens, and the JSONL line carries
it under ``tokens``. A turn that starts over from a whole prompt (``per_turn`` history mode, a
chat endpoint, a prompt cut to ``max_input_tokens``) starts a new sample:
`Trajectory.token_samples` gives one `TokenView` per sample, each exactly what the model saw
and sampled, and the JSONL line carries them under ``token_samples``. ``token_path`` says how
a turn's ids were obtained: ``"tokens"`` (token ids in and out, exact) or ``"chat"`` (a chat
endpoint tokenized the chat itself). Text-only turns leave these fields out of the JSONL.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

import numpy as np

from turnpool.policies.base import Message


@dataclass
class Turn:
    """One LLM turn: the state it saw, what it said, what ran, what came back."""

    state: str
    actions_left: int
    anchor_obs: str = ""
    llm_raw_response: str = ""
    llm_response: str = ""
    format_valid: bool = False
    actions: list[str] = field(default_factory=list)
    n_valid: int = 0
    executed: list[str] = field(default_factory=list)
    reward: float = 0.0
    penalized: bool = False
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    step_group_uid: str = ""
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    logprobs: list[float] | None = None
    #: False when ``prompt_ids`` is a whole prompt that does not continue the earlier turns
    prompt_extends: bool | None = None
    #: "tokens" (ids in, ids out) or "chat" (the server tokenized a chat); None: no tokens
    token_path: str | None = None
    #: tree rollouts: this turn's node in its group's tree, and the node of the turn before
    #: it on the same path (None on the first turn); None outside tree modes
    node_id: str | None = None
    parent_id: str | None = None

    @property
    def manager_invalid_action(self) -> bool:
        """No valid action at all in the reply (RAGEN v2's ``manager_invalid_action``): the
        env never ran, and v2's next prompt says so."""
        return self.n_valid == 0 and not self.executed


#: Turn fields that exist only for token-level turns (left out of text-only JSONL).
TOKEN_FIELDS = ("prompt_ids", "response_ids", "logprobs", "prompt_extends", "token_path")
#: Turn and Trajectory fields that exist only in tree rollouts (left out of the JSONL of
#: independent episodes, which stays byte for byte what it was)
TURN_TREE_FIELDS = ("node_id", "parent_id")
TREE_FIELDS = ("node_id", "parent_id", "branch_turn", "chosen")


@dataclass(frozen=True)
class TokenView:
    """A token-level trajectory as one sequence: ``prompt_ids`` (the first prompt) then
    ``response_ids`` (replies and the env/template tokens between them), ``loss_mask`` and
    ``logprobs`` aligned to ``response_ids`` (0.0 under env/template tokens)."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]

    def to_dict(self) -> dict[str, list[int] | list[float]]:
        return {"prompt_ids": self.prompt_ids, "response_ids": self.response_ids,
                "loss_mask": self.loss_mask, "logprobs": self.logprobs}


@dataclass
class Trajectory:
    """One env's episode. ``score`` is the unpenalized reward sum; ``normalized_score`` is
    what RL consumes (penalty added, then RAGEN's group normalization)."""

    env_id: int
    group_id: int
    group_uid: str
    tag: str
    env_type: str
    seed: int | None  # None: the env failed to reset
    messages: list[Message] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    final_state: str = ""
    num_actions: int = 0
    penalty: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    end_reason: str = "running"
    error: str | None = None
    #: the failure class of ``error`` (`turnpool.worker.failures.FAILURE_CLASSES`), None if none
    failure: str | None = None
    score: float = 0.0
    normalized_score: float = 0.0
    gen_batch: int = 0
    #: tree rollouts (`turnpool.rollout.tree`): the node of the last turn, the node this
    #: episode branched off its group at (the last turn it shares with another member;
    #: None: it shares none), the turn at which it branched (its first own turn), and
    #: whether it is its group's chosen path (best_of_n / beam; None in shared_prefix)
    node_id: str | None = None
    parent_id: str | None = None
    branch_turn: int | None = None
    chosen: bool | None = None
    #: multi-player games (`turnpool.rollout.seats`): the player whose episode this is;
    #: None (and left out of the JSONL) for one-player envs
    seat: int | None = None

    @property
    def rewards(self) -> list[float]:
        """Per-turn rewards (each the sum over that turn's executed actions)."""
        return [t.reward for t in self.turns]

    @property
    def actions(self) -> list[list[str]]:
        """Executed actions, per turn."""
        return [t.executed for t in self.turns]

    @property
    def has_tokens(self) -> bool:
        """True when every turn carries token ids (and there is at least one turn)."""
        return bool(self.turns) and all(t.response_ids is not None and t.prompt_ids is not None
                                        for t in self.turns)

    def token_samples(self) -> list[TokenView]:
        """The episode as training samples: one per run of turns that continue each other
        (one in ``verbatim`` history mode, one per turn in ``per_turn`` mode), each exactly
        the tokens the model was given and sampled. Raises ``ValueError`` without tokens."""
        if not self.has_tokens:
            raise ValueError(f"trajectory of env {self.env_id} has no token ids "
                             f"(the policy does not report tokens)")
        return turn_samples(self.turns, f"trajectory of env {self.env_id}")

    @property
    def is_one_sequence(self) -> bool:
        """True when the token-level episode is one sequence (every later turn extends)."""
        return self.has_tokens and all(t.prompt_extends for t in self.turns[1:])

    def token_view(self) -> TokenView:
        """The episode as one token sequence (see `TokenView`).

        Raises ``ValueError`` when a turn has no tokens or starts over from a whole prompt
        (``per_turn`` history, a chat endpoint): a single sequence would then claim the model
        saw what it did not; use `token_samples` for those.
        """
        samples = self.token_samples()
        if len(samples) > 1:
            k = next(k for k, t in enumerate(self.turns) if k and not t.prompt_extends)
            raise ValueError(f"turn {k} of env {self.env_id} starts from a whole prompt "
                             f"({len(samples)} samples); use token_samples()")
        return samples[0]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rewards"] = self.rewards
        for turn in d["turns"]:
            _strip_turn(turn)
        if self.node_id is None:
            for key in TREE_FIELDS:
                d.pop(key, None)
        if self.seat is None:
            d.pop("seat", None)
        if self.is_one_sequence:
            d["tokens"] = self.token_view().to_dict()
        elif self.has_tokens:
            d["token_samples"] = [v.to_dict() for v in self.token_samples()]
        return plain_json(d)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["turns"] = [Turn(**t) for t in d.get("turns", [])]
        return cls(**kw)


def turn_samples(turns: Sequence[Turn], what: str = "turns") -> list[TokenView]:
    """Token-level turns as training samples (see `Trajectory.token_samples`); ``what``
    names them in the ``ValueError`` raised when a turn has no tokens."""
    if not turns or not all(t.response_ids is not None and t.prompt_ids is not None
                            for t in turns):
        raise ValueError(f"{what} has no token ids (the policy does not report tokens)")
    samples: list[TokenView] = []
    prompt: list[int] = []
    response: list[int] = []
    mask: list[int] = []
    logps: list[float] = []
    for k, turn in enumerate(turns):
        if k == 0 or not turn.prompt_extends:
            if k > 0:
                samples.append(TokenView(prompt, response, mask, logps))
            prompt, response, mask, logps = list(turn.prompt_ids or []), [], [], []
        else:
            env_ids = list(turn.prompt_ids or [])
            response += env_ids
            mask += [0] * len(env_ids)
            logps += [0.0] * len(env_ids)
        ids = list(turn.response_ids or [])
        lp = list(turn.logprobs or [])
        response += ids
        mask += [1] * len(ids)
        logps += (lp + [0.0] * len(ids))[: len(ids)]
    samples.append(TokenView(prompt, response, mask, logps))
    return samples


def turn_dict(turn: Turn) -> dict[str, Any]:
    """One turn as the JSONL line holds it (token and tree fields only where set)."""
    d = asdict(turn)
    _strip_turn(d)
    return plain_json(d)  # type: ignore[no-any-return]


def _strip_turn(d: dict[str, Any]) -> None:
    if d.get("response_ids") is None:
        for key in TOKEN_FIELDS:
            d.pop(key, None)
    if d.get("node_id") is None:
        for key in TURN_TREE_FIELDS:
            d.pop(key, None)


def plain_json(x: Any) -> Any:
    """``x`` as plain JSON types (numpy scalars and arrays as lists or numbers, tuples as
    lists, non-finite floats as their repr, anything else as its repr)."""
    if isinstance(x, dict):
        return {str(k): plain_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain_json(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return x if math.isfinite(x) else repr(x)
    if isinstance(x, (np.generic, np.ndarray)):  # numpy scalars and arrays
        return plain_json(x.tolist())
    return repr(x)


def canonical(x: Any) -> str:
    """``x`` as canonical JSON text: plain JSON types (numpy scalars, tuples and non-finite
    floats as `Trajectory.to_dict` writes them), sorted keys, no ASCII escaping. The one form
    in which turnpool stores and compares records byte for byte.

        >>> canonical({"b": (1, 2.0), "a": float("nan")})
        '{"a": "nan", "b": [1, 2.0]}'
    """
    return dumps_plain(plain_json(x))


def dumps_plain(plain: Any) -> str:
    """`canonical` of a value already made of plain JSON types (no conversion pass)."""
    return json.dumps(plain, sort_keys=True, ensure_ascii=False, allow_nan=False)


def dumps(traj: Trajectory) -> str:
    """One canonical JSON line (no trailing newline)."""
    return dumps_plain(traj.to_dict())


def write_jsonl(trajectories: Iterable[Trajectory], dest: str | Path | IO[str]) -> int:
    """Write one line per trajectory; returns the number written."""
    if isinstance(dest, (str, Path)):
        with open(dest, "w", encoding="utf-8") as fh:
            return write_jsonl(trajectories, fh)
    n = 0
    for t in trajectories:
        dest.write(dumps(t) + "\n")
        n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Trajectories back from a file written by :func:`write_jsonl`."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield Trajectory.from_dict(json.loads(line))


def token_prefix(turns: Sequence[Turn]) -> list[int] | None:
    """The token sequence an episode has so far (its last prompt and reply), None when a
    turn has no tokens or there are no turns yet."""
    seq: list[int] = []
    for turn in turns:
        if turn.prompt_ids is None or turn.response_ids is None:
            return None
        if not turn.prompt_extends:
            seq = []
        seq += turn.prompt_ids
        seq += turn.response_ids
    return seq or None


def completion_tokens(turns: Sequence[Turn]) -> int:
    """Completion tokens of the episode's current sample: replies and the env/template tokens
    between them since its last whole prompt (0 before the first reply)."""
    n = 0
    for k, turn in enumerate(turns):
        if k == 0 or not turn.prompt_extends:
            n = 0
        elif turn.prompt_ids is not None:
            n += len(turn.prompt_ids)
        n += len(turn.response_ids or [])
    return n


def step_group_uid(group_uid: str, anchor_obs: str) -> str:
    """GiGPO step group: same episode group and same anchor state -> same uid."""
    digest = hashlib.sha256(anchor_obs.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{group_uid}/{digest}"
