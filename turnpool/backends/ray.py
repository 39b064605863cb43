"""ray backend: one Ray actor per worker, each owning a slice of envs for its whole life.

An actor runs the request loop (`HandoffServer`) on a thread that reads an inbox fed by
``put`` calls and writes an outbox drained by ``take`` calls (with ``handoff_after=None``,
one ``call`` per request): a step is one call per actor. With ``ray_address`` the pool joins
that cluster; otherwise, unless Ray is up already, it starts a local runtime on 127.0.0.1
with the dashboard off and a small object store (``ray_init_kwargs`` overrides that), which
stays up for later pools. Actors default to ``num_cpus=0``; on a cluster of several nodes
worker ``k`` goes to node ``k mod n`` of the live nodes with CPUs (hard node affinity: Ray's
soft form and ``SPREAD`` packed every actor on one node), unless ``ray_actor_options`` names
a ``scheduling_strategy``. Every ``ray.get`` has a timeout; a stuck actor is killed with
``ray.kill`` and replaced (by the idle standby actor, by default); ``close`` waits until the
actors on this host are gone.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turnpool.backends.base import WorkerHandle, WorkerLost, one_per_core
from turnpool.backends.remote import Hello, RemoteBackend, WorkerInit, build_host
from turnpool.worker.build import EnvBuild
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Reply
from turnpool.worker.transport import ProgressSlot, serve

log = logging.getLogger(__name__)

#: Set before Ray is imported: loopback only, no auth token file, no usage reporting.
RAY_ENV_DEFAULTS = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # on Linux this keeps Ray on 127.0.0.1
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}
#: Local runtime started by the pool: text envs need little object store.
RAY_INIT_DEFAULTS: dict[str, Any] = {
    # a runtime of its own: without this, Ray joins the last cluster `ray start` left on the
    # machine (which refuses the settings below); `ray_address` is how a pool joins one
    "address": "local",
    "include_dashboard": False,
    "object_store_memory": 200 * 2**20,
    "log_to_driver": False,
    "configure_logging": False,
}
_EXIT_WAIT_S = 5.0


def ensure_ray(address: str | None = None, init_kwargs: dict[str, Any] | None = None) -> None:
    """Initialise Ray unless it already is."""
    loopback_chosen_by_user = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" in os.environ
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, **(init_kwargs or {}))
        return
    if not loopback_chosen_by_user:
        # Ray reads the switch once, when it is imported, and rewrites
        # ``_node_ip_address="127.0.0.1"`` to the host's address, so if Ray was imported
        # before this call the only way to keep a local runtime on loopback is its constant.
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    ray.init(**{**RAY_INIT_DEFAULTS, **(init_kwargs or {})})


class SliceActor:
    """The actor body (wrapped by ``ray.remote`` at start). Envs arrive with `load` (its
    answer is the `Hello`, so a standing `take` cannot consume it), not with the constructor,
    so an idle standby can take over a slice. `put` and `take` each run in a concurrency group
    of one thread (requests stay in order; a `take` waiting for a late result never blocks a
    `put`); an empty reply means the loop has ended."""

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def load(self, init: WorkerInit) -> Hello:
        import ray

        # the hello is this call's answer: a standing `take` must not consume it
        host, hello = build_host(init, ray.get_runtime_context().get_node_id())
        threading.Thread(target=self._serve, args=(host, init), daemon=True,
                         name="turnpool-ray-worker").start()
        return hello

    def _serve(self, host: EnvHost, init: WorkerInit) -> None:
        try:
            serve(self._inbox.get, self._outbox.put, host, init.handoff_after,
                  init.step_timeout)
        finally:
            self._outbox.put(b"")

    def ping(self) -> int:
        return os.getpid()

    def put(self, request: bytes) -> None:
        self._inbox.put(request)

    def take(self) -> bytes:
        return self._outbox.get()

    def call(self, request: bytes) -> bytes:
        """`put` and `take` in one call, where each request has one reply (no hand-off)."""
        self._inbox.put(request)
        return self._outbox.get()


def _nodes_with_cpus() -> list[str]:
    """The ids of the cluster's live nodes that have CPUs (all live ones if none has),
    sorted, so worker ``k`` goes to the same node in every run of the same cluster."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    with_cpus = [n for n in alive if n.get("Resources", {}).get("CPU", 0) > 0]
    return sorted(str(n["NodeID"]) for n in with_cpus or alive)


@functools.lru_cache(maxsize=1)
def _remote_class() -> Any:
    import ray

    # No Ray-level restarts: a restarted actor would come back with fresh envs behind the
    # pool's back; the pool restarts it itself and replays the innocent envs.
    # `put` and `take` each in a group of one thread, beside `load` and `ping`.
    options: dict[str, Any] = {"concurrency_groups": {"inbox": 1, "outbox": 1}}
    return ray.remote(max_restarts=0, max_task_retries=0, **options)(SliceActor)


@dataclass(eq=False, kw_only=True)
class _Actor(WorkerHandle):
    """A Ray actor handle, its ``load`` (on standby: ``ping``) call, and its calls in flight
    (``pending``: with hand-off one standing ``take``, else one ``call`` per request)."""

    runner: Any
    hello: Any = None
    pending: deque[Any] = field(default_factory=deque)
    #: the Ray node the actor runs on
    node: str = ""

    def join(self, timeout: float) -> None:
        import ray

        if self.pending and not self.lost:  # told to close, its loop ends with an empty reply
            with contextlib.suppress(Exception):
                ray.wait([self.pending[-1]], timeout=timeout)


