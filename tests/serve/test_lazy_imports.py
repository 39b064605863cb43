"""``turnpool serve`` of an env that is not WebShop needs no WebShop code (nor ``rapidfuzz``,
which only the WebShop reward uses): the real command runs with both made unimportable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)

#: Runs the ``turnpool`` command with WebShop code and rapidfuzz unimportable.
_WITHOUT_WEBSHOP = """
import sys

class _Unimportable:
    def find_spec(self, name, path=None, target=None):
        for blocked in ("rapidfuzz", "turnpool.webshop"):
            if name == blocked or name.startswith(blocked + "."):
                raise ImportError(f"{name} was imported")
        return None

sys.meta_path.insert(0, _Unimportable())
from turnpool.cli import main
main()
"""


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else ""


def test_serving_sokoban_imports_no_webshop_code() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _WITHOUT_WEBSHOP, "serve", "--env", "sokoban", "--port", "0",
         "--backend", "thread", "--num-workers", "1", "--max-sessions", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = _first_line(proc, timeout=90)
        found = re.search(r"at (http://[0-9.]+:\d+)", line)
        assert found, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = found.group(1)
        with httpx.Client(base_url=url, timeout=30) as http:
            reply = http.post("/reset", json={"seed": 3})
            assert reply.status_code == 200, reply.text
            assert reply.json()["observation"]["text"]
            assert http.get("/metrics").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
