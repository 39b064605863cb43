"""The README works as written: its Python snippets run as plain scripts, the quick start's
first command runs in a fresh clone, every ``turnpool`` command in it (and in docs/trl.md,
docs/verl.md) parses, the cheap ones run, every file it names exists and every extra it names
is defined.

The snippets are pasted into files and run without an ``if __name__ == "__main__":`` guard,
as a new user would; they must exit cleanly without a traceback (worker processes would re-run
such a script, which turnpool avoids). The clone test copies the committed repository to a
temporary directory and runs the README's first command there (``make run``: it creates a
virtual environment and installs turnpool's core dependencies from the package index).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: the user-facing pages whose commands must run as written
PAGES = {name: (ROOT / name).read_text(encoding="utf-8")
         for name in ("README.md", "docs/trl.md", "docs/verl.md", "docs/reliability.md")}
#: first line of a snippet that talks to a running ``turnpool serve`` (the test starts one)
NEEDS_SERVER = "# needs a running `turnpool serve --env sokoban`"


def _blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.DOTALL)


def _commands(prefix: str) -> list[tuple[str, str]]:
    """(page, command) for every line of a bash block that starts with ``prefix`` (comment
    and line continuation removed) and every table cell that is such a command alone."""
    out = []
    for page, text in PAGES.items():
        for block in _blocks("bash", text):
            for line in block.replace("\\\n", " ").splitlines():
                command = line.split("  #")[0].split(" # ")[0].strip()
                if command.startswith(prefix):
                    out.append((page, command))
        for row in (line for line in text.splitlines() if line.startswith("|")):
            cells = [c.strip() for c in row.strip("|").split("|")]
            out += [(page, c.strip("`")) for c in cells
                    if re.fullmatch(r"`[^`]+`", c) and c.strip("`").startswith(prefix)]
    return out


#: First line of a snippet that is an excerpt of a runnable script (it names the script).
EXCERPT = "# excerpt of examples/"


def _check_excerpt(source: str) -> None:
    """An excerpt parses, its script exists, and every turnpool name it imports exists."""
    import ast
    import importlib

    script = source.splitlines()[0].removeprefix("# excerpt of ").split()[0]
    assert (ROOT / script).is_file(), script
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("turnpool"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module}.{alias.name}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_snippets_run_as_plain_scripts(index: int, tmp_path: Path) -> None:
    source = _blocks("python")[index]
    if source.startswith(EXCERPT):  # an excerpt of a script in examples/: imports must hold
        _check_excerpt(source)
        return
    script = tmp_path / "snippet.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with _server_for(source) as url:
        if url:
            source = source.replace("http://127.0.0.1:8100", url)
        script.write_text(source, encoding="utf-8")
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=240, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr


@contextlib.contextmanager
def _server_for(source: str) -> Iterator[str | None]:
    """A real ``turnpool serve --env sokoban`` on a free port when the snippet needs one."""
    if not source.startswith(NEEDS_SERVER):
        yield None
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "turnpool.cli", "serve", "--env", "sokoban",
                             "--port", "0", "--max-sessions", "2", "--num-workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the server prints its URL once it listens
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert found, line + proc.stdout.read()
        yield found.group(0)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_first_snippet_has_what_the_comments_say(tmp_path: Path) -> None:
    import turnpool

    f = turnpool.create_projection_function("sokoban")
    assert f(["<answer>Up</answer>", "<answer>Up || Left</answer>", "dance"]) == (
        [1, [1, 3], 0], [True, True, False])


def test_the_default_backend_is_the_same_in_code_readme_and_config() -> None:
    import inspect

    from turnpool.pool import EnvPool

    default = inspect.signature(EnvPool.__init__).parameters["backend"].default
    assert default == "auto"
    base = (ROOT / "turnpool" / "configs" / "base.yaml").read_text(encoding="utf-8")
    assert re.search(r"^\s*backend:\s*auto\b", base, re.MULTILINE)
    assert "| `auto` |" in README and "the default" in README.split("| `auto` |")[1][:200]


@pytest.mark.slow(seconds=20)
@pytest.mark.timeout(900)
def test_first_command_runs_in_a_fresh_clone(tmp_path: Path) -> None:
    quick = README.split("## Quick start", 1)[1]
    first = _blocks("bash", quick)[0].splitlines()[0].split("#")[0].strip()
    assert first == "make run"
    clone = tmp_path / "turnpool"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)],
                   check=True, timeout=120)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHON"] = shutil.which("python3") or sys.executable
    proc = subprocess.run(first.split(), cwd=clone, env=env, capture_output=True, text=True,
                          timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "success" in proc.stdout and "env-steps/s" in proc.stdout
    assert (clone / ".venv" / "bin" / "turnpool").exists()


def _parse(args: list[str]) -> None:
    """Parse ``turnpool ARGS`` down to the leaf command without running it."""
    from turnpool.cli import main

    command: click.Command = main
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        ctx = click.Context(command, info_name="turnpool")
        sub = command.get_command(ctx, args[0])
        assert sub is not None, f"no command {args[0]!r}"
        command, args = sub, args[1:]
    try:
        command.make_context("turnpool", list(args), resilient_parsing=False)
    except click.exceptions.Exit as done:  # --version, --help: parsed, and they say so
        assert done.exit_code == 0


@pytest.mark.parametrize(("page", "command"), _commands("turnpool "),
                         ids=[c for _, c in _commands("turnpool ")])
def test_every_turnpool_command_in_the_docs_parses(page: str, command: str) -> None:
    args = shlex.split(command)[1:]
    _parse(args)
    if "--config" in args:
        assert (ROOT / args[args.index("--config") + 1]).is_file(), command


#: commands of the pages cheap enough to run here as written (the others are parsed above,
#: and `make check-install` runs each feature's own)
RUN_AS_WRITTEN = ["turnpool envs", "turnpool --version",
                  "turnpool rollout --policy random --workers 4 --seed 7",
                  "turnpool rollout --env frozen_lake --groups 4 --group-size 8"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", RUN_AS_WRITTEN)
def test_the_cheap_commands_run_as_written(command: str, tmp_path: Path) -> None:
    assert command in [c for _, c in _commands("turnpool ")], command
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "turnpool.cli", *shlex.split(command)[1:]],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_every_file_the_docs_name_exists() -> None:
    pattern = r"(?<![\w/.-])((?:configs|examples|docs|scripts)/[\w./-]+\.(?:yaml|py|md|png|json))"
    named = {(page, m) for page, text in PAGES.items() for m in re.findall(pattern, text)}
    assert any(m == "configs/serve.yaml" for _, m in named)
    missing = sorted((page, m) for page, m in named if not (ROOT / m).exists())
    assert not missing


def test_every_extra_the_docs_name_is_defined() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
                 ["project"]["optional-dependencies"])
    named = {e.strip() for text in PAGES.values()
             for group in re.findall(r"turnpool\[([\w,-]+)\]", text) for e in group.split(",")}
    assert {"serve", "webshop", "ray", "joblib", "openai", "hf", "trl", "verl", "tokens",
            "bench", "all"} <= extras
    assert named and named <= extras, named - extras


def test_no_extra_pins_torch_to_one_version() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"]["optional-dependencies"]
    torch = [d for group in deps.values() for d in group if d.startswith("torch")]
    assert torch and not [d for d in torch if "==" in d], torch


@pytest.mark.parametrize("page", ["docs/trl.md", "docs/verl.md"])
def test_the_integration_pages_excerpts_import_what_exists(page: str) -> None:
    for source in _blocks("python", PAGES[page]):
        assert source.startswith(EXCERPT), source[:80]
        _check_excerpt(source)


def test_user_facing_text_has_no_insider_words() -> None:
    from click.testing import CliRunner

    from turnpool.cli import main

    runner = CliRunner()
    helps = [runner.invoke(main, [*cmd, "--help"]).output
             for cmd in (["rollout"], ["serve"], ["envs"], ["verl-config"], ["webshop", "serve"])]
    for text in [*PAGES.values(), runner.invoke(main, ["--help"]).output, *helps]:
        for word in ("seed 00", "seed-named", "issue goal", "issue 2", "issue 3"):
            assert word not in text.lower(), word
