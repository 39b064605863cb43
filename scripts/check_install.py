"""Install turnpool's wheel by feature, one fresh virtual environment per extra, and run each
feature's smoke command (``make check-install``).

    python scripts/check_install.py                 # every feature
    python scripts/check_install.py --only core,serve --work build/check-install

For each extra a venv gets ``pip install 'turnpool-<v>.whl[extra]'`` (pip's cache is reused;
where the extra pulls torch, the CPU build ``TORCH`` goes in first) and runs:

* core: a small rollout works, and each optional feature fails with exit 2 and the one line
  ``Error: ... pip install 'turnpool[extra]'`` naming the extra it needs;
* serve: ``turnpool serve`` answers ``/health`` and ``/metrics``;
* webshop: a WebShop rollout and ``turnpool webshop serve``;
* ray, joblib: a rollout on that backend;
* trl: the TRL integration imports; its venv (torch, transformers) then runs the local token
  server (`turnpool.policies.token_server`) over a tiny model built offline;
* openai: a rollout with the openai policy against that token server.

Prints one line per check and the seconds each venv took; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = os.environ.get("TURNPOOL_TORCH", "torch==2.13.0")
#: a rollout small enough to take seconds: 2 groups of 2 FrozenLake envs, 3 turns
SMALL = ["--no-progress", "es_manager.train.env_groups=2",
         "es_manager.train.env_configs.n_groups=[2]", "es_manager.train.group_size=2",
         "es_manager.train.env_configs.tags=[FrozenLake]", "agent_proxy.max_turn=3"]
#: extra -> does it pull torch
FEATURES = {"core": False, "serve": False, "webshop": False, "ray": False, "joblib": False,
            "trl": True, "openai": False}
#: what a core-only install must refuse, naming the extra: (extra, turnpool arguments)
CORE_REFUSALS: list[tuple[str, list[str]]] = [
    ("serve", ["serve", "--env", "sokoban", "--port", "0"]),
    ("webshop", ["webshop", "serve", "--port", "0"]),
    ("webshop", ["rollout", "--config", str(ROOT / "configs" / "webshop.yaml")]),
    ("openai", ["rollout", "--policy", "openai",
                "turnpool.policy.openai.base_url=http://127.0.0.1:9/v1", *SMALL]),
    ("hf", ["rollout", "--policy", "hf", "turnpool.policy.hf.model_path=.", *SMALL]),
    ("ray", ["rollout", "--backend", "ray", *SMALL]),
    ("joblib", ["rollout", "--backend", "joblib", *SMALL]),
    ("data", ["rollout", "--out", "t.parquet", *SMALL]),
]
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
TIMEOUT = 600


class Check:
    """Collects pass/fail lines."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def __call__(self, ok: bool, what: str, detail: str = "") -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}" + ("" if ok else f"\n{detail[-2000:]}"),
              flush=True)
        if not ok:
            self.failed.append(what)


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **RAY_ENV})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env,
                          **kwargs)  # type: ignore[call-overload]


def build_wheel(work: Path) -> Path:
    dist = work / "dist"
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                str(ROOT)])
    if proc.returncode:
        sys.exit(f"building the wheel failed:\n{proc.stderr[-3000:]}")
    return sorted(dist.glob("turnpool-*.whl"))[-1]


def make_venv(work: Path, extra: str, wheel: Path, torch: bool) -> Path:
    """A fresh venv with the wheel and ``extra`` (torch's CPU build first if it needs it)."""
    venv = work / f"venv-{extra}"
    # no pip inside: this interpreter's pip installs into it (--python), which saves
    # bootstrapping pip once per venv
    proc = run([sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)])
    if proc.returncode:
        sys.exit(f"python -m venv failed:\n{proc.stderr}")
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
           "-q"]
    steps = [[*pip, TORCH]] if torch else []
    steps.append([*pip, f"{wheel}" + ("" if extra == "core" else f"[{extra}]")])
    for step in steps:
        proc = run(step)
        if proc.returncode:
            sys.exit(f"{' '.join(step)} failed:\n{proc.stderr[-3000:]}")
    return venv


