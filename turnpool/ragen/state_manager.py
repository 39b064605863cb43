"""RAGEN's ``EnvStateManager`` (seed 001) over the pool and the rollout's episode functions.

`EnvStateManager(config, mode)` is RAGEN's ``es_manager`` interface, ``reset(seed)`` /
``step(all_env_inputs)`` / ``get_rollout_states()`` / ``render()`` / ``close()``, with the
rollout-cache dicts RAGEN's ContextManager reads. ``es_manager.use_multiprocessing`` (plus
``max_workers``, ``sequential_env_types``) selects the ``process_pool`` backend; results are
identical with it on and off.

It is thin: prompts, episodes, turn rules, penalties and the seed schedule are
`turnpool.rollout`'s; this module only translates RAGEN's inputs and cache dicts. Differences
from RAGEN on purpose: the returned cache dicts are fresh copies (RAGEN returned its own, and
the ContextManager's history window then truncated them); history ``actions`` holds the
executed action names; an explicit ``reset(seed=s)`` in train mode moves the seed counter past
``s``'s whole block (RAGEN restarted at ``s + 1``, reusing seeds).

Example:
    >>> es = EnvStateManager({"es_manager": {"train": {"env_groups": 1, "group_size": 2,
    ...     "env_configs": {"tags": ["Bandit"], "n_groups": [1]}}}})
    >>> cache = es.reset(seed=7)
    >>> out = es.step([{"env_id": 0, "actions": ["dragon"], "llm_response": "",
    ...                 "llm_raw_response": ""}])
    >>> [c["env_id"] for c in out]   # env 0 is done after one pull; env 1 was not stepped
    []
    >>> es.close()
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnpool.pool import EnvPool
from turnpool.ragen.config import load_config, pool_options, rollout_plan
from turnpool.rollout.collector import build_pool
from turnpool.rollout.episode import (
    EpisodeState,
    SeedSchedule,
    apply_turn,
    plan_actions,
    start_episodes,
    step_plans,
)
from turnpool.rollout.prompts import env_prompts

log = logging.getLogger(__name__)


@dataclass
class EnvStatus:
    """RAGEN's per-env status (``terminated`` = done for any reason, as RAGEN uses it)."""

    truncated: bool = False
    terminated: bool = False
    num_actions: int = 0
    rewards: list[float] = field(default_factory=list)
    seed: int | None = None


