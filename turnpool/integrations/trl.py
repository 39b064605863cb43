"""turnpool inside TRL's ``GRPOTrainer``: an ``environment_factory`` class and a ``rollout_func``.

Two ways in, both over turnpool's pool (envs in worker processes, ``step_timeout`` enforced,
faults isolated) instead of env code running in the trainer's process:

* `environment_factory` (`turnpool.integrations.trl_env`, importable from here) returns a
  class for ``GRPOTrainer(environment_factory=...)``: each instance leases one env slot and
  exposes the env's actions as tools.

* `TurnpoolRollout` is a ``rollout_func``: it runs turnpool's multi-turn collector with the
  trainer's model as the policy (TRL's own vLLM client in ``vllm_mode="server"``, else
  `turnpool.policies.hf.HFPolicy.from_model`; the trainer's sampling settings and
  ``chat_template_kwargs`` either way; ``max_completion_length`` bounds each episode) and
  returns ``prompt_ids``, ``completion_ids`` (replies and the env/template tokens between them),
  ``logprobs``, ``env_mask`` (1 on model tokens) and the extra keys ``turnpool_score``,
  ``turnpool_success``, ``turnpool_failure``, ``turnpool_num_turns`` for reward functions;
  `turnpool_reward` is the reward function that reads them. Each run of ``num_generations``
  identical prompts is one turnpool group (one seed); the prompt text itself is not shown to the
  model, the env's own prompt is. A failed trajectory (env error, timeout, lost worker) keeps
  its place but gets reward None and an all-zero ``env_mask``, so it is neither scored 0 nor
  trained on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from turnpool.integrations.trl_env import (
    environment_factory,
    seed_of_row,
    tool_prompt,
    without_answer_format,
)
from turnpool.policies.base import Message, TokenTurn, TurnContext
from turnpool.policies.hf import HFPolicy
from turnpool.policies.tokens import ChatRenderer, continue_chat, turn_limit
from turnpool.pool import EnvPool
from turnpool.rollout.collector import TrajectoryCollector, build_pool
from turnpool.rollout.settings import CollectorSettings, TagSpec, TurnSettings
from turnpool.rollout.trajectory import Trajectory
from turnpool.worker.failures import failure_of

log = logging.getLogger(__name__)

__all__ = ["TurnpoolRollout", "VLLMClientPolicy", "check_whole_groups", "environment_factory",
           "generation_kwargs", "seed_of_row", "tokenizer_of", "tool_prompt", "trainer_sampling",
           "turnpool_reward", "without_answer_format"]


# ---------------------------------------------------------------------- rollout_func
def turnpool_reward(completions: Sequence[Any], turnpool_score: Sequence[float | None],
                    **kwargs: Any) -> list[float | None]:
    """Reward function for `TurnpoolRollout`: turnpool's score (reward sum plus format
    penalty), None for failed trajectories (TRL leaves those unscored)."""
    return list(turnpool_score)


def check_whole_groups(args: Any, num_processes: int) -> None:
    """Raise ``ValueError`` unless every process's generation batch holds whole GRPO groups.

    TRL hands each process ``per_device_train_batch_size * steps_per_generation`` consecutive
    prompts of the global generation batch (group members are adjacent) and only checks that
    the global batch holds whole groups; `TurnpoolRollout` plays one turnpool
    group (one seed) per GRPO group, so a group cut between processes cannot be played. The
    error names the settings to change. Eval batches are checked the same way.
    """
    procs = max(1, int(num_processes))
    g = int(args.num_generations)
    per_device = int(args.per_device_train_batch_size)
    steps = int(args.steps_per_generation or 1)
    per_proc = per_device * steps
    if per_proc % g:
        raise ValueError(
            f"TurnpoolRollout needs whole GRPO groups on every process: each of the {procs} "
            f"processes gets per_device_train_batch_size * steps_per_generation = "
            f"{per_device} * {steps} = {per_proc} prompts per generation, not a multiple of "
            f"num_generations = {g}. Raise steps_per_generation (e.g. to "
            f"{steps * _steps_for(per_proc, g)}) or per_device_train_batch_size, or lower "
            f"num_generations")
    g_eval = int(args.num_generations_eval or g)
    eval_batch = int(args.per_device_eval_batch_size or 0)
    if args.eval_strategy not in ("no", None) and eval_batch % g_eval:
        raise ValueError(
            f"TurnpoolRollout needs whole GRPO groups on every process: "
            f"per_device_eval_batch_size = {eval_batch} is not a multiple of "
            f"num_generations_eval = {g_eval}; change per_device_eval_batch_size")


def _steps_for(per_device: int, group: int) -> int:
    """The smallest ``steps_per_generation`` whose per-process batch holds whole groups."""
    k = 1
    while (per_device * k) % group:
        k += 1
    return k


def trainer_sampling(trainer: Any) -> dict[str, Any]:
    """``generate`` keyword arguments from a GRPOTrainer's sampling settings (``top_k``,
    ``min_p``, ``repetition_penalty``, then ``generation_kwargs`` over them)."""
    chosen = {"top_k": trainer.top_k, "min_p": trainer.min_p,
              "repetition_penalty": trainer.repetition_penalty}
    out = {key: value for key, value in chosen.items() if value is not None}
    if out.get("top_k") == 0:  # TRL: 0 disables top-k, HF generate wants None
        out.pop("top_k")
    out.update(generation_kwargs(trainer.args))
    return out


def generation_kwargs(args: Any) -> dict[str, Any]:
    """A GRPOConfig's ``generation_kwargs`` as a dict (the command line gives it as JSON)."""
    extra = args.generation_kwargs or {}
    return dict(json.loads(extra) if isinstance(extra, str) else extra)


