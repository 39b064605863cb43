"""Environment managers: observations -> chat messages (RAGEN's format), LLM text -> turns.

A manager holds one `EnvPrompt` per tag (the user-message prefix, built once) and moves
`EpisodeState` objects through turns. The turn logic lives in two functions: `plan_turn`
(pure: parse the reply, keep the valid actions that fit the action budget, decide the format
penalty) and `apply_turn` (the only place an episode changes). The collector batches the
plans of many envs into one pool call; an asynchronous loop can call the same two functions
one env at a time.

Prompt format (RAGEN's ContextManager, reproduced string for string)::

    system: "You're a helpful assistant. "
    user:   <env_instruction>
            [\\nThe meaning of each symbol in the state is:\\n# : wall, ...]
            [\\nYour available actions are:\\nUp, Down, ...
             \\nYou can make up to N actions, separated by the action separator " || "\\n]
            \\nTurn 1:\\nState:\\n<grid>\\nYou have 10 actions left. Always output: <think> ...
    assistant: <think>...</think><answer>Up || Left</answer>
    user:   Reward:\\n-0.2\\n
            \\nTurn 2:\\nState:\\n...

Deliberate differences from RAGEN (each a bug there):

* the symbol legend comes from the symbols the env really draws (its ``env_config`` override
  of ``grid_vocab``/``grid_lookup``), not from the env type's default config;
* ``max_context_window`` selects what goes into the prompt and never shortens the stored
  history, so scores and metrics always cover the whole episode; turns keep their real
  numbers inside the window.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnpool.envs.base import TextEnv
from turnpool.envs.registry import resolve
from turnpool.projection import parse_response
from turnpool.trajectory import Message, Turn

SYSTEM_PROMPT = "You're a helpful assistant. "
THINK_FORMAT = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
ANSWER_FORMAT = "<answer> [your answer] </answer>"
#: RAGEN's fallback for ``max_tokens`` (``actor_rollout_ref.rollout.response_length``).
DEFAULT_MAX_TOKENS = 400
#: LLM text is hostile: what is stored and replayed into later prompts is capped.
MAX_RESPONSE_CHARS = 32_768

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TagSpec:
    """One RAGEN tag (``custom_envs.<tag>``) as the manager needs it."""

    tag: str
    env_type: str
    n_groups: int = 1
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_actions_per_traj: int = 10
    env_instruction: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    grid_vocab: dict[str, str] | None = None
    action_lookup: dict[int, str] | None = None


@dataclass(frozen=True)
class TurnSettings:
    """``agent_proxy`` and ``es_manager`` keys that shape a turn."""

    action_sep: str = "||"
    max_actions_per_turn: int = 5
    enable_think: bool = True
    max_context_window: int = -1
    format_penalty: float = -0.1


@dataclass(frozen=True)
class EnvPrompt:
    """What a tag's prompts are built from.

    ``action_names`` are listed in the prompt (RAGEN lists the env config's
    ``action_lookup``); ``valid_names`` are what the manager accepts, which also covers envs
    whose lookup is only known per episode (Bandit shuffles its arm ids; RAGEN's prompt does
    not list them but its manager still drops unknown arm names).
    """

    spec: TagSpec
    prefix: str
    action_names: tuple[str, ...] | None
    valid_names: tuple[str, ...] | None


@dataclass(frozen=True)
class EnvDescription:
    """An env as configured: its default instruction, legend and action names."""

    instruction: str
    grid_vocab: dict[str, str] | None
    action_lookup: dict[int, str] | None
    episode_action_names: tuple[str, ...] | None


# ------------------------------------------------------------------ env descriptions
def describe_env(env_type: str, env_kwargs: Mapping[str, Any] | None = None) -> EnvDescription:
    """The env *as configured* (class defaults overridden by its keyword arguments).

    ``env_kwargs`` win over class attributes because they are what the env draws with: an env
    configured with its own ``grid_vocab`` (RAGEN's SokobanDifferentGridVocab) gets that
    legend; one that only remaps ``grid_lookup`` (code -> symbol) gets the default meanings
    re-keyed by its symbols.
    """
    cls, defaults = resolve(env_type)
    kw = {**defaults, **dict(env_kwargs or {})}
    vocab = _as_str_dict(kw.get("grid_vocab")) or _as_str_dict(getattr(cls, "grid_vocab", None))
    if kw.get("grid_lookup") and not kw.get("grid_vocab"):
        vocab = _rekey_vocab(vocab, getattr(cls, "grid_lookup", None), kw["grid_lookup"])
    lookup = _as_lookup(kw.get("action_lookup")) or _as_lookup(getattr(cls, "action_lookup", None))
    episode_names: tuple[str, ...] | None = None
    if lookup is None and _has_episode_lookup(cls):
        episode_names = _episode_action_names(cls, kw)
    return EnvDescription(str(getattr(cls, "instruction", "") or ""), vocab, lookup,
                          episode_names)


def _has_episode_lookup(cls: type) -> bool:
    own = getattr(cls, "action_lookup_for_episode", None)
    return own is not None and own is not TextEnv.action_lookup_for_episode


def _episode_action_names(cls: type, kw: dict[str, Any]) -> tuple[str, ...] | None:
    # Envs with per-episode lookups (ids shuffled on reset) keep the same *names*; a fresh
    # instance reports them. Only such envs are built here, and building does no I/O.
    try:
        lookup = cls(**kw).action_lookup_for_episode()
    except Exception as exc:  # noqa: BLE001 - a user env may fail any way; fall back to free text
        log.warning("cannot list the actions of %s (%s); accepting any action text",
                    cls.__name__, exc)
        return None
    return tuple(str(v) for _, v in sorted(lookup.items())) if lookup else None


def _as_str_dict(x: Any) -> dict[str, str] | None:
    if not x:
        return None
    return {str(k): str(v) for k, v in dict(x).items()}


def _as_lookup(x: Any) -> dict[int, str] | None:
    if not x:
        return None
    return {int(k): str(v) for k, v in dict(x).items()}


def _rekey_vocab(
    vocab: dict[str, str] | None, default_lookup: Any, new_lookup: Any
) -> dict[str, str] | None:
    if not vocab or not default_lookup:
        return vocab
    old = {int(k): str(v) for k, v in dict(default_lookup).items()}
    new = {int(k): str(v) for k, v in dict(new_lookup).items()}
    out: dict[str, str] = {}
    for code, sym in new.items():
        meaning = vocab.get(old.get(code, ""))
        if meaning is not None:
            out[sym] = meaning
    return out or vocab


def build_prefix(
    instruction: str,
    grid_vocab: Mapping[str, str] | None,
    action_names: Sequence[str] | None,
    max_actions_per_traj: int,
    action_sep: str,
) -> str:
    """The first user message: instruction, symbol legend, available actions (RAGEN)."""
    text = instruction
    if grid_vocab:
        text += "\nThe meaning of each symbol in the state is:\n" + ", ".join(
            f"{k}: {v}" for k, v in grid_vocab.items()
        )
    if action_names:
        text += "\nYour available actions are:\n" + ", ".join(action_names)
        text += (
            f"\nYou can make up to {max_actions_per_traj} actions, "
            f'separated by the action separator " {action_sep} "\n'
        )
    return text


def make_env_prompt(spec: TagSpec, settings: TurnSettings) -> EnvPrompt:
    """Resolve a tag's prompt prefix once (config keys over the env's own description)."""
    desc = describe_env(spec.env_type, spec.env_kwargs)
    instruction = desc.instruction if spec.env_instruction is None else spec.env_instruction
    vocab = desc.grid_vocab
    if spec.grid_vocab and not (spec.env_kwargs.get("grid_vocab")
                                or spec.env_kwargs.get("grid_lookup")):
        # custom_envs.<tag>.grid_vocab only reaches the prompt, never the env, so it is
        # trusted only while the env draws with its default symbols.
        vocab = _as_str_dict(spec.grid_vocab)
    lookup = _as_lookup(spec.action_lookup) or desc.action_lookup
    names = tuple(lookup[k] for k in sorted(lookup)) if lookup else None
    prefix = build_prefix(instruction, vocab, names, spec.max_actions_per_traj,
                          settings.action_sep)
    return EnvPrompt(spec, prefix, names, names or desc.episode_action_names)


# ------------------------------------------------------------------ episodes
@dataclass
class EpisodeState:
    """One env's episode in the driver: identity, stored history, budget, end state."""

    env_id: int
    group_id: int
    seed: int
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
    gen_batch: int = 0

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


