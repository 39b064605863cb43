"""The host side of the sandbox: `Sandbox` starts and talks to one sandbox server, `run` runs
one program in it and classifies the result (`Outcome`).

A sandbox is a long-lived server process inside its own namespaces (see ``_inner.py`` for the
process tree); each run forks from that server's pre-imported interpreter, so a run costs a
few milliseconds, not an interpreter start. Runs on one `Sandbox` are serial (a lock); use
one sandbox per thread for parallel runs.
"""

from __future__ import annotations

import enum
import json
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

INNER = Path(__file__).with_name("_inner.py")
#: How much longer than the run's wall limit the host waits for the server's reply.
GRACE_S = 5.0
START_TIMEOUT_S = 30.0
#: The one line printed when isolation is unavailable.
UNAVAILABLE = ("turnpool.sandbox: isolation is unavailable here ({why}); refusing to run "
               "untrusted code (pass unsafe=True / --unsafe-no-sandbox to run it unisolated)")


class Outcome(str, enum.Enum):
    """How a run ended."""

    PASSED = "passed"
    WRONG_ANSWER = "wrong_answer"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    FORBIDDEN = "forbidden"            # killed by the seccomp filter: an attempted escape
    SANDBOX_ERROR = "sandbox_error"    # the sandbox itself failed; the program is not to blame


class SandboxError(RuntimeError):
    """The sandbox server failed (died, did not answer); the run's program is not to blame."""


class SandboxUnavailable(SandboxError):
    """Isolation cannot be set up here (no user namespaces, not Linux, ...)."""


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits (seconds, bytes, counts)."""

    wall: float = 10.0
    cpu: float = 10.0
    memory: int = 512 << 20        # address space (RLIMIT_AS)
    output: int = 8 << 20          # stdout + stderr together
    file_size: int = 16 << 20      # any one file written (RLIMIT_FSIZE)
    disk: int = 32 << 20           # the writable /tmp (tmpfs size)
    procs: int = 16                # processes and threads (RLIMIT_NPROC)
    files: int = 64                # open file descriptors (RLIMIT_NOFILE)


@dataclass(frozen=True)
class RunResult:
    """One run: its `Outcome`, exit code (-1 if killed), signal, output and times."""

    outcome: Outcome
    exit_code: int = -1
    signal: int = 0
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    error: str = ""


#: How much of a run's text (feedback, an error, a program's output) an env passes on: a few
#: KB, since it goes on into observations, ``info``, trajectories, JSON replies and prompts.
MAX_SHOWN_CHARS = 4096


def clip(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, its head and tail kept around a marker
    that says how much was cut (the head says what failed; the tail of a traceback, why).

    >>> clip("a" * 30 + "b" * 30, 40)
    'aaaaaaaaaa[cut 40 of 60 chars]bbbbbbbbbb'
    """
    if len(text) <= limit:
        return text
    total = len(text)
    keep = max(0, limit - len(f"[cut {total} of {total} chars]"))  # the longest marker
    marker = f"[cut {total - keep} of {total} chars]"
    tail = keep // 2
    return text[:keep - tail] + marker + text[total - tail:]


@dataclass
class _Probe:
    ok: bool | None = None
    why: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


_PROBE = _Probe()


def classify(reply: dict[str, Any], limits: Limits, expected: str | None) -> Outcome:
    """The `Outcome` of a server reply: limits first, then the exit, then the answer."""
    status = reply.get("status")
    sig = int(reply.get("signal") or 0)
    stderr = str(reply.get("stderr") or "")
    if status in ("timeout", "output_limit"):
        return Outcome(status)
    if status == "error" or (status == "exited" and reply.get("code") == 126
                             and "sandbox setup failed" in stderr):
        return Outcome.SANDBOX_ERROR
    if sig == signal.SIGSYS:
        return Outcome.FORBIDDEN
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL
                                 and float(reply.get("cpu") or 0) >= limits.cpu):
        return Outcome.TIMEOUT
    if sig == signal.SIGXFSZ:
        return Outcome.OUTPUT_LIMIT
    last = stderr.rstrip().rpartition("\n")[2]
    if last.startswith("MemoryError"):
        return Outcome.MEMORY_LIMIT
    if "[Errno 27]" in last:  # EFBIG: python ignores SIGXFSZ, so a write fails instead
        return Outcome.OUTPUT_LIMIT
    if sig or reply.get("code") != 0:
        return Outcome.RUNTIME_ERROR
    if expected is not None and str(reply.get("stdout", "")).strip() != expected.strip():
        return Outcome.WRONG_ANSWER
    return Outcome.PASSED


