"""The edges of gymnasium's vector contract on the pool's ``VectorEnv``, each checked against
gymnasium's own ``SyncVectorEnv`` over the same ids: bad ``reset_mask`` and action batches
raise what gymnasium raises, a closed env says so, ``np_random_seed`` and ``render()`` agree,
render wrappers apply to ``turnpool/...`` ids, and a gymnasium env with a ``Text`` observation
space keeps it in the pool."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.spaces import Discrete, Text
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import turnpool
from turnpool.envs.base import TextEnv
from turnpool.envs.frozen_lake import FrozenLakeEnv
from turnpool.envs.gym_ids import GYM_NAMES, gym_id
from turnpool.pool.vector import PoolVectorEnv

pytestmark = pytest.mark.timeout(240)


def _pair(env_id: str, n: int = 3, **kw: Any) -> tuple[gymnasium.vector.VectorEnv, ...]:
    mode = kw.pop("autoreset_mode", AutoresetMode.NEXT_STEP)
    pool = gymnasium.make_vec(env_id, num_envs=n, backend="sequential", autoreset_mode=mode, **kw)
    sync = gymnasium.make_vec(env_id, num_envs=n, vectorization_mode="sync",
                              vector_kwargs={"autoreset_mode": mode}, **kw)
    return pool, sync


def _raised(call: Callable[[], Any]) -> tuple[type[BaseException], str] | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the point is to compare what is raised
        return type(exc), str(exc)
    return None


BAD_MASKS = [np.array([True]), np.array([[True, True, True]]), np.array([1, 1, 0]),
             np.array([False, False, False]), [True, True, True]]


@pytest.mark.parametrize("mask", BAD_MASKS, ids=repr)
def test_a_bad_reset_mask_raises_what_sync_vector_env_raises(mask: Any) -> None:
    pool, sync = _pair("turnpool/Bandit-v0", autoreset_mode=AutoresetMode.DISABLED)
    for envs in (pool, sync):
        envs.reset(seed=1)
    got = _raised(lambda: pool.reset(options={"reset_mask": mask}))
    assert got is not None and got == _raised(lambda: sync.reset(options={"reset_mask": mask}))
    pool.close()
    sync.close()


def test_a_batch_of_the_wrong_size_or_a_bare_action_raises_as_in_gymnasium() -> None:
    pool, sync = _pair("turnpool/FrozenLake-v0", n=4)
    for envs in (pool, sync):
        envs.reset(seed=2)
    for bad in (np.array([1, 2, 3]), np.array([1, 2, 3, 0, 1]), 0):
        ours = _raised(lambda bad=bad: pool.step(bad))
        theirs = _raised(lambda bad=bad: sync.step(bad))
        assert ours is not None and theirs is not None and ours[0] is theirs[0], (bad, ours)
    assert len(pool.step(np.array([1, 2, 3, 0]))[0]) == 4  # still usable afterwards
    pool.close()
    sync.close()


def test_a_closed_vector_env_raises_closed_environment_error() -> None:
    envs = PoolVectorEnv(2, "bandit", backend="sequential")
    envs.reset(seed=0)
    envs.close()
    envs.close()  # idempotent
    for call in (lambda: envs.reset(seed=0), lambda: envs.step(np.array([1, 1])), envs.render):
        with pytest.raises(gymnasium.error.ClosedEnvironmentError):
            call()


def test_np_random_seed_is_each_env_s_episode_seed_as_in_sync_vector_env() -> None:
    pool, sync = _pair("turnpool/Bandit-v0")
    assert sync.np_random_seed == (-1, -1, -1)  # gymnasium: not known before a reset
    for envs in (pool, sync):
        envs.reset(seed=42)
    assert pool.np_random_seed == sync.np_random_seed == (42, 43, 44)
    for _ in range(2):  # Bandit ends in one step: NEXT_STEP resets the envs on the next
        for envs in (pool, sync):
            envs.step(np.array([1, 2, 1]))
    assert pool.np_random_seed == sync.np_random_seed
    assert pool.np_random_seed != (42, 43, 44)
    pool.close()
    sync.close()


@pytest.mark.parametrize("base", [0, 7])
def test_before_its_first_reset_each_env_reports_the_seed_a_seedless_reset_plays(
        base: int) -> None:
    pool = PoolVectorEnv(3, "sokoban", backend="sequential", seed=base)
    expected = (base, base + 1, base + 2)
    assert pool.np_random_seed == expected  # distinct, and known before any reset
    seedless = pool.reset()[0]
    assert pool.np_random_seed == expected
    sync = SyncVectorEnv([lambda: turnpool.make("sokoban")] * 3)
    assert seedless == sync.reset(seed=base)[0]  # the episodes of exactly those seeds
    pool.close()
    sync.close()


@pytest.mark.parametrize("name", ["Sokoban", "FrozenLake"])
@pytest.mark.parametrize("render_mode", [None, "rgb_array"])
def test_render_draws_what_sync_vector_env_draws(name: str, render_mode: str | None) -> None:
    pool, sync = _pair(f"turnpool/{name}-v0", render_mode=render_mode)
    assert pool.render_mode == sync.render_mode == render_mode
    assert pool.metadata == sync.metadata  # render_fps included: render wrappers read it
    for envs in (pool, sync):
        envs.reset(seed=5)
        envs.step(np.array([1, 2, 3]))
    ours, theirs = pool.render(), sync.render()
    assert ours is not None and len(ours) == 3
    for a, b in zip(ours, theirs, strict=True):
        if render_mode == "rgb_array":
            assert isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.ndim == 3
            np.testing.assert_array_equal(a, b)
        else:
            assert isinstance(a, str) and a == b
    pool.close()
    sync.close()


class _DrawsOnlyItself(TextEnv):
    """Lists ``rgb_array`` but has no ``frame_from_obs``: only the env itself can draw."""

    metadata = {"render_modes": ["text", "rgb_array"]}  # noqa: RUF012

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        return "x"

    def _render_text(self) -> str:
        return "x"


def test_a_render_mode_the_vector_env_cannot_draw_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="render_mode"):
        PoolVectorEnv(2, "sokoban", backend="sequential", render_mode="rgb_array_list")
    with pytest.raises(ValueError, match="frame_from_obs"):
        PoolVectorEnv(2, _DrawsOnlyItself, backend="sequential", render_mode="rgb_array")


def test_frozen_lake_draws_the_same_frame_from_its_text() -> None:
    env = turnpool.make("frozen_lake", size=5)
    obs, _ = env.reset(seed=3)
    for action in [1, 2, 2, 3, 4, 1]:
        np.testing.assert_array_equal(FrozenLakeEnv.frame_from_obs(obs, {}),
                                      env.render("rgb_array"))
        obs, *_ = env.step(action)
    with pytest.raises(ValueError, match="grid"):
        FrozenLakeEnv.frame_from_obs("Player at (0, 0)", {})


def test_render_wrappers_apply_to_turnpool_ids() -> None:
    env = gymnasium.make("turnpool/Sokoban-v0", render_mode="rgb_array_list")
    env.reset(seed=1)
    env.step(1)
    frames = env.render()
    assert isinstance(frames, list) and len(frames) == 2
    assert all(isinstance(f, np.ndarray) and f.ndim == 3 for f in frames)
    # gymnasium's sync vector env passes render_mode=None explicitly: Sokoban takes it
    sync = gymnasium.make_vec("turnpool/Sokoban-v0", num_envs=2, vectorization_mode="sync")
    assert len(sync.reset(seed=0)[0]) == 2
    sync.close()


@pytest.mark.parametrize("name", sorted(GYM_NAMES))
def test_check_env_passes_on_every_built_in_id_without_warnings(name: str) -> None:
    env = gymnasium.make(gym_id(name))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    env.close()
    assert [str(w.message) for w in caught if "socket" not in str(w.message)] == []


class _EchoEnv(gymnasium.Env[str, str]):
    """A gymnasium env whose observations are the text of its last action."""

    def __init__(self) -> None:
        self.observation_space = Text(6, charset="abcdef")
        self.action_space = Text(6, charset="abcdef")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        return "a", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return action, float(len(action)), len(action) == 6, False, {}


def test_a_gymnasium_env_with_a_text_space_keeps_it_in_the_pool() -> None:
    envs = PoolVectorEnv(3, _EchoEnv, backend="sequential")
    sync = SyncVectorEnv([_EchoEnv] * 3)
    assert envs.single_observation_space == sync.single_observation_space == Text(
        6, charset="abcdef")
    assert envs.observation_space == sync.observation_space
    envs.reset(seed=0)
    actions = ("ab", "abcdef", "fed")
    obs, reward, terminated, _, _ = envs.step(actions)
    assert obs == actions and obs in envs.observation_space
    assert list(reward) == [2.0, 6.0, 3.0] and list(terminated) == [False, True, False]
    # an env whose observations are not text is still written as text
    assert turnpool.make("FrozenLake-v1").observation_space != Discrete(16)
    envs.close()
