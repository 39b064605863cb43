"""turnpool envs are gymnasium citizens, and gymnasium's envs run in an EnvPool.

Built-in envs pass gymnasium's own `check_env` with real spaces; gymnasium's toy-text envs
run in a pool by id and by factory on every backend with identical results.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import gymnasium
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

import turnpool
from tests.ray_cluster import local_ray
from turnpool.envs.base import TextSpace
from turnpool.envs.gym_adapter import GymTextEnv, obs_to_text
from turnpool.envs.registry import registered
from turnpool.envs.synthetic import TrivialEnv
from turnpool.pool import EnvPool

BUILT_IN = [n for n in registered() if n != "faulty"]  # faulty raises on purpose
TOY_TEXT = ["FrozenLake-v1", "Taxi-v3" if "Taxi-v3" in gymnasium.registry else "Taxi-v4",
            "Blackjack-v1",
            "CliffWalking-v1" if "CliffWalking-v1" in gymnasium.registry else "CliffWalking-v0"]
BACKENDS = ["sequential", "thread", "process", "process_pool", "joblib", "ray", "auto"]


@pytest.mark.parametrize("name", BUILT_IN)
def test_check_env_passes_without_warnings(name: str) -> None:
    env = turnpool.make(name)
    assert isinstance(env, gymnasium.Env)
    assert isinstance(env.observation_space, spaces.Text)
    assert isinstance(env.action_space, (spaces.Discrete, spaces.Text))
    assert env.spec is not None and env.spec.id == f"turnpool/{name}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    assert [str(w.message) for w in caught] == []
    env.close()


def test_spaces_follow_the_action_lookup() -> None:
    assert turnpool.make("sokoban").action_space == spaces.Discrete(4, start=1)
    assert turnpool.make("bandit").action_space == spaces.Discrete(2, start=1)
    assert isinstance(turnpool.make("countdown").action_space, TextSpace)
    text = TextSpace(max_length=4)
    assert "ab\nc" in text and "abcde" not in text and b"ab" not in text


def test_seedless_reset_continues_from_the_seeded_generator() -> None:
    a, b = turnpool.make("sokoban"), turnpool.make("sokoban")
    a.reset(seed=5)
    b.reset(seed=5)
    assert a.reset()[0] == b.reset()[0]


def test_obs_to_text_is_a_python_literal() -> None:
    import numpy as np

    assert obs_to_text(np.int64(5)) == "5"
    assert obs_to_text((np.int64(14), 10, 0)) == "(14, 10, 0)"
    assert obs_to_text(np.array([[1, 2], [3, 4]])) == "[[1, 2], [3, 4]]"
    assert obs_to_text({"a": (1,)}) == "{'a': (1,)}"


@pytest.mark.parametrize("gym_id", TOY_TEXT)
def test_toy_text_adapter(gym_id: str) -> None:
    env = turnpool.make(gym_id)
    assert isinstance(env, GymTextEnv)
    obs, info = env.reset(seed=1)
    assert isinstance(obs, str) and obs == info["anchor_obs"]
    _, reward, _, _, info = env.step("not an action")
    assert info["action_is_valid"] is False and reward == 0.0
    _, _, _, _, info = env.step(str(env.action_space.start))  # the id as text works too
    assert info["action_is_valid"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium's own envs warn about their spaces
        check_env(turnpool.make(gym_id))


def frozen_lake_factory(**kwargs: Any) -> gymnasium.Env[Any, Any]:
    """A module-level factory: picklable by reference, so every backend can ship it."""
    return gymnasium.make("FrozenLake-v1", **kwargs)


def _trace(pool: EnvPool, steps: int = 6) -> list[Any]:
    out: list[Any] = [pool.reset()]
    n = pool.num_envs
    for t in range(steps):
        out.append(pool.step([(t + i) % 4 for i in range(n)]))
    return out


ray_local = pytest.fixture(scope="module")(local_ray)


@pytest.fixture(scope="module")
def reference() -> dict[str, list[Any]]:
    traces = {}
    for gym_id in TOY_TEXT:
        with EnvPool(gym_id, env_num=3, group_n=2, seed=7, backend="sequential") as pool:
            traces[gym_id] = _trace(pool)
    return traces


@pytest.mark.parametrize("backend", BACKENDS)
def test_toy_text_by_id_on_every_backend(backend: str, reference: dict[str, list[Any]],
                                         ray_local: None) -> None:
    for gym_id in TOY_TEXT:
        with EnvPool(gym_id, env_num=3, group_n=2, seed=7, backend=backend, num_workers=2,
                     fallback=False) as pool:
            assert pool.tags[0] == gym_id
            assert _trace(pool) == reference[gym_id], (backend, gym_id)


@pytest.mark.parametrize("backend", BACKENDS)
def test_factory_on_every_backend(backend: str, reference: dict[str, list[Any]],
                                  ray_local: None) -> None:
    with EnvPool(frozen_lake_factory, env_num=3, group_n=2, seed=7, backend=backend,
                 num_workers=2, fallback=False) as pool:
        assert pool.tags[0] == "frozen_lake_factory"
        assert _trace(pool) == reference["FrozenLake-v1"]
    for gym_id in TOY_TEXT:  # a partial of gymnasium.make pickles by reference too
        with EnvPool(functools.partial(gymnasium.make, gym_id), env_num=3, group_n=2,
                     seed=7, backend=backend, num_workers=2, fallback=False) as pool:
            assert _trace(pool) == reference[gym_id], (backend, gym_id)


def test_factory_returning_a_text_env_is_used_as_is() -> None:
    with EnvPool(TrivialEnv, env_num=2, seed=3,
                 backend="sequential") as by_factory, \
         EnvPool("trivial", env_num=2, seed=3, backend="sequential") as by_name:
        assert _trace(by_factory) == _trace(by_name)


def test_auto_measures_a_gymnasium_env() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning from the measurement
        with EnvPool("Taxi-v3" if "Taxi-v3" in gymnasium.registry else "Taxi-v4", env_num=2,
                     backend="auto") as pool:
            assert pool.backend.profile is not None  # type: ignore[attr-defined]
            assert pool.backend.profile.steps >= 3  # type: ignore[attr-defined]


def test_unknown_targets_fail_in_the_caller() -> None:
    with pytest.raises(KeyError):
        EnvPool("NoSuchEnv-v9", backend="sequential")
    with pytest.raises(TypeError):
        EnvPool(42, backend="sequential")  # type: ignore[arg-type]
