"""DeepCoder: write a Python program (or a method of ``class Solution``) that passes the tests.

RAGEN v2's ``deepcoder`` env (taken from rLLM), with its semantics kept: the observation is the
question as RAGEN v2 prepares it (the problem, then ``Starter code:`` and the code where a row
has starter code; a row that already holds a ``question`` is shown as is); the reward of a
reply is ``passed / total`` tests; the episode ends when all pass or after ``max_steps``
attempts (default 1), and a failed attempt shows the problem again with ``Feedback: <detail>``
(``Passed 2/5 tests. Wrong answer on test 2: got 3 expected 4``). The reply is assembled with
the ``starter_code`` as RAGEN does (a reply that defines ``class Solution`` replaces it; a bare
``def`` under a starter class is indented into it). Tests are stdin/stdout (stripped outputs
compared) or function calls (``str(result) == str(expected)``, ``metadata.func_name``); all
tests of a reply run in one process, with one wall clock (3 s) for the whole reply: on timeout
the reward is 0, as in RAGEN.

What differs: the reply runs in `turnpool.sandbox` (no network, no host files, limits) instead
of a bare ``subprocess.run(["python", ...])``, and expected outputs never enter the sandbox
(the host compares), so a reply cannot read the answers; the feedback (``detail``) is cut to a
few KB with a marker (RAGEN passes on all a reply printed, up to megabytes). A missing dataset
is an error, never RAGEN's toy ``add(a, b)`` problem. Rows in the DeepCoder-Preview format
(``problem``, ``tests``, ``metadata``, ``starter_code``; or RAGEN's ``question`` /
``ground_truth``) are read from ``data_path`` / ``dataset_path`` (JSONL / JSON / Parquet, or a
dataset folder read for ``split``, "test" by default, as RAGEN's ``load_dataset``); tests given as
``{"inputs", "outputs"}`` (TACO) become stdin/stdout tests, as in RAGEN's preprocessing.
Without ``data_path``, a bundled set of 240 generated problems is used
(``scripts/gen_deepcoder.py``).

    >>> env = DeepCoderEnv()
    >>> obs, _ = env.reset(seed=0)
    >>> obs[:40]
    'Given a list of integers nums, return ho'
    >>> env.step("   ")[4]["action_is_valid"]  # RAGEN: an empty reply is invalid, no run
    False
"""

from __future__ import annotations

import json
import random
import secrets
import threading
from pathlib import Path
from typing import Any

import turnpool.envs.datasets as datasets
from turnpool.envs.base import TextEnv
from turnpool.sandbox import (
    Limits,
    Outcome,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
    available,
    clip,
)
from turnpool.sandbox.core import UNAVAILABLE

BUNDLED = "deepcoder.jsonl"
PATH_KEYS = ("data_path", "dataset_path")
MAX_CODE_CHARS = 64_000
MAX_RECORD_CHARS = 4_000

