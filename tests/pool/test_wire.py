"""The step reply on the wire: a `TurnResult`'s fields as plain tuples (pickling a NamedTuple
runs Python code per object), made into `TurnResult` records by the pool as replies arrive."""

from __future__ import annotations

import pickle

from turnpool.pool import EnvPool, TurnResult
from turnpool.worker.build import EnvBuild
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Op
from turnpool.worker.results import as_turn_results


def test_host_step_replies_are_plain_tuples_in_turn_result_order() -> None:
    host = EnvHost([EnvBuild(0, "trivial", {}), EnvBuild(1, "trivial", {})])
    host.handle((1, Op.RESET, [(5, [0, 1])]))
    _, op, (wire, failed), failure, error = host.handle((2, Op.STEP1, (range(2), ["a", "bb"])))
    assert op is Op.STEP1 and failure is None and error is None and failed == []
    assert all(type(r) is tuple and len(r) == len(TurnResult._fields) for r in wire)
    records = as_turn_results(pickle.loads(pickle.dumps(wire)))
    assert all(type(r) is TurnResult for r in records)
    assert [r.obs for r in records] == [w[0] for w in wire]
    assert records[0].n_executed == 1 and records[0].error is None
    assert records[0].failure is None
    host.close()


def test_ops_cross_a_process_boundary_as_themselves() -> None:
    """The op is an enum on both sides of the wire (a pickled request keeps its member)."""
    for op in Op:
        assert pickle.loads(pickle.dumps((1, op, None)))[1] is op


def test_pool_callers_get_turn_result_records_on_every_path() -> None:
    with EnvPool("trivial", env_num=2, group_n=1, seed=3, backend="process",
                 num_workers=2) as pool:
        pool.reset()
        sync = pool.step_turns([["a"], ["b", "c"]])
        pool.step_async(None, [["a"], ["b"]])
        ready = []
        while len(ready) < 2:
            ready += pool.poll(timeout=30.0)
    assert all(type(r) is TurnResult for r in sync)
    assert sync[1].n_executed == 2
    assert all(type(r) is TurnResult for _, r in ready)
