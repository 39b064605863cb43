"""Every script in examples/ answers ``--help`` with its usage at once (nothing trained, no
folder left behind)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_helps_instead_of_running(script: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:"), proc.stdout[:500]
    assert list(scratch.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]
