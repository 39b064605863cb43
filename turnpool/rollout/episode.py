"""An env's episode inside a rollout: its state, the two turn functions, and the seed schedule.

The turn logic is two functions. `plan_turn` is pure: it parses a reply, keeps the valid
actions that fit the action budget and decides the format penalty. `apply_turn` is the only
place an episode changes: it records what the pool returned (`turnpool.pool.TurnResult`, read
by field name). The drivers of LLM episodes (the lock-step collector and the async driver,
through `TurnRunner` and `step_plans`, and the verl agent loop) go through these two, so they
agree on prompts, penalties, budgets and records by construction. RAGEN's ``EnvStateManager``
does not: it is handed actions RAGEN's own context manager already parsed, keeps RAGEN's
rollout-cache rules (``turnpool/ragen/state_manager.py``) and steps the pool directly.

`TurnRunner` bundles the per-turn steps for any subset of episodes (prompts, one
``generate`` call, plans, records); the lock-step loop calls it for every running env at once,
the async driver for whatever micro-batch is ready.

Seeds: `SeedSchedule` is the one place that decides a batch's base seed; the pool gives group
``g`` the seed ``base + g`` and each episode reads its own from ``pool.env_seeds``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from turnpool.policies.base import FailedReply, Message, Policy, TurnContext
from turnpool.pool import EnvPool, TurnResult
from turnpool.rollout.projection import parse_response
from turnpool.rollout.prompts import EnvPrompt, build_messages
from turnpool.rollout.settings import TurnSettings
from turnpool.rollout.trajectory import Turn
from turnpool.worker.failures import FAILURE_CLASSES, failure_of

#: LLM text is hostile: what is stored and replayed into later prompts is capped.
MAX_RESPONSE_CHARS = 32_768


@dataclass
class EpisodeState:
    """One env's episode in the driver: identity, stored history, budget, end state."""

    env_id: int
    group_id: int
    seed: int | None  # None: the reset failed
    prompt: EnvPrompt
    state: str
    anchor_obs: str
    turns: list[Turn] = field(default_factory=list)
    num_actions: int = 0
    penalty: float = 0.0
    done: bool = False
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    end_reason: str = "running"
    error: str | None = None
    #: the failure class of ``error`` (`turnpool.worker.failures.FAILURE_CLASSES`) and whether
    #: playing the episode again from its seed may succeed
    failure: str | None = None
    retryable: bool = False
    gen_batch: int = 0
    #: tree rollouts: whether this episode is its group's chosen path (None: no choice made)
    chosen: bool | None = None
    #: multi-player games (`turnpool.rollout.seats`): the player this episode is (None: the
    #: env has one player)
    seat: int | None = None

    def fail(self, error: str, failure: str) -> None:
        """End the episode as failed (never scored: the collector retries or drops it)."""
        self.done, self.end_reason, self.error = True, "error", error
        self.failure, self.retryable = failure, FAILURE_CLASSES[failure]

    @property
    def tag(self) -> str:
        return self.prompt.spec.tag

    @property
    def actions_left(self) -> int:
        return max(0, self.prompt.spec.max_actions_per_traj - self.num_actions)


@dataclass(frozen=True)
class TurnPlan:
    """What one reply means before the env runs: the parse, and the actions to execute."""

    raw: str
    llm_response: str
    format_valid: bool
    actions: tuple[str, ...]
    valid: tuple[str, ...]
    to_execute: tuple[str, ...]
    penalize: bool
    #: the policy produced no reply for this env (why); nothing runs and the episode fails
    policy_error: str | None = None


def start_episode(
    prompt: EnvPrompt, env_id: int, group_id: int, seed: int | None, obs: str,
    info: Mapping[str, Any],
) -> EpisodeState:
    """An episode after reset. A reset error ends it at once (nothing can be asked of it)."""
    ep = EpisodeState(env_id=env_id, group_id=group_id, seed=seed, prompt=prompt,
                      state=str(obs), anchor_obs=str(info.get("anchor_obs", obs)))
    err = info.get("error")
    if err:
        ep.fail(str(err), failure_of(dict(info)))
    return ep


