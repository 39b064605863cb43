"""Async collection (``turnpool.collector.mode: async``): the same trajectories, groups, scores
and metrics as lock-step for a deterministic policy, on every env type and backend; generation
really overlaps env steps; faults and policy errors behave as in lock-step."""

from __future__ import annotations

import io
import json
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from turnpool.envs.synthetic import TrivialEnv
from turnpool.policies import make_policy
from turnpool.policies.base import Message, Policy, TurnContext
from turnpool.pool import EnvPool
from turnpool.ragen.config import ConfigError, load_config, rollout_plan
from turnpool.ragen.rollout_manager import collector_from_config
from turnpool.rollout.async_driver import _busy
from turnpool.rollout.collector import RolloutBatch, TrajectoryCollector
from turnpool.rollout.settings import AsyncSettings, CollectorSettings, TagSpec, TurnSettings

pytestmark = pytest.mark.timeout(120)


def _tags(tags: list[str], n_groups: list[int], group_size: int) -> list[str]:
    return [f"es_manager.train.env_configs.tags=[{','.join(tags)}]",
            f"es_manager.train.env_configs.n_groups=[{','.join(map(str, n_groups))}]",
            f"es_manager.train.env_groups={sum(n_groups)}",
            f"es_manager.train.group_size={group_size}"]


def _jsonl(*batches: RolloutBatch) -> str:
    buf = io.StringIO()
    for b in batches:
        b.to_jsonl(buf)
    return buf.getvalue()


def _untimed(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith("timing/")
            and k != "env_steps_per_s"}


