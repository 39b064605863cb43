"""LLM text -> env actions.

Model output is hostile input: it can be empty, a megabyte long, binary junk, or carry tags
nested, unclosed or repeated. Everything here is pure (inputs are never mutated), never raises
on any text, and does bounded, linear work: texts are cut to ``MAX_TEXT_CHARS`` before any
search, tags are located with ``str.find`` instead of lazy regexes (``<a>(.*?)</a>`` retried
from every ``<a>`` is quadratic on ``"<a>" * n``), and nothing is ever evaluated.

Two layers:

* ``parse_response`` splits one turn the way RAGEN's context manager does:
  ``<think>…</think><answer>a1 || a2</answer>`` -> think text, action strings, format flag
  and a canonical re-formatted text for the history.
* ``projection_for(env_type)`` maps each action string to an env action plus a
  valid flag. It accepts ``<think>…</think><answer>X</answer>``, ``<answer>X</answer>``,
  ``<action>X</action>`` and a bare ``X``. Names match case-insensitively and exactly:
  ``"upper-left"`` is invalid, never ``"up"``. RAGEN's formats: several actions joined by
  ``||`` (``<answer>Up || Left</answer>``) project to a list of actions for envs with named
  actions (valid when every one is); Countdown answers may end in ``= result``
  (``(3 + 5) * 2 = 16`` projects to ``(3 + 5) * 2``); Bandit names are checked against the
  env's arms. Malformed tags (a ``<think>`` never closed, a closing tag before its opening
  one) make a text invalid.

Invalid placeholder (one rule): envs with integer action ids get ``0`` (RAGEN's ids start at 1;
an env that uses 0 as a real id gets ``min(ids) - 1`` instead); every other env gets ``""``.
Both are rejected by the env itself as ``action_is_valid=False``.

Example:
    >>> f = projection_for("countdown")
    >>> f(["<answer>(1 + 2) * 3</answer>", "print(1)"])
    (['(1 + 2) * 3', ''], [True, False])
    >>> parse_response("<think>go</think><answer>Up||Left</answer>")
    ParsedResponse(think='go', actions=['Up', 'Left'], format_valid=True, text='<think>go</think><answer>Up || Left</answer>')
"""  # noqa: E501

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from turnpool.envs.safe_math import MAX_CHARS as MAX_EXPRESSION_CHARS
from turnpool.envs.safe_math import MAX_DEPTH as MAX_EXPRESSION_DEPTH

#: Texts longer than this are cut before any search; a real turn is a few thousand characters.
MAX_TEXT_CHARS = 65_536
#: Bounds on what a single valid action may be, per kind of env.
MAX_FREE_TEXT_CHARS = 4_096
MAX_WEBSHOP_ACTION_CHARS = 512
MAX_WORD_CHARS = 64

INVALID_DISCRETE_ACTION = 0
INVALID_TEXT_ACTION = ""

#: Removed from the think and answer parts (RAGEN's list, plus ``<action>`` tags).
SPECIAL_TOKENS = (
    "<think>", "</think>", "<answer>", "</answer>", "<action>", "</action>",
    "<|im_start|>", "<|im_end|>",
)
#: A bare text containing one of these is a broken tag structure, not an action.
_TAG_MARKERS = ("<think>", "</think>", "<answer>", "</answer>", "<action>", "</action>")

#: The characters Countdown's expression reader accepts (it reads × ÷ − as * / -).
_EXPRESSION_CHARS = re.compile(r"[0-9+\-*/() \t×÷−]+")
_WORD = re.compile(r"\w[\w\-]*")
_NUMBER = re.compile(r"-?\d{1,15}(?:\.\d{1,15})?")
#: RAGEN's separator between the actions of one answer.
ACTION_SEP = "||"
#: Actions kept from one multi-action answer (RAGEN's per-turn default); the rest is dropped.
MAX_ACTIONS_PER_ANSWER = 5
_WEBSHOP_VERBS = ("search", "click")


class ParsedResponse(NamedTuple):
    """One parsed turn: think text, action strings, whether the format matched, canonical text.

    ``text`` is ``<think>{think}</think><answer>{a1 || a2}</answer>`` (``<answer>…</answer>``
    only when think is disabled) when the format matched, else the raw text (cut to
    ``MAX_TEXT_CHARS``), as RAGEN keeps it for the history.
    """

    think: str
    actions: list[str]
    format_valid: bool
    text: str


