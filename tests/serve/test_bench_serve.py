"""``turnpool bench serve`` end to end on a tiny load: both servers start as processes, the
same client load runs against each in interleaved windows (A B, then B A), and the table,
JSON report (with per-pair ratios, their median and spread, and the machine's load) and PNG
plot come out; ``--url`` drives a server that is already running."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from turnpool.bench.servers import backend_of, fronts_of, known_server
from turnpool.cli import main
from turnpool.serve import ServeSettings, TurnpoolServer

pytestmark = pytest.mark.timeout(300)


def test_bench_serve_compares_both_servers_interleaved(tmp_path: Path) -> None:
    out, png = tmp_path / "serve.json", tmp_path / "serve.png"
    res = CliRunner().invoke(main, ["bench", "serve", "--sessions", "4", "--hold", "16",
                                    "--seconds", "1", "--warmup", "0.2", "--pairs", "2",
                                    "--json", str(out), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text(encoding="utf-8"))
    rows = report["rows"]
    # interleaved: pair 0 runs openenv then turnpool, pair 1 the other way round
    assert [(r["pair"], r["server"]) for r in rows] == [
        (0, "openenv"), (0, "turnpool"), (1, "turnpool"), (1, "openenv")]
    for row in rows:
        assert row["running"] == 4 and row["errors"] == 0 and row["steps"] > 0
        assert row["p50_ms"] <= row["p99_ms"] and row["rss_mb"] > 0
        assert row["cpu_us_per_step"] > 0
        assert row["load_1m"] >= 0 and 0 <= row["other_busy"] <= 1
    ratios = [r["x_openenv"] for r in rows if r["server"] == "turnpool"]
    level = report["summary"][0]
    assert level["pairs"] == 2 and level["x_openenv_min"] == min(ratios)
    assert level["x_openenv_max"] == max(ratios)
    assert min(ratios) <= level["x_openenv_median"] <= max(ratios)
    assert {k: h["held"] for k, h in report["holds"].items()} == {"openenv": 16, "turnpool": 16}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "x openenv" in res.output and "sessions held" in res.output
    assert len(report["machine"]["python_ns_per_iter"]) == 2
    assert "pure-Python speed of this machine" in res.output


def test_bench_serve_drives_a_running_server_by_url(tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    settings = ServeSettings(env="sokoban", max_sessions=8, backend="sequential")
    with TurnpoolServer(settings) as srv:
        res = CliRunner().invoke(main, ["bench", "serve", "--servers", "turnpool",
                                        "--url", f"turnpool={srv.url}", "--sessions", "3",
                                        "--hold", "0", "--seconds", "0.5", "--warmup", "0.1",
                                        "--pairs", "1", "--json", str(out)])
        assert res.exit_code == 0, res.output
        served = srv.engine.steps_total
    report = json.loads(out.read_text(encoding="utf-8"))
    (row,) = report["rows"]
    assert row["running"] == 3 and row["steps"] > 0 and row["steps"] <= served
    assert row["rss_mb"] is None and row["cpu_us_per_step"] is None  # not ours to measure
    assert report["external"] == ["turnpool"]
    bad = CliRunner().invoke(main, ["bench", "serve", "--url", "nginx=http://127.0.0.1:1"])
    assert bad.exit_code == 2 and "NAME=URL" in bad.output


def test_bench_serve_runs_a_server_of_several_fronts(tmp_path: Path) -> None:
    """A two-front server, loaded by two client processes that start together."""
    out = tmp_path / "serve.json"
    res = CliRunner().invoke(main, ["bench", "serve", "--servers", "openenv,turnpool-f2",
                                    "--sessions", "7", "--hold", "8", "--seconds", "1",
                                    "--warmup", "0.2", "--pairs", "1", "--clients", "2",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text(encoding="utf-8"))
    (ref,) = [r for r in report["rows"] if r["server"] == "openenv"]
    (ours,) = [r for r in report["rows"] if r["server"] == "turnpool-f2"]
    for row in (ref, ours):
        assert row["clients"] == 2 and row["sessions"] == 7 and row["running"] == 7
        assert row["errors"] == 0 and row["steps"] > 0 and row["cpu_us_per_step"] > 0
        assert row["p50_ms"] <= row["p99_ms"] and "quantiles_ms" not in row
    assert ours["x_openenv"] == pytest.approx(ours["steps_per_s"] / ref["steps_per_s"])
    assert report["summary"][0]["turnpool-f2"]["x_openenv_median"] == ours["x_openenv"]
    assert report["holds"]["turnpool-f2"]["held"] == 8 and report["clients"] == 2
    assert "turnpool-f2: 7 sessions x openenv" in res.output
    bad = CliRunner().invoke(main, ["bench", "serve", "--servers", "turnpool-fx"])
    assert bad.exit_code == 2 and "turnpool-f<N>" in bad.output


def test_bench_serve_server_kinds_name_fronts_or_a_backend() -> None:
    """``turnpool-f<N>`` is N fronts on the default backend; ``turnpool-<backend>`` one front
    whose pool runs on that backend; anything else is refused before a server starts."""
    assert (fronts_of("turnpool-f3"), backend_of("turnpool-f3")) == (3, None)
    seq = "turnpool-sequential"
    assert (fronts_of(seq), backend_of(seq)) == (1, "sequential")
    assert backend_of("turnpool-process_pool") == "process_pool"
    assert not any(known_server(k) for k in ("turnpool-ray2", "turnpool-f", "turnpool-"))
    bad = CliRunner().invoke(main, ["bench", "serve", "--servers", "openenv,turnpool-gpu"])
    assert bad.exit_code == 2 and "turnpool-<sequential|thread|process_pool>" in bad.output


def test_bench_serve_loads_with_either_websocket_client(tmp_path: Path) -> None:
    """aiohttp's client by default (not turnpool's), turnpool's own codec on request."""
    settings = ServeSettings(env="sokoban", max_sessions=4, backend="sequential")
    with TurnpoolServer(settings) as srv:
        for client in ("aiohttp", "turnpool"):
            out = tmp_path / f"{client}.json"
            args = ["bench", "serve", "--servers", "turnpool", "--url", f"turnpool={srv.url}",
                    "--sessions", "2", "--hold", "2", "--seconds", "0.3", "--warmup", "0.1",
                    "--pairs", "1", "--json", str(out)]
            res = CliRunner().invoke(main, args + ([] if client == "aiohttp"
                                                   else ["--client", client]))
            assert res.exit_code == 0, res.output
            report = json.loads(out.read_text(encoding="utf-8"))
            (row,) = report["rows"]
            assert report["client"] == client
            assert row["running"] == 2 and row["errors"] == 0 and row["steps"] > 0
            assert report["holds"]["turnpool"]["held"] == 2
    bad = CliRunner().invoke(main, ["bench", "serve", "--client", "websocat"])
    assert bad.exit_code == 2 and "websocat" in bad.output
