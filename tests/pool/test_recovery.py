"""The recovery decision, case by case, with no processes: `turnpool.pool.recovery.decide`
reads a lost worker's request, stragglers, queue and progress marker and returns whom to
blame, what to restore and what to send again (in that order). Then the dispatcher carrying
a plan out, and keeping its env table, against a fake in-memory backend."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection

from turnpool.backends.base import Backend
from turnpool.pool.dispatch import Dispatcher
from turnpool.pool.recovery import Fault, Plan, abandon, decide
from turnpool.pool.requests import Pending, Straggler, Ticket, restore_request
from turnpool.pool.table import Status
from turnpool.worker.build import EnvBuild
from turnpool.worker.errors import WorkerLost
from turnpool.worker.failures import Failure
from turnpool.worker.protocol import Op, Reply, Request, ResetRequest, StepRequest
from turnpool.worker.results import ResetResult, TurnResult

LOST = Fault("worker died (exit code 9)", Failure.WORKER_LOST)
HANG = Fault("step timeout (1 s)", Failure.TIMEOUT)
SLICE = [0, 1, 2, 3]


def step(env_ids: list[int], retried: bool = False) -> Pending:
    pending = Pending(StepRequest(env_ids, [f"a{i}" for i in env_ids], single=True),
                      Ticket(list(env_ids), is_async=False), list(range(len(env_ids))))
    pending.retried = retried
    return pending


def straggler(env_id: int, retried: bool = False) -> Straggler:
    """Env ``env_id`` left behind by a step request its worker answered in part."""
    return Straggler(step([env_id], retried), 0, due=1.0)


def blamed(plan: Plan) -> list[int]:
    return [env_id for _, _, env_id in plan.blame]


def sent(plan: Plan) -> list[tuple[Op, list[int], bool]]:
    return [(p.op, list(p.env_ids), p.retried) for p in plan.resend]


def test_a_crash_mid_request_blames_the_env_that_was_running() -> None:
    head = step([0, 1, 2])
    plan = decide(LOST, head, [], [], culprit=1, live=SLICE)
    assert blamed(plan) == [1] and plan.blame[0][:2] == (head, 1)
    assert plan.restore == [0, 2, 3]
    assert sent(plan) == [(Op.STEP1, [0, 2], True)]
    assert plan.resend[0].positions == [0, 2]  # results still land where the caller wants


def test_a_hang_without_hand_off_blames_the_env_its_worker_is_stuck_in() -> None:
    plan = decide(HANG, step([0, 1, 2, 3]), [], [], culprit=3, live=SLICE)
    assert blamed(plan) == [3]
    assert plan.restore == [0, 1, 2] and sent(plan) == [(Op.STEP1, [0, 1, 2], True)]


def test_a_hang_after_hand_off_blames_only_the_stuck_stragglers() -> None:
    """The worker answered in part; one straggler is past its deadline, another is not: the
    request it is on now is innocent (sent again whole), the other straggler is sent alone."""
    stuck, slow = straggler(2), straggler(3)
    head = step([0, 1])
    fault = Fault("step timeout (1 s)", Failure.TIMEOUT, frozenset({2}))
    plan = decide(fault, head, [stuck, slow], [], culprit=0, live=SLICE)
    assert blamed(plan) == [2] and plan.blame[0][0] is stuck.head
    assert plan.restore == [0, 1, 3]
    assert sent(plan) == [(Op.STEP1, [0, 1], True), (Op.STEP1, [3], True)]


def test_a_worker_that_dies_with_stragglers_out_blames_the_stragglers() -> None:
    """A stalled env's thread may have ended the process, so the stragglers are the suspects
    when the marker names no env of the request the worker was on."""
    plan = decide(LOST, step([0, 1]), [straggler(2), straggler(3)], [], culprit=None,
                  live=SLICE)
    assert blamed(plan) == [2, 3]
    assert plan.restore == [0, 1] and sent(plan) == [(Op.STEP1, [0, 1], True)]


def test_a_straggler_on_a_dying_worker_is_sent_again_once_only() -> None:
    again = decide(LOST, step([0]), [straggler(2)], [], culprit=0, live=SLICE)
    assert blamed(again) == [0] and sent(again) == [(Op.STEP1, [2], True)]
    assert again.restore == [1, 2, 3]
    third = decide(LOST, step([0]), [straggler(2, retried=True)], [], culprit=0, live=SLICE)
    assert blamed(third) == [0, 2] and third.resend == []
    assert third.restore == [1, 3]


def test_a_worker_killed_between_envs_sends_its_request_again_once() -> None:
    """Killed from outside (with a sibling): its marker names an env of no request."""
    plan = decide(LOST, step([0, 1, 2]), [], [], culprit=-1, live=SLICE)
    assert blamed(plan) == [] and sent(plan) == [(Op.STEP1, [0, 1, 2], True)]
    assert plan.restore == SLICE


def test_a_request_that_loses_its_worker_twice_fails_every_env_of_it() -> None:
    plan = decide(LOST, step([0, 1, 2], retried=True), [], [], culprit=-1, live=SLICE)
    assert blamed(plan) == [0, 1, 2] and plan.resend == [] and plan.restore == [3]


def test_a_hang_with_no_env_to_blame_fails_the_whole_request() -> None:
    plan = decide(HANG, step([1, 2]), [], [], culprit=None, live=SLICE)
    assert blamed(plan) == [1, 2] and plan.resend == [] and plan.restore == [0, 3]


def test_a_replay_that_fails_again_is_not_sent_again() -> None:
    """The worker died inside a restore: the env it was replaying fails, the restore itself
    is not resent; a fresh restore brings back the others."""
    head = restore_request([(0, 7, [["a"]]), (1, 7, [])])
    plan = decide(LOST, head, [], [], culprit=0, live=SLICE)
    assert blamed(plan) == [0] and plan.resend == []
    assert plan.restore == [1, 2, 3]


def test_a_restore_lost_between_envs_is_not_retried_but_its_envs_fail() -> None:
    head = restore_request([(0, 7, []), (1, 7, [])])
    plan = decide(LOST, head, [], [], culprit=-1, live=SLICE)
    assert blamed(plan) == [0, 1] and plan.resend == [] and plan.restore == [2, 3]


def test_a_reset_whose_leader_crashed_gets_a_new_leader() -> None:
    head = Pending(ResetRequest([(10, [0, 1]), (11, [2])]), Ticket([0, 1, 2], False),
                   [0, 1, 2])
    plan = decide(LOST, head, [], [], culprit=0, live=[3])
    assert blamed(plan) == [0]
    retry = plan.resend[0].request
    assert isinstance(retry, ResetRequest) and retry.groups == [(10, [1]), (11, [2])]
    assert plan.resend[0].positions == [1, 2] and plan.restore == [3]


def test_envs_about_to_be_reset_are_not_restored_and_waiting_requests_keep_their_order(
) -> None:
    reset = Pending(ResetRequest([(5, [3])]), Ticket([3], False), [0])
    later = step([1])
    plan = decide(LOST, step([0, 1]), [], [reset, later], culprit=0, live=SLICE)
    assert plan.restore == [1, 2]
    assert sent(plan) == [(Op.STEP1, [1], True), (Op.RESET, [3], False),
                          (Op.STEP1, [1], False)]
    assert plan.resend[1] is reset and plan.resend[2] is later


def test_a_worker_lost_while_idle_only_restores_and_resends_its_queue() -> None:
    waiting = step([2])
    plan = decide(LOST, None, [], [waiting], culprit=None, live=[0, 2])
    assert plan.blame == [] and plan.restore == [0, 2] and plan.resend == [waiting]


def test_the_decision_changes_none_of_its_inputs() -> None:
    head, late = step([0, 1]), [straggler(2)]
    waiting = [step([3])]
    live = list(SLICE)
    decide(LOST, head, late, waiting, culprit=1, live=live)
    assert not head.retried and not late[0].head.retried and not waiting[0].retried
    assert list(head.env_ids) == [0, 1] and live == SLICE and len(waiting) == 1


def test_a_worker_that_cannot_be_replaced_fails_stragglers_then_its_requests() -> None:
    head, waiting = step([0, 1]), step([3])
    out = abandon(head, [straggler(2)], [waiting])
    assert [env_id for _, _, env_id in out] == [2, 0, 1, 3]
    assert out[1] == (head, 0, 0) and out[3] == (waiting, 0, 3)


# ---------------------------------------------------------------------- carried out
class FakeBackend(Backend):
    """One in-memory worker that answers every request at once, except that it can die on
    the next one (``crash``) or leave chosen envs of a step behind (``stall``: an
    `Op.PARTIAL` reply, then `Op.LATE` on `release`)."""

    name = "fake"

    def __init__(self, num_envs: int) -> None:
        super().__init__([EnvBuild(i, "fake:Env") for i in range(num_envs)], 1)
        self.sent: list[Request] = []
        self.replies: deque[Reply | None] = deque()
        self.crash = False
        self.stall: set[int] = set()
        self.stalled: dict[int, int] = {}  # env id -> seq of its request
        self.marker: tuple[int, float] | None = None
        self.restarts = 0

    def start(self, timeout: float) -> None:
        pass

    def send(self, worker: int, request: Request) -> None:
        self.sent.append(request)
        seq, op, payload = request
        if self.crash:
            self.replies.append(None)
        elif op is Op.RESET:
            ids = [i for _, members in payload for i in members]
            self.replies.append((seq, op, [ResetResult(f"start {i}", {}, None) for i in ids],
                                 None, None))
        elif op is Op.RESTORE:
            self.replies.append((seq, op, [None] * len(payload), None, None))
        else:
            env_ids, actions = payload
            wire = [None if i in self.stall else (f"{i}:{a}", 1.0, False, False, {}, 1, None)
                    for i, a in zip(env_ids, actions)]
            pending = [(k, time.monotonic()) for k, i in enumerate(env_ids) if i in self.stall]
            for k, _ in pending:
                self.stalled[env_ids[k]] = seq
            self.stall.clear()
            reply_op = Op.PARTIAL if pending else op
            self.replies.append((seq, reply_op, (wire, pending) if pending else (wire, []),
                                 None, None))

    def release(self, env_id: int) -> None:
        seq = self.stalled.pop(env_id)
        self.replies.append((seq, Op.LATE, [(env_id, (f"{env_id}:late", 2.0, True, False, {},
                                                      1, None))], None, None))

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        return [0] if self.replies else []

    def recv(self, worker: int) -> Reply:
        reply = self.replies.popleft()
        if reply is None:
            raise WorkerLost("worker died (exit code 9)")
        return reply

    def progress(self, worker: int) -> tuple[int, float] | None:
        return self.marker

    def restart(self, worker: int) -> None:
        self.restarts += 1
        self.crash = False
        self.replies.clear()

    def close(self) -> None:
        pass


def started_dispatcher(num_envs: int) -> tuple[Dispatcher, FakeBackend]:
    backend = FakeBackend(num_envs)
    dispatch = Dispatcher(backend, num_envs, step_timeout=30.0, reset_timeout=30.0)
    ticket = Ticket(list(range(num_envs)), is_async=False)
    dispatch.resets(ticket, 5, [0] * num_envs)
    dispatch.finish(ticket)
    return dispatch, backend


def run_step(dispatch: Dispatcher, actions: list[str]) -> list[TurnResult]:
    ticket = Ticket(list(range(len(actions))), is_async=False)
    dispatch.turns(ticket, actions, whole=True, single=True)
    dispatch.finish(ticket)
    return ticket.out


def test_a_crash_mid_request_restores_the_innocent_env_then_sends_its_turn_again() -> None:
    dispatch, backend = started_dispatcher(2)
    run_step(dispatch, ["a", "b"])
    backend.crash, backend.marker = True, (1, time.monotonic())
    out = run_step(dispatch, ["c", "d"])
    assert backend.restarts == 1
    assert [op for _, op, _ in backend.sent] == [Op.RESET, Op.STEP1, Op.STEP1, Op.RESTORE,
                                                 Op.STEP1]
    assert backend.sent[3][2] == [(0, 5, [["a"]])]  # env 0: its seed and its one turn
    assert backend.sent[4][2] == ([0], ["c"])
    assert out[0].obs == "0:c" and out[0].error is None
    assert out[1].failure is Failure.WORKER_LOST and out[1].info["failure"] == "worker_lost"
    assert type(out[1].info["failure"]) is str
    row = dispatch.table.record(1)
    assert row.status is Status.FAILED and row.failure is Failure.WORKER_LOST
    assert row.reason == "worker died (exit code 9)"
    assert dispatch.table.record(0).status is Status.IDLE


def test_a_straggler_is_tracked_in_the_table_until_its_late_result_is_polled() -> None:
    dispatch, backend = started_dispatcher(2)
    backend.stall = {1}
    dispatch.turns(Ticket([0, 1], is_async=True), [["x"], ["y"]])
    dispatch.pump(lambda: len(dispatch.table.ready) >= 1, 0.0)
    table = dispatch.table
    assert [i for i, _ in table.ready] == [0]
    assert table.record(1).status is Status.STRAGGLING
    assert table.record(0).status is Status.IN_FLIGHT  # done but not polled
    backend.release(1)
    dispatch.pump(lambda: len(table.ready) >= 2, 0.0)
    taken, failed = table.take_ready(hold_if_failed=True)
    assert [(i, r.obs) for i, r in taken] == [(0, "0:['x']"), (1, "1:late")] and failed == []
    assert table.record(1).status is Status.IDLE and table.in_flight == set()


def test_a_hang_past_the_deadline_restarts_the_worker_and_blames_the_running_env() -> None:
    dispatch, backend = started_dispatcher(2)
    backend.crash = True  # the step is never answered: swallow it
    ticket = Ticket([0, 1], is_async=False)
    dispatch.turns(ticket, ["a", "b"], whole=True, single=True)
    backend.replies.clear()
    backend.crash = False
    head = dispatch._queues[0][0]
    head.clock -= 60.0  # its 30 s deadline passed (no waiting in a test)
    backend.marker = (1, head.clock)  # stuck in env 1 since the request began
    dispatch.finish(ticket)
    assert backend.restarts == 1
    assert [op for _, op, _ in backend.sent[2:]] == [Op.RESTORE, Op.STEP1]
    assert ticket.out[1].failure is Failure.TIMEOUT
    assert ticket.out[1].error == "step timeout (30 s)" and ticket.out[0].obs == "0:a"


def test_a_straggler_past_its_deadline_is_blamed_and_its_finished_neighbour_replayed(
) -> None:
    dispatch, backend = started_dispatcher(2)
    backend.stall = {1}
    ticket = Ticket([0, 1], is_async=False)
    dispatch.turns(ticket, ["a", "b"], whole=True, single=True)
    dispatch.pump(lambda: ticket.remaining == 1, 0.0)
    assert dispatch.table.record(1).status is Status.STRAGGLING
    dispatch.table.stragglers[0][1].due -= 60.0  # past deadline and grace
    dispatch.finish(ticket)
    assert backend.restarts == 1
    assert backend.sent[-1] == (backend.sent[-1][0], Op.RESTORE, [(0, 5, [["a"]])])
    assert ticket.out[0].obs == "0:a" and ticket.out[1].failure is Failure.TIMEOUT
    assert dispatch.table.record(1).status is Status.FAILED
    assert dispatch.table.stragglers[0] == {}
