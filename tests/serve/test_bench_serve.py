"""``turnpool bench serve`` end to end on a tiny load: both servers start as processes, the
same client load runs against each, and the table, JSON report and PNG plot come out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from turnpool.cli import main

pytestmark = pytest.mark.timeout(300)


def test_bench_serve_compares_both_servers(tmp_path: Path) -> None:
    out, png = tmp_path / "serve.json", tmp_path / "serve.png"
    res = CliRunner().invoke(main, ["bench", "serve", "--sessions", "4", "--hold", "16",
                                    "--seconds", "1", "--warmup", "0.2", "--json", str(out),
                                    "--plot", str(png)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text(encoding="utf-8"))
    assert {r["server"] for r in report["rows"]} == {"openenv", "turnpool"}
    for row in report["rows"]:
        assert row["running"] == 4 and row["errors"] == 0 and row["steps"] > 0
        assert row["p50_ms"] <= row["p99_ms"] and row["rss_mb"] > 0
        assert row["cpu_us_per_step"] > 0
    turnpool_row = next(r for r in report["rows"] if r["server"] == "turnpool")
    assert turnpool_row["x_openenv"] > 0
    assert {k: h["held"] for k, h in report["holds"].items()} == {"openenv": 16, "turnpool": 16}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "x openenv" in res.output and "sessions held" in res.output
