"""EnvPool: many text envs in groups, stepped in parallel on any backend, faults isolated.

The pool is backend-agnostic: it decides seeds, groups, which worker gets which actions,
deadlines and fault recovery; a `turnpool.backends.base.Backend` decides where envs run
(``sequential``, ``thread``, ``process``, ...). Results are byte-identical for every backend,
worker count and start method because each env's randomness comes only from its reset seed.

Groups: env ``i`` belongs to group ``i // group_n``; all members of a group get the group's
seed, so they start from the same state. The pool resets one member per group in each worker
that owns members and copies the state to the others (one Sokoban room generation per group).

Seeds: group ``g``'s reset seed is ``base + g``, with ``base`` the explicit ``reset(seed=...)`` or,
for a seedless ``reset()``, ``seed + episode * n_groups`` where ``episode`` counts seedless
resets; successive seedless resets therefore never reuse a seed.

Faults: an env that raises, a worker that dies and an env that runs past ``step_timeout`` give
that env a result with ``done=True`` (``truncated``), reward 0 and ``info["error"]``; the env
stays failed until its next reset (which rebuilds it). A dead or stuck worker is killed and
replaced; the other envs it held are rebuilt by reset + replay of their recorded actions
(deterministic envs make this exact) and their results for the step are computed as if
nothing happened. ``on_error="raise"`` raises `EnvError` after the step instead.

Example:
    >>> from turnpool.pool import EnvPool
    >>> with EnvPool("trivial", env_num=2, group_n=2, seed=1, backend="sequential") as pool:
    ...     obs, infos = pool.reset()
    ...     obs2, rewards, dones, infos2 = pool.step(["a", "b", "c", "d"])
    >>> obs[0] == obs[1], pool.group_ids
    (True, [0, 0, 1, 1])
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from turnpool.backends import get_backend
from turnpool.backends.base import (
    Backend,
    BackendUnavailable,
    EnvBuild,
    StepTuple,
    WorkerLost,
    error_info,
    error_step,
    monotonic,
)
from turnpool.backends.sequential import SequentialBackend
from turnpool.envs.registry import registered, resolve

log = logging.getLogger(__name__)

#: Seconds a backend may take to start all its workers before the pool gives up on it.
START_TIMEOUT = 120.0


class EnvError(RuntimeError):
    """Raised with ``on_error="raise"`` when envs failed; ``errors`` maps env id -> reason."""

    def __init__(self, errors: dict[int, str]) -> None:
        self.errors = dict(errors)
        shown = "; ".join(f"env {i}: {e}" for i, e in list(self.errors.items())[:5])
        more = f" (+{len(self.errors) - 5} more)" if len(self.errors) > 5 else ""
        super().__init__(f"{len(self.errors)} env(s) failed: {shown}{more}")


@dataclass(frozen=True)
class EnvGroupSpec:
    """One block of a multi-type pool (a RAGEN ``es_manager`` tag): ``n_groups`` groups of
    ``env_type``, laid out after the blocks before it."""

    tag: str
    env_type: str
    n_groups: int
    env_kwargs: dict[str, Any] = field(default_factory=dict)


class TurnResult(NamedTuple):
    """One env's outcome for a (possibly multi-action) turn.

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


class _Ticket:
    """The results of one pool call, filled in as worker replies arrive."""

    __slots__ = ("env_ids", "out", "remaining", "is_async")

    def __init__(self, env_ids: list[int], is_async: bool) -> None:
        self.env_ids = env_ids
        self.out: list[Any] = [None] * len(env_ids)
        self.remaining = len(env_ids)
        self.is_async = is_async


class _Pending:
    """One request to one worker: its envs, where their results go, and its clock."""

    __slots__ = ("seq", "op", "env_ids", "items", "ticket", "positions", "seeds", "clock")

    def __init__(self, op: str, env_ids: Sequence[int], items: Any, ticket: _Ticket | None,
                 positions: Sequence[int], seeds: list[int] | None = None) -> None:
        self.seq = 0
        self.op = op
        self.env_ids = env_ids
        self.items = items
        self.ticket = ticket
        self.positions = positions
        self.seeds = seeds
        self.clock = 0.0


