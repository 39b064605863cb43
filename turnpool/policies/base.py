"""The policy protocol: a batch of chat conversations in, one reply text per conversation out.

The collector calls ``generate`` once per turn with the conversations of the envs that are
still running. ``contexts`` carries what the collector knows about each env (its type, the
current observation, the legal action names, the turn index, the seed, ...), so scripted
policies can act without parsing prompts and stay deterministic per env whatever the batch
composition. LLM-backed policies ignore it.

A policy that can also report tokens (`TokenPolicy`: ``hf``, ``openai``) implements
``generate_tokens``: given, per conversation, the token ids the model has already seen and
said (its previous prompt and reply), it extends them with the tokens of the new messages
only, so that a multi-turn episode is one token sequence the model really saw, and returns a
`TokenTurn` (ids, log-probabilities) per reply. Trainers need exactly that sequence with a
loss mask (1 for model tokens, 0 for env and template tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]


@dataclass(frozen=True)
class TurnContext:
    """What the collector knows about one env at the turn being generated for."""

    env_id: int
    env_type: str
    env_kwargs: dict[str, Any]
    obs: str
    action_names: list[str] | None
    turn: int
    actions_left: int
    max_actions_per_turn: int
    action_sep: str
    enable_think: bool
    seed: int
    tag: str


@runtime_checkable
class Policy(Protocol):
    """Anything with ``generate`` and ``close`` is a policy."""

    def generate(
        self, batch: list[list[Message]], contexts: list[TurnContext] | None = None
    ) -> list[str]:
        """One reply per conversation, in order; never raises for a bad reply (returns "")."""
        ...

    def close(self) -> None:
        """Release clients, threads or models. Idempotent."""
        ...


class FailedReply(str):
    """The reply for a conversation the policy could not answer (a failed request): empty
    text, with ``error`` saying why. The collector ends that episode as a ``policy_error``
    instead of scoring the empty text as a bad answer."""

    error: str

    def __new__(cls, error: str) -> FailedReply:
        reply = super().__new__(cls, "")
        reply.error = error
        return reply


class PolicyUnreachable(ConnectionError):
    """The policy's endpoint cannot be reached at all (nothing listens, DNS fails): no reply
    can succeed, so the rollout stops instead of failing every episode."""


@dataclass(frozen=True)
class TokenTurn:
    """One reply with its tokens.

    ``prompt_ids`` are the tokens added before the reply: the whole prompt when
    ``extends`` is False (the first turn, or a history that could not be continued), else
    only the env/template tokens that follow the given prefix. ``logprobs`` holds one
    log-probability per ``response_ids`` token under the distribution it was drawn from.
    ``has_ids`` is False for a reply that came without tokens (only ``text`` is meaningful).
    ``path`` says how the ids were obtained: ``"tokens"`` (ids in, ids out: exact) or
    ``"chat"`` (a chat endpoint rendered and tokenized the chat itself).
    """

    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    extends: bool
    has_ids: bool = True
    path: str = "tokens"
    #: set when the policy did not generate because the episode's token budget is spent:
    #: the episode ends with this reason and the turn is not played
    stop: str | None = None

    @classmethod
    def text_only(cls, text: str) -> TokenTurn:
        """A reply without tokens."""
        return cls(text, [], [], [], False, has_ids=False)


@runtime_checkable
class TokenPolicy(Policy, Protocol):
    """A policy that can also return token ids and log-probabilities (see the module doc)."""

    def generate_tokens(
        self, batch: list[list[Message]], prefixes: list[list[int] | None],
        contexts: list[TurnContext] | None = None,
    ) -> Sequence[TokenTurn]:
        """One `TokenTurn` per conversation (``has_ids`` False where a reply came without
        tokens); ``prefixes[i]`` is the token sequence conversation ``i`` has so far
        (previous prompt + reply), None on its first turn. A policy may also accept
        ``budgets=[...]`` (completion tokens left per conversation, None: no limit; the
        collector passes it only with ``max_episode_tokens``): it caps the reply to what is
        left after the new prompt tokens and answers ``stop="token_budget"`` when nothing
        is left."""
        ...


@dataclass
class PolicyStats:
    """Counters a policy keeps across calls (exposed as ``policy.stats``)."""

    calls: int = 0
    requests: int = 0
    failures: int = 0
    retries: int = 0
    timeouts: int = 0
    generate_seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "requests": self.requests,
            "failures": self.failures,
            "retries": self.retries,
            "timeouts": self.timeouts,
            "generate_seconds": self.generate_seconds,
            "errors": list(self.errors[-20:]),
        }
