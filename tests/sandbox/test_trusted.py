"""A trusted program (the caller's own harness) is compiled once by the server and reused:
each run still gets its own text's code, its own globals, and python's errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox.conftest import FAST
from turnpool.sandbox import Outcome, Sandbox


def _run(box: Sandbox, text: str, stdin: str = "") -> tuple[Outcome, str, str]:
    r = box.run(["python", "harness.py", "arg"], files={"harness.py": text}, stdin=stdin,
                limits=FAST, trusted_program=True)
    return r.outcome, r.stdout, r.stderr


def test_each_text_runs_its_own_code_with_fresh_globals(box: Sandbox) -> None:
    counter = ("import sys\nseen = globals().setdefault('seen', [])\nseen.append(1)\n"
               "print(len(seen), sys.argv, __name__, __file__, input())\n")
    for _ in range(3):  # a second run of the same text sees none of the first's state
        assert _run(box, counter, "x\n") == (
            Outcome.PASSED, "1 ['harness.py', 'arg'] __main__ harness.py x\n", "")
    assert _run(box, "print('other')\n")[1] == "other\n"  # same name, other text
    assert _run(box, counter, "y\n")[1].endswith(" y\n")


def test_errors_of_a_trusted_program_read_as_pythons(box: Sandbox) -> None:
    outcome, _, stderr = _run(box, "def f(:\n")
    assert outcome is Outcome.RUNTIME_ERROR and "SyntaxError" in stderr
    outcome, _, stderr = _run(box, "x = 1\nraise KeyError('k')\n")
    assert outcome is Outcome.RUNTIME_ERROR
    assert 'File "harness.py", line 2, in <module>' in stderr and "KeyError: 'k'" in stderr
    assert _run(box, "import sys\nsys.exit(3)\n")[0] is Outcome.RUNTIME_ERROR


#: programs whose tracebacks the ``traceback`` module words unlike python's own display (the
#: caret under an IndentationError of exec'd text), and the other common shapes
ERRORS = (
    "exec('class S:\\n    def m(self):\\n\\n\\n    def f():\\n        return 1')\n",
    "def f(xs):\n    return xs[0] + xs[1]['k']\nf([1, {}])\n",
    "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise ValueError('v') from e\n",
    "def f(:\n",
)


@pytest.mark.parametrize("trusted", [False, True])
@pytest.mark.parametrize("code", ERRORS)
def test_a_traceback_reads_as_python_file_prints_it(box: Sandbox, tmp_path: Path,
                                                    code: str, trusted: bool) -> None:
    """Byte for byte what ``python main.py`` prints (its absolute path of the file aside)."""
    (tmp_path / "main.py").write_text(code)
    real = subprocess.run([sys.executable, "-I", "main.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=30)
    want = real.stderr.replace(f'"{tmp_path / "main.py"}"', '"main.py"')
    r = box.run(["python", "main.py"], files={"main.py": code}, limits=FAST,
                trusted_program=trusted)
    assert r.outcome is Outcome.RUNTIME_ERROR
    assert r.stderr == want and 'File "main.py"' in want
