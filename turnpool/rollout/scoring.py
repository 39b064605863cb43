"""Episode scores and RAGEN's group-wise reward normalization.

A trajectory's score is the sum of its turn rewards. RAGEN adds the accumulated format penalty
*before* normalizing (even for ``identity``), then normalizes within groups:

==============  ============================================================
grouping        which trajectories share statistics
==============  ============================================================
``state``       same group id (same seed and env config)
``inductive``   same tag
``batch``       the whole batch
==============  ============================================================

==============  ============================================================
method          formula inside a group G (std is unbiased, n - 1)
==============  ============================================================
``mean_std``    ``(x - mean_G) / (std_G + 1e-6)``; ``std_G <= 1e-6`` -> 0
``mean``        ``x - mean_G``
``asym_clip``   ``clamp(mean_std(x), -1, 3)``
``identity``    ``x``
==============  ============================================================

If there are as many groups as trajectories (every group a singleton), nothing is normalized.

The unnormalized, unpenalized scores are kept apart (``Scores.original``): RAGEN's group
filter received scores that had already been penalized and normalized in place, so with
``mean_std`` every non-constant group looked alike to it.

    >>> s = compute_scores([[1.0], [0.0], [2.0], [2.0]], [0.0, -0.1, 0.0, 0.0],
    ...                    group_ids=[0, 0, 1, 1], tags=["a"] * 4,
    ...                    grouping="state", method="mean")
    >>> [round(x, 6) for x in s.normalized]
    [0.55, -0.55, 0.0, 0.0]
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

GROUPINGS = ("state", "inductive", "batch")
METHODS = ("mean_std", "mean", "asym_clip", "identity")
_EPS = 1e-6


@dataclass(frozen=True)
class Scores:
    """Per-trajectory scores: raw sums, plus penalty, and normalized."""

    original: list[float]
    penalized: list[float]
    normalized: list[float]


def group_keys(
    group_ids: Sequence[Hashable], tags: Sequence[str], grouping: str
) -> list[Hashable]:
    """The key each trajectory is normalized under, for a RAGEN ``grouping`` name."""
    if grouping == "state":
        return list(group_ids)
    if grouping == "inductive":
        return list(tags)
    if grouping == "batch":
        return [0] * len(group_ids)
    raise ValueError(f"unknown reward_normalization.grouping {grouping!r}; one of {GROUPINGS}")


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _std_unbiased(xs: Sequence[float]) -> float:
    # One sample has no spread to measure; torch returns nan there, which RAGEN's `> 1e-6`
    # guard then treats as "constant group" -> zeros. 0.0 takes the same branch.
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _normalize_group(xs: list[float], method: str) -> list[float]:
    if method == "identity":
        return list(xs)
    m = _mean(xs)
    if method == "mean":
        return [x - m for x in xs]
    if method in ("mean_std", "asym_clip"):
        sd = _std_unbiased(xs)
        if sd <= _EPS:
            return [0.0] * len(xs)
        out = [(x - m) / (sd + _EPS) for x in xs]
        if method == "asym_clip":
            out = [min(max(v, -1.0), 3.0) for v in out]
        return out
    raise ValueError(f"unknown reward_normalization.method {method!r}; one of {METHODS}")


def normalize(scores: Sequence[float], keys: Sequence[Hashable], method: str) -> list[float]:
    """Normalize ``scores`` group-wise (``keys`` name the groups) with a RAGEN method."""
    if method not in METHODS:
        raise ValueError(f"unknown reward_normalization.method {method!r}; one of {METHODS}")
    if len(scores) != len(keys):
        raise ValueError(f"{len(scores)} scores but {len(keys)} group keys")
    out = [float(x) for x in scores]
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    if len(members) >= len(out):  # every group a singleton: RAGEN leaves scores alone
        return out
    for idx in members.values():
        for i, v in zip(idx, _normalize_group([out[i] for i in idx], method)):
            out[i] = v
    return out


def compute_scores(
    turn_rewards: Sequence[Sequence[float]],
    penalties: Sequence[float],
    group_ids: Sequence[Hashable],
    tags: Sequence[str],
    grouping: str = "state",
    method: str = "identity",
) -> Scores:
    """Episode scores as RAGEN computes them: sum of turn rewards + penalty, normalized."""
    original = [math.fsum(r) for r in turn_rewards]
    penalized = [o + float(p) for o, p in zip(original, penalties)]
    keys = group_keys(group_ids, tags, grouping)
    return Scores(original, penalized, normalize(penalized, keys, method))
