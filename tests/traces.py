"""Traces shared by the pool and backend tests: the same calls on two pools must give the same
trace, whatever the backend (``mixed_pool`` + ``run_trace`` over every env type; ``short_trace``
for one-type pools)."""

from __future__ import annotations

from typing import Any

import numpy as np

from turnpool.envs.webshop import oracle
from turnpool.pool import EnvGroupSpec, EnvPool

N_GROUPS, GROUP_N, TURNS = 4, 6, 20

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
    "webshop": ({"split": "val"}, ["search[red cotton shirt]", "click[next >]", "click[< prev]",
                                   "click[back to search]", "search[dress]", "click[b0]"]),
    "webshop_lite": ({"max_steps": 6}, ["search[red cotton shirt]", "click[buy now]",
                                   "click[back to search]", "click[next >]"]),
}


def _strip(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if "time" not in k}


def _actions(rng: np.random.Generator, env_type: str, obs: str) -> list[Any]:
    vocab = ENVS[env_type][1]
    n = int(rng.integers(1, 4))
    if env_type == "webshop_lite":  # each action is an HTTP round trip; keep the test quick
        n = 1
    acts: list[Any] = []
    for _ in range(n):
        if env_type == "webshop_lite" and rng.random() < 0.7:
            acts.append((oracle(obs) or ["click[buy now]"])[0])
        else:
            acts.append(vocab[int(rng.integers(0, len(vocab)))])
    return acts


def run_trace(pool: EnvPool) -> list[Any]:
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


def mixed_pool(shop_url: str, **kwargs: Any) -> EnvPool:
    specs = []
    for name, (env_kwargs, _) in ENVS.items():
        kw = dict(env_kwargs, server_url=shop_url) if name == "webshop_lite" else env_kwargs
        specs.append(EnvGroupSpec(name, name, N_GROUPS, kw))
    return EnvPool.from_specs(specs, group_n=GROUP_N, seed=2024, step_timeout=60.0,
                              fallback=False, **kwargs)


def short_trace(pool: EnvPool, turns: int = 4) -> list[Any]:
    """Reset, a few multi-action turns, a seedless reset."""
    out: list[Any] = [pool.reset(seed=11)]
    for t in range(turns):
        out.append(pool.step_turns([[f"a{t}", "b"][: 1 + (i + t) % 2]
                                    for i in range(pool.num_envs)]))
    out.append(pool.reset())
    return out
