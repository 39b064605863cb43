"""The worker protocol: what a backend must do so that `EnvPool` can run envs on it.

The pool (``turnpool/pool.py``) decides *what* is computed: groups, seeds, which env gets which
actions, deadlines, fault recovery and result assembly. A backend decides *where*: it places a
fixed slice of env ids in each of its workers for the worker's whole life and moves one request
to a worker and one reply back. Adding a backend is one file with one `Backend` subclass.

Inside every worker, whatever the backend, an `EnvHost` owns that worker's envs and answers
requests; backends only ship requests to the host and its replies back, so env semantics,
exception capture and group copying are written once.

Wire format (plain tuples; a process backend pickles them once per worker per call):

* request ``(seq, op, payload)``; reply ``(seq, payload, error)`` where ``error`` is ``None``
  unless the host itself failed (then the pool treats every env in the request as failed).
* ``op == "reset"``: payload ``[(seed, [env_id, ...]), ...]``: one entry per group slice owned by
  this worker. The host resets the first env with ``seed`` and copies its state to the others
  (``get_state`` / ``set_state``), falling back to resetting each with the same seed if the env
  cannot be copied. Reply payload: one ``(obs, info, error)`` per env id, in request order.
* ``op == "step"``: payload ``(env_ids, action_lists)`` (``env_ids`` may be a ``range``). Each
  env executes its actions in order and stops at the first done. Reply payload
  ``(results, failed)``: one `StepTuple` per env, in request order,
  ``(obs, reward_sum, terminated, truncated, info, n_executed, error)``, and the indices of the
  results whose ``error`` is set (so the pool need not scan every result).
* ``op == "step1"``: the same with one bare action per env instead of a list (the common
  ``pool.step`` case, which saves building and pickling a list per env).
* ``op == "restore"``: payload ``[(env_id, seed, [[action, ...], ...]), ...]``: rebuild the env,
  reset it with ``seed`` and replay its turns with the same stop-at-first-done rule (the pool
  uses this to bring back the innocent envs of a worker that was killed). Reply payload: one
  ``error`` (``None`` on success) per env.

Backends never look inside payloads, so these formats can evolve without touching them.
* ``op == "close"``: close every env; no reply is needed.

Sequence numbers are chosen by the pool and echoed by the worker; the pool discards any reply
whose number it is not waiting for (a late reply from a worker it gave up on).

Fault model, as seen by a backend: exceptions inside env code never leave `EnvHost` (they
become per-env results with ``error`` set and done=True). A worker that dies, or that the pool
finds stuck past its deadline, is replaced by `Backend.restart`; the pool then identifies the
env that was running from `Backend.progress`, flags it, and restores the others by
reset + replay (deterministic envs make this exact).

Ready-first operation (``EnvPool.step_async`` / ``poll``) needs nothing more: several requests
may be outstanding on a worker, replies come back in request order, and `Backend.wait` reports
whichever workers have a reply ready.

Example (a backend that runs everything in the caller; see ``sequential.py``):
    >>> from turnpool.backends.base import EnvBuild, EnvHost
    >>> host = EnvHost([EnvBuild(0, "turnpool.envs.synthetic:TrivialEnv", {})])
    >>> seq, payload, error = host.handle((1, "reset", [(7, [0])]))
    >>> obs, info, err = payload[0]
    >>> err is None and info["success"] is False
    True
"""

from __future__ import annotations

import copy
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turnpool.envs.base import TextEnv
from turnpool.envs.registry import make

log = logging.getLogger(__name__)

#: ``(seq, op, payload)``
Request = tuple[int, str, Any]
#: ``(seq, payload, error)``
Reply = tuple[int, Any, "str | None"]
#: ``(obs, reward_sum, terminated, truncated, info, n_executed, error)``
StepTuple = tuple[str, float, bool, bool, dict[str, Any], int, "str | None"]

#: Cap on the length of an error text carried in ``info["error"]``.
MAX_ERROR_CHARS = 300


class BackendUnavailable(RuntimeError):
    """A backend could not start (missing package, start-method failure, worker import error)."""


class WorkerLost(RuntimeError):
    """A worker died (or was declared dead) before replying."""


@dataclass(frozen=True)
class EnvBuild:
    """How to build env ``env_id`` in any process: an entry point string and its kwargs.

    The pool resolves registered names to ``"module.path:ClassName"`` before shipping, so envs
    registered only in the parent still build in spawned workers.
    """

    env_id: int
    entry_point: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> TextEnv:
        return make(self.entry_point, **self.kwargs)


def short_error(exc: BaseException) -> str:
    """``"<ExcType>: message"``, bounded so a huge message cannot bloat replies."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def error_info(reason: str) -> dict[str, Any]:
    """The info dict of a failed env: the standard keys (so readers never KeyError) + error."""
    return {"success": False, "action_is_valid": False, "action_is_effective": False,
            "anchor_obs": "", "terminated": False, "truncated": True, "error": reason}


def error_step(reason: str, n_executed: int = 0) -> StepTuple:
    """A failed env's step result: done (truncated: the episode was cut, not finished), 0 reward."""
    return ("", 0.0, False, True, error_info(reason), n_executed, reason)


