"""Tree rollouts (`turnpool.rollout.tree`) on a real EnvPool: best-of-N per turn, beam search
and GRPO groups sharing a prefix, played by the lock-step collector and branched with the
pool's fork verbs. Paths are checked by replaying them on a fresh env from the seed."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

import turnpool
from tests.faults import ALL_FAULTS_ENV
from turnpool.policies import make_policy
from turnpool.policies.base import Message, Policy, TurnContext
from turnpool.pool import EnvGroupSpec, EnvPool
from turnpool.rollout.collector import RolloutBatch, TrajectoryCollector
from turnpool.rollout.episode import EpisodeState
from turnpool.rollout.settings import CollectorSettings, TagSpec, TreeSettings, TurnSettings
from turnpool.rollout.trajectory import TREE_FIELDS, Trajectory
from turnpool.rollout.tree import TreeNode

pytestmark = pytest.mark.timeout(120)

#: a room the noisy oracle does not always solve in a few turns
ROOM = {"dim_room": (7, 7), "search_depth": 40}


def _collect(mode: str, *, group_n: int = 4, groups: int = 3, backend: str = "sequential",
             max_turn: int = 5, epsilon: float = 0.5, seed: int = 21, policy: Policy | None = None,
             env_type: str = "sokoban", env_kwargs: dict[str, Any] | None = None,
             **tree: Any) -> RolloutBatch:
    settings = CollectorSettings(max_turn=max_turn, turn=TurnSettings(max_actions_per_turn=2),
                                 tree=TreeSettings(mode=mode, **tree))
    kwargs = ROOM if env_kwargs is None and env_type == "sokoban" else env_kwargs or {}
    pool = EnvPool(env_type, env_num=groups, group_n=group_n, env_kwargs=dict(kwargs),
                   backend=backend, num_workers=None if backend == "sequential" else 2)
    pol = policy or make_policy({"name": "oracle", "epsilon": epsilon, "seed": 1})
    with TrajectoryCollector(pool, pol, settings=settings, owns_pool=True) as col:
        return col.collect(seed=seed)


def _by_group(nodes: list[TreeNode]) -> dict[str, list[TreeNode]]:
    out: dict[str, list[TreeNode]] = defaultdict(list)
    for n in nodes:
        out[n.group_uid].append(n)
    return out


def _replay(traj_seed: int, turns: list[Any], env_kwargs: dict[str, Any]) -> None:
    """Reset a fresh env with the seed and play each turn's executed actions: every turn's
    recorded state must be what the env shows at that point."""
    env = turnpool.make("sokoban", **env_kwargs)
    obs, _ = env.reset(seed=traj_seed)
    for turn in turns:
        assert turn.state == obs
        for action in turn.executed:
            obs, *_ = env.step(action)


def _jsonl(batch: RolloutBatch) -> str:
    buf = io.StringIO()
    batch.to_jsonl(buf)
    batch.write_tree(buf)
    return buf.getvalue()


def test_none_mode_writes_the_jsonl_it_wrote_before_tree_modes() -> None:
    """The digest was recorded with the collector as it was before tree modes existed."""
    lake = {"p": 0.8, "success_rate": 1 / 3}  # FrozenLake's defaults when it was recorded
    specs = [EnvGroupSpec("S", "sokoban", 2, {"dim_room": (7, 7)}),
             EnvGroupSpec("L", "frozen_lake", 1, lake)]
    pool = EnvPool.from_specs(specs, group_n=3, backend="sequential")
    settings = CollectorSettings(max_turn=4, turn=TurnSettings(max_actions_per_turn=2))
    with TrajectoryCollector(pool, make_policy({"name": "oracle", "epsilon": 0.3}),
                             settings=settings, owns_pool=True) as col:
        batch = col.collect(seed=11)
    buf = io.StringIO()
    batch.to_jsonl(buf)
    text = buf.getvalue()
    assert hashlib.sha256(text.encode()).hexdigest() == \
        "72ebd9e60e125cb00605684a23f1d58e59d369783ac9b4178539a97d6fbbf365"
    assert batch.tree == [] and not any(k.startswith("tree/") for k in batch.metrics)
    for line in text.splitlines():
        d = json.loads(line)
        assert not set(TREE_FIELDS) & set(d)
        assert all("node_id" not in t for t in d["turns"])


def test_best_of_n_keeps_the_best_sibling_each_turn_and_its_path_replays() -> None:
    batch = _collect("best_of_n", groups=4)
    assert batch.metrics["tree/forks"] > 0
    trees = _by_group(batch.tree)
    for uid, nodes in trees.items():
        by_turn: dict[int, list[TreeNode]] = defaultdict(list)
        for n in nodes:
            by_turn[n.turn].append(n)
        for turn, sibs in sorted(by_turn.items()):
            best = max(sibs, key=lambda n: (n.score, -n.env_id))
            assert [n.kept for n in sibs] == [n is best for n in sibs]
            # the score is the path's env return, and every sibling hangs off one state
            for n in sibs:
                assert n.score == pytest.approx(sum(t.reward for t in batch.path(n.node_id)))
            assert len({n.parent_id for n in sibs}) == 1
            if turn + 1 in by_turn:
                assert {n.parent_id for n in by_turn[turn + 1]} == {best.node_id}
                assert len(by_turn[turn + 1]) == 4  # every slot got its own sample
                assert not best.record.done
        chosen = [t for t in batch.trajectories if t.group_uid == uid and t.chosen]
        assert len(chosen) == 1
        assert [t.node_id for t in chosen[0].turns] == \
            [max(by_turn[k], key=lambda n: (n.score, -n.env_id)).node_id
             for k in sorted(by_turn)]
    for traj in batch.trajectories:  # every returned path (chosen or not) replays exactly
        assert traj.seed is not None
        _replay(traj.seed, traj.turns, ROOM)
    assert len(batch.chosen()) == 4
    assert batch.metrics["tree/chosen_success"] == \
        sum(t.success for t in batch.chosen()) / 4
    # each turn's siblings had distinct samples somewhere (the policy's noise is per slot)
    assert any(len({tuple(n.record.executed) for n in nodes if n.turn == 0}) > 1
               for nodes in trees.values())


def test_discarded_nodes_replay_too() -> None:
    batch = _collect("best_of_n", groups=2)
    seeds = {t.group_uid: t.seed for t in batch.trajectories}
    for node in batch.tree:
        seed = seeds[node.group_uid]
        assert seed is not None
        _replay(seed, batch.path(node.node_id), ROOM)


def test_beam_keeps_width_states_and_deals_them_the_slots() -> None:
    batch = _collect("beam", group_n=6, width=2, groups=3, max_turn=5, epsilon=0.7)
    for nodes in _by_group(batch.tree).values():
        by_turn: dict[int, list[TreeNode]] = defaultdict(list)
        for n in nodes:
            by_turn[n.turn].append(n)
        finished_kept = False
        for turn, cands in sorted(by_turn.items()):
            kept = [n for n in cands if n.kept]
            dropped = [n for n in cands if not n.kept]
            assert len(kept) <= 2
            if not finished_kept:
                assert len(kept) == min(2, len(cands))
            assert all((k.score, -k.env_id) > (d.score, -d.env_id)  # type: ignore[operator]
                       for k in kept for d in dropped)
            live = [n for n in kept if not n.record.done]
            if turn + 1 in by_turn:
                # the running kept states share the slots that finished kept ones leave
                children = Counter(n.parent_id for n in by_turn[turn + 1])
                assert set(children) == {n.node_id for n in live}
                assert max(children.values()) - min(children.values()) <= 1
                if not finished_kept:
                    assert sum(children.values()) == 6 - (len(kept) - len(live))
            finished_kept |= len(live) < len(kept)
    for traj in batch.trajectories:
        assert traj.seed is not None
        _replay(traj.seed, traj.turns, ROOM)


def test_shared_prefix_members_share_k_turns_exactly_and_diverge_after() -> None:
    batch = _collect("shared_prefix", prefix_turns=2, groups=3, max_turn=6, epsilon=0.6)
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in batch.trajectories:
        groups[t.group_uid].append(t)
    diverged = 0
    for members in groups.values():
        first = members[0]
        assert len(first.turns) >= 2
        for m in members:
            assert [t.node_id for t in m.turns[:2]] == [t.node_id for t in first.turns[:2]]
            assert [(t.state, t.llm_raw_response, t.executed, t.reward) for t in m.turns[:2]] \
                == [(t.state, t.llm_raw_response, t.executed, t.reward)
                    for t in first.turns[:2]]
            assert m.chosen is None
            if not first.turns[1].done:
                assert m.branch_turn == 2 and m.parent_id == first.turns[1].node_id
                assert len({t.node_id for t in m.turns[2:]}) == len(m.turns) - 2
                assert all(t.node_id.endswith(f"/{m.env_id}")  # type: ignore[union-attr]
                           for t in m.turns[2:])
        if len({tuple(tuple(t.executed) for t in m.turns) for m in members}) > 1:
            diverged += 1
    assert diverged >= 2
    assert batch.metrics["tree/forks"] == 3 * 3  # member 0 into the 3 others, per group


def test_parent_ids_form_a_tree_in_every_mode() -> None:
    for mode, extra in (("best_of_n", {}), ("beam", {"width": 2}),
                        ("shared_prefix", {"prefix_turns": 1})):
        batch = _collect(mode, **extra)
        ids = [n.node_id for n in batch.tree]
        assert len(set(ids)) == len(ids)
        nodes = {n.node_id: n for n in batch.tree}
        for n in batch.tree:
            if n.parent_id is None:
                assert n.turn == 0
            else:
                parent = nodes[n.parent_id]
                assert parent.group_uid == n.group_uid and parent.turn == n.turn - 1
        for t in batch.trajectories:
            chain = [turn.node_id for turn in t.turns]
            assert [turn.parent_id for turn in t.turns] == [None, *chain[:-1]]
            assert t.node_id == chain[-1]
            assert [x.node_id for x in batch.path(t.node_id)] == chain
        assert batch.metrics["tree/nodes"] == len(batch.tree)
        assert batch.metrics["tree/env_steps"] == batch.metrics["env_steps"] == \
            sum(len(n.record.executed) for n in batch.tree)
        # the JSON form carries the same nodes, and reads back as them
        lines = io.StringIO()
        assert batch.write_tree(lines) == len(batch.tree)
        back = [TreeNode.from_dict(json.loads(x)) for x in lines.getvalue().splitlines()]
        assert back == batch.tree
        assert all(n.record.step_group_uid.startswith(n.group_uid + "/") for n in back)


@pytest.mark.parametrize("mode,extra", [("best_of_n", {}), ("beam", {"width": 2})])
def test_sequential_and_process_backends_give_identical_jsonl(mode: str,
                                                              extra: dict[str, Any]) -> None:
    outs = {b: _jsonl(_collect(mode, backend=b, groups=2, **extra))
            for b in ("sequential", "process")}
    assert outs["sequential"] == outs["process"]
    assert '"node_id"' in outs["sequential"]


def prefer_last_member(ep: EpisodeState) -> float:
    """A user score (named by import path in the test below): the highest env id wins."""
    return float(ep.env_id)


def test_a_user_score_function_by_import_path_picks_the_kept_node() -> None:
    batch = _collect("best_of_n", score="tests.rollout.test_tree:prefer_last_member",
                     groups=2)
    for nodes in _by_group(batch.tree).values():
        for turn in {n.turn for n in nodes}:
            sibs = [n for n in nodes if n.turn == turn]
            assert [n.kept for n in sibs] == [n.env_id == max(s.env_id for s in sibs)
                                              for n in sibs]
            assert all(n.score == n.env_id for n in sibs)


def test_a_misspelt_collector_mode_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match=r"^collector mode must be one of lockstep, async, "
                                         r"got 'asynch'$"):
        CollectorSettings(collector_mode="asynch")  # type: ignore[arg-type]
    assert CollectorSettings(collector_mode="async").driver == "async"
    assert CollectorSettings().driver == "lockstep"
    assert CollectorSettings(tree=TreeSettings(mode="beam")).driver == "tree"


def test_tree_modes_refuse_what_they_cannot_play() -> None:
    with pytest.raises(ValueError, match="needs the lockstep collector"):
        CollectorSettings(collector_mode="async", tree=TreeSettings(mode="best_of_n"))
    with pytest.raises(ValueError, match="tree mode must be one of"):
        TreeSettings(mode="mcts")
    settings = CollectorSettings(tree=TreeSettings(mode="beam", width=5))
    pool = EnvPool("sokoban", env_num=1, group_n=4, backend="sequential")
    with pytest.raises(ValueError, match="width 5 is more than the group's 4"):
        TrajectoryCollector(pool, make_policy({"name": "oracle"}), settings=settings,
                            owns_pool=True)
    pool.close()


def test_best_of_n_token_paths_are_token_exact(tiny_model_dir: Path) -> None:
    from turnpool.policies.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), max_new_tokens=24, temperature=1.0, seed=3)
    batch = _collect("best_of_n", group_n=3, groups=1, max_turn=3,
                     policy=policy)
    tok = policy.tokenizer
    for t in batch.trajectories:
        assert t.is_one_sequence
        assert batch.path_samples(t.node_id or "") == t.token_samples()
    nodes = {n.node_id: n for n in batch.tree}
    for n in batch.tree:  # discarded siblings too: each path is one exact sequence
        (view,) = batch.path_samples(n.node_id)
        ids = n.record.response_ids or []
        assert view.response_ids[len(view.response_ids) - len(ids):] == ids
        assert tok.decode(ids, skip_special_tokens=True) == n.record.llm_raw_response
        if n.parent_id is not None:
            (before,) = batch.path_samples(n.parent_id)
            env = n.record.prompt_ids or []
            assert view.prompt_ids == before.prompt_ids
            assert view.response_ids == before.response_ids + env + ids
            assert view.loss_mask == before.loss_mask + [0] * len(env) + [1] * len(ids)
            assert nodes[n.parent_id].turn == n.turn - 1
    assert len(batch.tree) > len(batch.trajectories)


def test_the_best_of_n_example_runs_at_small_sizes() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "best_of_n_sokoban.py"
    spec = importlib.util.spec_from_file_location("best_of_n_sokoban", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = argparse.Namespace(rooms=6, n=3, epsilon=0.8, max_turn=8, seed=0,
                              backend="sequential")
    rows = example.table(args)
    assert [r["mode"] for r in rows] == ["flat", "best-of-N per turn",
                                         "best-of-N per turn, user score"]
    assert rows[0]["forks"] == 0 and all(r["forks"] > 0 for r in rows[1:])
    assert all(r["env_steps"] > 0 and 0.0 <= r["success"] <= 1.0 for r in rows)
    for r in rows[1:]:  # a leaf that solves its room always outranks its siblings
        assert r["pass@3"] == r["success"]


class FaultAt:
    """Answers ``go<turn>``, and ``action`` for env ``env_id`` at turn ``turn``."""

    def __init__(self, env_id: int, turn: int, action: str) -> None:
        self.at, self.action = (env_id, turn), action

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        assert contexts is not None
        return [f"<answer>{self.action if (c.env_id, c.turn) == self.at else f'go{c.turn}'}"
                f"</answer>" for c in contexts]

    def close(self) -> None:
        pass


def _faulty(policy: FaultAt, backend: str) -> RolloutBatch:
    pool = EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=3, seed=0, backend=backend,
                   num_workers=2, step_timeout=1.0, tag="Faulty")
    tags = [TagSpec("Faulty", ALL_FAULTS_ENV, n_groups=2, max_actions_per_traj=10)]
    settings = CollectorSettings(max_turn=3, turn=TurnSettings(enable_think=False),
                                 seed_base=100, tree=TreeSettings(mode="best_of_n"))
    with TrajectoryCollector(pool, policy, tags, settings, owns_pool=True) as col:
        return col.collect()


@pytest.mark.parametrize(("backend", "fault", "failure"), [
    ("sequential", "raise", "env_error"), ("process", "exit", "worker_lost")])
def test_a_failed_candidate_is_never_kept_and_its_slot_is_branched_again(
        backend: str, fault: str, failure: str) -> None:
    batch = _faulty(FaultAt(1, 0, fault), backend)
    failed = [n for n in batch.tree if n.record.error is not None]
    assert [(n.node_id, n.kept, n.score) for n in failed] == [("0-0/0/1", False, None)]
    assert {n.parent_id for n in batch.tree if n.turn == 1 and n.group_uid == "0-0"} == \
        {"0-0/0/0"}  # slot 1 continues the kept state again
    assert len(batch.trajectories) == 6 and all(t.error is None for t in batch.trajectories)
    assert batch.metrics[f"failures/{failure}"] == 1.0
    assert batch.metrics["failures/dropped_groups"] == 0.0


def test_a_failed_leaf_drops_its_group_and_its_tree() -> None:
    batch = _faulty(FaultAt(1, 2, "raise"), "sequential")
    assert {t.group_uid for t in batch.trajectories} == {"0-1"}
    assert {n.group_uid for n in batch.tree} == {"0-1"}
    assert batch.metrics["failures/dropped_groups"] == 1.0
    assert batch.metrics["failures/env_error"] == 1.0