def tokenizer_of(processing_class: Any) -> Any:
    """The tokenizer of a trainer's ``processing_class``: itself, or a processor's own."""
    from transformers import ProcessorMixin

    if isinstance(processing_class, ProcessorMixin):
        return processing_class.tokenizer
    return processing_class


class VLLMClientPolicy:
    """TRL's own ``VLLMClient`` (``GRPOTrainer`` with ``use_vllm=True, vllm_mode="server"``)
    as a token-level policy: each conversation is rendered here
    (`turnpool.policies.tokens.ChatRenderer`: the first prompt, then only each new turn's ids
    after what the model saw and sampled) and sent as token ids; the ids and log-probabilities
    the server sampled come back. TRL has already synced the trainer's weights to the server
    before it calls the ``rollout_func``."""

    def __init__(self, client: Any, tokenizer: Any, *, max_new_tokens: int, temperature: float,
                 top_p: float, sampling: Mapping[str, Any] | None = None,
                 generation_kwargs: Mapping[str, Any] | None = None,
                 template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.sampling = {k: v for k, v in dict(sampling or {}).items()
                         if k in ("top_k", "min_p", "repetition_penalty") and v is not None}
        self.generation_kwargs = dict(generation_kwargs or {})
        self.renderer = ChatRenderer(tokenizer, template_kwargs)

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        return [t.text for t in self.generate_tokens(batch, [None] * len(batch), contexts)]

    def generate_tokens(self, batch: list[list[Message]], prefixes: list[list[int] | None],
                        contexts: list[TurnContext] | None = None,
                        budgets: list[int | None] | None = None) -> list[TokenTurn]:
        """See `turnpool.policies.base.TokenPolicy` (``budgets`` included)."""
        out: list[TokenTurn | None] = []
        jobs: list[tuple[int, list[int], list[int], bool, int]] = []
        for k, (messages, prefix) in enumerate(zip(batch, prefixes)):
            new, extends = continue_chat(self.tokenizer, messages, prefix,
                                         renderer=self.renderer)
            limit = turn_limit(self.max_new_tokens, budgets[k] if budgets is not None else None,
                               new, extends)
            if limit < 1:
                out.append(TokenTurn("", new, [], [], extends, stop="token_budget"))
                continue
            out.append(None)
            jobs.append((k, (list(prefix) if extends and prefix else []) + new, new, extends,
                         limit))
        if jobs:
            res = self.client.generate(
                prompts=[prompt for _, prompt, *_ in jobs], n=1,
                temperature=self.temperature, top_p=self.top_p,
                top_k=int(self.sampling.get("top_k") or 0),
                min_p=float(self.sampling.get("min_p") or 0.0),
                repetition_penalty=float(self.sampling.get("repetition_penalty") or 1.0),
                max_tokens=max(job[4] for job in jobs), logprobs=0,
                generation_kwargs=self.generation_kwargs or None)
            lp_rows = res.get("logprobs") or [None] * len(jobs)
            id_rows = res.get("logprob_token_ids") or [None] * len(jobs)
            for (k, prompt, new, extends, limit), got, ids, lps, lp_ids in zip(
                    jobs, res["prompt_ids"], res["completion_ids"], lp_rows, id_rows):
                if [int(i) for i in got] != prompt:
                    raise RuntimeError("the vLLM server answered for another prompt than the "
                                       "one sent; the episode would not be token-exact")
                ids = [int(i) for i in ids][:limit]
                out[k] = TokenTurn(
                    text=str(self.tokenizer.decode(ids, skip_special_tokens=True)),
                    prompt_ids=new, response_ids=ids, logprobs=_sampled_logprobs(
                        ids, lps, lp_ids), extends=extends, path="tokens")
        return [turn for turn in out if turn is not None]

    def close(self) -> None:
        """The client belongs to the trainer: nothing to release."""


def _sampled_logprobs(ids: list[int], lps: Any, lp_ids: Any) -> list[float]:
    """The sampled tokens' log-probabilities from TRL's per-position top lists."""
    out: list[float] = []
    for t, tid in enumerate(ids):
        value = 0.0
        if lps is not None and lp_ids is not None and t < len(lps):
            for cand, lp in zip(lp_ids[t], lps[t]):
                if int(cand) == tid and lp is not None:
                    value = float(lp)
                    break
        out.append(value)
    return out


class TurnpoolRollout:
    """A ``rollout_func`` for ``GRPOTrainer`` that plays multi-turn turnpool episodes.

    Args:
        env_type: a registered env name or ``"module:Class"`` (or pass ``tags``).
        env_kwargs: its constructor arguments.
        tags: several env types, as `turnpool.rollout.settings.TagSpec` (``n_groups`` is
            ignored: each batch's groups fill the first tag's slots in order).
        settings: turns per episode, action separator, format penalty, ... (the
            ``max_context_window`` is forced to -1: an episode is one token sequence).
        pool_options: `turnpool.pool.EnvPool` keyword arguments (backend, step_timeout, ...).
        max_new_tokens: tokens per reply (default: no limit of its own; each reply is
            capped by what is left of the episode's ``max_completion_length``).
        seed: base of the episode seeds; batch ``k`` of process ``p`` uses a block of seeds
            of its own, group ``g`` one seed of that block.

    The trainer's settings are honoured: ``temperature``, ``top_p``, ``top_k``, ``min_p``,
    ``repetition_penalty`` and ``generation_kwargs`` for sampling, ``chat_template_kwargs``
    (``enable_thinking``, ...) for the chat template, and ``max_completion_length`` bounds the
    episode's completion tokens (replies plus the env/template tokens between them), as TRL's
    own multi-turn tool loop does: each reply gets what is left, and an episode whose next
    turn does not fit ends with ``end_reason="token_budget"``. Sampled history is never
    re-rendered (`turnpool.policies.tokens`), so templates that rewrite history (Qwen3's
    think-stripping) train on exactly what the model saw.
    """

    def __init__(self, env_type: str | None = None, env_kwargs: Mapping[str, Any] | None = None,
                 *, tags: Sequence[TagSpec] | None = None,
                 settings: CollectorSettings | None = None,
                 pool_options: Mapping[str, Any] | None = None,
                 max_new_tokens: int | None = None, seed: int = 0,
                 max_actions_per_traj: int = 10) -> None:
        if tags is None:
            if env_type is None:
                raise ValueError("pass env_type or tags")
            tags = [TagSpec(tag=env_type, env_type=env_type, env_kwargs=dict(env_kwargs or {}),
                            max_actions_per_traj=max_actions_per_traj)]
        self.tags = list(tags)
        s = settings or CollectorSettings()
        if s.max_episode_tokens is not None:
            raise ValueError("TurnpoolRollout takes the episode's token budget from the "
                             "trainer's max_completion_length; leave max_episode_tokens unset")
        turn = TurnSettings(**{**s.turn.__dict__, "max_context_window": -1})
        self.settings = CollectorSettings(**{**s.__dict__, "turn": turn,
                                             "collector_mode": "lockstep",
                                             "failed_groups": "keep",
                                             "filter_groups": False})
        self.pool_options = dict(pool_options or {})
        self.max_new_tokens = max_new_tokens
        self.seed = int(seed)
        self.calls = 0
        self._checked = False
        self.last_trajectories: list[Trajectory] = []
        self._pools: dict[tuple[int, int], EnvPool] = {}
        self.__name__ = "turnpool_rollout"

    def _pool(self, n_groups: int, group_n: int) -> EnvPool:
        key = (n_groups, group_n)
        if key not in self._pools:
            first = self.tags[0]
            tags = [TagSpec(**{**first.__dict__, "n_groups": n_groups})]
            self._pools[key] = build_pool(tags, group_n, self.pool_options, seed=self.seed)
        return self._pools[key]

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        if not self._checked:  # the trainer's first generation: before any env or sample
            check_whole_groups(trainer.args, int(trainer.accelerator.num_processes))
            self._checked = True
        training = bool(trainer.model.training)
        g = int(trainer.num_generations if training else trainer.num_generations_eval)
        n = len(prompts)
        if g < 1 or n % g:
            raise ValueError(f"{n} prompts do not split into groups of {g}")
        for k in range(0, n, g):
            if any(p != prompts[k] for p in prompts[k:k + g]):
                raise ValueError("the prompts of a GRPO group differ: each process must get "
                                 "whole groups of num_generations identical prompts (see "
                                 "check_whole_groups)")
        n_groups = n // g
        pool = self._pool(n_groups, g)
        first = self.tags[0]
        tags = [TagSpec(**{**first.__dict__, "n_groups": n_groups})]
        tokenizer = tokenizer_of(trainer.processing_class)
        model = trainer.accelerator.unwrap_model(trainer.model)
        budget = int(trainer.max_completion_length)
        policy = self.policy_for(trainer, model, tokenizer, budget)
        procs, rank = int(trainer.accelerator.num_processes), int(trainer.accelerator.process_index)
        base = self.seed + (self.calls * procs + rank) * n_groups
        self.calls += 1
        was_training = model.training
        model.eval()
        try:
            settings = CollectorSettings(**{**self.settings.__dict__,
                                            "max_episode_tokens": budget})
            collector = TrajectoryCollector(pool, policy, tags, settings)
            batch = collector.collect(seed=base)
        finally:
            model.train(was_training)
        self.last_trajectories = batch.trajectories
        return self.to_trl(batch.trajectories, tokenizer, budget)

    def policy_for(self, trainer: Any, model: Any, tokenizer: Any, budget: int) -> Any:
        """TRL's vLLM client in server mode, else HF ``generate`` on the training model;
        either way with the trainer's sampling settings and ``chat_template_kwargs``."""
        template_kwargs = dict(trainer.chat_template_kwargs or {})
        sampling = trainer_sampling(trainer)
        if trainer.use_vllm:
            if trainer.vllm_mode != "server":
                raise ValueError("TurnpoolRollout generates with vLLM in server mode only "
                                 "(vllm_mode='server'); colocate mode is not supported yet")
            return VLLMClientPolicy(
                trainer.vllm_generation.vllm_client, tokenizer,
                max_new_tokens=int(self.max_new_tokens or budget),
                temperature=float(trainer.temperature), top_p=float(trainer.top_p),
                sampling=sampling,
                generation_kwargs=generation_kwargs(trainer.args),
                template_kwargs=template_kwargs)
        return HFPolicy.from_model(
            model, tokenizer, max_new_tokens=int(self.max_new_tokens or budget),
            temperature=float(trainer.temperature), top_p=float(trainer.top_p),
            seed=self.seed + self.calls, sampling=sampling, template_kwargs=template_kwargs)

    @staticmethod
    def to_trl(trajectories: Sequence[Trajectory], tokenizer: Any,
               max_completion_length: int | None = None) -> dict[str, Any]:
        """The dict GRPOTrainer expects from a rollout_func, one row per trajectory."""
        eos = int(tokenizer.eos_token_id)
        out: dict[str, list[Any]] = {k: [] for k in (
            "prompt_ids", "completion_ids", "logprobs", "env_mask", "turnpool_score",
            "turnpool_success", "turnpool_failure", "turnpool_num_turns")}
        for t in trajectories:
            failure = None if t.error is None else failure_of({"failure": t.failure}).value
            if t.has_tokens:
                # verbatim history: one sample per episode; a prompt cut to the model's input
                # limit starts a new one, and only the first is trained (it is exact)
                view = t.token_samples()[0]
                prompt, resp, mask, lp = (view.prompt_ids, view.response_ids, view.loss_mask,
                                          view.logprobs)
            else:  # the env failed before the model said anything
                prompt, resp, mask, lp = [eos], [], [], []
            if not resp:
                resp, mask, lp = [eos], [0], [0.0]
            if max_completion_length is not None:
                resp, mask, lp = (resp[:max_completion_length], mask[:max_completion_length],
                                  lp[:max_completion_length])
            if failure is not None:
                mask = [0] * len(resp)
            out["prompt_ids"].append(prompt)
            out["completion_ids"].append(resp)
            out["logprobs"].append(lp)
            out["env_mask"].append(mask)
            out["turnpool_score"].append(None if failure else float(t.score + t.penalty))
            out["turnpool_success"].append(bool(t.success))
            out["turnpool_failure"].append(failure)
            out["turnpool_num_turns"].append(len(t.turns))
        return out

    def close(self) -> None:
        """Close the pools (idempotent)."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
