"""Placement by measured cost: one model for `turnpool.pool.slots.SlotEngine` (a new lease
goes to the least loaded worker) and for the fronts of ``turnpool serve`` (a new session goes
to the least loaded front process).

A unit's *cost* is a moving average of its steps' time (`updated`); a group's *load* is the
cost of its measured units plus its unmeasured ones at the mean cost of every measured unit
(`load_of`; 1.0 each while none is measured, so load is then a count).

Example:
    >>> mean = mean_of(total_cost=0.75, measured=3)
    >>> [load_of(0.5, unmeasured=0, mean=mean), load_of(0.0, unmeasured=2, mean=mean)]
    [0.5, 0.5]
    >>> least_loaded([0.2, 0.1, 0.0], eligible=[True, True, False])
    1
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: Weight of the newest step in a unit's moving-average cost.
COST_WEIGHT = 0.2


def updated(cost: float, took: float) -> float:
    """A unit's cost after a step that took ``took`` s (its first step sets it)."""
    return took if not cost else cost + COST_WEIGHT * (took - cost)


def mean_of(total_cost: float, measured: float) -> float:
    """One unit's mean cost over ``measured`` units costing ``total_cost`` (1.0: none)."""
    return total_cost / measured if measured > 0 and total_cost > 0 else 1.0


def load_of(measured_cost: float, unmeasured: float, mean: float) -> float:
    """A group's load: its measured units' cost, the others at ``mean`` each."""
    return measured_cost + max(0.0, unmeasured) * mean


def least_loaded(loads: Sequence[float], eligible: Sequence[bool]) -> int | None:
    """The eligible group of least load (the first of equals); None when none is."""
    best, best_load = None, math.inf
    for k, (load, ok) in enumerate(zip(loads, eligible, strict=True)):
        if ok and load < best_load:
            best, best_load = k, load
    return best


__all__ = ["COST_WEIGHT", "least_loaded", "load_of", "mean_of", "updated"]
