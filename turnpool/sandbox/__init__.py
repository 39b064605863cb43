"""Run untrusted programs (model-written code) isolated from the host, fast.

`Sandbox.run` runs a program inside user, mount, PID, network, IPC and UTS namespaces of its
sandbox (made once per `Sandbox`; one run at a time, and nothing of a run outlives it): no
network, a fresh tmpfs ``/tmp`` as the only writable place, the system's programs and the
interpreter read-only, nothing else of the host file system, a scrubbed environment, rlimits
(CPU, address space, file size, processes, open files), a wall clock and an output limit,
escape syscalls killed by a seccomp filter, and every process it started killed when it ends.
Python programs run warm: forked from a server interpreter already inside the sandbox, one fork
per run.

    >>> from turnpool.sandbox import Limits, Outcome, Sandbox, available
    >>> if available()[0]:
    ...     with Sandbox() as box:
    ...         r = box.run(["python", "main.py"], files={"main.py": "print(input()[::-1])"},
    ...                     stdin="olleh\\n", expected_stdout="hello")
    ...     assert r.outcome is Outcome.PASSED, r

Where isolation is unavailable (not Linux, no user namespaces), runs raise
`SandboxUnavailable` with a one-line reason, unless the sandbox was made with ``unsafe=True``.
"""

from turnpool.sandbox.core import (
    Limits,
    Outcome,
    RunResult,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
    available,
    clip,
)

__all__ = ["Limits", "Outcome", "RunResult", "Sandbox", "SandboxError", "SandboxUnavailable",
           "available", "clip"]