def plan_turn(ep: EpisodeState, reply: str, settings: TurnSettings) -> TurnPlan:
    """Parse a reply and decide what runs. Never raises on any text."""
    if isinstance(reply, FailedReply):
        return TurnPlan(raw="", llm_response="", format_valid=False, actions=(), valid=(),
                        to_execute=(), penalize=False,
                        policy_error=str(reply.error)[:MAX_RESPONSE_CHARS] or "policy failed")
    raw = reply[:MAX_RESPONSE_CHARS] if isinstance(reply, str) else ""
    parsed = parse_response(raw, settings.action_sep, settings.max_actions_per_turn,
                            settings.enable_think)
    if not parsed.format_valid:
        return plan_actions(ep, (), raw=raw, llm_response=raw, format_valid=False)
    return plan_actions(ep, parsed.actions, raw=raw, llm_response=parsed.text,
                        format_valid=True)


def plan_actions(
    ep: EpisodeState, actions: Sequence[str], *, raw: str = "", llm_response: str = "",
    format_valid: bool = True,
) -> TurnPlan:
    """Decide what runs from already-parsed action strings (RAGEN's manager rules).

    Actions outside a discrete env's action set are dropped before the env sees them, those
    past the remaining action budget are cut silently, and a turn with any invalid action or
    no valid action at all costs one format penalty (once per turn, however many were bad).
    """
    acts = tuple(str(a) for a in actions)
    names = ep.prompt.valid_names
    if names is None:
        valid = acts
    else:
        by_lower = {n.lower(): n for n in names}
        valid = tuple(by_lower[a.strip().lower()] for a in acts if a.strip().lower() in by_lower)
    penalize = len(valid) != len(acts) or not valid
    return TurnPlan(raw=raw, llm_response=llm_response, format_valid=format_valid,
                    actions=acts, valid=valid, to_execute=valid[: ep.actions_left],
                    penalize=penalize)


def apply_turn(
    ep: EpisodeState, plan: TurnPlan, outcome: TurnResult | None, settings: TurnSettings
) -> Turn:
    """Record one turn into the episode (``outcome`` is None when nothing was executed)."""
    info: dict[str, Any] = {}
    reward, n_exec, error = 0.0, 0, None
    env_done = False
    if outcome is not None:
        info = {k: v for k, v in outcome.info.items() if k != "anchor_obs"}
        reward, n_exec, error = float(outcome.reward_sum), int(outcome.n_executed), outcome.error
        env_done = bool(outcome.terminated or outcome.truncated)
    # Free-text envs (countdown, webshop, ...) judge validity themselves.
    env_rejected = n_exec > 0 and info.get("action_is_valid") is False
    penalize = plan.penalize or env_rejected
    if penalize:
        ep.penalty += settings.format_penalty
    turn = Turn(state=ep.state, actions_left=ep.actions_left, anchor_obs=ep.anchor_obs,
                llm_raw_response=plan.raw, llm_response=plan.llm_response,
                format_valid=plan.format_valid, actions=list(plan.actions),
                n_valid=max(0, len(plan.valid) - int(env_rejected)),
                executed=list(plan.to_execute[:n_exec]), reward=reward, penalized=penalize,
                info=info, error=error)
    ep.turns.append(turn)
    ep.num_actions += n_exec
    if outcome is not None:
        ep.state = str(outcome.obs)
        ep.anchor_obs = str(outcome.info.get("anchor_obs", outcome.obs))
    if plan.policy_error is not None:
        turn.error = plan.policy_error
        ep.fail(plan.policy_error, "policy_error")
    elif error:
        ep.fail(str(error), failure_of(outcome.info) if outcome is not None else "env_error")
    elif env_done:
        ep.done, ep.success = True, bool(info.get("success", False))
        ep.terminated, ep.truncated = bool(outcome and outcome.terminated), bool(
            outcome and outcome.truncated and not outcome.terminated)
        ep.end_reason = "terminated" if ep.terminated else "truncated"
    elif ep.num_actions >= ep.prompt.spec.max_actions_per_traj:
        ep.done, ep.truncated, ep.end_reason = True, True, "action_budget"
    turn.done = ep.done
    return turn


