"""Branching: snapshot an env mid-episode, restore it later or elsewhere, fork it.

A `Snapshot` is a value (picklable, no server-side handle): the env's identity (entry point
and kwargs), its episode seed, the turns it took since that reset (from the pool's replay
log) and, for env classes whose ``snapshot_by_state`` is true, its ``get_state()``. Restoring
sets that state (`Op.LOAD`); a class branched by replay (the gymnasium adapter: the wrapped
env's internals are not ours to copy) is reset with the seed and replays the turns. Either
way the env table records the restored env as "episode ``seed`` after ``turns``", so a lost
worker brings it back by the usual replay, exactly. `fork` is a snapshot of the source loaded
into each destination, on any worker; when they all live on the source's worker it is one
`Op.FORK` message there (one round trip, and the state is never pickled).

>>> from turnpool.pool import EnvPool
>>> with EnvPool("sokoban", env_num=2, seed=3, backend="sequential") as pool:
...     _ = pool.reset()
...     _ = pool.step(["Up", "Down"])
...     obs, infos = pool.fork(0, [1])
...     later = pool.step(["Left", "Left"])
...     snap = pool.snapshot([0])[0]
>>> later[0][0] == later[0][1], snap.seed, len(snap.turns)
(True, 3, 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from turnpool.pool.dispatch import Dispatcher
from turnpool.pool.requests import Pending, Ticket, split
from turnpool.worker.failures import Failure
from turnpool.worker.protocol import ForkRequest, LoadRequest, SnapshotRequest
from turnpool.worker.results import ResetResult, StateResult


@dataclass(frozen=True)
class Snapshot:
    """One env's state mid-episode (opaque to callers: pass it to `EnvPool.restore`)."""

    #: what the env is: entry point and kwargs (a snapshot restores only into the same)
    env_key: str
    seed: int
    #: the turns since the reset with ``seed`` (each a tuple of actions)
    turns: tuple[tuple[Any, ...], ...]
    #: the env's ``get_state()``; None: restored by reset + replay of ``turns``
    state: Any = None


def snapshot(dispatch: Dispatcher, env_keys: Sequence[str], ids: list[int]) -> list[Snapshot]:
    """`EnvPool.snapshot` of the (checked) ``ids``; ``env_keys``: what each env is.
    ValueError for an env with no live episode or a finished one."""
    _check_live(dispatch, ids)
    results: list[StateResult] = run_on_owners(dispatch, ids,
                                               lambda w, wids: SnapshotRequest(wids))
    out = []
    for i, r in zip(ids, results):
        _check_state(i, r)
        seed, turns = _episode(dispatch, i)
        out.append(Snapshot(env_keys[i], seed, turns, r.state))
    return out


def episode(dispatch: Dispatcher, env_keys: Sequence[str], i: int) -> Snapshot:
    """`EnvPool.episode`: env ``i``'s episode from the replay log alone (no state)."""
    _check_live(dispatch, [i])
    seed, turns = _episode(dispatch, i)
    return Snapshot(env_keys[i], seed, turns)


def _check_live(dispatch: Dispatcher, ids: list[int]) -> None:
    table = dispatch.table
    for i in ids:
        if table.seeds[i] is None or i in table.failed:
            why = table.failed.get(i, "no episode started")
            raise ValueError(f"env {i} has no live episode to snapshot ({why}); reset it")


def _check_state(i: int, r: StateResult) -> None:
    """ValueError unless env ``i``'s `StateResult` can be branched."""
    if r.error is not None:
        raise ValueError(f"env {i} cannot be snapshot: {r.error}")
    if r.finished:
        raise ValueError(f"env {i}'s episode is finished; there is nothing to branch")


def _episode(dispatch: Dispatcher, i: int) -> tuple[int, tuple[tuple[Any, ...], ...]]:
    """Env ``i``'s episode as the replay log has it: its seed and its turns."""
    item = dispatch.table.restore_items(dispatch.table.owner_of(i), [i])[0]
    return item[1], tuple(tuple(acts) for acts in item[2])


