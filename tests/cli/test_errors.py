"""Every user error of the command line is one line that names its fix, with the exit code of
docs/reliability.md, and the same mistake has the same code in every command.

A missing extra is made real by running the CLI in a subprocess whose ``sys.modules`` holds
``None`` for the module (Python then refuses to import it, as it would were it not installed).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from turnpool.cli import main
from turnpool.cli import rollout as rollout_cli
from turnpool.cli.errors import EXIT_USAGE, missing_extra
from turnpool.cli.serve import DEFAULT_PORT

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--no-progress", "es_manager.train.env_groups=2",
         "es_manager.train.env_configs.n_groups=[2]", "es_manager.train.group_size=2",
         "es_manager.train.env_configs.tags=[FrozenLake]", "agent_proxy.max_turn=2",
         "turnpool.backend=sequential"]


def _lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def _one_error(output: str) -> str:
    lines = _lines(output)
    assert len(lines) == 1 and lines[0].startswith("Error: "), output
    assert "Traceback" not in output
    return lines[0]


def _without(modules: list[str], args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``turnpool ARGS`` in a fresh interpreter that cannot import ``modules``."""
    code = (f"import sys\nfor m in {modules!r}:\n    sys.modules[m] = None\n"
            "from turnpool.cli import main\nmain()\n")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=150, cwd=cwd, env=env)


@pytest.mark.parametrize(("modules", "args", "extra"), [
    (["fastapi"], ["serve", "--env", "sokoban", "--port", "0"], "serve"),
    (["fastapi"], ["webshop", "serve", "--port", "0"], "webshop"),
    (["httpx"], ["rollout", "--policy", "openai",
                 "turnpool.policy.openai.base_url=http://127.0.0.1:9/v1", *SMALL], "openai"),
    (["rapidfuzz"], ["rollout", "--config", str(ROOT / "configs" / "webshop.yaml"),
                     "--no-progress"], "webshop"),
    (["torch"], ["rollout", "--policy", "hf", "turnpool.policy.hf.model_path=.", *SMALL],
     "hf"),
    (["pyarrow"], ["rollout", "--out", "t.parquet", *SMALL], "data"),
    (["pyarrow"], ["verl-config", "--env", "sokoban", "--out", "v"], "data"),
    (["tiktoken"], ["bench", "tokens", "--episodes", "1"], "tokens"),
], ids=["serve", "webshop-serve", "openai-policy", "webshop-config", "hf-policy",
        "parquet-out", "verl-config", "bench-tokens"])
def test_a_missing_extra_is_one_line_naming_the_pip_extra_and_exits_2(
        modules: list[str], args: list[str], extra: str, tmp_path: Path) -> None:
    proc = _without(modules, args, tmp_path)
    line = _one_error(proc.stdout + proc.stderr)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert line.endswith(f"needs {modules[0]}: pip install 'turnpool[{extra}]'"), line
    assert line.startswith("Error: turnpool "), line


# These two need the backends to stop falling back from a backend the user named (the
# backends' side of "a named backend is never replaced"); until then they fail here.
@pytest.mark.parametrize("backend", ["ray", "joblib"])
def test_a_named_backend_without_its_package_fails_naming_the_extra(
        backend: str, tmp_path: Path) -> None:
    proc = _without([backend], ["rollout", "--backend", backend, *SMALL[:-1]], tmp_path)
    line = _one_error(proc.stdout + proc.stderr)
    assert proc.returncode == EXIT_USAGE
    assert line.endswith(f"pip install 'turnpool[{backend}]'"), line


def test_a_module_missing_in_a_worker_is_named_by_its_extra() -> None:
    remote = RuntimeError("env 0 could not be built: ModuleNotFoundError: No module named "
                          "'rapidfuzz'")
    found = missing_extra(remote, "rollout")
    assert found is not None and str(found) == (
        "turnpool rollout needs rapidfuzz: pip install 'turnpool[webshop]'")
    assert missing_extra(RuntimeError("No module named 'my_own_pkg'"), "rollout") is None


def test_a_backend_that_cannot_start_is_a_usage_error_not_a_traceback() -> None:
    from turnpool.cli.errors import translate
    from turnpool.worker.errors import BackendUnavailable

    plain = translate(BackendUnavailable("ray_address='x:1' cannot be reached"), "rollout")
    assert plain is not None and plain.exit_code == EXIT_USAGE
    assert plain.message == "ray_address='x:1' cannot be reached"
    missing = translate(BackendUnavailable("ray is not installed: No module named 'ray'"),
                        "rollout")
    assert missing is not None and missing.message == (
        "turnpool rollout needs ray: pip install 'turnpool[ray]'")
    assert translate(RuntimeError("a bug"), "rollout") is None  # bugs keep their traceback


def test_a_misspelt_env_has_the_same_code_and_hint_in_every_command(tmp_path: Path) -> None:
    runner = CliRunner()
    serve = runner.invoke(main, ["serve", "--env", "sokobann", "--port", "0"])
    verl = runner.invoke(main, ["verl-config", "--env", "sokobann", "--out",
                                str(tmp_path / "v")])
    rollout = runner.invoke(main, ["rollout", "--no-progress",
                                   "custom_envs.SimpleSokoban.env_type=sokobann"])
    for res in (serve, verl, rollout):
        line = _one_error(res.output)
        assert res.exit_code == EXIT_USAGE, res.output
        assert "unknown env 'sokobann' (did you mean 'sokoban'?)" in line
        assert '"' not in line and "cpu" not in line.split("registered:")[1].split("(")[0]
    assert "custom_envs.SimpleSokoban.env_type" in _one_error(rollout.output)


