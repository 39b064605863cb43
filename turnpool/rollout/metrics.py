"""A batch's metrics: per tag, RAGEN v2's extra keys, and the collector's clock.

`batch_metrics` is what `turnpool.rollout.collector.RolloutBatch.metrics` holds: per tag
``{tag}/success``, ``{tag}/pass@{k}``, ``{tag}/num_actions``, ...; under RAGEN v2 also the keys
v2's manager and ContextManager report (`v2_tag_metrics`); and ``timing/...`` from `Clock`.

    >>> c = Clock(env_s=0.5, turns=2)
    >>> m = batch_metrics([], 4, c)
    >>> m["trajectories"], m["timing/env_ms_per_turn"]
    (0.0, 250.0)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from turnpool.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)

#: Keys the pool adds to ``info`` that RAGEN's envs never report.
POOL_INFO_KEYS = ("anchor_obs", "terminated", "truncated", "error", "failure", "retryable",
                  "frame_shm")
#: RAGEN averages these info keys per turn even for its WebShop tags.
TURN_LVL_METRICS = ("action_is_effective", "action_is_valid", "end_of_page")


@dataclass
class Clock:
    """Where a collector's time went, summed over a `collect` call."""

    env_s: float = 0.0
    reset_s: float = 0.0
    policy_s: float = 0.0
    turn_s: float = 0.0
    overlap_s: float = 0.0
    turns: int = 0
    env_steps: int = 0
    batches: int = 0


def batch_metrics(trajectories: list[Trajectory], group_size: int, clock: Clock, *,
                  v2: bool = False) -> dict[str, float]:
    """Per-tag metrics, RAGEN v2's (``v2``) and the clock's (module docstring)."""
    m: dict[str, float] = {}
    by_tag: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_tag.setdefault(t.tag, []).append(t)
    for tag, ts in by_tag.items():
        m.update(tag_metrics(tag, ts, group_size))
        if v2:
            m.update(v2_tag_metrics(tag, ts))
    if v2:
        returns = [m[f"{tag}/episodic_return"] for tag in by_tag]
        if returns:
            m["charts/avg_episode_return"] = float(np.mean(returns))
        tiles = [tile for t in trajectories if (tile := _max_tile(t)) is not None]
        if tiles:
            m["rollout/max_tile"] = max(tiles)
    m["errors"] = float(sum(t.error is not None for t in trajectories))
    m["trajectories"] = float(len(trajectories))
    m.update(clock_metrics(clock))
    return m


def tag_metrics(tag: str, ts: list[Trajectory], group_size: int) -> dict[str, float]:
    """One tag's own metrics (every RAGEN version)."""
    m: dict[str, float] = {}
    n = len(ts)
    groups: dict[str, list[Trajectory]] = {}
    for t in ts:
        groups.setdefault(t.group_uid, []).append(t)
    turns = [turn for t in ts for turn in t.turns]
    # An unparseable reply counts as one invalid action.
    proposed = sum(max(1, len(turn.actions)) for turn in turns)
    valid = sum(turn.n_valid for turn in turns)
    m[f"{tag}/success"] = sum(t.success for t in ts) / n
    m[f"{tag}/pass@{group_size}"] = (
        sum(any(t.success for t in g) for g in groups.values()) / len(groups))
    m[f"{tag}/num_actions"] = sum(t.num_actions for t in ts) / n
    m[f"{tag}/num_turns"] = len(turns) / n
    m[f"{tag}/valid_action_ratio"] = valid / proposed if proposed else 0.0
    m[f"{tag}/penalty_rate"] = (sum(turn.penalized for turn in turns) / len(turns)
                                if turns else 0.0)
    m[f"{tag}/score"] = sum(t.score for t in ts) / n
    m[f"{tag}/normalized_score"] = sum(t.normalized_score for t in ts) / n
    m[f"{tag}/errors"] = float(sum(t.error is not None for t in ts))
    m[f"{tag}/trajectories"] = float(n)
    return m


def clock_metrics(c: Clock) -> dict[str, float]:
    """``timing/...``, ``env_steps`` and ``env_steps_per_s`` of a collect call."""
    m: dict[str, float] = {}
    m["timing/env_s"] = c.env_s
    m["timing/reset_s"] = c.reset_s
    m["timing/policy_s"] = c.policy_s
    m["timing/turns"] = float(c.turns)
    m["timing/env_ms_per_turn"] = 1000.0 * c.env_s / c.turns if c.turns else 0.0
    m["timing/policy_ms_per_turn"] = 1000.0 * c.policy_s / c.turns if c.turns else 0.0
    # prompts, parsing and bookkeeping: the driver's own share of a turn (the time
    # neither the policy nor the envs were busy)
    manager_s = max(0.0, c.turn_s - c.policy_s - c.env_s + c.overlap_s)
    m["timing/wall_s"] = c.turn_s
    m["timing/overlap_s"] = c.overlap_s
    shorter = min(c.policy_s, c.env_s)
    m["timing/overlap_ratio"] = c.overlap_s / shorter if shorter > 0 else 0.0
    m["timing/manager_s"] = manager_s
    m["timing/manager_ms_per_turn"] = 1000.0 * manager_s / c.turns if c.turns else 0.0
    m["env_steps"] = float(c.env_steps)
    m["env_steps_per_s"] = c.env_steps / c.env_s if c.env_s > 0 else 0.0
    return m


