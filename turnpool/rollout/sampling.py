"""Dynamic sampling (DAPO / dynamic GiGPO: RAGEN's ``algorithm.filter_groups``): batches are
drawn until exactly ``target`` groups whose episode scores vary are kept; groups whose scores
are all equal are dropped, and surplus groups of the last batch are discarded, so the result
never overshoots. When ``max_batches`` are spent first, ``on_exhausted`` decides: ``raise``
(`BudgetExhausted`), ``keep_all`` (fill up with dropped groups, oldest first) or
``return_short``. `turnpool.rollout.collector.TrajectoryCollector` draws the batches.

    >>> from turnpool.rollout.trajectory import Trajectory
    >>> def group(*scores):
    ...     return [Trajectory(env_id=0, group_id=0, group_uid="0-0", tag="t",
    ...                        env_type="bandit", seed=0, score=x) for x in scores]
    >>> batches = [[group(1, 1), group(0, 1)], [group(0, 1), group(1, 0)]]
    >>> kept, metrics = dynamic_groups(lambda b: batches[b], 2, 4, "raise")
    >>> len(kept), metrics["dynamic/gen_batches"], metrics["dynamic/surplus_groups"]
    (2, 2.0, 1.0)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from turnpool.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


class BudgetExhausted(RuntimeError):
    """Dynamic sampling spent ``max_num_gen_batches`` before enough groups had varied rewards."""

    def __init__(self, kept: int, target: int, batches: int) -> None:
        self.kept, self.target, self.batches = kept, target, batches
        super().__init__(f"dynamic sampling kept {kept} of {target} groups after {batches} "
                         f"generation batches (algorithm.filter_groups.max_num_gen_batches); "
                         f"set turnpool.collector.on_budget_exhausted to keep_all or "
                         f"return_short to accept fewer varied groups")


def dynamic_groups(batch: Callable[[int], list[list[Trajectory]]], target: int,
                   max_batches: int, on_exhausted: str
                   ) -> tuple[list[list[Trajectory]], dict[str, float]]:
    """The kept groups and the ``dynamic/...`` metrics; ``batch(b)`` plays generation batch
    ``b`` and returns its groups."""
    if target < 1:
        raise ValueError(f"target_groups must be >= 1, got {target}")
    kept: list[list[Trajectory]] = []
    dropped: list[list[Trajectory]] = []
    surplus = 0
    batches = 0
    for b in range(max_batches):
        batches += 1
        for group in batch(b):
            scores = {t.score for t in group}
            if len(scores) <= 1:
                dropped.append(group)
            elif len(kept) < target:
                kept.append(group)
            else:
                surplus += 1
        if len(kept) >= target:
            break
    filled = 0
    if len(kept) < target:
        if on_exhausted == "raise":
            raise BudgetExhausted(len(kept), target, batches)
        if on_exhausted == "keep_all":
            filled = min(target - len(kept), len(dropped))
            kept.extend(dropped[:filled])
        elif on_exhausted != "return_short":
            raise ValueError(f"unknown on_budget_exhausted {on_exhausted!r}")
        log.warning("dynamic sampling: %d of %d groups vary after %d batches (%s)",
                    len(kept) - filled, target, batches, on_exhausted)
    metrics = {"dynamic/gen_batches": float(batches), "dynamic/target_groups": float(target),
               "dynamic/kept_groups": float(len(kept) - filled),
               "dynamic/dropped_groups": float(len(dropped)),
               "dynamic/surplus_groups": float(surplus),
               "dynamic/filled_groups": float(filled),
               "dynamic/returned_groups": float(len(kept))}
    return kept, metrics


__all__ = ["BudgetExhausted", "dynamic_groups"]
