"""Best-of-N per turn against flat sampling on Sokoban, at the same number of env steps.

The policy is the oracle with noise: each action is the solver's with probability
``1 - epsilon``, a random one otherwise (the same per-env, per-turn generator as the
``random`` policy, so every run is reproducible). Each room is one group of ``N`` envs:

* ``flat``: ``N`` independent episodes per room (turnpool's default collector). Its success
  is the share of episodes that solve their room; ``pass@N`` is the share of rooms that some
  episode solves (best-of-N over whole episodes: it needs a verifier at the end).
* ``best-of-N per turn``: every turn, the ``N`` envs of a room continue the room's chosen
  state with their own sample each, and the candidate with the best env return so far is
  kept (``turnpool.collector.tree.mode=best_of_n``). Its success is the chosen paths'.
* ``best-of-N per turn, user score``: the same, ranked by a user function instead of the env
  reward: here ``solver_distance`` (minus the number of moves the solver needs from the
  candidate's state: a perfect value function, so this row is an upper bound of what a
  learned value would give).

Forks are not env steps: the env-step column counts actions the envs executed, and the
forks are reported apart.

    python examples/best_of_n_sokoban.py --rooms 200 --n 4 --epsilon 0.5

prints one row per mode (rooms, env steps, forks and their time, success, pass@N, wall time
of the whole collect call).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from turnpool.envs.registry import oracle_for, resolve
from turnpool.policies import make_policy
from turnpool.pool import EnvPool
from turnpool.rollout.collector import RolloutBatch, TrajectoryCollector
from turnpool.rollout.episode import EpisodeState
from turnpool.rollout.settings import CollectorSettings, TagSpec, TreeSettings, TurnSettings

ROOM = {"dim_room": (7, 7), "num_boxes": 1, "search_depth": 40}
SOLVER = oracle_for("sokoban")
SOLVER_CONFIG = {**resolve("sokoban")[1], **ROOM}


def solver_distance(ep: EpisodeState) -> float:
    """A user score: minus the solver's plan length from the candidate's state (0 when
    solved; a state the solver cannot finish scores -1000)."""
    if ep.success:
        return 0.0
    plan = SOLVER(ep.state, SOLVER_CONFIG)
    return -float(len(plan)) if plan else -1000.0


def run(mode: str, *, rooms: int, n: int, epsilon: float, max_turn: int, seed: int,
        backend: str, score: Any = "return") -> tuple[RolloutBatch, float]:
    """One batch of ``rooms`` groups of ``n`` envs; returns it and its wall time."""
    settings = CollectorSettings(
        max_turn=max_turn, turn=TurnSettings(max_actions_per_turn=1, enable_think=False),
        tree=TreeSettings(mode=mode, score=score))
    pool = EnvPool("sokoban", env_num=rooms, group_n=n, env_kwargs=dict(ROOM),
                   backend=backend)
    policy = make_policy({"name": "oracle", "epsilon": epsilon, "seed": 0})
    t0 = time.perf_counter()
    tags = [TagSpec(tag="sokoban", env_type="sokoban", n_groups=rooms, env_kwargs=dict(ROOM),
                    max_actions_per_traj=max_turn)]
    with TrajectoryCollector(pool, policy, tags, settings, owns_pool=True,
                             owns_policy=True) as col:
        batch = col.collect(seed=seed)
    return batch, time.perf_counter() - t0


def table(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The comparison's rows (one per mode)."""
    common = dict(rooms=args.rooms, n=args.n, epsilon=args.epsilon, max_turn=args.max_turn,
                  seed=args.seed, backend=args.backend)
    rows = []
    flat, wall = run("none", **common)
    m = flat.metrics
    rows.append({"mode": "flat", "rooms": args.rooms, "env_steps": m["env_steps"],
                 "forks": 0.0, "fork_s": 0.0, "success": m["sokoban/success"],
                 f"pass@{args.n}": m[f"sokoban/pass@{args.n}"], "wall_s": wall})
    for label, score in (("best-of-N per turn", "return"),
                         ("best-of-N per turn, user score", solver_distance)):
        batch, wall = run("best_of_n", score=score, **common)
        m = batch.metrics
        rows.append({"mode": label, "rooms": args.rooms, "env_steps": m["tree/env_steps"],
                     "forks": m["tree/forks"], "fork_s": m["tree/fork_s"],
                     "success": m["tree/chosen_success"],
                     f"pass@{args.n}": m[f"sokoban/pass@{args.n}"], "wall_s": wall})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rooms", type=int, default=200, help="rooms (groups)")
    parser.add_argument("--n", type=int, default=4, help="envs per room (N)")
    parser.add_argument("--epsilon", type=float, default=0.5, help="oracle noise")
    parser.add_argument("--max-turn", type=int, default=10, help="turns (one action each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="sequential")
    args = parser.parse_args()
    rows = table(args)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) and k in
                                ("success", f"pass@{args.n}") else
                                f"{v:.2f}" if isinstance(v, float) and k.endswith("_s") else
                                f"{v:.0f}" if isinstance(v, float) else str(v)
                                for k, v in row.items()) + " |")


if __name__ == "__main__":
    main()
