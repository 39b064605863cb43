"""A trusted program (the caller's own harness) is compiled once by the server and reused:
each run still gets its own text's code, its own globals, and python's errors."""

from __future__ import annotations

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