# ------------------------------------------------------------------------------ tag search
@lru_cache(maxsize=16)
def _think_answer_separator(answer_tag: str) -> re.Pattern[str]:
    return re.compile(rf"</think>\s*<{re.escape(answer_tag)}>")


def _find_tagged(text: str, tag: str) -> str | None:
    """Content of the first complete ``<tag>…</tag>``, as ``re.search("<tag>(.*?)</tag>")``.

    If the first opening tag has no closing tag after it, no later opening tag has one either,
    so one forward scan decides.
    """
    start = text.find(f"<{tag}>")
    if start < 0:
        return None
    start += len(tag) + 2
    end = text.find(f"</{tag}>", start)
    return None if end < 0 else text[start:end]


def _find_think_answer(text: str, answer_tag: str) -> tuple[str, str] | None:
    """``re.search(r"<think>(.*?)</think>\\s*<tag>(.*?)</tag>", DOTALL)`` in linear time.

    The leftmost ``<think>`` is the only start that can match: any separator or closing tag
    that would complete a later start also completes the first one.
    """
    start = text.find("<think>")
    if start < 0:
        return None
    start += len("<think>")
    sep = _think_answer_separator(answer_tag).search(text, start)
    if sep is None:
        return None
    end = text.find(f"</{answer_tag}>", sep.end())
    if end < 0:
        return None
    return text[start:sep.start()], text[sep.end():end]


def _strip_special(text: str) -> str:
    """Remove special tokens, including ones that removal itself reassembles (``<thi<think>nk>``).

    The plain ``replace`` pass handles every real response; the rare leftover case falls back to
    a one-pass stack scan (every token ends with ``>``), so the work stays linear.
    """
    for token in SPECIAL_TOKENS:
        if token in text:
            text = text.replace(token, "")
    if not any(token in text for token in SPECIAL_TOKENS):
        return text.strip()
    out: list[str] = []
    for char in text:
        out.append(char)
        if char != ">":
            continue
        for token in SPECIAL_TOKENS:
            size = len(token)
            if len(out) >= size and "".join(out[-size:]) == token:
                del out[-size:]
                break
    return "".join(out).strip()


def extract_action_text(text: Any) -> str | None:
    """The action part of one response, or ``None`` when the tag structure is broken.

    Priority: ``<think>…</think><answer>X</answer>``, then ``<answer>X</answer>``, then
    ``<action>X</action>`` (first complete match of each), then the whole text when it holds
    no tag at all. Special tokens are removed and whitespace stripped.
    """
    if not isinstance(text, str):
        return None
    text = text[:MAX_TEXT_CHARS]
    if not _tags_well_formed(text):
        return None
    pair = _find_think_answer(text, "answer")
    content = pair[1] if pair is not None else _find_tagged(text, "answer")
    if content is None:
        content = _find_tagged(text, "action")
    if content is None:
        if any(marker in text for marker in _TAG_MARKERS):
            return None
        content = text
    return _strip_special(content)


def _tags_well_formed(text: str) -> bool:
    """Every think/answer/action tag is closed as often as it is opened, and the first
    closing tag comes after the first opening one (linear: ``str.count`` and ``str.find``)."""
    for tag in ("think", "answer", "action"):
        opening, closing = f"<{tag}>", f"</{tag}>"
        n_open = text.count(opening)
        if n_open != text.count(closing):
            return False
        if n_open and text.find(closing) < text.find(opening):
            return False
    return True


# ------------------------------------------------------------------------- parse_response
def parse_response(
    text: Any,
    action_sep: str = "||",
    max_actions: int = 5,
    enable_think: bool = True,
    answer_tag: str = "answer",
) -> ParsedResponse:
    """Split one model turn into think text and up to ``max_actions`` action strings.

    With ``enable_think`` the first ``<think>(.*?)</think>\\s*<answer>(.*?)</answer>`` match is
    used, else the first ``<answer>(.*?)</answer>``. Special tokens are removed from both parts,
    the answer is split on ``action_sep``, parts are stripped, empty ones dropped and the list
    cut to ``max_actions``. ``format_valid`` means the pattern matched and gave at least one
    action. ``answer_tag="action"`` parses the ``<action>…</action>`` prompt style instead.

    Raises ``ValueError`` only for a bad configuration (empty separator, ``max_actions < 1``).
    """
    if not action_sep:
        raise ValueError("action_sep must be a non-empty string")
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1, got {max_actions}")
    if not answer_tag or not answer_tag.isidentifier():
        raise ValueError(f"answer_tag must be a plain tag name, got {answer_tag!r}")
    if not isinstance(text, str):
        return ParsedResponse("", [], False, "")
    text = text[:MAX_TEXT_CHARS]
    if enable_think:
        pair = _find_think_answer(text, answer_tag)
    else:
        answer = _find_tagged(text, answer_tag)
        pair = None if answer is None else ("", answer)
    if pair is None:
        return ParsedResponse("", [], False, text)
    think = _strip_special(pair[0])
    actions = [part.strip() for part in _strip_special(pair[1]).split(action_sep)]
    actions = [part for part in actions if part][:max_actions]
    joined = f" {action_sep} ".join(actions)
    canonical = f"<{answer_tag}>{joined}</{answer_tag}>"
    if enable_think:
        canonical = f"<think>{think}</think>{canonical}"
    return ParsedResponse(think, actions, bool(actions), canonical)


