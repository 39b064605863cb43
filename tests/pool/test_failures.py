"""No silent failure: strict arguments, construction errors at construction, every failure
classified, deadlines held in the caller's own process, isolation of unpicklable actions."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.faults import ALL_FAULTS_ENV
from turnpool.backends.auto import EnvProfile, choose
from turnpool.pool import EnvPool
from turnpool.pool.api import EnvConstructionError
from turnpool.worker.deadline import InProcessDeadline, StepInterrupted
from turnpool.worker.errors import MAX_ERROR_CHARS, bounded
from turnpool.worker.failures import FAILURE_CLASSES, failure_of
from turnpool.worker.results import error_step

pytestmark = pytest.mark.timeout(120)

PROCESS_LIKE = ["process", "process_pool", "joblib"]


# ---------------------------------------------------------------------- strict arguments
@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"n_workers": 2}, TypeError, ["'n_workers'", "did you mean 'num_workers'"]),
    ({"stepTimeout": 5}, TypeError, ["'stepTimeout'", "did you mean 'step_timeout'"]),
    ({"step_timeout": -1}, ValueError, ["step_timeout", "-1"]),
    ({"step_timeout": 0}, ValueError, ["step_timeout"]),
    ({"reset_timeout": "5"}, TypeError, ["reset_timeout"]),
    ({"num_workers": -2}, ValueError, ["num_workers", "-2"]),
    ({"num_workers": 1.5}, TypeError, ["num_workers"]),
    ({"seed": -1}, ValueError, ["seed", "-1"]),
    ({"seed": "7"}, TypeError, ["seed"]),
    ({"group_n": 0}, ValueError, ["group_n"]),
    ({"env_kwargs": print}, TypeError, ["env_kwargs", "dict"]),
    ({"backend": "proces"}, ValueError, ["'proces'", "did you mean 'process'"]),
    ({"on_error": "ignore"}, ValueError, ["on_error"]),
])
def test_bad_arguments_name_the_parameter(kwargs: dict[str, Any], error: type[Exception],
                                          words: list[str]) -> None:
    options = {"backend": "sequential", **kwargs}
    with pytest.raises(error) as info:
        EnvPool("trivial", env_num=1, group_n=options.pop("group_n", 1), **options)
    for word in words:
        assert word in str(info.value)


def test_backend_options_are_checked_against_the_backend() -> None:
    with pytest.raises(TypeError, match="'standby'"):
        EnvPool("trivial", backend="sequential", standby=True)
    with pytest.raises(TypeError, match="'standby'"):
        EnvPool("trivial", backend="thread", standby=False)
    with EnvPool("trivial", backend="auto", standby=False) as pool:  # for whichever it picks
        assert pool.backend_name.startswith("auto->")
    with pytest.raises(TypeError, match="did you mean 'joblib_backend'"):
        EnvPool("trivial", backend="joblib", joblib_backnd="loky")
    with EnvPool("trivial", env_num=1, backend="sequential") as pool:
        with pytest.raises(ValueError, match="seed"):
            pool.reset(seed=-5)
        with pytest.raises(IndexError, match="env id 3"):
            pool.step(["a"], env_ids=[3])


# ---------------------------------------------------------------------- construction errors
@pytest.mark.parametrize("backend", ["sequential", "thread", *PROCESS_LIKE, "auto"])
def test_an_env_that_cannot_be_built_fails_the_constructor(backend: str) -> None:
    with pytest.raises(EnvConstructionError) as info:
        EnvPool("trivial", env_num=2, group_n=2, backend=backend, num_workers=2,
                tag="Echo", env_kwargs={"episode_len": "many"})
    text = str(info.value)
    for part in ("tag 'Echo'", "type 'trivial'", "'episode_len': 'many'", "ValueError",
                 "invalid literal"):
        assert part in text, text


# ---------------------------------------------------------------------- taxonomy
def test_failure_classes_and_bounded_error_text() -> None:
    assert set(FAILURE_CLASSES) >= {"env_error", "timeout", "worker_lost", "unpicklable",
                                    "policy_error", "construct_error"}
    info = error_step("boom", failure="timeout").info
    assert (info["failure"], info["retryable"], info["error"]) == ("timeout", True, "boom")
    assert failure_of({"error": "old reader"}) == "env_error"
    with pytest.raises(ValueError, match="failure class"):
        error_step("x", failure="bad_luck")
    traceback = ("\x1b[36mray::SliceActor.handle()\x1b[39m\n" + "  File x, line 1\n" * 40
                 + "ModuleNotFoundError: No module named 'envs_on_my_laptop'")
    text = bounded(traceback)
    assert len(text) <= MAX_ERROR_CHARS and "\x1b" not in text
    assert text.startswith("ray::SliceActor.handle()")
    assert text.endswith("ModuleNotFoundError: No module named 'envs_on_my_laptop'")


def test_a_failed_env_keeps_its_class_until_reset() -> None:
    with EnvPool(ALL_FAULTS_ENV, env_num=1, group_n=2, backend="sequential",
                 step_timeout=5.0) as pool:
        pool.reset(seed=1)
        _, _, _, infos = pool.step(["raise", "a"])
        assert infos[0]["failure"] == "env_error" and infos[0]["retryable"] is False
        _, _, _, infos = pool.step(["a", "a"])
        assert "failed earlier" in infos[0]["error"] and infos[0]["failure"] == "env_error"
        assert "error" not in infos[1]


# ---------------------------------------------------------------------- in-process deadlines
def test_sequential_stops_a_hang_on_the_main_thread() -> None:
    """The default path (auto -> sequential for fast envs) never hangs: a blocking sleep and a
    Python loop are both cut at the deadline, and the other envs of the request still run."""
    with EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=2, seed=3, backend="auto",
                 step_timeout=1.0) as pool, \
            EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=2, seed=3, backend="sequential",
                    step_timeout=None) as ref:
        assert pool.backend_name == "auto->sequential"
        assert pool.reset() == ref.reset()
        started = time.monotonic()
        _, _, dones, infos = pool.step(["hang", "a", "spin", "b"])
        # both cut (the hang would last an hour, the spin forever), with room for a loaded
        # machine; the failures below say which deadline fired
        assert time.monotonic() - started < 2 * 1.0 + 15
        assert [i.get("failure") for i in infos] == ["timeout", None, "timeout", None]
        assert dones == [True, False, True, False]
        want = ref.step(["x", "a", "x", "b"])
        assert [infos[1], infos[3]] == [want[3][1], want[3][3]]
        assert pool.reset(seed=9) == ref.reset(seed=9)  # the timed-out envs come back


def test_sequential_stops_a_python_hang_off_the_main_thread() -> None:
    out: dict[str, Any] = {}

    def run() -> None:
        with EnvPool(ALL_FAULTS_ENV, env_num=1, group_n=2, backend="sequential",
                     step_timeout=1.0) as pool:
            pool.reset(seed=1)
            out["infos"] = pool.step(["spin", "a"])[3]
            out["next"] = pool.step(["b", "b"], env_ids=[1, 0])[3]

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(20)
    assert not worker.is_alive()
    assert out["infos"][0]["failure"] == "timeout" and "error" not in out["infos"][1]
    assert "error" not in out["next"][0] and out["next"][1]["failure"] == "timeout"


def test_deadline_is_per_env_and_disarmed_after_the_request() -> None:
    deadline = InProcessDeadline()
    deadline.begin(1.0)
    deadline.mark(0)
    with pytest.raises(StepInterrupted):
        while True:
            pass
    deadline.end()
    assert deadline.fired == 1
    deadline.begin(None)  # no deadline: nothing is armed
    deadline.mark(0)
    deadline.end()


def test_auto_never_picks_a_backend_that_cannot_keep_the_deadline() -> None:
    fast = EnvProfile(step_wall_s=1e-6, step_cpu_s=1e-6, reset_wall_s=1e-6, steps=20)
    assert choose(fast, 8, 2)[0] == "sequential"
    assert choose(fast, 8, 2, in_process=False)[0] in ("thread", "process")
    picked: dict[str, str] = {}

    def run() -> None:
        with EnvPool("trivial", env_num=2, group_n=2, backend="auto",
                     step_timeout=5.0) as pool:
            picked["with_deadline"] = pool.backend_name
        with EnvPool("trivial", env_num=2, group_n=2, backend="auto",
                     step_timeout=None) as pool:
            picked["without"] = pool.backend_name

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(60)
    assert picked == {"with_deadline": "auto->thread", "without": "auto->sequential"}


# ---------------------------------------------------------------------- unpicklable actions
@pytest.mark.parametrize("backend", PROCESS_LIKE)
def test_an_unpicklable_action_fails_only_its_env(backend: str) -> None:
    with EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=2, seed=1, backend=backend,
                 num_workers=2) as pool, \
            EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=2, seed=1,
                    backend="sequential") as ref:
        assert pool.reset() == ref.reset()
        _, _, dones, infos = pool.step(["a", lambda: None, "b", "c"])
        assert infos[1]["failure"] == "unpicklable" and dones[1]
        want = ref.step(["a", "x", "b", "c"])
        assert [infos[k] for k in (0, 2, 3)] == [want[3][k] for k in (0, 2, 3)]
        res = pool.step_turns([["d"], [threading.Lock()]], env_ids=[0, 3])
        assert res[0].error is None and res[1].info["failure"] == "unpicklable"
