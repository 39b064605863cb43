"""The hand-off server driven in this process over in-memory queues, with an env that blocks
on an event instead of a load: the order in which a handed-off request's replies leave."""

from __future__ import annotations

import pickle
import queue
import threading
from typing import Any

from turnpool.envs.synthetic import TrivialEnv
from turnpool.worker.build import EnvBuild
from turnpool.worker.handoff import HandoffServer
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Op
from turnpool.worker.transport import encode

WAIT_S = 30.0  # every wait is bounded; none is expected to run out
_RELEASE = threading.Event()


class BlockingEnv(TrivialEnv):
    """Action ``block`` returns only once the test releases it (a stall, without load)."""

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == "block" and not _RELEASE.wait(WAIT_S):
            raise RuntimeError("never released")
        return super()._step(action)


class _WatchedLock:
    """The server's send lock, setting ``contended`` when a thread has to wait for it."""

    def __init__(self, contended: threading.Event) -> None:
        self._lock = threading.Lock()
        self.contended = contended

    def __enter__(self) -> _WatchedLock:
        if not self._lock.acquire(blocking=False):
            self.contended.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_late_result_never_overtakes_the_partial_reply_that_names_it() -> None:
    """Env 0 stalls, so the rest of the request is handed to a second runner, which answers
    with a partial reply. While that reply is being encoded, env 0 returns: its stuck runner
    must send its late result after the partial reply (the pool drops a late result it does
    not expect yet and waits for that env until its deadline). The encode of the partial
    reply holds on until the late result was sent (the bug) or its runner waits for the send
    lock (the fix): events, not times, decide the interleaving."""
    _RELEASE.clear()
    inbox: queue.Queue[bytes] = queue.Queue()
    outbox: queue.Queue[Any] = queue.Queue()
    # set when the late result was sent (the bug) or its runner waits for the send lock
    either = threading.Event()

    def recv() -> bytes:
        try:
            return inbox.get(timeout=WAIT_S)
        except queue.Empty:
            raise EOFError from None

    def send(data: bytes) -> None:
        reply = pickle.loads(data)
        outbox.put(reply)
        if reply[1] is Op.LATE:
            either.set()

    def encode_slowly(reply: Any) -> bytes:
        if reply[1] is Op.PARTIAL:  # env 0 may return now: hold this reply until it did
            _RELEASE.set()
            assert either.wait(WAIT_S), "env 0's runner neither sent nor waited to send"
        return encode(reply)

    entry = f"{__name__}:BlockingEnv"
    host = EnvHost([EnvBuild(0, entry), EnvBuild(1, entry)])
    server = HandoffServer(recv, send, host, 0.01, None, encode_slowly, pickle.loads,
                           lambda env_id: None)
    server._send_lock = _WatchedLock(either)  # type: ignore[assignment]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        inbox.put(pickle.dumps((1, Op.RESET, [(7, [0]), (8, [1])])))
        assert outbox.get(timeout=WAIT_S)[:2] == (1, Op.RESET)
        inbox.put(pickle.dumps((2, Op.STEP, ([0, 1], [["block"], ["go"]]))))
        first = outbox.get(timeout=WAIT_S)
        second = outbox.get(timeout=WAIT_S)
    finally:
        _RELEASE.set()
        inbox.put(pickle.dumps((3, Op.CLOSE, None)))
        thread.join(WAIT_S)
    assert [first[:2], second[:2]] == [(2, Op.PARTIAL), (2, Op.LATE)]
    results, pending = first[2]
    assert results[1][0].startswith("t=1 ") and [k for k, _ in pending] == [0]
    assert [env_id for env_id, _ in second[2]] == [0] and second[2][0][1][0].startswith("t=1 ")
    assert not thread.is_alive()