def one_error_line(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def check_core(venv: Path, check: Check, work: Path) -> None:
    turnpool = str(venv / "bin" / "turnpool")
    proc = run([turnpool, "rollout", *SMALL], cwd=work)
    check(proc.returncode == 0 and "env-steps/s" in proc.stdout, "core: turnpool rollout",
          proc.stdout + proc.stderr)
    for extra, args in CORE_REFUSALS:
        proc = run([turnpool, *args], cwd=work)
        lines = one_error_line(proc)
        want = f"pip install 'turnpool[{extra}]'"
        ok = (proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error: ")
              and lines[0].endswith(want))
        check(ok, f"core: turnpool {' '.join(args[:3])} -> exit 2, {want}",
              f"exit {proc.returncode}:\n" + proc.stdout + proc.stderr)


def serve_and_probe(cmd: list[str], paths: list[str], cwd: Path) -> tuple[bool, str]:
    """Start a server that prints its URL, GET each path, stop it; (all 200, log)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=cwd, env=env)
    log: list[str] = []
    try:
        url = None
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            log.append(line)
            found = re.search(r"http://127\.0\.0\.1:\d+", line)
            url = found.group(0) if found else None
        if url is None:
            return False, "".join(log)
        for path in paths:
            with urllib.request.urlopen(url + path, timeout=30) as reply:
                body = reply.read().decode("utf-8", "replace")
                log.append(f"GET {path}: {reply.status} {body[:120]!r}\n")
                if reply.status != 200:
                    return False, "".join(log)
        return True, "".join(log)
    except OSError as exc:
        return False, "".join(log) + f"\n{exc}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def check_serve(venv: Path, check: Check, work: Path) -> None:
    ok, log = serve_and_probe([str(venv / "bin" / "turnpool"), "serve", "--env", "sokoban",
                               "--port", "0", "--max-sessions", "4", "--workers", "1"],
                              ["/health", "/metrics"], work)
    check(ok, "serve: turnpool serve answers /health and /metrics", log)


def check_webshop(venv: Path, check: Check, work: Path) -> None:
    turnpool = str(venv / "bin" / "turnpool")
    proc = run([turnpool, "rollout", "--config", str(ROOT / "configs" / "webshop.yaml"),
                "--policy", "random", "--no-progress", "es_manager.train.env_groups=1",
                "es_manager.train.env_configs.n_groups=[1]", "es_manager.train.group_size=2",
                "agent_proxy.max_turn=2"], cwd=work)
    check(proc.returncode == 0 and "env-steps/s" in proc.stdout,
          "webshop: turnpool rollout --config configs/webshop.yaml", proc.stdout + proc.stderr)
    ok, log = serve_and_probe([turnpool, "webshop", "serve", "--port", "0"], ["/"], work)
    check(ok, "webshop: turnpool webshop serve answers /", log)


def backend_check(name: str) -> Callable[[Path, Check, Path], None]:
    def check_backend(venv: Path, check: Check, work: Path) -> None:
        proc = run([str(venv / "bin" / "turnpool"), "rollout", "--backend", name,
                    "--workers", "2", *SMALL], cwd=work)
        check(proc.returncode == 0 and name in proc.stdout,
              f"{name}: turnpool rollout --backend {name}", proc.stdout + proc.stderr)
    return check_backend


TOKEN_SERVER = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
from turnpool.policies.tiny_llm import build_tiny_model
from turnpool.policies.token_server import TokenServer
path = build_tiny_model(sys.argv[1])
with TokenServer(AutoModelForCausalLM.from_pretrained(path),
                 AutoTokenizer.from_pretrained(path)) as server:
    print(server.url, flush=True)
    sys.stdin.read()  # serve until the parent closes stdin
"""


def check_trl(venv: Path, check: Check, work: Path) -> None:
    proc = run([str(venv / "bin" / "python"), "-c",
                "import turnpool.integrations.trl as t; print(t.TurnpoolRollout.__name__)"],
               cwd=work)
    check(proc.returncode == 0, "trl: import turnpool.integrations.trl", proc.stderr)


def check_openai(trl: Path, openai: Path, check: Check, work: Path) -> None:
    """The openai policy (its venv has no torch) against the token server in the trl venv."""
    server = subprocess.Popen([str(trl / "bin" / "python"), "-c", TOKEN_SERVER,
                               str(work / "tiny-model")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1",
                                   "TRANSFORMERS_OFFLINE": "1"})
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            check(False, "openai: the token server starts", server.stderr.read()
                  if server.stderr else "")
            return
        proc = run([str(openai / "bin" / "turnpool"), "rollout", "--policy", "openai",
                    f"turnpool.policy.openai.base_url={url}",
                    "turnpool.policy.openai.max_tokens=24", *SMALL], cwd=work)
        check(proc.returncode == 0 and "env-steps/s" in proc.stdout,
              "openai: turnpool rollout --policy openai against the local token server",
              proc.stdout + proc.stderr)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


CHECKS: dict[str, Callable[[Path, Check, Path], None]] = {
    "core": check_core, "serve": check_serve, "webshop": check_webshop,
    "ray": backend_check("ray"), "joblib": backend_check("joblib"), "trl": check_trl,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(FEATURES),
                        help="comma-separated features (default: all)")
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the wheel and venvs (default: a temporary one)")
    args = parser.parse_args()
    features = [f for f in args.only.split(",") if f]
    unknown = sorted(set(features) - set(FEATURES))
    if unknown:
        parser.error(f"unknown features {unknown}; known: {', '.join(FEATURES)}")
    if "openai" in features and "trl" not in features:
        features.append("trl")  # the token server runs in the trl venv (torch, transformers)
    features.sort(key=list(FEATURES).index)
    with tempfile.TemporaryDirectory(prefix="turnpool-check-install-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        wheel = build_wheel(work)
        print(f"wheel {wheel.name}: {time.monotonic() - started:.0f} s", flush=True)
        check, venvs = Check(), {}
        for feature in features:
            t0 = time.monotonic()
            venvs[feature] = make_venv(work, feature, wheel, FEATURES[feature])
            t1 = time.monotonic()
            if feature in CHECKS:
                CHECKS[feature](venvs[feature], check, work)
            elif feature == "openai":
                check_openai(venvs["trl"], venvs["openai"], check, work)
            print(f"{feature}: install {t1 - t0:.0f} s, checks {time.monotonic() - t1:.0f} s",
                  flush=True)
        print(f"check-install: {len(check.failed)} failed, "
              f"{time.monotonic() - started:.0f} s in all", flush=True)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