def default_binds(python: str) -> list[str]:
    """What the sandbox sees, read-only: the system's programs and libraries, the dynamic
    linker's cache, and the interpreter's own prefix (stdlib only, no site-packages)."""
    prefix = str(Path(python).resolve().parent.parent)
    binds = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc/ld.so.cache",
             "/etc/localtime", "/etc/alternatives"]
    if not prefix.startswith("/usr"):
        binds.append(prefix)
    return [b for b in binds if os.path.lexists(b)]


class Sandbox:
    """A sandbox server and the runs made in it.

    ``unsafe=True`` runs programs as plain subprocesses when isolation is unavailable (never
    silently: without it, `SandboxUnavailable` carries the one-line reason).
    """

    def __init__(self, *, python: str | None = None, unsafe: bool = False) -> None:
        self.python = str(Path(python or sys.executable).resolve())
        self.unsafe = unsafe
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self._probing = False  # set by the availability probe, which must not probe itself

    # ---------------------------------------------------------------- lifecycle
    @property
    def server_pid(self) -> int | None:
        """The host pid of the sandbox server's outer process (None when not running)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def isolated(self) -> bool:
        return available(self.python)[0]

    def start(self) -> None:
        """Start the server (done by the first run); raises `SandboxUnavailable`."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._owner != os.getpid():  # a forked copy: the server is the parent's to close
            self._proc = None
        if self._proc is not None and self._proc.poll() is None:
            return
        self._stop()
        ok, why = (True, "") if self._probing else available(self.python)
        if not ok:
            if self.unsafe:
                return
            raise SandboxUnavailable(UNAVAILABLE.format(why=why))
        proc = _SPAWNER.popen(
            [self.python, "-I", "-S", "-B", str(INNER), str(os.getpid()),
             "1" if os.geteuid() == 0 else "0", json.dumps(default_binds(self.python))])
        self._proc, self._owner = proc, os.getpid()
        try:
            if self._read(1, START_TIMEOUT_S) != b"U":
                raise SandboxError("the sandbox server did not start")
            _write_maps(proc.pid)
            self._write(b"M")
            hello = self._recv(START_TIMEOUT_S)
            if "error" in hello:
                raise SandboxError(f"sandbox setup failed: {hello['error']}")
        except BaseException:
            self._stop()
            raise

    def close(self) -> None:
        """Kill the server and everything in it (idempotent)."""
        with self._lock:
            self._closed = True
            self._stop()

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()  # A kills and reaps B, whose PID namespace dies with it
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()  # B dies with A all the same (PR_SET_PDEATHSIG), a moment later
        proc.wait(timeout=START_TIMEOUT_S)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- runs
    def run(self, argv: list[str], *, files: dict[str, str] | None = None, stdin: str = "",
            limits: Limits | None = None, expected_stdout: str | None = None,
            warm: bool = True, trusted_program: bool = False) -> RunResult:
        """Run ``argv`` in ``/tmp`` holding ``files``, with ``stdin`` and ``limits``.

        ``["python", "main.py"]`` runs warm (forked from the server's interpreter); anything
        else is exec'd. With ``expected_stdout`` a clean exit is `Outcome.PASSED` or
        `Outcome.WRONG_ANSWER` (stripped outputs compared), else `Outcome.PASSED`.
        ``trusted_program``: the program file is the caller's own text (a harness that runs
        the model's code), never a model's: the server compiles it once and reuses the code
        for later runs of the same text, which then skip the parse.
        """
        limits = limits or Limits()
        request = {"argv": list(argv), "files": dict(files or {}), "stdin": stdin,
                   "limits": {**asdict(limits), "wall": limits.wall}, "warm": warm,
                   "trusted_program": trusted_program}
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            self._start()
            if self._proc is None:  # unsafe and unavailable
                return _run_unsafe(argv, files or {}, stdin, limits, expected_stdout)
            started = time.monotonic()
            try:
                self._send(request)
                reply = self._recv(limits.wall + GRACE_S)
            except (OSError, SandboxError, ValueError) as exc:
                self._stop()  # the next run starts a fresh server
                return RunResult(Outcome.SANDBOX_ERROR, error=f"{type(exc).__name__}: {exc}",
                                 wall_s=time.monotonic() - started)
            except BaseException:  # interrupted (a step deadline): the run dies with the server
                self._stop()
                raise
        return RunResult(classify(reply, limits, expected_stdout),
                         exit_code=int(reply.get("code", -1)), signal=int(reply.get("signal", 0)),
                         stdout=str(reply.get("stdout", "")), stderr=str(reply.get("stderr", "")),
                         wall_s=float(reply.get("wall", 0.0)), cpu_s=float(reply.get("cpu", 0.0)),
                         error=str(reply.get("error", "")))

    # ---------------------------------------------------------------- wire
    def _write(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        os.write(self._proc.stdin.fileno(), data)

    def _read(self, n: int, timeout: float) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        data = bytearray()
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError(f"the sandbox server did not answer in {timeout:.0f} s")
            # short waits: an exception raised in this thread (a step deadline) lands between
            if not select.select([fd], [], [], min(left, 0.05))[0]:
                continue
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise SandboxError("the sandbox server died")
            data += chunk
        return bytes(data)

    def _send(self, obj: object) -> None:
        data = json.dumps(obj).encode()
        self._write(struct.pack(">I", len(data)) + data)

    def _recv(self, timeout: float) -> dict[str, Any]:
        (size,) = struct.unpack(">I", self._read(4, timeout))
        reply = json.loads(self._read(size, timeout))
        if not isinstance(reply, dict):
            raise SandboxError("malformed reply from the sandbox server")
        return reply


class _Spawner:
    """Starts servers from one long-lived thread: a server dies with the *thread* that
    started it (``PR_SET_PDEATHSIG``), and envs may step on short-lived threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[list[str], queue.Queue[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pid = 0
        # A forked child inherits the queue with the parent's spawner thread still listed as
        # its waiter: a job put there would wake that dead thread, never the child's own.
        os.register_at_fork(after_in_child=self._forget_parent)

    def _forget_parent(self) -> None:
        self._lock = threading.Lock()
        self._jobs = queue.Queue()
        self._thread = None

    def popen(self, argv: list[str]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._thread = threading.Thread(target=self._serve, name="sandbox-spawner",
                                                daemon=True)
                self._thread.start()
                self._pid = os.getpid()
        answer: queue.Queue[Any] = queue.Queue()
        self._jobs.put((argv, answer))
        result = answer.get(timeout=START_TIMEOUT_S)
        if isinstance(result, BaseException):
            raise result
        proc: subprocess.Popen[bytes] = result
        return proc

    def _serve(self) -> None:
        while True:
            argv, answer = self._jobs.get()
            try:
                answer.put(subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                    close_fds=True, start_new_session=True))
            except BaseException as exc:  # handed to the caller
                answer.put(exc)


_SPAWNER = _Spawner()


def _write_maps(pid: int) -> None:
    """uid/gid maps of the server's user namespace: the program runs as 1000, which is
    ``nobody`` on the host when the host is root, else the host user itself."""
    if os.geteuid() == 0:
        uid_map, gid_map = "0 0 1\n1000 65534 1\n", "0 0 1\n1000 65534 1\n"
    else:
        uid_map, gid_map = f"1000 {os.geteuid()} 1\n", f"1000 {os.getegid()} 1\n"
        Path(f"/proc/{pid}/setgroups").write_text("deny")
    Path(f"/proc/{pid}/uid_map").write_text(uid_map)
    Path(f"/proc/{pid}/gid_map").write_text(gid_map)


def available(python: str | None = None) -> tuple[bool, str]:
    """``(True, "")`` when this machine can isolate runs, else ``(False, why)`` (probed once
    per process: one real sandbox start and a trivial run)."""
    with _PROBE.lock:
        if _PROBE.ok is None:
            _PROBE.ok, _PROBE.why = _probe(python or sys.executable)
        return _PROBE.ok, _PROBE.why


def _probe(python: str) -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"not Linux ({sys.platform})"
    if not Path("/proc/self/ns/user").exists():
        return False, "no user namespaces in this kernel"
    box = Sandbox(python=python)
    box._probing = True
    try:
        result = box.run(["python", "-c", "print(6 * 7)"], limits=Limits(wall=10))
    except (SandboxError, OSError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        box.close()
    if result.outcome is not Outcome.PASSED or result.stdout.strip() != "42":
        return False, (result.error or result.stderr.strip().splitlines()[-1:] or ["?"])[0]
    return True, ""


def _run_unsafe(argv: list[str], files: dict[str, str], stdin: str, limits: Limits,
                expected: str | None) -> RunResult:
    """No isolation (the user asked for it): a subprocess in a temporary directory."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            Path(tmp, name).parent.mkdir(parents=True, exist_ok=True)
            Path(tmp, name).write_text(text, encoding="utf-8")
        argv = [sys.executable if a in ("python", "python3") and i == 0 else a
                for i, a in enumerate(argv)]
        started = time.monotonic()
        try:
            proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=tmp,
                                  timeout=limits.wall, start_new_session=True)
        except subprocess.TimeoutExpired:
            return RunResult(Outcome.TIMEOUT, wall_s=time.monotonic() - started)
        reply: dict[str, Any] = {"status": "exited" if proc.returncode >= 0 else "signaled",
                 "code": proc.returncode if proc.returncode >= 0 else -1,
                 "signal": max(0, -proc.returncode), "stdout": proc.stdout[:limits.output],
                 "stderr": proc.stderr[-(1 << 16):]}
        return RunResult(classify(reply, limits, expected), exit_code=int(reply["code"]),
                         signal=int(reply["signal"]), stdout=str(reply["stdout"]),
                         stderr=str(reply["stderr"]), wall_s=time.monotonic() - started)
