"""The state machine of one handed-off step request (`HandoffJob`), apart from the threads
that drive it (`turnpool.worker.handoff.HandoffServer`, whose docstring tells the whole story).

A job's `JobState` says where its answer stands; `HandoffJob.hand_to`, `HandoffJob.finish`,
`HandoffJob.give_up` and `HandoffJob.abort` are its only transitions, each returning what to
send (an `Answer`), so it is unit-tested without threads or processes
(``tests/worker/test_handoff_job.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, NamedTuple

from turnpool.worker.protocol import Op, Reply, Request, StepPayload


class JobState(Enum):
    """Where one step request stands (`HandoffJob.state`)."""

    #: one runner claims every env; nobody else knows the job (the common path)
    RUNNING = "running"
    #: a stalled runner handed the rest to another: the job's owner will answer it
    HANDED = "handed"
    #: the partial reply went out: each straggler's result goes out on its own, as `Op.LATE`
    PARTIAL = "partial"
    #: every env's result was sent
    DONE = "done"


class Answer(NamedTuple):
    """What a transition sends: ``replies`` in order; ``answered``: the request's own reply
    (full or partial) is among them, so the worker's progress goes back to ``-1``."""

    replies: list[Reply]
    answered: bool


#: a transition that sends nothing
NOTHING = Answer([], False)


class HandoffJob:
    """One step request being answered, shareable between runners.

    Runners write ``results`` / ``failed`` (through `EnvHost.run_turns`, claiming envs from
    ``claim``); the job's state changes only through `hand_to`, `finish`, `give_up` and
    `abort`, each of which says what to send (or whether to fail the request). The server
    calls them under its lock.
    """

    __slots__ = ("seq", "op", "env_ids", "claim", "results", "failed", "owner", "state",
                 "reported", "given_up")

    def __init__(self, request: Request, owner: object) -> None:
        self.seq: int = request[0]
        self.op: Op = request[1]
        step: StepPayload = request[2]
        env_ids, actions = step
        self.env_ids: Sequence[int] = env_ids
        self.claim = enumerate(zip(env_ids, actions))
        self.results: list[Any] = [None] * len(env_ids)
        self.failed: list[int] = []
        #: the runner that answers the request (the one it was last handed to)
        self.owner = owner
        self.state = JobState.RUNNING
        #: indices whose result was sent
        self.reported: set[int] = set()
        #: index -> the ``timeout`` result of an env given up before the partial reply (it
        #: wins over whatever its stuck runner writes later)
        self.given_up: dict[int, Any] = {}

    def hand_to(self, owner: object) -> bool:
        """The owner stalled: ``owner`` runs the rest and answers. False once answered."""
        if self.state not in (JobState.RUNNING, JobState.HANDED):
            return False
        self.owner = owner
        self.state = JobState.HANDED
        return True

    def finish(self, runner: object,
               since: Callable[[], tuple[dict[int, float], float]]) -> Answer:
        """``runner`` has no more envs of this job to claim: what is due now. ``since()``
        gives ``({env_id: start}, now)`` for the envs runners are inside (only asked for a
        partial reply, which names when each pending env started)."""
        state = self.state
        if state is JobState.RUNNING:  # one runner did every env
            self.state = JobState.DONE
            return Answer([(self.seq, self.op, (self.results, self.failed), None, None)],
                          True)
        if state is JobState.HANDED:
            return self._answer(since) if runner is self.owner else NOTHING
        if state is JobState.PARTIAL:
            return self._late()
        return NOTHING

    def abort(self) -> bool:
        """Running the envs failed (a host bug): True if the request, held by one runner
        only, is now to be answered as a whole failure; False once another runner holds it
        (its envs then end as stragglers)."""
        if self.state is not JobState.RUNNING:
            return False
        self.state = JobState.DONE
        return True

    def give_up(self, env_id: int, timed_out: Any) -> tuple[bool, Reply | None]:
        """Env ``env_id`` is stuck past the deadline: fail it with ``timed_out``. Returns
        whether that was news, and the reply to send now (None: the partial reply will carry
        it). Only an env a runner was handed away from can be given up."""
        k = next((k for k, i in enumerate(self.env_ids) if i == env_id), -1)
        if k < 0 or k in self.reported or k in self.given_up:
            return False, None
        if self.state is JobState.HANDED:
            self.given_up[k] = timed_out
            return True, None
        if self.state is JobState.PARTIAL:
            self._report([k])
            return True, (self.seq, Op.LATE, [(env_id, timed_out)], None, None)
        return False, None

    # ------------------------------------------------------------------ helpers
    def _view(self) -> list[Any]:
        """The results as sent: a given-up env's ``timeout`` wins over its late result."""
        if not self.given_up:
            return self.results
        return [self.given_up.get(k, r) for k, r in enumerate(self.results)]

    def _report(self, indices: list[int]) -> None:
        self.reported.update(indices)
        if len(self.reported) == len(self.env_ids):
            self.state = JobState.DONE

    def _answer(self, since: Callable[[], tuple[dict[int, float], float]]) -> Answer:
        """The owner is done: the full reply if nothing is pending, else the partial one.
        One copy of the results decides both what is pending and what is reported (and is
        what goes out): a stuck runner writes its result without the lock, and a result
        seen as pending by one look and as reported by a second would never be sent."""
        results = list(self._view())
        pending = [k for k, r in enumerate(results) if r is None]
        self._report([k for k, r in enumerate(results) if r is not None])
        if not pending:
            failed = sorted(set(self.failed) | set(self.given_up))
            return Answer([(self.seq, self.op, (results, failed), None, None)], True)
        self.state = JobState.PARTIAL
        started, now = since()
        pending_since = [(k, started.get(self.env_ids[k], now)) for k in pending]
        return Answer([(self.seq, Op.PARTIAL, (results, pending_since), None, None)],
                      True)

    def _late(self) -> Answer:
        """Results finished since the last reply, as one `Op.LATE` reply."""
        results = self._view()
        fresh = [k for k, r in enumerate(results) if r is not None and k not in self.reported]
        if not fresh:
            return NOTHING
        self._report(fresh)
        return Answer([(self.seq, Op.LATE, [(self.env_ids[k], results[k]) for k in fresh],
                        None, None)], False)


__all__ = ["Answer", "HandoffJob", "JobState", "NOTHING"]
