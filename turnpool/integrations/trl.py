"""turnpool inside TRL's ``GRPOTrainer``: an ``environment_factory`` class and a ``rollout_func``.

Two ways in, both over turnpool's pool (envs in worker processes, ``step_timeout`` enforced,
faults isolated) instead of env code running in the trainer's process:

* `environment_factory` returns a class for ``GRPOTrainer(environment_factory=...)``. TRL
  builds instances with no arguments, calls ``reset(**row)`` before each rollout and exposes
  the public methods as tools. Each instance leases one env slot from this process's pool
  (`turnpool.integrations.leases.shared_leases`) on ``reset``, gives the previous one back
  first, and gives it back when the instance goes away. A discrete env's actions become one
  tool each (``up()``, ``left()``, ...); other envs get one ``act(action: str)`` tool.
  ``get_reward()`` returns the episode's reward sum, or None for a failed env (TRL then
  leaves the rollout unscored instead of scoring it 0). The dataset row's ``seed`` column
  (or, without one, a digest of the row) is the episode's seed, so the repeated rows of a
  GRPO group share their start state. ``reset`` tells the model its tools (`tool_prompt`;
  RAGEN texts' ``<answer>`` sentences are dropped), a call the env cannot take is answered
  with the reason and recorded in ``invalid_calls``, and ``tool_steps`` counts env steps.

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

import hashlib
import json
import keyword
import logging
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from turnpool.integrations.leases import shared_leases
from turnpool.policies.base import Message, TokenTurn, TurnContext
from turnpool.policies.hf import HFPolicy
from turnpool.policies.tokens import ChatRenderer, continue_chat, turn_limit
from turnpool.pool import EnvPool
from turnpool.pool.slots import SlotEngine
from turnpool.rollout.collector import TrajectoryCollector, build_pool
from turnpool.rollout.prompts import describe_env, make_env_prompt
from turnpool.rollout.settings import CollectorSettings, TagSpec, TurnSettings
from turnpool.rollout.trajectory import Trajectory
from turnpool.worker.protocol import Failure

log = logging.getLogger(__name__)

#: Longest action text a tool call may pass to an env (LLM text is hostile).
MAX_ACTION_CHARS = 4096
#: Seconds a tool call waits for its env beyond the pool's own ``step_timeout``.
WAIT_MARGIN_S = 60.0
_RESERVED = {"reset", "get_reward"}


def seed_of_row(row: Mapping[str, Any], key: str = "seed") -> int:
    """The episode seed for a dataset row: its ``key`` column, else a digest of the row (so
    identical rows, such as a GRPO group's, get the same seed in every process)."""
    if key in row and row[key] is not None:
        return int(row[key])
    text = json.dumps(row, sort_keys=True, default=repr, ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:4],
                          "big")


def failure_of(trajectory: Trajectory) -> str | None:
    """The failure class of a failed trajectory (None when it did not fail)."""
    if trajectory.error is None:
        return None
    return Failure.of(trajectory.failure).value


