"""turnpool: the environment side of multi-turn LLM-agent RL, parallel, deterministic, safe.

    >>> import turnpool
    >>> env = turnpool.make("sokoban", dim_room=(6, 6), num_boxes=1)
    >>> obs, info = env.reset(seed=123)

Public names are imported lazily so that ``import turnpool`` stays cheap and optional extras
(ray, transformers, fastapi) are only imported by the parts that need them.
"""

from __future__ import annotations

from typing import Any

from turnpool.envs.base import TextEnv
from turnpool.envs.gym_ids import register_gym_ids
from turnpool.envs.registry import load_entry_point, make, register, registered

__version__ = "0.1.0"

register_gym_ids()  # gymnasium.make("turnpool/Sokoban-v0") after `import turnpool`

_LAZY: dict[str, str] = {
    "create_projection_function": "turnpool.ragen.projection",
    "parse_response": "turnpool.rollout.projection",
    "EnvPool": "turnpool.pool.api",
    "MultiProcessEnvironmentContainer": "turnpool.ragen.container",
    "EnvStateManager": "turnpool.ragen.state_manager",
    "ParallelRolloutManager": "turnpool.ragen.rollout_manager",
    "TrajectoryCollector": "turnpool.rollout.collector",
    "load_config": "turnpool.ragen.config",
    "collector_from_config": "turnpool.ragen.rollout_manager",
    "make_policy": "turnpool.policies",
    "SharedLLMInferenceManager": "turnpool.ragen.rollout_manager",
    "project_actions": "turnpool.rollout.projection",
    "EnvGroupSpec": "turnpool.pool.api",
    "TurnResult": "turnpool.worker.results",
    "EnvError": "turnpool.pool.api",
}

__all__ = ["TextEnv", "__version__", "make", "register", "registered", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'turnpool' has no attribute {name!r}")
    value = load_entry_point(f"{module}:{name}")
    globals()[name] = value
    return value
