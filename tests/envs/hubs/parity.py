"""What every hub test compares: one run of many library ids through `turnpool.make` and
through `EnvPool` on a backend, as plain records (observation, reward, terminated, truncated,
the library's info keys), to hold against the library's own loop and against each other.

``actions[name]`` is the action list for that id; the episode of id ``k`` of ``names`` has
seed ``base_seed + k`` everywhere (the pool's group seeds, one group per id), so a library
loop that resets with the same seeds sees the same episodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import turnpool
from turnpool.envs.hubs.base import plain
from turnpool.pool.api import EnvGroupSpec, EnvPool

#: The keys turnpool adds to a library's info (compared on their own, not against the library).
TURNPOOL_KEYS = frozenset({"success", "action_is_valid", "action_is_effective", "anchor_obs"})

Record = tuple[str, float, bool, bool, dict[str, Any]]


def record(obs: Any, reward: Any, terminated: Any, truncated: Any, info: Mapping[str, Any],
           *, library: bool = False) -> Record:
    """One step as compared: the library's values plain, turnpool's own keys left out."""
    rest = {k: v for k, v in plain(dict(info)).items() if library or k not in TURNPOOL_KEYS}
    rest.pop("terminated", None), rest.pop("truncated", None)
    return str(obs), float(reward), bool(terminated), bool(truncated), rest


def play_make(name: str, seed: int, actions: Sequence[str], **kwargs: Any
              ) -> tuple[str, list[Record]]:
    """The first observation and one record per action until the episode ends."""
    env = turnpool.make(name, **kwargs)
    try:
        obs, _ = env.reset(seed=seed)
        steps: list[Record] = []
        for action in actions:
            o, r, term, trunc, info = env.step(action)
            steps.append(record(o, r, term, trunc, info))
            if term or trunc:
                break
        return obs, steps
    finally:
        env.close()


def play_pool(names: Sequence[str], base_seed: int, actions: Mapping[str, Sequence[str]],
              backend: str, kwargs: Mapping[str, Any] | None = None, **pool_options: Any
              ) -> dict[str, tuple[str, list[Record]]]:
    """`play_make` for every id at once in one pool: one group per id, seeds ``base + k``."""
    specs = [EnvGroupSpec(f"t{k}", name, 1, dict(kwargs or {})) for k, name in enumerate(names)]
    with EnvPool.from_specs(specs, group_n=1, seed=base_seed, backend=backend,
                            **pool_options) as pool:
        first, _ = pool.reset()
        steps: list[list[Record]] = [[] for _ in names]
        live = [k for k, name in enumerate(names) if actions[name]]
        turn = 0
        while live:
            obs, rewards, _dones, infos = pool.step([actions[names[k]][turn] for k in live],
                                                    env_ids=live)
            still = []
            for k, o, r, info in zip(live, obs, rewards, infos):
                steps[k].append(record(o, r, info["terminated"], info["truncated"], info))
                if not (info["terminated"] or info["truncated"]) and \
                        turn + 1 < len(actions[names[k]]):
                    still.append(k)
            live, turn = still, turn + 1
    return {name: (first[k], steps[k]) for k, name in enumerate(names)}