#: Runs inside the sandbox: every test of one reply, outputs (never verdicts) on stdout. Its
#: ``eval`` reads a dataset's test input (RAGEN's parsing), inside the sandbox, never on the host.
HARNESS = r'''
import io, json, os, sys
from contextlib import redirect_stderr, redirect_stdout
CASE = json.load(open("case.json"))
CODE, FUNC, MARK = CASE["code"], CASE["func_name"], CASE["mark"]
real = os.fdopen(os.dup(1), "w")
def emit(rec):
    real.write(MARK + json.dumps(rec) + "\n")
    real.flush()
def args_of(raw):
    if isinstance(raw, str):
        try:
            return [eval(p) for p in raw.strip().splitlines() if p.strip()]
        except Exception:
            return [raw]
    return list(raw) if isinstance(raw, (list, tuple)) else [raw]
for i, test in enumerate(CASE["tests"]):
    if test["kind"] == "functional":
        scope = {}
        with io.StringIO() as o, io.StringIO() as e, redirect_stdout(o), redirect_stderr(e):
            exec(CODE, scope, scope)
        if "Solution" in scope and FUNC:
            target = getattr(scope["Solution"](), FUNC)  # the dataset names the method
        elif FUNC and FUNC in scope:
            target = scope[FUNC]
        else:
            emit({"i": i, "ok": False, "err": "Function not found"})
            continue
        try:
            result = target(*args_of(test["input"]))
        except Exception as exc:
            emit({"i": i, "ok": False, "err": repr(exc)})
            continue
        emit({"i": i, "ok": True, "out": str(result)[:1048576]})
    else:
        scope = {"__name__": "__main__"}
        out, err = io.StringIO(), io.StringIO()
        old, sys.stdin = sys.stdin, io.StringIO(str(test["input"]))
        try:
            with redirect_stdout(out), redirect_stderr(err):
                exec(CODE, scope, scope)
            emit({"i": i, "ok": True, "out": out.getvalue()[:1048576]})
        except Exception as exc:
            emit({"i": i, "ok": False, "out": out.getvalue()[:1048576], "err": repr(exc)})
        finally:
            sys.stdin = old
'''


# ------------------------------------------------------------------------------- data
def _tests_of(row: dict[str, Any]) -> list[dict[str, Any]]:
    raw = row.get("ground_truth", row.get("tests", "[]"))
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return []
    if isinstance(raw, dict) and "inputs" in raw and "outputs" in raw:
        raw = [{"input": i, "output": o, "testtype": "stdin_stdout"}
               for i, o in zip(raw["inputs"], raw["outputs"])]
    return [t for t in raw if isinstance(t, dict)] if isinstance(raw, list) else []


def _metadata_of(row: dict[str, Any]) -> dict[str, Any]:
    meta = row.get("metadata", {})
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            return {}
    return meta if isinstance(meta, dict) else {}


def question(problem: str, starter_code: str) -> str:
    """The question RAGEN v2 asks for a raw DeepCoder row (its preparation without rLLM
    installed): the problem, then ``Starter code:`` and the code when the row has some, so a
    function problem names the class and method the tests call."""
    return f"{problem}\n\nStarter code:\n{starter_code}" if starter_code else problem


