"""TrajectoryCollector: the multi-turn loop between a policy and an EnvPool.

Each turn, the envs still running get one batched ``policy.generate`` call through a
`turnpool.rollout.episode.TurnRunner`: their replies are parsed into actions (``plan_turn``),
executed by ``pool.step_turns`` (one message per worker), and the results recorded
(``apply_turn``). Finished envs are neither generated for nor stepped. The loop ends after
``max_turn`` turns or when every env is done. With ``collector_mode="async"`` (config
``turnpool.collector.mode``) the same turn logic runs per env, overlapping generation with env
steps (`turnpool.rollout.async_driver`); with a tree mode (``turnpool.collector.tree``) each
group is played as a tree (`turnpool.rollout.tree`). The driver is chosen once, at
construction (`turnpool.rollout.settings.CollectorSettings.driver`).

Sampling:

* vanilla: one batch (one reset of the pool) is the result;
* dynamic (``algorithm.filter_groups.enable``, DAPO / dynamic GiGPO): batches are drawn with
  fresh seeds until exactly ``target_groups`` groups with varied rewards are kept
  (`turnpool.rollout.sampling`: ``max_num_gen_batches``, ``on_budget_exhausted``). Counts are
  in the metrics.

Failures: an episode that failed (its env raised, timed out or lost its worker, or the policy
gave no reply for it; the class is in ``info["failure"]``) is never scored, since a reward-0
sample would bias its group's baseline. A retryable failure is played again from the same
seed, at most ``episode_retries`` times; a group that still holds a failed episode is dropped
whole. The metrics count ``failures/<class>`` (every failed attempt), ``failures/retried``,
``failures/dropped_groups`` and ``failures/unrecovered_fraction`` (episodes that failed for
good over episodes started); a policy whose endpoint cannot be reached at all raises
`turnpool.policies.base.PolicyUnreachable` instead.

Scores follow RAGEN (see `turnpool.rollout.scoring`); the group filter reads the unpenalized,
unnormalized sums. GiGPO step groups: every turn gets ``step_group_uid``, equal for turns of
one group whose ``anchor_obs`` are equal.

Token level: with a policy that reports tokens (`turnpool.policies.base.TokenPolicy`, e.g.
``hf``), the lock-step loop hands each episode's token sequence so far to
``generate_tokens`` and records prompt/response ids and log-probabilities on every turn
(`turnpool.rollout.trajectory.Turn`, `Trajectory.token_view`). With ``max_context_window > 0``
each turn is a whole prompt of its own. The async driver records text only.

Seeds follow `turnpool.rollout.episode.SeedSchedule` (``seed_base``, ``mode``); each
trajectory records the seed the pool gave its env.

Record: `TrajectoryCollector.record_to` writes every episode attempt's env transitions (seed,
actions sent, what the pool returned) to a `turnpool.rollout.record.Recorder`, in both modes;
`turnpool.rollout.replay` re-runs and compares them.

Example:
    >>> from turnpool.policies import make_policy
    >>> from turnpool.pool import EnvPool
    >>> from turnpool.rollout.collector import TrajectoryCollector
    >>> from turnpool.rollout.settings import CollectorSettings
    >>> pool = EnvPool("bandit", env_num=2, group_n=2, backend="sequential")
    >>> with TrajectoryCollector(pool, make_policy({"name": "oracle"}),
    ...                          settings=CollectorSettings(max_turn=2), owns_pool=True) as col:
    ...     batch = col.collect()
    >>> len(batch.trajectories), sorted(batch.metrics)[:1]
    (4, ['bandit/errors'])
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from turnpool.policies import make_policy
from turnpool.policies.base import Message, Policy, TokenPolicy, TokenTurn, TurnContext
from turnpool.pool import EnvGroupSpec, EnvPool
from turnpool.rollout.async_driver import play_async
from turnpool.rollout.batch import RolloutBatch
from turnpool.rollout.episode import (
    EpisodeState,
    SeedSchedule,
    TurnRunner,
    start_episode,
    start_episodes,
    step_plans,
)
from turnpool.rollout.metrics import Clock, batch_metrics
from turnpool.rollout.prompts import build_messages, env_prompts
from turnpool.rollout.record import Recorder, record_header
from turnpool.rollout.sampling import dynamic_groups
from turnpool.rollout.scoring import compute_scores
from turnpool.rollout.seats import num_seats, play_games, seat_runners
from turnpool.rollout.settings import CollectorSettings, RolloutPlan, TagSpec
from turnpool.rollout.trajectory import (
    Trajectory,
    completion_tokens,
    step_group_uid,
    token_prefix,
)
from turnpool.rollout.tree import TreeTally, check_tree, group_uid, play_tree
from turnpool.worker.failures import FAILURE_CLASSES, Failure

log = logging.getLogger(__name__)


class TrajectoryCollector:
    """Runs ``policy`` against ``pool`` and returns scored trajectories.

    ``tags`` describe the pool's blocks in order (env type, kwargs, action budget, prompt
    texts); without them, they are read from the pool's own specs with defaults.
    """

    def __init__(self, pool: EnvPool, policy: Policy, tags: Sequence[TagSpec] | None = None,
                 settings: CollectorSettings | None = None, *, owns_pool: bool = False,
                 owns_policy: bool = False, seat_policies: Mapping[int, Policy] | None = None
                 ) -> None:
        self.pool = pool
        self.policy = policy
        self.settings = s = settings or CollectorSettings()
        self._owns_pool, self._owns_policy = owns_pool, owns_policy
        self._closed = False
        self.tags = list(tags) if tags is not None else _tags_from_pool(pool)
        check_tree(s.tree, pool)
        self.group_size = int(pool.group_n)
        self.n_groups = int(pool.n_groups)
        self._prompt_of = env_prompts(self.tags, pool.tags, s.turn)
        self.seeds = SeedSchedule(s.seed_base, self.n_groups, s.mode)
        self.turns = TurnRunner(policy, s.turn)
        #: multi-player games: the policy of each seat that is not played by ``policy``
        self.seat_policies = dict(seat_policies or {})
        self._clock = Clock()
        #: generation batches played by every `collect` call so far (a run of several calls
        #: passes it as the next call's ``first_gen_batch``)
        self.gen_batches = 0
        self._first_gen_batch = 0
        self._failures: Counter[str] = Counter()
        self._first_error: str | None = None
        self._trees = TreeTally()
        self.on_turn: Callable[[int, int, int], None] | None = None
        self.recorder: Recorder | None = None
        # the driver, chosen once: a tree plays whole groups, the others retry failed episodes
        self._play_batch = self._play_tree if s.driver == "tree" else self._play_retried
        self._play_episodes = self._play_async if s.driver == "async" else self._play_lockstep

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_plan(cls, plan: RolloutPlan, policy: Policy | None = None) -> TrajectoryCollector:
        """Build pool, policy (unless given) and collector from a `RolloutPlan`. The
        collector owns and closes what it built."""
        pool = build_pool(plan.tags, plan.group_size, plan.pool,
                          seed=plan.collector.seed_base or 0)
        try:
            pol = make_policy(plan.policy) if policy is None else policy
            return cls(pool, pol, plan.tags, plan.collector, owns_pool=True,
                       owns_policy=policy is None)
        except Exception:
            pool.close()
            raise

    # ------------------------------------------------------------------ public API
    def collect(self, seed: int | None = None, *, first_gen_batch: int = 0) -> RolloutBatch:
        """One rollout batch: vanilla, or dynamic sampling when ``filter_groups`` is on.
        ``first_gen_batch`` numbers its first generation batch (``gen_batch``, the head of
        every ``group_uid`` and tree node id): a run of several calls passes `gen_batches`
        so that no two of its batches share a group id; 0 keeps every call's output the same
        for the same seed."""
        self._first_gen_batch = int(first_gen_batch)
        self._clock = Clock()
        self._failures = Counter()
        self._first_error = None
        self._trees = TreeTally()
        s = self.settings
        try:
            if s.filter_groups:
                groups, dyn = self._dynamic(seed)
            else:
                groups, dyn = self._groups_of(self._run_batch(self.seeds.next(seed), 0)), {}
        finally:
            self.gen_batches += self._clock.batches
        trajectories = [t for g in groups for t in g]
        self._score(trajectories)
        metrics = batch_metrics(trajectories, self.group_size, self._clock,
                                v2=self.settings.turn.ragen_version == "v2")
        metrics.update(dyn)
        metrics.update(self._failure_metrics())
        if s.driver != "tree":
            return RolloutBatch(trajectories, metrics, first_error=self._first_error)
        nodes, tree_metrics = self._trees.finish(groups)
        metrics.update(tree_metrics)
        return RolloutBatch(trajectories, metrics, nodes, self._first_error)

    def record_to(self, recorder: Recorder | None) -> None:
        """From now on, write every episode attempt's env transitions to ``recorder`` (None:
        stop); `record_header` gives its header line. Lock-step and async record through the
        same hook (`TurnRunner.record`), retried and failed attempts included."""
        if recorder is not None:
            self._check_recordable()
        self.recorder = recorder
        self.turns.sink = recorder

    def record_header(self, version: str) -> dict[str, Any]:
        """The header line of a record of this collector's runs (`turnpool.rollout.record`);
        ``version``: the turnpool version that writes it."""
        self._check_recordable()
        s = self.settings
        return record_header(self.pool.specs, group_n=self.group_size,
                             collector_mode=s.collector_mode,
                             ragen_version=s.turn.ragen_version, max_turn=s.max_turn,
                             max_actions_per_turn=s.turn.max_actions_per_turn,
                             version=version)

    def _check_recordable(self) -> None:
        if self.settings.driver == "tree":
            raise ValueError("a tree rollout cannot be recorded: its branches put envs into "
                             "other envs' states mid-episode, which a replay from seeds does "
                             "not see (set turnpool.collector.tree.mode=none to record)")

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

    # ------------------------------------------------------------------ the loop
    def _run_batch(self, seed: int, gen_batch: int) -> list[EpisodeState]:
        """Reset the pool and play up to ``max_turn`` turns; ``gen_batch`` counts within this
        `collect` call, from its ``first_gen_batch``."""
        gen_batch += self._first_gen_batch
        t0 = time.perf_counter()
        obs, infos = self.pool.reset(seed=seed)
        self._clock.reset_s += time.perf_counter() - t0
        self._clock.batches += 1
        eps = start_episodes(self.pool, self._prompt_of, obs, infos)
        for ep in eps:
            ep.gen_batch = gen_batch
        if num_seats(infos) > 1:
            return self._play_seats(eps, infos, gen_batch)
        if self.recorder is not None:  # never set on a tree collector (_check_recordable)
            self.recorder.begin(eps, obs, infos, attempt=0)
        return self._play_batch(eps, seed, gen_batch)

    def _play_retried(self, eps: list[EpisodeState], seed: int, gen_batch: int
                      ) -> list[EpisodeState]:
        """Play the batch's episodes (lock-step or async), then retry the failed ones."""
        self._play_episodes(eps, gen_batch)
        if self.recorder is not None:
            self.recorder.finish(eps)
        self._failures["started"] += len(eps)
        return self._retry_failed(eps, seed, gen_batch)

    def _play_tree(self, eps: list[EpisodeState], seed: int, gen_batch: int
                   ) -> list[EpisodeState]:
        """Play the batch's groups as trees (`turnpool.rollout.tree`); no retries there.
        Every failed candidate is counted, the ones a branch later replaced too."""
        self._count_failures(eps)  # failed resets
        run = play_tree(self.pool, eps, self.settings, self.play_turn, gen_batch=gen_batch,
                        reset_seed=seed, on_turn=self.on_turn)
        self._trees.add(run)
        self._clock.env_steps += run.env_steps
        self._failures["started"] += len(run.episodes)
        self._failures.update(run.failures)
        return run.episodes

    def _play_seats(self, eps: list[EpisodeState], infos: Sequence[Mapping[str, Any]],
                    gen_batch: int) -> list[EpisodeState]:
        """Multi-player games, every seat played (`turnpool.rollout.seats.play_games`)."""
        s, on_turn = self.settings, self.on_turn
        seats, steps = play_games(
            self.pool, eps, infos, seat_runners(self.turns, self.seat_policies, s.turn), s,
            recording=self.recorder is not None,
            on_turn=None if on_turn is None else lambda t, n: on_turn(gen_batch, t, n))
        self._clock.env_steps += steps
        self._failures["started"] += len(seats)
        self._count_failures(seats)
        return seats

    def _play_lockstep(self, eps: list[EpisodeState], gen_batch: int) -> None:
        """Play freshly reset episodes to their end (or ``max_turn``): every active episode
        in one batched policy call per turn."""
        for turn in range(self.settings.max_turn):
            active = [ep for ep in eps if not ep.done]
            if not active:
                break
            self.play_turn(active)
            if self.on_turn is not None:
                self.on_turn(gen_batch, turn, len(active))
        self._clock.env_steps += sum(ep.num_actions for ep in eps)

    def _retry_failed(self, eps: list[EpisodeState], seed: int, gen_batch: int
                      ) -> list[EpisodeState]:
        """Play retryable failed episodes again from the same seed (bounded); count every
        failed attempt by class."""
        self._count_failures(eps)
        for attempt in range(1, self.settings.episode_retries + 1):
            again = [k for k, ep in enumerate(eps) if ep.error is not None and ep.retryable]
            if not again:
                break
            ids = [eps[k].env_id for k in again]
            obs, infos = self.pool.reset(seed=seed, env_ids=ids)
            seeds, gids = self.pool.env_seeds, self.pool.group_ids
            fresh = [start_episode(self._prompt_of[i], i, gids[i], seeds[i], o, info)
                     for i, o, info in zip(ids, obs, infos)]
            for ep in fresh:
                ep.gen_batch = gen_batch
            log.info("retrying %d failed episode(s) from their seeds", len(fresh))
            if self.recorder is not None:
                self.recorder.begin(fresh, obs, infos, attempt=attempt)
            self._play_episodes(fresh, gen_batch)
            if self.recorder is not None:
                self.recorder.finish(fresh)
            self._failures["retried"] += len(fresh)
            self._count_failures(fresh)
            for k, ep in zip(again, fresh):
                eps[k] = ep
        return eps

    def _count_failures(self, eps: Sequence[EpisodeState]) -> None:
        for ep in eps:
            if ep.error is not None:
                self._failures[Failure.of(ep.failure).value] += 1

    def _failure_metrics(self) -> dict[str, float]:
        f = self._failures
        m = {f"failures/{name}": float(f[name]) for name in (
            *FAILURE_CLASSES, "retried", "dropped_groups", "unrecovered", "started")}
        m["failures/unrecovered_fraction"] = (f["unrecovered"] / f["started"]
                                              if f["started"] else 0.0)
        return m

    def play_turn(self, active: Sequence[EpisodeState]) -> None:
        """One turn for ``active`` envs: generate, plan, step, record."""
        start = time.perf_counter()
        messages, contexts = self.turns.prompts(active)
        t0 = time.perf_counter()
        tokens = self._generate_tokens(active, messages, contexts)
        replies = ([t.text for t in tokens] if tokens is not None
                   else self.turns.generate(messages, contexts))
        self._clock.policy_s += time.perf_counter() - t0
        if tokens is not None and any(t.stop for t in tokens):
            for ep, tok in zip(active, tokens):
                if tok.stop:  # no room for another reply: the episode ends here
                    ep.done, ep.truncated, ep.end_reason = True, True, tok.stop
            keep = [k for k, tok in enumerate(tokens) if not tok.stop]
            active = [active[k] for k in keep]
            tokens = [tokens[k] for k in keep]
            replies = [replies[k] for k in keep]
        plans = self.turns.plan(active, replies)
        t0 = time.perf_counter()
        results = step_plans(self.pool, active, plans, self.settings.turn)
        if any(p.to_execute for p in plans):
            self._clock.env_s += time.perf_counter() - t0
        for ep, plan, result in zip(active, plans, results):
            self.turns.record(ep, plan, result)
        if tokens is not None:
            for ep, tok in zip(active, tokens):
                if not tok.has_ids:
                    continue
                turn = ep.turns[-1]
                turn.prompt_ids, turn.response_ids = list(tok.prompt_ids), list(tok.response_ids)
                turn.logprobs, turn.prompt_extends = list(tok.logprobs), bool(tok.extends)
                turn.token_path = tok.path
        self._clock.turns += 1
        self._clock.turn_s += time.perf_counter() - start

    def _generate_tokens(self, active: Sequence[EpisodeState], messages: list[list[Message]],
                         contexts: list[TurnContext]) -> Sequence[TokenTurn] | None:
        """Token-level generation when the policy supports it (None: it does not)."""
        if not isinstance(self.policy, TokenPolicy):
            return None
        window = self.settings.turn.max_context_window
        prefixes = [token_prefix(ep.turns) if window is None or window <= 0 else None
                    for ep in active]
        limit = self.settings.max_episode_tokens
        if limit is None:
            out = self.policy.generate_tokens(messages, prefixes, contexts)
        else:
            budgets: list[int | None] = [limit - completion_tokens(ep.turns) for ep in active]
            out = self.policy.generate_tokens(  # type: ignore[call-arg]
                messages, prefixes, contexts, budgets=budgets)
        if len(out) != len(active):
            raise RuntimeError(f"policy returned {len(out)} replies for {len(active)} "
                               f"conversations")
        return out

    def _play_async(self, eps: list[EpisodeState], gen_batch: int) -> None:
        """The same, each episode at its own pace in micro-batches
        (`turnpool.rollout.async_driver`)."""
        on_turn = self.on_turn
        timing = play_async(self.turns, self.pool, eps, self.settings.max_turn,
                            self.settings.async_settings,
                            None if on_turn is None
                            else lambda turn, running: on_turn(gen_batch, turn, running),
                            singly=self.settings.turn.ragen_version == "v2")
        c = self._clock
        c.policy_s += timing.policy_s
        c.env_s += timing.env_s
        c.overlap_s += timing.overlap_s
        c.turn_s += timing.wall_s
        c.turns += timing.calls
        c.env_steps += sum(ep.num_actions for ep in eps)

    # ------------------------------------------------------------------ sampling
    def _groups_of(self, eps: list[EpisodeState]) -> list[list[Trajectory]]:
        """The batch's groups, without those that hold a failed episode (dropped whole),
        unless ``failed_groups="keep"``."""
        members: dict[tuple[int, int], list[EpisodeState]] = {}
        for ep in eps:  # a multi-player game's seats form groups of their own
            members.setdefault((ep.group_id, -1 if ep.seat is None else ep.seat), []).append(ep)
        groups: list[list[Trajectory]] = []
        for (group_id, _seat), group in members.items():
            failed = [ep for ep in group if ep.error is not None]
            if failed:
                self._failures["unrecovered"] += len(failed)
                self._first_error = self._first_error or f"{failed[0].failure}: {failed[0].error}"
                if self.settings.failed_groups == "keep":
                    groups.append([self._trajectory(ep) for ep in group])
                    continue
                self._failures["dropped_groups"] += 1
                log.warning("dropping group %d: %d episode(s) failed (%s: %s)", group_id,
                            len(failed), failed[0].failure, failed[0].error)
                continue
            groups.append([self._trajectory(ep) for ep in group])
        return groups

    def _dynamic(self, seed: int | None) -> tuple[list[list[Trajectory]], dict[str, float]]:
        s = self.settings
        return dynamic_groups(
            lambda b: self._groups_of(self._run_batch(self.seeds.next(seed if b == 0 else None),
                                                      b)),
            s.target_groups if s.target_groups is not None else self.n_groups,
            s.max_num_gen_batches, s.on_budget_exhausted)

    # ------------------------------------------------------------------ results
    def _trajectory(self, ep: EpisodeState) -> Trajectory:
        full = dataclasses.replace(self.settings.turn, max_context_window=-1)
        gen_batch = ep.gen_batch
        uid = group_uid(gen_batch, ep.group_id)
        if ep.seat is not None:
            uid = f"{uid}/seat{ep.seat}"
        for turn in ep.turns:
            turn.step_group_uid = step_group_uid(uid, turn.anchor_obs)
        end = ep.end_reason if ep.done else "max_turn"
        return Trajectory(
            env_id=ep.env_id, group_id=ep.group_id, group_uid=uid, tag=ep.tag,
            env_type=ep.prompt.spec.env_type, seed=ep.seed,
            messages=build_messages(ep, full, for_update=True), turns=list(ep.turns),
            final_state=ep.state, num_actions=ep.num_actions, penalty=ep.penalty,
            success=ep.success, terminated=ep.terminated, truncated=ep.truncated,
            end_reason=end, error=ep.error, failure=ep.failure,
            score=sum(t.reward for t in ep.turns),
            gen_batch=gen_batch, chosen=ep.chosen, seat=ep.seat)

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


def build_pool(tags: Sequence[TagSpec], group_size: int,
               pool_options: Mapping[str, Any] | None = None, seed: int = 0) -> EnvPool:
    """An `EnvPool` laid out like RAGEN's ``es_manager`` (tags in order, ``n_groups`` each);
    ``pool_options`` are EnvPool keyword arguments (absent: EnvPool's own defaults)."""
    specs = [EnvGroupSpec(t.tag, t.env_type, t.n_groups, dict(t.env_kwargs), t.member_kwargs)
             for t in tags]
    return EnvPool.from_specs(specs, group_n=group_size, seed=seed, **dict(pool_options or {}))


def _tags_from_pool(pool: EnvPool) -> list[TagSpec]:
    if not pool.specs or not all(isinstance(s.env_type, str) for s in pool.specs):
        raise ValueError("pass tags=[TagSpec(...)] for a pool without specs or built from "
                         "env factories")
    return [TagSpec(tag=s.tag, env_type=str(s.env_type), n_groups=s.n_groups,
                    env_kwargs=dict(s.env_kwargs),
                    member_kwargs=tuple(dict(m) for m in s.member_kwargs)) for s in pool.specs]


__all__ = ["RolloutBatch", "TrajectoryCollector", "build_pool"]
