"""Traces shared by the pool and backend tests: the same calls on two pools must give the same
trace, whatever the backend (``mixed_pool`` + ``run_trace`` over every env type; ``short_trace``
for one-type pools; ``calls_trace`` for calls into the envs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from turnpool.envs.synthetic import FaultyEnv
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


#: Branching traces (`branch_trace`) cover the envs `ENVS` leaves out, too.
BRANCH_ENVS: dict[str, tuple[dict[str, Any], list[Any]]] = {
    **{k: v for k, v in ENVS.items() if k not in ("cpu", "sleep")},
    "sudoku": ({}, ["1,1,1", "place 2 at row 1 col 2", "3,3,4", "2,4,1", "junk"]),
    "game_2048": ({}, ["Up", "Right", "Down", "Left", 0, "jump"]),
    "rubikscube": ({}, ["U", "U'", "R", "F'", "B", 3, "spin"]),
    "search": ({"mock_mode": True}, ["search[capital of France]", "finish[Paris]",
                                     "finish[no]", "look"]),
    "deepcoder": ({}, ["print(1)", "print(input())", "  ", "import sys\nprint(-1)"]),
    "FrozenLake-v1": ({}, ["0", "1", "2", "3"]),  # gymnasium's: branched by replay
}
BRANCH_GROUP_N = 4


def branch_pool(shop_url: str, **kwargs: Any) -> EnvPool:
    """One group of `BRANCH_GROUP_N` envs per `BRANCH_ENVS` type, adjacent."""
    specs = []
    for name, (env_kwargs, _) in BRANCH_ENVS.items():
        kw = dict(env_kwargs, server_url=shop_url) if name == "webshop_lite" else env_kwargs
        specs.append(EnvGroupSpec(name, name, 1, kw))
    return EnvPool.from_specs(specs, group_n=BRANCH_GROUP_N, seed=77, step_timeout=60.0,
                              fallback=False, **kwargs)


def _branch_actions(rng: np.random.Generator, env_type: str) -> list[Any]:
    vocab = BRANCH_ENVS[env_type][1]
    return [vocab[int(rng.integers(len(vocab)))] for _ in range(int(rng.integers(1, 3)))]


def branch_trace(pool: EnvPool, trials: int = 3) -> list[Any]:
    """Random episodes branched at random points (`branch_pool`): each trial resets, plays
    ``trial % 3`` random turns on every env, then per env type forks member 0 into members 1 and 2
    and restores a pickled snapshot of it into member 3; the four then play the same random
    turns, and must answer alike, as text, every turn (asserted here). Returns the source
    members' continuations, to compare across backends."""
    import pickle

    trace: list[Any] = []
    types = pool.env_types
    firsts = list(range(0, pool.num_envs, BRANCH_GROUP_N))
    for trial in range(trials):
        rng = np.random.default_rng([trial, 5])
        obs, _ = pool.reset(seed=100 + trial)
        done = [False] * pool.num_envs
        for _ in range(trial % 3):  # the reset state, then mid-episode
            live = [i for i in range(pool.num_envs) if not done[i]]
            results = pool.step_turns([_branch_actions(rng, types[i]) for i in live], live)
            for i, r in zip(live, results):
                done[i] = r.done
        sources = [i for i in firsts if not done[i]]
        for src in sources:
            pool.fork(src, [src + 1, src + 2])
        snaps = pool.snapshot(sources)
        pool.restore([s + 3 for s in sources], [pickle.loads(pickle.dumps(s)) for s in snaps])
        live = list(sources)
        for turn in range(5):
            if not live:
                break
            ids = [i + k for i in live for k in range(BRANCH_GROUP_N)]
            plans = []
            for i in live:
                plans += [_branch_actions(rng, types[i])] * BRANCH_GROUP_N
            results = pool.step_turns(plans, ids)
            for g, src in enumerate(live):
                got = [repr((r.obs, r.reward_sum, r.terminated, r.truncated,
                             sorted(_strip(r.info).items()), r.n_executed, r.error))
                       for r in results[g * BRANCH_GROUP_N:(g + 1) * BRANCH_GROUP_N]]
                assert got == [got[0]] * BRANCH_GROUP_N, \
                    f"{types[src]} (env {src}), trial {trial}, turn {turn}: a branch differs"
                trace.append((trial, turn, types[src], got[0]))
            live = [i for g, i in enumerate(live)
                    if not results[g * BRANCH_GROUP_N].done]
    return trace


class DialEnv(FaultyEnv):
    """A faulty env with a method whose value cannot leave its process."""

    def opener(self) -> Any:
        return lambda: self.t

    def scaled(self, factor: int, *, offset: int = 0) -> int:
        return self.value * factor + offset


def calls_trace(pool: EnvPool) -> list[Any]:
    """Every kind of call on a 3-env pool, each answer checked and returned."""
    out: list[Any] = []
    pool.reset(seed=5)
    pool.set_attr("note", ["a", "b", "c"])
    out.append(pool.call("note"))
    assert out[-1] == ["a", "b", "c"]
    pool.set_attr("note", ["z"], env_ids=[1])
    out.append(pool.call("note", env_ids=[2, 1]))
    assert out[-1] == ["c", "z"]
    values = pool.call("value")
    out.append(pool.call("scaled", (3,), {"offset": 1}))
    assert out[-1] == [v * 3 + 1 for v in values]
    obs = pool.step(["x", "yy", "zzz"])[0]
    out.append(pool.call("render", ("text",)))
    assert out[-1] == obs  # the envs answer in place, where they were stepped
    for name, args, error, text in [
            ("gravity", (), AttributeError, "env 0: gravity: .*no attribute 'gravity'"),
            ("scaled", (), TypeError, "env 0: scaled: .*factor"),
            ("opener", (), TypeError, "env 0: opener: its result cannot be pickled"),
            ("scaled", (lambda: 1,), TypeError, "arguments of scaled must pickle"),
            ("reset", (), ValueError, "use `reset` directly")]:
        with pytest.raises(error, match=text):
            pool.call(name, args)
        out.append(error.__name__)
    with pytest.raises(TypeError, match="arguments of note must pickle"):
        pool.set_attr("note", [lambda: 1] * 3)
    with pytest.raises(ValueError, match="2 values for 3 envs"):
        pool.set_attr("note", ["a", "b"])
    # errors leave the envs as they were: no env was flagged
    out.append(pool.step(["x", "yy", "zzz"])[1])
    assert all(pool.env_record(i).failure is None for i in range(3))
    return out
