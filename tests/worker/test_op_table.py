"""The op table: every op the pool sends is answered by the host and filed by the pool by
its reply kind, and a transport replaces what cannot be pickled by that same kind."""

from __future__ import annotations

import pickle
import threading

from turnpool.pool import dispatch
from turnpool.worker import transport
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import OPS, REPLY_KIND, Op, ReplyKind


def test_every_op_the_pool_sends_has_a_host_handler_and_a_filed_reply() -> None:
    sent = {op for op, spec in OPS.items() if spec.record is not None}
    assert sent == set(EnvHost._handlers)
    assert set(Op) == set(OPS) == set(REPLY_KIND)
    answered = {REPLY_KIND[op] for op in sent} - {ReplyKind.NONE}
    assert answered <= set(dispatch._FILE)
    assert ReplyKind.PARTIAL in dispatch._FILE  # `LATE` answers no head: `_receive` reads it


def test_a_reply_kind_without_per_env_replacement_fails_the_request_as_a_whole() -> None:
    lock = threading.Lock()  # cannot be pickled
    reset = pickle.loads(transport.encode((1, Op.RESET, [lock], None, None)))
    assert reset[3] is None and reset[2][0].info["failure"] == "unpicklable"
    load = pickle.loads(transport.encode((2, Op.LOAD, [lock], None, None)))
    assert load[2] is None and load[3] == "unpicklable"
