"""The README works as written: its Python snippets run as plain scripts, and its first
command runs in a fresh clone.

The snippets are pasted into files and run without an ``if __name__ == "__main__":`` guard,
as a new user would; they must exit cleanly without a traceback (worker processes would re-run
such a script, which turnpool avoids). The clone test copies the committed repository to a
temporary directory and runs the README's first command there (``make run``: it creates a
virtual environment and installs turnpool's core dependencies from the package index).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.DOTALL)


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
    script.write_text(source, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr


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


@pytest.mark.timeout(900)
def test_first_command_runs_in_a_fresh_clone(tmp_path: Path) -> None:
    first = _blocks("bash")[0].splitlines()[0].split("#")[0].strip()
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