@pytest.mark.parametrize(("policy", "key"), [("openai", "base_url"), ("hf", "model_path")])
def test_a_policy_without_its_required_option_says_which_to_set(policy: str, key: str) -> None:
    res = CliRunner().invoke(main, ["rollout", "--policy", policy, *SMALL])
    assert res.exit_code == EXIT_USAGE
    assert f"needs turnpool.policy.{policy}.{key} (e.g." in _one_error(res.output)


def test_a_serve_config_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["serve", "--config", str(tmp_path / "serve.yaml")])
    assert res.exit_code == EXIT_USAGE
    assert "serve.yaml does not exist" in _one_error(res.output)


def test_a_misspelt_serve_setting_says_what_it_probably_meant(tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text("env: sokoban\nmax_sesions: 4\n")
    res = CliRunner().invoke(main, ["serve", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE
    assert "'max_sesions' (did you mean 'max_sessions'?)" in _one_error(res.output)


def test_the_shipped_serve_config_loads() -> None:
    from turnpool.cli.serve import load_settings

    settings = load_settings(ROOT / "configs" / "serve.yaml", {})
    assert settings.env == "sokoban" and settings.max_sessions > 0


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"],
                                  ["--host", "0.0.0.0", "--allow-remote"]])
def test_refusing_a_public_host_is_said_once(args: list[str]) -> None:
    res = CliRunner().invoke(main, ["serve", "--port", "0", *args], env={
        "TURNPOOL_SERVE_TOKEN": ""})
    line = _one_error(res.output)
    assert res.exit_code == EXIT_USAGE
    assert line.count("0.0.0.0") == 1 and line.count("--token") == 1
    assert ("--allow-remote" in line) == ("--allow-remote" not in args)


def test_out_refuses_an_extension_it_does_not_write(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["rollout", *SMALL, "--out", str(tmp_path / "t.csv")])
    assert res.exit_code == EXIT_USAGE
    assert ".jsonl or .parquet" in _one_error(res.output)
    assert not (tmp_path / "t.csv").exists()


def test_out_parquet_writes_parquet_with_one_row_per_trajectory(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")  # the data extra; installed for the tests
    out = tmp_path / "t.parquet"
    res = CliRunner().invoke(main, ["rollout", *SMALL, "--out", str(out)])
    assert res.exit_code == 0, res.output
    table = pq.read_table(out)
    assert table.num_rows == 4 and "env_type" in table.column_names
    assert set(table.column("env_type").to_pylist()) == {"frozen_lake"}


def test_serve_does_not_default_to_the_port_an_openai_server_uses() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    policy_ports = set(re.findall(r"base_url=http://127\.0\.0\.1:(\d+)/v1", readme))
    assert policy_ports and str(DEFAULT_PORT) not in policy_ports
    serve_help = CliRunner().invoke(main, ["serve", "--help"]).output
    assert f"[default: {DEFAULT_PORT}]" in serve_help


def test_test_envs_are_listed_only_with_all() -> None:
    plain = CliRunner().invoke(main, ["envs"])
    every = CliRunner().invoke(main, ["envs", "--all"])
    assert plain.exit_code == 0 and every.exit_code == 0
    for name in ("cpu", "faulty", "sleep", "trivial"):
        assert not re.search(rf"^{name}\s*$", plain.output, re.MULTILINE), name
        assert re.search(rf"^{name}\s*$", every.output, re.MULTILINE), name
    assert re.search(r"^sokoban\s*$", plain.output, re.MULTILINE)


def test_without_a_terminal_progress_is_a_periodic_line(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setattr(rollout_cli, "PROGRESS_EVERY_S", 0.01)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    ticker = rollout_cli._Ticker(batches=1, max_turn=5)
    ticker.state = (0, 2, 96)
    ticker.start()
    try:
        for _ in range(2000):  # bounded: the ticker writes within its first periods
            if "rollout:" in err.getvalue():
                break
            ticker._stop.wait(0.01)
    finally:
        ticker.stop()
    assert "rollout: batch 1/1, 3/5 turns done, 96 envs running" in err.getvalue()


def test_envs_names_the_extra_of_an_env_it_cannot_import(tmp_path: Path) -> None:
    proc = _without(["rapidfuzz"], ["envs"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "ModuleNotFoundError" not in proc.stdout
    assert "unavailable: needs rapidfuzz: pip install 'turnpool[webshop]'" in proc.stdout


def test_bench_envs_names_the_bench_extra_for_gym_sokoban(tmp_path: Path) -> None:
    proc = _without(["gym_sokoban"], ["bench", "envs", "--resets", "1", "--steps", "1",
                                      "--rooms", "1"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "gym_sokoban not installed (pip install 'turnpool[bench]')" in proc.stdout


@pytest.mark.parametrize("args", [["serve", "--env", "sokoban", "--backend", "sequential"],
                                  ["webshop", "serve"]], ids=["serve", "webshop-serve"])
def test_a_taken_port_is_one_line_that_suggests_port_0(args: list[str], tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _without([], [*args, "--port", str(port)], tmp_path)
    line = _one_error(proc.stdout + proc.stderr)
    assert proc.returncode == 1, proc.stderr
    assert line.endswith(f"port {port} is in use; choose another --port, or --port 0 for a "
                         "free one"), line
