"""What ``turnpool serve`` needs: an env that is not WebShop needs no WebShop code (nor
``rapidfuzz``, which only the WebShop reward uses), and without ``prometheus-client`` only
``/metrics`` is missing, saying which extra brings it. The real command runs with those
modules made unimportable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)

#: Runs the ``turnpool`` command with the modules named in its first argument unimportable.
_WITHOUT = """
import sys

BLOCKED = sys.argv.pop(1).split(",")

class _Unimportable:
    def find_spec(self, name, path=None, target=None):
        for blocked in BLOCKED:
            if name == blocked or name.startswith(blocked + "."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Unimportable())
from turnpool.cli import main
main()
"""


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    out = proc.stdout
    assert out is not None
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(out.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else ""


class Served:
    """``turnpool serve --env sokoban`` in a subprocess with ``blocked`` unimportable."""

    def __init__(self, blocked: str, errors: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.errors = errors
        with errors.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WITHOUT, blocked, "serve", "--env", "sokoban",
                 "--port", "0", "--backend", "thread", "--num-workers", "1",
                 "--max-sessions", "2"],
                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        line = _first_line(self.proc, timeout=90)
        found = re.search(r"at (http://[0-9.]+:\d+)", line)
        if not found:
            self.stop()
        assert found, (line, errors.read_text())
        self.url = found.group(1)

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=30)


def test_serving_sokoban_imports_no_webshop_code(tmp_path: Path) -> None:
    served = Served("rapidfuzz,turnpool.webshop", tmp_path / "stderr.txt")
    try:
        with httpx.Client(base_url=served.url, timeout=30) as http:
            reply = http.post("/reset", json={"seed": 3})
            assert reply.status_code == 200, reply.text
            assert reply.json()["observation"]["text"]
            assert http.get("/metrics").status_code == 200
    finally:
        code = served.stop()
    assert code == 0, served.errors.read_text()


def test_without_prometheus_client_metrics_names_the_extra_and_the_rest_serves(
        tmp_path: Path) -> None:
    served = Served("prometheus_client", tmp_path / "stderr.txt")
    try:
        with httpx.Client(base_url=served.url, timeout=30) as http:
            metrics = http.get("/metrics")
            assert metrics.status_code == 501
            assert metrics.json()["detail"] == ("/metrics of turnpool serve needs "
                                                "prometheus_client: pip install 'turnpool[serve]'")
            assert http.post("/reset", json={"seed": 3}).status_code == 200
            assert http.get("/api/status").json()["active_sessions"] == 0
    finally:
        code = served.stop()
    assert code == 0, served.errors.read_text()
