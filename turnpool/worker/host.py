"""EnvHost: the one place where envs run, inside every worker of every backend.

Backends only ship requests to a host and its replies back, so env semantics, exception
capture, multi-action turns and group state copying are written once and behave the same on
every backend. A host never lets an exception from env code escape: a failing env becomes a
result with ``error`` set, and the host goes on serving the other envs of its worker.

Example (a backend that runs everything in the caller; see ``backends/sequential.py``):
    >>> from turnpool.worker.host import EnvHost
    >>> from turnpool.worker.build import EnvBuild
    >>> from turnpool.worker.protocol import Op
    >>> host = EnvHost([EnvBuild(0, "turnpool.envs.synthetic:TrivialEnv", {})])
    >>> seq, op, payload, failure, error = host.handle((1, Op.RESET, [(7, [0])]))
    >>> failure is None and payload[0].error is None and payload[0].info["success"] is False
    True
"""

from __future__ import annotations

import copy
import logging
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from turnpool.envs.base import TextEnv
from turnpool.worker.build import EnvBuild
from turnpool.worker.deadline import TIMED_OUT, StepInterrupted
from turnpool.worker.errors import bounded, short_error
from turnpool.worker.failures import failure_of_exception
from turnpool.worker.protocol import (
    OPS,
    CallPayload,
    CallReply,
    ForkPayload,
    ForkReply,
    LoadPayload,
    Op,
    Reply,
    Request,
    ResetPayload,
    ResetReply,
    RestorePayload,
    RestoreReply,
    SetAttrPayload,
    SnapshotPayload,
    SnapshotReply,
    StepPayload,
    StepReply,
    failed_reply,
)
from turnpool.worker.results import (
    CallResult,
    ResetResult,
    StateResult,
    error_reset,
    error_step,
)

log = logging.getLogger(__name__)


