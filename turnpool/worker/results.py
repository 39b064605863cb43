"""The per-env result records every backend carries back to the pool: `TurnResult` (a turn),
`ResetResult` (a reset or a load), `StateResult` (a snapshot), `CallResult` (a call into an
env), and the failed forms of each (`error_step`, `error_reset`)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

from turnpool.worker.failures import Failure, failure_info, failure_of


class TurnResult(NamedTuple):
    """One env's outcome for a (possibly multi-action) turn: THE step result, from the host
    through every backend to the pool's callers. Read it by field name.

    ``reward_sum`` adds the rewards of the executed actions; execution stops at the first
    done, so ``n_executed`` may be less than the number of actions sent.
    """

    obs: str
    reward_sum: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    n_executed: int
    error: str | None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def failure(self) -> Failure | None:
        """The failure class (`Failure`) when ``error`` is set, else None: the
        ``info["failure"]`` field set where the failure was decided (the record stays seven
        plain fields on the wire, which counts for microsecond envs)."""
        return failure_of(self.info) if self.error is not None else None


#: A `TurnResult` on the wire: the same fields, in the same order, as a plain tuple.
WireTurn = tuple[str, float, bool, bool, dict[str, Any], int, str | None]

#: ``as_turn_result(wire)``: the `TurnResult` of one `WireTurn` (C speed)
as_turn_result = partial(tuple.__new__, TurnResult)


def as_turn_results(wire: Sequence[Any]) -> list[TurnResult]:
    """The `TurnResult` records of a step reply's `WireTurn` tuples (or of records already:
    each is copied as one). C-speed: no Python call per env."""
    return list(map(as_turn_result, wire))


class StateResult(NamedTuple):
    """An env's `Op.SNAPSHOT` answer: ``get_state()`` (None: branched by replay), done, error."""

    state: Any
    finished: bool
    error: str | None


class CallResult(NamedTuple):
    """An env's answer to `Op.CALL` / `Op.SET_ATTR`: the value, or the error it raised
    (``kind`` its type's name, ``error`` its message, bounded)."""

    value: Any
    error: str | None = None
    kind: str | None = None


class ResetResult(NamedTuple):
    """One env's outcome for a reset: its first observation and info, or the error."""

    obs: str
    info: dict[str, Any]
    error: str | None

    @property
    def failure(self) -> Failure | None:
        """The failure class when ``error`` is set (as `TurnResult.failure`)."""
        return failure_of(self.info) if self.error is not None else None



def error_info(reason: str, failure: str = "env_error") -> dict[str, Any]:
    """The info dict of a failed env: the standard keys (so readers never KeyError), the
    error and its failure class."""
    return {"success": False, "action_is_valid": False, "action_is_effective": False,
            "anchor_obs": "", "terminated": False, "truncated": True, "error": reason,
            **failure_info(failure)}


def error_step(reason: str, n_executed: int = 0, failure: str = "env_error") -> TurnResult:
    """A failed env's step result: done (truncated: the episode was cut, not finished), 0 reward."""
    return TurnResult("", 0.0, False, True, error_info(reason, failure), n_executed, reason)


def error_reset(reason: str, failure: str = "env_error") -> ResetResult:
    """A failed env's reset result."""
    return ResetResult("", error_info(reason, failure), reason)