class EnvPool:
    """A pool of ``env_num * group_n`` text envs (or a multi-type pool, see `from_specs`).

    Args:
        env_type: a registered env name or ``"module.path:ClassName"``.
        env_num: number of groups; group_n: envs per group (same seed within a group).
        seed: base seed; group ``g`` of the first seedless reset uses ``seed + g``.
        env_kwargs: constructor arguments for every env.
        backend: ``"sequential"``, ``"thread"``, ``"process"`` or any other name in
            `turnpool.backends.BACKENDS`.
        num_workers: worker count (default: the backend's, e.g. one process per core).
        mp_context: ``"spawn"`` (default), ``"forkserver"`` or ``"fork"`` for process backends.
        step_timeout: seconds one env may spend on one turn before its worker is killed and
            the env flagged (None: no deadline). reset_timeout: the same for a reset
            (default: ``step_timeout``).
        on_error: ``"flag"`` (failed envs return done + ``info["error"]``) or ``"raise"``
            (`EnvError` after the call).
        fallback: run sequentially, with a logged warning, if the backend cannot start.
        tag: the tag reported in ``pool.tags`` (default: ``env_type``).
        ray_address, backend_options: passed to the backend.

    Not thread-safe: drive one pool from one thread.
    """

    def __init__(self, env_type: str = "sokoban", env_num: int = 1, group_n: int = 1,
                 seed: int = 0, env_kwargs: dict[str, Any] | None = None, *,
                 backend: str = "process", num_workers: int | None = None,
                 mp_context: str | None = "spawn", step_timeout: float | None = 30.0,
                 reset_timeout: float | None = None, on_error: str = "flag",
                 fallback: bool = True, tag: str | None = None,
                 ray_address: str | None = None, **backend_options: Any) -> None:
        spec = EnvGroupSpec(tag or env_type, env_type, env_num, dict(env_kwargs or {}))
        self._init([spec], group_n, seed, backend=backend, num_workers=num_workers,
                   mp_context=mp_context, step_timeout=step_timeout,
                   reset_timeout=reset_timeout, on_error=on_error, fallback=fallback,
                   ray_address=ray_address, **backend_options)

    @classmethod
    def from_specs(cls, specs: Sequence[EnvGroupSpec], group_n: int, seed: int = 0,
                   **kwargs: Any) -> EnvPool:
        """A pool of several env types (RAGEN tags), laid out in ``specs`` order; group ids
        run on across specs, so seeds never collide between tags."""
        pool = cls.__new__(cls)
        pool._init(list(specs), group_n, seed, **kwargs)
        return pool

    # ------------------------------------------------------------------ construction
    def _init(self, specs: list[EnvGroupSpec], group_n: int, seed: int, *,
              backend: str = "process", num_workers: int | None = None,
              mp_context: str | None = "spawn", step_timeout: float | None = 30.0,
              reset_timeout: float | None = None, on_error: str = "flag",
              fallback: bool = True, ray_address: str | None = None,
              **backend_options: Any) -> None:
        if group_n < 1:
            raise ValueError("group_n must be >= 1")
        if on_error not in ("flag", "raise"):
            raise ValueError("on_error must be 'flag' or 'raise'")
        self._closed = True  # until a backend is running
        self.group_n = int(group_n)
        self.seed = int(seed)
        self.on_error = on_error
        self.step_timeout = step_timeout
        self.reset_timeout = reset_timeout if reset_timeout is not None else step_timeout
        self.specs = specs
        builds: list[EnvBuild] = []
        self.group_ids: list[int] = []
        self.tags: list[str] = []
        self.env_types: list[str] = []
        group = 0
        for spec in specs:
            if spec.n_groups < 0:
                raise ValueError(f"n_groups must be >= 0 for tag {spec.tag!r}")
            entry, kwargs = _entry_point(spec.env_type, spec.env_kwargs)
            for _ in range(spec.n_groups):
                for _ in range(self.group_n):
                    builds.append(EnvBuild(len(builds), entry, kwargs))
                    self.group_ids.append(group)
                    self.tags.append(spec.tag)
                    self.env_types.append(spec.env_type)
                group += 1
        if not builds:
            raise ValueError("the pool has no envs")
        self.n_groups = group
        self.env_num = group
        self._episode = 0
        self._seq = 0
        self._tickets = 0
        n = len(builds)
        self._seeds: list[int | None] = [None] * n
        # Replay log for worker recovery: per worker, the step requests it completed, and
        # per env, where in its worker's log its current episode starts.
        self._log: list[list[tuple[Any, Any, bool]]] = []
        self._mark = [0] * n
        self._broken: dict[int, str] = {}
        self._in_flight: set[int] = set()
        self._ready: list[tuple[int, Any, str]] = []
        options = dict(backend_options)
        if ray_address is not None:
            options["ray_address"] = ray_address
        self._backend = _start_backend(backend, builds, num_workers, mp_context, options,
                                       fallback)
        self._closed = False
        self._finalizer = weakref.finalize(self, self._backend.close)
        self._owner = [0] * n
        for w, ids in enumerate(self._backend.slices):
            for i in ids:
                self._owner[i] = w
        self._queues: list[deque[_Pending]] = [deque() for _ in self._backend.slices]
        self._log = [[] for _ in self._backend.slices]
        # Fast path for whole-pool calls: worker w's envs are all_ids[a:b].
        self._spans: list[tuple[int, int]] | None = None
        flat = [i for ids in self._backend.slices for i in ids]
        if flat == list(range(n)):
            pos = 0
            self._spans = []
            for ids in self._backend.slices:
                self._spans.append((pos, pos + len(ids)))
                pos += len(ids)

    # ------------------------------------------------------------------ properties
    @property
    def num_envs(self) -> int:
        return len(self.group_ids)

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def num_workers(self) -> int:
        return self._backend.num_workers

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def env_seeds(self) -> list[int | None]:
        """Each env's current episode seed (``None`` before its first reset or after a
        failure); callers read seeds here instead of re-deriving the group rule."""
        return list(self._seeds)

    def worker_pids(self) -> list[int]:
        """OS pids of the worker processes (empty for in-process backends)."""
        return self._backend.worker_pids()

    # ------------------------------------------------------------------ reset
    def reset(self, seed: int | None = None, env_ids: Sequence[int] | None = None
              ) -> tuple[list[str], list[dict[str, Any]]]:
        """Start new episodes; returns ``(obs, infos)`` aligned to ``env_ids`` (default: all).

        Group ``g`` gets seed ``base + g``; see the module docstring for ``base``.
        """
        self._check_open()
        ids = list(range(self.num_envs)) if env_ids is None else [int(i) for i in env_ids]
        self._check_ids(ids)
        if seed is None:
            base = self.seed + self._episode * self.n_groups
            self._episode += 1
        else:
            base = int(seed)
        ticket = _Ticket(ids, is_async=False)
        per_worker: dict[int, tuple[list[int], list[int]]] = {}
        for pos, i in enumerate(ids):
            wids, wpos = per_worker.setdefault(self._owner[i], ([], []))
            wids.append(i)
            wpos.append(pos)
        for w, (wids, wpos) in per_worker.items():
            groups: dict[int, list[int]] = {}
            for i in wids:
                groups.setdefault(self.group_ids[i], []).append(i)
            items = [(base + g, members) for g, members in groups.items()]
            order = [i for _, members in items for i in members]
            pos_of = dict(zip(wids, wpos))
            seeds = [base + self.group_ids[i] for i in order]
            self._enqueue(w, _Pending("reset", order, items, ticket,
                                      [pos_of[i] for i in order], seeds))
        self._finish(ticket)
        obs = [r[0] for r in ticket.out]
        infos = [r[1] for r in ticket.out]
        self._raise_if_needed(ids, [r[2] for r in ticket.out])
        return obs, infos

    # ------------------------------------------------------------------ step
    def step(self, actions: Sequence[Any], env_ids: Sequence[int] | None = None
             ) -> tuple[list[str], list[float], list[bool], list[dict[str, Any]]]:
        """One action per env; returns ``(obs, rewards, dones, infos)`` aligned to ``env_ids``.

        ``dones[k]`` is ``terminated or truncated``; both are also in ``infos[k]``.
        """
        res = self._run_turns(list(actions), env_ids, single=True)
        if not res:
            return [], [], [], []
        obs, rewards, terminated, truncated, infos, _, _ = zip(*res)
        return list(obs), list(rewards), list(map(operator.or_, terminated, truncated)), list(infos)

    def step_turns(self, action_lists: Sequence[Sequence[Any]],
                   env_ids: Sequence[int] | None = None) -> list[TurnResult]:
        """Multi-action turns: each env executes its actions in order inside its worker and
        stops at the first done. Results are aligned to ``env_ids``."""
        res = self._run_turns([list(a) for a in action_lists], env_ids)
        return [TurnResult._make(r) for r in res]

    def step_async(self, env_ids: Sequence[int] | None,
                   action_lists: Sequence[Sequence[Any]]) -> int:
        """Start multi-action turns without waiting; collect them with `poll`. Returns a
        ticket number (the order of the call; results carry env ids, not tickets).

        Envs already in flight cannot be stepped again until their result was polled.
        """
        ids = self._ids(env_ids, len(action_lists))
        ticket = _Ticket(ids, is_async=True)
        self._dispatch_turns(ticket, [list(a) for a in action_lists])
        self._tickets += 1
        return self._tickets

    def poll(self, timeout: float | None = 0.0, min_ready: int = 1
             ) -> list[tuple[int, TurnResult]]:
        """Results of `step_async` turns that are done, ready first, as ``(env_id, result)``.

        Blocks until at least ``min_ready`` results are available (or none are in flight) or
        ``timeout`` seconds pass; ``step_timeout`` is enforced meanwhile.
        """
        self._check_open()
        want = max(0, int(min_ready))
        self._pump(lambda: len(self._ready) >= want, timeout)
        out, self._ready = self._ready, []
        if self.on_error == "raise" and any(r[6] is not None for _, r, _ in out):
            # The failed envs are reported; the others stay ready for the next poll, so an
            # exception never swallows a result.
            self._ready = [x for x in out if x[1][6] is None]
            failed = [x for x in out if x[1][6] is not None]
            self._in_flight.difference_update(i for i, _, _ in failed)
            self._raise_if_needed([i for i, _, _ in failed], [r[6] for _, r, _ in failed])
        self._in_flight.difference_update(i for i, _, _ in out)
        return [(i, TurnResult._make(r)) for i, r, _ in out]

    @property
    def in_flight(self) -> frozenset[int]:
        """Env ids whose `step_async` results have not been polled yet."""
        return frozenset(self._in_flight)

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Stop every worker and close every env. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"EnvPool(num_envs={self.num_envs}, group_n={self.group_n}, "
                f"backend={self.backend_name!r}, num_workers={self.num_workers})")

    # ================================================================== internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the pool is closed")

    def _check_ids(self, ids: list[int]) -> None:
        n = self.num_envs
        for i in ids:
            if not 0 <= i < n:
                raise IndexError(f"env id {i} out of range [0, {n})")
        if len(set(ids)) != len(ids):
            raise ValueError("env_ids contains duplicates")
        busy = self._in_flight.intersection(ids)
        if busy:
            raise RuntimeError(f"envs {sorted(busy)[:5]} are still in flight; poll() first")

    def _ids(self, env_ids: Sequence[int] | None, n_actions: int) -> list[int]:
        self._check_open()
        if env_ids is None:
            ids = list(range(self.num_envs))
            if self._in_flight:
                self._check_ids(ids)
        else:
            ids = [int(i) for i in env_ids]
            self._check_ids(ids)
        if len(ids) != n_actions:
            raise ValueError(f"got {n_actions} actions for {len(ids)} envs")
        return ids

    def _run_turns(self, action_lists: list[Any], env_ids: Sequence[int] | None,
                   single: bool = False) -> list[StepTuple]:
        ids = self._ids(env_ids, len(action_lists))
        ticket = _Ticket(ids, is_async=False)
        self._dispatch_turns(ticket, action_lists, whole=env_ids is None, single=single)
        self._finish(ticket)
        out: list[StepTuple] = ticket.out
        if self.on_error == "raise":
            self._raise_if_needed(ids, [r[6] for r in out])
        return out

    def _dispatch_turns(self, ticket: _Ticket, action_lists: list[Any], whole: bool = False,
                        single: bool = False) -> None:
        ids = ticket.env_ids
        broken = self._broken
        op = "step1" if single else "step"
        failed: list[tuple[int, int]] = []
        if whole and self._spans is not None and not broken:
            # Contiguous slices: the request is a range and a list slice, no per-env work.
            for w, (a, b) in enumerate(self._spans):
                if a < b:
                    span = range(a, b)
                    self._enqueue(w, _Pending(op, span, (span, action_lists[a:b]), ticket, span))
        else:
            per_worker: dict[int, tuple[list[int], list[Any], list[int]]] = {}
            owner = self._owner
            for pos, i in enumerate(ids):
                if i in broken:  # a failed env stays failed until reset; no worker needed
                    failed.append((pos, i))
                    continue
                wids, wacts, wpos = per_worker.setdefault(owner[i], ([], [], []))
                wids.append(i)
                wacts.append(action_lists[pos])
                wpos.append(pos)
            for w, (wids, wacts, wpos) in per_worker.items():
                self._enqueue(w, _Pending(op, wids, (wids, wacts), ticket, wpos))
        if ticket.is_async:
            self._in_flight.update(ids)
        for pos, i in failed:
            self._deliver(ticket, pos, i,
                          error_step(f"env failed earlier ({broken[i]}); reset it"))

    def _finish(self, ticket: _Ticket) -> None:
        self._pump(lambda: ticket.remaining == 0, None)

    def _raise_if_needed(self, ids: Sequence[int], errors: Sequence[str | None]) -> None:
        if self.on_error != "raise":
            return
        failed = {i: e for i, e in zip(ids, errors) if e is not None}
        if failed:
            raise EnvError(failed)

    # ------------------------------------------------------------------ request queue
    def _enqueue(self, worker: int, pending: _Pending) -> None:
        queue = self._queues[worker]
        queue.append(pending)
        if len(queue) == 1:
            self._send(worker, pending)

    def _send(self, worker: int, pending: _Pending) -> None:
        queue = self._queues[worker]
        while True:
            self._seq += 1
            pending.seq = self._seq
            pending.clock = monotonic()
            try:
                self._backend.send(worker, (pending.seq, pending.op, pending.items))
                return
            except (OSError, WorkerLost) as exc:  # it died between calls; recover in _pump
                log.debug("sending to worker %d failed: %s", worker, exc)
                return
            except Exception as exc:  # e.g. an action that cannot be pickled
                reason = f"request could not be sent: {type(exc).__name__}: {exc}"[:300]
                log.warning("worker %d: %s", worker, reason)
                queue.popleft()
                for k, i in enumerate(pending.env_ids):
                    self._fail(pending, k, i, reason)
                if not queue:
                    return
                pending = queue[0]

    def _pump(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Process replies and faults until ``done()`` or ``timeout`` (None: until done or
        nothing is in flight)."""
        end = None if timeout is None else monotonic() + timeout
        backend = self._backend
        queues = self._queues
        while not done():
            active = [w for w in range(len(queues)) if queues[w]]
            if not active:
                return
            now = monotonic()
            wake = end
            for w in active:
                limit = self._limit(queues[w][0].op)
                if limit is None:
                    continue
                due = queues[w][0].clock + limit
                if due <= now:
                    rechecked = self._recheck_deadline(w, limit, now)
                    if rechecked is None:
                        continue  # recovered; its queue was rebuilt
                    due = rechecked
                if wake is None or due < wake:
                    wake = due
            if not any(queues):
                continue
            wait_s = None if wake is None else max(0.0, wake - now)
            for w in backend.wait([w for w in active if queues[w]], wait_s):
                self._receive(w)
            if end is not None and monotonic() >= end:
                return

    def _limit(self, op: str) -> float | None:
        if op == "step" or op == "step1":
            return self.step_timeout
        if op == "reset":
            return self.reset_timeout
        if self.reset_timeout is None or self.step_timeout is None:
            return None
        return self.reset_timeout + self.step_timeout

    def _recheck_deadline(self, worker: int, limit: float, now: float) -> float | None:
        """The head request looks late; an env that started later gets its own full budget."""
        head = self._queues[worker][0]
        if self._backend.wait([worker], 0.0):
            return now  # it has answered (or died) meanwhile: receive that first
        progress = self._backend.progress(worker)
        if progress is not None:
            env_id, since = progress
            if since > head.clock:
                head.clock = since
                if since + limit > now:
                    return since + limit
        what = "reset timeout" if head.op == "reset" else "step timeout"
        self._recover(worker, f"{what} ({limit:g} s)")
        return None

    def _receive(self, worker: int) -> None:
        queue = self._queues[worker]
        try:
            seq, payload, error = self._backend.recv(worker)
        except WorkerLost as exc:
            self._recover(worker, str(exc) or "worker died")
            return
        if not queue or seq != queue[0].seq:
            log.debug("discarding a stale reply (seq %d) from worker %d", seq, worker)
            return
        head = queue.popleft()
        self._complete(head, payload, error)
        if queue:
            self._send(worker, queue[0])

    def _complete(self, head: _Pending, payload: Any, error: str | None) -> None:
        ids = head.env_ids
        ticket = head.ticket
        if error is not None:  # the worker's host failed as a whole
            for k, i in enumerate(ids):
                self._fail(head, k, i, f"worker error: {error}")
            return
        if head.op == "step" or head.op == "step1":
            assert ticket is not None
            results, failed = payload
            for k in failed:
                self._broken[ids[k]] = results[k][6]
            self._log[self._owner[ids[0]]].append(
                (head.env_ids, head.items[1], head.op == "step1"))
            positions = head.positions
            if not ticket.is_async and isinstance(positions, range) and positions.step == 1:
                ticket.out[positions.start:positions.stop] = results
                ticket.remaining -= len(results)
            else:
                for i, pos, r in zip(ids, positions, results):
                    self._deliver(ticket, pos, i, r)
        elif head.op == "reset":
            assert ticket is not None and head.seeds is not None
            worker = self._owner[ids[0]]
            start = len(self._log[worker])
            for i, pos, s, r in zip(ids, head.positions, head.seeds, payload):
                if r[2] is None:
                    self._seeds[i] = s
                    self._mark[i] = start
                    self._broken.pop(i, None)
                else:
                    self._broken[i] = r[2]
                    self._seeds[i] = None
                self._deliver(ticket, pos, i, r)
            self._compact_log(worker)
        else:  # restore
            for i, err in zip(ids, payload):
                if err is not None:
                    self._broken[i] = f"restore failed: {err}"

    def _deliver(self, ticket: _Ticket, pos: int, env_id: int, result: Any) -> None:
        ticket.out[pos] = result
        ticket.remaining -= 1
        if ticket.is_async:  # stays in flight until polled
            self._ready.append((env_id, result, ""))

    def _fail(self, pending: _Pending, k: int, env_id: int, reason: str) -> None:
        """Env ``env_id`` (index ``k`` of ``pending``) failed: flag it and deliver the error."""
        self._broken[env_id] = reason
        if pending.op == "restore" or pending.ticket is None:
            return
        if pending.op == "reset":
            self._seeds[env_id] = None
            self._deliver(pending.ticket, pending.positions[k], env_id,
                          ("", error_info(reason), reason))
        else:
            self._deliver(pending.ticket, pending.positions[k], env_id, error_step(reason))

    # ------------------------------------------------------------------ recovery
    def _recover(self, worker: int, reason: str) -> None:
        """Replace a dead or stuck worker; flag the env it was running, bring back the rest.

        The env running when the worker died is known from the backend's progress marker;
        if it is unknown, every env of the request is flagged. The worker's other envs are
        rebuilt by reset + replay of the actions recorded since their reset, then the
        unfinished part of the request is sent again.
        """
        queue = self._queues[worker]
        head = queue.popleft()
        progress = self._backend.progress(worker)
        culprit = int(progress[0]) if progress is not None else -1
        log.warning("worker %d of %s backend: %s (env %s); restarting it", worker,
                    self.backend_name, reason, culprit if culprit >= 0 else "unknown")
        try:
            self._backend.restart(worker)
        except (BackendUnavailable, OSError, WorkerLost) as exc:
            # Without a worker its envs cannot run: fail them all, keep the pool consistent.
            log.error("restarting worker %d failed: %s", worker, exc)
            for pending in [head, *queue]:
                for k, i in enumerate(pending.env_ids):
                    self._fail(pending, k, i, f"{reason}; restart failed: {exc}")
            queue.clear()
            for i in self._backend.slices[worker]:
                self._broken.setdefault(i, f"worker lost: {exc}")
            return
        # Unknown culprit (died between envs): flag the whole request rather than risk a loop.
        guilty = [culprit] if culprit in head.env_ids else list(head.env_ids)
        for i in guilty:
            self._fail(head, head.env_ids.index(i), i, reason)
        rest: list[_Pending] = []
        if head.op != "restore":
            keep = [k for k, i in enumerate(head.env_ids) if i not in guilty]
            if keep:
                items: Any
                if head.op == "reset":
                    items = _regroup(head.items, {head.env_ids[k] for k in keep})
                    env_ids = [i for _, members in items for i in members]
                else:
                    env_ids = [head.env_ids[k] for k in keep]
                    items = (env_ids, [head.items[1][k] for k in keep])
                pos_of = dict(zip(head.env_ids, head.positions))
                seeds = None
                if head.seeds is not None:
                    seed_of = dict(zip(head.env_ids, head.seeds))
                    seeds = [seed_of[i] for i in env_ids]
                rest.append(_Pending(head.op, env_ids, items, head.ticket,
                                     [pos_of[i] for i in env_ids], seeds))
        waiting = list(queue)
        queue.clear()
        resetting = {i for p in (*rest, *waiting) if p.op == "reset" for i in p.env_ids}
        wanted = [i for i in self._backend.slices[worker]
                  if self._seeds[i] is not None and i not in self._broken and i not in resetting]
        turns = self._turns_since_reset(worker, wanted)
        restore = [(i, self._seeds[i], turns[i]) for i in wanted]
        if restore:
            queue.append(_Pending("restore", [r[0] for r in restore], restore, None, []))
        queue.extend(rest)
        queue.extend(waiting)
        if queue:
            self._send(worker, queue[0])


    def _turns_since_reset(self, worker: int, env_ids: list[int]) -> dict[int, list[Any]]:
        """Each env's turns since its reset, from its worker's log (for replay)."""
        turns: dict[int, list[Any]] = {i: [] for i in env_ids}
        if not env_ids:
            return turns
        log = self._log[worker]
        for index in range(min(self._mark[i] for i in env_ids), len(log)):
            ids, actions, single = log[index]
            for i, acts in zip(ids, actions):
                if i in turns and index >= self._mark[i]:
                    turns[i].append([acts] if single else acts)
        return turns

    def _compact_log(self, worker: int) -> None:
        """Forget log entries older than every live episode of the worker."""
        live = [self._mark[i] for i in self._backend.slices[worker]
                if self._seeds[i] is not None and i not in self._broken]
        cut = min(live) if live else len(self._log[worker])
        if cut:
            del self._log[worker][:cut]
            for i in self._backend.slices[worker]:
                self._mark[i] = max(0, self._mark[i] - cut)


def _regroup(items: list[tuple[int, list[int]]], keep: set[int]) -> list[tuple[int, list[int]]]:
    """Reset items restricted to ``keep`` (a group whose leader failed gets a new leader)."""
    out = []
    for seed, members in items:
        kept = [i for i in members if i in keep]
        if kept:
            out.append((seed, kept))
    return out


def _entry_point(env_type: str, env_kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Resolve a registered name to its entry point + merged kwargs, so envs registered only
    in this process still build in spawned workers. Fails here, not in a worker, on typos."""
    spec = registered().get(env_type)
    resolve(env_type)  # imports the class: an unknown env or a broken module fails early
    if spec is None:
        return env_type, dict(env_kwargs)
    return spec.entry_point, {**spec.kwargs, **env_kwargs}


def _start_backend(name: str, builds: list[EnvBuild], num_workers: int | None,
                   mp_context: str | None, options: dict[str, Any], fallback: bool) -> Backend:
    backend: Backend | None = None
    try:
        cls = get_backend(name)
        backend = cls(builds, num_workers, mp_context=mp_context, **options)
        backend.start(START_TIMEOUT)
        return backend
    except (BackendUnavailable, OSError, ImportError) as exc:
        if backend is not None:
            backend.close()
        if not fallback:
            raise
        log.warning("backend %r cannot start (%s); falling back to sequential", name, exc)
    seq = SequentialBackend(builds, 1)
    seq.start(START_TIMEOUT)
    return seq
