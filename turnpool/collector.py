"""TrajectoryCollector: the multi-turn loop between a policy and an EnvPool.

Each turn, the envs still running get one batched ``policy.generate`` call; their replies are
parsed into actions (`turnpool.managers.plan_turn`) and executed by ``pool.step_turns`` (one
message per worker), and the results are recorded (`turnpool.managers.apply_turn`). Finished
envs are neither generated for nor stepped. The loop ends after ``max_turn`` turns or when
every env is done. With ``collector_mode="async"`` (config ``turnpool.collector.mode``) the
same turn logic runs per env, overlapping generation with env steps
(`turnpool.collector_async`).

Sampling:

* vanilla: one batch (one reset of the pool) is the result;
* dynamic (``algorithm.filter_groups.enable``, DAPO / dynamic GiGPO): batches are drawn with
  fresh seeds and groups whose episode rewards are all equal are dropped, until exactly
  ``target_groups`` groups are kept. Surplus groups of the last batch are discarded, so the
  result never overshoots. When ``max_num_gen_batches`` batches are spent first,
  ``on_budget_exhausted`` decides: ``raise`` (`BudgetExhausted`), ``keep_all`` (fill the batch
  with dropped groups, oldest first) or ``return_short``. Counts are in the metrics.

Scores follow RAGEN (see `turnpool.rewards`); the group filter reads the unpenalized,
unnormalized sums. GiGPO step groups: every turn gets ``step_group_uid``, equal for turns of
one group whose ``anchor_obs`` are equal.

Seeds (RAGEN's scheme): train batches use ``seed_base + counter`` and the counter advances by
the number of groups, so batches never share a seed; an explicit ``collect(seed=s)`` moves the
counter past ``s``'s block (RAGEN restarted at ``s + 1``, overlapping it). Val batches always
use ``seed_base``.

Example:
    >>> from turnpool.collector import TrajectoryCollector
    >>> with TrajectoryCollector.from_config(overrides=[
    ...         "es_manager.train.env_groups=2", "es_manager.train.env_configs.n_groups=[2]",
    ...         "es_manager.train.group_size=2", "turnpool.backend=sequential"]) as col:
    ...     batch = col.collect()
    >>> len(batch.trajectories), sorted(batch.metrics)[:1]
    (4, ['SimpleSokoban/errors'])
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from turnpool.collector_async import AsyncSettings, play_async
from turnpool.managers import (
    EnvPrompt,
    EpisodeState,
    TagSpec,
    TurnOutcome,
    TurnPlan,
    TurnSettings,
    apply_turn,
    build_messages,
    make_env_prompt,
    plan_turn,
    start_episode,
)
from turnpool.policies.base import Message, Policy, TurnContext
from turnpool.rewards import compute_scores
from turnpool.trajectory import Trajectory, write_jsonl

log = logging.getLogger(__name__)


class BudgetExhausted(RuntimeError):
    """Dynamic sampling spent ``max_num_gen_batches`` before enough groups had varied rewards."""

    def __init__(self, kept: int, target: int, batches: int) -> None:
        self.kept, self.target, self.batches = kept, target, batches
        super().__init__(f"dynamic sampling kept {kept} of {target} groups after {batches} "
                         f"generation batches (algorithm.filter_groups.max_num_gen_batches); "
                         f"set turnpool.collector.on_budget_exhausted to keep_all or "
                         f"return_short to accept fewer varied groups")


@dataclass(frozen=True)
class CollectorSettings:
    """How trajectories are collected (``agent_proxy``, ``algorithm.filter_groups``, ...)."""

    max_turn: int = 5
    turn: TurnSettings = field(default_factory=TurnSettings)
    grouping: str = "state"
    method: str = "identity"
    use_turn_scores: bool = False
    filter_groups: bool = False
    max_num_gen_batches: int = 10
    on_budget_exhausted: str = "raise"
    target_groups: int | None = None
    seed_base: int | None = 10000
    mode: str = "train"
    #: "lockstep" (one batched policy call per turn) or "async" (`turnpool.collector_async`)
    collector_mode: str = "lockstep"
    async_settings: AsyncSettings = field(default_factory=AsyncSettings)


@dataclass
class RolloutBatch:
    """What `TrajectoryCollector.collect` returns: trajectories (group members adjacent) and
    metrics (per tag ``{tag}/success``, ``{tag}/pass@{k}``, ...; ``timing/...``;
    ``dynamic/...``)."""

    trajectories: list[Trajectory]
    metrics: dict[str, float]

    def to_jsonl(self, dest: str | Path | IO[str]) -> int:
        """Write the trajectories as canonical JSONL; returns the number of lines."""
        return write_jsonl(self.trajectories, dest)


@dataclass
class _Clock:
    env_s: float = 0.0
    reset_s: float = 0.0
    policy_s: float = 0.0
    turn_s: float = 0.0
    overlap_s: float = 0.0
    turns: int = 0
    env_steps: int = 0
    batches: int = 0


class TrajectoryCollector:
    """Runs ``policy`` against ``pool`` and returns scored trajectories.

    ``tags`` describe the pool's blocks in order (env type, kwargs, action budget, prompt
    texts); without them, they are read from the pool's own specs with defaults.
    """

    def __init__(self, pool: Any, policy: Policy, tags: Sequence[TagSpec] | None = None,
                 settings: CollectorSettings | None = None, *, owns_pool: bool = False,
                 owns_policy: bool = False) -> None:
        self.pool = pool
        self.policy = policy
        self.settings = settings or CollectorSettings()
        self._owns_pool, self._owns_policy = owns_pool, owns_policy
        self._closed = False
        self.tags = list(tags) if tags is not None else _tags_from_pool(pool)
        self.group_size = int(pool.group_n)
        self.n_groups = int(pool.n_groups)
        prompts = {t.tag: make_env_prompt(t, self.settings.turn) for t in self.tags}
        missing = sorted(set(pool.tags) - set(prompts))
        if missing:
            raise ValueError(f"the pool has tags {missing} that no TagSpec describes")
        self._prompt_of: list[EnvPrompt] = [prompts[t] for t in pool.tags]
        self._seed_counter = 0
        self._clock = _Clock()
        self.on_turn: Callable[[int, int, int], None] | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: Any = None, mode: str = "train", policy: Policy | None = None,
                    overrides: Sequence[str] = ()) -> TrajectoryCollector:
        """Build pool, policy and collector from a config (a path, a loaded config or None
        for the packaged defaults). The collector owns and closes what it built."""
        from omegaconf import DictConfig

        from turnpool.config import load_config, rollout_plan
        from turnpool.policies import make_policy

        if not isinstance(cfg, DictConfig):
            cfg = load_config(cfg, overrides)
        elif overrides:
            raise ValueError("overrides apply to a config path, not a loaded config")
        plan = rollout_plan(cfg, mode)
        pool = build_pool(plan.tags, plan.group_size, plan.pool, seed=plan.seed_base or 0)
        try:
            pol = make_policy(plan.policy) if policy is None else policy
            return cls(pool, pol, plan.tags, settings_from_plan(plan), owns_pool=True,
                       owns_policy=policy is None)
        except Exception:
            pool.close()
            raise

    # ------------------------------------------------------------------ public API
    def collect(self, seed: int | None = None) -> RolloutBatch:
        """One rollout batch: vanilla, or dynamic sampling when ``filter_groups`` is on."""
        self._clock = _Clock()
        s = self.settings
        if s.filter_groups:
            groups, dyn = self._dynamic(seed)
        else:
            groups, dyn = self._groups_of(self._run_batch(self._next_seed(seed), 0)), {}
        trajectories = [t for g in groups for t in g]
        self._score(trajectories)
        metrics = self._metrics(trajectories)
        metrics.update(dyn)
        return RolloutBatch(trajectories, metrics)

    def close(self) -> None:
        """Close what the collector built (pool, policy). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._owns_pool:
                self.pool.close()
        finally:
            if self._owns_policy:
                self.policy.close()

    def __enter__(self) -> TrajectoryCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ seeds
    def _next_seed(self, seed: int | None) -> int:
        s = self.settings
        base = s.seed_base if s.seed_base is not None else 0
        if s.mode == "val":
            return base if seed is None else int(seed)
        if seed is None:
            out = base + self._seed_counter
            self._seed_counter += self.n_groups
            return out
        self._seed_counter = int(seed) - base + self.n_groups
        return int(seed)

    # ------------------------------------------------------------------ the loop
    def _run_batch(self, seed: int, gen_batch: int) -> list[EpisodeState]:
        """Reset the pool and play up to ``max_turn`` turns."""
        t0 = time.perf_counter()
        obs, infos = self.pool.reset(seed=seed)
        self._clock.reset_s += time.perf_counter() - t0
        self._clock.batches += 1
        gids = self.pool.group_ids
        eps = [start_episode(self._prompt_of[i], i, gids[i], seed + gids[i], obs[i], infos[i])
               for i in range(self.pool.num_envs)]
        for ep in eps:
            ep.gen_batch = gen_batch
        if self.settings.collector_mode == "async":
            self._play_async(eps, gen_batch)
            return eps
        for turn in range(self.settings.max_turn):
            active = [ep for ep in eps if not ep.done]
            if not active:
                break
            self.play_turn(active)
            if self.on_turn is not None:
                self.on_turn(gen_batch, turn, len(active))
        return eps

    def play_turn(self, active: Sequence[EpisodeState]) -> None:
        """One turn for ``active`` envs: generate, plan, step, record.

        Every env-side decision is in `plan_turn`/`apply_turn`, so a loop that sends envs
        back to the policy as their steps return can reuse this with any subset of envs.
        """
        start = time.perf_counter()
        messages, contexts = self.prompts(active)
        t0 = time.perf_counter()
        replies = self.policy.generate(messages, contexts)
        self._clock.policy_s += time.perf_counter() - t0
        plans = self.plan_replies(active, replies)
        run = [k for k, p in enumerate(plans) if p.to_execute]
        results: list[Any] = [None] * len(active)
        if run:
            t0 = time.perf_counter()
            stepped = self.pool.step_turns([list(plans[k].to_execute) for k in run],
                                           [active[k].env_id for k in run])
            self._clock.env_s += time.perf_counter() - t0
            for k, r in zip(run, stepped):
                results[k] = r
        for ep, plan, result in zip(active, plans, results):
            self.record_turn(ep, plan, result)
        self._clock.turns += 1
        self._clock.turn_s += time.perf_counter() - start

    def prompts(self, active: Sequence[EpisodeState]
                ) -> tuple[list[list[Message]], list[TurnContext]]:
        """What the policy gets for ``active``: their chats and contexts."""
        s = self.settings.turn
        return [build_messages(ep, s) for ep in active], [self._context(ep) for ep in active]

    def plan_replies(self, active: Sequence[EpisodeState], replies: Sequence[str]
                     ) -> list[TurnPlan]:
        """Parse one reply per env into what its turn executes."""
        if len(replies) != len(active):
            raise RuntimeError(f"policy returned {len(replies)} replies for {len(active)} "
                               f"conversations")
        s = self.settings.turn
        return [plan_turn(ep, r, s) for ep, r in zip(active, replies)]

    def record_turn(self, ep: EpisodeState, plan: TurnPlan, result: Any) -> None:
        """Record ``ep``'s turn from the pool's `TurnResult` (None: nothing was executed)."""
        outcome = None
        if result is not None:
            outcome = TurnOutcome(obs=result.obs, reward=result.reward_sum,
                                  terminated=result.terminated, truncated=result.truncated,
                                  info=dict(result.info), n_executed=result.n_executed,
                                  error=result.error)
            self._clock.env_steps += int(result.n_executed)
        apply_turn(ep, plan, outcome, self.settings.turn)

    def _play_async(self, eps: list[EpisodeState], gen_batch: int) -> None:
        on_turn = self.on_turn
        timing = play_async(self, eps, self.settings.async_settings,
                            None if on_turn is None
                            else lambda turn, running: on_turn(gen_batch, turn, running))
        c = self._clock
        c.policy_s += timing.policy_s
        c.env_s += timing.env_s
        c.overlap_s += timing.overlap_s
        c.turn_s += timing.wall_s
        c.turns += timing.calls

    def _context(self, ep: EpisodeState) -> TurnContext:
        s = self.settings.turn
        spec = ep.prompt.spec
        names = list(ep.prompt.valid_names) if ep.prompt.valid_names else None
        return TurnContext(env_id=ep.env_id, env_type=spec.env_type,
                           env_kwargs=dict(spec.env_kwargs), obs=ep.state, action_names=names,
                           turn=len(ep.turns), actions_left=ep.actions_left,
                           max_actions_per_turn=s.max_actions_per_turn,
                           action_sep=s.action_sep, enable_think=s.enable_think,
                           seed=ep.seed, tag=spec.tag)

    # ------------------------------------------------------------------ sampling
    def _groups_of(self, eps: list[EpisodeState]) -> list[list[Trajectory]]:
        groups: dict[int, list[Trajectory]] = {}
        for ep in eps:
            groups.setdefault(ep.group_id, []).append(self._trajectory(ep))
        return list(groups.values())

    def _dynamic(self, seed: int | None) -> tuple[list[list[Trajectory]], dict[str, float]]:
        s = self.settings
        target = s.target_groups if s.target_groups is not None else self.n_groups
        if target < 1:
            raise ValueError(f"target_groups must be >= 1, got {target}")
        kept: list[list[Trajectory]] = []
        dropped: list[list[Trajectory]] = []
        surplus = 0
        batches = 0
        for b in range(s.max_num_gen_batches):
            batches += 1
            for group in self._groups_of(self._run_batch(self._next_seed(seed if b == 0
                                                                          else None), b)):
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
            policy = s.on_budget_exhausted
            if policy == "raise":
                raise BudgetExhausted(len(kept), target, batches)
            if policy == "keep_all":
                filled = min(target - len(kept), len(dropped))
                kept.extend(dropped[:filled])
            elif policy != "return_short":
                raise ValueError(f"unknown on_budget_exhausted {policy!r}")
            log.warning("dynamic sampling: %d of %d groups vary after %d batches (%s)",
                        len(kept) - filled, target, batches, policy)
        metrics = {"dynamic/gen_batches": float(batches), "dynamic/target_groups": float(target),
                   "dynamic/kept_groups": float(len(kept) - filled),
                   "dynamic/dropped_groups": float(len(dropped)),
                   "dynamic/surplus_groups": float(surplus),
                   "dynamic/filled_groups": float(filled),
                   "dynamic/returned_groups": float(len(kept))}
        return kept, metrics

    # ------------------------------------------------------------------ results
    def _trajectory(self, ep: EpisodeState) -> Trajectory:
        full = dataclasses.replace(self.settings.turn, max_context_window=-1)
        gen_batch = ep.gen_batch
        group_uid = f"{gen_batch}-{ep.group_id}"
        for turn in ep.turns:
            turn.step_group_uid = step_group_uid(group_uid, turn.anchor_obs)
        end = ep.end_reason if ep.done else "max_turn"
        return Trajectory(
            env_id=ep.env_id, group_id=ep.group_id, group_uid=group_uid, tag=ep.tag,
            env_type=ep.prompt.spec.env_type, seed=ep.seed,
            messages=build_messages(ep, full, for_update=True), turns=list(ep.turns),
            final_state=ep.state, num_actions=ep.num_actions, penalty=ep.penalty,
            success=ep.success, terminated=ep.terminated, truncated=ep.truncated,
            end_reason=end, error=ep.error, score=sum(t.reward for t in ep.turns),
            gen_batch=gen_batch)

    def _score(self, trajectories: list[Trajectory]) -> None:
        s = self.settings
        if not trajectories:
            return
        scores = compute_scores([t.rewards for t in trajectories],
                                [t.penalty for t in trajectories],
                                [t.group_uid for t in trajectories],
                                [t.tag for t in trajectories], s.grouping, s.method)
        for t, orig, norm in zip(trajectories, scores.original, scores.normalized):
            t.score = orig
            # RAGEN normalizes (and adds the penalty) only for end-of-episode scores.
            t.normalized_score = orig if s.use_turn_scores else norm

    def _metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        m: dict[str, float] = {}
        by_tag: dict[str, list[Trajectory]] = {}
        for t in trajectories:
            by_tag.setdefault(t.tag, []).append(t)
        for tag, ts in by_tag.items():
            n = len(ts)
            groups: dict[str, list[Trajectory]] = {}
            for t in ts:
                groups.setdefault(t.group_uid, []).append(t)
            turns = [turn for t in ts for turn in t.turns]
            # An unparseable reply counts as one invalid action.
            proposed = sum(max(1, len(turn.actions)) for turn in turns)
            valid = sum(turn.n_valid for turn in turns)
            m[f"{tag}/success"] = sum(t.success for t in ts) / n
            m[f"{tag}/pass@{self.group_size}"] = (
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
        c = self._clock
        m["errors"] = float(sum(t.error is not None for t in trajectories))
        m["trajectories"] = float(len(trajectories))
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


def step_group_uid(group_uid: str, anchor_obs: str) -> str:
    """GiGPO step group: same episode group and same anchor state -> same uid."""
    digest = hashlib.sha256(anchor_obs.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{group_uid}/{digest}"


def settings_from_plan(plan: Any) -> CollectorSettings:
    """`CollectorSettings` from a `turnpool.config.RolloutPlan`."""
    return CollectorSettings(
        max_turn=plan.max_turn, turn=plan.turn, grouping=plan.grouping, method=plan.method,
        use_turn_scores=plan.use_turn_scores, filter_groups=plan.filter_groups,
        max_num_gen_batches=plan.max_num_gen_batches,
        on_budget_exhausted=plan.on_budget_exhausted, target_groups=plan.target_groups,
        seed_base=plan.seed_base, mode=plan.mode, collector_mode=plan.collector_mode,
        async_settings=plan.async_settings)


def build_pool(tags: Sequence[TagSpec], group_size: int, pool_settings: Any,
               seed: int = 0) -> Any:
    """An `EnvPool` laid out like RAGEN's ``es_manager`` (tags in order, ``n_groups`` each)."""
    from turnpool.backends import BACKENDS
    from turnpool.pool import EnvGroupSpec, EnvPool

    ps = pool_settings
    backend = ps.backend
    if backend not in BACKENDS:
        if backend == "auto":
            # Text envs step in microseconds; in-process is the fast choice until the pool
            # can measure env cost itself.
            backend = "sequential"
        else:
            raise ValueError(f"unknown backend {backend!r}; choose from auto, "
                             f"{', '.join(BACKENDS)}")
    specs = [EnvGroupSpec(t.tag, t.env_type, t.n_groups, dict(t.env_kwargs)) for t in tags]
    kwargs: dict[str, Any] = {"backend": backend, "num_workers": ps.num_workers,
                              "step_timeout": ps.step_timeout, "on_error": ps.on_error,
                              "fallback": ps.fallback}
    if ps.mp_context is not None:
        kwargs["mp_context"] = ps.mp_context
    if ps.ray_address is not None:
        kwargs["ray_address"] = ps.ray_address
    kwargs.update(getattr(ps, "options", {}) or {})
    return EnvPool.from_specs(specs, group_n=group_size, seed=seed, **kwargs)


def _tags_from_pool(pool: Any) -> list[TagSpec]:
    specs = getattr(pool, "specs", None)
    if not specs:
        raise ValueError("pass tags=[TagSpec(...)] for a pool without specs")
    return [TagSpec(tag=s.tag, env_type=s.env_type, n_groups=s.n_groups,
                    env_kwargs=dict(s.env_kwargs)) for s in specs]
