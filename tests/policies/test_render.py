"""The renderer contract (`turnpool.policies.tokens`): a new turn's ids are appended to what
the model saw and sampled, sampled history is never re-rendered, and a template that rewrites
history (Qwen3 drops earlier ``<think>`` blocks) neither breaks the sequence nor cuts it."""

from __future__ import annotations

from typing import Any

import pytest
from trl.chat_template_utils import qwen3_chat_template  # Qwen3's stock template

from turnpool.policies.tiny_llm import CHATML_TEMPLATE, build_tokenizer
from turnpool.policies.tokens import ChatRenderer, continue_chat, render_chat
from turnpool.rollout.trajectory import Trajectory, Turn


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_tokenizer(seed=0)


def _chat(turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Turn 1: #P_O#"}]
    for k in range(1, turns):
        msgs.append({"role": "assistant", "content": f"<think>step {k}</think><answer>Up</answer>"})
        msgs.append({"role": "user", "content": f"Reward: 0.0\nTurn {k + 1}: #_PO#"})
    return msgs


@pytest.mark.parametrize("template", [CHATML_TEMPLATE, qwen3_chat_template])
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
def test_sequence_is_what_was_seen_and_sampled(tok: Any, template: str,
                                               kwargs: dict[str, Any]) -> None:
    tok.chat_template = template
    r = ChatRenderer(tok, kwargs)
    chat = _chat(1)
    seq = r.first(chat)
    assert seq == tok.encode(render_chat(tok, chat, True, kwargs), add_special_tokens=False)
    text = render_chat(tok, chat, True, kwargs)
    for k in range(1, 4):
        reply = f"<think>step {k}</think><answer>Up</answer>"
        sampled = tok.encode(reply + "<|im_end|>", add_special_tokens=False)
        seq += sampled
        text += reply + "<|im_end|>"
        chat = _chat(k + 1)
        new = r.extend(chat, seq)
        full = render_chat(tok, chat, True, kwargs)
        # the new part is exactly the template's text after the last reply's end of turn
        tail = full[full.rfind("<|im_end|>", 0, full.rfind("Reward:")) + len("<|im_end|>"):]
        assert tok.decode(new) == tail
        seq += new
        text += tail
    # decoding the sequence gives the verbatim chat: every earlier thought kept
    assert tok.decode(seq) == text
    assert all(f"<think>step {k}</think>" in text for k in (1, 2, 3))
    if template == qwen3_chat_template:  # a re-render would have dropped them
        assert "<think>step 1</think>" not in render_chat(tok, _chat(4), True, kwargs)


def test_a_cut_reply_is_closed_by_the_template(tok: Any) -> None:
    tok.chat_template = qwen3_chat_template
    r = ChatRenderer(tok)
    chat = _chat(2)
    cut = r.first(_chat(1)) + tok.encode("<think>step 1</thi", add_special_tokens=False)
    new = r.extend(chat, cut)
    assert tok.decode(new).startswith("<|im_end|>\n<|im_start|>user\nReward:")
    ended = cut + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert r.extend(chat, ended) == new[1:]


def test_per_turn_mode_prompts_with_the_full_render(tok: Any) -> None:
    tok.chat_template = qwen3_chat_template
    chat = _chat(2)
    ids, extends = continue_chat(tok, chat, [1, 2, 3], history="per_turn")
    assert not extends and tok.decode(ids) == render_chat(tok, chat, True)
    with pytest.raises(ValueError, match="history"):
        continue_chat(tok, chat, [1], history="rerender")


def test_token_samples_split_at_whole_prompts() -> None:
    def turn(p: list[int], r: list[int], ext: bool | None) -> Turn:
        return Turn(state="", actions_left=0, prompt_ids=p, response_ids=r,
                    logprobs=[-1.0] * len(r), prompt_extends=ext, token_path="tokens")

    t = Trajectory(env_id=3, group_id=0, group_uid="0", tag="x", env_type="x", seed=1,
                   turns=[turn([1, 2], [3], False), turn([4], [5, 6], True),
                          turn([1, 2, 9], [7], False)])
    first, second = t.token_samples()
    assert (first.prompt_ids, first.response_ids, first.loss_mask) == ([1, 2], [3, 4, 5, 6],
                                                                      [1, 0, 1, 1])
    assert (second.prompt_ids, second.response_ids, second.loss_mask) == ([1, 2, 9], [7], [1])
    with pytest.raises(ValueError, match="token_samples"):
        t.token_view()
    d = t.to_dict()
    assert "tokens" not in d and len(d["token_samples"]) == 2
    assert Trajectory.from_dict(d) == t