class Recording:
    """A real policy, plus which env ids each call asked about (calls may run concurrently)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.calls: list[list[int]] = []
        self._lock = threading.Lock()

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        assert contexts is not None
        with self._lock:
            self.calls.append([c.env_id for c in contexts])
        return self.inner.generate(batch, contexts)

    def close(self) -> None:
        self.inner.close()


MIXED = _tags(["SimpleSokoban", "FrozenLake", "Bandit", "Countdown"], [1, 2, 1, 1], 3)


@pytest.mark.parametrize("policy", [
    ["turnpool.policy.name=random", "turnpool.policy.random.invalid_rate=0.2"],
    ["turnpool.policy.name=oracle", "turnpool.policy.oracle.epsilon=0.3"],
])
@pytest.mark.parametrize("backend", ["sequential", "thread", "process"])
def test_async_and_lockstep_give_identical_jsonl_and_metrics(backend: str,
                                                             policy: list[str]) -> None:
    common = [*MIXED, *policy, "agent_proxy.max_turn=6", "turnpool.num_workers=2",
              "turnpool.fallback=false", f"turnpool.backend={backend}",
              "agent_proxy.reward_normalization.method=mean_std"]
    runs: dict[str, tuple[str, dict[str, float]]] = {}
    modes = {"lockstep": ["turnpool.collector.mode=lockstep"],
             # small micro-batches from several threads: many orders, same result
             "async": ["turnpool.collector.mode=async", "turnpool.collector.max_batch=2",
                       "turnpool.collector.policy_workers=3"],
             "async_default": ["turnpool.collector.mode=async"]}
    for name, extra in modes.items():
        with collector_from_config(overrides=[*common, *extra]) as col:
            assert col.pool.backend_name == backend
            first, second = col.collect(), col.collect()
        runs[name] = (_jsonl(first, second), _untimed(second.metrics))
    ref_text, ref_metrics = runs["lockstep"]
    assert len(ref_text.splitlines()) == 2 * 15
    for name, (text, metrics) in runs.items():
        assert text == ref_text, name
        assert metrics == ref_metrics, name


def test_dynamic_sampling_in_async_mode_matches_lockstep() -> None:
    common = [*_tags(["FrozenLake"], [4], 2), "turnpool.backend=thread",
              "turnpool.num_workers=2", "turnpool.policy.name=random",
              "agent_proxy.max_turn=3", "algorithm.filter_groups.enable=true",
              "algorithm.filter_groups.max_num_gen_batches=6",
              "turnpool.collector.on_budget_exhausted=keep_all"]
    out = {}
    for mode in ("lockstep", "async"):
        with collector_from_config(
                overrides=[*common, f"turnpool.collector.mode={mode}"]) as col:
            batch = col.collect(seed=100)
        out[mode] = (_jsonl(batch), _untimed(batch.metrics))
    assert out["async"] == out["lockstep"]
    assert out["async"][1]["dynamic/gen_batches"] >= 1


def test_each_env_is_generated_for_once_per_turn_in_micro_batches() -> None:
    rec = Recording(make_policy({"name": "oracle", "epsilon": 0.3, "seed": 1}))
    overrides = [*_tags(["FrozenLake", "Bandit"], [2, 2], 4), "agent_proxy.max_turn=6",
                 "turnpool.backend=thread", "turnpool.num_workers=4",
                 "turnpool.collector.mode=async", "turnpool.collector.max_batch=3"]
    turns: list[tuple[int, int, int]] = []
    with collector_from_config(overrides=overrides, policy=rec) as col:
        col.on_turn = lambda gen_batch, turn, running: turns.append((gen_batch, turn, running))
        batch = col.collect()
    asked = Counter(i for call in rec.calls for i in call)
    for t in batch.trajectories:  # one generation per recorded turn, none after the end
        assert asked[t.env_id] == len(t.turns)
    assert all(1 <= len(call) <= 3 for call in rec.calls)
    assert all(len(set(call)) == len(call) for call in rec.calls)
    assert batch.metrics["env_steps"] == sum(t.num_actions for t in batch.trajectories)
    assert batch.metrics["timing/turns"] == len(rec.calls)
    # The progress callback reports the lock-step turn counter, as lock-step does.
    lock_turns: list[tuple[int, int, int]] = []
    with collector_from_config(overrides=[*overrides[:-2]], policy=make_policy(
            {"name": "oracle", "epsilon": 0.3, "seed": 1})) as col:
        col.on_turn = lambda gen_batch, turn, running: lock_turns.append(
            (gen_batch, turn, running))
        col.collect()
    assert turns == lock_turns and turns[0] == (0, 0, 16)


def test_without_max_batch_the_envs_move_in_eighths() -> None:
    """One call for every pending env would keep all envs in step (lock-step again)."""
    rec = Recording(make_policy({"name": "random", "seed": 2}))
    overrides = [*_tags(["FrozenLake"], [8], 2), "agent_proxy.max_turn=3",
                 "turnpool.backend=sequential", "turnpool.collector.mode=async"]
    with collector_from_config(overrides=overrides, policy=rec) as col:
        assert col.settings.async_settings.max_batch is None
        col.collect()
    assert max(len(call) for call in rec.calls) == 2  # 16 envs / 8


# ------------------------------------------------------------------ overlap, for real
_GATE = threading.Event()
_WAITING = threading.Event()


class GateEnv(TrivialEnv):
    """Action ``wait`` blocks until the policy has been asked about another env's next turn;
    lock-step collection cannot get there, so the gate would time out (an env error)."""

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == "wait":
            _WAITING.set()
            if not _GATE.wait(30.0):
                raise RuntimeError("the policy never ran while this env was stepping")
        return super()._step(action)


class GatePolicy:
    """Env 1 says ``wait`` at its first turn; env 0's second turn opens the gate, once env 1
    is inside that step (env 0 may get there before env 1's first turn is even generated:
    opened then, the gate would let env 1 through with nothing generated while it steps)."""

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        assert contexts is not None
        out = []
        for ctx in contexts:
            if ctx.env_id == 0 and ctx.turn == 1:
                if not _WAITING.wait(30.0):
                    raise RuntimeError("env 1 never started its step")
                _GATE.set()
            out.append("<answer>wait</answer>" if (ctx.env_id, ctx.turn) == (1, 0)
                       else "<answer>go</answer>")
        return out

    def close(self) -> None:
        pass


def test_generation_runs_while_another_env_is_stepping() -> None:
    """Env 0's second turn is generated while env 1's first step runs, and the timing says
    so: the env span starts when the step is sent, the policy span ends when ``generate``
    returns, and both enclose the moment the gate opened."""
    _GATE.clear()
    _WAITING.clear()
    env = f"{__name__}:GateEnv"
    pool = EnvPool(env, env_num=2, group_n=1, seed=0, backend="thread", num_workers=2,
                   step_timeout=60.0, tag="Gate")
    settings = CollectorSettings(max_turn=3, collector_mode="async",
                                 turn=TurnSettings(enable_think=False))
    with TrajectoryCollector(pool, GatePolicy(), [TagSpec("Gate", env, n_groups=2)], settings,
                             owns_pool=True) as col:
        batch = col.collect()
    assert _GATE.is_set()
    assert [t.error for t in batch.trajectories] == [None, None]
    assert [len(t.turns) for t in batch.trajectories] == [3, 3]
    assert batch.trajectories[1].turns[0].executed == ["wait"]
    assert batch.metrics["timing/overlap_s"] > 0.0


# ------------------------------------------------------------------ faults and errors
class ScriptedFaults:
    """Deterministic replies: env ``i`` gets ``faults[i]`` at turn 1, ``go`` otherwise."""

    def __init__(self, faults: dict[int, str]) -> None:
        self.faults = faults

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        assert contexts is not None
        return [f"<answer>{self.faults.get(c.env_id, 'go') if c.turn == 1 else 'go'}</answer>"
                for c in contexts]

    def close(self) -> None:
        pass


def _faulty_run(mode: str, faults: dict[int, str], failed_groups: str = "drop"
                ) -> RolloutBatch:
    pool = EnvPool("faulty", env_num=4, group_n=2, seed=3, backend="process", num_workers=2,
                   step_timeout=2.0, fallback=False, tag="Faulty")
    settings = CollectorSettings(max_turn=4, collector_mode=mode,
                                 turn=TurnSettings(enable_think=False),
                                 async_settings=AsyncSettings(max_batch=3), episode_retries=0,
                                 failed_groups=failed_groups)
    tags = [TagSpec("Faulty", "faulty", n_groups=4)]
    with TrajectoryCollector(pool, ScriptedFaults(faults), tags, settings,
                             owns_pool=True) as col:
        return col.collect()


def test_env_faults_in_async_mode_isolate_exactly_as_in_lockstep() -> None:
    faults = {1: "hang", 2: "raise", 6: "exit"}
    lock, asyn = _faulty_run("lockstep", faults), _faulty_run("async", faults)
    assert _jsonl(asyn) == _jsonl(lock)
    # A failed episode is never scored: without retries its group is dropped whole.
    assert sorted(t.env_id for t in asyn.trajectories) == [4, 5]
    for t in asyn.trajectories:
        assert t.error is None and t.end_reason == "max_turn" and len(t.turns) == 4
    m = asyn.metrics
    assert (m["failures/timeout"], m["failures/env_error"], m["failures/worker_lost"]) == (
        1.0, 1.0, 1.0)
    assert m["failures/dropped_groups"] == 3.0 and m["errors"] == 0.0


def test_kept_failed_groups_mark_only_the_culprits() -> None:
    faults = {1: "hang", 2: "raise", 6: "exit"}
    batch = _faulty_run("async", faults, failed_groups="keep")
    assert len(batch.trajectories) == 8 and batch.metrics["failures/dropped_groups"] == 0.0
    errors = {t.env_id: t for t in batch.trajectories if t.error}
    assert sorted(errors) == [1, 2, 6]
    assert [errors[i].failure for i in (1, 2, 6)] == ["timeout", "env_error", "worker_lost"]
    for t in batch.trajectories:
        if t.env_id not in faults:
            assert t.end_reason == "max_turn" and len(t.turns) == 4


class FailingPolicy:
    """Raises on its ``fail_on``-th call (1-based), like a policy whose server went away."""

    def __init__(self, fail_on: int) -> None:
        self.fail_on = fail_on
        self.n = 0
        self.lock = threading.Lock()

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        with self.lock:
            self.n += 1
            if self.n == self.fail_on:
                raise ConnectionError("policy server went away")
        return ["<answer>go</answer>"] * len(batch)

    def close(self) -> None:
        pass


def test_a_policy_error_propagates_and_leaves_the_pool_usable() -> None:
    pool = EnvPool("sleep", env_num=4, group_n=2, seed=0, backend="thread", num_workers=2,
                   env_kwargs={"sleep_ms": 1.0})
    settings = CollectorSettings(max_turn=5, collector_mode="async",
                                 async_settings=AsyncSettings(max_batch=2, policy_workers=2))
    tags = [TagSpec("sleep", "sleep", n_groups=4, env_kwargs={"sleep_ms": 1.0})]
    with TrajectoryCollector(pool, FailingPolicy(fail_on=3), tags, settings,
                             owns_pool=True) as col:
        with pytest.raises(ConnectionError, match="went away"):
            col.collect()
        assert not pool.in_flight
        col.policy = FailingPolicy(fail_on=0)
        batch = col.collect()  # the pool is whole again: a full batch, no errors
    assert len(batch.trajectories) == 8 and batch.metrics["errors"] == 0.0


# ------------------------------------------------------------------ config and helpers
def test_config_keys_reach_the_async_settings() -> None:
    plan = rollout_plan(load_config(overrides=[
        "turnpool.collector.mode=async", "turnpool.collector.max_batch=8",
        "turnpool.collector.max_wait_s=0.01", "turnpool.collector.policy_workers=6"]))
    c = plan.collector
    assert c.collector_mode == "async"
    assert c.async_settings == AsyncSettings(max_batch=8, max_wait_s=0.01, policy_workers=6)
    with pytest.raises(ConfigError, match="mode"):
        load_config(overrides=["turnpool.collector.mode=sometimes"])
    with pytest.raises(ConfigError, match="max_batch"):
        rollout_plan(load_config(overrides=["turnpool.collector.max_batch=0"]))


def test_busy_time_union_and_overlap() -> None:
    policy: Sequence[tuple[float, float]] = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]
    env: Sequence[tuple[float, float]] = [(2.5, 5.5), (2.0, 2.2)]
    p, e, both = _busy(list(policy), list(env))
    assert (p, e) == (4.0, pytest.approx(3.2))
    assert both == pytest.approx(0.5 + 0.5 + 0.2)


# ------------------------------------------------------------------ the benchmark harness
def test_bench_rollout_quick_writes_json_and_png(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from turnpool.cli import main

    out, png = tmp_path / "rollout.json", tmp_path / "rollout.png"
    result = CliRunner().invoke(main, ["bench", "rollout", "--quick", "--no-openai",
                                       "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    (row,) = report["rows"]
    assert row["case"] == "scripted" and row["ratio_target"] == 1.0
    assert row["identical"] is True  # both modes produced the same trajectories
    assert row["lockstep"]["wall_s"] > 0 and row["asynchronous"]["wall_s"] > 0
    assert row["asynchronous"]["calls"] > 0
    assert row["extra"]["backend"] == "process"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "async/max" in result.output


def test_sleep_policy_is_serial_and_passes_replies_through() -> None:
    from turnpool.bench.rollout import SleepPolicy

    inner = make_policy({"name": "random", "seed": 4})
    policy = SleepPolicy(inner, per_request_s=0.0, per_call_s=0.0)
    ctx = TurnContext(env_id=0, env_type="cpu", env_kwargs={}, obs="t=0", action_names=None,
                      turn=0, actions_left=3, max_actions_per_turn=1, action_sep="||",
                      enable_think=False, seed=1, tag="cpu")
    assert policy.generate([[]], [ctx]) == inner.generate([[]], [ctx])
    assert (policy.stats.calls, policy.stats.requests) == (1, 1)