def start_episodes(pool: EnvPool, prompts: Sequence[EnvPrompt], obs: Sequence[str],
                   infos: Sequence[Mapping[str, Any]]) -> list[EpisodeState]:
    """One episode per env after ``pool.reset``; seeds come from the pool itself (an env
    whose reset failed has none, and its episode ends at once with the error)."""
    seeds, gids = pool.env_seeds, pool.group_ids
    return [start_episode(prompts[i], i, gids[i], seeds[i], obs[i], infos[i])
            for i in range(len(prompts))]


def step_plans(pool: EnvPool, eps: Sequence[EpisodeState], plans: Sequence[TurnPlan],
               settings: TurnSettings | None = None) -> list[TurnResult | None]:
    """Execute the plans that have actions in one pool call; None where nothing ran.
    Under RAGEN v2 (``settings.ragen_version``) a turn's info is every action's, merged:
    see `step_singly`."""
    runs = [(ep.env_id, list(p.to_execute)) for ep, p in zip(eps, plans)]
    return step_runs(pool, runs, singly=settings is not None and settings.ragen_version == "v2")


def step_runs(pool: EnvPool, runs: list[tuple[int, list[Any]]], *, singly: bool = False
              ) -> list[TurnResult | None]:
    """Execute ``runs`` (env id, actions): the envs with actions in one ``step_turns`` call,
    or (``singly``, RAGEN v2) one action per call, merged (`step_singly`). None where an
    env got no actions. The turn executor of `step_plans` and of a replay
    (`turnpool.rollout.replay`)."""

    def step(batch: list[tuple[int, list[Any]]]) -> list[TurnResult | None]:
        run = [k for k, (_, acts) in enumerate(batch) if acts]
        results: list[TurnResult | None] = [None] * len(batch)
        if run:
            stepped = pool.step_turns([batch[k][1] for k in run], [batch[k][0] for k in run])
            for k, r in zip(run, stepped):
                results[k] = r
        return results

    return step_singly(step, runs) if singly else step(runs)


#: The info key of an env's own unshaped reward (RAGEN v2 sums it over a turn's actions).
RAW_REWARD_KEY = "raw_reward"
StepFn = Callable[[list[tuple[int, list[Any]]]], list[TurnResult | None]]


def step_singly(step: StepFn, runs: list[tuple[int, list[Any]]]) -> list[TurnResult | None]:
    """RAGEN v2's turn: ``runs`` (env id, actions) executed one action per ``step`` call, up
    to an env's first done or error, each turn's results merged by `merge_results`."""
    merged: list[TurnResult | None] = [None] * len(runs)
    for depth in range(max((len(acts) for _, acts in runs), default=0)):
        todo = [k for k, (_, acts) in enumerate(runs)
                if depth < len(acts) and _running(merged[k])]
        got = step([(runs[k][0], [runs[k][1][depth]]) for k in todo])
        for k, r in zip(todo, got):
            if r is not None:
                merged[k] = merge_results(merged[k], r)
    return merged


def _running(result: TurnResult | None) -> bool:
    return result is None or not (result.done or result.error)


def merge_results(before: TurnResult | None, now: TurnResult) -> TurnResult:
    """Two consecutive results as one turn's: rewards and counts added, ``info`` updated
    key by key (RAGEN v2's ``turn_info.update``), ``raw_reward`` summed (0.0 where absent;
    a value that is not a number counts 0.0, as v2's ``try`` does)."""
    raw = _number(now.info.get(RAW_REWARD_KEY, 0.0))
    if before is None:
        return now._replace(info={**now.info, RAW_REWARD_KEY: raw})
    return now._replace(reward_sum=before.reward_sum + now.reward_sum,
                        n_executed=before.n_executed + now.n_executed,
                        info={**before.info, **now.info,
                              RAW_REWARD_KEY: _number(before.info[RAW_REWARD_KEY]) + raw})


