"""Branching: `EnvPool.snapshot` / `restore` / `fork` continue exactly as the original.

Each trial (a fixed seeded generator picks the episode seed, the branch point and the
actions) plays env 0 to the branch point, snapshots it, forks it into env 1 (same worker) and
env 3 (the other worker), restores the snapshot into env 2, then plays the same actions on all
four: every (obs, reward, done, info) must be equal, as text, to env 0's.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
from typing import Any

import numpy as np
import pytest

from turnpool.pool import EnvGroupSpec, EnvPool, Snapshot

#: env type -> the actions a trial draws from (by state: the built-in envs; by replay: the
#: gymnasium adapter)
ACTIONS: dict[str, list[Any]] = {
    "sokoban": ["Up", "Down", "Left", "Right"],
    "frozen_lake": ["Left", "Down", "Right", "Up"],
    "countdown": ["1+2", "(3*4)-5", "7", "nonsense"],
    "bandit": ["1", "2", "phoenix", "dragon"],
    "FrozenLake-v1": ["0", "1", "2", "3"],
}


def _pool(env_type: str, backend: str, seed: int = 0) -> EnvPool:
    return EnvPool(env_type, env_num=4, seed=seed, backend=backend, num_workers=2)


def _text(obs: str, reward: float, done: bool, info: dict[str, Any]) -> str:
    return repr((obs, reward, done, sorted(info.items())))


def _trial(pool: EnvPool, actions: list[Any], rng: np.random.Generator, branch_at: int
           ) -> int:
    """One random trial on ``pool``, branching after ``branch_at`` steps; returns how many
    continuation steps it compared."""
    pool.reset(seed=int(rng.integers(1000)))
    for _ in range(branch_at):
        *_, dones, _ = pool.step([actions[int(rng.integers(len(actions)))]], env_ids=[0])
        if dones[0]:
            with pytest.raises(ValueError, match="finished"):
                pool.snapshot([0])
            return 0
    now = pool.step_turns([[]], env_ids=[0])[0].obs  # the source's observation, unchanged
    snap = pool.snapshot([0])[0]
    fork_obs, _ = pool.fork(0, [1, 3])
    restore_obs, _ = pool.restore([2], [pickle.loads(pickle.dumps(snap))])
    assert fork_obs == [now, now] and restore_obs == [now]
    compared = 0
    for _ in range(12):
        action = actions[int(rng.integers(len(actions)))]
        obs, rewards, dones, infos = pool.step([action] * 4)
        texts = [_text(*x) for x in zip(obs, rewards, dones, infos)]
        assert texts == [texts[0]] * 4
        compared += 1
        if dones[0]:
            break
    return compared


@pytest.mark.parametrize("backend", ["sequential", "thread", "process"])
@pytest.mark.parametrize("env_type", list(ACTIONS))
def test_forked_and_restored_envs_continue_as_the_original(env_type: str, backend: str
                                                           ) -> None:
    rng = np.random.default_rng([7, len(env_type), len(backend)])
    with _pool(env_type, backend) as pool:
        assert pool.owner_of(0) == pool.owner_of(1) != pool.owner_of(3)
        branch_points = [0, *rng.integers(1, 6, size=4)]  # the reset state, then mid-episode
        compared = sum(_trial(pool, ACTIONS[env_type], rng, int(k)) for k in branch_points)
    assert compared > 0


def test_a_fork_on_the_process_pool_backend_continues_as_the_original() -> None:
    rng = np.random.default_rng(11)
    with _pool("sokoban", "process_pool") as pool:
        assert sum(_trial(pool, ACTIONS["sokoban"], rng, k) for k in (0, 3)) > 0


def test_a_snapshot_is_a_small_picklable_value_by_state_or_by_replay() -> None:
    for env_type, by_state in (("sokoban", True), ("FrozenLake-v1", False)):
        with _pool(env_type, "sequential") as pool:
            pool.reset(seed=5)
            pool.step([ACTIONS[env_type][0]], env_ids=[0])
            snap = pool.snapshot([0])[0]
            assert (snap.state is not None) is by_state
            assert snap.seed == 5 and len(snap.turns) == 1
            assert len(pickle.dumps(snap)) < 4096


def test_snapshots_restore_into_the_same_env_type_of_another_pool() -> None:
    with _pool("sokoban", "sequential") as a, _pool("sokoban", "thread", seed=9) as b:
        a.reset(seed=3)
        a.step(["Up"], env_ids=[2])
        snap = a.snapshot([2])[0]
        b.reset()
        b.restore([1], [snap])
        assert _text(*[x[0] for x in a.step(["Left"], env_ids=[2])]) == \
            _text(*[x[0] for x in b.step(["Left"], env_ids=[1])])


def test_bad_branching_input_is_a_clear_value_error() -> None:
    specs = [EnvGroupSpec("soko", "sokoban", 2), EnvGroupSpec("lake", "frozen_lake", 2)]
    with EnvPool.from_specs(specs, group_n=1, backend="sequential") as pool:
        with pytest.raises(ValueError, match="no live episode"):
            pool.snapshot([0])
        pool.reset(seed=1)
        snap = pool.snapshot([0])[0]
        with pytest.raises(ValueError, match="unknown env id 9"):
            pool.snapshot([9])
        with pytest.raises(ValueError, match="unknown env id -1"):
            pool.fork(-1, [1])
        with pytest.raises(ValueError, match="snapshot is of"):
            pool.restore([2], [snap])  # a sokoban snapshot into a frozen lake
        with pytest.raises(ValueError, match="snapshot is of"):
            pool.fork(0, [2])  # the same, as one message on their one worker
        with pytest.raises(ValueError, match="not a turnpool Snapshot"):
            pool.restore([1], [{"seed": 1}])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="2 snapshots for 1 envs"):
            pool.restore([1], [snap, snap])
        with pytest.raises(ValueError, match="both the source and a destination"):
            pool.fork(0, [0, 1])
        forged = Snapshot(snap.env_key, snap.seed, snap.turns, state={"nonsense": 1})
        with pytest.raises(ValueError, match="could not be restored"):
            pool.restore([1], [forged])
        assert pool.env_record(1).status.value == "failed"  # until its next reset
        pool.reset(seed=1, env_ids=[1])
        pool.restore([1], [snap])
        assert pool.env_record(1).status.value == "idle"


def test_a_fork_of_a_finished_episode_is_refused_and_changes_nothing() -> None:
    with EnvPool("frozen_lake", env_num=3, seed=0, backend="sequential") as pool:
        pool.reset(seed=2)
        for _ in range(200):  # walk until the episode ends (a hole, the goal or the limit)
            *_, dones, _ = pool.step(["Down"], env_ids=[0])
            if dones[0]:
                break
        assert dones[0]
        before = pool.step_turns([[]], env_ids=[1])[0].obs
        with pytest.raises(ValueError, match="finished"):
            pool.fork(0, [1, 2])
        assert pool.step_turns([[]], env_ids=[1])[0].obs == before
        assert pool.env_record(1).status.value == "idle"


@pytest.mark.parametrize("how", ["fork on its worker", "restore from the other worker"])
@pytest.mark.parametrize("env_type", ["sokoban", "FrozenLake-v1"])
def test_a_restored_env_survives_the_loss_of_its_worker_exactly(env_type: str, how: str
                                                                ) -> None:
    actions = ACTIONS[env_type]
    with _pool(env_type, "process") as pool:
        pool.reset(seed=4)
        pool.step([actions[2]], env_ids=[2])
        assert pool.owner_of(0) == pool.owner_of(1) != pool.owner_of(2)
        if how == "fork on its worker":  # env 1 (worker 0) is forked into env 0 (`Op.FORK`)
            pool.step([actions[2]], env_ids=[1])
            pool.fork(1, [0])
            pool.restore([2], pool.snapshot([1]))  # env 2, the reference, plays it too
        else:  # env 0 (worker 0) now plays env 2's episode
            pool.restore([0], pool.snapshot([2]))
        pool.step([actions[1], actions[1]], env_ids=[0, 2])
        os.kill(pool.worker_pids()[pool.owner_of(0)], signal.SIGKILL)
        for a in (actions[3], actions[0], actions[2]):
            obs, rewards, dones, infos = pool.step([a, a], env_ids=[0, 2])
            assert "error" not in infos[0]
            assert _text(obs[0], rewards[0], dones[0], infos[0]) == \
                _text(obs[1], rewards[1], dones[1], infos[1])
            if dones[0]:
                break


def test_bench_fork_reports_every_env_and_place(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from turnpool.cli.bench import bench
    out = tmp_path / "fork.json"
    result = CliRunner().invoke(bench, ["fork", "--env", "countdown", "--forks", "5",
                                        "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["env"], r["place"]) for r in rows] == [("countdown", "in-process"),
                                                      ("countdown", "process"),
                                                      ("countdown", "process-same"),
                                                      ("countdown", "served")]
    assert all(r["p50_us"] <= r["p99_us"] and r["snapshot_bytes"] > 0 for r in rows)


def test_repeated_forks_do_not_grow_the_replay_log() -> None:
    with _pool("sokoban", "sequential") as pool:
        pool.reset(seed=2)
        pool.step(["Up"], env_ids=[0])
        pool.fork(0, [1])
        held = pool._dispatch.table.replay.held(pool.owner_of(1))
        for _ in range(50):
            pool.fork(0, [1])
        assert pool._dispatch.table.replay.held(pool.owner_of(1)) == held
        assert pool.snapshot([1])[0].turns == (("Up",),)


def test_an_episode_is_a_snapshot_without_state_that_restores_by_replay() -> None:
    with _pool("sokoban", "process") as pool:
        with pytest.raises(ValueError, match="no live episode"):
            pool.episode(0)
        pool.reset(seed=6)
        pool.step(["Up"], env_ids=[0])
        pool.step(["Left"], env_ids=[0])
        ep, snap = pool.episode(0), pool.snapshot([0])[0]
        assert ep.state is None and (ep.env_key, ep.seed, ep.turns) == \
            (snap.env_key, snap.seed, snap.turns) == (snap.env_key, 6, (("Up",), ("Left",)))
        obs, _ = pool.restore([3], [ep])  # the other worker, by reset + replay
        assert obs == [pool.step_turns([[]], env_ids=[0])[0].obs]
        got = pool.step(["Down", "Down"], env_ids=[0, 3])
        assert _text(*[x[0] for x in got]) == _text(*[x[1] for x in got])
