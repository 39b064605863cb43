"""Observations -> chat messages, in RAGEN's format, reproduced string for string.

Each tag's first user message (instruction, symbol legend, action list) is built once into an
`EnvPrompt`; every turn then appends the state and the previous reward. `build_messages` only
reads an episode, so the same history yields the policy's view (with the current state) and
the training view (without the final state and reward).

Prompt format (RAGEN's ContextManager)::

    system: "You're a helpful assistant. "
    user:   <env_instruction>
            [\\nThe meaning of each symbol in the state is:\\n# : wall, ...]
            [\\nYour available actions are:\\nUp, Down, ...
             \\nYou can make up to N actions, separated by the action separator " || "\\n]
            \\nTurn 1:\\nState:\\n<grid>\\nYou have 10 actions left. Always output: <think> ...
    assistant: <think>...</think><answer>Up || Left</answer>
    user:   Reward:\\n-0.2\\n
            \\nTurn 2:\\nState:\\n...

RAGEN v2 (``TurnSettings.ragen_version == "v2"``, mll-lab-nu/RAGEN's ContextManager) moves the
prefix into the system message (``"You're a helpful assistant. " + prefix``; the first user
message starts at ``"\\nTurn 1:"``), adds ``INVALID_WARNING`` after the state of a turn that
follows one with no valid action, and windows by ``context_window_mode``: ``full`` shows every
turn (``max_context_window`` is ignored), ``limited_multi_turn`` the last ``max_context_window``
history entries as chat turns, ``single_turn`` one user message with a summary of the earlier
entries of the window and the current state.

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
from dataclasses import dataclass
from typing import Any, Protocol

from turnpool.envs.base import TextEnv
from turnpool.envs.registry import resolve
from turnpool.policies.base import Message
from turnpool.rollout.settings import TagSpec, TurnSettings
from turnpool.rollout.trajectory import Turn

SYSTEM_PROMPT = "You're a helpful assistant. "
#: RAGEN v2's line after the state of a turn that follows one with no valid action.
INVALID_WARNING = ("No valid action provided previously. Environment state remains the same. "
                   "Please try again.\n")
THINK_FORMAT = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
ANSWER_FORMAT = "<answer> [your answer] </answer>"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvPrompt:
    """What a tag's prompts are built from.

    ``action_names`` are listed in the prompt (RAGEN lists the env config's
    ``action_lookup``); ``valid_names`` are what a turn accepts, which also covers envs
    whose lookup is only known per episode (Bandit shuffles its arm ids; RAGEN's prompt does
    not list them but its manager still dropped unknown arm names).
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
    vocab = _as_str_dict(kw.get("grid_vocab")) or _as_str_dict(cls.grid_vocab)
    if kw.get("grid_lookup") and not kw.get("grid_vocab"):
        vocab = _rekey_vocab(vocab, cls.grid_lookup, kw["grid_lookup"])
    lookup = _as_lookup(kw.get("action_lookup")) or _as_lookup(cls.action_lookup)
    episode_names: tuple[str, ...] | None = None
    if lookup is None and _has_episode_lookup(cls):
        episode_names = _episode_action_names(cls, kw)
    return EnvDescription(str(cls.instruction or ""), vocab, lookup,
                          episode_names)


def _has_episode_lookup(cls: type[TextEnv]) -> bool:
    return cls.action_lookup_for_episode is not TextEnv.action_lookup_for_episode


def _episode_action_names(cls: type[TextEnv], kw: dict[str, Any]) -> tuple[str, ...] | None:
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
    """Resolve a tag's prompt prefix once, by RAGEN's rule (its ContextManager's).

    The legend and the action list come from the env's *default* description (its class
    attributes, which are RAGEN's default config) overlaid with the tag-level keys of
    ``custom_envs.<tag>`` (``grid_vocab``, ``action_lookup``); the nested ``env_config`` never
    reaches the prompt. A model trained with RAGEN saw exactly this text, so it is kept even
    where it differs from what the env draws (RAGEN's SokobanDifferentGridVocab explains the
    default symbols): set ``custom_envs.<tag>.grid_vocab`` to change the legend, in RAGEN and
    here alike.
    """
    desc = describe_env(spec.env_type)
    instruction = desc.instruction if spec.env_instruction is None else spec.env_instruction
    vocab = _as_str_dict(spec.grid_vocab) or desc.grid_vocab
    lookup = _as_lookup(spec.action_lookup) or desc.action_lookup
    names = tuple(lookup[k] for k in sorted(lookup)) if lookup else None
    prefix = build_prefix(instruction, vocab, names, spec.max_actions_per_traj,
                          settings.action_sep)
    # What a turn accepts follows the env as configured (its own action_lookup, if any).
    own = describe_env(spec.env_type, spec.env_kwargs)
    own_names = (tuple(own.action_lookup[k] for k in sorted(own.action_lookup))
                 if own.action_lookup else None)
    valid = own_names or names or own.episode_action_names
    return EnvPrompt(spec, prefix, names, valid)


