"""The typed protocol: request records, the one codec, and the failure classes."""

from __future__ import annotations

import json
import pickle

from turnpool.worker.failures import FAILURE_CLASSES, Failure, failure_of
from turnpool.worker.protocol import (
    CloseRequest,
    Op,
    ResetRequest,
    RestoreRequest,
    StepRequest,
    decode,
    encode,
)
from turnpool.worker.results import error_step


def test_each_request_record_encodes_to_the_wire_tuple_the_host_reads() -> None:
    assert encode(1, ResetRequest([(5, [0, 1]), (6, [2])])) == (1, Op.RESET,
                                                                [(5, [0, 1]), (6, [2])])
    assert encode(2, StepRequest([3], [["a", "b"]])) == (2, Op.STEP, ([3], [["a", "b"]]))
    assert encode(3, StepRequest(range(2), ["a", "b"], single=True)) == (
        3, Op.STEP1, (range(2), ["a", "b"]))
    assert encode(4, RestoreRequest([(0, 5, [["a"]])])) == (4, Op.RESTORE, [(0, 5, [["a"]])])
    assert encode(5, CloseRequest()) == (5, Op.CLOSE, None)


def test_a_reset_request_knows_each_envs_seed_in_order() -> None:
    request = ResetRequest([(5, [0, 1]), (6, [2])])
    assert request.env_ids == [0, 1, 2] and request.seeds == [5, 5, 6]


def test_decoding_a_reply_reads_its_failure_class_as_the_enum() -> None:
    ok = decode((7, Op.STEP, ([], []), None, None))
    assert (ok.seq, ok.op, ok.failure, ok.error) == (7, Op.STEP, None, None)
    failed = decode((8, Op.RESET, None, "unpicklable", "cannot pickle"))
    assert failed.failure is Failure.UNPICKLABLE and failed.error == "cannot pickle"


def test_a_failure_class_is_its_string_everywhere_it_is_written() -> None:
    assert Failure.TIMEOUT == "timeout" and str(Failure.TIMEOUT) == "timeout"
    assert f"{Failure.WORKER_LOST}" == "worker_lost"
    assert json.dumps({"failure": Failure.UNPICKLABLE}) == '{"failure": "unpicklable"}'
    assert {Failure.POLICY_ERROR: 1}["policy_error"] == 1
    assert {f.value: f.retryable for f in Failure} == FAILURE_CLASSES


def test_a_failed_envs_info_holds_the_plain_string_so_its_bytes_are_unchanged() -> None:
    info = error_step("boom", failure=Failure.TIMEOUT).info
    assert type(info["failure"]) is str and info["retryable"] is True
    assert pickle.dumps(info) == pickle.dumps(error_step("boom", failure="timeout").info)


def test_reading_a_class_maps_anything_unknown_to_env_error() -> None:
    assert Failure.of(None) is Failure.ENV_ERROR
    assert Failure.of("no such class") is Failure.ENV_ERROR
    assert Failure.of(["unhashable"]) is Failure.ENV_ERROR
    assert Failure.of("timeout") is Failure.TIMEOUT and Failure.of(Failure.TIMEOUT).retryable
    assert failure_of({"failure": "worker_lost"}) is Failure.WORKER_LOST
    assert failure_of({}) is Failure.ENV_ERROR
    assert not Failure.ENV_ERROR.retryable and not Failure.CONSTRUCT_ERROR.retryable
