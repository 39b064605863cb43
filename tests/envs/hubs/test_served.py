"""A library's env served by ``turnpool serve --env <prefix>:<id>`` passes ``openenv
validate`` and plays the episode `turnpool.make` plays."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import turnpool
from tests.serve.conftest import client, openenv_validate

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize(("name", "action"), [("gem:game:Sokoban-v0-easy", "\\boxed{up}"),
                                              ("rg:leg_counting", "12"),
                                              ("skyrl:gsm8k", "#### 5"),
                                              ("verifiers:add-easy", "5")])
def test_turnpool_serve_of_a_library_env_passes_openenv_validate(name: str, action: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "turnpool.cli", "serve", "--env", name,
                             "--max-sessions", "2", "--backend", "process", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server prints its URL (or dies)
        while line and " at http" not in line:  # a library's own log lines come first
            line = proc.stdout.readline()
        assert f"turnpool serve: {name}" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        openenv_validate(url)
        env = turnpool.make(name)
        want_obs, _ = env.reset(seed=4)
        want = env.step(action)
        with client(url) as served:  # OpenEnv's own client
            assert served.reset(seed=4).observation["text"] == want_obs
            step = served.step({"action": action})
        assert (step.observation["text"], step.reward, step.done) == \
            (want[0], want[1], want[2] or want[3])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