# ------------------------------------------------------------------ messages
class ChatHistory(Protocol):
    """What `build_messages` reads of an episode (`turnpool.rollout.episode.EpisodeState`)."""

    @property
    def prompt(self) -> EnvPrompt: ...
    @property
    def turns(self) -> list[Turn]: ...
    @property
    def state(self) -> str: ...
    @property
    def actions_left(self) -> int: ...


def _state_text(state: str, actions_left: int, max_tokens: int, enable_think: bool,
                warning: str = "") -> str:
    fmt = THINK_FORMAT if enable_think else ANSWER_FORMAT
    return (f"State:\n{state}\n{warning}You have {actions_left} actions left. Always output: {fmt} "
            f"with no extra text. Strictly follow this format. "
            f"Max response length: {max_tokens} words (tokens).\n")


def _entry_state(ep: ChatHistory, number: int, turn: Turn | None,
                 settings: TurnSettings) -> str:
    """The state block of history entry ``number`` (``turn`` None: the current state)."""
    state, left = (ep.state, ep.actions_left) if turn is None else (turn.state, turn.actions_left)
    warn = (settings.ragen_version == "v2" and number >= 2
            and ep.turns[number - 2].manager_invalid_action)
    return _state_text(state, left, ep.prompt.spec.max_tokens, settings.enable_think,
                       INVALID_WARNING if warn else "")


def _single_turn(ep: ChatHistory, entries: list[tuple[int, Turn | None]],
                 settings: TurnSettings) -> list[Message]:
    """v2's ``single_turn`` prompt: one user message, the earlier turns of the window as a
    summary and the current state (its default memory, ``SimpleMemory``)."""
    *past, (number, _) = entries
    text = ""
    if past:
        text = (f"Summary: {number - 1} step(s) completed so far. Showing the last "
                f"{len(past)} turn(s) with state/action/reward details. Recent turns:\n---\n")
        for n, turn in past:
            assert turn is not None
            text += (f"Turn {n} State:\n{turn.state}\nTurn {n} Action: {turn.llm_response}\n"
                     f"Turn {n} Reward: {_reward_value(turn)}\n---\n")
    head = "\nCurrent Turn " if past else ""
    text += f"{head}(Turn {number}):\n" + _entry_state(ep, number, None, settings)
    return [{"role": "system", "content": SYSTEM_PROMPT + ep.prompt.prefix},
            {"role": "user", "content": text}]


def _reward_value(turn: Turn) -> float | int:
    return turn.reward if turn.executed else 0


def _reward_text(turn: Turn) -> str:
    # RAGEN starts each turn's sum at the integer 0, so a turn that ran nothing shows "0".
    value: float | int = turn.reward if turn.executed else 0
    return f"Reward:\n{value}\n"


def build_messages(
    ep: ChatHistory, settings: TurnSettings, *, for_update: bool = False
) -> list[Message]:
    """The chat for ``ep``: what the policy sees now, or (``for_update``) the training view
    without the final state and the final reward. Reads the episode, never changes it.

    RAGEN v1 opens the first user message with the tag's prefix; v2 puts it in the system
    message, marks a state that follows a turn with no valid action, and windows by
    ``context_window_mode`` (module docstring)."""
    v2 = settings.ragen_version == "v2"
    entries: list[tuple[int, Turn | None]] = [(i + 1, t) for i, t in enumerate(ep.turns)]
    if not for_update:
        entries.append((len(ep.turns) + 1, None))
    k = settings.max_context_window
    if k is not None and k > 0 and not (v2 and settings.context_window_mode == "full"):
        entries = entries[-k:]
    if v2 and settings.context_window_mode == "single_turn" and not for_update:
        return _single_turn(ep, entries, settings)
    system, first = ((SYSTEM_PROMPT + ep.prompt.prefix, "") if v2
                     else (SYSTEM_PROMPT, ep.prompt.prefix))
    messages: list[Message] = [{"role": "system", "content": system},
                               {"role": "user", "content": first}]
    for pos, (number, turn) in enumerate(entries):
        text = f"\nTurn {number}:\n" + _entry_state(ep, number, turn, settings)
        messages[-1] = {"role": messages[-1]["role"],
                        "content": messages[-1]["content"] + text}
        if turn is not None:
            messages.append({"role": "assistant", "content": turn.llm_response})
            if not (for_update and pos == len(entries) - 1):
                messages.append({"role": "user", "content": _reward_text(turn)})
    return messages


def env_prompts(tags: Sequence[TagSpec], pool_tags: Sequence[str], settings: TurnSettings
                ) -> list[EnvPrompt]:
    """One prompt per env of a pool (``pool_tags`` in env order), each tag's built once."""
    prompts = {t.tag: make_env_prompt(t, settings) for t in tags}
    missing = sorted(set(pool_tags) - set(prompts))
    if missing:
        raise ValueError(f"the pool has tags {missing} that no TagSpec describes")
    return [prompts[t] for t in pool_tags]
