"""The benchmark's floor row (`turnpool.bench.pool_floor.BarePipes`) does the pool's work:
the same envs, answers and lists, so comparing the two rows compares only the machinery."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.faults import GONE_S, gone, wait_gone
from turnpool.bench.pool_floor import BarePipes
from turnpool.pool import EnvPool

pytestmark = pytest.mark.timeout(60)


def test_bare_pipes_steps_the_envs_as_the_pool_does() -> None:
    kwargs = {"episode_len": 3}
    floor = BarePipes("trivial", kwargs, num_envs=5, num_workers=2)
    pids = [p.pid for p in floor._procs]
    try:
        assert floor.num_workers == 2
        with EnvPool("trivial", env_num=5, group_n=1, seed=0, env_kwargs=kwargs,
                     backend="sequential") as pool:
            assert floor.reset() == pool.reset()[0]
            for turn in range(3):
                actions = [1 + (turn + i) % 4 for i in range(5)]
                mine, theirs = floor.step(actions), pool.step(actions)
                assert mine[:3] == theirs[:3]
                assert mine[2] == [turn == 2] * 5  # the episodes end on their third step
                # the pool adds its own keys; every key the env wrote is the same
                assert all(set(m) <= set(t) and all(t[k] == v for k, v in m.items())
                           for m, t in zip(mine[3], theirs[3]))
    finally:
        floor.close()
        floor.close()  # idempotent
    for pid in pids:  # no worker left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_bare_pipes_workers_go_when_their_parent_is_killed() -> None:
    # a forked worker holds its own pipe's write end, so no EOF comes: it must die with its
    # owner on its own (no orphans)
    script = ("from turnpool.bench.pool_floor import BarePipes\n"
              "f = BarePipes('trivial', {}, num_envs=6, num_workers=3)\n"
              "f.reset()\n"
              "print(' '.join(str(p.pid) for p in f._procs), flush=True)\n"
              "input()\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3 and not any(gone(p) for p in pids)
    finally:
        parent.kill()
        parent.wait(GONE_S)
    assert wait_gone(pids, GONE_S) == []
