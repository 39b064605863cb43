"""turnpool as a verl agent loop: ``agent_name: turnpool`` plays one multi-turn env episode.

verl's agent-loop workers build a new loop object per trajectory and ``asyncio.gather`` them
all with no timeout, so an env that hangs inside a loop stalls the batch. `TurnpoolAgentLoop`
(registered as ``"turnpool"``) instead leases one env slot from its worker process's pool
(`turnpool.integrations.leases.shared_leases`: one pool per agent-loop worker, any backend),
so env steps run in pool workers with ``step_timeout`` enforced and a hang comes back as a
failed env, not a stuck batch.

Each turn uses turnpool's own turn logic (`turnpool.rollout.prompts.build_messages`,
`turnpool.rollout.episode.plan_turn` / `apply_turn`, the same as the collector), generates
with verl's ``server_manager.generate`` from token ids, and extends the sequence with
`turnpool.policies.tokens.ChatRenderer` (sampled history is never re-rendered, so templates
that rewrite history, such as Qwen3's, keep every turn; verl's
``data.apply_chat_template_kwargs`` reach the template), so ``response_mask`` is 1 exactly on
sampled tokens and 0 on env/template tokens. ``extra_fields["turnpool_end"]`` names why the
episode ended: the episode's reason (``terminated``, ``truncated``, ``action_budget``,
``error``), ``max_turn``, or ``response_length`` when verl's response budget ran out first.
``reward_score`` is the episode's reward sum plus its format penalty. A failed env (error,
timeout, lost worker) is marked, never silently scored:
``extra_fields["turnpool_failure"]`` names the failure class and its ``response_mask`` is all
zeros, so it carries no gradient. Before that, a failed episode is replayed from its seed on a
fresh lease, up to ``turnpool.retries`` times (default 1; ``extra_fields["turnpool_attempts"]``
counts the tries), as the collector replays failed groups. An episode that still fails must not
bias its group: ``algorithm.adv_estimator=turnpool_grpo``
(`turnpool.integrations.verl_advantage`, registered on import) computes GRPO's group mean and
std over the healthy rows only.

Options come from the trainer config's ``turnpool`` section (``env_type``, ``env_kwargs``,
``capacity``, ``pool`` = EnvPool keyword arguments, ``max_turn``, ``max_actions_per_traj``,
``format_penalty``, ``enable_think``, ...); a dataset row may override ``env_type``,
``env_kwargs`` and ``seed`` at the top level or in its ``extra_info``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from omegaconf import Container, OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

import turnpool.integrations.verl_advantage  # noqa: F401 - registers "turnpool_grpo"
from turnpool.integrations.leases import shared_leases
from turnpool.policies.tokens import ChatRenderer
from turnpool.pool import TurnResult
from turnpool.pool.slots import PoolTimeout, SlotEngine
from turnpool.rollout.episode import EpisodeState, apply_turn, plan_turn, start_episode
from turnpool.rollout.prompts import EnvPrompt, build_messages, make_env_prompt
from turnpool.rollout.settings import TagSpec, TurnSettings
from turnpool.worker.failures import failure_of

log = logging.getLogger(__name__)

#: Seconds an env call may wait beyond the pool's ``step_timeout`` (the pool enforces it).
WAIT_MARGIN_S = 60.0
DEFAULTS: dict[str, Any] = {"env_kwargs": {}, "capacity": 256, "pool": {}, "max_turn": 5,
                            "max_actions_per_traj": 10, "max_actions_per_turn": 5,
                            "action_sep": "||", "enable_think": True, "format_penalty": -0.1,
                            "retries": 1}
_SLOTS: dict[tuple[int, int], asyncio.Semaphore] = {}


def _plain(x: Any) -> Any:
    """An OmegaConf node as plain dicts and lists; anything else as it is."""
    if isinstance(x, Container):
        return OmegaConf.to_container(x, resolve=True)
    return x


def loop_options(config: Any, row: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer config's ``turnpool`` section over `DEFAULTS`, then the row's overrides."""
    section = _plain(config.get("turnpool", None) if isinstance(config, Mapping) else None) or {}
    opts = {**DEFAULTS, **dict(section)}
    extra = _plain(row.get("extra_info")) or {}
    for key in ("env_type", "env_kwargs", "seed"):
        for source in (extra, row):
            if isinstance(source, Mapping) and source.get(key) is not None:
                opts[key] = _plain(source[key])
    if not opts.get("env_type"):
        raise ValueError("turnpool agent loop: set turnpool.env_type in the trainer config "
                         "or env_type in the dataset row")
    return opts


