"""``turnpool serve --frontends 2`` stopped by Ctrl-C or SIGTERM, early or late: no fatal
error, no front left running, no ``turnpool-fronts-*`` directory left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.faults import wait_gone

pytestmark = pytest.mark.timeout(180)

SERVE = [sys.executable, "-m", "turnpool.cli", "serve", "--env", "trivial", "--frontends", "2",
         "--port", "0", "--workers", "2", "--max-sessions", "4"]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A scratch TMPDIR short enough for the fronts' unix sockets (pytest's tmp_path under
    xdist is not)."""
    with tempfile.TemporaryDirectory(prefix="tp-", dir="/tmp") as d:
        yield Path(d)


def _start(tmp: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": os.getcwd()}
    return subprocess.Popen(SERVE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # its own group, as a terminal's


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # gone, or not exec'd yet
        return []


def _stop(proc: subprocess.Popen[str], sig: int) -> tuple[str, list[int]]:
    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, sig)  # the terminal sends Ctrl-C to the whole group
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return err, children


def test_ctrl_c_while_the_fronts_start_is_quiet(short_tmp: Path) -> None:
    tmp_path = short_tmp
    proc = _start(tmp_path)
    deadline = time.monotonic() + 60
    # the moment the first front's interpreter is starting (its `import site`)
    while not any("spawn_main" in " ".join(_cmdline(c))
                  for c in psutil.Process(proc.pid).children()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.002)
    err, children = _stop(proc, signal.SIGINT)
    # the fronts never see the Ctrl-C (their supervisor stops them); a pool worker whose
    # front stops while the worker is being spawned may still say so (EOFError): known
    assert "Fatal Python error" not in err and "KeyboardInterrupt" not in err, err
    assert "FileNotFoundError" not in err, err  # no front left starting after the stop
    assert wait_gone(children, 10.0) == []
    assert list(tmp_path.iterdir()) == []


def test_sigterm_to_a_running_multi_front_server_leaves_nothing(short_tmp: Path) -> None:
    tmp_path = short_tmp
    proc = _start(tmp_path)
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    if "2 fronts" not in ready:  # it ended instead: say why
        proc.kill()
        pytest.fail(f"not ready: {ready!r} {proc.communicate(timeout=30)}")
    assert [p.name for p in tmp_path.iterdir()][0].startswith("turnpool-fronts-")
    err, children = _stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert wait_gone(children, 10.0) == []
    assert list(tmp_path.iterdir()) == []
