"""Tree rollouts: per-turn best-of-N, beam search, and GRPO groups that share a prefix.

A group is one tree. Its ``group_n`` members start from the same reset state (they share the
seed) and serve as the tree's branch slots: each turn, every slot that plays is one
candidate, and the turn is played for all slots of all groups at once by the lock-step
collector's own turn (`turnpool.rollout.collector.TrajectoryCollector.play_turn`: one batched
``generate``, one ``step_turns``). Between turns, a slot is pointed at another branch with the
pool's branching verbs: one ``EnvPool.snapshot`` of the branch points and one
``EnvPool.restore`` into the slots that take them over, so a branch continues exactly as its
source would have, on any backend. Its episode record is copied with it (`branch_episode`).

Modes (`turnpool.rollout.settings.TreeSettings`):

* ``best_of_n``: every turn, each slot continues the group's chosen state with its own policy
  sample; the best candidate by score becomes the chosen state of the next turn. It is
  ``beam`` with ``width=1``.
* ``beam``: the ``width`` best candidates are kept; each kept state that is still running
  keeps its own slot and the other slots are dealt to the kept states round-robin, best
  first. A kept state whose episode ended stays in its slot as a finished beam (it still
  competes, by its score, with the next turn's candidates).
* ``shared_prefix``: member 0 plays the first ``prefix_turns`` turns alone; then every member
  continues from its state independently (no scores): a GRPO group that shares its first
  ``k`` turns.

A group stops when no kept state is running (or after ``max_turn`` turns); its slots that
still run then end with ``end_reason="pruned"``. The group's trajectories are its slots at
the end: for ``best_of_n`` the chosen path (``chosen=True``) and its siblings of the last
turn; every candidate of every turn is a `TreeNode` of the tree (`RolloutBatch.tree`), with
its parent, turn, record, score and whether it was kept. Node ids are
``"{group_uid}/{turn}/{env_id}"`` (a slot plays at most one node per turn).

Scores: ``"return"`` (default: env reward summed over the episode so far), ``"reward"``
(the last turn's), or a function of the candidate's `EpisodeState` (its ``turns``,
``state``, ``done``, ``success``), given as a callable or ``"module:function"``. Ties go to
the lowest member index; a failed candidate is never chosen. Forks are not env steps: the
collector counts env steps from the nodes (``tree/env_steps``) and forks apart
(``tree/forks``).

Failures are not retried in tree modes (a tree cannot be replayed one member at a time): a
failed candidate is never kept and its slot is branched again the next turn (reset first,
since only a reset rebuilds a failed env); each failed candidate is counted once
(``failures/<class>``); a failed leaf at the end fails its group as usual (dropped, or kept
with ``failed_groups="keep"``).

    >>> from turnpool.policies import make_policy
    >>> from turnpool.pool import EnvPool
    >>> from turnpool.rollout.collector import TrajectoryCollector
    >>> from turnpool.rollout.settings import CollectorSettings, TreeSettings
    >>> settings = CollectorSettings(max_turn=3, tree=TreeSettings(mode="best_of_n"))
    >>> pool = EnvPool("sokoban", env_num=1, group_n=4, backend="sequential")
    >>> policy = make_policy({"name": "oracle", "epsilon": 0.5})
    >>> with TrajectoryCollector(pool, policy, settings=settings, owns_pool=True) as col:
    ...     batch = col.collect(seed=3)
    >>> len(batch.chosen()), len(batch.tree) >= len(batch.trajectories)
    (1, True)
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnpool.envs.registry import load_entry_point
from turnpool.pool import EnvPool
from turnpool.rollout.episode import EpisodeState
from turnpool.rollout.settings import CollectorSettings, TreeSettings
from turnpool.rollout.trajectory import Trajectory, Turn, step_group_uid, turn_dict
from turnpool.worker.failures import Failure

#: A candidate's score: larger is better.
ScoreFn = Callable[[EpisodeState], float]
#: One turn for a set of episodes (the collector's ``play_turn``).
PlayTurn = Callable[[Sequence[EpisodeState]], None]
OnTurn = Callable[[int, int, int], None]


def episode_return(ep: EpisodeState) -> float:
    """The ``"return"`` score: env reward summed over the episode so far."""
    return float(sum(t.reward for t in ep.turns))


def last_reward(ep: EpisodeState) -> float:
    """The ``"reward"`` score: the env reward of the episode's last turn (0.0 before one)."""
    return float(ep.turns[-1].reward) if ep.turns else 0.0


