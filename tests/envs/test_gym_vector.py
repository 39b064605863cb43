"""turnpool under gymnasium's own API: ``gymnasium.make("turnpool/...")``, ``make_vec`` giving
a ``VectorEnv`` over the pool step for step equal to gymnasium's ``SyncVectorEnv`` in every
autoreset mode, gymnasium's ``AsyncVectorEnv`` with shared memory over every built-in env, text
spaces that carry every character the envs print, and render modes honoured."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.spaces.utils import flatten, unflatten
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

import turnpool
from turnpool.envs.base import TextSpace, next_episode_seed
from turnpool.envs.gym_ids import GYM_NAMES, gym_id
from turnpool.pool.vector import PoolVectorEnv

pytestmark = pytest.mark.timeout(240)

#: envs with short episodes, so autoresets happen within a few steps
SHORT = ["Bandit", "FrozenLake", "Countdown"]
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def _actions(envs: gymnasium.vector.VectorEnv, step: int) -> Any:
    space = envs.single_action_space
    rng = np.random.default_rng(step)
    if isinstance(space, gymnasium.spaces.Discrete):
        return np.array([space.start + int(rng.integers(space.n)) for _ in range(envs.num_envs)])
    return tuple(str(int(rng.integers(10))) for _ in range(envs.num_envs))


def _play(envs: gymnasium.vector.VectorEnv, steps: int = 12) -> list[Any]:
    out: list[Any] = [envs.reset(seed=3)]
    for t in range(steps):
        out.append(envs.step(_actions(envs, t)))
    envs.close()
    return out


def _same(a: list[Any], b: list[Any]) -> None:
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        assert data_equivalence(x, y), (k, x, y)


def test_import_registers_the_ids_and_module_syntax_imports_turnpool() -> None:
    assert all(gym_id(n) in gymnasium.registry for n in GYM_NAMES)
    env = gymnasium.make("turnpool/Sokoban-v0", dim_room=(6, 6), num_boxes=1)
    obs, _ = env.reset(seed=1)
    assert obs == turnpool.make("sokoban", dim_room=(6, 6), num_boxes=1).reset(seed=1)[0]
    code = ("import gymnasium, sys; env = gymnasium.make('turnpool:turnpool/FrozenLake-v0'); "
            "print(env.reset(seed=2)[0]); print('turnpool' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out[-1] == "True" and "P" in "\n".join(out[:-1])


@pytest.mark.parametrize("name", SHORT)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_make_vec_is_sync_vector_env_step_for_step(name: str, mode: AutoresetMode) -> None:
    env_id = f"turnpool/{name}-v0"
    pool = gymnasium.make_vec(env_id, num_envs=3, backend="sequential", autoreset_mode=mode)
    assert isinstance(pool, PoolVectorEnv) and isinstance(pool, gymnasium.vector.VectorEnv)
    assert pool.metadata["autoreset_mode"] == mode
    sync = gymnasium.make_vec(env_id, num_envs=3, vectorization_mode="sync",
                              vector_kwargs={"autoreset_mode": mode})
    assert pool.single_observation_space == sync.single_observation_space
    assert pool.single_action_space == sync.single_action_space
    assert pool.observation_space == sync.observation_space
    assert pool.action_space == sync.action_space
    ours, theirs = _play(pool), _play(sync)
    ended = sum(int(np.any(s[2] | s[3])) for s in ours[1:])
    assert ended > 0, "no episode ended: autoreset untested"
    _same(ours, theirs)


def test_the_process_backend_gives_the_same_vector_steps() -> None:
    kw = {"num_envs": 4, "autoreset_mode": AutoresetMode.SAME_STEP}
    one = _play(gymnasium.make_vec("turnpool/FrozenLake-v0", backend="sequential", **kw))
    two = _play(gymnasium.make_vec("turnpool/FrozenLake-v0", backend="process", num_workers=2,
                                   **kw))
    _same(one, two)


def test_autoreset_disabled_with_a_reset_mask_is_sync_vector_env() -> None:
    def run(envs: gymnasium.vector.VectorEnv) -> list[Any]:
        out: list[Any] = [envs.reset(seed=[4, 5, 6])[0]]
        for t in range(8):
            step = envs.step(_actions(envs, t))
            out.append(step[:4])
            ended = step[2] | step[3]
            if ended.any():
                out.append(envs.reset(seed=[10 + t, 20 + t, 30 + t],
                                      options={"reset_mask": ended})[0])
        envs.close()
        return out

    mode = AutoresetMode.DISABLED
    ours = run(gymnasium.make_vec("turnpool/Bandit-v0", num_envs=3, backend="sequential",
                                  autoreset_mode=mode))
    theirs = run(gymnasium.make_vec("turnpool/Bandit-v0", num_envs=3,
                                    vectorization_mode="sync",
                                    vector_kwargs={"autoreset_mode": mode}))
    _same(ours, theirs)


def test_seeds_follow_gymnasium_int_and_list_forms() -> None:
    envs = PoolVectorEnv(3, "bandit", backend="sequential")
    envs.reset(seed=7)
    assert envs.pool.env_seeds == [7, 8, 9]
    envs.reset(seed=[1, 5, 2])
    assert envs.pool.env_seeds == [1, 5, 2]
    envs.step(np.array([1, 1, 1]))
    envs.step(np.array([1, 1, 1]))  # NEXT_STEP: the finished episodes reset now
    assert envs.pool.env_seeds == [next_episode_seed(s) for s in (1, 5, 2)]
    with pytest.raises(ValueError, match="num_envs=3"):
        envs.reset(seed=[1, 2])
    envs.close()


@pytest.mark.parametrize("name", sorted(GYM_NAMES))
def test_async_vector_env_with_shared_memory_runs_every_built_in_env(name: str) -> None:
    env_id = gym_id(name)
    fns = [lambda: gymnasium.make(env_id) for _ in range(2)]
    shared = AsyncVectorEnv(fns, shared_memory=True)
    sync = SyncVectorEnv(fns)
    _same(_play(shared, steps=3), _play(sync, steps=3))


def test_text_spaces_carry_every_character_the_envs_print() -> None:
    space = TextSpace(max_length=16)
    for text in ("#√P_", "❌ bad", "é\u4e2d\U0001f600\n"):
        assert text in space
        assert unflatten(space, flatten(space, text)) == text
    sample = space.sample()
    assert sample in space and all(32 <= ord(c) < 127 or c == "\n" for c in sample)


def test_render_mode_rgb_array_draws_an_image() -> None:
    env = gymnasium.make("turnpool/Sokoban-v0", render_mode="rgb_array")
    env.reset(seed=1)
    frame = env.render()
    assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3
    text_env = turnpool.make("sokoban")
    text_env.reset(seed=1)
    assert isinstance(text_env.render(), str)
    with pytest.raises(ValueError, match="render_mode"):
        turnpool.make("countdown", render_mode="rgb_array")


def test_check_env_accepts_an_rgb_array_env_without_warnings() -> None:
    import warnings

    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(turnpool.make("sokoban", render_mode="rgb_array"))
    assert [str(w.message) for w in caught] == []
