"""Shared helpers of the ``turnpool serve`` tests: a real server on 127.0.0.1 (a free port, in
a thread of the test process; the pool's workers are real processes) and OpenEnv's own
client from PyPI."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from openenv.core import GenericEnvClient

from turnpool.worker import failures

#: The class a timed-out / killed env reports: issue 11's taxonomy when it is in the tree,
#: else the documented default for results that name none.
HAS_TAXONOMY = hasattr(failures, "FAILURE_CLASSES")


def expected_failure(kind: str) -> str:
    return kind if HAS_TAXONOMY else "env_error"


def client(url: str, **kwargs: Any) -> Any:
    """OpenEnv's sync WebSocket client on ``url``."""
    return GenericEnvClient(base_url=url, message_timeout_s=60.0, **kwargs).sync()


def openenv_validate(url: str) -> None:
    """``openenv validate`` against a running server passes every criterion (exit 0)."""
    out = subprocess.run([sys.executable, "-m", "openenv.cli", "validate", "--url", url,
                          "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout[out.stdout.index("{"):])
    failed = [c for c in report["criteria"] if not c["passed"]]
    assert report["passed"] is True and not failed, failed
    assert report["standard_version"] == "1.0.0"  # OpenEnv's HTTP standard, profile 1.x
    assert out.returncode == 0