class EnvHost:
    """Owns a worker's envs and executes protocol requests against them.

    ``progress(env_id)`` is called before each env's work and with ``-1`` when a request is
    done, so a backend can tell the pool which env was running if the worker dies or hangs.
    """

    def __init__(self, builds: Sequence[EnvBuild],
                 progress: Callable[[int], None] | None = None) -> None:
        self.builds = {b.env_id: b for b in builds}
        self.envs: dict[int, TextEnv | None] = {}
        self.broken: set[int] = set()
        #: env id -> why it could not be built (a backend reports these when it starts)
        self.build_errors: dict[int, str] = {}
        self._progress = progress or _no_progress
        for env_id, b in self.builds.items():
            try:
                self.envs[env_id] = b.build()
            except Exception as exc:  # a broken env must not take its worker down
                log.warning("building env %d (%s) failed: %s", env_id, b.entry_point, exc)
                self.envs[env_id] = None
                self.broken.add(env_id)
                self.build_errors[env_id] = short_error(exc)

    # ------------------------------------------------------------------ dispatch
    def handle(self, request: Request) -> Reply:
        seq, op, payload = request
        try:
            if op == "step1":
                out: Any = self.step(payload, single=True)
            elif op == "step":
                out = self.step(payload)
            elif op == "reset":
                out = self.reset(payload)
            elif op == "restore":
                out = self.restore(payload)
            elif op == "close":
                self.close()
                out = None
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:  # a host bug: report it rather than kill the worker
            log.exception("worker request %s failed", op)
            return (seq, None, short_error(exc))
        finally:
            self._progress(-1)
        return (seq, out, None)

    # ------------------------------------------------------------------ ops
    def step(self, payload: tuple[Sequence[int], Sequence[Any]], single: bool = False
             ) -> tuple[list[StepTuple], list[int]]:
        """Run one turn per env; with ``single`` each env gets one bare action instead of a
        list. Returns the results and the indices of the envs that failed."""
        env_ids, actions = payload
        results: list[StepTuple] = []
        failed: list[int] = []
        append = results.append
        progress = self._progress
        envs = self.envs
        broken = self.broken
        for env_id, acts in zip(env_ids, actions):
            progress(env_id)
            env = envs.get(env_id)
            if env is None or env_id in broken:
                failed.append(len(results))
                append(error_step("env failed earlier; reset it"))
                continue
            n = 0
            try:
                if single:
                    obs, total, terminated, truncated, info = env.step(acts)
                    n = 1
                else:
                    obs, total, terminated, truncated, info, n = _turn(env, acts)
            except Exception as exc:
                broken.add(env_id)
                failed.append(len(results))
                append(error_step(short_error(exc), n))
                continue
            info["terminated"] = terminated
            info["truncated"] = truncated
            append((obs, total, terminated, truncated, info, n, None))
        return results, failed

    def reset(self, groups: Sequence[tuple[int, Sequence[int]]]
              ) -> list[tuple[str, dict[str, Any], str | None]]:
        results: list[tuple[str, dict[str, Any], str | None]] = []
        for seed, env_ids in groups:
            leader_out: tuple[str, dict[str, Any]] | None = None
            state: Any = None
            for env_id in env_ids:
                self._progress(env_id)
                try:
                    env = self._fresh_if_broken(env_id)
                    if leader_out is None:
                        leader_out = env.reset(seed=seed)
                        state = _snapshot(env)
                        results.append((leader_out[0], leader_out[1], None))
                    elif state is not None and _copy_into(env, state):
                        results.append((leader_out[0], copy.deepcopy(leader_out[1]), None))
                    else:
                        obs, info = env.reset(seed=seed)
                        results.append((obs, info, None))
                except Exception as exc:
                    self.broken.add(env_id)
                    reason = short_error(exc)
                    results.append(("", error_info(reason), reason))
        return results

    def restore(self, items: Sequence[tuple[int, int, Sequence[Sequence[Any]]]]
                ) -> list[str | None]:
        errors: list[str | None] = []
        for env_id, seed, turns in items:
            self._progress(env_id)
            try:
                self.broken.add(env_id)  # forces a fresh instance
                env = self._fresh_if_broken(env_id)
                env.reset(seed=seed)
                for acts in turns:
                    _turn(env, acts)
                errors.append(None)
            except Exception as exc:
                self.broken.add(env_id)
                errors.append(short_error(exc))
        return errors

    def close(self) -> None:
        for env in self.envs.values():
            if env is not None:
                try:
                    env.close()
                except Exception as exc:
                    log.warning("closing an env failed: %s", exc)
        self.envs.clear()

    # ------------------------------------------------------------------ helpers
    def _fresh_if_broken(self, env_id: int) -> TextEnv:
        env = self.envs.get(env_id)
        if env is None or env_id in self.broken:
            if env is not None:
                try:
                    env.close()
                except Exception as exc:
                    log.debug("closing a broken env failed: %s", exc)
            self.envs[env_id] = None
            env = self.builds[env_id].build()
            self.envs[env_id] = env
            self.broken.discard(env_id)
        return env