def restore(dispatch: Dispatcher, env_keys: Sequence[str], ids: list[int],
            snapshots: Sequence[Snapshot]) -> tuple[list[str], list[dict[str, Any]]]:
    """`EnvPool.restore` of the (checked) ``ids``: ValueError for a foreign snapshot or one of
    another env type."""
    snaps = list(snapshots)
    if len(snaps) != len(ids):
        raise ValueError(f"got {len(snaps)} snapshots for {len(ids)} envs")
    for i, snap in zip(ids, snaps):
        if not isinstance(snap, Snapshot):
            raise ValueError(f"not a turnpool Snapshot: {type(snap).__name__}")
        if snap.env_key != env_keys[i]:
            raise ValueError(f"env {i} is {env_keys[i]}; the snapshot is of "
                             f"{snap.env_key}")
    by_id = dict(zip(ids, snaps))

    def request(w: int, wids: list[int]) -> LoadRequest:
        return LoadRequest([(i, by_id[i].seed, by_id[i].turns, by_id[i].state) for i in wids])

    results: list[ResetResult] = run_on_owners(dispatch, ids, request)
    return _loaded(dispatch, ids, [(by_id[i].seed, by_id[i].turns) for i in ids], results)


def _loaded(dispatch: Dispatcher, ids: list[int],
            episodes: Sequence[tuple[int, Sequence[Sequence[Any]]]],
            results: Sequence[ResetResult]) -> tuple[list[str], list[dict[str, Any]]]:
    """Record each of ``ids`` as now playing its ``(seed, turns)`` episode (or failed, when its
    load did); ValueError naming the first that failed."""
    table = dispatch.table
    errors = {}
    for i, (seed, turns), r in zip(ids, episodes, results):
        if r.error is None:
            table.restored(i, seed, turns)
        else:
            table.fail(i, f"restore failed: {r.error}", Failure.of(r.failure),
                       episode_lost=True)
            errors[i] = r.error
    if errors:
        i, why = next(iter(errors.items()))
        raise ValueError(f"env {i} could not be restored: {why} (it must be reset)")
    return [r.obs for r in results], [r.info for r in results]


def fork(dispatch: Dispatcher, env_keys: Sequence[str], src_id: int, dst_ids: list[int]
         ) -> tuple[list[str], list[dict[str, Any]]]:
    """`EnvPool.fork`: each of ``dst_ids`` continues exactly as ``src_id`` would."""
    if src_id in dst_ids:
        raise ValueError(f"env {src_id} cannot be both the source and a destination")
    owner = dispatch.table.owner_of
    if any(owner(d) != owner(src_id) for d in dst_ids):  # the state travels through here
        snap = snapshot(dispatch, env_keys, [src_id])[0]
        return restore(dispatch, env_keys, dst_ids, [snap] * len(dst_ids))
    # All on the source's worker: one `Op.FORK` message, the state never leaves the worker.
    _check_live(dispatch, [src_id])
    for d in dst_ids:
        if env_keys[d] != env_keys[src_id]:
            raise ValueError(f"env {d} is {env_keys[d]}; the snapshot is of "
                             f"{env_keys[src_id]}")
    seed, turns = _episode(dispatch, src_id)
    request = ForkRequest(src_id, [(d, seed, turns) for d in dst_ids])
    head, *loaded = run_on_owners(dispatch, [src_id, *dst_ids], lambda w, wids: request)
    _check_state(src_id, head)
    return _loaded(dispatch, dst_ids, [(seed, turns)] * len(dst_ids), loaded)


def run_on_owners(dispatch: Dispatcher, ids: list[int], request: Any) -> Any:
    """Send ``request(worker, its env ids)`` to each worker holding some of ``ids`` and wait:
    the replies' per-env results, aligned to ``ids`` (`turnpool.pool.calls` sends its too)."""
    ticket = Ticket(ids, is_async=False)
    for w, (wids, wpos) in split(ids, dispatch.table.owners)[0].items():
        dispatch.enqueue(w, Pending(request(w, wids), ticket, wpos))
    dispatch.finish(ticket)
    return ticket.out