def score_function(score: str | Callable[[Any], float]) -> ScoreFn:
    """The score `TreeSettings.score` names: a built-in, an import path or the callable."""
    if callable(score):
        return score
    if score == "return":
        return episode_return
    if score == "reward":
        return last_reward
    fn = load_entry_point(score)
    if not callable(fn):
        raise ValueError(f"tree score {score!r} is not a function")
    return fn  # type: ignore[no-any-return]


def group_uid(gen_batch: int, group_id: int) -> str:
    """A group's id within a run (generation batch, which a multi-batch run counts on
    across its `collect` calls, and group)."""
    return f"{gen_batch}-{group_id}"


@dataclass
class TreeNode:
    """One candidate turn of a tree: where it hangs (``parent_id``: the node of the turn before
    it on its path, None at the reset state), what happened (``record``), its score (None in
    ``shared_prefix``), whether it was kept to branch from and whether it lies on the group's
    chosen path."""

    node_id: str
    parent_id: str | None
    group_uid: str
    turn: int
    env_id: int
    record: Turn
    score: float | None = None
    kept: bool = False
    chosen: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The node as one JSON object (the turn record as in the trajectory JSONL)."""
        record = turn_dict(self.record)
        for key in ("node_id", "parent_id"):
            record.pop(key, None)
        return {"node_id": self.node_id, "parent_id": self.parent_id,
                "group_uid": self.group_uid, "turn": self.turn, "env_id": self.env_id,
                "score": self.score, "kept": self.kept, "chosen": self.chosen,
                "record": record}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TreeNode:
        """A node back from `to_dict` (a line of ``turnpool rollout --tree-out``)."""
        names = {f.name for f in dataclasses.fields(Turn)}
        record = Turn(**{k: v for k, v in d["record"].items() if k in names},
                      node_id=d["node_id"], parent_id=d["parent_id"])
        return cls(d["node_id"], d["parent_id"], d["group_uid"], int(d["turn"]),
                   int(d["env_id"]), record, d["score"], bool(d["kept"]), bool(d["chosen"]))


@dataclass
class TreeRun:
    """What `play_tree` returns: the final episode of every slot (aligned to the input), every
    node created, and what branching cost."""

    episodes: list[EpisodeState]
    nodes: list[TreeNode] = field(default_factory=list)
    #: failed candidates by failure class (each once, when it failed; overwritten ones too)
    failures: Counter[str] = field(default_factory=Counter)
    forks: int = 0
    env_steps: int = 0
    fork_s: float = 0.0


@dataclass
class TreeTally:
    """A collect call's trees over its batches: every node played and what branching cost;
    `finish` links the returned groups and gives the ``tree/...`` metrics."""

    nodes: list[TreeNode] = field(default_factory=list)
    forks: int = 0
    env_steps: int = 0
    fork_s: float = 0.0

    def add(self, run: TreeRun) -> None:
        self.nodes += run.nodes
        self.forks += run.forks
        self.env_steps += run.env_steps
        self.fork_s += run.fork_s

    def finish(self, groups: Sequence[Sequence[Trajectory]]
               ) -> tuple[list[TreeNode], dict[str, float]]:
        """The returned groups' nodes (their trajectories' tree fields set, `link_group`;
        every node's GiGPO step group, discarded candidates too) and the metrics:
        ``tree/forks``, ``tree/env_steps``, ``tree/fork_s`` (every batch played),
        ``tree/nodes`` and ``tree/chosen_*`` over the chosen paths (best_of_n, beam)."""
        for g in groups:
            link_group(g)
        kept = {t.group_uid for g in groups for t in g}
        nodes = [n for n in self.nodes if n.group_uid in kept]
        for n in nodes:
            n.record.step_group_uid = step_group_uid(n.group_uid, n.record.anchor_obs)
        m = {"tree/forks": float(self.forks), "tree/env_steps": float(self.env_steps),
             "tree/fork_s": self.fork_s, "tree/nodes": float(len(nodes))}
        chosen = [t for g in groups for t in g if t.chosen]
        if chosen:
            m["tree/chosen_success"] = sum(t.success for t in chosen) / len(chosen)
            m["tree/chosen_score"] = sum(t.score for t in chosen) / len(chosen)
        return nodes, m


def branch_episode(src: EpisodeState, env_id: int) -> EpisodeState:
    """A copy of ``src``'s episode record for the slot ``env_id`` (its turns copied, so the
    two records never share a mutable turn)."""
    return dataclasses.replace(src, env_id=env_id, chosen=None,
                               turns=[dataclasses.replace(t) for t in src.turns])


def play_tree(pool: EnvPool, eps: Sequence[EpisodeState], settings: CollectorSettings,
              play_turn: PlayTurn, *, gen_batch: int = 0, reset_seed: int | None = None,
              on_turn: OnTurn | None = None) -> TreeRun:
    """Play freshly reset episodes as trees (module docstring). ``reset_seed`` is the batch's
    reset seed: a slot whose episode failed is reset with it before a branch is loaded."""
    check_tree(settings.tree, pool)
    return _Tree(pool, eps, settings, play_turn, gen_batch, reset_seed, on_turn).play()


def check_tree(tree: TreeSettings, pool: EnvPool) -> None:
    """ValueError for tree settings this pool cannot play (checked when a collector is
    built, before any env runs)."""
    if not tree.enabled:
        return
    if tree.mode == "beam" and tree.width > pool.group_n:
        raise ValueError(f"tree width {tree.width} is more than the group's {pool.group_n} "
                         f"members (es_manager.<mode>.group_size)")
    if any(spec.member_kwargs for spec in pool.specs):
        raise ValueError("tree rollouts branch a group's members into each other, so they "
                         "must be the same env: this pool gives members their own kwargs "
                         "(member_kwargs)")


class _Tree:
    """The state of one batch's trees: per group, its slots (member episodes in env order)
    and the members kept at the last selection."""

    def __init__(self, pool: EnvPool, eps: Sequence[EpisodeState], settings: CollectorSettings,
                 play_turn: PlayTurn, gen_batch: int, reset_seed: int | None,
                 on_turn: OnTurn | None) -> None:
        self.pool, self.settings, self.tree = pool, settings, settings.tree
        self.play_turn, self.gen_batch, self.reset_seed = play_turn, gen_batch, reset_seed
        self.on_turn = on_turn
        self.order = [ep.env_id for ep in eps]
        self.slots: dict[int, list[EpisodeState]] = {}
        for ep in eps:
            self.slots.setdefault(ep.group_id, []).append(ep)
        self.score = score_function(self.tree.score)
        self.width = 1 if self.tree.mode == "best_of_n" else self.tree.width
        #: per group, the member indices kept at the last selection (the root: member 0)
        self.kept: dict[int, list[int]] = {g: [0] for g in self.slots}
        #: per group, the member ranked best at the last selection
        self.best: dict[int, int | None] = {}
        self.run = TreeRun(episodes=[])
        self.branched = False  # shared_prefix: the prefix was handed to every member

    def play(self) -> TreeRun:
        s = self.settings
        for turn in range(s.max_turn):
            if self.tree.mode == "shared_prefix":
                active = self._prefix_turn(turn)
            else:
                active = self._search_turn(turn)
            if not active:
                break
            counts = [len(ep.turns) for ep in active]
            self.play_turn(active)
            for ep in active:
                if ep.error is not None:
                    self.run.failures[Failure.of(ep.failure).value] += 1
            new = self._record(active, counts)
            if self.tree.mode != "shared_prefix":
                played = {ep.env_id for ep in active}
                for g in self.slots:
                    self._select(g, played, new)
            if self.on_turn is not None:
                self.on_turn(self.gen_batch, turn, len(active))
        if self.tree.mode == "shared_prefix":
            if not self.branched:  # the prefix is the whole episode: every member gets it
                self._branch({g: [(0, k) for k in range(1, len(m))]
                              for g, m in self.slots.items()}, fork=False)
        else:
            self._finish()
        by_id = {ep.env_id: ep for m in self.slots.values() for ep in m}
        self.run.episodes = [by_id[i] for i in self.order]
        self.run.env_steps = sum(len(n.record.executed) for n in self.run.nodes)
        return self.run

    # ------------------------------------------------------------------ modes
    def _prefix_turn(self, turn: int) -> list[EpisodeState]:
        """shared_prefix: member 0 alone before ``prefix_turns``, then every member."""
        if turn < self.tree.prefix_turns:
            return [m[0] for m in self.slots.values() if not m[0].done]
        if not self.branched:
            self._branch({g: [(0, k) for k in range(1, len(m))]
                          for g, m in self.slots.items()})
        return self._running([ep for m in self.slots.values() for ep in m])

    def _search_turn(self, turn: int) -> list[EpisodeState]:
        """best_of_n / beam: point every slot at a kept state, then play them all."""
        if turn == 0:  # every member is a copy of the root already (same seed)
            return self._running([ep for m in self.slots.values() for ep in m])
        plan: dict[int, list[tuple[int, int]]] = {}
        active: list[EpisodeState] = []
        for g, members in self.slots.items():
            live = [k for k in self.kept[g] if not members[k].done]
            if not live:
                continue
            free = [k for k in range(len(members)) if k not in self.kept[g]]
            plan[g] = [(live[j % len(live)], k) for j, k in enumerate(free)]
            active += [members[k] for k in live]
        self._branch(plan)
        for g, pairs in plan.items():
            active += [self.slots[g][k] for _, k in pairs]
        return sorted(active, key=lambda ep: ep.env_id)

    # ------------------------------------------------------------------ steps
    @staticmethod
    def _running(eps: list[EpisodeState]) -> list[EpisodeState]:
        return [ep for ep in eps if not ep.done]

    def _branch(self, plan: dict[int, list[tuple[int, int]]], fork: bool = True) -> None:
        """Per group, (source member, destination member) pairs: each destination slot takes
        over its source's episode (record copied; env loaded from one snapshot per source,
        unless the source's episode is over: nothing will step it again)."""
        self.branched = True
        t0 = time.perf_counter()
        srcs: list[int] = []
        dsts: list[int] = []
        for g, pairs in plan.items():
            members = self.slots[g]
            for src, dst in pairs:
                source = members[src]
                copy = branch_episode(source, members[dst].env_id)
                if fork and not source.done:
                    srcs.append(source.env_id)
                    dsts.append(copy.env_id)
                members[dst] = copy
        if dsts:
            failed = [i for i in dsts if self.pool.env_record(i).status.value == "failed"]
            if failed:  # a failed env is rebuilt by its reset before a branch loads into it
                self.pool.reset(seed=self.reset_seed, env_ids=failed)
            unique = sorted(set(srcs))
            snaps = dict(zip(unique, self.pool.snapshot(unique)))
            self.pool.restore(dsts, [snaps[i] for i in srcs])
            self.run.forks += len(dsts)
        self.run.fork_s += time.perf_counter() - t0

    def _record(self, active: Sequence[EpisodeState], counts: Sequence[int]
                ) -> dict[int, TreeNode]:
        """A node for each turn just played, linked to the turn before it on its path; the
        new nodes by env id."""
        new: dict[int, TreeNode] = {}
        for ep, before in zip(active, counts):
            if len(ep.turns) == before:  # ended without playing (no room for a reply)
                continue
            record = ep.turns[-1]
            turn = len(ep.turns) - 1
            uid = group_uid(self.gen_batch, ep.group_id)
            record.node_id = f"{uid}/{turn}/{ep.env_id}"
            record.parent_id = ep.turns[-2].node_id if turn > 0 else None
            node = TreeNode(record.node_id, record.parent_id, uid, turn, ep.env_id, record,
                            kept=self.tree.mode == "shared_prefix")
            self.run.nodes.append(node)
            new[ep.env_id] = node
        return new

    def _select(self, g: int, played: set[int], new: dict[int, TreeNode]) -> None:
        """Rank the group's candidates (this turn's and its finished kept states) and keep
        the ``width`` best; failed ones never."""
        members = self.slots[g]
        if not any(ep.env_id in played for ep in members):
            return  # the group did not play this turn
        cands = [k for k, ep in enumerate(members)
                 if (ep.env_id in played or (k in self.kept[g] and ep.done))
                 and ep.error is None]
        scores = {k: self._score(members[k]) for k in cands}
        ranked = sorted(cands, key=lambda k: (-scores[k], k))
        self.kept[g] = ranked[: self.width]
        self.best[g] = ranked[0] if ranked else None
        for k in cands:
            node = new.get(members[k].env_id)
            if node is not None:
                node.score = scores[k]
                node.kept = k in self.kept[g]

    def _score(self, ep: EpisodeState) -> float:
        value = float(self.score(ep))
        if value != value:  # NaN: no order
            raise ValueError(f"tree score {self.tree.score!r} returned NaN for env "
                             f"{ep.env_id}")
        return value

    def _finish(self) -> None:
        """Mark each group's chosen path; end the slots that still run as pruned (their
        group stopped before ``max_turn`` because no kept state runs)."""
        stopped_early = {g for g, members in self.slots.items()
                         if not any(not members[k].done for k in self.kept[g])}
        by_id = {n.node_id: n for n in self.run.nodes}
        for g, members in self.slots.items():
            best = self.best.get(g)
            for k, ep in enumerate(members):
                ep.chosen = k == best
                if g in stopped_early and not ep.done:
                    ep.done, ep.truncated, ep.end_reason = True, True, "pruned"
            if best is not None:
                for t in members[best].turns:
                    node = by_id.get(t.node_id or "")
                    if node is not None:
                        node.chosen = True