def _tool_name(action: str, taken: set[str]) -> str:
    name = re.sub(r"\W+", "_", action.strip().lower()).strip("_") or "action"
    if name[0].isdigit() or keyword.iskeyword(name) or name in _RESERVED:
        name = f"action_{name}"
    base, k = name, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def environment_factory(
    env_type: str, env_kwargs: Mapping[str, Any] | None = None, *, capacity: int = 64,
    pool_options: Mapping[str, Any] | None = None, seed_key: str = "seed",
    max_actions: int | None = None, class_name: str | None = None,
) -> type:
    """A class for ``GRPOTrainer(environment_factory=...)`` over turnpool env ``env_type``.

    Args:
        env_type: a registered env name or ``"module:Class"``.
        env_kwargs: the env's constructor arguments.
        capacity: env slots in this process's pool (at least TRL's generation batch size).
        pool_options: `turnpool.pool.EnvPool` keyword arguments (``backend``,
            ``num_workers``, ``step_timeout``, ...).
        seed_key: the dataset column holding the episode seed.
        max_actions: actions one episode may take (default: unlimited; the env's own
            termination still applies).
        class_name: the class's name (TRL logs the env reward under it).
    """
    kwargs = dict(env_kwargs or {})
    options = dict(pool_options or {})
    spec = TagSpec(tag=env_type, env_type=env_type, env_kwargs=kwargs,
                   max_actions_per_traj=max_actions or 10)
    prompt = make_env_prompt(spec, TurnSettings())
    desc = describe_env(env_type, kwargs)
    names = prompt.valid_names
    taken = set(_RESERVED)
    tool_names = [_tool_name(action, taken) for action in names or ()]
    intro = tool_prompt(env_type, desc.instruction, desc.grid_vocab, tool_names, max_actions)
    wait_s = float(options.get("step_timeout") or 0.0) + WAIT_MARGIN_S

    def leases() -> SlotEngine:
        return shared_leases(env_type, kwargs, capacity, options)

    def __init__(self: Any) -> None:
        self._slot = None
        self._reward = 0.0
        self._done = False
        self._failure = None
        self._actions = 0
        self._release = None
        self.tool_steps = 0  # env steps taken through tool calls
        self.invalid_calls = []  # why each rejected call was rejected (list of str)

    def reset(self: Any, **row: Any) -> str:
        """Start a new episode (gives the previous env slot back first)."""
        self._give_back()
        pool = leases()
        slot = pool.lease()
        self._slot = slot
        self._release = weakref.finalize(self, pool.release, slot)
        self._reward, self._done, self._failure, self._actions = 0.0, False, None, 0
        self.tool_steps, self.invalid_calls = 0, []
        obs, info, *_ = pool.submit_reset(slot, seed_of_row(row, seed_key)).result(wait_s)
        if info.get("error"):
            self._done, self._failure = True, Failure.of(info.get("failure")).value
            return f"The environment failed to start: {info['error']}"
        return f"{intro}\n{without_answer_format(obs)}"

    def get_reward(self: Any) -> float | None:
        """The episode's reward so far; None when the env failed (TRL leaves it unscored)."""
        return None if self._failure is not None else float(self._reward)

    def _give_back(self: Any) -> None:
        if self._release is not None:
            self._release()
        self._slot, self._release = None, None

    def _act(self: Any, action: Any) -> str:
        if self._slot is None:
            return self._reject("no episode is running")
        if self._done:
            return self._reject("the episode is over; no more actions are accepted")
        if not isinstance(action, str) or not action.strip():
            return self._reject(f"the action must be non-empty text, got {type(action).__name__}")
        if max_actions is not None and self._actions >= max_actions:
            self._done = True
            return "The action budget is spent; the episode is over."
        future = leases().submit_step(self._slot, [str(action)[:MAX_ACTION_CHARS]])
        try:
            res = future.result(timeout=wait_s)
        except FutureTimeout:  # the pool had no step_timeout: give up on this env here
            self._done, self._failure = True, "timeout"
            return f"The environment failed: no answer after {wait_s:.0f} s"
        self._actions += 1
        self.tool_steps += 1
        self._reward += float(res.reward_sum)
        if res.error:
            self._done = True
            self._failure = Failure.of(res.info.get("failure")).value
            return f"The environment failed: {res.error}"
        self._done = bool(res.terminated or res.truncated)
        text = f"{without_answer_format(res.obs)}\nReward: {res.reward_sum}"
        if res.info.get("action_is_valid") is False:
            self.invalid_calls.append(f"not a valid action: {str(action)[:80]!r}")
            text += "\nThat action was not valid."
        return text + ("\nThe episode is over." if self._done else "")

    def _reject(self: Any, reason: str) -> str:
        self.invalid_calls.append(reason[:200])
        return f"Invalid call: {reason}."

    members: dict[str, Any] = {"__init__": __init__, "reset": reset, "get_reward": get_reward,
                               "_give_back": _give_back, "_act": _act, "_reject": _reject,
                               "__doc__": f"turnpool env {env_type!r} as a TRL environment."}
    if names:
        taken = set(_RESERVED)
        for action in names:
            members[_tool_name(action, taken)] = _action_tool(action, env_type)
    else:
        members["act"] = _text_tool(env_type, desc.instruction)
    name = class_name or re.sub(r"\W", "", env_type.title()) + "Env"
    cls = type(name, (), members)
    cls.__module__ = __name__
    return cls


_ANSWER_FORMAT = re.compile(r"[^.\n?!]*<answer>.*?</answer>[^.\n]*\.?[ \t]*")


def without_answer_format(text: str) -> str:
    """``text`` without the sentences that ask for ``<answer>`` tags (RAGEN envs' texts do):
    a tool-calling model acts through its tools."""
    return _ANSWER_FORMAT.sub("", text)


