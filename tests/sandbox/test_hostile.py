"""The hostile battery: programs that try to hurt the host, each contained. Every test checks
the run's class, that the host is untouched, and (through the ``run`` fixture) that nothing
the program started is still running and that the sandbox still serves the next run."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from tests.sandbox.conftest import FAST
from turnpool.sandbox import Limits, Outcome, Sandbox

CTYPES = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


# ------------------------------------------------------------------------------- resources
def test_a_fork_bomb_ends_on_its_limits(run) -> None:
    r = run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
            "        pass\n")
    assert r.outcome in (Outcome.TIMEOUT, Outcome.RUNTIME_ERROR)


def test_an_infinite_loop_times_out_on_cpu(run) -> None:
    assert run("while True:\n    pass\n").outcome is Outcome.TIMEOUT


def test_a_sleeping_program_times_out_on_the_wall_clock(run) -> None:
    r = run("import time\ntime.sleep(60)\n", limits=Limits(wall=0.5, cpu=1))
    assert r.outcome is Outcome.TIMEOUT


def test_a_memory_bomb_hits_the_memory_limit(run) -> None:
    r = run("chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))\n")
    assert r.outcome is Outcome.MEMORY_LIMIT


def test_one_huge_allocation_hits_the_memory_limit(run) -> None:
    assert run("x = bytearray(1 << 34)\n").outcome is Outcome.MEMORY_LIMIT


def test_a_gigabyte_of_output_hits_the_output_limit(run) -> None:
    r = run("import sys\nblock = 'x' * (1 << 20)\nfor _ in range(1024):\n"
            "    sys.stdout.write(block)\n")
    assert r.outcome is Outcome.OUTPUT_LIMIT
    assert len(r.stdout) <= FAST.output


def test_a_flood_on_stderr_hits_the_output_limit(run) -> None:
    r = run("import os\nwhile True:\n    os.write(2, b'e' * 65536)\n")
    assert r.outcome is Outcome.OUTPUT_LIMIT


def test_filling_tmp_fails_inside_and_the_next_run_gets_a_fresh_tmp(run) -> None:
    r = run("i = 0\nwhile True:\n    open(f'/tmp/f{i}', 'wb').write(b'x' * 500_000)\n"
            "    i += 1\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and "No space left" in r.stderr
    assert run("import os\nprint(os.listdir('/tmp'))\n").stdout == "['main.py']\n"


def test_a_file_larger_than_the_file_size_limit_is_stopped(run) -> None:
    r = run("open('/tmp/big', 'wb').write(b'x' * (2 << 20))\n")
    assert r.outcome is Outcome.OUTPUT_LIMIT


def test_too_many_open_files_fail_inside(run) -> None:
    r = run("fs = [open('/tmp/main.py') for _ in range(1000)]\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and "Too many open files" in r.stderr


def test_a_thread_bomb_is_capped_by_the_process_limit(run) -> None:
    r = run("import threading, time\nts = []\nfor _ in range(1000):\n"
            "    t = threading.Thread(target=time.sleep, args=(30,), daemon=True)\n"
            "    t.start()\n    ts.append(t)\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and "can't start new thread" in r.stderr


def test_raising_its_own_rlimits_is_refused(run) -> None:
    r = run("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1000, 1000))\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and "not allowed" in r.stderr


# ------------------------------------------------------------------------------- file system
def test_writing_a_host_path_fails(run, tmp_path: Path) -> None:
    target = tmp_path / "written"
    r = run(f"open({str(target)!r}, 'w').write('pwned')\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and not target.exists()


def test_writing_the_system_directories_fails(run) -> None:
    r = run("open('/usr/pwned', 'w')\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and "Read-only file system" in r.stderr
    assert not Path("/usr/pwned").exists()


def test_deleting_a_host_file_fails(run, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    r = run(f"import os\nos.remove({str(victim)!r})\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and victim.read_text() == "keep me"


def test_a_symlink_out_of_tmp_reaches_nothing_of_the_host(run, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("TOKEN-1234")
    r = run(f"import os\nos.symlink({str(secret)!r}, '/tmp/link')\n"
            "print(open('/tmp/link').read())\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and "TOKEN-1234" not in r.stdout


def test_a_symlink_written_through_does_not_escape(run, tmp_path: Path) -> None:
    r = run(f"import os\nos.symlink({str(tmp_path)!r}, '/tmp/out')\n"
            "open('/tmp/out/escaped', 'w').write('x')\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and not (tmp_path / "escaped").exists()


def test_reading_a_host_file_fails(run, tmp_path: Path) -> None:
    secret = tmp_path / "api_key"
    secret.write_text("sk-secret")
    r = run(f"print(open({str(secret)!r}).read())\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and "sk-secret" not in r.stdout


def test_the_host_password_files_are_not_there(run) -> None:
    r = run("import os\nprint(os.path.exists('/etc/shadow'), open('/etc/passwd').read())\n")
    assert r.outcome is Outcome.PASSED
    assert r.stdout.startswith("False sandbox:x:1000") and "root:" not in r.stdout


def test_writing_proc_sys_fails(run) -> None:
    r = run("open('/proc/sys/kernel/hostname', 'w').write('pwned')\n")
    assert r.outcome is Outcome.RUNTIME_ERROR
    assert socket.gethostname() != "pwned"


def test_a_run_sees_none_of_the_previous_runs_files(run) -> None:
    r = run("import os\nopen('/tmp/left', 'w').write('x')\nos.makedirs('/tmp/.hidden/deep')\n"
            "open('/tmp/.hidden/deep/x', 'w').write('x')\nos.chmod('/tmp/.hidden', 0)\n")
    assert r.outcome is Outcome.PASSED
    r = run("import os\nprint(sorted(os.path.join(d, f) for d, ds, fs in os.walk('/tmp')"
            " for f in fs + ds))\n")
    assert r.stdout == "['/tmp/main.py']\n"


# ------------------------------------------------------------------------------- secrets
def test_the_parents_environment_is_not_visible(run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNPOOL_TEST_SECRET", "hunter2")
    r = run("import os\nprint(dict(os.environ))\n")
    assert r.outcome is Outcome.PASSED and "hunter2" not in r.stdout
    assert "TURNPOOL_TEST_SECRET" not in r.stdout


PIDS = ("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),"
        " [os.getpid()])\n")


def test_host_processes_are_not_in_proc(run) -> None:
    r = run(f"print(open('/proc/{os.getpid()}/environ').read())\n")
    assert r.outcome is Outcome.RUNTIME_ERROR
    pids, me = r_lists(run(PIDS).stdout)
    assert pids == me  # the run itself, and neither the host nor the sandbox's server


def r_lists(stdout: str) -> tuple[list[int], list[int]]:
    first, _, second = stdout.strip().partition("] [")
    return ([int(p) for p in first.strip("[]").split(",") if p],
            [int(p) for p in second.strip("[]").split(",") if p])


def test_the_server_a_run_is_forked_from_is_neither_readable_nor_hurt(run, box: Sandbox
                                                                       ) -> None:
    """Every run is forked from the sandbox's server (PID 1 inside): it must stay out of
    reach, or one run could spy on or tamper with the next."""
    server = box.server_pid
    for path in ("/proc/1/environ", "/proc/1/mem", "/proc/1/cmdline", "/proc/1/maps"):
        r = run(f"print(open({path!r}, 'rb').read(64))\n")
        # hidden from a run's /proc (readable by no run, if its owner's groups show it)
        assert r.outcome is Outcome.RUNTIME_ERROR, r
        assert "FileNotFoundError" in r.stderr or "PermissionError" in r.stderr, r
    r = run("import os\nfor sig in (2, 10, 15, 19, 9):\n    try:\n        os.kill(1, sig)\n"
            "    except OSError:\n        pass\nprint('sent')\n")
    assert r.outcome is Outcome.PASSED and r.stdout == "sent\n"
    assert box.server_pid == server  # the same server, alive (the fixture runs once more)


# ------------------------------------------------------------------------------- network
def test_a_tcp_server_of_the_host_receives_nothing(run) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    r = run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "s.sendall(b'stolen')\n")
    assert r.outcome is Outcome.RUNTIME_ERROR
    server.settimeout(0.05)  # the run is over: anything it sent would be queued already
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()


def test_a_udp_datagram_to_the_host_never_arrives(run) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    port = receiver.getsockname()[1]
    r = run(f"import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto("
            f"b'stolen', ('127.0.0.1', {port}))\n")
    assert r.outcome is Outcome.RUNTIME_ERROR
    receiver.setblocking(False)
    with pytest.raises(BlockingIOError):
        receiver.recv(64)
    receiver.close()


def test_the_internet_is_unreachable(run) -> None:
    r = run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and "unreachable" in r.stderr


# ------------------------------------------------------------------------------- processes
def test_killing_the_parent_hurts_no_one(run) -> None:
    r = run("import os\nos.kill(os.getppid(), 9)\nprint('after')\n")
    assert r.outcome in (Outcome.RUNTIME_ERROR, Outcome.PASSED)


def test_killing_every_process_it_can_see_hurts_no_one(run) -> None:
    r = run("import os\nos.kill(-1, 9)\n")
    assert r.outcome in (Outcome.RUNTIME_ERROR, Outcome.PASSED)


def test_a_signal_to_process_group_zero_hurts_no_one(run) -> None:
    r = run("import os, signal\nif os.fork() == 0:\n    os.kill(0, signal.SIGKILL)\n"
            "os.wait()\n")
    assert r.outcome in (Outcome.RUNTIME_ERROR, Outcome.PASSED)


def test_killing_the_host_by_pid_fails(run) -> None:
    r = run(f"import os\nos.kill({os.getpid()}, 9)\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and "ProcessLookupError" in r.stderr


def test_a_daemonized_grandchild_dies_with_the_run(run) -> None:
    r = run("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(60)\n    os._exit(0)\nos.wait()\nprint('parent done')\n")
    assert r.outcome is Outcome.PASSED and r.stdout == "parent done\n"


def test_a_process_left_by_one_run_is_gone_before_the_next(run) -> None:
    """The runs of a sandbox share its network and PID namespaces: a listener left behind
    would answer the next run, and a sleeper would show in its /proc."""
    r = run("import os, socket, time\nr, w = os.pipe()\nif os.fork() == 0:\n    os.setsid()\n"
            "    s = socket.socket(socket.AF_UNIX)\n    s.bind('\\0turnpool-left')\n"
            "    s.listen()\n    os.write(w, b'1')\n    time.sleep(60)\n"
            "os.read(r, 1)\nprint('listening')\n")
    assert r.outcome is Outcome.PASSED and r.stdout == "listening\n"
    r = run("import socket\ns = socket.socket(socket.AF_UNIX)\n"
            "s.connect('\\0turnpool-left')\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and "ConnectionRefusedError" in r.stderr
    pids, me = r_lists(run(PIDS).stdout)
    assert pids == me


def test_sysv_ipc_and_message_queues_are_refused(run) -> None:
    """Their objects live in the IPC namespace the runs share, past the run that made them."""
    r = run(CTYPES + "libc.mq_open.restype = ctypes.c_int\n"
            "print(libc.shmget(0, 4096, 0o1600), ctypes.get_errno(),"
            " libc.semget(0, 1, 0o1600), ctypes.get_errno(),"
            " libc.msgget(0, 0o1600), ctypes.get_errno(),"
            " libc.mq_open(b'/q', 0o100 | 2, 0o600, None), ctypes.get_errno())\n")
    assert r.outcome is Outcome.PASSED and r.stdout == "-1 1 -1 1 -1 1 -1 1\n", r


def test_becoming_root_fails(run) -> None:
    r = run("import os\nos.setuid(0)\n")
    assert r.outcome is Outcome.RUNTIME_ERROR
    # EPERM under a root host; EINVAL under a normal user (uid 0 is not even mapped)
    assert "Operation not permitted" in r.stderr or "Invalid argument" in r.stderr


# ------------------------------------------------------------------------------- syscalls
def test_ptrace_is_forbidden(run) -> None:
    assert run(CTYPES + "libc.ptrace(16, 1, 0, 0)\n").outcome is Outcome.FORBIDDEN


def test_a_new_user_namespace_is_forbidden(run) -> None:
    assert run(CTYPES + "libc.unshare(0x10000000)\n").outcome is Outcome.FORBIDDEN


def test_clone_into_a_new_network_namespace_is_forbidden(run) -> None:
    r = run(CTYPES + "libc.syscall.restype = ctypes.c_long\n"
            "libc.syscall(56 if os.uname().machine == 'x86_64' else 220, 0x40000000 | 17,"
            " 0, 0, 0, 0)\n")
    assert r.outcome is Outcome.FORBIDDEN


def test_mount_is_forbidden(run) -> None:
    r = run(CTYPES + "libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)\n")
    assert r.outcome is Outcome.FORBIDDEN


def test_chroot_is_forbidden(run) -> None:
    assert run(CTYPES + "libc.chroot(b'/tmp')\n").outcome is Outcome.FORBIDDEN


def test_bpf_and_keyring_syscalls_are_forbidden(run) -> None:
    r = run(CTYPES + "libc.syscall(321 if os.uname().machine == 'x86_64' else 280, 0, 0, 0)\n")
    assert r.outcome is Outcome.FORBIDDEN
    r = run(CTYPES + "libc.syscall(250 if os.uname().machine == 'x86_64' else 219, 0, 0)\n")
    assert r.outcome is Outcome.FORBIDDEN


def test_process_vm_readv_is_forbidden(run) -> None:
    r = run(CTYPES + "libc.syscall(310 if os.uname().machine == 'x86_64' else 270, 1, 0, 0,"
            " 0, 0, 0)\n")
    assert r.outcome is Outcome.FORBIDDEN


def test_io_uring_is_forbidden(run) -> None:
    assert run(CTYPES + "libc.syscall(425, 8, 0)\n").outcome is Outcome.FORBIDDEN


def test_sethostname_fails(run) -> None:
    r = run("import socket\nsocket.sethostname('pwned')\n")
    assert r.outcome is Outcome.RUNTIME_ERROR and socket.gethostname() != "pwned"


def test_threads_still_work_under_the_filter(run) -> None:
    r = run("import threading\nout = []\nt = threading.Thread(target=out.append, args=(7,))\n"
            "t.start()\nt.join()\nprint(out)\n")
    assert r.outcome is Outcome.PASSED and r.stdout == "[7]\n"


# ------------------------------------------------------------------------------- neighbours
def test_a_hostile_run_leaves_a_neighbour_sandbox_unaffected(box: Sandbox) -> None:
    results = {}
    with Sandbox() as other:
        def hostile() -> None:
            results["hostile"] = box.run(
                ["python", "-c", "import os\nos.kill(-1, 9)\nwhile True: os.fork()"],
                limits=Limits(wall=1, cpu=1, procs=16))
        thread = threading.Thread(target=hostile)
        thread.start()
        results["other"] = other.run(["python", "-c", "print(sum(range(10)))"], limits=FAST)
        thread.join(timeout=30)
    assert results["other"].stdout == "45\n"
    assert results["hostile"].outcome in (Outcome.RUNTIME_ERROR, Outcome.TIMEOUT)