class EnvStateManager:
    """RAGEN's environment state manager on top of an `EnvPool`."""

    def __init__(self, config: Any = None, mode: str = "train") -> None:
        self.sys_config = load_config(config)
        self.mode = mode
        self.plan = rollout_plan(self.sys_config, mode)
        es = self.sys_config.es_manager
        self.config = es[mode]
        self.env_groups = self.plan.num_groups
        self.group_size = self.plan.group_size
        self.base_seed = self.plan.collector.seed_base
        self.seeds = SeedSchedule(self.base_seed, self.env_groups, mode)
        self._use_mp = bool(es.get("use_multiprocessing", False))
        self._pool_use_mp = self._use_mp
        self.pool = self._build_pool()
        self._prompts = env_prompts(self.plan.tags, self.pool.tags, self.plan.collector.turn)
        self._eps: list[EpisodeState] = []
        self._closed = False

    # ------------------------------------------------------------------ backend switch
    @property
    def use_multiprocessing(self) -> bool:
        """Run envs in a process pool; setting it takes effect at the next `reset`."""
        return self._use_mp

    @use_multiprocessing.setter
    def use_multiprocessing(self, value: bool) -> None:
        self._use_mp = bool(value)

    @property
    def seed_counter(self) -> int:
        """RAGEN's train seed counter (`turnpool.rollout.episode.SeedSchedule`)."""
        return self.seeds.counter

    def _build_pool(self) -> EnvPool:
        cfg = self.sys_config.copy()
        cfg.es_manager.use_multiprocessing = self._use_mp
        return build_pool(self.plan.tags, self.group_size, pool_options(cfg),
                          seed=self.base_seed or 0)

    @property
    def backend_name(self) -> str:
        return str(self.pool.backend_name)

    # ------------------------------------------------------------------ RAGEN API
    def reset(self, seed: int | None = None) -> list[dict[str, Any]]:
        """New episodes; returns the rollout cache (one dict per env)."""
        if self._use_mp != self._pool_use_mp:
            self.pool.close()
            self.pool = self._build_pool()
            self._pool_use_mp = self._use_mp
        obs, infos = self.pool.reset(seed=self.seeds.next(seed))
        self._eps = start_episodes(self.pool, self._prompts, obs, infos)
        return [self._cache(ep) for ep in self._eps]

    def step(self, all_env_inputs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Apply ``{env_id, actions, llm_response, llm_raw_response}`` inputs; return the
        caches of the envs that are still running (done envs are not sent back)."""
        if not self._eps:
            raise RuntimeError("call reset() before step()")
        eps, plans = [], []
        for inp in all_env_inputs:
            ep = self._eps[int(inp["env_id"])]
            if ep.done:
                continue
            actions = [str(a) for a in (inp.get("actions") or [])]
            eps.append(ep)
            plans.append(plan_actions(ep, actions, raw=str(inp.get("llm_raw_response", "")),
                                      llm_response=str(inp.get("llm_response", "")),
                                      format_valid=bool(actions)))
        out = []
        for ep, plan, result in zip(eps, plans, step_plans(self.pool, eps, plans)):
            apply_turn(ep, plan, result, self.plan.collector.turn)
            if not ep.done:
                out.append(self._cache(ep))
        return out

    def get_rollout_states(self) -> list[dict[str, Any]]:
        """Final caches with RAGEN's metrics: ``{tag}/success``, ``{tag}/num_actions``,
        numeric info keys averaged over turns, ``{tag}/pass@{group_size}``."""
        caches = [self._cache(ep) for ep in self._eps]
        group_success: dict[tuple[str, int], bool] = {}
        for ep in self._eps:
            key = (ep.tag, ep.group_id)
            group_success[key] = group_success.get(key, False) or ep.success
        for ep, cache in zip(self._eps, caches):
            sums: dict[str, float] = {}
            for turn in ep.turns:
                for k, v in turn.info.items():
                    if k != "success" and isinstance(v, (bool, int, float)):
                        sums[k] = sums.get(k, 0.0) + float(v)
            metrics: dict[str, float] = {"success": float(ep.success),
                                         "num_actions": float(ep.num_actions)}
            n_turns = max(1, len(ep.turns))
            metrics.update({k: v / n_turns for k, v in sums.items()})
            cache["metrics"] = {f"{ep.tag}/{k}": v for k, v in metrics.items()}
            cache["metrics"][f"{ep.tag}/pass@{self.group_size}"] = float(
                group_success[(ep.tag, ep.group_id)])
        return caches

    @property
    def envs(self) -> list[dict[str, Any]]:
        """RAGEN's env entries (without env objects, which live in the pool's workers)."""
        return [{"tag": ep.tag, "group_id": ep.group_id, "env_id": ep.env_id,
                 "status": self._status(ep),
                 "max_actions_per_traj": ep.prompt.spec.max_actions_per_traj}
                for ep in self._eps]

    @property
    def rollout_cache(self) -> list[dict[str, Any]] | None:
        return [self._cache(ep) for ep in self._eps] if self._eps else None

    def render(self) -> list[str]:
        return [ep.state for ep in self._eps]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.pool.close()

    def __enter__(self) -> EnvStateManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ views
    @staticmethod
    def _status(ep: EpisodeState) -> EnvStatus:
        return EnvStatus(truncated=ep.done and not ep.success, terminated=ep.done,
                         num_actions=ep.num_actions, rewards=[t.reward for t in ep.turns],
                         seed=ep.seed)

    @staticmethod
    def _cache(ep: EpisodeState) -> dict[str, Any]:
        history: list[dict[str, Any]] = []
        for t in ep.turns:
            history.append({"state": t.state, "actions_left": t.actions_left,
                            "actions": list(t.executed), "reward": t.reward,
                            "info": dict(t.info), "llm_response": t.llm_response,
                            "llm_raw_response": t.llm_raw_response})
        history.append({"state": ep.state, "actions_left": ep.actions_left})
        return {"env_id": ep.env_id, "group_id": ep.group_id, "tag": ep.tag,
                "penalty": ep.penalty, "history": history}
