"""The ``oracle`` policy: the env's own solver, with optional epsilon noise.

It checks that success is reachable and gives a fast, meaningful baseline for benchmarks.
Each env class declares its solver (`turnpool.envs.base.TextEnv.oracle`, found through
`turnpool.envs.registry.oracle_for`), so a user env registered by entry point ships its own.
Noise and fallbacks draw from the same per-env, per-turn generator as the ``random`` policy.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

from turnpool.envs.base import OracleFn
from turnpool.envs.registry import oracle_for, resolve
from turnpool.policies.base import PolicyStats, TurnContext
from turnpool.policies.random import (
    ScriptedPolicy,
    format_reply,
    random_action,
    turn_capacity,
    turn_rng,
)

logger = logging.getLogger(__name__)

#: the key of the config an oracle is given that says how many actions one turn takes
ORACLE_TURN_KEY = "max_actions_per_turn"


def find_oracle(env_type: str) -> OracleFn:
    """The ``oracle`` the env class declares (`turnpool.envs.base.TextEnv.oracle`)."""
    return oracle_for(env_type)


class OraclePolicy(ScriptedPolicy):
    """Acts with the env's oracle; each action is replaced by a random one w.p. ``epsilon``.

    Plans are cached per (env type, config, observation), so the members of a group (which
    share their state until they diverge) solve a Sokoban room once, not ``group_n`` times.
    """

    kind = "oracle"

    def __init__(self, seed: int = 0, epsilon: float = 0.0, cache_size: int = 4096) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.seed = int(seed)
        self.epsilon = float(epsilon)
        self.stats = PolicyStats()
        self._cache_size = int(cache_size)
        self._plans: OrderedDict[tuple[str, str, str], list[str]] = OrderedDict()
        self._oracles: dict[str, OracleFn] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def reply(self, ctx: TurnContext) -> str:
        """The reply for one env at one turn."""
        rng = turn_rng(self.seed, ctx)
        plan = self.plan(ctx)[: turn_capacity(ctx)]
        if not plan:  # no plan (unsolvable or unknown state): still answer in format
            plan = [random_action(rng, ctx)]
        actions = [random_action(rng, ctx) if rng.random() < self.epsilon else a for a in plan]
        return format_reply(actions, ctx, "Following the plan.")

    def plan(self, ctx: TurnContext) -> list[str]:
        """The oracle's action list for this observation ([] when the oracle fails)."""
        key = (ctx.env_type, repr(sorted(ctx.env_kwargs.items(), key=lambda kv: str(kv[0])))
               + f"/{ctx.max_actions_per_turn}", ctx.obs)
        with self._lock:
            cached = self._plans.get(key)
            if cached is not None:
                self._plans.move_to_end(key)
                return list(cached)
        try:
            plan = [str(a) for a in self._oracle(ctx.env_type)(ctx.obs, self._config(ctx))]
        except Exception as exc:  # an oracle bug must not stop a rollout
            plan = []
            with self._lock:
                if ctx.env_type not in self._warned:  # once per env, not once per turn
                    self._warned.add(ctx.env_type)
                    logger.warning("oracle for %s failed (random actions instead; "
                                   "policy.stats counts every failure): %s", ctx.env_type, exc)
                self.stats.failures += 1
                self.stats.errors.append(f"{ctx.env_type}: {exc}"[:200])
                del self.stats.errors[:-100]
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self._cache_size:
                self._plans.popitem(last=False)
        return list(plan)

    def close(self) -> None:
        """Drop cached plans."""
        with self._lock:
            self._plans.clear()

    def _oracle(self, env_type: str) -> OracleFn:
        fn = self._oracles.get(env_type)
        if fn is None:
            fn = self._oracles[env_type] = find_oracle(env_type)
        return fn

    @staticmethod
    def _config(ctx: TurnContext) -> dict[str, Any]:
        """The env's config, and ``max_actions_per_turn`` (`ORACLE_TURN_KEY`): an oracle
        that cannot see its own earlier actions on the page (WebShop's option clicks) plans
        what fits in one turn."""
        _, defaults = resolve(ctx.env_type)
        return {**defaults, **ctx.env_kwargs, ORACLE_TURN_KEY: ctx.max_actions_per_turn}
