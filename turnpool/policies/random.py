"""The ``random`` policy: well-formed random answers, some malformed on purpose.

It exercises the whole loop without a language model: it hits the format-penalty and
invalid-action paths at a known rate. Its reply helpers (`turn_rng`, `format_reply`,
`random_action`) are shared with the ``oracle`` policy, which adds noise with them.

Determinism: every decision for one env at one turn comes from
``np.random.default_rng([policy_seed, ctx.seed, ctx.env_id, ctx.turn])``. The reply therefore
does not depend on which other envs share the batch, on the backend, or on thread timing.
"""

from __future__ import annotations

import re
import threading
from typing import ClassVar

import numpy as np

from turnpool.policies.base import Message, PolicyStats, TurnContext

_NUMS = re.compile(r"nums:\s*\[([^\]]*)\]")
_INT = re.compile(r"-?\d+")
_GARBAGE_ALPHABET = np.array(list("abcdefghijklmnopqrstuvwxyz ABCDEFXYZ0123456789.,;!?-_"))
_THOUGHTS = ("Let me think about the state.", "This move looks good.",
             "I will try this.", "Following the plan.")


def require_contexts(batch: list[list[Message]], contexts: list[TurnContext] | None,
                      who: str) -> list[TurnContext]:
    if contexts is None or len(contexts) != len(batch):
        raise ValueError(f"the {who} policy needs one TurnContext per conversation "
                         f"(got {0 if contexts is None else len(contexts)} for {len(batch)})")
    return contexts


def turn_rng(policy_seed: int, ctx: TurnContext) -> np.random.Generator:
    """The generator for one env at one turn, independent of batch composition."""
    return np.random.default_rng([int(policy_seed), int(ctx.seed), int(ctx.env_id),
                                  int(ctx.turn)])


def format_reply(actions: list[str], ctx: TurnContext, thought: str) -> str:
    """``<think>…</think><answer>a1 || a2</answer>`` (no think part when think is disabled)."""
    answer = f"<answer>{f' {ctx.action_sep} '.join(actions)}</answer>"
    return f"<think>{thought}</think>{answer}" if ctx.enable_think else answer


def turn_capacity(ctx: TurnContext) -> int:
    """How many actions one reply may carry: the per-turn limit, within the remaining budget."""
    return max(1, min(int(ctx.max_actions_per_turn), int(ctx.actions_left)))


def random_free_text(rng: np.random.Generator, ctx: TurnContext) -> str:
    """A random answer for envs without an action list: an expression or a number."""
    match = _NUMS.search(ctx.obs)
    if match is None:
        return str(int(rng.integers(0, 1000)))
    nums = [int(x) for x in _INT.findall(match.group(1))] or [int(rng.integers(1, 10))]
    order = rng.permutation(len(nums))
    used = [str(nums[int(i)]) for i in order[: int(rng.integers(1, len(nums) + 1))]]
    expr = used[0]
    for term in used[1:]:
        op = "+-*/"[int(rng.integers(4))]
        expr = f"({expr} {op} {term})" if rng.random() < 0.3 else f"{expr} {op} {term}"
    return expr


def random_action(rng: np.random.Generator, ctx: TurnContext) -> str:
    """One legal-looking action: a random name from the list, or random free text."""
    if ctx.action_names:
        return str(ctx.action_names[int(rng.integers(len(ctx.action_names)))])
    return random_free_text(rng, ctx)


def malformed_reply(rng: np.random.Generator, ctx: TurnContext) -> str:
    """A reply that fails the ``<think>/<answer>`` format in one of several ways."""
    kind = int(rng.integers(4))
    if kind == 0:  # the action without any tags
        return random_action(rng, ctx)
    if kind == 1:  # thinking but no answer
        return f"<think>{_THOUGHTS[int(rng.integers(len(_THOUGHTS)))]}</think>"
    if kind == 2:  # an answer that carries no action
        return format_reply([], ctx, "nothing to do")
    length = int(rng.integers(1, 80))
    return "".join(rng.choice(_GARBAGE_ALPHABET, size=length))


class ScriptedPolicy:
    """What the scripted policies share: a reply is a pure function of the policy seed and the
    turn's context (`reply`), so ``generate`` only counts and maps. ``stats`` and ``_lock`` are
    set by the subclass (rollout threads may share one policy)."""

    kind: ClassVar[str] = "scripted"
    stats: PolicyStats
    _lock: threading.Lock

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        ctxs = require_contexts(batch, contexts, self.kind)
        with self._lock:
            self.stats.calls += 1
            self.stats.requests += len(ctxs)
        return [self.reply(ctx) for ctx in ctxs]

    def reply(self, ctx: TurnContext) -> str:
        raise NotImplementedError


class RandomPolicy(ScriptedPolicy):
    """Well-formed random answers; with probability ``invalid_rate`` a malformed reply.

    Example:
        >>> from turnpool.policies import TurnContext
        >>> ctx = TurnContext(env_id=0, env_type="sokoban", env_kwargs={}, obs="#P#",
        ...                   action_names=["Up", "Down"], turn=0, actions_left=5,
        ...                   max_actions_per_turn=1, action_sep="||", enable_think=False,
        ...                   seed=1, tag="S")
        >>> RandomPolicy(seed=0).generate([[]], [ctx])[0] in ("<answer>Up</answer>",
        ...                                                  "<answer>Down</answer>")
        True
    """

    kind = "random"

    def __init__(self, seed: int = 0, invalid_rate: float = 0.0,
                 min_actions: int = 1, max_actions: int | None = None) -> None:
        if not 0.0 <= invalid_rate <= 1.0:
            raise ValueError(f"invalid_rate must be in [0, 1], got {invalid_rate}")
        self.seed = int(seed)
        self.invalid_rate = float(invalid_rate)
        self.min_actions = max(1, int(min_actions))
        self.max_actions = max_actions
        self.stats = PolicyStats()
        self._lock = threading.Lock()  # rollout threads may share one policy

    def reply(self, ctx: TurnContext) -> str:
        """The reply for one env at one turn (a pure function of seeds and context)."""
        rng = turn_rng(self.seed, ctx)
        if rng.random() < self.invalid_rate:
            return malformed_reply(rng, ctx)
        cap = turn_capacity(ctx)
        if self.max_actions is not None:
            cap = max(1, min(cap, int(self.max_actions)))
        n = int(rng.integers(min(self.min_actions, cap), cap + 1))
        actions = [random_action(rng, ctx) for _ in range(n)]
        return format_reply(actions, ctx, _THOUGHTS[int(rng.integers(len(_THOUGHTS)))])

    def close(self) -> None:
        """Nothing to release."""
