"""EnvPool: many text envs in groups, stepped in parallel on any backend, faults isolated.

The pool is backend-agnostic: it decides seeds, groups, which worker gets which actions,
deadlines and fault recovery; a `turnpool.backends.base.Backend` decides where envs run
(``sequential``, ``thread``, ``process``, ...). Results are byte-identical for every backend,
worker count and start method because each env's randomness comes only from its reset seed.

Groups: env ``i`` belongs to group ``i // group_n``; all members of a group get the group's
seed, so they start from the same state. The pool resets one member per group in each worker
that owns members and copies the state to the others (one Sokoban room generation per group).

Seeds: group ``g``'s reset seed is ``base + g``, with ``base`` the explicit ``reset(seed=...)``
or, for a seedless ``reset()``, ``seed + episode * n_groups`` (``episode`` counts seedless
resets, so they never reuse a seed); `reset_async` also takes a group -> seed mapping.

Faults: an env that raises, a dead worker and a step past ``step_timeout`` give that env a
result with ``done=True`` (``truncated``), reward 0, ``info["error"]``, ``info["failure"]`` and
``info["retryable"]`` (`turnpool.worker.failures.FAILURE_CLASSES`); it stays failed until its
next reset, which rebuilds it. Envs that cannot be built raise `EnvConstructionError` from the
constructor; a named backend that cannot start raises `BackendUnavailable` naming the fix
(``auto``, or ``fallback=True``, runs sequentially, with a warning). A dead or stuck worker is
replaced; its other envs are rebuilt by reset + replay of their recorded actions, so their
results are as if nothing happened. ``on_error="raise"`` raises `EnvError` after the step.

Parts: this module is the public API (argument checks in ``arguments.py``); a pool holds one
`turnpool.pool.dispatch.Dispatcher` (queues, deadlines, recovery), which owns the
`turnpool.pool.table.EnvTable` (each env's owner, seed, turns to replay, status: ask it
through `EnvPool.owner_of` and `EnvPool.env_record`). Backends start by name
(`turnpool.backends.start_backend`), so adding one never touches the pool.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import turnpool.pool.branch as branch
import turnpool.pool.calls as calls
from turnpool.backends import start_backend
from turnpool.backends.base import Backend
from turnpool.envs.registry import EnvTarget, build_target, target_name
from turnpool.pool.arguments import check_arguments, check_int
from turnpool.pool.branch import Snapshot
from turnpool.pool.dispatch import Dispatcher
from turnpool.pool.errors import EnvConstructionError, EnvError
from turnpool.pool.requests import Ticket
from turnpool.pool.table import EnvRecord
from turnpool.worker.build import EnvBuild
from turnpool.worker.defaults import DEFAULT_MP_CONTEXT, DEFAULT_STEP_TIMEOUT, START_TIMEOUT
from turnpool.worker.errors import EnvBuildError
from turnpool.worker.results import ResetResult, TurnResult, as_turn_results

log = logging.getLogger(__name__)
#: the index of ``error`` in a `TurnResult` (and its plain-tuple form)
_ERROR = TurnResult._fields.index("error")


@dataclass(frozen=True)
class EnvGroupSpec:
    """One block of a multi-type pool (a RAGEN ``es_manager`` tag): ``n_groups`` groups of
    ``env_type``, laid out after the blocks before it."""

    tag: str
    env_type: EnvTarget
    n_groups: int
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    #: per-env kwargs over ``env_kwargs``, one mapping per env of the block in order (empty:
    #: every env gets ``env_kwargs``); RAGEN v2's per-instance numbers (Bandit's
    #: ``internal_seed``) travel here
    member_kwargs: Sequence[Mapping[str, Any]] = ()


class EnvPool:
    """A pool of ``env_num * group_n`` text envs (or a multi-type pool, see `from_specs`).

    Args:
        env_type: a registered env name, a gymnasium id (``"FrozenLake-v1"``: observations
            become text, see `turnpool.envs.gym_adapter`), ``"module.path:ClassName"`` or a
            picklable factory callable returning a `TextEnv` or a gymnasium env.
        env_num: number of groups; group_n: envs per group (same seed within a group).
        seed: base seed; group ``g`` of the first seedless reset uses ``seed + g``.
        env_kwargs: constructor arguments for every env.
        backend: ``"auto"`` (default: measures the env and picks sequential, thread or
            process), ``"sequential"``, ``"thread"``, ``"process"`` or any other name in
            `turnpool.backends.BACKENDS`.
        num_workers: worker count (default: the backend's, e.g. one process per core).
        mp_context: ``"spawn"`` (default), ``"forkserver"`` or ``"fork"`` for process backends.
        step_timeout: seconds one env may spend on one turn before it is flagged
            (``timeout``; None: no deadline); a worker that cannot answer for it (a hang
            holding the GIL) is replaced, its other envs restored. reset_timeout: the same
            for a reset (default: ``step_timeout``).
        on_error: ``"flag"`` (failed envs return done + ``info["error"]``) or ``"raise"``
            (`EnvError` after the call).
        fallback: run sequentially, with a logged warning, if the named backend cannot start
            (default: raise `BackendUnavailable`; ``auto`` always falls back).
        lazy_build: build each env at its first reset, not at start (the first env of each
            type still is, so one that cannot be built fails the constructor).
        tag: the tag reported in ``pool.tags`` (default: ``env_type``).
        ray_address, backend_options: passed to the backend.
        specs: the blocks of a multi-type pool (`from_specs`), instead of ``env_type``,
            ``env_num``, ``env_kwargs`` and ``tag``.

    Not thread-safe: drive one pool from one thread.
    """

    def __init__(self, env_type: EnvTarget = "sokoban", env_num: int = 1, group_n: int = 1,
                 seed: int = 0, env_kwargs: dict[str, Any] | None = None, *,
                 backend: str = "auto", num_workers: int | None = None,
                 mp_context: str | None = DEFAULT_MP_CONTEXT,
                 step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
                 reset_timeout: float | None = None, on_error: str = "flag",
                 fallback: bool = False, tag: str | None = None,
                 ray_address: str | None = None, lazy_build: bool = False,
                 specs: Sequence[EnvGroupSpec] | None = None, **backend_options: Any) -> None:
        self._closed = True  # until a backend is running
        if specs is None:
            if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
                raise TypeError(f"env_kwargs must be a dict, got {type(env_kwargs).__name__}")
            specs = [EnvGroupSpec(tag or target_name(env_type), env_type, env_num,
                                  dict(env_kwargs or {}))]
        specs = list(specs)
        check_arguments(EnvPool.__init__, specs, group_n, seed, backend, num_workers,
                        mp_context, step_timeout, reset_timeout, on_error, backend_options)
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
            first = len(builds)
            members = list(spec.member_kwargs)
            if members and len(members) != spec.n_groups * self.group_n:
                raise ValueError(f"tag {spec.tag!r}: member_kwargs has {len(members)} entries "
                                 f"for {spec.n_groups * self.group_n} envs")
            for _ in range(spec.n_groups):
                for _ in range(self.group_n):
                    lazy = bool(lazy_build) and len(builds) > first
                    own = {**kwargs, **members[len(builds) - first]} if members else kwargs
                    builds.append(EnvBuild(len(builds), entry, own, lazy))
                    self.group_ids.append(group)
                    self.tags.append(spec.tag)
                    self.env_types.append(target_name(spec.env_type))
                group += 1
        if not builds:
            raise ValueError("the pool has no envs")
        self.n_groups = group
        self.env_num = group
        self._episode = 0
        self._tickets = 0
        options = dict(backend_options)
        if ray_address is not None:
            options["ray_address"] = ray_address
        try:
            self._backend = start_backend(backend, builds, num_workers, mp_context, options,
                                          (self.step_timeout, self.reset_timeout), START_TIMEOUT,
                                          fallback=fallback)
        except EnvBuildError as exc:
            env_id, cause = sorted(exc.errors.items())[0]
            kwargs = next(b.kwargs for b in builds if b.env_id == env_id)
            more = len(exc.errors) - 1
            raise EnvConstructionError(
                f"cannot build env {env_id} (tag {self.tags[env_id]!r}, type "
                f"{self.env_types[env_id]!r}, kwargs {kwargs!r}): {cause}"
                + (f" ({more} more env(s) failed too)" if more else "")) from None
        #: per env, what it is (entry point and kwargs): a snapshot restores only into the same
        self._env_keys = [f"{b.entry_point}({b.kwargs!r})" for b in builds]
        self._closed = False
        self._finalizer = weakref.finalize(self, self._backend.close)
        self._dispatch = Dispatcher(self._backend, len(builds), self.step_timeout,
                                    self.reset_timeout)

    @classmethod
    def from_specs(cls, specs: Sequence[EnvGroupSpec], group_n: int, seed: int = 0,
                   **kwargs: Any) -> EnvPool:
        """A pool of several env types (RAGEN tags), laid out in ``specs`` order; group ids
        run on across specs, so seeds never collide between tags."""
        return cls(group_n=group_n, seed=seed, specs=specs, **kwargs)

    # ------------------------------------------------------------------ properties
    @property
    def num_envs(self) -> int:
        return len(self.group_ids)

    @property
    def backend_name(self) -> str:
        return self._backend.label

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
        return list(self._dispatch.table.seeds)

    def owner_of(self, env_id: int) -> int:
        """The worker index that holds env ``env_id`` (fixed for the pool's life)."""
        return self._dispatch.table.owner_of(env_id)

    def env_record(self, env_id: int) -> EnvRecord:
        """Env ``env_id``'s row of the pool's env table: owner, episode seed and mark, status
        (idle, in flight, straggling, failed with its reason and class)."""
        return self._dispatch.table.record(env_id)

    def worker_pids(self) -> list[int]:
        """OS pids of the worker processes (empty for in-process backends)."""
        return self._backend.worker_pids()

    # ------------------------------------------------------------------ reset
    def reset(self, seed: int | None = None, env_ids: Sequence[int] | None = None
              ) -> tuple[list[str], list[dict[str, Any]]]:
        """Start new episodes; returns ``(obs, infos)`` aligned to ``env_ids`` (default: all).

        Group ``g`` gets seed ``base + g``; see the module docstring for ``base``.
        """
        ids = self._ids_of(env_ids)
        ticket = Ticket(ids, is_async=False)
        self._dispatch.resets(ticket, self._reset_base(seed, ids), self.group_ids)
        self._dispatch.finish(ticket)
        results: list[ResetResult] = ticket.out
        obs = [r.obs for r in results]
        infos = [r.info for r in results]
        self._raise_if_needed(ids, [r.error for r in results])
        return obs, infos

    def reset_async(self, seed: int | Mapping[int, int] | None = None,
                    env_ids: Sequence[int] | None = None) -> None:
        """`reset` without waiting: each env's `ResetResult` comes from `poll`, ready first,
        like a turn's (the envs are in flight until then). ``seed`` may also map each group
        of ``env_ids`` to its own seed: many groups, each to a seed of its own, in one call
        (one request per worker, as any reset)."""
        ids = self._ids_of(env_ids)
        self._dispatch.resets(Ticket(ids, is_async=True), self._reset_base(seed, ids),
                              self.group_ids)

    def _reset_base(self, seed: int | Mapping[int, int] | None, ids: list[int]
                    ) -> int | dict[int, int]:
        """The seed base of a reset: the pool's schedule when ``seed`` is None; a mapping
        of groups to seeds is checked and passed on."""
        if isinstance(seed, Mapping):
            for s in seed.values():
                check_int("seed", s, 0)
            seeds = {int(g): int(s) for g, s in seed.items()}
            missing = {self.group_ids[i] for i in ids} - seeds.keys()
            if missing:
                raise ValueError(f"no seed for groups {sorted(missing)[:5]}")
            return seeds
        if seed is None:
            base = self.seed + self._episode * self.n_groups
            self._episode += 1
            return base
        check_int("seed", seed)
        # a base below 0 is fine as long as every env reset here gets a seed >= 0
        check_int("seed (+ group index of the envs reset)",
                   int(seed) + min((self.group_ids[i] for i in ids), default=0), 0)
        return int(seed)

    # ------------------------------------------------------------------ step
    def step(self, actions: Sequence[Any], env_ids: Sequence[int] | None = None
             ) -> tuple[list[str], list[float], list[bool], list[dict[str, Any]]]:
        """One action per env; returns ``(obs, rewards, dones, infos)`` aligned to ``env_ids``.

        ``dones[k]`` is ``terminated or truncated``; both are also in ``infos[k]``.
        """
        res = self._run_turns(list(actions), env_ids, single=True)
        if not res:
            return [], [], [], []
        # TurnResult's fields, unpacked in its declared order (one C-level transpose; this is
        # the per-env hot path)
        obs, rewards, terminated, truncated, infos, _, _ = zip(*res)
        return (list(obs), list(rewards), list(map(operator.or_, terminated, truncated)),
                list(infos))

    def step_turns(self, action_lists: Sequence[Sequence[Any]],
                   env_ids: Sequence[int] | None = None) -> list[TurnResult]:
        """Multi-action turns: each env executes its actions in order inside its worker and
        stops at the first done. Results are aligned to ``env_ids``."""
        return as_turn_results(self._run_turns([list(a) for a in action_lists], env_ids))

    def step_async(self, env_ids: Sequence[int] | None,
                   action_lists: Sequence[Sequence[Any]]) -> int:
        """Start multi-action turns without waiting; collect them with `poll`. Returns a
        ticket number (the order of the call; results carry env ids, not tickets).

        Envs already in flight cannot be stepped again until their result was polled.
        Unlike `step` / `step_turns` (actions first), the env ids come first here: both are
        sequences, so reordering would silently misroute existing positional callers; pass
        ``env_ids=`` and ``action_lists=`` by keyword to read the same everywhere.
        """
        ids = self._ids(env_ids, len(action_lists))
        ticket = Ticket(ids, is_async=True)
        self._dispatch.turns(ticket, [list(a) for a in action_lists])
        self._tickets += 1
        return self._tickets

    def poll(self, timeout: float | None = 0.0, min_ready: int = 1
             ) -> list[tuple[int, Any]]:
        """Results of `step_async` turns (`TurnResult`) and `reset_async` resets
        (`ResetResult`) that are done, ready first, as ``(env_id, result)``.

        Blocks until at least ``min_ready`` results are available (or none are in flight) or
        ``timeout`` seconds pass; ``step_timeout`` is enforced meanwhile.
        """
        self._check_open()
        want = max(0, int(min_ready))
        table = self._dispatch.table
        self._dispatch.pump(lambda: len(table.ready) >= want, timeout)
        # With on_error="raise" the failed envs are reported; the others stay ready for the
        # next poll, so an exception never swallows a result.
        out, failed = table.take_ready(hold_if_failed=self.on_error == "raise")
        self._raise_if_needed([i for i, _ in failed], [r.error for _, r in failed])
        return out

    def wait_fds(self) -> tuple[list[int], bool] | None:
        """File descriptors that become readable when a result for `poll` may be ready (a
        worker with something in flight answered or died), for a caller that waits on them
        with its own (a `turnpool.pool.slots.SlotEngine` waits on its inbox too), then polls
        with timeout 0, and whether every worker has a request out (one sent now would wait
        behind it); None when the backend has no fds to give (threads, Ray: poll with a
        timeout instead)."""
        self._check_open()
        return self._dispatch.wait_fds()

    def forget(self, env_ids: Sequence[int]) -> None:
        """The caller is done with these envs' current episodes (a server session ended):
        they are no longer restored after a worker loss (a step without a reset first then
        fails), and the replay log stops keeping their turns, which an abandoned episode
        would otherwise hold for good."""
        self._check_open()
        ids = [int(i) for i in env_ids]
        n = self.num_envs
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise IndexError(f"env id {bad[0]} out of range [0, {n})")
        self._dispatch.table.forget(ids)

    def call(self, name: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
             env_ids: Sequence[int] | None = None) -> list[Any]:
        """Each env's attribute ``name`` (called with ``args`` / ``kwargs`` if callable) in
        its worker: the values, aligned to ``env_ids`` (`turnpool.pool.calls`)."""
        return calls.call(self._dispatch, self._ids_of(env_ids), name, args, dict(kwargs or {}))

    def set_attr(self, name: str, values: Sequence[Any], env_ids: Sequence[int] | None = None
                 ) -> None:
        """Set each env's attribute ``name`` to its value (`turnpool.pool.calls`)."""
        calls.set_attr(self._dispatch, self._ids_of(env_ids), name, list(values))

    # ------------------------------------------------------------------ branching
    def snapshot(self, env_ids: Sequence[int]) -> list[Snapshot]:
        """Each env's state mid-episode as a `Snapshot` value (picklable; restore it into
        any env of the same type, in this pool or another). ValueError for an unknown env,
        one with no live episode or a finished one."""
        return branch.snapshot(self._dispatch, self._env_keys, self._branch_ids(env_ids))

    def episode(self, env_id: int) -> Snapshot:
        """Env ``env_id``'s episode as a `Snapshot` without its state: the seed and the turns
        since, from the pool's own record (no worker is asked, so it is cheap), restored by
        reset + replay. It cannot see whether the last turn ended the episode (`snapshot`
        refuses a finished one): restoring such a snapshot replays to that end. ValueError
        for an unknown env or one with no live episode."""
        return branch.episode(self._dispatch, self._env_keys, self._branch_ids([env_id])[0])

    def restore(self, env_ids: Sequence[int], snapshots: Sequence[Snapshot]
                ) -> tuple[list[str], list[dict[str, Any]]]:
        """Put each env in its snapshot's state; returns ``(obs, infos)`` (the current
        observation). Its next steps equal the snapshotted env's byte for byte. ValueError
        for a foreign snapshot or one of another env type."""
        return branch.restore(self._dispatch, self._env_keys, self._branch_ids(env_ids),
                              snapshots)

    def fork(self, src_id: int, dst_ids: Sequence[int]
             ) -> tuple[list[str], list[dict[str, Any]]]:
        """Copy env ``src_id`` mid-episode into each of ``dst_ids`` (on any worker): each
        continues exactly as the source would. Returns the destinations' ``(obs, infos)``."""
        src = self._branch_ids([src_id])[0]
        return branch.fork(self._dispatch, self._env_keys, src, self._branch_ids(dst_ids))

    @property
    def in_flight(self) -> frozenset[int]:
        """Env ids whose `step_async` results have not been polled yet."""
        return frozenset(self._dispatch.table.in_flight)

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

    def _ids_of(self, env_ids: Sequence[int] | None) -> list[int]:
        self._check_open()
        ids = list(range(self.num_envs)) if env_ids is None else [int(i) for i in env_ids]
        self._check_ids(ids)
        return ids

    def _check_ids(self, ids: list[int]) -> None:
        n = self.num_envs
        for i in ids:
            if not 0 <= i < n:
                raise IndexError(f"env id {i} out of range [0, {n})")
        if len(set(ids)) != len(ids):
            raise ValueError("env_ids contains duplicates")
        busy = self._dispatch.table.busy(ids)
        if busy:
            raise RuntimeError(f"envs {sorted(busy)[:5]} are still in flight; poll() first")

    def _branch_ids(self, env_ids: Sequence[int]) -> list[int]:
        """The ids of a branching call: ValueError for an unknown one (their results are
        values, not per-env records, so a bad id is bad input, not an index)."""
        self._check_open()
        ids = [int(i) for i in env_ids]
        for i in ids:
            if not 0 <= i < self.num_envs:
                raise ValueError(f"unknown env id {i}: the pool has envs [0, {self.num_envs})")
        self._check_ids(ids)
        return ids

    def _ids(self, env_ids: Sequence[int] | None, n_actions: int) -> list[int]:
        self._check_open()
        if env_ids is None:
            ids = list(range(self.num_envs))
            if self._dispatch.table.in_flight:
                self._check_ids(ids)
        else:
            ids = [int(i) for i in env_ids]
            self._check_ids(ids)
        if len(ids) != n_actions:
            raise ValueError(f"got {n_actions} actions for {len(ids)} envs")
        return ids

    def _run_turns(self, action_lists: list[Any], env_ids: Sequence[int] | None,
                   single: bool = False) -> list[Any]:
        """One turn per env, each result a `TurnResult` or its plain-tuple form (`WireTurn`,
        same fields in the same order: `Dispatcher` files a synchronous call's rows as they
        came off the wire)."""
        ids = self._ids(env_ids, len(action_lists))
        ticket = Ticket(ids, is_async=False)
        self._dispatch.turns(ticket, action_lists, whole=env_ids is None, single=single)
        self._dispatch.finish(ticket)
        out: list[Any] = ticket.out
        if self.on_error == "raise":
            self._raise_if_needed(ids, [r[_ERROR] for r in out])
        return out

    def _raise_if_needed(self, ids: Sequence[int], errors: Sequence[str | None]) -> None:
        if self.on_error != "raise":
            return
        failed = {i: e for i, e in zip(ids, errors) if e is not None}
        if failed:
            raise EnvError(failed)


def _entry_point(env_type: EnvTarget, env_kwargs: dict[str, Any]
                 ) -> tuple[str, dict[str, Any]]:
    """What workers rebuild the env from (`turnpool.envs.registry.build_target`); fails
    here, not in a worker, on typos."""
    return build_target(env_type, env_kwargs)
