"""Every ``turnpool`` command, walked through click: help on every option, one spelling per
option across commands (``--workers``, ``--json``), ``--backend`` checked everywhere, and
every example of every ``--help`` runs."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from turnpool.backends import BACKENDS
from turnpool.cli import main

pytestmark = pytest.mark.timeout(300)

#: spellings replaced by one name across commands (kept as hidden aliases)
OLD_SPELLINGS = {"--num-workers": "--workers", "--json-out": "--json"}


def _commands() -> Iterator[tuple[str, click.Command]]:
    def walk(prefix: str, cmd: click.Command) -> Iterator[tuple[str, click.Command]]:
        yield prefix, cmd
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, name
                yield from walk(f"{prefix} {name}", sub)
    return walk("turnpool", main)


COMMANDS = dict(_commands())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help_and_one_spelling(name: str) -> None:
    cmd = COMMANDS[name]
    ctx = click.Context(cmd, info_name=name)
    for param in cmd.get_params(ctx):
        if not isinstance(param, click.Option) or param.hidden:
            continue
        assert param.help, f"{name} {param.opts[0]} has no help"
        record = param.get_help_record(ctx)
        assert record is not None
        for old in OLD_SPELLINGS:
            assert old not in record[0], f"{name}: {record[0]} (say {OLD_SPELLINGS[old]})"
        if "--backend" in param.opts:
            assert isinstance(param.type, click.Choice), f"{name} --backend is free text"
            assert set(param.type.choices) <= {*BACKENDS, "auto"}


def _examples() -> list[tuple[str, str]]:
    """(command, example line) for each ``turnpool ...`` line under a help's ``Examples:``."""
    found = []
    for name, cmd in COMMANDS.items():
        text = f"{cmd.help or ''}\n{cmd.epilog or ''}"
        for line in text.split("Examples:", 1)[1].splitlines() if "Examples:" in text else []:
            line = line.split("  #", 1)[0].strip()
            if line.startswith("turnpool "):
                found.append((name, line))
    return found


EXAMPLES = _examples()


def test_the_helps_have_examples() -> None:
    assert {"turnpool", "turnpool rollout", "turnpool replay",
            "turnpool bench pool"} <= {n for n, _ in EXAMPLES}


#: what an example needs to run quickly here: a smaller batch (the example's own options win
#: where they set the same key), or files an earlier example writes
QUICK = ["agent_proxy.max_turn=2", "--groups", "4", "--group-size", "2", "--no-progress"]


@pytest.mark.parametrize(("name", "example"), EXAMPLES)
def test_every_help_example_runs(name: str, example: str, tmp_path: Path) -> None:
    words = shlex.split(example)[1:]
    if words[0] == "rollout":
        words = [words[0], *QUICK, *words[1:]]
    if words[0] == "replay":  # needs the record the rollout example writes
        subprocess.run([sys.executable, "-m", "turnpool.cli", "rollout", *QUICK, "--record",
                        words[1]], cwd=tmp_path, check=True, capture_output=True, timeout=120)
    if words[:2] == ["bench", "pool"]:  # the example's options, then a tiny grid
        words += ["--backends", "sequential,thread", "--envs", "trivial", "--sizes", "8",
                  "--no-gym", "--min-time", "0.01", "--repeats", "1", "--retries", "0"]
    (tmp_path / "configs").symlink_to(Path.cwd() / "configs")  # as from the repository
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    if words[0] == "view":  # the file a rollout writes, then the page until Ctrl-C
        _view_example(words, tmp_path, env)
        return
    proc = subprocess.run([sys.executable, "-m", "turnpool.cli", *words], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240, env=env, check=False)
    assert proc.returncode == 0, f"{example}: {proc.stderr[-2000:]}"


#: what writes each file the view examples show
VIEW_INPUTS = {".jsonl.gz": ["--record"], "tree.jsonl": ["turnpool.collector.tree.mode=best_of_n",
                                                        "--tree-out"], ".jsonl": ["--out"]}


def _view_example(words: list[str], tmp_path: Path, env: dict[str, str]) -> None:
    """Write the example's file with a quick rollout, start the page on a free port, load it,
    and stop it with Ctrl-C (exit 0)."""
    import signal

    import httpx

    target = words[1]
    writes = next(v for k, v in VIEW_INPUTS.items() if target.endswith(k))
    subprocess.run([sys.executable, "-m", "turnpool.cli", "rollout", *QUICK, *writes, target],
                   cwd=tmp_path, check=True, capture_output=True, timeout=120, env=env)
    args = [w for w in words if w not in ("--port", "0")] + ["--port", "0"]
    proc = subprocess.Popen([sys.executable, "-m", "turnpool.cli", *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the ready line, printed once it listens
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        assert httpx.get(url.rstrip("/") + "/api/summary", timeout=30).status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_every_turnpool_command_of_the_makefile_exists() -> None:
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    calls = [shlex.split(line.split("/turnpool ", 1)[1]) for line in makefile.splitlines()
             if "/bin/turnpool " in line]
    assert ["bench", "pool", "--json", "bench-pool.json"] in calls  # make bench
    for words in calls:
        depth = 2 if words[0] == "bench" else 1  # `turnpool bench NAME`, `turnpool rollout`
        name = " ".join(["turnpool", *words[:depth]])
        assert name in COMMANDS, name  # `turnpool bench all` is not one
        COMMANDS[name].make_context(name, words[depth:])  # an unknown option fails here