class RayBackend(RemoteBackend[_Actor]):
    """``num_workers`` actors (default: one per usable core of this host, at most one per env);
    ``standby``: keep one idle actor, so that replacing a lost one costs a call."""

    name: ClassVar[str] = "ray"
    extra: ClassVar[str] = "ray"
    #: ray.init and Ray's calls raise many types (ConnectionError, RuntimeError, Ray's own)
    start_errors: ClassVar[tuple[type[BaseException], ...]] = (Exception,)

    @staticmethod
    def default_num_workers(num_envs: int) -> int:
        return one_per_core(num_envs)

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, ray_address: str | None = None,
                 ray_init_kwargs: dict[str, Any] | None = None,
                 ray_actor_options: dict[str, Any] | None = None, standby: bool = True,
                 **options: Any) -> None:
        super().__init__(builds, num_workers, mp_context=mp_context, **options)
        self._use_standby = standby
        self.ray_address = ray_address
        self.ray_init_kwargs = dict(ray_init_kwargs or {})
        self.actor_options: dict[str, Any] = {"num_cpus": 0, **(ray_actor_options or {})}
        #: the nodes worker k is placed on in turn (empty: Ray's own placement)
        self._nodes: list[str] = []
        self._hostname = socket.gethostname()
        self._killed: list[int] = []

    def _prepare(self) -> None:
        ensure_ray(self.ray_address, self.ray_init_kwargs)  # its errors: `start_errors`
        if "scheduling_strategy" not in self.actor_options:
            self._nodes = _nodes_with_cpus()

    def _launch(self, slot: int | None) -> _Actor:
        """A new actor: worker ``slot``'s on its node, or the standby (None)."""
        options = dict(self.actor_options)
        if self._nodes and slot is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            if self._started:  # a replacement: the nodes alive now
                self._nodes = _nodes_with_cpus() or self._nodes
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                self._nodes[slot % len(self._nodes)], soft=False)
        actor = _Actor(runner=_remote_class().options(**options).remote(),
                       progress=ProgressSlot(file=False), local=False)
        if slot is None:
            actor.hello = actor.runner.ping.remote()
        else:
            self._load(actor, slot)
        return actor

    def _load(self, worker: _Actor, slot: int) -> None:
        worker.progress = ProgressSlot()
        worker.hello = worker.runner.load.remote(self._init(slot, worker.progress))
        worker.pending = deque([_take(worker)] if self.handoff_after else [])

    def _await_hello(self, worker: _Actor, slot: int | None, deadline: float) -> Hello | None:
        import ray

        hello = ray.get(worker.hello, timeout=max(0.0, deadline - time.monotonic()))
        if slot is None:  # the standby's ping
            return None
        worker.local, worker.node = hello.hostname == self._hostname, hello.node
        return hello  # type: ignore[no-any-return]

    def worker_nodes(self) -> list[str | None]:
        """Per worker, the id of the Ray node its actor runs on (None: none now)."""
        return [a.node if a is not None and a.node else None for a in self._workers]

    def _stop(self, worker: _Actor) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(worker.runner, no_restart=True)
        if worker.local and worker.pid > 0:
            self._killed.append(worker.pid)  # its exit is awaited in close, not here
        worker.lost = True
        worker.progress.close()

    def _shutdown(self, workers: list[_Actor]) -> None:
        if not workers and not self._killed:
            return
        import ray

        if ray.is_initialized():  # else its actors ended with it
            super()._shutdown(workers)
        _wait_gone(self._killed, _EXIT_WAIT_S)
        for a in workers:
            a.progress.close()

    def _post(self, actor: _Actor, data: bytes) -> None:
        if self.handoff_after:  # replies come through the standing `take`
            actor.runner.put.options(concurrency_group="inbox").remote(data)
        else:  # one reply per request: one call (half the calls of put + take)
            actor.pending.append(actor.runner.call.options(concurrency_group="inbox").remote(data))

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        import ray

        heads: dict[Any, int] = {}
        dead: list[int] = []
        for k in workers:
            actor = self._workers[k]
            if actor is None or actor.lost:
                dead.append(k)
            elif actor.pending:
                heads[actor.pending[0]] = k
        if dead or not heads:
            return dead
        refs = list(heads)
        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and rest:  # collect whatever else is already done, without waiting
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        return sorted(heads[r] for r in ready)

    def recv(self, worker: int) -> Reply:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        actor = self._live(worker)
        data, why = b"", "ray actor is gone"
        try:
            if actor.pending:
                data, why = ray.get(actor.pending.popleft(), timeout=self._timeout), ""
        except RayActorError as exc:
            why = f"ray actor died ({type(exc).__name__})"
        except GetTimeoutError:
            why = "ray actor did not reply"
        if data:
            if self.handoff_after:
                actor.pending.append(_take(actor))
            reply: Reply = pickle.loads(data)
            return reply
        actor.lost = True
        raise WorkerLost(why or "ray actor stopped serving")

    def worker_dead(self, worker: int) -> bool:
        # Ray can take longer than a step deadline to report a dead actor; on this host the
        # process table answers at once.
        actor = self._workers[worker]
        return actor is not None and actor.local and actor.pid > 0 and not _alive(actor.pid)


def _take(actor: _Actor) -> Any:
    """The call that returns the actor's next reply."""
    return actor.runner.take.options(concurrency_group="outbox").remote()


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Block (bounded) until these local processes have exited; Ray kills actors
    asynchronously and a pool must not return from close with its workers still alive."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while pid > 0 and _alive(pid):
            if time.monotonic() >= deadline:
                log.warning("ray actor process %d still alive after %.0f s", pid, timeout)
                return
            time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a reaped-late zombie is as good as gone
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return True


__all__ = ["RAY_ENV_DEFAULTS", "RAY_INIT_DEFAULTS", "RayBackend", "SliceActor", "ensure_ray"]
