"""Same seeds + same actions -> identical results on every backend, worker count and start
method, for every env type (one mixed pool per configuration, 24 envs in 4 groups per type)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from turnpool.backends import ALL_BACKENDS, BackendUnavailable, get_backend
from turnpool.envs.webshop import oracle
from turnpool.pool import EnvGroupSpec, EnvPool
from turnpool.webshop.server import ShopServer

pytestmark = pytest.mark.timeout(240)

N_GROUPS, GROUP_N, TURNS = 4, 6, 20
START_METHODS = ("spawn", "forkserver", "fork")

#: env type -> (cheap kwargs, action vocabulary incl. invalid ones)
ENVS: dict[str, tuple[dict[str, Any], list[Any]]] = {
    "trivial": ({"episode_len": 7}, ["a", "bb", "ccc"]),
    "cpu": ({"work_iters": 200, "episode_len": 9}, ["a", "bb"]),
    "sleep": ({"sleep_ms": 0.0, "episode_len": 5}, ["x", "yy"]),
    "bandit": ({}, ["phoenix", "dragon", "Dragon", 1, 2, "tiger"]),
    "frozen_lake": ({}, ["Left", "Down", "Right", "Up", 1, 3, "jump"]),
    "countdown": ({}, ["1+2", "37+64-19", "(3*4)-5", "10/0", "junk"]),
    "metamathqa": ({}, ["9", "10", "The answer is: 9", "x"]),
    "sokoban": ({"dim_room": (6, 6), "num_boxes": 1, "max_steps": 8},
                ["Up", "Down", "Left", "Right", 1, 4, "push"]),
    "webshop": ({"max_steps": 6}, ["search[red cotton shirt]", "click[buy now]",
                                   "click[back to search]", "click[next >]"]),
}


def _configs() -> list[tuple[str, int, str | None]]:
    out = []
    for backend in ALL_BACKENDS:
        try:
            methods = get_backend(backend).start_methods or (None,)
        except BackendUnavailable:  # collected anyway: the test itself then fails loudly
            methods = (None,)
        for workers in (1, 2, 3):
            for method in methods:
                if method is None or method in START_METHODS:
                    out.append((backend, workers, method))
    return out


@pytest.fixture(scope="module")
def shop_url() -> Iterator[str]:
    with ShopServer() as server:
        yield server.url


def _strip(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if "time" not in k}


def _actions(rng: np.random.Generator, env_type: str, obs: str) -> list[Any]:
    vocab = ENVS[env_type][1]
    n = int(rng.integers(1, 4))
    if env_type == "webshop":  # each action is an HTTP round trip; keep the test quick
        n = 1
    acts: list[Any] = []
    for _ in range(n):
        if env_type == "webshop" and rng.random() < 0.7:
            acts.append((oracle(obs) or ["click[buy now]"])[0])
        else:
            acts.append(vocab[int(rng.integers(0, len(vocab)))])
    return acts


def _run(pool: EnvPool) -> list[Any]:
    """A 20-turn trace: multi-action turns for live envs, seedless resets of finished ones."""
    trace: list[Any] = []
    obs, infos = pool.reset()
    trace.append(("reset", obs, [_strip(i) for i in infos]))
    done = [False] * pool.num_envs
    for turn in range(TURNS):
        rng = np.random.default_rng(turn)
        finished = [i for i in range(pool.num_envs) if done[i]]
        if finished:
            new_obs, new_infos = pool.reset(env_ids=finished)
            trace.append(("reset", finished, new_obs, [_strip(i) for i in new_infos]))
            for i, o in zip(finished, new_obs):
                obs[i], done[i] = o, False
        live = [i for i in range(pool.num_envs) if not done[i]]
        plans = [_actions(rng, pool.env_types[i], obs[i]) for i in live]
        results = pool.step_turns(plans, live)
        for i, r in zip(live, results):
            obs[i], done[i] = r.obs, r.done
            trace.append((turn, i, pool.env_types[i], r.obs, r.reward_sum, r.terminated,
                          r.truncated, _strip(r.info), r.n_executed, r.error))
    return trace


def _pool(shop_url: str, **kwargs: Any) -> EnvPool:
    specs = []
    for name, (env_kwargs, _) in ENVS.items():
        kw = dict(env_kwargs, server_url=shop_url) if name == "webshop" else env_kwargs
        specs.append(EnvGroupSpec(name, name, N_GROUPS, kw))
    return EnvPool.from_specs(specs, group_n=GROUP_N, seed=2024, step_timeout=60.0,
                              fallback=False, **kwargs)


@pytest.fixture(scope="module")
def reference(shop_url: str) -> list[Any]:
    with _pool(shop_url, backend="sequential", num_workers=1) as pool:
        trace = _run(pool)
    errors = [t for t in trace if t[0] != "reset" and t[-1] is not None]
    assert not errors, errors[:3]  # the reference itself must be clean
    assert len({t[2] for t in trace if t[0] != "reset"}) == len(ENVS)
    return trace


@pytest.mark.parametrize(("backend", "num_workers", "mp_context"), _configs())
def test_every_backend_gives_identical_results(reference: list[Any], shop_url: str,
                                               backend: str, num_workers: int,
                                               mp_context: str | None) -> None:
    extra = {"mp_context": mp_context} if mp_context else {}
    with _pool(shop_url, backend=backend, num_workers=num_workers, **extra) as pool:
        if backend != "auto":  # auto reports the backend it picked
            assert pool.backend_name == backend and pool.num_workers == num_workers
        trace = _run(pool)
    assert len(trace) == len(reference)
    for got, want in zip(trace, reference):
        assert got == want, f"first difference: {got!r} != {want!r}"
