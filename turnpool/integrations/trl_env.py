"""TRL's ``environment_factory``: a turnpool env as a class of tools for ``GRPOTrainer``.

`environment_factory` returns a class for ``GRPOTrainer(environment_factory=...)``. TRL builds
instances with no arguments, calls ``reset(**row)`` before each rollout and exposes the public
methods as tools. Each instance leases one env slot from this process's pool
(`turnpool.integrations.leases.shared_leases`) on ``reset``, gives the previous one back first,
and gives it back when the instance goes away. A discrete env's actions become one tool each
(``up()``, ``left()``, ...); other envs get one ``act(action: str)`` tool. ``get_reward()``
returns the episode's reward sum, or None for a failed env (TRL then leaves the rollout
unscored instead of scoring it 0). The dataset row's ``seed`` column (or, without one, a
digest of the row) is the episode's seed, so the repeated rows of a GRPO group share their
start state. ``reset`` tells the model its tools (`tool_prompt`; RAGEN texts' ``<answer>``
sentences are dropped), a call the env cannot take is answered with the reason and recorded in
``invalid_calls``, and ``tool_steps`` counts env steps.

Every class shares `LeasedEnv`'s methods; what differs per env (the lease settings, the
opening text, the tools) is one `ToolEnvSpec` and the tool methods of the class.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turnpool.integrations.leases import shared_leases
from turnpool.pool.slots import SlotEngine
from turnpool.rollout.prompts import describe_env, make_env_prompt
from turnpool.rollout.settings import TagSpec, TurnSettings
from turnpool.worker.failures import failure_of

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


def _tool_name(action: str, taken: set[str]) -> str:
    name = re.sub(r"\W+", "_", action.strip().lower()).strip("_") or "action"
    if name[0].isdigit() or keyword.iskeyword(name) or name in _RESERVED:
        name = f"action_{name}"
    base, k = name, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


@dataclass(frozen=True)
class ToolEnvSpec:
    """What one `environment_factory` class plays: the env, its lease pool, its opening text."""

    env_type: str
    env_kwargs: dict[str, Any]
    capacity: int
    pool_options: dict[str, Any]
    seed_key: str
    max_actions: int | None
    intro: str
    wait_s: float = field(init=False)

    def __post_init__(self) -> None:
        step_timeout = float(self.pool_options.get("step_timeout") or 0.0)
        object.__setattr__(self, "wait_s", step_timeout + WAIT_MARGIN_S)

    def leases(self) -> SlotEngine:
        """This process's pool for the env (`shared_leases`: one per env and settings)."""
        return shared_leases(self.env_type, self.env_kwargs, self.capacity, self.pool_options)