def _number(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


class SeedSchedule:
    """The base seed of each batch (RAGEN's scheme).

    Train batches use ``base + counter`` and the counter advances by the number of groups, so
    batches never share a seed; an explicit seed ``s`` is used as given and moves the counter
    past ``s``'s whole block (RAGEN restarted at ``s + 1``, overlapping it). Val batches always
    use ``base`` unless a seed is given. A missing base counts as 0.
    """

    def __init__(self, base: int | None, n_groups: int, mode: str = "train") -> None:
        self.base = 0 if base is None else int(base)
        self.n_groups = int(n_groups)
        self.mode = mode
        self.counter = 0

    def next(self, seed: int | None = None) -> int:
        """The base seed of the next batch (``seed``: an explicit one)."""
        if self.mode == "val":
            return self.base if seed is None else int(seed)
        if seed is None:
            out = self.base + self.counter
            self.counter += self.n_groups
            return out
        self.counter = int(seed) - self.base + self.n_groups
        return int(seed)


class TransitionSink(Protocol):
    """Where `TurnRunner.record` sends each env transition as the pool returned it (a
    `turnpool.rollout.record.Recorder`)."""

    def step(self, ep: EpisodeState, actions: Sequence[Any], result: TurnResult) -> None: ...


class TurnRunner:
    """The steps of one turn for any subset of episodes: prompts, generate, plan, record.

    ``sink``: where each turn that called the pool also goes, with the actions sent and
    the `TurnResult` (once `apply_turn` has recorded it); both collector modes record through
    here, so a record of an async run holds every env's transitions in its own order.
    """

    def __init__(self, policy: Policy, settings: TurnSettings) -> None:
        self.policy = policy
        self.settings = settings
        self.sink: TransitionSink | None = None

    def prompts(self, eps: Sequence[EpisodeState]
                ) -> tuple[list[list[Message]], list[TurnContext]]:
        """What the policy gets for ``eps``: their chats and contexts."""
        s = self.settings
        return [build_messages(ep, s) for ep in eps], [self._context(ep) for ep in eps]

    def generate(self, messages: list[list[Message]], contexts: list[TurnContext]
                 ) -> list[str]:
        return self.policy.generate(messages, contexts)

    def plan(self, eps: Sequence[EpisodeState], replies: Sequence[str]) -> list[TurnPlan]:
        """Parse one reply per episode into what its turn executes."""
        if len(replies) != len(eps):
            raise RuntimeError(f"policy returned {len(replies)} replies for {len(eps)} "
                               f"conversations")
        return [plan_turn(ep, r, self.settings) for ep, r in zip(eps, replies)]

    def record(self, ep: EpisodeState, plan: TurnPlan, result: TurnResult | None) -> None:
        """Record ``ep``'s turn (``result`` None: nothing was executed)."""
        apply_turn(ep, plan, result, self.settings)
        if self.sink is not None and result is not None:
            self.sink.step(ep, plan.to_execute, result)

    def _context(self, ep: EpisodeState) -> TurnContext:
        s = self.settings
        spec = ep.prompt.spec
        names = list(ep.prompt.valid_names) if ep.prompt.valid_names else None
        return TurnContext(env_id=ep.env_id, env_type=spec.env_type,
                           env_kwargs=dict(spec.env_kwargs), obs=ep.state, action_names=names,
                           turn=len(ep.turns), actions_left=ep.actions_left,
                           max_actions_per_turn=s.max_actions_per_turn,
                           action_sep=s.action_sep, enable_think=s.enable_think,
                           seed=ep.seed or 0, tag=spec.tag)