@dataclass(frozen=True)
class TurnOutcome:
    """What the env returned for a planned turn (the pool's TurnResult, minus timing)."""

    obs: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    n_executed: int
    error: str | None = None


def start_episode(
    prompt: EnvPrompt, env_id: int, group_id: int, seed: int, obs: str, info: Mapping[str, Any]
) -> EpisodeState:
    """An episode after reset. A reset error ends it at once (nothing can be asked of it)."""
    ep = EpisodeState(env_id=env_id, group_id=group_id, seed=seed, prompt=prompt,
                      state=str(obs), anchor_obs=str(info.get("anchor_obs", obs)))
    err = info.get("error")
    if err:
        ep.done, ep.end_reason, ep.error = True, "error", str(err)
    return ep


def plan_turn(ep: EpisodeState, reply: str, settings: TurnSettings) -> TurnPlan:
    """Parse a reply and decide what runs. Never raises on any text."""
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
    ep: EpisodeState, plan: TurnPlan, outcome: TurnOutcome | None, settings: TurnSettings
) -> Turn:
    """Record one turn into the episode (``outcome`` is None when nothing was executed)."""
    info: dict[str, Any] = {}
    reward, n_exec, error = 0.0, 0, None
    env_done = False
    if outcome is not None:
        info = {k: v for k, v in outcome.info.items() if k != "anchor_obs"}
        reward, n_exec, error = float(outcome.reward), int(outcome.n_executed), outcome.error
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
    if error:
        ep.done, ep.end_reason, ep.error = True, "error", str(error)
    elif env_done:
        ep.done, ep.success = True, bool(info.get("success", False))
        ep.terminated, ep.truncated = bool(outcome and outcome.terminated), bool(
            outcome and outcome.truncated and not outcome.terminated)
        ep.end_reason = "terminated" if ep.terminated else "truncated"
    elif ep.num_actions >= ep.prompt.spec.max_actions_per_traj:
        ep.done, ep.truncated, ep.end_reason = True, True, "action_budget"
    turn.done = ep.done
    return turn