def v2_tag_metrics(tag: str, ts: list[Trajectory]) -> dict[str, float]:
    """RAGEN v2's extra keys for one tag, as its ContextManager aggregates them: per env
    ``raw_reward`` (mean per turn), ``episodic_return`` (sum), ``manager_invalid_action``
    (share of turns), ``max_tile`` (the last ``grid`` reported), ``final_score`` (the last
    ``score``), WebShop's ``traj_sum/<key>``; each averaged over the tag's envs, plus the
    ``non-zero/`` mean over the envs where it is not 0."""
    per_env: dict[str, list[float]] = {}
    webshop = "webshop" in tag.lower()
    for t in ts:
        n = len(t.turns)
        raw = [_number(turn.info.get("raw_reward", 0.0)) for turn in t.turns]
        per_env.setdefault("episodic_return", []).append(float(sum(raw)))
        if n:
            per_env.setdefault("raw_reward", []).append(sum(raw) / n)
            invalid = sum(turn.manager_invalid_action for turn in t.turns)
            per_env.setdefault("manager_invalid_action", []).append(invalid / n)
        tile = _max_tile(t)
        if tile is not None:
            per_env.setdefault("max_tile", []).append(tile)
        scores = [turn.info["score"] for turn in t.turns if "score" in turn.info]
        if scores:
            per_env.setdefault("final_score", []).append(_number(scores[-1]))
        if webshop:
            for k, v in _info_sums(t).items():
                per_env.setdefault("traj_sum/" + k, []).append(v)
    m: dict[str, float] = {}
    for key, values in per_env.items():
        m[f"{tag}/{key}"] = float(np.mean(values))
        nonzero = [v for v in values if v != 0]
        if nonzero:
            m[f"{tag}/non-zero/{key}"] = float(np.mean(nonzero))
    return m


def _max_tile(t: Trajectory) -> float | None:
    """The largest cell of the last ``grid`` an episode's env reported (2048), else None."""
    grids = [turn.info["grid"] for turn in t.turns if "grid" in turn.info]
    return float(np.max(np.asarray(grids[-1]))) if grids else None


def _info_sums(t: Trajectory) -> dict[str, float]:
    """Numeric info keys summed over an episode (WebShop's ``traj_sum``); a value that is
    not a number is logged and skipped, as RAGEN v2 does."""
    sums: dict[str, float] = {}
    for turn in t.turns:
        for k, v in turn.info.items():
            if k in POOL_INFO_KEYS or k in TURN_LVL_METRICS or k == "success":
                continue
            try:
                sums[k] = sums.get(k, 0.0) + float(v)
            except (TypeError, ValueError):
                log.warning("Skipping non-numeric metric %r with value %r for env %s.", k, v,
                            t.tag)
    return sums


def _number(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


#: counters that add up over the batches of a run (``failures/...``, ``dynamic/...``, trees)
_SUMMED_PREFIXES = ("failures/", "dynamic/", "tree/")


def run_metrics(batches: list[tuple[list[Trajectory], dict[str, float]]], group_size: int, *,
                v2: bool = False) -> dict[str, float]:
    """The metrics of a whole run of several batches (``(trajectories, metrics)`` each): the
    per-tag means over every trajectory, ``pass@k`` over every group (a group's uid is only
    unique within its batch), the clocks and counters summed.

        >>> from turnpool.rollout.trajectory import Trajectory
        >>> one = {"timing/env_s": 1.0, "timing/turns": 2.0, "env_steps": 8.0}
        >>> m = run_metrics([([], one), ([], one)], 4)
        >>> m["timing/env_s"], m["env_steps"], m["env_steps_per_s"]
        (2.0, 16.0, 8.0)
    """
    def total(key: str) -> float:
        return float(sum(m.get(key, 0.0) for _, m in batches))

    clock = Clock(env_s=total("timing/env_s"), reset_s=total("timing/reset_s"),
                  policy_s=total("timing/policy_s"), turn_s=total("timing/wall_s"),
                  overlap_s=total("timing/overlap_s"), turns=int(total("timing/turns")),
                  env_steps=int(total("env_steps")), batches=len(batches))
    m = batch_metrics([t for ts, _ in batches for t in ts], group_size, clock, v2=v2)
    groups: dict[str, list[tuple[int, float]]] = {}  # tag -> (groups, pass@k) per batch
    for ts, bm in batches:
        for tag in dict.fromkeys(t.tag for t in ts):
            n = len({t.group_uid for t in ts if t.tag == tag})
            groups.setdefault(tag, []).append((n, bm.get(f"{tag}/pass@{group_size}", 0.0)))
    for tag, parts in groups.items():
        n_all = sum(n for n, _ in parts)
        m[f"{tag}/pass@{group_size}"] = sum(n * p for n, p in parts) / n_all if n_all else 0.0
    counters = {k for _, bm in batches for k in bm if k.startswith(_SUMMED_PREFIXES)}
    for key in counters:
        m[key] = total(key)
    if "failures/started" in m:
        m["failures/unrecovered_fraction"] = (m["failures/unrecovered"]
                                              / max(1.0, m["failures/started"]))
    for key in ("tree/chosen_success", "tree/chosen_score"):  # means, not counters
        if key in m:
            m[key] = total(key) / sum(key in bm for _, bm in batches)
    return m
