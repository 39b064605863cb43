"""Calls into the envs where they live: `EnvPool.call` and `EnvPool.set_attr`.

gymnasium's vector envs reach their envs' methods and attributes with ``call``, ``get_attr``
and ``set_attr``; a pool's envs live in its workers, so each call is one `Op.CALL` (or
`Op.SET_ATTR`) message per worker that holds some of the envs, answered by the envs in place
(`turnpool.worker.host.EnvHost.call`) within ``step_timeout``, on every backend. A value
comes back only if it pickles, and arguments go only if they do (on every backend, so a call
answers the same everywhere). A call that runs past ``step_timeout`` raises ``TimeoutError``
and its env must be reset, as after a step that did.

What a call does to an env is not in the pool's replay log: an env restored after its
worker was lost is its episode's seed and turns, without the calls made to it. ``reset``,
``step`` and ``close`` go through the pool (its episode table must see them), not here.

An env's exception is raised again in the caller: the same built-in type (``AttributeError``
for a missing attribute, as gymnasium's ``SyncVectorEnv``), with the env and the name in its
message; a type that is not built in becomes a ``RuntimeError`` naming it.

>>> from turnpool.pool import EnvPool
>>> with EnvPool("sokoban", env_num=2, backend="sequential") as pool:
...     pool.set_attr("note", ["a", "b"])
...     notes = pool.call("note")
>>> notes
['a', 'b']
"""

from __future__ import annotations

import builtins
import pickle
from collections.abc import Sequence
from typing import Any

from turnpool.pool.branch import run_on_owners
from turnpool.pool.dispatch import Dispatcher
from turnpool.worker.errors import short_error
from turnpool.worker.failures import Failure
from turnpool.worker.protocol import CallRequest, SetAttrRequest
from turnpool.worker.results import CallResult

#: env methods a call may not reach: the pool's own calls, which its env table must see
THROUGH_THE_POOL = frozenset({"reset", "step", "close"})


def call(dispatch: Dispatcher, ids: list[int], name: str, args: Sequence[Any],
         kwargs: dict[str, Any]) -> list[Any]:
    """`EnvPool.call` of the (checked) ``ids``: each env's value, aligned to ``ids``."""
    if not isinstance(name, str):
        raise TypeError(f"the name to call must be a str, got {type(name).__name__}")
    if name in THROUGH_THE_POOL:
        raise ValueError(f"Trying to call function `{name}` with `call`, use `{name}` "
                         "directly instead.")
    item_args, item_kwargs = tuple(args), dict(kwargs)
    _check_picklable(name, (item_args, item_kwargs))
    results = run_on_owners(dispatch, ids, lambda w, wids: CallRequest(
        [(i, name, item_args, item_kwargs) for i in wids]))
    return _values(ids, name, results)


def set_attr(dispatch: Dispatcher, ids: list[int], name: str, values: Sequence[Any]) -> None:
    """`EnvPool.set_attr`: ``values[k]`` becomes attribute ``name`` of env ``ids[k]``."""
    if not isinstance(name, str):
        raise TypeError(f"the attribute name must be a str, got {type(name).__name__}")
    if len(values) != len(ids):
        raise ValueError(f"got {len(values)} values for {len(ids)} envs")
    _check_picklable(name, values)
    by_id = dict(zip(ids, values))
    results = run_on_owners(dispatch, ids, lambda w, wids: SetAttrRequest(
        [(i, name, by_id[i]) for i in wids]))
    _values(ids, name, results)


def _values(ids: list[int], name: str, results: list[Any]) -> list[Any]:
    """The values of a call's results, or the first env's error raised (module doc). A
    result that is not a `CallResult` is a failure of the worker (its deadline, its loss):
    the env was flagged and must be reset."""
    out = []
    for i, r in zip(ids, results):
        if isinstance(r, CallResult) and r.error is None:
            out.append(r.value)
            continue
        if isinstance(r, CallResult):
            raise _exception(f"env {i}: {name}: {r.error}", r.kind)
        if r is not None and r.failure is Failure.TIMEOUT:
            raise TimeoutError(f"env {i}: {name}: {r.error} (the env must be reset)")
        why = "its worker was lost" if r is None else r.error
        raise RuntimeError(f"env {i}: {name}: {why} (the env must be reset)")
    return out


def _check_picklable(name: str, payload: Any) -> None:
    """What a call sends must pickle, on every backend (an in-process one would not need
    it; the same call answers the same everywhere)."""
    try:
        pickle.dumps(payload, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(f"the arguments of {name} must pickle: {short_error(exc)}") from None


def _exception(text: str, kind: str | None) -> Exception:
    cls = getattr(builtins, kind or "", None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(text)
        except Exception:  # a built-in that takes other arguments (UnicodeDecodeError...)
            pass
    return RuntimeError(f"{text} ({kind})")
