"""The hand-off job's states, driven alone: runners are plain tokens, results are written by
hand where `EnvHost.run_turns` would write them, and each transition says what to send."""

from __future__ import annotations

from typing import Any

from turnpool.worker.handoff import HandoffJob, JobState
from turnpool.worker.protocol import Op

READER, HELPER, SECOND = object(), object(), object()
TIMED_OUT = ("timed out",)


def _job(env_ids: list[int]) -> HandoffJob:
    return HandoffJob((7, Op.STEP, (env_ids, [["a"]] * len(env_ids))), READER)


def _since(started: dict[int, float] | None = None) -> Any:
    return lambda: (dict(started or {}), 100.0)


def _no_since() -> tuple[dict[int, float], float]:
    raise AssertionError("only a partial reply asks when envs started")


def _run(job: HandoffJob, k: int, result: Any = "ok") -> None:
    job.results[k] = result


def test_a_job_one_runner_finishes_is_answered_once_in_full() -> None:
    job = _job([4, 5])
    _run(job, 0)
    _run(job, 1, "bad")
    job.failed.append(1)
    replies, answered = job.finish(READER, _no_since)
    assert answered and replies == [(7, Op.STEP, (["ok", "bad"], [1]), None, None)]
    assert job.state is JobState.DONE
    assert job.finish(READER, _no_since).replies == []  # never twice


def test_the_runner_a_job_was_handed_away_from_sends_nothing_before_the_owner() -> None:
    job = _job([4, 5, 6])
    assert job.hand_to(HELPER) and job.state is JobState.HANDED
    _run(job, 0)  # the stuck reader's env came back before the helper finished
    assert job.finish(READER, _no_since) == ([], False)
    _run(job, 1)
    _run(job, 2)
    replies, answered = job.finish(HELPER, _no_since)
    assert answered and replies == [(7, Op.STEP, (["ok"] * 3, []), None, None)]
    assert job.state is JobState.DONE


def test_an_owner_done_while_an_env_is_stuck_sends_a_partial_reply_naming_its_start() -> None:
    job = _job([4, 5, 6])
    job.hand_to(HELPER)
    _run(job, 1)
    _run(job, 2)
    replies, answered = job.finish(HELPER, _since({4: 42.0}))
    assert answered
    assert replies == [(7, Op.PARTIAL, ([None, "ok", "ok"], [(0, 42.0)]), None, None)]
    assert job.state is JobState.PARTIAL


def test_a_straggler_that_returns_is_reported_late_exactly_once() -> None:
    job = _job([4, 5])
    job.hand_to(HELPER)
    _run(job, 1)
    job.finish(HELPER, _since())
    _run(job, 0, "late")
    replies, answered = job.finish(READER, _no_since)
    assert not answered and replies == [(7, Op.LATE, [(4, "late")], None, None)]
    assert job.state is JobState.DONE
    assert job.finish(READER, _no_since).replies == []


def test_a_pending_env_with_no_runner_inside_is_dated_now() -> None:
    job = _job([4, 5])
    job.hand_to(HELPER)
    _run(job, 1)
    replies, _ = job.finish(HELPER, _since())
    assert replies[0][2][1] == [(0, 100.0)]


def test_a_job_that_times_out_before_the_partial_reply_is_answered_once_in_it() -> None:
    job = _job([4, 5])
    job.hand_to(HELPER)
    assert job.give_up(4, TIMED_OUT) == (True, None)  # the partial reply will carry it
    assert job.give_up(4, TIMED_OUT) == (False, None)  # given up once
    _run(job, 1)
    replies, answered = job.finish(HELPER, _no_since)
    assert answered and replies == [(7, Op.STEP, ([TIMED_OUT, "ok"], [0]), None, None)]
    _run(job, 0, "late")  # the stuck thread came back after all: its result is dropped
    assert job.finish(READER, _no_since).replies == []


def test_a_late_result_after_a_timeout_is_never_sent() -> None:
    job = _job([4, 5])
    job.hand_to(HELPER)
    _run(job, 1)
    job.finish(HELPER, _since())
    news, reply = job.give_up(4, TIMED_OUT)
    assert news and reply == (7, Op.LATE, [(4, TIMED_OUT)], None, None)
    assert job.state is JobState.DONE
    _run(job, 0, "late")
    assert job.finish(READER, _no_since).replies == []


def test_a_straggler_already_reported_late_cannot_time_out() -> None:
    job = _job([4, 5])
    job.hand_to(HELPER)
    _run(job, 1)
    job.finish(HELPER, _since())
    _run(job, 0, "late")
    job.finish(READER, _no_since)
    assert job.give_up(4, TIMED_OUT) == (False, None)


def test_only_an_env_a_runner_was_handed_away_from_can_time_out() -> None:
    job = _job([4, 5])
    assert job.give_up(4, TIMED_OUT) == (False, None)  # the reader's own: the pool's deadline
    assert job.give_up(9, TIMED_OUT) == (False, None)  # not in this request
    assert job.state is JobState.RUNNING


def test_a_helper_that_stalls_too_hands_the_job_on_and_the_last_owner_answers() -> None:
    job = _job([4, 5, 6])
    assert job.hand_to(HELPER) and job.hand_to(SECOND)
    _run(job, 2)
    assert job.finish(HELPER, _no_since) == ([], False)
    replies, answered = job.finish(SECOND, _since({4: 1.0, 5: 2.0}))
    assert answered and replies[0][1] is Op.PARTIAL
    assert replies[0][2][1] == [(0, 1.0), (1, 2.0)]


def test_an_answered_job_cannot_be_handed_off() -> None:
    job = _job([4])
    _run(job, 0)
    job.finish(READER, _no_since)
    assert not job.hand_to(HELPER) and job.owner is READER
    partial = _job([4, 5])
    partial.hand_to(HELPER)
    _run(partial, 1)
    partial.finish(HELPER, _since())
    assert not partial.hand_to(SECOND) and partial.owner is HELPER


def test_a_host_bug_fails_a_job_held_by_one_runner_as_a_whole_and_only_then() -> None:
    job = _job([4, 5])
    assert job.abort() and job.state is JobState.DONE
    assert job.finish(READER, _no_since).replies == []  # nothing more is sent for it
    handed = _job([4, 5])
    handed.hand_to(HELPER)
    assert not handed.abort() and handed.state is JobState.HANDED


class _WrittenDuringLook(list):  # type: ignore[type-arg]
    """Results that a stuck runner writes to right after the owner's first look at them
    (runners write results without the server's lock)."""

    def __init__(self, items: list[Any], k: int, value: Any) -> None:
        super().__init__(items)
        self.write: tuple[int, Any] | None = (k, value)

    def __iter__(self) -> Any:
        yield from list.__iter__(self)
        if self.write is not None:
            k, value = self.write
            self.write = None
            self[k] = value


def test_a_result_written_while_the_partial_reply_is_made_still_goes_out_late() -> None:
    """What is pending and what is reported come from one look: the stuck env is either in
    the partial reply or in a late one, never in neither."""
    job = _job([4, 5])
    job.hand_to(HELPER)
    _run(job, 1)
    job.results = _WrittenDuringLook(job.results, 0, "late")
    replies, answered = job.finish(HELPER, _since({4: 3.0}))
    assert answered and replies == [(7, Op.PARTIAL, ([None, "ok"], [(0, 3.0)]), None, None)]
    replies, answered = job.finish(READER, _no_since)
    assert replies == [(7, Op.LATE, [(4, "late")], None, None)]
    assert job.state is JobState.DONE
