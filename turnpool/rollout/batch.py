"""`RolloutBatch`: what `turnpool.rollout.collector.TrajectoryCollector.collect` returns, and
its writers (trajectories as JSONL, a tree rollout's nodes as JSONL, a node's path as
token-exact samples)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from turnpool.rollout.trajectory import TokenView, Trajectory, Turn, turn_samples, write_jsonl
from turnpool.rollout.tree import TreeNode, path_turns


@dataclass
class RolloutBatch:
    """What `TrajectoryCollector.collect` returns: trajectories (group members adjacent) and
    metrics (per tag ``{tag}/success``, ``{tag}/pass@{k}``, ...; ``timing/...``;
    ``dynamic/...``)."""

    trajectories: list[Trajectory]
    metrics: dict[str, float]
    #: tree rollouts: every node of the returned groups' trees, in the order played
    tree: list[TreeNode] = field(default_factory=list)
    #: the first episode that failed for good: ``"<failure class>: <ExcType>: message"``
    first_error: str | None = None

    def to_jsonl(self, dest: str | Path | IO[str]) -> int:
        """Write the trajectories as canonical JSONL; returns the number of lines."""
        return write_jsonl(self.trajectories, dest)

    def chosen(self) -> list[Trajectory]:
        """Tree rollouts (best_of_n, beam): each group's chosen path."""
        return [t for t in self.trajectories if t.chosen]

    def to_tree(self) -> list[dict[str, Any]]:
        """The trees as JSON objects, one per node (``node_id``, ``parent_id``, ``group_uid``,
        ``turn``, ``env_id``, ``score``, ``kept``, ``chosen`` and the turn ``record``); the
        nodes of one group form a forest rooted at its reset state (``parent_id`` None)."""
        return [n.to_dict() for n in self.tree]

    def write_tree(self, dest: str | Path | IO[str]) -> int:
        """Write `to_tree` as canonical JSONL (one node a line); returns the number of lines."""
        if isinstance(dest, (str, Path)):
            with open(dest, "w", encoding="utf-8") as fh:
                return self.write_tree(fh)
        for node in self.to_tree():
            dest.write(json.dumps(node, sort_keys=True, ensure_ascii=False, allow_nan=False)
                       + "\n")
        return len(self.tree)

    def path(self, node_id: str) -> list[Turn]:
        """The turns from the reset state to ``node_id`` (any node, discarded ones too)."""
        return path_turns(self.tree, node_id)

    def path_samples(self, node_id: str) -> list[TokenView]:
        """The path to ``node_id`` as token-exact training samples (as
        `Trajectory.token_samples`: token policies only)."""
        return turn_samples(self.path(node_id), f"node {node_id}")
