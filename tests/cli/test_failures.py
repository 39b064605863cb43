"""``turnpool rollout`` fails loudly: a non-zero exit code and one readable line for an invalid
config, envs that cannot be built, an unreachable policy endpoint and too many failed episodes;
Ctrl-C ends it at once with no process left and a JSONL file that is valid line by line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from tests.faults import GONE_S, wait_gone
from turnpool.cli import main
from turnpool.cli.rollout import EXIT_INTERRUPTED, EXIT_POLICY_UNREACHABLE, EXIT_TOO_MANY_FAILURES
from turnpool.policies.tiny_llm import free_port

pytestmark = pytest.mark.timeout(180)

SMALL = ["es_manager.train.env_groups=2", "es_manager.train.env_configs.n_groups=[2]",
         "es_manager.train.group_size=4", "es_manager.train.env_configs.tags=[FrozenLake]",
         "turnpool.backend=sequential", "agent_proxy.max_turn=3"]


def _openai(url: str) -> str:
    return (f"turnpool.policy={{name: openai, base_url: '{url}', max_retries: 1, "
            f"backoff: 0.01, timeout: 5}}")


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error:")]


def test_an_unreachable_policy_endpoint_fails_fast_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    res = CliRunner().invoke(main, ["rollout", "--no-progress", *SMALL, _openai(url)])
    assert time.monotonic() - started < 60
    assert res.exit_code == EXIT_POLICY_UNREACHABLE, res.output
    lines = _error_lines(res.output)
    assert len(lines) == 1 and url in lines[0] and "Traceback" not in res.output


class _Refusing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(400)
        self.end_headers()
        self.wfile.write(b'{"error": "no"}')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def refusing_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_too_many_failed_episodes_exit_non_zero(refusing_server: str, tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    res = CliRunner().invoke(main, ["rollout", "--no-progress", *SMALL, _openai(refusing_server),
                                    "--json", str(summary)])
    assert res.exit_code == EXIT_TOO_MANY_FAILURES, res.output
    lines = _error_lines(res.output)
    assert len(lines) == 1 and "policy_error" in lines[0] and "100%" in lines[0]
    metrics = json.loads(summary.read_text())["metrics"]  # the summary is still written
    assert metrics["failures/dropped_groups"] == 2 and metrics["trajectories"] == 0
    res = CliRunner().invoke(main, ["rollout", "--no-progress", *SMALL, _openai(refusing_server),
                                    "--max-failed-fraction", "1"])
    assert res.exit_code == 0, res.output


def test_envs_that_cannot_be_built_fail_the_run_in_one_line() -> None:
    res = CliRunner().invoke(main, ["rollout", "--no-progress", *SMALL,
                                    "custom_envs.FrozenLake.env_config.size=abc"])
    assert res.exit_code == 1, res.output
    lines = _error_lines(res.output)
    assert len(lines) == 1 and "FrozenLake" in lines[0] and "'size': 'abc'" in lines[0]


def test_ctrl_c_ends_the_rollout_at_once(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    args = [sys.executable, "-m", "turnpool.cli", "rollout", "--no-progress",
            "--batches", "100000", "--out", str(out), *SMALL[:-2],
            "turnpool.backend=process", "turnpool.num_workers=2"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no trajectory was written"
            time.sleep(0.05)
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert children  # the process backend's workers
        os.kill(proc.pid, signal.SIGINT)
        interrupted = time.monotonic()
        # not the 100,000 batches (hours): a generous ceiling, for a loaded one-core machine
        _, err = proc.communicate(timeout=120)
        assert time.monotonic() - interrupted < 120
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "interrupted" in err and "Traceback" not in err
    assert wait_gone(children, GONE_S) == []
    lines = out.read_text().splitlines()
    assert lines and all(json.loads(line)["env_id"] >= 0 for line in lines)
    # whole batches only (2 groups of 4 each), and the line says exactly how many
    assert len(lines) % 8 == 0
    assert f"wrote {len(lines)} trajectories (whole groups)" in " ".join(err.split())
