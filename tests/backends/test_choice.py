"""The one backend choice, made when the pool starts: a named backend is never silently
replaced, only ``auto`` or ``fallback=True`` falls back, and a deadline set off the main thread
needs threads."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import pytest

from tests.faults import ALL_FAULTS_ENV
from turnpool.backends import BACKENDS, get_backend, start_backend
from turnpool.backends.choice import choose_backend
from turnpool.backends.sequential import SequentialBackend
from turnpool.backends.thread import ThreadBackend
from turnpool.pool import EnvPool
from turnpool.worker.build import EnvBuild
from turnpool.worker.errors import BackendUnavailable

pytestmark = pytest.mark.timeout(60)

BUILDS = [EnvBuild(i, "turnpool.envs.synthetic:TrivialEnv", {}) for i in range(4)]


class NeverStarts(SequentialBackend):
    """A backend whose start always fails the way a missing package does."""

    closed = 0

    def start(self, timeout: float) -> None:
        raise BackendUnavailable("the never backend needs nothing: pip install 'turnpool[x]'")

    def close(self) -> None:
        NeverStarts.closed += 1
        super().close()


@pytest.fixture
def never(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(BACKENDS, "never", f"{__name__}:NeverStarts")
    return "never"


def _off_main(fn: Any) -> Any:
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(fn()))
    worker.start()
    worker.join(30)
    assert out, "the call failed or froze"
    return out[0]


def test_a_named_backend_that_cannot_start_raises_and_names_the_fix(never: str) -> None:
    NeverStarts.closed = 0
    with pytest.raises(BackendUnavailable) as info:
        EnvPool("trivial", env_num=2, backend=never)
    assert str(info.value) == ("backend 'never' cannot start: the never backend needs "
                               "nothing: pip install 'turnpool[x]'")
    assert NeverStarts.closed == 1  # what it had started is closed


def test_a_named_backend_falls_back_only_when_asked(never: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), \
            EnvPool("trivial", env_num=2, backend=never, fallback=True) as pool:
        assert pool.backend_name == "sequential"
        assert isinstance(pool.backend, SequentialBackend)
        assert len(pool.reset()[0]) == 2
    assert "backend 'never' cannot start" in caplog.text
    assert "falling back to sequential" in caplog.text


def test_ray_without_ray_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    with pytest.raises(BackendUnavailable, match=r"pip install 'turnpool\[ray\]'"):
        EnvPool("trivial", env_num=2, backend="ray")


def test_auto_is_a_name_not_a_backend_class() -> None:
    assert "auto" in BACKENDS
    with pytest.raises(BackendUnavailable, match="start_backend picks one"):
        get_backend("auto")


def test_sequential_on_the_main_thread_stays_in_the_caller() -> None:
    choice = choose_backend("sequential", BUILDS, None, (5.0, 5.0))
    assert (choice.name, choice.label, choice.num_workers) == ("sequential", "sequential", None)


def test_a_deadline_set_off_the_main_thread_needs_threads() -> None:
    choice = _off_main(lambda: choose_backend("sequential", BUILDS, None, (5.0, None)))
    assert (choice.name, choice.label, choice.num_workers) == ("thread", "sequential->thread", 1)
    without = _off_main(lambda: choose_backend("sequential", BUILDS, 2, (None, None)))
    assert (without.name, without.num_workers) == ("sequential", 2)
    auto = _off_main(lambda: choose_backend("auto", BUILDS, None, (5.0, 5.0)))
    assert auto.name in ("thread", "process") and auto.label == f"auto->{auto.name}"
    assert auto.profile is not None and auto.profile.steps >= 3


def test_the_chosen_backend_keeps_its_shape() -> None:
    def start() -> tuple[str, type, int]:
        backend = start_backend("sequential", BUILDS, 2, None, {}, (5.0, 5.0), 30.0)
        try:
            return backend.label, type(backend), backend.num_workers
        finally:
            backend.close()

    assert _off_main(start) == ("sequential->thread", ThreadBackend, 2)


def test_closing_a_backend_that_never_started_is_harmless() -> None:
    for name in ("sequential", "thread", "process"):
        backend = get_backend(name)(BUILDS, 2)
        backend.close()
        backend.close()


def test_a_pool_started_here_and_driven_from_another_thread_keeps_its_deadline() -> None:
    """Started on the main thread, the sequential backend stays itself when a request comes
    from elsewhere: that request runs on its worker's lane, a sleeping env is cut at the
    deadline, the innocent envs are exact, and the main thread runs in the caller again."""
    with EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=2, seed=3, backend="sequential",
                 step_timeout=1.0) as pool, \
            EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=2, seed=3, backend="sequential",
                    step_timeout=None) as ref:
        backend = pool.backend
        assert isinstance(backend, SequentialBackend)
        assert pool.reset() == ref.reset()
        infos = _off_main(lambda: pool.step(["hang", "a", "b", "c"])[3])
        want = ref.step(["x", "a", "b", "c"])[3]
        assert infos[0]["failure"] == "timeout" and infos[1:] == want[1:]
        assert backend.threaded and backend.abandoned == 1
        assert pool.backend is backend  # the same object, the same shape
        got = pool.step(["d", "e", "f", "g"])[3]  # on the main thread again
        assert "failed earlier" in got[0]["error"]
        assert got[1:] == ref.step(["d", "e", "f", "g"])[3][1:]
        assert pool.reset(seed=9) == ref.reset(seed=9)