# --------------------------------------------------------------------- action validation
def _check_discrete(candidate: str, names: Mapping[str, Any]) -> tuple[Any, bool]:
    if candidate in names:  # exact spelling first, so the lookup stays O(1)
        return names[candidate], True
    key = candidate.lower()
    return (names[key], True) if key in names else (None, False)


def _check_word(candidate: str) -> tuple[str, bool]:
    ok = len(candidate) <= MAX_WORD_CHARS and _WORD.fullmatch(candidate) is not None
    return (candidate.lower(), True) if ok else (INVALID_TEXT_ACTION, False)


def _check_expression(candidate: str) -> tuple[str, bool]:
    if "=" in candidate:  # "(3 + 5) * 2 = 16": the expression is what the env scores
        candidate, _, result = candidate.partition("=")
        if _NUMBER.fullmatch(result.strip()) is None:
            return INVALID_TEXT_ACTION, False
        candidate = candidate.strip()
    if not candidate or len(candidate) > MAX_EXPRESSION_CHARS:
        return INVALID_TEXT_ACTION, False
    if _EXPRESSION_CHARS.fullmatch(candidate) is None or not any(c.isdigit() for c in candidate):
        return INVALID_TEXT_ACTION, False
    depth = 0
    for char in candidate:
        depth += (char == "(") - (char == ")")
        if not 0 <= depth <= MAX_EXPRESSION_DEPTH:
            return INVALID_TEXT_ACTION, False
    return (candidate, True) if depth == 0 else (INVALID_TEXT_ACTION, False)


def _check_free_text(candidate: str) -> tuple[str, bool]:
    ok = 0 < len(candidate) <= MAX_FREE_TEXT_CHARS
    return (candidate, True) if ok else (INVALID_TEXT_ACTION, False)


def _check_webshop(candidate: str) -> tuple[str, bool]:
    if len(candidate) > MAX_WEBSHOP_ACTION_CHARS or not candidate.endswith("]"):
        return INVALID_TEXT_ACTION, False
    verb, bracket, rest = candidate.partition("[")
    verb = verb.strip().lower()
    content = rest[:-1].strip()
    if not bracket or verb not in _WEBSHOP_VERBS or not content:
        return INVALID_TEXT_ACTION, False
    return f"{verb}[{content}]", True


_TEXT_CHECKS: dict[str, Callable[[str], tuple[str, bool]]] = {
    "word": _check_word,
    "expression": _check_expression,
    "free_text": _check_free_text,
    "webshop": _check_webshop,
}


@dataclass(frozen=True, eq=False)  # identity equality keeps instances hashable
class Projection:
    """A picklable ``list[str] -> (actions, valids)`` function for one env type.

    ``kind`` is ``"discrete"`` (names -> ids), ``"names"`` (names -> canonical names, for a
    fixed set of names whose ids change per episode), or a text kind (``"word"``,
    ``"expression"``, ``"free_text"``, ``"webshop"``). ``names`` maps lowercased names to the
    returned action.
    """

    env_type: str
    kind: str
    names: Mapping[str, Any] = field(default_factory=dict)
    invalid_action: Any = INVALID_TEXT_ACTION
    max_actions: int = MAX_ACTIONS_PER_ANSWER

    def project_one(self, text: Any) -> tuple[Any, bool]:
        """``(action, valid)`` for one response; ``(invalid_action, False)`` when invalid.

        For named actions, ``"Up || Left"`` gives the list ``[1, 3]`` (at most
        ``max_actions``, empty parts dropped), valid when every part is a name."""
        candidate = extract_action_text(text)
        if candidate is None:
            return self.invalid_action, False
        if self.kind in ("discrete", "names"):
            if ACTION_SEP in candidate:
                parts = [p.strip() for p in candidate.split(ACTION_SEP)]
                parts = [p for p in parts if p][: self.max_actions]
                checked = [_check_discrete(p, self.names) for p in parts]
                if checked and all(ok for _, ok in checked):
                    actions = [a for a, _ in checked]
                    return (actions if len(actions) > 1 else actions[0]), True
                return self.invalid_action, False
            action, ok = _check_discrete(candidate, self.names)
        else:
            action, ok = _TEXT_CHECKS[self.kind](candidate)
        return (action, True) if ok else (self.invalid_action, False)

    def __call__(self, texts: Sequence[Any]) -> tuple[list[Any], list[bool]]:
        if isinstance(texts, (str, bytes)):
            raise TypeError("projection takes a list of texts, not a single string")
        pairs = [self.project_one(text) for text in texts]
        return [action for action, _ in pairs], [ok for _, ok in pairs]

    @property
    def legal_actions(self) -> list[Any]:
        """Every action a valid projection can return (discrete kinds only; else ``[]``)."""
        return sorted(set(self.names.values()), key=str)


