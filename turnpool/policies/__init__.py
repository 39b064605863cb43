"""Policies: ``generate(batch_of_messages, contexts) -> list[str]``, one file per kind.

``make_policy({"name": "oracle", "epsilon": 0.1, "seed": 0})`` builds one from a config dict.
Each kind lives in its own module and is imported only when asked for, so the core install
never imports torch, transformers or openai.

| name     | module  | what it is                                                  |
|----------|---------|-------------------------------------------------------------|
| random   | random  | well-formed random answers, ``invalid_rate`` malformed ones |
| oracle   | oracle  | the env oracles, with ``epsilon`` noise                     |
| openai   | openai  | any OpenAI-compatible chat endpoint (vLLM, SGLang, ...)     |
| hf       | hf      | a local transformers model, batched, thread-safe            |

Adding a policy is one module with a class taking keyword options and one ``_KINDS`` line.
`turnpool.policies.tiny_llm` builds (and serves) a tiny offline chat model for the LLM paths.
"""

from __future__ import annotations

import difflib
import inspect
import logging
from typing import Any

from turnpool.envs.registry import load_entry_point
from turnpool.policies.base import Message, Policy, PolicyStats, TurnContext

_KINDS: dict[str, str] = {
    "random": "turnpool.policies.random:RandomPolicy",
    "oracle": "turnpool.policies.oracle:OraclePolicy",
    "openai": "turnpool.policies.openai:OpenAIPolicy",
    "hf": "turnpool.policies.hf:HFPolicy",
}

logger = logging.getLogger(__name__)

__all__ = ["Message", "Policy", "PolicyStats", "TurnContext", "make_policy", "policy_names"]


def policy_names() -> list[str]:
    """The names ``make_policy`` accepts."""
    return sorted(_KINDS)


def _policy_class(name: str) -> Any:
    return load_entry_point(_KINDS[name])


def _option_names(name: str) -> set[str]:
    """Keyword options of a kind ({} when its optional dependencies are not installed)."""
    try:
        cls = _policy_class(name)
    except ImportError:
        return set()
    return set(inspect.signature(cls.__init__).parameters) - {"self"}


def make_policy(cfg: dict[str, Any]) -> Policy:
    """Build a policy from ``{"name": <kind>, **options}``.

    Options that only another kind takes (say ``epsilon`` left over from the default oracle
    config after switching ``name`` to ``hf``) are dropped with a log line; options no kind
    takes, and unknown names, raise ``TypeError``/``ValueError`` naming them.
    """
    options = dict(cfg)
    name = options.pop("name", None) or options.pop("type", None)
    if name not in _KINDS:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(policy_names())}")
    own = _option_names(name)
    others = set().union(*(_option_names(k) for k in _KINDS if k != name)) - own
    for key in sorted(set(options) & others):
        logger.info("policy %r does not take %r (an option of another policy); ignoring it",
                    name, key)
        del options[key]
    cls = _policy_class(name)
    unknown = sorted(set(options) - own)
    if unknown and own:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(own), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise TypeError(f"policy {name!r} got unexpected option(s) {', '.join(hints)}")
    try:
        policy: Policy = cls(**options)
    except TypeError as exc:
        raise TypeError(f"policy {name!r}: {exc}") from exc
    return policy
