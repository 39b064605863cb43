"""RAGEN's ``ParallelRolloutManager`` (seed 002), and a collector straight from a config.

Both are the rollout's `TrajectoryCollector` built from a `turnpool.ragen.config` plan; the
manager only adds RAGEN's names (``rollout``) on top. Seed 002's "shared LLM inference
manager" is the ``hf`` policy itself (`SharedLLMInferenceManager`): it is already thread-safe.

Example:
    >>> with collector_from_config(overrides=[
    ...         "es_manager.train.env_groups=2", "es_manager.train.env_configs.n_groups=[2]",
    ...         "es_manager.train.group_size=2", "turnpool.backend=sequential"]) as col:
    ...     batch = col.collect()
    >>> len(batch.trajectories), "charts/avg_episode_return" in batch.metrics  # RAGEN v2's
    (4, True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from turnpool.policies.base import Policy
from turnpool.policies.hf import HFPolicy
from turnpool.ragen.config import load_config, rollout_plan
from turnpool.rollout.collector import RolloutBatch, TrajectoryCollector

#: Seed 002's name for a thread-safe shared model: the ``hf`` policy class itself.
SharedLLMInferenceManager = HFPolicy


def collector_from_config(cfg: str | Path | DictConfig | Mapping[str, Any] | None = None,
                          mode: str = "train", policy: Policy | None = None,
                          overrides: Sequence[str] = ()) -> TrajectoryCollector:
    """Build pool, policy and collector from a config (a path, a loaded config or None
    for the packaged defaults). The collector owns and closes what it built."""
    if not isinstance(cfg, DictConfig):
        cfg = load_config(cfg, overrides)
    elif overrides:
        raise ValueError("overrides apply to a config path, not a loaded config")
    return TrajectoryCollector.from_plan(rollout_plan(cfg, mode), policy)


class ParallelRolloutManager:
    """Seed 002's joblib rollout: a `TrajectoryCollector` whose pool runs on joblib.

    ``agent_proxy.use_parallel_rollout`` picks the joblib backend with ``parallel_n_jobs``
    workers (false: the configured backend). All workers share the one ``policy``; the
    collector calls it once per turn for every running env, so no locking is needed beyond
    what the policy itself does (the ``hf`` policy serializes its model calls).
    """

    def __init__(self, config: Any = None, policy: Policy | None = None, mode: str = "train",
                 overrides: Sequence[str] = ()) -> None:
        self.collector = collector_from_config(load_config(config, overrides), mode=mode,
                                               policy=policy)

    @property
    def backend_name(self) -> str:
        return str(self.collector.pool.backend_name)

    def rollout(self, seed: int | None = None) -> RolloutBatch:
        """One batch of trajectories with metrics."""
        return self.collector.collect(seed)

    def close(self) -> None:
        self.collector.close()

    def __enter__(self) -> ParallelRolloutManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