def _names_of(action_lookup: Mapping[int, str]) -> dict[str, int]:
    names: dict[str, int] = {}
    for aid, name in action_lookup.items():
        names.setdefault(str(name).strip().lower(), int(aid))
    return names


def projection_for(
    env_type: str,
    *,
    arm_names: Sequence[str] | None = None,
    action_lookup: Mapping[int, str] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> Projection:
    """The projection for ``env_type`` (a registered name, an alias such as ``"frozenlake"``,
    or ``"module:Class"``).

    * discrete envs (a class-level ``action_lookup``, e.g. sokoban, frozen_lake): the action
      name -> its id; ``action_lookup`` overrides the class's table;
    * envs whose names change ids per episode (``bandit``): the matching name, from
      ``arm_names`` or else from an env built with ``env_kwargs`` (its configured arms);
    * ``countdown``: the expression (a trailing ``= number`` is dropped) when it uses only
      digits, ``+ - * / ( )`` (or ``× ÷ −``) and blanks, with balanced parentheses nested at
      most ``MAX_EXPRESSION_DEPTH`` deep and at most ``MAX_EXPRESSION_CHARS`` long -- the
      env's own bounds; never evaluated here;
    * ``metamathqa`` and envs without an ``action_lookup``: any non-empty stripped text up to
      ``MAX_FREE_TEXT_CHARS``;
    * ``webshop``: ``search[...]`` or ``click[...]`` with non-empty content (the env checks it
      against the page's available actions).

    Raises ``KeyError`` for an env type that is neither registered nor an entry point.
    """
    if arm_names is not None:
        names = {str(n).strip().lower(): str(n).strip() for n in arm_names if str(n).strip()}
        return Projection(env_type, "names", names, INVALID_TEXT_ACTION)
    if action_lookup is None:
        from turnpool.envs.registry import action_kind, resolve

        kind = action_kind(env_type)
        if kind not in ("discrete", "names"):
            return Projection(env_type, kind)
        lookup: Mapping[int, str] = resolve(env_type)[0].action_lookup or {}
        if kind == "names":
            lookup = _episode_lookup(env_type, env_kwargs) or lookup
            if not lookup:  # names unknown: any single word, as the env decides
                return Projection(env_type, "word")
            names = {str(n).strip().lower(): str(n).strip() for n in lookup.values()}
            return Projection(env_type, "names", names, INVALID_TEXT_ACTION)
        action_lookup = lookup
    ids = [int(aid) for aid in action_lookup]
    invalid = INVALID_DISCRETE_ACTION if INVALID_DISCRETE_ACTION not in ids else min(ids) - 1
    return Projection(env_type, "discrete", _names_of(action_lookup), invalid)


def _episode_lookup(env_type: str, env_kwargs: Mapping[str, Any] | None
                    ) -> Mapping[int, str] | None:
    """The names an env built with ``env_kwargs`` offers (Bandit: its two arms)."""
    from turnpool.envs.registry import make

    try:
        env = make(env_type, **dict(env_kwargs or {}))
    except Exception:  # an env that cannot be built here (needs a server): names unknown
        return None
    try:
        return env.action_lookup_for_episode()
    finally:
        env.close()


def project_actions(
    env_type: str, action_strings: Sequence[Any], **kwargs: Any
) -> list[tuple[Any, bool]]:
    """``[(action, valid), ...]`` for the action strings of one turn (see ``parse_response``)."""
    projection = projection_for(env_type, **kwargs)
    return [projection.project_one(text) for text in action_strings]