@register("turnpool")
class TurnpoolAgentLoop(AgentLoopBase):
    """One env episode per ``run``; see the module docstring."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        opts = loop_options(self.config, kwargs)
        pool_options = dict(opts.get("pool") or {})
        # the first call of a worker starts its pool: off the event loop, which other
        # trajectories share
        leases = await asyncio.get_running_loop().run_in_executor(
            None, shared_leases, str(opts["env_type"]), dict(opts["env_kwargs"] or {}),
            int(opts["capacity"]), pool_options)
        wait_s = float(pool_options.get("step_timeout") or 0.0) + WAIT_MARGIN_S
        seed = int(opts.get("seed", kwargs.get("index", 0)) or 0)
        slots = _slots(leases)
        tries = 1 + max(0, int(opts.get("retries") or 0))
        for attempt in range(1, tries + 1):
            async with slots:
                slot = leases.lease()
                try:
                    out = await self._play(leases, slot, seed, opts, sampling_params, wait_s)
                finally:
                    leases.release(slot)
            out.extra_fields["turnpool_attempts"] = attempt
            if out.extra_fields["turnpool_failure"] is None:
                break
            log.warning("turnpool agent loop: env %s seed %d failed (%s), attempt %d of %d",
                        opts["env_type"], seed, out.extra_fields["turnpool_failure"], attempt,
                        tries)
        return out

    async def _play(self, leases: SlotEngine, slot: int, seed: int, opts: dict[str, Any],
                    sampling_params: dict[str, Any], wait_s: float) -> AgentLoopOutput:
        settings, prompt = _turn_settings(opts)
        tokenizer: Any = self.tokenizer
        renderer = ChatRenderer(tokenizer, _plain(self.apply_chat_template_kwargs) or {})
        obs, info, *_ = await leases.reset(slot, seed, timeout=wait_s)
        ep = start_episode(prompt, slot, 0, seed, obs, info)
        seq = _Sequence(budget=int(self.rollout_config.response_length))
        request_id = uuid4().hex
        end = "max_turn"
        for _ in range(int(opts["max_turn"])):
            if ep.done:
                break
            messages = build_messages(ep, settings)
            if seq.prompt_ids is None:
                seq.prompt_ids = self._cap_text_prompt_length(renderer.first(messages))
            elif not seq.add_env(renderer.extend(messages, seq.response)):
                end = "response_length"  # no room left for the next turn's reply
                break
            t0 = time.perf_counter()
            out = await self.server_manager.generate(
                request_id=request_id, prompt_ids=seq.prompt_ids + seq.response,
                sampling_params=sampling_params)
            seq.generate_s += time.perf_counter() - t0
            ids = seq.add_sampled(out.token_ids, out.log_probs)
            plan = plan_turn(ep, str(tokenizer.decode(ids, skip_special_tokens=True)), settings)
            result = None
            if plan.to_execute:
                result = await _env_turn(leases, slot, plan.to_execute, wait_s, seq)
            apply_turn(ep, plan, result, settings)
            if seq.full and not ep.done:
                end = "response_length"
                break
        return _output(ep, info, seq, seed, ep.end_reason if ep.done else end,
                       int(tokenizer.eos_token_id))


@dataclass
class _Sequence:
    """One episode's token sequence as verl trains it: the first prompt, then the replies and
    the env/template tokens between them (``mask`` 1 on sampled tokens), and timings."""

    budget: int
    prompt_ids: list[int] | None = None
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0
    generate_s: float = 0.0
    tool_s: float = 0.0

    @property
    def full(self) -> bool:
        return len(self.response) >= self.budget

    def add_env(self, ids: list[int]) -> bool:
        """Append the env's (unsampled) tokens; False, adding nothing, when the next reply
        would have no room left."""
        if len(self.response) + len(ids) >= self.budget:
            return False
        self.response += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        return True

    def add_sampled(self, token_ids: Sequence[int], log_probs: Sequence[float] | None
                    ) -> list[int]:
        """Append a reply, cut to the budget; its ids."""
        ids = [int(i) for i in token_ids][: self.budget - len(self.response)]
        self.response += ids
        self.mask += [1] * len(ids)
        self.logprobs += (list(log_probs or []) + [0.0] * len(ids))[: len(ids)]
        self.turns += 1
        return ids


def _turn_settings(opts: Mapping[str, Any]) -> tuple[TurnSettings, EnvPrompt]:
    """The turn settings and env prompt of the options (`loop_options`)."""
    settings = TurnSettings(action_sep=str(opts["action_sep"]),
                            max_actions_per_turn=int(opts["max_actions_per_turn"]),
                            enable_think=bool(opts["enable_think"]),
                            max_context_window=-1,
                            format_penalty=float(opts["format_penalty"]))
    env_type = str(opts["env_type"])
    spec = TagSpec(tag=env_type, env_type=env_type, env_kwargs=dict(opts["env_kwargs"] or {}),
                   max_actions_per_traj=int(opts["max_actions_per_traj"]))
    return settings, make_env_prompt(spec, settings)


async def _env_turn(leases: SlotEngine, slot: int, actions: Sequence[str], wait_s: float,
                    seq: _Sequence) -> TurnResult:
    """One env step of ``actions``; a pool without ``step_timeout`` is given up on after
    ``wait_s`` (a failed turn, failure class ``timeout``)."""
    t0 = time.perf_counter()
    try:
        return await leases.step(slot, list(actions), timeout=wait_s)
    except PoolTimeout:  # the pool had no step_timeout: stop waiting
        return TurnResult(obs="", reward_sum=0.0, terminated=False, truncated=True,
                          info={"failure": "timeout"}, n_executed=0,
                          error=f"no answer from the env after {wait_s:.0f} s")
    finally:
        seq.tool_s += time.perf_counter() - t0


def _output(ep: EpisodeState, info: Mapping[str, Any], seq: _Sequence, seed: int, end: str,
            eos: int) -> AgentLoopOutput:
    """verl's record of the episode; a failed one is marked and masked out (all zeros)."""
    failure = None
    mask = seq.mask
    if ep.error is not None:
        failure = failure_of(dict(ep.turns[-1].info if ep.turns else info)).value
        mask = [0] * len(mask)
    score = sum(t.reward for t in ep.turns) + ep.penalty
    extra = {"turnpool_failure": failure, "turnpool_success": bool(ep.success),
             "turnpool_seed": seed, "turnpool_end": end, "turnpool_error": ep.error}
    budget = seq.budget
    return AgentLoopOutput(
        prompt_ids=seq.prompt_ids or [eos], response_ids=seq.response[:budget],
        response_mask=mask[:budget], response_logprobs=seq.logprobs[:budget],
        reward_score=float(score), num_turns=2 * seq.turns + 1,
        metrics=AgentLoopMetrics(generate_sequences=seq.generate_s, tool_calls=seq.tool_s),
        extra_fields=extra)


def _slots(leases: SlotEngine) -> asyncio.Semaphore:
    """Per event loop: at most ``capacity`` episodes hold a slot; the others wait their turn."""
    key = (id(leases), id(asyncio.get_running_loop()))
    sem = _SLOTS.get(key)
    if sem is None:
        sem = _SLOTS[key] = asyncio.Semaphore(leases.capacity)
    return sem