class EnvHost:
    """Owns a worker's envs and executes protocol requests against them.

    ``progress(env_id)`` is called before each env's work and with ``-1`` when a request is
    done, so a backend can tell the pool which env was running if the worker dies or hangs
    (the sequential backend rebinds `progress` when a request runs on its worker's lane).
    """

    _handlers: dict[Op, Callable[[EnvHost, Any], Any]]

    def __init__(self, builds: Sequence[EnvBuild],
                 progress: Callable[[int], None] | None = None) -> None:
        self.builds = {b.env_id: b for b in builds}
        self.envs: dict[int, TextEnv | None] = {}
        self.broken: set[int] = set()
        #: env id -> why it could not be built (a backend reports these when it starts)
        self.build_errors: dict[int, str] = {}
        self.progress = progress or _no_progress
        #: lazy envs not built yet (they are at their first reset)
        self.unbuilt: set[int] = set()
        #: envs whose episode is finished (a done turn), until their next reset or load
        self.finished: set[int] = set()
        for env_id, b in self.builds.items():
            if b.lazy:
                self.envs[env_id] = None
                self.unbuilt.add(env_id)
                continue
            try:
                self.envs[env_id] = b.build()
            except Exception as exc:  # a broken env must not take its worker down
                log.debug("building env %d (%s) failed: %s", env_id, b.entry_point, exc)
                self.envs[env_id] = None
                self.broken.add(env_id)
                self.build_errors[env_id] = short_error(exc)

    # ------------------------------------------------------------------ dispatch
    def handle(self, request: Request) -> Reply:
        seq, op, payload = request
        try:
            out = self._handlers[op](self, payload)
        except Exception as exc:  # a host bug: report it rather than kill the worker
            log.exception("worker request %s failed", op)
            return failed_reply(request, short_error(exc), "worker_lost")
        finally:
            self.progress(-1)
        return (seq, op, out, None, None)

    # ------------------------------------------------------------------ ops
    def step1(self, payload: StepPayload) -> StepReply:
        """`Op.STEP1`: one bare action per env."""
        return self.step(payload, single=True)

    def step(self, payload: StepPayload, single: bool = False) -> StepReply:
        """Run one turn per env; with ``single`` each env gets one bare action instead of a
        list. Returns the results (`WireTurn` tuples) and the indices of the envs that failed."""
        env_ids, actions = payload
        results: list[Any] = [None] * len(env_ids)
        failed: list[int] = []
        self.run_turns(enumerate(zip(env_ids, actions)), single, results, failed,
                       self.progress)
        return results, failed

    def run_turns(self, claim: Iterator[tuple[int, tuple[int, Any]]], single: bool,
                  results: list[Any], failed: list[int], at: Callable[[int], None]) -> None:
        """Run the turns ``claim`` yields as ``(k, (env_id, actions))``: ``results[k]`` gets
        the env's `WireTurn` and ``k`` goes to ``failed`` if it failed; ``at(env_id)`` is
        called before each env.

        Several threads may drain one ``claim`` (a worker hands the rest of a stalled request
        to another thread, `turnpool.worker.handoff`): ``next`` on an ``enumerate(zip(...))``
        of lists or ranges runs no Python code, so under the GIL each env is claimed once.
        An env abandoned meanwhile (no longer this host's object for its id) is not flagged.
        """
        envs = self.envs
        broken = self.broken
        finished = self.finished
        for k, (env_id, acts) in claim:
            at(env_id)
            env = envs.get(env_id)
            if env is None or env_id in broken:
                failed.append(k)
                if env_id in self.unbuilt:
                    results[k] = error_step("env has no episode yet; reset it first")
                else:
                    results[k] = error_step("env failed earlier; reset it",
                                            failure="construct_error" if env is None
                                            else "env_error")
                continue
            n = 0
            try:
                if single:
                    obs, total, terminated, truncated, info = env.step(acts)
                    n = 1
                else:
                    obs, total, terminated, truncated, info, n = _turn(env, acts)
            except Exception as exc:
                if envs.get(env_id) is env:
                    broken.add(env_id)
                failed.append(k)
                results[k] = error_step(short_error(exc), n, failure=failure_of_exception(exc))
                continue
            except StepInterrupted:  # ran past its deadline in this process
                if envs.get(env_id) is env:
                    broken.add(env_id)
                failed.append(k)
                results[k] = error_step(TIMED_OUT, n, failure="timeout")
                continue
            if terminated or truncated:
                finished.add(env_id)
            info["terminated"] = terminated
            info["truncated"] = truncated
            results[k] = (obs, total, terminated, truncated, info, n, None)

    def abandon(self, env_id: int) -> None:
        """Forget env ``env_id`` without closing it (a thread is stuck in it): it is failed
        until its next reset builds a fresh one."""
        self.envs[env_id] = None
        self.broken.add(env_id)

    def reset(self, groups: ResetPayload) -> ResetReply:
        results: list[ResetResult] = []
        for seed, env_ids in groups:
            leader_out: tuple[str, dict[str, Any]] | None = None
            state: Any = None
            for env_id in env_ids:
                self.progress(env_id)
                self.finished.discard(env_id)
                try:
                    env = self._fresh_if_broken(env_id)
                    if leader_out is None:
                        leader_out = env.reset(seed=seed)
                        state = _snapshot(env)
                        results.append(ResetResult(leader_out[0], leader_out[1], None))
                    elif state is not None and _copy_into(env, state):
                        results.append(ResetResult(leader_out[0], copy.deepcopy(leader_out[1]),
                                                   None))
                    else:
                        obs, info = env.reset(seed=seed)
                        results.append(ResetResult(obs, info, None))
                except _BuildFailed as exc:
                    self.broken.add(env_id)
                    results.append(error_reset(str(exc), failure="construct_error"))
                except Exception as exc:
                    self.broken.add(env_id)
                    results.append(error_reset(short_error(exc)))
                except StepInterrupted:
                    self.broken.add(env_id)
                    results.append(error_reset(TIMED_OUT.replace("step", "reset"),
                                               failure="timeout"))
        return results

    def restore(self, items: RestorePayload) -> RestoreReply:
        errors: list[str | None] = []
        for env_id, seed, turns in items:
            self.progress(env_id)
            try:
                self._replayed(env_id, seed, turns)
                errors.append(None)
            except Exception as exc:
                self.broken.add(env_id)
                errors.append(short_error(exc))
            except StepInterrupted:
                self.broken.add(env_id)
                errors.append(TIMED_OUT)
        return errors

    def snapshot(self, env_ids: SnapshotPayload) -> SnapshotReply:
        """`Op.SNAPSHOT`: each env's state (``None`` for a class branched by replay)."""
        out: list[StateResult] = []
        for env_id in env_ids:
            self.progress(env_id)
            env = self.envs.get(env_id)
            if env is None or env_id in self.broken:
                out.append(StateResult(None, False, "env has no live episode; reset it"))
                continue
            finished = env_id in self.finished
            if finished or not type(env).snapshot_by_state:
                out.append(StateResult(None, finished, None))
                continue
            try:
                out.append(StateResult(env.get_state(), False, None))
            except Exception as exc:
                out.append(StateResult(None, False, short_error(exc)))
        return out

    def load(self, items: LoadPayload) -> ResetReply:
        """`Op.LOAD`: put each env in a snapshot's state (by state, else by reset + replay);
        answer its current observation."""
        out: list[ResetResult] = []
        for env_id, seed, turns, state in items:
            self.progress(env_id)
            try:
                if state is None:
                    env = self._replayed(env_id, seed, turns)
                else:
                    env = self._fresh_if_broken(env_id)
                    env.set_state(state)
                    self.finished.discard(env_id)
                obs, _, _, _, info, _ = _turn(env, ())
                out.append(ResetResult(obs, info, None))
            except Exception as exc:
                self.broken.add(env_id)
                out.append(error_reset(short_error(exc)))
            except StepInterrupted:
                self.broken.add(env_id)
                out.append(error_reset(TIMED_OUT, failure="timeout"))
        return out

    def fork(self, payload: ForkPayload) -> ForkReply:
        """`Op.FORK`: `snapshot` of the source loaded into each destination, without the
        state leaving this worker."""
        src, items = payload
        head = self.snapshot([src])[0]
        if head.error is not None or head.finished:
            return [head, *[None] * len(items)]
        return [head, *self.load([(d, seed, turns, head.state) for d, seed, turns in items])]

    def call(self, items: CallPayload) -> CallReply:
        """`Op.CALL`: each env's attribute ``name``, called with ``args`` / ``kwargs`` when it
        is callable (gymnasium's vector ``call``). The value must pickle, on every backend
        (the same answer whether or not this worker is a process of its own)."""
        return [self._call_one(env_id, name, args, kwargs) for env_id, name, args, kwargs in items]

    def set_attr(self, items: SetAttrPayload) -> CallReply:
        """`Op.SET_ATTR`: ``setattr(env, name, value)`` on each env."""
        return [self._call_one(env_id, "__setattr__", (name, value), {})
                for env_id, name, value in items]

    def _call_one(self, env_id: int, name: str, args: Sequence[Any], kwargs: dict[str, Any]
                  ) -> CallResult:
        self.progress(env_id)
        env = self.envs.get(env_id)
        if env is None or env_id in self.broken:
            why = "it has no episode yet" if env_id in self.unbuilt else "it failed earlier"
            return CallResult(None, f"env {env_id} cannot be called: {why}; reset it",
                              "RuntimeError")
        try:
            attr = getattr(env, name)
            value = attr(*args, **kwargs) if callable(attr) else attr
        except Exception as exc:
            return CallResult(None, bounded(str(exc)), type(exc).__name__)
        except StepInterrupted:
            self.broken.add(env_id)
            return CallResult(None, f"{TIMED_OUT}; the env must be reset", "TimeoutError")
        try:
            pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            return CallResult(None, f"its result cannot be pickled: {short_error(exc)}",
                              "TypeError")
        return CallResult(value)

    def close(self, payload: Any = None) -> None:
        """`Op.CLOSE` (and the end of every worker): close every env."""
        for env in self.envs.values():
            if env is not None:
                try:
                    env.close()
                except Exception as exc:
                    log.warning("closing an env failed: %s", exc)
        self.envs.clear()

    # ------------------------------------------------------------------ helpers
    def _replayed(self, env_id: int, seed: int, turns: Sequence[Sequence[Any]]) -> TextEnv:
        """A fresh instance of env ``env_id`` reset with ``seed`` and its ``turns`` replayed
        (each stops at its first done, as when they were played)."""
        self.broken.add(env_id)  # forces a fresh instance
        self.finished.discard(env_id)
        env = self._fresh_if_broken(env_id)
        env.reset(seed=seed)
        for acts in turns:
            if _turn(env, acts)[2:4] != (False, False):
                self.finished.add(env_id)
        return env

    def _fresh_if_broken(self, env_id: int) -> TextEnv:
        env = self.envs.get(env_id)
        if env is None or env_id in self.broken:
            if env is not None:
                try:
                    env.close()
                except Exception as exc:
                    log.debug("closing a broken env failed: %s", exc)
            self.envs[env_id] = None
            try:
                env = self.builds[env_id].build()
            except Exception as exc:
                self.unbuilt.discard(env_id)
                raise _BuildFailed(short_error(exc)) from exc
            self.envs[env_id] = env
            self.broken.discard(env_id)
            self.unbuilt.discard(env_id)
        return env


class _BuildFailed(Exception):
    """Rebuilding a failed env raised (its reset reports ``construct_error``)."""


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
        obs = env.render("text")
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


#: op -> the `EnvHost` method that answers it, as the op table (`OPS`) names it
EnvHost._handlers = {op: getattr(EnvHost, spec.handler) for op, spec in OPS.items()
                     if spec.handler is not None}
