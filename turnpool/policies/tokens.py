"""Rendering a chat into tokens incrementally: the one renderer contract of turnpool.

A multi-turn episode is trained as one token sequence: the first prompt, then each reply
exactly as the model sampled it, with the env's answer and the chat template's markup between
replies. Sampled history is never re-rendered or re-tokenized: a reply decoded and encoded
again can change tokens, the stored history holds the parsed reply rather than the raw one,
and some templates rewrite history (Qwen3 drops the ``<think>`` blocks of earlier turns when
it renders a chat again). So a new turn's prompt is ``what the model saw and sampled so far``
followed by the ids of the new messages only (`ChatRenderer.extend`).

The new messages' ids come from a *bridge*: the template renders a two-message stand-in
history (an optional copy of the real system message, a user line, an assistant line holding
a marker) followed by the new messages and the generation prompt. Everything after the
stand-in assistant's end-of-turn token is the text the template puts between a finished reply
and the next reply. The cost is O(new messages), flat over the episode, and it never depends
on how the template would re-render earlier turns. When the sampled reply did not end with an
end-of-turn token (it was cut at the length limit) the template's own closing tokens are
added first.

History modes (`HISTORY_MODES`):

* ``"verbatim"`` (default) - one sequence per episode, the sampled history kept as sampled.
* ``"per_turn"`` - every turn is prompted with the template's full render of the chat (the
  chat exactly as the template would show it: for Qwen3 without earlier thoughts) and becomes
  its own training sample (`turnpool.rollout.trajectory.Trajectory.token_samples`).

The tokenizer is duck-typed (``apply_chat_template``, ``encode``, ``eos_token_id``, optional
``convert_tokens_to_ids``), so this module imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from turnpool.policies.base import Message

HISTORY_MODES = ("verbatim", "per_turn")

#: Strings of end-of-turn tokens in common chat vocabularies (ChatML, Llama 3, Gemma,
#: harmony, Mistral, DeepSeek); whichever of them the tokenizer knows end a reply.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|return|>",
                      "<|call|>", "</s>", "<｜end▁of▁sentence｜>", "<|endoftext|>",
                      "<|end_of_text|>", "<eos>")

_MARK = "turnpool-bridge-7f3a"
_USER = "turnpool-bridge-user"


def turn_limit(max_new: int, budget: int | None, new: Sequence[int], extends: bool) -> int:
    """New tokens a turn may sample: the policy's cap, within what is left of the episode's
    token budget (the turn's new prompt ids count when they extend the sequence). Below 1 the
    turn is not generated (a `TokenTurn` with ``stop="token_budget"``)."""
    if budget is None:
        return max_new
    return min(max_new, int(budget) - (len(new) if extends else 0))


def check_history_mode(history: str) -> str:
    if history not in HISTORY_MODES:
        raise ValueError(f"history must be one of {HISTORY_MODES}, got {history!r}")
    return history


def render_chat(tokenizer: Any, messages: Sequence[Message], generation_prompt: bool,
                template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The template's text for ``messages`` (``template_kwargs`` go to the template, such
    as ``enable_thinking``)."""
    return str(tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=generation_prompt,
                                             **dict(template_kwargs or {})))


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens added (special-token strings in the text
    become their ids, as in a rendered template)."""
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def end_of_turn_ids(tokenizer: Any, extra: Iterable[int] = ()) -> frozenset[int]:
    """Ids that end a reply: the tokenizer's eos, the end-of-turn tokens it knows
    (`END_OF_TURN_TOKENS`) and ``extra``."""
    ids = {int(i) for i in extra}
    eos = tokenizer.eos_token_id
    if isinstance(eos, int):
        ids.add(eos)
    for token in END_OF_TURN_TOKENS:
        try:
            tid = tokenizer.convert_tokens_to_ids(token)
        except (KeyError, ValueError, TypeError):
            continue
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return frozenset(ids)


class ChatRenderer:
    """Messages to token ids for one tokenizer and template, turn by turn.

    Example (the tiny offline tokenizer; any HF tokenizer with a chat template works):
        >>> from turnpool.policies.tiny_llm import build_tokenizer
        >>> tok = build_tokenizer(seed=0)
        >>> r = ChatRenderer(tok)
        >>> chat = [{"role": "user", "content": "Push the box."}]
        >>> seq = r.first(chat)                                   # the first prompt
        >>> seq += tok.encode("<answer>Up</answer>", add_special_tokens=False)  # sampled
        >>> chat += [{"role": "assistant", "content": "<answer>Up</answer>"},
        ...          {"role": "user", "content": "Done."}]       # the reply, the env's answer
        >>> seq += r.extend(chat, seq)                            # only the new turn's ids
        >>> seq == r.first(chat)            # here the same ids as rendering the whole chat
        True
    """

    def __init__(self, tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None,
                 end_ids: Iterable[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.end_ids = end_of_turn_ids(tokenizer, end_ids)

    def first(self, messages: Sequence[Message]) -> list[int]:
        """The whole prompt for ``messages`` (ending with the generation prompt)."""
        return encode_text(self.tokenizer, render_chat(self.tokenizer, messages, True,
                                                       self.template_kwargs))

    def extend(self, messages: Sequence[Message], prefix_ids: Sequence[int]) -> list[int]:
        """Ids to append to ``prefix_ids`` (ending with the last sampled reply) so that the
        sequence ends with the messages after the last assistant message of ``messages`` and
        the generation prompt. Raises ``ValueError`` when ``messages`` has no assistant
        message to continue from."""
        last = max((k for k, m in enumerate(messages) if m.get("role") == "assistant"),
                   default=-1)
        if last < 0:
            raise ValueError("no assistant message to continue from")
        close, new = self.bridge(messages[last + 1:], messages[0] if
                                 messages and messages[0].get("role") == "system" else None)
        ended = bool(prefix_ids) and int(prefix_ids[-1]) in self.end_ids
        return new if ended else close + new

    def bridge(self, tail: Sequence[Message], system: Message | None = None
               ) -> tuple[list[int], list[int]]:
        """``(closing ids, new ids)``: the template's tokens that close a reply (up to its
        end-of-turn token) and those of ``tail`` plus the generation prompt after it."""
        stand_in: list[Message] = [] if system is None else [dict(system)]
        stand_in += [{"role": "user", "content": _USER}, {"role": "assistant", "content": _MARK}]
        text = render_chat(self.tokenizer, [*stand_in, *tail], True, self.template_kwargs)
        at = text.rfind(_MARK)
        if at < 0:
            raise ValueError("the chat template dropped an assistant message; cannot continue "
                             "a chat in token space with it")
        ids = encode_text(self.tokenizer, text[at + len(_MARK):])
        cut = next((k + 1 for k, i in enumerate(ids) if i in self.end_ids), 0)
        return ids[:cut], ids[cut:]


def continue_chat(tokenizer: Any, messages: Sequence[Message], prefix_ids: Sequence[int] | None,
                  *, history: str = "verbatim",
                  template_kwargs: Mapping[str, Any] | None = None,
                  renderer: ChatRenderer | None = None) -> tuple[list[int], bool]:
    """Ids to append to ``prefix_ids`` so that the sequence ends with ``messages`` and the
    generation prompt: ``(ids, True)``. On the first turn (no prefix, no assistant message)
    and in ``per_turn`` mode: the whole prompt, ``(ids, False)``."""
    r = renderer or ChatRenderer(tokenizer, template_kwargs)
    has_reply = any(m.get("role") == "assistant" for m in messages)
    if not prefix_ids or not has_reply or check_history_mode(history) == "per_turn":
        return r.first(messages), False
    return r.extend(messages, prefix_ids), True
