"""The async driver: LLM generation overlaps env steps (``turnpool.collector.mode: async``).

Lock-step collection waits for the slowest generation, then for the slowest env, so a turn
costs generation time L plus env time E. Here every env moves on its own: an env whose step
has returned goes straight back to the policy, and an env whose reply has been parsed is
stepped at once (`EnvPool.step_async` / `EnvPool.poll`), so generation for some envs runs
while others step and the wall time approaches ``max(L, E)``.

The policy side batches whatever is pending: a micro-batch leaves when it holds ``max_batch``
envs, when its oldest env has waited ``max_wait_s``, or when nothing else can arrive. Up to
``policy_workers`` ``generate`` calls run at once on a thread pool (policy calls block), which
keeps an OpenAI-compatible server's continuous batching fed. The pool is driven only from the
calling thread.

The driver knows nothing of prompts, parsing or records: it takes a `Turns` object (the
lock-step loop's own `turnpool.rollout.episode.TurnRunner`) and calls it one micro-batch at a
time. Each env plays at most ``max_turn`` turns and a deterministic policy sees exactly what it
sees in lock-step mode, so trajectories (and everything scored from them) are identical.

Timing (added to the collector's metrics): ``policy_s`` is the time at least one ``generate``
call was running, ``env_s`` the time at least one env step was outstanding, ``overlap_s``
the time both were, and ``timing/turns`` counts ``generate`` calls.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Protocol

from turnpool.policies.base import Message, TurnContext
from turnpool.pool import EnvPool, TurnResult
from turnpool.rollout.episode import EpisodeState, TurnPlan, merge_results
from turnpool.rollout.settings import AsyncSettings

log = logging.getLogger(__name__)

#: Longest single wait on policy threads; the loop re-checks and waits again (policies
#: bound their own calls, this only keeps every wait finite).
_POLICY_WAIT_S = 30.0
#: Without ``max_batch``, a batch's envs are split into this many micro-batches: enough
#: cohorts that one generates while others step (one batch for all would move in lock-step).
AUTO_MICRO_BATCHES = 8


class Turns(Protocol):
    """The turn steps the driver calls, for any micro-batch of episodes."""

    def prompts(self, eps: Sequence[EpisodeState]
                ) -> tuple[list[list[Message]], list[TurnContext]]: ...

    def generate(self, messages: list[list[Message]], contexts: list[TurnContext]
                 ) -> list[str]: ...

    def plan(self, eps: Sequence[EpisodeState], replies: Sequence[str]) -> list[TurnPlan]: ...

    def record(self, ep: EpisodeState, plan: TurnPlan, result: TurnResult | None) -> None: ...


@dataclass
class AsyncTiming:
    """Busy times of one async run (seconds); see the module docstring."""

    wall_s: float = 0.0
    policy_s: float = 0.0
    env_s: float = 0.0
    overlap_s: float = 0.0
    calls: int = 0


class _Call:
    """One ``generate`` call: its envs and when it really ran (set by the policy thread)."""

    __slots__ = ("eps", "start", "end")

    def __init__(self, eps: list[EpisodeState]) -> None:
        self.eps = eps
        self.start = 0.0
        self.end = 0.0


def play_async(turns: Turns, pool: EnvPool, eps: Sequence[EpisodeState], max_turn: int,
               settings: AsyncSettings,
               on_turn: Callable[[int, int], None] | None = None, *,
               singly: bool = False) -> AsyncTiming:
    """Play ``eps`` (freshly reset episodes of ``pool``) to the end, asynchronously.

    ``on_turn(turn, envs)`` is called once every env has finished turn ``turn`` or its
    episode (the lock-step turn counter; ``envs`` played that turn). ``singly``: each action
    of a turn is its own step and the results are merged (RAGEN v2, as
    `turnpool.rollout.episode.step_singly` does in lock-step). Returns the run's busy times.
    """
    driver = _Driver(turns, pool, eps, max_turn, settings, on_turn)
    driver.singly = singly
    return driver.run()


@dataclass
class _Stepping:
    """An env whose turn is in the pool: what it runs, since when, and (``singly``) how many
    of its actions have come back, merged."""

    ep: EpisodeState
    plan: TurnPlan
    sent: float
    done_actions: int = 0
    merged: TurnResult | None = None


class _Driver:
    def __init__(self, turns: Turns, pool: EnvPool, eps: Sequence[EpisodeState],
                 max_turn: int, settings: AsyncSettings,
                 on_turn: Callable[[int, int], None] | None) -> None:
        self.turns = turns
        self.pool = pool
        self.s = settings
        self.on_turn = on_turn
        self.max_turn = max_turn
        self.eps = list(eps)
        self.cap = settings.max_batch or max(1, -(-len(self.eps) // AUTO_MICRO_BATCHES))
        self.pending: deque[EpisodeState] = deque()
        self.since: dict[int, float] = {}  # env id -> when it became pending
        self.calls: dict[Future[list[str]], _Call] = {}
        self.stepping: dict[int, _Stepping] = {}
        self.singly = False
        self.policy_spans: list[tuple[float, float]] = []
        self.env_spans: list[tuple[float, float]] = []
        self.level = 0
        # For `_report_level` without a pass over every env per call: how many running envs
        # have played exactly k turns (`_running_at`), and how many envs played turn k.
        self._running_at: Counter[int] = Counter()
        self._played: Counter[int] = Counter()
        for ep in self.eps:
            self._played.update(range(len(ep.turns)))
            if not self._finished(ep):
                self._running_at[len(ep.turns)] += 1
                self._enqueue(ep, time.perf_counter())

    # ------------------------------------------------------------------ main loop
    def run(self) -> AsyncTiming:
        start = time.perf_counter()
        executor = ThreadPoolExecutor(self.s.policy_workers,
                                      thread_name_prefix="turnpool-policy")
        try:
            while self.pending or self.calls or self.stepping:
                self._launch(executor)
                progressed = self._harvest_calls()
                self._wait_and_collect(idle=not progressed)
        except BaseException:
            self._drain()
            raise
        finally:
            for fut in self.calls:
                fut.cancel()
            executor.shutdown(wait=True, cancel_futures=True)
        wall = time.perf_counter() - start
        policy_s, env_s, both = _busy(self.policy_spans, self.env_spans)
        return AsyncTiming(wall_s=wall, policy_s=policy_s, env_s=env_s, overlap_s=both,
                           calls=len(self.policy_spans))

    def _launch(self, executor: ThreadPoolExecutor) -> None:
        """Start micro-batches while a policy thread is free and a batch is due."""
        now = time.perf_counter()
        while self.pending and len(self.calls) < self.s.policy_workers:
            n = len(self.pending)
            cap = self.cap
            oldest = self.since[self.pending[0].env_id]
            due = (n >= cap or now - oldest >= self.s.max_wait_s
                   or (not self.calls and not self.stepping))  # nothing else can arrive
            if not due:
                return
            batch = [self.pending.popleft() for _ in range(min(cap, n))]
            messages, contexts = self.turns.prompts(batch)
            call = _Call(batch)
            fut = executor.submit(self._generate, call, messages, contexts)
            self.calls[fut] = call

    def _generate(self, call: _Call, messages: Any, contexts: Any) -> list[str]:
        call.start = time.perf_counter()
        try:
            replies: list[str] = self.turns.generate(messages, contexts)
        finally:
            call.end = time.perf_counter()
        return replies

    def _harvest_calls(self) -> bool:
        """Parse finished ``generate`` calls and start their env steps; True if any."""
        finished = [f for f in self.calls if f.done()]
        for fut in finished:
            call = self.calls.pop(fut)
            replies = fut.result()  # a policy error ends the run, as in lock-step
            self.policy_spans.append((call.start, call.end))
            plans = self.turns.plan(call.eps, replies)
            run = [k for k, p in enumerate(plans) if p.to_execute]
            now = time.perf_counter()
            for ep, plan in zip(call.eps, plans):
                if not plan.to_execute:  # nothing to run: the turn ends here, as in lock-step
                    self._record(ep, plan, None, now)
            if run:
                ids = [call.eps[k].env_id for k in run]
                for k in run:
                    self.stepping[call.eps[k].env_id] = _Stepping(call.eps[k], plans[k], now)
                n = 1 if self.singly else None
                self.pool.step_async(ids, [list(plans[k].to_execute[:n]) for k in run])
        if finished:
            self._report_level()
        return bool(finished)

    def _wait_and_collect(self, idle: bool) -> None:
        """Block until something can happen (a step result, a call, a batch deadline)."""
        timeout = 0.0 if not idle else self._wait_budget()
        if self.stepping:
            got = self.pool.poll(timeout=timeout, min_ready=1)
            if got:
                now = time.perf_counter()
                for env_id, result in got:
                    self._collect(env_id, result, now)
                self._report_level()
        elif self.calls and timeout != 0.0:
            wait_futures(list(self.calls), timeout=timeout, return_when=FIRST_COMPLETED)

    def _wait_budget(self) -> float | None:
        """How long the driver may block: until a batch deadline, briefly while generate
        calls run next to env steps, else until the side that is busy answers."""
        budget: float | None = None
        if self.pending and len(self.calls) < self.s.policy_workers:
            oldest = self.since[self.pending[0].env_id]
            budget = max(0.0, oldest + self.s.max_wait_s - time.perf_counter())
        if self.calls:
            limit = self.s.poll_interval_s if self.stepping else _POLICY_WAIT_S
            budget = limit if budget is None else min(budget, limit)
        return budget

    # ------------------------------------------------------------------ bookkeeping
    def _collect(self, env_id: int, result: TurnResult, now: float) -> None:
        """A step came back: record the turn, or (``singly``) send its next action."""
        st = self.stepping[env_id]
        if self.singly:
            st.merged, st.done_actions = merge_results(st.merged, result), st.done_actions + 1
            result = st.merged
            if st.done_actions < len(st.plan.to_execute) and not (result.done or result.error):
                self.pool.step_async([env_id], [[st.plan.to_execute[st.done_actions]]])
                return
        del self.stepping[env_id]
        self.env_spans.append((st.sent, now))
        self._record(st.ep, st.plan, result, now)

    def _record(self, ep: EpisodeState, plan: TurnPlan, result: Any, now: float) -> None:
        self._running_at[len(ep.turns)] -= 1
        self.turns.record(ep, plan, result)
        self._played[len(ep.turns) - 1] += 1
        if not self._finished(ep):
            self._running_at[len(ep.turns)] += 1
            self._enqueue(ep, now)

    def _finished(self, ep: EpisodeState) -> bool:
        return ep.done or len(ep.turns) >= self.max_turn

    def _enqueue(self, ep: EpisodeState, now: float) -> None:
        self.pending.append(ep)
        self.since[ep.env_id] = now

    def _report_level(self) -> None:
        """Call ``on_turn`` for each lock-step turn that every running env has completed."""
        if self.on_turn is None:
            return
        low = self.level  # the fewest turns a running env has played (it only grows)
        while low < self.max_turn and not self._running_at[low]:
            low += 1
        while self.level < low:
            played = self._played[self.level]
            if played:
                self.on_turn(self.level, played)
            self.level += 1

    def _drain(self) -> None:
        """After an error: collect every outstanding step so the pool can be reset."""
        deadline = time.perf_counter() + 600.0
        while self.pool.in_flight and time.perf_counter() < deadline:
            try:
                self.pool.poll(timeout=5.0, min_ready=len(self.pool.in_flight))
            except Exception as exc:  # noqa: BLE001 - the first error is the one raised
                log.debug("while draining the pool after an error: %s", exc)


def _busy(a: list[tuple[float, float]], b: list[tuple[float, float]]
          ) -> tuple[float, float, float]:
    """Time covered by spans ``a``, by spans ``b``, and by both at once."""
    ua, ub = _union(a), _union(b)
    both = 0.0
    i = j = 0
    while i < len(ua) and j < len(ub):
        lo = max(ua[i][0], ub[j][0])
        hi = min(ua[i][1], ub[j][1])
        if hi > lo:
            both += hi - lo
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return sum(e - s for s, e in ua), sum(e - s for s, e in ub), both


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out