def link_group(group: Sequence[Trajectory]) -> None:
    """Set each trajectory's tree fields from its turns' node ids: its leaf, and where it
    branched off the group (the longest node path it shares with another member)."""
    paths = [[t.node_id for t in traj.turns] for traj in group]
    for i, (traj, path) in enumerate(zip(group, paths)):
        shared = max((_common(path, other) for j, other in enumerate(paths) if j != i),
                     default=0)
        traj.node_id = path[-1] if path else None
        traj.branch_turn = shared
        traj.parent_id = path[shared - 1] if shared else None


def _common(a: Sequence[str | None], b: Sequence[str | None]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y or x is None:
            break
        n += 1
    return n


def path_turns(nodes: Sequence[TreeNode], node_id: str) -> list[Turn]:
    """The turns from the reset state to ``node_id`` (KeyError for an unknown node)."""
    by_id = {n.node_id: n for n in nodes}
    out: list[Turn] = []
    at: str | None = node_id
    while at is not None:
        node = by_id[at]
        out.append(node.record)
        at = node.parent_id
    return out[::-1]


__all__ = ["TreeNode", "TreeRun", "TreeSettings", "TreeTally", "branch_episode", "check_tree",
           "episode_return",
           "group_uid", "last_reward", "link_group", "path_turns", "play_tree",
           "score_function"]
