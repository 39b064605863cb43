"""EnvPool semantics: groups, seeds, layouts, subsets, multi-action turns, async, lifecycle."""

from __future__ import annotations

import sys
import types

import pytest

import turnpool
from turnpool.envs.synthetic import TrivialEnv
from turnpool.pool import EnvError, EnvGroupSpec, EnvPool, TurnResult
from turnpool.pool.api import EnvConstructionError
from turnpool.ragen.container import MultiProcessEnvironmentContainer

pytestmark = pytest.mark.timeout(60)


def _direct_reset(seed: int, **kwargs: object) -> tuple[str, dict]:
    return turnpool.make("trivial", **kwargs).reset(seed=seed)


@pytest.mark.parametrize("backend", ["sequential", "thread"])
@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_groups_share_the_group_seed(backend: str, num_workers: int) -> None:
    with EnvPool("trivial", env_num=3, group_n=4, seed=10, backend=backend,
                 num_workers=num_workers) as pool:
        assert pool.group_ids == [0] * 4 + [1] * 4 + [2] * 4
        obs, infos = pool.reset()
        for i in range(pool.num_envs):
            # Copying the leader's state equals resetting every member with the group seed.
            assert (obs[i], infos[i]) == _direct_reset(10 + i // 4)
        assert len({obs[0], obs[4], obs[8]}) == 3
        infos[0]["mutated"] = True
        assert "mutated" not in infos[1]  # members never alias one info dict


def test_group_members_diverge_with_different_actions() -> None:
    with EnvPool("trivial", env_num=1, group_n=2, seed=0, backend="sequential") as pool:
        pool.reset()
        obs, _, _, _ = pool.step(["a", "bb"])
        assert obs[0] != obs[1]


def test_seedless_reset_advances_an_episode_counter() -> None:
    with EnvPool("trivial", env_num=3, group_n=2, seed=100, backend="sequential") as pool:
        first, _ = pool.reset()
        explicit, _ = pool.reset(seed=777)  # explicit seeds do not move the counter
        second, _ = pool.reset()
        third, _ = pool.reset()
        assert first == pool.reset(seed=100)[0]
        assert second == pool.reset(seed=100 + 3)[0]  # next block of n_groups seeds
        assert third == pool.reset(seed=100 + 6)[0]
        assert explicit[0] == _direct_reset(777)[0] and explicit[2] == _direct_reset(778)[0]
        assert len({first[0], second[0], third[0]}) == 3


def test_from_specs_lays_tags_out_in_order() -> None:
    specs = [EnvGroupSpec("easy", "trivial", 2, {"episode_len": 5}),
             EnvGroupSpec("bandit", "bandit", 1, {}),
             EnvGroupSpec("hard", "trivial", 1, {"episode_len": 9, "obs_len": 20})]
    with EnvPool.from_specs(specs, group_n=2, seed=5, backend="sequential") as pool:
        assert pool.num_envs == 8 and pool.n_groups == 4
        assert pool.tags == ["easy"] * 4 + ["bandit"] * 2 + ["hard"] * 2
        assert pool.env_types == ["trivial"] * 4 + ["bandit"] * 2 + ["trivial"] * 2
        assert pool.group_ids == [0, 0, 1, 1, 2, 2, 3, 3]
        obs, _ = pool.reset()
        assert obs[7] == _direct_reset(5 + 3, obs_len=20)[0]  # group ids run on across tags
        assert len(obs[7]) == 20 and len(obs[0]) == 96
        results = pool.step_turns([["x"] * 6] * 4, env_ids=[0, 1, 6, 7])
        assert [r.n_executed for r in results] == [5, 5, 6, 6]  # episode_len per tag


def test_step_subset_is_aligned_to_env_ids() -> None:
    with EnvPool("trivial", env_num=4, group_n=1, seed=3, backend="sequential",
                 num_workers=2) as pool, \
            EnvPool("trivial", env_num=4, group_n=1, seed=3, backend="sequential") as ref:
        pool.reset()
        ref.reset()
        obs, rewards, dones, infos = pool.step(["a", "bbb"], env_ids=[3, 0])
        ref_obs, ref_rewards, _, _ = ref.step(["bbb", "x", "x", "a"])
        assert obs == [ref_obs[3], ref_obs[0]] and rewards == [ref_rewards[3], ref_rewards[0]]
        assert [i["t"] for i in infos] == [1, 1]
        untouched = pool.step(["q"], env_ids=[1])[3][0]
        assert untouched["t"] == 1  # env 1 was not stepped by the subset call
        with pytest.raises(ValueError):
            pool.step(["a"], env_ids=[0, 1])
        with pytest.raises(IndexError):
            pool.step(["a"], env_ids=[9])


def test_step_turns_stop_at_the_first_done_and_sum_rewards() -> None:
    env = TrivialEnv(episode_len=3)
    env.reset(seed=8)
    expected = sum(env.step(a)[1] for a in ["a", "bb", "c"])
    with EnvPool("trivial", env_num=1, group_n=2, seed=8, env_kwargs={"episode_len": 3},
                 backend="thread", num_workers=2) as pool:
        pool.reset()
        r0, r1 = pool.step_turns([["a", "bb", "c", "d", "e"], []])
        assert isinstance(r0, TurnResult)
        assert r0.n_executed == 3 and r0.truncated and r0.done and not r0.terminated
        assert r0.reward_sum == expected and r0.error is None
        assert r0.info["truncated"] is True and r0.info["terminated"] is False
        assert r1.n_executed == 0 and r1.reward_sum == 0.0 and not r1.done  # empty turn
        _, _, dones, infos = pool.step(["x", "y"])
        assert dones == [True, False] and infos[1]["t"] == 1


def test_async_steps_equal_sync_steps_and_guard_in_flight_envs() -> None:
    kwargs = {"env_num": 3, "group_n": 2, "seed": 4, "num_workers": 3}
    with EnvPool("trivial", backend="thread", **kwargs) as pool, \
            EnvPool("trivial", backend="sequential", **kwargs) as ref:
        pool.reset()
        ref.reset()
        ticket = pool.step_async([5, 0, 2], [["a"], ["b", "c"], ["d"]])
        assert ticket == 1 and pool.in_flight == {0, 2, 5}
        with pytest.raises(RuntimeError, match="in flight"):
            pool.step(["z"], env_ids=[0])
        got: dict[int, TurnResult] = {}
        while len(got) < 3:
            for env_id, result in pool.poll(timeout=10.0, min_ready=1):
                got[env_id] = result
        assert pool.in_flight == frozenset()
        want = ref.step_turns([["a"], ["b", "c"], ["d"]], env_ids=[5, 0, 2])
        assert [got[5], got[0], got[2]] == want
        assert pool.poll(timeout=0.0) == []


def test_on_error_raise_reports_the_env_and_the_pool_recovers() -> None:
    with EnvPool("faulty", env_num=2, group_n=1, seed=0, backend="sequential",
                 on_error="raise") as pool:
        pool.reset()
        with pytest.raises(EnvError) as err:
            pool.step(["ok", "raise"])
        assert list(err.value.errors) == [1] and "RuntimeError" in err.value.errors[1]
        with pytest.raises(EnvError):  # still failed until reset
            pool.step(["ok", "ok"])
        obs, infos = pool.reset()
        assert all("error" not in i for i in infos)
        pool.step(["ok", "ok"])


def test_flagged_env_stays_failed_until_reset() -> None:
    with EnvPool("faulty", env_num=1, group_n=3, seed=0, backend="sequential") as pool:
        pool.reset()
        _, rewards, dones, infos = pool.step(["a", "raise", "b"])
        assert dones == [False, True, False] and rewards[1] == 0.0
        assert infos[1]["error"].startswith("RuntimeError") and infos[1]["success"] is False
        _, _, dones, infos = pool.step(["a", "a", "a"])
        assert dones[1] and "reset it" in infos[1]["error"] and "error" not in infos[0]
        obs, infos = pool.reset(env_ids=[1])
        assert "error" not in infos[0]
        assert "error" not in pool.step(["a"], env_ids=[1])[3][0]


_GHOST = "turnpool_test_ghost_env"


@pytest.fixture()
def ghost_env() -> object:
    """An env class that exists only in this process (as a notebook-defined env would)."""
    module = types.ModuleType(_GHOST)

    class GhostEnv(TrivialEnv):
        pass

    GhostEnv.__module__ = _GHOST
    module.GhostEnv = GhostEnv  # type: ignore[attr-defined]
    sys.modules[_GHOST] = module
    yield GhostEnv
    del sys.modules[_GHOST]


@pytest.mark.usefixtures("ghost_env")
@pytest.mark.parametrize("backend", ["process", "process_pool", "joblib"])
def test_an_env_that_workers_cannot_import_fails_the_constructor(backend: str) -> None:
    """No silent fallback: the envs are broken, not the backend, so the pool says which."""
    with pytest.raises(EnvConstructionError, match="No module named") as info:
        EnvPool(f"{_GHOST}:GhostEnv", env_num=2, group_n=1, seed=1, backend=backend,
                num_workers=2, tag="ghosts")
    assert "tag 'ghosts'" in str(info.value) and "GhostEnv" in str(info.value)


def test_bad_arguments_fail_fast() -> None:
    with pytest.raises(KeyError):
        EnvPool("no_such_env", backend="sequential")
    with pytest.raises(ValueError):
        EnvPool("trivial", backend="no_such_backend")
    with pytest.raises(ValueError):
        EnvPool("trivial", backend="process", mp_context="teleport")
    with pytest.raises(ValueError):
        EnvPool("trivial", backend="sequential", on_error="ignore")


def test_close_is_idempotent_and_final() -> None:
    pool = EnvPool("trivial", env_num=2, group_n=1, backend="thread")
    pool.reset()
    pool.close()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.reset()


def test_multiprocess_container_keeps_seed_000_shapes() -> None:
    container = MultiProcessEnvironmentContainer(
        env_type="trivial", env_num=2, group_n=3, seed=42, env_kwargs={"episode_len": 4},
        num_workers=2)
    try:
        assert container.pool.backend_name == "process"
        obs_list, info_list = container.reset()
        assert len(obs_list) == len(info_list) == 6
        assert obs_list[0] == obs_list[2] != obs_list[3]
        obs_list, rewards, dones, infos = container.step(["a"] * 6)
        assert len(obs_list) == len(rewards) == len(dones) == len(infos) == 6
        assert all(isinstance(r, float) for r in rewards) and dones == [False] * 6
    finally:
        container.close()
        container.close()


def test_a_slow_step_that_finished_is_not_a_timeout() -> None:
    """The deadline is per env: two envs of one worker that each finish within it are not
    timed out although the request as a whole took longer (the reply is ready when the
    deadline is checked, and it wins)."""
    with EnvPool("sleep", env_num=1, group_n=2, seed=0, backend="sequential",
                 env_kwargs={"sleep_ms": 1000.0}, step_timeout=2.5) as pool:
        pool.reset()
        _, _, dones, infos = pool.step(["a", "b"])
        assert dones == [False, False] and "error" not in infos[0] and "error" not in infos[1]


def test_thread_backend_abandons_a_hung_thread() -> None:
    with EnvPool("faulty", env_num=2, group_n=2, seed=0, backend="thread", num_workers=2,
                 step_timeout=0.5) as pool, \
            EnvPool("faulty", env_num=2, group_n=2, seed=0, backend="sequential") as ref:
        pool.reset()
        ref.reset()
        pool.step(["a"] * 4)
        ref.step(["a"] * 4)
        _, _, dones, infos = pool.step(["b", "hang", "c", "d"])
        want = ref.step(["b", "x", "c", "d"])
        assert "step timeout" in infos[1]["error"] and dones[1]
        assert [infos[k] for k in (0, 2, 3)] == [want[3][k] for k in (0, 2, 3)]
        obs, _ = pool.reset(seed=9)
        assert obs == ref.reset(seed=9)[0]