class LeasedEnv:
    """One TRL environment instance: one leased env slot at a time (see the module docstring).

    Subclasses (built by `environment_factory`) set `spec` and add the tool methods; the
    methods here are ``reset``, ``get_reward`` (which TRL treats apart) and private ones.
    """

    spec: ClassVar[ToolEnvSpec]

    def __init__(self) -> None:
        self._slot: int | None = None
        self._reward = 0.0
        self._done = False
        self._failure: str | None = None
        self._actions = 0
        self._release: weakref.finalize[Any, Any] | None = None
        self.tool_steps = 0  # env steps taken through tool calls
        self.invalid_calls: list[str] = []  # why each rejected call was rejected

    def reset(self, **row: Any) -> str:
        """Start a new episode (gives the previous env slot back first)."""
        self._give_back()
        spec = self.spec
        leases = spec.leases()
        slot = leases.lease()
        self._slot = slot
        self._release = weakref.finalize(self, leases.release, slot)
        self._reward, self._done, self._failure, self._actions = 0.0, False, None, 0
        self.tool_steps, self.invalid_calls = 0, []
        seed = seed_of_row(row, spec.seed_key)
        obs, info, *_ = leases.submit_reset(slot, seed).result(spec.wait_s)
        if info.get("error"):
            self._done, self._failure = True, failure_of(info).value
            return f"The environment failed to start: {info['error']}"
        return f"{spec.intro}\n{without_answer_format(obs)}"

    def get_reward(self) -> float | None:
        """The episode's reward so far; None when the env failed (TRL leaves it unscored)."""
        return None if self._failure is not None else float(self._reward)

    def _give_back(self) -> None:
        if self._release is not None:
            self._release()
        self._slot, self._release = None, None

    def _act(self, action: Any) -> str:
        if self._slot is None:
            return self._reject("no episode is running")
        if self._done:
            return self._reject("the episode is over; no more actions are accepted")
        if not isinstance(action, str) or not action.strip():
            return self._reject(f"the action must be non-empty text, got {type(action).__name__}")
        spec = self.spec
        if spec.max_actions is not None and self._actions >= spec.max_actions:
            self._done = True
            return "The action budget is spent; the episode is over."
        future = spec.leases().submit_step(self._slot, [action[:MAX_ACTION_CHARS]])
        try:
            res = future.result(timeout=spec.wait_s)
        except FutureTimeout:  # the pool had no step_timeout: give up on this env here
            self._done, self._failure = True, "timeout"
            return f"The environment failed: no answer after {spec.wait_s:.0f} s"
        self._actions += 1
        self.tool_steps += 1
        self._reward += float(res.reward_sum)
        if res.error:
            self._done, self._failure = True, failure_of(res.info).value
            return f"The environment failed: {res.error}"
        self._done = bool(res.terminated or res.truncated)
        text = f"{without_answer_format(res.obs)}\nReward: {res.reward_sum}"
        if res.info.get("action_is_valid") is False:
            self.invalid_calls.append(f"not a valid action: {action[:80]!r}")
            text += "\nThat action was not valid."
        return text + ("\nThe episode is over." if self._done else "")

    def _reject(self, reason: str) -> str:
        self.invalid_calls.append(reason[:200])
        return f"Invalid call: {reason}."


def environment_factory(
    env_type: str, env_kwargs: Mapping[str, Any] | None = None, *, capacity: int = 64,
    pool_options: Mapping[str, Any] | None = None, seed_key: str = "seed",
    max_actions: int | None = None, class_name: str | None = None,
) -> type[LeasedEnv]:
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
    tag = TagSpec(tag=env_type, env_type=env_type, env_kwargs=kwargs,
                  max_actions_per_traj=max_actions or 10)
    names = make_env_prompt(tag, TurnSettings()).valid_names or ()
    desc = describe_env(env_type, kwargs)
    members: dict[str, Any] = {"__doc__": f"turnpool env {env_type!r} as a TRL environment."}
    taken = set(_RESERVED)
    for action in names:
        members[_tool_name(action, taken)] = _action_tool(action, env_type)
    if not names:
        members["act"] = _text_tool(env_type, desc.instruction)
    tool_names = [name for name in members if not name.startswith("_") and name != "act"]
    members["spec"] = ToolEnvSpec(
        env_type=env_type, env_kwargs=kwargs, capacity=capacity,
        pool_options=dict(pool_options or {}), seed_key=seed_key, max_actions=max_actions,
        intro=tool_prompt(env_type, desc.instruction, desc.grid_vocab, tool_names, max_actions))
    name = class_name or re.sub(r"\W", "", env_type.title()) + "Env"
    cls = type(name, (LeasedEnv,), members)
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


def _action_tool(action: str, env_type: str) -> Callable[[LeasedEnv], str]:
    def tool(self: LeasedEnv) -> str:
        return self._act(action)

    tool.__name__ = tool.__qualname__ = _tool_name(action, set(_RESERVED))
    tool.__doc__ = (f"Take the action {action!r} in the {env_type} environment.\n\n"
                    f"Returns:\n    The new observation, the reward and whether the episode "
                    f"is over.\n")
    tool.__annotations__ = {"return": str}
    return tool


def _text_tool(env_type: str, instruction: str) -> Callable[[LeasedEnv, str], str]:
    def act(self: LeasedEnv, action: str) -> str:
        return self._act(action)

    rules = re.split(r"\s*Answer with\b", instruction, maxsplit=1)[0]
    act.__doc__ = (f"Take one action in the {env_type} environment.\n\n"
                   f"Args:\n    action: The action text ({rules[:200].strip() or 'free text'}"
                   f").\n\nReturns:\n    The new observation, the reward and whether the episode "
                   f"is over.\n")
    act.__annotations__ = {"action": str, "return": str}
    return act
