"""The sandbox never outlives its owner: close(), a SIGKILLed parent, a step deadline of the
pool; where isolation is unavailable it refuses in one line unless told otherwise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.sandbox.conftest import FAST, alive, descendants, sandbox_processes, userns_members
from turnpool import EnvPool
from turnpool.sandbox import Outcome, Sandbox, SandboxError, SandboxUnavailable, core

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(predicate, timeout: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)  # polling a condition under a deadline, not synchronising
    return predicate()


def test_close_leaves_no_process_and_is_idempotent() -> None:
    box = Sandbox()
    box.start()
    pid = box.server_pid
    assert pid is not None
    ns = os.readlink(f"/proc/{pid}/ns/user")
    procs = sandbox_processes(box)
    assert len(procs) == 2
    box.close()
    box.close()
    assert not userns_members(ns) and not alive(procs)
    with pytest.raises(SandboxError):
        box.run(["python", "-c", "pass"])


def test_a_dead_server_is_replaced_by_the_next_run() -> None:
    with Sandbox() as box:
        assert box.run(["python", "-c", "print(1)"], limits=FAST).stdout == "1\n"
        outer = box.server_pid
        assert outer is not None
        zygote = int(Path(f"/proc/{outer}/task/{outer}/children").read_text().split()[0])
        os.kill(zygote, signal.SIGKILL)  # the server the runs are forked from
        assert _wait_for(lambda: box.server_pid is None)  # its outer process follows it
        r = box.run(["python", "-c", "print(2)"], limits=FAST)
        assert r.outcome is Outcome.PASSED and r.stdout == "2\n"
        assert box.server_pid not in (None, outer)


CHILD = """
import sys, threading
from turnpool.sandbox import Limits, Sandbox
box = Sandbox()
box.start()
threading.Thread(target=box.run, args=(["python", "-c", "import time; time.sleep(60)"],),
                 kwargs={"limits": Limits(wall=60, cpu=60)}, daemon=True).start()
print(box.server_pid, flush=True)
threading.Event().wait(60)
"""


def test_a_sigkilled_parent_leaves_no_sandbox_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None
        server = int(child.stdout.readline())
        ns = os.readlink(f"/proc/{server}/ns/user")
        procs: set[int] = set()
        assert _wait_for(lambda: len(procs.update({server} | descendants(server))
                                     or procs) >= 3)  # A, B and the run's P
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        assert _wait_for(lambda: not userns_members(ns) and not alive(procs)), alive(procs)
    finally:
        child.kill()
        child.wait(timeout=30)


def test_a_run_past_the_step_timeout_fails_as_a_timeout_and_leaves_nothing() -> None:
    before = {_ns_of(p) for p in _children(os.getpid())}  # other tests' sandboxes
    with EnvPool("deepcoder", env_num=2, seed=0, backend="process", num_workers=2,
                 step_timeout=2.5) as pool:  # the env's own run limit is 3 s
        pool.reset()
        pool.step(["print(1)", "print(1)"])  # each worker's sandbox server is up
        pool.reset()
        hang = "class Solution:\n    pass\nwhile True:\n    pass\n"  # whatever the problem
        _, _, dones, infos = pool.step([hang, "print(1)"])
        assert infos[0].get("failure") == "timeout" and dones[0], infos[0]
        assert infos[1]["action_is_valid"] and "failure" not in infos[1]
        ours = os.readlink("/proc/self/ns/user")
        sandboxes = {_ns_of(p) for p in _children(os.getpid())} - {ours, None} - before
        assert sandboxes  # the workers' sandbox servers, in namespaces of their own
        procs = {p for p in _children(os.getpid()) if _ns_of(p) in sandboxes}
        procs |= {d for p in procs for d in descendants(p)}
    assert _wait_for(lambda: not any(userns_members(ns) for ns in sandboxes)
                     and not alive(procs))


def _ns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/user")
    except OSError:
        return None  # exited meanwhile


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
                out.extend(_children(int(entry.name)))
    return out


def test_a_sandbox_failure_is_its_own_failure_class() -> None:
    from turnpool.worker.failures import FAILURE_CLASSES, failure_of_exception
    assert failure_of_exception(SandboxError("server died")) == "sandbox_error"
    assert failure_of_exception(ValueError("bug")) == "env_error"
    assert FAILURE_CLASSES["sandbox_error"] is True


def test_without_isolation_it_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # a fake probe result: this machine isolates, the decision is what is tested
    monkeypatch.setattr(core, "_PROBE", core._Probe(ok=False, why="no user namespaces"))
    with pytest.raises(SandboxUnavailable) as err:
        Sandbox().run(["python", "-c", "print(1)"])
    assert "\n" not in str(err.value) and "no user namespaces" in str(err.value)
    assert "unsafe" in str(err.value)
    unsafe = Sandbox(unsafe=True).run(["python", "main.py"], files={"main.py": "print(2)"},
                                      limits=FAST, expected_stdout="2")
    assert unsafe.outcome is Outcome.PASSED


def test_a_sandbox_started_on_a_thread_that_ended_still_serves() -> None:
    with Sandbox() as box:
        thread = threading.Thread(target=box.start)
        thread.start()
        thread.join(timeout=60)
        pid = box.server_pid
        r = box.run(["python", "-c", "print(3)"], limits=FAST)
        assert r.stdout == "3\n" and box.server_pid == pid  # the same server, alive


def test_a_forked_child_starts_its_own_sandbox_while_the_parents_spawner_waits() -> None:
    """gymnasium's AsyncVectorEnv forks workers from a process whose spawner thread already
    waits on its job queue: the child must not hand its job to that thread (gone in the
    child) and wait for an answer that never comes."""
    parent = Sandbox()
    parent.start()  # the parent's spawner thread now waits for jobs
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: run one program in a sandbox of its own, report, leave
            os.close(read)
            code = 1
            try:
                with Sandbox() as box:
                    result = box.run(["python", "-c", "print(6 * 7)"], limits=FAST)
                code = 0 if result.stdout.strip() == "42" else 2
            finally:
                os.write(write, bytes([code]))
                os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            ready = select_ready(pipe.fileno(), 60.0)
            answer = pipe.read(1) if ready else b""
        os.waitpid(pid, 0)
        assert answer == b"\x00"
    finally:
        parent.close()


def select_ready(fd: int, timeout: float) -> bool:
    import select

    return bool(select.select([fd], [], [], timeout)[0])
