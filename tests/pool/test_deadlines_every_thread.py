"""``step_timeout`` holds in every thread on every backend: an env blocked in ``time.sleep``
(which no asynchronous exception can cut) is failed with ``timeout`` (the hang lasts an hour,
so an answer well within that is the deadline firing) while the other envs of the pool keep
playing exactly the episode they would have played. The pool is driven from a thread that is
not the main one, as a server's or a trainer's is."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.faults import ALL_FAULTS_ENV, RESTART_S
from turnpool.backends import LOCAL_BACKENDS
from turnpool.pool import EnvPool

pytestmark = pytest.mark.timeout(120)

STEP_TIMEOUT = 1.0


def _off_main(fn: Any) -> Any:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test thread
            out["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(100)
    assert not worker.is_alive(), "the pool froze"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("backend", LOCAL_BACKENDS)
def test_a_sleeping_env_is_cut_at_its_deadline_off_the_main_thread(backend: str) -> None:
    def play() -> tuple[Any, ...]:
        with EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=2, seed=3, backend=backend,
                     num_workers=2 if backend != "sequential" else None,
                     step_timeout=STEP_TIMEOUT) as pool:
            first = pool.reset()
            started = time.monotonic()
            _, _, dones, infos = pool.step(["hang", "a", "b", "c"])
            took = time.monotonic() - started
            after = [pool.step(["x", "d", "e", "f"])[3] for _ in range(2)]
            again = pool.reset(seed=9)
            return first, took, dones, infos, after, again, pool.backend_name

    def reference() -> tuple[Any, ...]:
        with EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=2, seed=3, backend="sequential",
                     step_timeout=None) as ref:
            first = ref.reset()
            infos = ref.step(["x", "a", "b", "c"])[3]
            after = [ref.step(["x", "d", "e", "f"])[3] for _ in range(2)]
            return first, infos, after, ref.reset(seed=9)

    first, took, dones, infos, after, again, name = _off_main(play)
    want_first, want_infos, want_after, want_again = _off_main(reference)
    assert first == want_first
    assert STEP_TIMEOUT - 0.5 < took < STEP_TIMEOUT + RESTART_S, (name, took)
    assert infos[0]["failure"] == "timeout" and dones[0]
    assert infos[1:] == want_infos[1:]  # the innocent envs, exact
    for got, want in zip(after, want_after):
        assert "failed earlier" in got[0]["error"] and got[1:] == want[1:]
    assert again == want_again  # the timed-out env comes back with a reset


def test_the_sequential_backend_hands_its_envs_to_threads_only_when_it_must() -> None:
    """On the main thread it stays in-process (timer signal); off it, with a deadline, the
    hosts move to threads with their envs as they are (an episode goes on unchanged)."""
    with EnvPool("trivial", env_num=2, group_n=1, seed=1, backend="sequential",
                 step_timeout=5.0) as main_pool:
        main_pool.reset()
        main_pool.step(["a", "b"])
        assert not main_pool.backend.threaded  # type: ignore[attr-defined]

    with EnvPool("trivial", env_num=2, group_n=1, seed=1, backend="sequential",
                 step_timeout=5.0) as pool, \
            EnvPool("trivial", env_num=2, group_n=1, seed=1, backend="sequential",
                    step_timeout=None) as ref:
        assert pool.reset() == ref.reset()
        assert pool.step(["a", "b"]) == ref.step(["a", "b"])  # main thread: in-process
        got = _off_main(lambda: [pool.step(["cc", "d"]) for _ in range(3)])
        assert got == [ref.step(["cc", "d"]) for _ in range(3)]
        assert pool.backend.threaded  # type: ignore[attr-defined]
        assert pool.backend.abandoned == 0  # type: ignore[attr-defined]
