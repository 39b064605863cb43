"""The inside of a sandbox: started by `turnpool.sandbox.core.Sandbox` as a script (stdlib only,
``python -I -S _inner.py HOST_PID``), it builds the namespaces once and serves runs.

Processes, from the host down:

* **A** (this script, a child of the host): ``unshare`` user, mount, network, IPC, UTS and PID
  namespaces; the host writes its uid/gid maps; A binds the read-only parts of the file system
  under a fresh tmpfs root and forks B. A dies with the host (``PR_SET_PDEATHSIG``).
* **B** (PID 1 of the sandbox, the zygote): mounts ``/proc`` (``hidepid=2``: a run sees only
  processes it may trace, so never B), ``pivot_root``\\ s into the new root, makes itself
  non-dumpable, pre-imports the usual modules and compiles the seccomp filter, then serves
  requests (length-prefixed JSON on fds 0/1). B dies with A; when B dies, the kernel kills
  every process of the namespace.
* **P** (one per run, forked by B): per run B mounts a fresh tmpfs on ``/tmp`` (the only
  writable place) with the run's files, forks P, enforces the wall clock and the output limit,
  and when P ends kills every other process of the namespace (``kill(-1)`` from PID 1 reaches
  them all), reaps them and unmounts ``/tmp``: the next run finds no file and no process of
  this one. P sets the rlimits, becomes an unprivileged user, drops every capability, sets
  ``no_new_privs`` and the seccomp filter (escape syscalls kill it with SIGSYS; SysV IPC and
  POSIX message queues, which would outlive a run in the shared IPC namespace, fail with
  EPERM), then runs the program: ``python FILE`` in this pre-imported interpreter (warm: no
  exec), anything else by ``execve``.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import io
import json
import os
import platform
import resource
import select
import signal
import struct
import sys
import time
import types
from types import CodeType

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x20000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID = 0x08000000, 0x10000000, 0x20000000
CLONE_NEWNET, CLONE_NEWTIME = 0x40000000, 0x80
NS_FLAGS = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
            | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWTIME)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAP_AMBIENT = 38, 22, 47
SANDBOX_ID = 1000           # uid and gid of the program inside
MAX_MESSAGE = 256 << 20
STDIN = "/tmp/.stdin"
WARM = ("python", "python3")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
       "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}
#: modules imported once in B so a warm run starts with them loaded
PREIMPORT = ("collections", "itertools", "functools", "heapq", "bisect", "math", "re",
             "string", "json", "typing", "fractions", "decimal", "copy", "operator", "array",
             "dataclasses", "statistics", "contextlib")

# syscall numbers: pivot_root, capset, clone, those that kill the program, and SysV IPC and
# POSIX message queues (refused with EPERM: their objects would outlive the run)
_ARCH = {
    "x86_64": (0xC000003E, 155, 126, 56, (
        101, 310, 311, 165, 166, 155, 161, 272, 308, 250, 248, 249, 321, 298, 246, 320, 175,
        313, 176, 169, 167, 168, 163, 164, 227, 159, 172, 173, 323, 304, 303, 179, 103, 300,
        428, 429, 430, 431, 432, 433, 442, 425, 426, 427, 312, 438, 440, 212, 153), (
        29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 220, 240, 241, 242, 243, 244, 245)),
    "aarch64": (0xC00000B7, 41, 91, 220, (
        117, 270, 271, 40, 39, 41, 51, 97, 268, 219, 217, 218, 280, 241, 104, 294, 105, 273,
        106, 142, 224, 225, 89, 170, 112, 171, 282, 265, 264, 60, 116, 262, 428, 429, 430,
        431, 432, 433, 442, 425, 426, 427, 272, 438, 440, 18), tuple(range(180, 198))),
}
CLONE3 = 435
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]


def _check(ret: int, what: str) -> None:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def arch() -> tuple[int, int, int, int, tuple[int, ...], tuple[int, ...]]:
    machine = platform.machine()
    if machine not in _ARCH:
        raise OSError(f"no sandbox for machine {machine!r} (x86_64 and aarch64 only)")
    return _ARCH[machine]


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(src: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)),
           f"mount {target}")


def prctl(option: int, arg: int = 0, arg3: int = 0) -> None:
    _check(_libc.prctl(option, arg, arg3, 0, 0), f"prctl {option}")


# ------------------------------------------------------------------------------- A: setup
def _bind(root: str, src: str) -> None:
    """Bind ``src`` read-only at the same path under ``root`` (a link stays a link)."""
    if os.path.islink(src) and os.path.dirname(src) == "/":
        os.symlink(os.readlink(src), root + src)
        return
    src = os.path.realpath(src)
    if not os.path.exists(src) or os.path.exists(root + src):
        return
    os.makedirs(os.path.dirname(root + src), exist_ok=True)
    if os.path.isdir(src):
        os.mkdir(root + src)
    else:
        open(root + src, "w").close()
    mount(src, root + src, None, MS_BIND | MS_REC)
    keep = 0
    st = os.statvfs(root + src).f_flag  # locked flags of the source must be kept
    for st_flag, ms_flag in ((os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME),
                             (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME)):
        if st & st_flag:
            keep |= ms_flag
    devices = src.startswith("/dev/")
    mount(None, root + src, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | keep
          | (0 if devices else MS_NODEV))


def build_root(root: str, binds: list[str]) -> None:
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for name in ("proc", "tmp", "dev", "etc"):
        os.mkdir(f"{root}/{name}")
    for src in binds:
        _bind(root, src)
    for dev in ("null", "zero", "full", "random", "urandom"):
        _bind(root, f"/dev/{dev}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    with open(f"{root}/etc/passwd", "w") as f:
        f.write(f"sandbox:x:{SANDBOX_ID}:{SANDBOX_ID}::/tmp:/bin/sh\n")


def enter_root(root: str) -> None:
    """In B: a /proc of the sandbox's PID namespace that shows a run only the processes it may
    trace (its own), then the new root replaces the old."""
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    os.chdir(root)
    _check(_libc.syscall(arch()[1], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4m,mode=0755")


# ------------------------------------------------------------------------------- P: privileges
class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def seccomp_program() -> list[tuple[int, int, int, int]]:
    """A classic BPF program: other ABIs, escape syscalls and namespace flags of ``clone``
    kill the process (SIGSYS); SysV IPC and message queues answer EPERM; ``clone3`` answers
    ENOSYS (libc falls back to ``clone``)."""
    audit_arch, _, _, nr_clone, denied, ipc = arch()
    ld, jeq, jset, ret, jge = 0x20, 0x15, 0x45, 0x06, 0x35
    kill, allow, enosys, eperm = 0x80000000, 0x7FFF0000, 0x00050000 | 38, 0x00050000 | 1
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, kill), (ld, 0, 0, 0),
            (jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]  # x32 ABI
    for nr in denied:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, kill)]
    for nr in ipc:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, CLONE3), (ret, 0, 0, enosys),
             (jeq, 0, 3, nr_clone), (ld, 0, 0, 16), (jset, 0, 1, NS_FLAGS), (ret, 0, 0, kill),
             (ret, 0, 0, allow)]
    return prog


class Privileges:
    """What P gives up, prepared once in B: the compiled seccomp filter (the ctypes buffers
    live as long as B, so each P only hands the kernel a pointer)."""

    def __init__(self, root_host: bool) -> None:
        self.root_host = root_host
        program = seccomp_program()
        self._filters = (_Filter * len(program))(*[_Filter(*ins) for ins in program])
        self._prog = _Prog(len(program), self._filters)
        self._caps_header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        self._caps_data = (ctypes.c_uint32 * 6)()
        self._capset = arch()[2]
        # B never execs, so the bounding and ambient sets can go once for all its children
        for cap in range(64):
            if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
                break
        _libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)

    def drop(self) -> None:
        """In P: become uid/gid 1000 of the sandbox with no capability, no way to regain one,
        and the seccomp filter installed."""
        if self.root_host:
            os.setgroups([])
        os.setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
        os.setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
        _check(_libc.syscall(self._capset, self._caps_header, self._caps_data), "capset")
        if not self.root_host:  # B is non-dumpable; P (same uid here) gets its /proc back
            prctl(PR_SET_DUMPABLE, 1)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        _check(_libc.prctl(PR_SET_SECCOMP, 2, ctypes.addressof(self._prog), 0, 0), "seccomp")


def set_limits(limits: dict[str, int]) -> None:
    cpu = max(1, int(limits["cpu"]))
    for res, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                       (resource.RLIMIT_AS, (limits["memory"],) * 2),
                       (resource.RLIMIT_FSIZE, (limits["file_size"],) * 2),
                       (resource.RLIMIT_NPROC, (limits["procs"],) * 2),
                       (resource.RLIMIT_NOFILE, (limits["files"],) * 2),
                       (resource.RLIMIT_CORE, (0, 0)), (resource.RLIMIT_MEMLOCK, (0, 0))):
        resource.setrlimit(res, value)


# ------------------------------------------------------------------------------- P: the program
Stdio = tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]


def make_stdio() -> Stdio:
    """Text streams over fds 0-2, made once in B: each P dup2s its own files onto those fds
    and takes the streams as they are (unused in B, so empty), instead of building them."""
    def text(fd: int, write: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w" if write else "r", closefd=False)
        buf = io.BufferedWriter(raw) if write else io.BufferedReader(raw)
        return io.TextIOWrapper(buf, encoding="utf-8", errors="surrogateescape" if not write
                                else "backslashreplace" if fd == 2 else "strict")
    return text(0, False), text(1, True), text(2, True)


def run_python(args: list[str], stdio: Stdio, compiled: CodeType | None = None) -> int:
    """``python FILE ARGS`` / ``python -c CODE ARGS`` in this process (the run's P), with
    python's exit codes (an uncaught exception prints its traceback and exits 1);
    ``compiled``: FILE's code, compiled by B already."""
    sys.stdin, sys.stdout, sys.stderr = stdio
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = stdio  # type: ignore[misc]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    filename = "<string>" if args[:1] == ["-c"] else args[0] if args else "<stdin>"
    code = 0
    try:
        if args[:1] == ["-c"]:
            sys.argv = ["-c", *args[2:]]
            sys.path[0:0] = [""]
            source: str | bytes = args[1]
        else:
            sys.argv = list(args)
            sys.path[0:0] = [os.path.dirname(os.path.abspath(filename))]
            if compiled is None:
                with open(filename, "rb") as f:
                    source = f.read()
            main.__file__ = filename
        if compiled is None:
            compiled = compile(source, filename, "exec")
        exec(compiled, main.__dict__)  # noqa: S102 - P, in the sandbox
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:  # what python does with an uncaught exception
        tb = exc.__traceback__  # from the program's own frames, as `python FILE` shows it
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
        # python's own display (C), which words some SyntaxError carets unlike `traceback`
        exc.__traceback__ = tb
        try:
            sys.excepthook(type(exc), exc, tb)
        except BaseException:  # a program's broken excepthook: python falls back too
            sys.__excepthook__(type(exc), exc, tb)
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = 120
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def program(req: dict, out_w: int, err_w: int, privileges: Privileges, stdio: Stdio,
            compiled: CodeType | None) -> None:
    """P: never returns."""
    code = 127
    try:
        os.setsid()
        fd = os.open(STDIN, os.O_RDONLY)
        os.unlink(STDIN)
        os.dup2(fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 20)  # B's fds (the host's pipes among them) are not the run's
        os.chdir("/tmp")
        set_limits(req["limits"])
        privileges.drop()
    except BaseException as exc:
        os.write(2, f"sandbox setup failed: {exc}\n".encode())
        os._exit(126)
    argv = req["argv"]
    try:
        if req.get("warm", True) and argv[0] in WARM:
            code = run_python(argv[1:], stdio, compiled)
        else:
            os.execve(_which(argv[0]), argv, ENV)
    except BaseException as exc:
        os.write(2, f"{argv[0]}: {exc}\n".encode(errors="replace"))
    os._exit(code)


def _which(name: str) -> str:
    if "/" in name:
        return name
    for d in ENV["PATH"].split(":"):
        if os.access(f"{d}/{name}", os.X_OK):
            return f"{d}/{name}"
    return name


# ------------------------------------------------------------------------------- B: one run
class Codes:
    """The code of trusted programs (the caller's own harness, never a model's text: the
    request says so), compiled in B once per text and handed to every P that runs it."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._codes: dict[tuple[str, str], CodeType] = {}

    def of(self, req: dict) -> CodeType | None:
        argv, files = req["argv"], req.get("files", {})
        if not (req.get("trusted_program") and req.get("warm", True) and argv[0] in WARM
                and len(argv) > 1 and argv[1] in files):
            return None
        key = (argv[1], files[argv[1]])
        code = self._codes.pop(key, None)
        if code is None:
            try:
                code = compile(key[1], key[0], "exec")
            except Exception:  # P compiles it again and reports the error as python would
                return None
        self._codes[key] = code  # the most recently used last
        while len(self._codes) > self.keep:
            del self._codes[next(iter(self._codes))]
        return code


def _write_files(files: dict[str, str], stdin: str) -> None:
    for name, text in files.items():
        parts = name.split("/")
        if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"bad file name {name!r}")
        os.makedirs(os.path.join("/tmp", *parts[:-1]), exist_ok=True)
        with open(os.path.join("/tmp", *parts), "w", encoding="utf-8") as f:
            f.write(text)
        os.chown(os.path.join("/tmp", *parts), SANDBOX_ID, SANDBOX_ID)
    with open(STDIN, "w", encoding="utf-8") as f:
        f.write(stdin)


def _kill_the_rest() -> None:
    """Kill every process of the sandbox but B (PID 1 reaches them all with ``kill(-1)``)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass  # none left


def _reap_all() -> None:
    """Kill and reap until B has no child: every orphan of a run is re-parented to B (PID 1),
    so no child left means no process of any run left."""
    while True:
        _kill_the_rest()
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


class _Run:
    """B's side of one run: P's output, its exit and the reasons to kill it."""

    def __init__(self, pid: int, out_r: int, err_r: int, limits: dict[str, int]) -> None:
        self.pid, self.limits = pid, limits
        self.start = time.monotonic()
        self.bufs = {out_r: bytearray(), err_r: bytearray()}
        self.out_r, self.err_r = out_r, err_r
        self.status: int | None = None
        self.cpu = 0.0

    def reap_p(self) -> None:
        _, status, usage = os.wait4(self.pid, 0)
        self.status, self.cpu = status, usage.ru_utime + usage.ru_stime

    def collect(self, pidfd: int) -> str:
        """Read the output until P has exited and both pipes are closed; kill everything on
        the wall clock or past the output limit. Returns why it was killed, or ""."""
        open_fds = [self.out_r, self.err_r]
        deadline = self.start + float(self.limits["wall"])
        while open_fds or self.status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            watch = open_fds + ([pidfd] if self.status is None else [])
            for fd in select.select(watch, [], [], left)[0]:
                if fd == pidfd:  # P is done: what it left behind dies now, closing the pipes
                    self.reap_p()
                    _kill_the_rest()
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.remove(fd)
                    continue
                self.bufs[fd] += chunk
            if len(self.bufs[self.out_r]) + len(self.bufs[self.err_r]) > self.limits["output"]:
                return "output_limit"
        return ""

    def reply(self, killed: str) -> dict:
        if killed:
            _kill_the_rest()
            if self.status is None:
                self.reap_p()
        status = self.status or 0
        return {"status": killed or ("signaled" if os.WIFSIGNALED(status) else "exited"),
                "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
                "stdout": bytes(self.bufs[self.out_r][:self.limits["output"]]).decode(
                    "utf-8", "replace"),
                "stderr": bytes(self.bufs[self.err_r][:1 << 16]).decode("utf-8", "replace"),
                "wall": time.monotonic() - self.start, "cpu": self.cpu}


def run_one(req: dict, privileges: Privileges, stdio: Stdio, codes: Codes) -> dict:
    """One run in B: a fresh ``/tmp``, P forked, its output collected; afterwards no process
    and no file of the run is left."""
    limits = req["limits"]
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={limits['disk']},nr_inodes=4096,mode=0755")
    fds: list[int] = []
    try:
        os.chown("/tmp", SANDBOX_ID, SANDBOX_ID)
        _write_files(req.get("files", {}), req.get("stdin", ""))
        compiled = codes.of(req)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fds += [out_r, err_r]
        pid = os.fork()
        if pid == 0:
            try:
                program(req, out_w, err_w, privileges, stdio, compiled)
            finally:
                os._exit(127)
        os.close(out_w)
        os.close(err_w)
        run = _Run(pid, out_r, err_r, limits)
        fds.append(os.pidfd_open(pid))
        return run.reply(run.collect(fds[-1]))
    finally:
        _reap_all()
        for fd in fds:
            os.close(fd)
        _check(_libc.umount2(b"/tmp", MNT_DETACH), "umount /tmp")


# ------------------------------------------------------------------------------- B: the server
def _read_exact(fd: int, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


def send(fd: int, obj: object) -> None:
    data = json.dumps(obj).encode()
    os.write(fd, struct.pack(">I", len(data)) + data)


def serve(root_host: bool) -> None:
    """B's loop: one request in, one run, one reply out; EOF on fd 0 ends the sandbox."""
    # PID 1 gets only the signals it handles: with none handled, no run can signal B, and
    # non-dumpable, no run can read or trace it (nor see it in the hidepid /proc)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    prctl(PR_SET_DUMPABLE, 0)
    os.environ.clear()  # B's environment is each P's
    os.environ.update(ENV)
    privileges, stdio, codes = Privileges(root_host), make_stdio(), Codes()
    for name in PREIMPORT:
        __import__(name)
    gc.freeze()  # what B holds now stays shared with each P (no collector writes to it)
    send(1, {"ready": True})
    while True:
        try:
            (size,) = struct.unpack(">I", _read_exact(0, 4))
            req = json.loads(_read_exact(0, min(size, MAX_MESSAGE)))
        except EOFError:
            os._exit(0)
        try:
            reply = run_one(req, privileges, stdio, codes)
        except Exception as exc:
            reply = {"status": "error", "code": -1, "signal": 0,
                     "error": f"{type(exc).__name__}: {exc}"}
        send(1, reply)


def main() -> None:
    host_pid = int(sys.argv[1])
    root_host = sys.argv[2] == "1"
    binds = json.loads(sys.argv[3])
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != host_pid:
        os._exit(1)
    try:
        unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
                | CLONE_NEWPID)
        os.write(1, b"U")  # the host writes our uid/gid maps, then answers
        if os.read(0, 1) != b"M":
            os._exit(1)
        root = "/tmp"
        build_root(root, binds)
    except BaseException as exc:
        send(1, {"error": f"{type(exc).__name__}: {exc}"})
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            enter_root(root)
        except BaseException as exc:
            send(1, {"error": f"{type(exc).__name__}: {exc}"})
            os._exit(1)
        serve(root_host)
    os.close(0)
    os.close(1)
    # the host's close(): B (PID 1: its namespace goes with it) is killed and reaped first
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


if __name__ == "__main__":
    main()