# ------------------------------------------------------------------ messages
def _state_text(state: str, actions_left: int, max_tokens: int, enable_think: bool) -> str:
    fmt = THINK_FORMAT if enable_think else ANSWER_FORMAT
    return (f"State:\n{state}\nYou have {actions_left} actions left. Always output: {fmt} "
            f"with no extra text. Strictly follow this format. "
            f"Max response length: {max_tokens} words (tokens).\n")


def _reward_text(turn: Turn) -> str:
    # RAGEN starts each turn's sum at the integer 0, so a turn that ran nothing shows "0".
    value: float | int = turn.reward if turn.executed else 0
    return f"Reward:\n{value}\n"


def build_messages(
    ep: EpisodeState, settings: TurnSettings, *, for_update: bool = False
) -> list[Message]:
    """The chat for ``ep``: what the policy sees now, or (``for_update``) the training view
    without the final state and the final reward. Reads the episode, never changes it."""
    spec = ep.prompt.spec
    entries: list[tuple[int, Turn | None]] = [(i + 1, t) for i, t in enumerate(ep.turns)]
    if not for_update:
        entries.append((len(ep.turns) + 1, None))
    k = settings.max_context_window
    if k is not None and k > 0:
        entries = entries[-k:]
    messages: list[Message] = [{"role": "system", "content": SYSTEM_PROMPT},
                               {"role": "user", "content": ep.prompt.prefix}]
    for pos, (number, turn) in enumerate(entries):
        text = f"\nTurn {number}:\n"
        if turn is None:
            text += _state_text(ep.state, ep.actions_left, spec.max_tokens, settings.enable_think)
        else:
            text += _state_text(turn.state, turn.actions_left, spec.max_tokens,
                                settings.enable_think)
        messages[-1] = {"role": messages[-1]["role"],
                        "content": messages[-1]["content"] + text}
        if turn is not None:
            messages.append({"role": "assistant", "content": turn.llm_response})
            if not (for_update and pos == len(entries) - 1):
                messages.append({"role": "user", "content": _reward_text(turn)})
    return messages
