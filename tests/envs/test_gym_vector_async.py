"""gymnasium's ``AsyncVectorEnv`` extras on the pool's ``VectorEnv``: ``reset_async`` /
``step_async`` and their waits equal to gymnasium's ``SyncVectorEnv`` step for step, the
pending-call errors and the timeout, ``call`` / ``get_attr`` / ``set_attr`` reaching the envs
in their workers, and a finished env stepped on under ``DISABLED``, on several backends."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode

import turnpool
from turnpool.envs.synthetic import TrivialEnv
from turnpool.pool.vector import PoolVectorEnv

pytestmark = pytest.mark.timeout(240)

BACKENDS = ["sequential", "thread", "process"]


def _split_play(envs: gymnasium.vector.VectorEnv, steps: int) -> list[Any]:
    """A seeded episode run through the async halves (the pool) or the plain calls (sync)."""
    split = isinstance(envs, PoolVectorEnv)
    if split:
        envs.reset_async(seed=11)
        out: list[Any] = [envs.reset_wait(timeout=60)]
    else:
        out = [envs.reset(seed=11)]
    for t in range(steps):
        actions = np.array([1 + (t + k) % 4 for k in range(envs.num_envs)])
        if split:
            envs.step_async(actions)
            out.append(envs.step_wait(timeout=60))
        else:
            out.append(envs.step(actions))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_async_halves_are_sync_vector_env_step_for_step(backend: str) -> None:
    mode = AutoresetMode.SAME_STEP  # a finished env is reset inside step_wait
    ours = gymnasium.make_vec("turnpool/FrozenLake-v0", num_envs=3, backend=backend,
                              num_workers=2, autoreset_mode=mode)
    sync = gymnasium.make_vec("turnpool/FrozenLake-v0", num_envs=3, vectorization_mode="sync",
                              vector_kwargs={"autoreset_mode": mode})
    got, want = _split_play(ours, 10), _split_play(sync, 10)
    assert any("final_obs" in step[4] for step in got[1:]), "no episode ended"
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert data_equivalence(a, b), k
    # set_attr / get_attr / call reach the envs in their workers
    ours.set_attr("note", ["a", "b", "c"])
    assert ours.get_attr("note") == ("a", "b", "c")
    ours.set_attr("note", 7)  # one value for every env, as in gymnasium
    assert ours.get_attr("note") == (7, 7, 7)
    assert ours.call("render", "text") == ours.render()
    with pytest.raises(ValueError, match="Got `2` values for 3 environments"):
        ours.set_attr("note", [1, 2])
    with pytest.raises(AttributeError, match="env 0: gravity"):
        ours.get_attr("gravity")
    ours.close()
    sync.close()


def test_calls_out_of_order_raise_gymnasium_s_errors() -> None:
    envs = PoolVectorEnv(2, "bandit", backend="sequential")
    with pytest.raises(NoAsyncCallError, match="Calling `reset_wait` without any prior "
                                               "call to `reset_async`."):
        envs.reset_wait()
    envs.reset_async(seed=1)
    for call in (lambda: envs.step_async(np.array([1, 1])), lambda: envs.reset(seed=2),
                 lambda: envs.call("render"), lambda: envs.set_attr("x", 1)):
        with pytest.raises(AlreadyPendingCallError, match="pending call to `reset`"):
            call()
    with pytest.raises(NoAsyncCallError, match="prior call to `step_async`"):
        envs.step_wait()
    obs = envs.reset_wait()[0]
    assert obs == envs.reset(seed=1)[0]
    envs.step_async(np.array([1, 2]))
    with pytest.warns(UserWarning, match="Calling `close` while waiting for a pending call "
                                         "to `step` to complete."):
        envs.close()
    with pytest.raises(gymnasium.error.ClosedEnvironmentError):
        envs.step_wait()


_GATE = threading.Event()


class GateEnv(TrivialEnv):
    """Its steps wait for `_GATE` (bounded), so a test decides when they answer."""

    def _work(self) -> None:
        if not _GATE.wait(timeout=60):
            raise RuntimeError("the gate was never opened")


def test_a_wait_that_times_out_leaves_the_call_pending_until_it_answers() -> None:
    _GATE.clear()
    envs = PoolVectorEnv(2, GateEnv, backend="thread", num_workers=2)
    envs.reset(seed=4)
    envs.step_async(np.array(["a", "b"], dtype=object))
    with pytest.raises(multiprocessing.TimeoutError, match="`step_wait` has timed out"):
        envs.step_wait(timeout=0.05)
    with pytest.raises(AlreadyPendingCallError, match="pending call to `step`"):
        envs.step_async(np.array(["a", "b"], dtype=object))
    _GATE.set()
    obs, rewards, *_ = envs.step_wait(timeout=60)
    want = turnpool.make("trivial")
    want.reset(seed=4)
    assert obs[0] == want.step("a")[0]
    envs.close()


def test_under_disabled_a_finished_env_is_stepped_on_as_async_vector_env_does() -> None:
    envs = PoolVectorEnv(2, "bandit", backend="sequential",
                         autoreset_mode=AutoresetMode.DISABLED)
    single = turnpool.make("bandit")
    envs.reset(seed=[3, 8])
    single.reset(seed=3)
    for action in (1, 2):  # Bandit ends in one step: the second steps a finished env
        obs, reward, terminated, _, _ = envs.step(np.array([action, 1]))
        obs1, reward1, terminated1, *_ = single.step(action)
        assert (obs[0], reward[0], terminated[0]) == (obs1, reward1, terminated1)
    assert envs.reset(seed=[3, 8], options={"reset_mask": np.array([True, False])})[0][1] == obs[1]
    envs.close()
