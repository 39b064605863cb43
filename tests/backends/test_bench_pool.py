"""The pool benchmark's smoke run over several backends (``turnpool bench pool --quick``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.timeout(120)


def test_bench_pool_quick_writes_json_and_png(tmp_path: Path) -> None:
    from turnpool.backends.base import one_per_core
    from turnpool.bench.pool import command

    out, png = tmp_path / "pool.json", tmp_path / "pool.png"
    result = CliRunner().invoke(command, [
        "--quick", "--backends", "sequential,thread,process_pool,auto", "--envs",
        "trivial,sleep", "--gym-max-n", "8", "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = {(r["env"], r["backend"], r["n"]): r for r in report["rows"]}
    for env in ("trivial", "sleep"):
        for backend in ("sequential", "thread", "process_pool", "auto", "gym_async"):
            row = rows[(env, backend, 8)]
            assert row["error"] is None and row["batch_s"] > 0 and row["steps"] >= 2
    assert rows[("trivial", "auto", 8)]["active_backend"] == "auto->sequential"
    # the floor row (the same envs over bare pipes) on the trivial env only
    floor = rows[("trivial", "bare_pipes", 8)]
    assert floor["error"] is None and floor["batch_s"] > 0 and floor["workers"] == one_per_core(8)
    assert ("sleep", "bare_pipes", 8) not in rows
    # the CPU the pool's processes spent per env-step is measured, not just wall time
    assert rows[("trivial", "sequential", 8)]["cpu_us_per_env_step"] > 0
    assert rows[("trivial", "process_pool", 8)]["cpu_us_per_env_step"] > 0
    assert "CPU of the caller and its workers per env-step" in result.output
    # the machine's speed before and after, to read the absolute µs against
    assert all(v > 0 for v in report["machine"]["python_ns_per_iter"])
    assert "pure-Python speed of this machine" in result.output
    assert report["summary"]["speedup"]["sleep"]["thread"]["8"] > 0
    assert {g["goal"] for g in report["summary"]["goals"]} >= {
        "auto / best backend, worst env and N"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gymnasium AsyncVectorEnv" in result.output
