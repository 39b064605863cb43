"""The env table alone: one row per env, changed only through its methods, read by status."""

from __future__ import annotations

from turnpool.pool.requests import Pending, Straggler, Ticket
from turnpool.pool.table import EnvTable, Status
from turnpool.worker.failures import Failure
from turnpool.worker.protocol import StepRequest
from turnpool.worker.results import error_step


def table_of_two_workers() -> EnvTable:
    table = EnvTable([[0, 1], [2, 3]], 4)
    table.started(0, {0: 7, 1: 7})
    table.started(1, {2: 8, 3: 8})
    return table


def test_every_env_starts_idle_with_its_owner_and_no_episode() -> None:
    table = EnvTable([[0, 1], [2]], 3)
    rows = [table.record(i) for i in range(3)]
    assert [(r.owner, r.seed, r.status) for r in rows] == [(0, None, Status.IDLE),
                                                           (0, None, Status.IDLE),
                                                           (1, None, Status.IDLE)]
    assert table.owner_of(2) == 1


def test_a_failed_env_keeps_its_reason_until_its_next_reset() -> None:
    table = table_of_two_workers()
    table.fail(1, "step timeout (2 s)", Failure.TIMEOUT)
    row = table.record(1)
    assert row.status is Status.FAILED and row.failure is Failure.TIMEOUT
    assert row.reason == "step timeout (2 s)" and row.seed == 7
    assert table.live(0) == [0]
    table.started(0, {1: 9})
    assert table.record(1).status is Status.IDLE and table.record(1).seed == 9
    assert table.live(0) == [0, 1]


def test_an_env_that_fails_its_reset_has_no_episode_to_restore() -> None:
    table = table_of_two_workers()
    table.fail(3, "ValueError: bad seed", Failure.ENV_ERROR, episode_lost=True)
    assert table.seeds[3] is None and table.live(1) == [2]


def test_a_forgotten_env_is_not_restored() -> None:
    table = table_of_two_workers()
    table.forget([0, 3])
    assert table.seeds == [None, 7, 8, None]
    assert table.live(0) == [1] and table.live(1) == [2]


def test_a_worker_that_cannot_be_replaced_loses_every_env_not_failed_already() -> None:
    table = table_of_two_workers()
    table.fail(2, "ValueError: boom", Failure.ENV_ERROR)
    table.worker_gone(1, "worker lost: no standby")
    assert table.record(2).failure is Failure.ENV_ERROR
    assert table.record(3).failure is Failure.WORKER_LOST
    assert table.record(0).status is Status.IDLE


def test_stragglers_and_async_envs_show_in_their_status() -> None:
    table = table_of_two_workers()
    table.sent_async([0, 1])
    head = Pending(StepRequest([0, 1], ["a", "b"]), Ticket([0, 1], True), [0, 1])
    table.straggling(0, 1, Straggler(head, 1, due=5.0))
    assert table.record(0).status is Status.IN_FLIGHT
    assert table.record(1).status is Status.STRAGGLING
    assert table.busy([1, 2]) == {1}


def test_polling_with_raise_takes_only_the_failed_results_and_keeps_the_others_ready() -> None:
    table = table_of_two_workers()
    table.sent_async([0, 1, 2])
    ok = error_step("x")._replace(error=None, info={})
    bad = error_step("ValueError: boom")
    for env_id, result in [(0, ok), (1, bad), (2, ok)]:
        table.finished_async(env_id, result)
    taken, failed = table.take_ready(hold_if_failed=True)
    assert taken == [] and failed == [(1, bad)]
    assert table.ready == [(0, ok), (2, ok)] and table.in_flight == {0, 2}
    taken, failed = table.take_ready(hold_if_failed=True)
    assert taken == [(0, ok), (2, ok)] and failed == [] and table.in_flight == set()


def test_polling_without_raise_takes_every_result() -> None:
    table = table_of_two_workers()
    table.sent_async([0, 1])
    bad = error_step("ValueError: boom")
    table.finished_async(1, bad)
    assert table.take_ready(hold_if_failed=False) == ([(1, bad)], [])
    assert table.in_flight == {0}
