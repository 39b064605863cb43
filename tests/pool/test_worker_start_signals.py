"""A terminal's Ctrl-C reaches the whole process group, pool workers still starting included:
a spawned worker whose interpreter has not yet reached its own SIGINT handling must survive it
(it starts with SIGINT blocked) and then ignore it like every running worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

# Run as a script: `spawn` imports it again as `__mp_main__` in the worker, before the worker's
# own code runs; there it says it is up and waits for the test's "go", so the test's SIGINT
# lands while the worker's interpreter is still starting.
SCRIPT = textwrap.dedent("""
    import os
    import sys
    import time
    from pathlib import Path

    here = Path(os.environ["SIGNAL_DIR"])
    if __name__ == "__mp_main__":
        (here / f"{os.getpid()}.up").write_text("")
        deadline = time.monotonic() + 60
        while not (here / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
    if __name__ == "__main__":
        from turnpool.pool import EnvPool

        with EnvPool("sokoban", env_num=2, group_n=1, seed=3, backend="process",
                     num_workers=1, mp_context="spawn", standby=False) as pool:
            pool.reset()
            worker = next(here.glob("*.up")).stem  # the one worker
            status = Path(f"/proc/{worker}/status").read_text().splitlines()
            masks = {k: int(v, 16) for k, _, v in (line.partition(":\\t") for line in status)
                     if k in ("SigBlk", "SigIgn")}
            print("steps", len(pool.step(["Up", "Left"])[0]), "masks", masks["SigBlk"],
                  masks["SigIgn"], flush=True)
    """)


def test_a_ctrl_c_while_a_worker_starts_is_ignored_by_it(tmp_path: Path) -> None:
    script = tmp_path / "start_signal.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "SIGNAL_DIR": str(tmp_path), "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (ups := list(tmp_path.glob("*.up"))):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.005)
        os.kill(int(ups[0].stem), signal.SIGINT)  # the worker only: the parent is not the test
        (tmp_path / "go").write_text("")
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    assert "KeyboardInterrupt" not in err and "Fatal Python error" not in err, err
    words = out.split()
    assert words[:2] == ["steps", "2"], out
    sigint = 1 << (signal.SIGINT - 1)
    # running, the worker holds SIGINT ignored, no longer blocked
    assert int(words[3]) & sigint == 0 and int(words[4]) & sigint, out