def _no_progress(env_id: int) -> None:
    pass


def _turn(env: TextEnv, actions: Sequence[Any]
          ) -> tuple[str, float, bool, bool, dict[str, Any], int]:
    """Execute ``actions`` in order, stopping at the first done; the last item says how many
    ran. An empty turn reports the current state without acting."""
    total = 0.0
    n = 0
    obs: str = ""
    terminated = truncated = False
    info: dict[str, Any] = {}
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        n += 1
        if terminated or truncated:
            break
    if n == 0:
        obs = env.render()
        info = {"success": False, "action_is_valid": False, "action_is_effective": False,
                "anchor_obs": env.anchor_obs()}
    return obs, total, terminated, truncated, info, n


def _snapshot(env: TextEnv) -> Any:
    try:
        return env.get_state()
    except Exception as exc:  # not copyable (e.g. holds a socket): reset each member instead
        log.debug("%s cannot snapshot its state (%s); resetting group members one by one",
                  type(env).__name__, exc)
        return None


def _copy_into(env: TextEnv, state: Any) -> bool:
    try:
        env.set_state(state)
    except Exception as exc:
        log.debug("%s cannot restore a snapshot (%s)", type(env).__name__, exc)
        return False
    return True


def split_evenly(env_ids: Sequence[int], num_workers: int) -> list[list[int]]:
    """Contiguous, near-equal slices (groups are contiguous, so most stay in one worker)."""
    n = len(env_ids)
    w = max(1, min(num_workers, n)) if n else 1
    bounds = [round(k * n / w) for k in range(w + 1)]
    return [list(env_ids[bounds[k]:bounds[k + 1]]) for k in range(w)]


def default_process_workers(num_envs: int) -> int:
    """One worker per usable core, never more than envs."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(num_envs, cores))


class Backend(ABC):
    """Where envs run. One instance serves one pool; worker ``k`` owns ``slices[k]`` for life.

    Lifecycle: ``__init__`` (cheap, no processes) -> ``start`` (may raise
    `BackendUnavailable`, after which the pool falls back to sequential) -> any number of
    ``send`` / ``wait`` / ``recv`` / ``restart`` -> ``close`` (idempotent, leaves nothing
    running).

    Subclasses set ``name`` and, when ``restart`` can stop a worker that is stuck in env code
    (a process can be killed, a thread cannot), ``can_interrupt = True``.
    """

    name: ClassVar[str] = "base"
    #: ``restart`` really stops a stuck worker (so ``step_timeout`` frees its resources).
    can_interrupt: ClassVar[bool] = False
    #: the ``mp_context`` values this backend honours (empty: it ignores ``mp_context``).
    start_methods: ClassVar[tuple[str, ...]] = ()
    #: worker count used when the caller passes ``num_workers=None``.
    @staticmethod
    def default_num_workers(num_envs: int) -> int:
        return 1

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, **options: Any) -> None:
        self.builds = list(builds)
        ids = [b.env_id for b in self.builds]
        workers = num_workers if num_workers else self.default_num_workers(len(ids))
        self.slices: list[list[int]] = split_evenly(ids, workers)
        self._by_id = {b.env_id: b for b in self.builds}
        self.mp_context = mp_context
        self.options = options

    @property
    def num_workers(self) -> int:
        return len(self.slices)

    def builds_of(self, worker: int) -> list[EnvBuild]:
        return [self._by_id[i] for i in self.slices[worker]]

    @abstractmethod
    def start(self, timeout: float) -> None:
        """Start every worker and build its envs, or raise `BackendUnavailable`."""

    @abstractmethod
    def send(self, worker: int, request: Request) -> None:
        """Queue ``request`` for ``worker``; must not block on env work."""

    @abstractmethod
    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        """Block up to ``timeout`` s until some of ``workers`` have a reply ready or are dead;
        return those (possibly none). Never spins."""

    @abstractmethod
    def recv(self, worker: int) -> Reply:
        """The worker's next reply, after `wait` reported it; raise `WorkerLost` if it died."""

    def progress(self, worker: int) -> tuple[int, float] | None:
        """``(env_id, since)`` of the env the worker is running (``-1`` between envs; ``since``
        is ``time.monotonic()`` in any process on this host), or None if unknown."""
        return None

    @abstractmethod
    def restart(self, worker: int) -> None:
        """Stop the worker (kill it if it can be killed) and start a fresh one with freshly
        built envs; replies of the old one must never surface."""

    @abstractmethod
    def close(self) -> None:
        """Stop every worker; idempotent; no process, thread or segment may remain."""

    def worker_pids(self) -> list[int]:
        """OS process ids of the workers, where they are processes (tests and diagnostics)."""
        return []


def monotonic() -> float:
    return time.monotonic()