def _build(rows: list[dict[str, Any]], options: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    problems = []
    for row in rows:
        starter = str(row.get("starter_code") or "")
        if "question" in row or "prompt" in row:  # already a question (RAGEN's prepared rows)
            prompt = str(row.get("question", row.get("prompt")))
        elif "problem" in row:
            prompt = question(str(row["problem"]), starter)
        else:
            continue
        problems.append({"prompt": prompt, "tests": _tests_of(row),
                         "func_name": _metadata_of(row).get("func_name"),
                         "starter_code": starter})
    if not problems:
        raise ValueError("no DeepCoder problems in the data file")
    return tuple(problems)


def load_problems(config: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    path = datasets.resolve_path(config, PATH_KEYS, BUNDLED, split="test")  # v2's default
    key = datasets.table_key("deepcoder", path)
    table: tuple[dict[str, Any], ...] = datasets.get_table(key, _build)
    return table


# ------------------------------------------------------------------------------- scoring
def assemble(code: str, starter_code: str) -> str:
    """RAGEN's rule for joining a reply to the starter code."""
    header, body = (starter_code or "").strip("\n"), (code or "").strip("\n")
    if "class Solution" in body:
        header = ""
    elif "class Solution" in header and body.startswith("def "):
        body = "\n".join(("    " + line) if line.strip() else "" for line in body.splitlines())
    return f"{header}\n\n{body}" if header and body else header or body


def _records(stdout: str, mark: str) -> tuple[dict[int, dict[str, Any]], str]:
    """The harness's records by test index, and what else the reply printed (a reply that
    writes to fd 1 without a newline puts its text before a record, on the record's line)."""
    records: dict[int, dict[str, Any]] = {}
    other = []
    for line in stdout.splitlines(keepends=True):
        head, found, tail = line.partition(mark)
        if not found:
            other.append(line)
            continue
        other.append(head)
        try:
            rec = json.loads(tail)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("i"), int):
            records.setdefault(rec["i"], rec)
    return records, "".join(other)


def judge(tests: list[dict[str, Any]], func_name: str | None, records: dict[int, dict[str, Any]]
          ) -> tuple[bool, str, int, int, bool, list[bool]]:
    """``(is_correct, detail, passed, total, runnable, passed per test)`` from per-test
    outputs, worded as RAGEN words them."""
    passed, runnable, first, oks = 0, True, None, []
    for idx, test in enumerate(tests):
        rec = records[idx]
        expected = test.get("output")
        functional = test.get("testtype") == "functional" and bool(func_name)
        oks.append(False)
        if not rec.get("ok"):
            runnable = False
            what = "Exception" if functional else "Runtime error"
            first = first or f"{what} on test {idx}: {rec.get('err')}"
            continue
        got = str(rec.get("out", ""))
        if not functional:
            got, expected = got.strip(), str(expected).strip()
        if got != str(expected):
            first = first or f"Wrong answer on test {idx}: got {got} expected {expected}"
            continue
        passed += 1
        oks[-1] = True
    total = len(tests)
    if passed == total and total > 0:
        return True, "All tests passed.", passed, total, runnable, oks
    summary = f"Passed {passed}/{total} tests."
    return (False, summary if first is None else f"{summary} {first}", passed, total, runnable,
            oks)


def ragen_stdout_breaks(other: str, verdict: tuple[bool, str, int, int, bool, list[bool]]
                        ) -> str | None:
    """RAGEN's harness prints its result as one JSON line after whatever the reply wrote to
    the real stdout, and reads the last line back: a reply that left a partial line there
    glues it to the JSON, and RAGEN reports ``Sandbox malformed output:`` and all of stdout.
    That text here (the same JSON rebuilt from ``verdict``), or None when RAGEN reads its
    line."""
    correct, detail, passed, total, runnable, oks = verdict
    payload = json.dumps({"is_correct": correct, "detail": detail, "passed_tests": passed,
                          "total_tests": total, "runnable": runnable,
                          "events": [{"idx": i, "ok": ok} for i, ok in enumerate(oks)]},
                         ensure_ascii=False)
    text = (other + payload).strip()
    try:
        json.loads(text.splitlines()[-1])
    except ValueError:
        return f"Sandbox malformed output: {text}"
    return None


def run_reply(box: Sandbox, code: str, problem: dict[str, Any], timeout_s: float = 3.0
              ) -> tuple[bool, str, int, int, bool, Outcome]:
    """Run every test of ``problem`` on ``code`` in one sandboxed process; RAGEN's result
    tuple and the sandbox's `Outcome` of the process. The detail is clipped to a few KB (a
    marker says how much was cut): RAGEN passes on all a reply printed, up to megabytes."""
    correct, detail, passed, total, runnable, outcome = _run_reply(box, code, problem,
                                                                   timeout_s)
    return correct, clip(detail), passed, total, runnable, outcome


def _run_reply(box: Sandbox, code: str, problem: dict[str, Any], timeout_s: float
               ) -> tuple[bool, str, int, int, bool, Outcome]:
    tests = problem["tests"]
    if not tests:
        return False, "No tests available.", 0, 0, False, Outcome.PASSED
    func_name = problem["func_name"]
    mark = f"@{secrets.token_hex(8)}@"
    case = {"code": assemble(code, problem["starter_code"]), "func_name": func_name,
            "mark": mark, "tests": [
                {"kind": "functional" if t.get("testtype") == "functional" and func_name
                 else "stdin", "input": t.get("input", [] if func_name else "")}
                for t in tests]}
    result = box.run(["python", "harness.py"],
                     files={"harness.py": HARNESS, "case.json": json.dumps(case)},
                     limits=Limits(wall=timeout_s, cpu=timeout_s), trusted_program=True)
    if result.outcome is Outcome.SANDBOX_ERROR:  # the sandbox failed, not the reply
        raise SandboxError(f"sandbox failed: {result.error or result.stderr}")
    records, other = _records(result.stdout, mark)
    total = len(tests)
    if result.outcome is Outcome.TIMEOUT:
        return False, "Sandbox runtime error: Timeout", 0, total, False, result.outcome
    if result.outcome is not Outcome.PASSED or len(records) < total:
        if result.outcome is Outcome.PASSED:  # exited 0 before the end (sys.exit in the reply)
            return (False, f"Sandbox malformed output: {other.strip()}", 0, total, False,
                    result.outcome)
        why = result.stderr or other or result.error
        return False, f"Sandbox runtime error: {why}", 0, total, False, result.outcome
    verdict = judge(tests, func_name, records)
    broken = ragen_stdout_breaks(other, verdict) if other else None
    if broken is not None:
        return False, broken, 0, total, False, result.outcome
    return (*verdict[:5], result.outcome)


# ------------------------------------------------------------------------------- sandbox
class _Shared:
    """One sandbox per process, shared by its DeepCoder envs; closed with the last of them."""

    lock = threading.Lock()
    box: Sandbox | None = None
    users = 0

    @classmethod
    def acquire(cls, unsafe: bool) -> Sandbox:
        with cls.lock:
            if cls.box is None:
                cls.box = Sandbox(unsafe=unsafe)
            cls.users += 1
            return cls.box

    @classmethod
    def current(cls) -> Sandbox:
        with cls.lock:
            assert cls.box is not None
            return cls.box

    @classmethod
    def release(cls) -> None:
        with cls.lock:
            cls.users -= 1
            if cls.users <= 0 and cls.box is not None:
                cls.box.close()
                cls.box, cls.users = None, 0


# ------------------------------------------------------------------------------- env
class DeepCoderEnv(TextEnv):
    """RAGEN v2's DeepCoder env over `turnpool.sandbox`."""

    #: every key RAGEN v2's env reports (its metrics average them; ``sandbox_outcome`` is
    #: turnpool's own)
    ragen_info_keys = ("action_is_effective", "action_is_valid", "success", "detail",
                       "passed_tests", "total_tests", "runnable", "pass_reward", "error")
    #: read from ``self.config`` (the data path's alias); any other unnamed key warns
    extra_kwargs = frozenset({"dataset_path", "split"})
    #: RAGEN v2's env_instruction for its DeepCoder tag
    instruction = ("You are solving a coding task. Provide a complete Python function solution "
                   "only. Format: <answer>...</answer>")

    def __init__(self, data_path: str | Path | None = None, max_steps: int = 1,
                 timeout_s: float = 3.0, unsafe_no_sandbox: bool = False,
                 **config: Any) -> None:
        super().__init__(data_path=data_path, max_steps=max_steps, timeout_s=timeout_s,
                         unsafe_no_sandbox=unsafe_no_sandbox, **config)
        self.max_steps = int(max_steps)
        self.timeout_s = float(timeout_s)
        self.unsafe = bool(unsafe_no_sandbox)
        load_problems(self.config)  # a missing file fails here, in one line
        if not self.unsafe:  # refuse at construction, in one line, where nothing isolates
            ok, why = available()
            if not ok:
                raise SandboxUnavailable(UNAVAILABLE.format(why=why))
        self.index = 0
        self.step_num = 0
        self.done = False
        self._text = ""
        self._holds = False  # a share of the process's sandbox (taken at the first reply)

    @property
    def problem(self) -> dict[str, Any]:
        return load_problems(self.config)[self.index]

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        # RAGEN: random.seed(seed) then randint over the split; an own generator here
        self.index = random.Random(seed).randint(0, len(load_problems(self.config)) - 1)
        self.step_num = 0
        self.done = False
        self._text = self.problem["prompt"]
        return self._text

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        prompt = self.problem["prompt"]
        code = action if isinstance(action, str) else ""
        if self.done or not code.strip() or len(code) > MAX_CODE_CHARS:
            error = ("Episode is done" if self.done else "Empty action" if not code.strip()
                     else "Code too long")
            self._text = f"{prompt}\n\nFeedback: {error}"
            # RAGEN v2's step answers "Invalid action." but its manager shows render(), the
            # problem with the feedback: the observation here is that text
            return (self._text, 0.0, self.done, False,
                    {"action_is_valid": False, "action_is_effective": False, "success": False,
                     "error": error})
        if not self._holds:
            _Shared.acquire(self.unsafe)
            self._holds = True
        correct, detail, passed, total, runnable, outcome = run_reply(
            _Shared.current(), code, self.problem, self.timeout_s)
        reward = passed / total if total > 0 else 0.0
        self.step_num += 1
        self.done = correct or self.step_num >= self.max_steps
        self._text = (f"{prompt}\n\nFeedback: {detail}" if not self.done
                      else "Correct!" if correct else "Incorrect.")
        return self._text, reward, self.done, False, {
            "action_is_valid": True, "action_is_effective": correct, "success": correct,
            "detail": detail, "passed_tests": passed, "total_tests": total,
            "runnable": runnable, "pass_reward": reward, "sandbox_outcome": outcome.value}

    def _render_text(self) -> str:
        return self._text

    def get_state(self) -> Any:
        state = super().get_state()
        state.pop("_holds", None)  # a share of the sandbox is this env's, not the episode's
        return state

    def set_state(self, state: Any) -> None:
        holds = self._holds
        super().set_state(state)
        self._holds = holds

    def close(self) -> None:
        if self._holds:
            self._holds = False
            _Shared.release()


# ------------------------------------------------------------------------------- oracle
def _json_args(raw: Any) -> str | None:
    """The harness's arguments of a functional test (`args_of` in `HARNESS`) as JSON, read
    with ``json`` (never ``eval``); None when a line is not JSON."""
    if isinstance(raw, str):
        try:
            args = [json.loads(p) for p in raw.strip().splitlines() if p.strip()]
        except ValueError:
            return None
    else:
        args = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    return json.dumps(args, sort_keys=True)


def answer_key(problem: dict[str, Any]) -> str | None:
    """A program that answers each test with its expected output: the data carries no
    reference solution, so the oracle answers from the tests it knows (an answer key, as
    SearchQA's and MetaMathQA's oracles answer from their tables). ``repr`` writes the data's
    strings as literals; nothing is evaluated here. None when a test's input is not JSON."""
    tests, name = problem["tests"], problem["func_name"]
    if not tests:
        return None
    if not (name and any(t.get("testtype") == "functional" for t in tests)):
        stdin = {str(t.get("input", "")): str(t.get("output", "")) for t in tests}
        return (f"import sys\nANSWERS = {stdin!r}\n"
                "sys.stdout.write(ANSWERS.get(sys.stdin.read(), ''))\n")
    table: dict[str, str] = {}
    for t in tests:
        key = _json_args(t.get("input", []))
        if key is None:
            return None
        table[key] = str(t.get("output", ""))
    if not str(name).isidentifier():
        return None
    lookup = "ANSWERS.get(json.dumps(list(args), sort_keys=True), '')"
    return (f"import json\nANSWERS = {table!r}\nclass Solution:\n"
            f"    def {name}(self, *args):\n        return {lookup}\n"
            f"def {name}(*args):\n    return {lookup}\n")


def oracle(obs: str, env_config: dict[str, Any]) -> list[str]:
    """The answer-key program (`answer_key`) of the problem on the page, else ``[]``. Two
    problems may share a prompt: the first one's key answers."""
    for problem in load_problems(env_config):
        if problem["prompt"] == obs:
            code = answer_key(problem)
            return [] if code is None or len(code) > MAX_CODE_CHARS else [code]
    return []


DeepCoderEnv.oracle = staticmethod(oracle)
