"""One sandbox shared by the hostile battery (each run forked afresh from its server), and a
check that nothing a run started is still alive."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnpool.sandbox import Limits, RunResult, Sandbox

FAST = Limits(wall=2.0, cpu=1.0, memory=256 << 20, output=1 << 20, file_size=1 << 20,
              disk=4 << 20, procs=16, files=32)


def userns_members(ns: str) -> set[int]:
    """Host pids of every process in the user namespace ``ns`` (a ``/proc/<pid>/ns/user``
    link text)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "user") == ns:
                    found.add(int(entry.name))
            except OSError:
                continue  # exited meanwhile, or not ours to read
    return found


def descendants(pid: int) -> set[int]:
    """Host pids of every live descendant of ``pid``, from the parent links in /proc/*/stat,
    which anyone may read: the sandbox's server is non-dumpable, so its user namespace link
    is unreadable to an owner that is not root."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue  # exited meanwhile
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists()}


def sandbox_processes(box: Sandbox) -> set[int]:
    """Host pids of every process in the sandbox, its server included."""
    pid = box.server_pid
    assert pid is not None
    return {pid} | descendants(pid) | userns_members(os.readlink(f"/proc/{pid}/ns/user"))


@pytest.fixture(scope="session")
def box() -> Iterator[Sandbox]:
    sandbox = Sandbox()
    sandbox.start()
    yield sandbox
    sandbox.close()


@pytest.fixture
def run(box: Sandbox):  # type: ignore[no-untyped-def]
    """``run(code, **kw)``: the code as ``main.py``; afterwards only the server remains (its
    outer process and PID 1) and the sandbox still answers."""

    def _run(code: str, *, limits: Limits = FAST, **kw: object) -> RunResult:
        result = box.run(["python", "main.py"], files={"main.py": code}, limits=limits,
                         **kw)  # type: ignore[arg-type]
        assert len(sandbox_processes(box)) == 2, "a process outlived its run"
        return result

    yield _run
    after = box.run(["python", "-c", "print('alive')"], limits=FAST)
    assert after.stdout == "alive\n", after