def tool_prompt(env_type: str, instruction: str, grid_vocab: Mapping[str, str] | None,
                tool_names: Sequence[str], max_actions: int | None) -> str:
    """What an `environment_factory` episode tells the model first: the env's rules (without
    the ``<answer>`` format of text rollouts), its symbols, and the tools to call."""
    rules = re.split(r"\s*Answer with\b", instruction, maxsplit=1)[0].strip()
    lines = [rules] if rules else [f"You are playing the {env_type} environment."]
    if grid_vocab:
        lines.append("Symbols: " + ", ".join(f"{k} {v}" for k, v in grid_vocab.items()))
    if tool_names:
        calls = ", ".join(f"{n}()" for n in tool_names)
        lines.append(f"Act by calling the tools {calls}: one call per action. Each call "
                     f"returns the new state, the reward and whether the episode is over.")
    else:
        lines.append("Act by calling the tool act(action) with one action per call. Each call "
                     "returns the new state, the reward and whether the episode is over.")
    if max_actions is not None:
        lines.append(f"You may take up to {max_actions} actions.")
    return "\n".join(lines)


def _action_tool(action: str, env_type: str) -> Callable[[Any], str]:
    def tool(self: Any) -> str:
        return str(self._act(action))

    tool.__name__ = tool.__qualname__ = _tool_name(action, set(_RESERVED))
    tool.__doc__ = (f"Take the action {action!r} in the {env_type} environment.\n\n"
                    f"Returns:\n    The new observation, the reward and whether the episode "
                    f"is over.\n")
    tool.__annotations__ = {"return": str}
    return tool


def _text_tool(env_type: str, instruction: str) -> Callable[[Any, str], str]:
    def act(self: Any, action: str) -> str:
        return str(self._act(action))

    rules = re.split(r"\s*Answer with\b", instruction, maxsplit=1)[0]
    act.__doc__ = (f"Take one action in the {env_type} environment.\n\n"
                   f"Args:\n    action: The action text ({rules[:200].strip() or 'free text'}"
                   f").\n\nReturns:\n    The new observation, the reward and whether the episode "
                   f"is over.\n")
    act.__annotations__ = {"action": str, "return": str}
    return act


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
    steps = int(getattr(args, "steps_per_generation", None) or 1)
    per_proc = per_device * steps
    if per_proc % g:
        raise ValueError(
            f"TurnpoolRollout needs whole GRPO groups on every process: each of the {procs} "
            f"processes gets per_device_train_batch_size * steps_per_generation = "
            f"{per_device} * {steps} = {per_proc} prompts per generation, not a multiple of "
            f"num_generations = {g}. Raise steps_per_generation (e.g. to "
            f"{steps * _steps_for(per_proc, g)}) or per_device_train_batch_size, or lower "
            f"num_generations")
    g_eval = int(getattr(args, "num_generations_eval", None) or g)
    eval_batch = int(getattr(args, "per_device_eval_batch_size", 0) or 0)
    if getattr(args, "eval_strategy", "no") not in ("no", None) and eval_batch % g_eval:
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
    args = getattr(trainer, "args", None)
    out: dict[str, Any] = {}
    for key in ("top_k", "min_p", "repetition_penalty"):
        value = getattr(trainer, key, getattr(args, key, None))
        if value is not None:
            out[key] = value
    if out.get("top_k") == 0:  # TRL: 0 disables top-k, HF generate wants None
        out.pop("top_k")
    extra = getattr(args, "generation_kwargs", None) or {}
    out.update(json.loads(extra) if isinstance(extra, str) else dict(extra))
    return out


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
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
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
        template_kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
        sampling = trainer_sampling(trainer)
        if getattr(trainer, "use_vllm", False):
            if getattr(trainer, "vllm_mode", "server") != "server":
                raise ValueError("TurnpoolRollout generates with vLLM in server mode only "
                                 "(vllm_mode='server'); colocate mode is not supported yet")
            args = getattr(trainer, "args", None)
            extra = getattr(args, "generation_kwargs", None) or {}
            return VLLMClientPolicy(
                trainer.vllm_generation.vllm_client, tokenizer,
                max_new_tokens=int(self.max_new_tokens or budget),
                temperature=float(trainer.temperature), top_p=float(trainer.top_p),
                sampling=sampling,
                generation_kwargs=json.loads(extra) if isinstance(extra, str) else extra,
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
            failure = failure_of(t)
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
