"""Continuing a chat in token space: the tokens a new turn adds after what the model said.

A multi-turn episode is trained as one sequence: the first prompt, then each reply exactly as
the model produced it, with the env's answer and the chat template's markup between replies.
Re-tokenizing the whole history each turn would not give that sequence (a reply decoded and
encoded again can change tokens, and the stored history holds the parsed reply, not the raw
one), so the next turn's prompt is built as ``previous ids + ids of the new messages``.

The new messages' text is found by rendering the chat twice with the template: up to the last
assistant message, and in full with the generation prompt. The full text must start with the
first one cut after its last end-of-turn token (the template's markup after it, such as a
newline, belongs to the new part); templates that rewrite earlier turns (some reasoning
models drop old thoughts) fail that test and the turn starts over from the full prompt.
The tokenizer is duck-typed (``apply_chat_template``, ``encode``, ``eos_token``), so this
module imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnpool.policies.base import Message


def render_chat(tokenizer: Any, messages: Sequence[Message], generation_prompt: bool) -> str:
    """The template's text for ``messages``."""
    return str(tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=generation_prompt))


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens added."""
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def continue_chat(tokenizer: Any, messages: Sequence[Message], prefix_ids: Sequence[int] | None
                  ) -> tuple[list[int], bool]:
    """Ids to append to ``prefix_ids`` so that the sequence ends with ``messages`` and the
    generation prompt; ``(ids, True)``. Without a usable prefix: the full prompt, ``False``."""
    full = render_chat(tokenizer, messages, generation_prompt=True)
    last = max((k for k, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    eos_text = getattr(tokenizer, "eos_token", None)
    if not prefix_ids or last < 0 or not eos_text:
        return encode_text(tokenizer, full), False
    head = render_chat(tokenizer, messages[: last + 1], generation_prompt=False)
    cut = head.rfind(eos_text)
    if cut < 0 or not full.startswith(head[: cut + len(eos_text)]):
        return encode_text(tokenizer, full), False
    cut += len(eos_text)
    ids = encode_text(tokenizer, full[cut:])
    eos_id = getattr(tokenizer, "eos_token_id", None)
    if eos_id is not None and int(prefix_ids[-1]) != int(eos_id):
        # the reply was cut before its end-of-turn token: the template closes the turn
        ids = [int(eos_id), *ids]
    return ids, True
