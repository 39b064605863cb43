"""Token in, token out on the OpenAI-compatible path: the ``openai`` policy against a real
local server that answers the way vLLM does (`turnpool.policies.token_server`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.chat_template_utils import qwen3_chat_template

from turnpool.policies.openai import OpenAIPolicy
from turnpool.policies.token_server import TokenServer
from turnpool.pool import EnvPool
from turnpool.rollout.collector import TrajectoryCollector
from turnpool.rollout.settings import CollectorSettings
from turnpool.rollout.trajectory import Trajectory


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[TokenServer, Any]]:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = qwen3_chat_template  # rewrites history when it re-renders a chat
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with TokenServer(model, tok) as server:
        yield server, tok


def _collect(policy: OpenAIPolicy, **settings: Any) -> list[Trajectory]:
    pool = EnvPool("sokoban", env_num=2, group_n=2, backend="sequential",
                   env_kwargs={"dim_room": (6, 6)})
    with TrajectoryCollector(pool, policy, settings=CollectorSettings(max_turn=3, **settings),
                             owns_pool=True, owns_policy=True) as col:
        return col.collect(seed=5).trajectories


def test_episode_is_what_the_server_received_and_sampled(
        served: tuple[TokenServer, Any]) -> None:
    server, tok = served
    server.log.clear()
    policy = OpenAIPolicy(server.url, tokenizer=tok, temperature=1.0, seed=3, max_tokens=24,
                          sampling={"top_k": 50})
    trajs = _collect(policy)
    assert all(e["endpoint"] == "completions" for e in server.log)
    multi = 0
    for t in trajs:
        assert t.error is None and t.is_one_sequence
        assert {turn.token_path for turn in t.turns} == {"tokens"}
        view = t.token_view()
        seq = list(view.prompt_ids)
        sampled: list[int] = []
        for k, turn in enumerate(t.turns):
            if k:
                seq += turn.prompt_ids or []
            # this turn's request: the server got exactly the sequence so far
            entry = next(e for e in server.log if e["prompt_ids"] == seq
                         and e["token_ids"] == turn.response_ids)
            assert entry["logprobs"] == pytest.approx(turn.logprobs)
            seq += entry["token_ids"]
            sampled += entry["token_ids"]
        assert view.prompt_ids + view.response_ids == seq  # token for token
        assert [i for i, m in zip(view.response_ids, view.loss_mask) if m] == sampled
        multi += len(t.turns) > 1
    assert multi == len(trajs)
    # earlier thoughts stay in the sequence although Qwen3's template would drop them
    long = max(trajs, key=lambda t: len(t.turns))
    text = tok.decode(long.token_view().prompt_ids + long.token_view().response_ids)
    assert text.count("<think>") >= len(long.turns)


def test_chat_fallback_is_marked_and_gives_one_sample_per_turn(
        served: tuple[TokenServer, Any]) -> None:
    server, tok = served
    server.log.clear()
    policy = OpenAIPolicy(server.url, return_token_ids=True, max_tokens=24)  # no tokenizer
    assert policy.token_path == "chat"
    trajs = _collect(policy)
    for t in trajs:
        assert {turn.token_path for turn in t.turns} == {"chat"}
        samples = t.token_samples()
        assert len(samples) == len(t.turns)
        for sample in samples:
            assert any(e["prompt_ids"] == sample.prompt_ids
                       and e["token_ids"] == sample.response_ids for e in server.log)
        if len(t.turns) > 1:
            with pytest.raises(ValueError, match="token_samples"):
                t.token_view()


def test_per_turn_history_gives_one_exact_sample_per_turn(
        served: tuple[TokenServer, Any]) -> None:
    """history="per_turn": each turn is prompted with the template's full render (Qwen3: no
    earlier thoughts) and is its own sample, exactly what the server got and sampled."""
    server, tok = served
    server.log.clear()
    trajs = _collect(OpenAIPolicy(server.url, tokenizer=tok, max_tokens=24, history="per_turn"))
    for t in trajs:
        samples = t.token_samples()
        assert len(samples) == len(t.turns) and {x.token_path for x in t.turns} == {"tokens"}
        for sample, turn in zip(samples, t.turns):
            assert any(e["prompt_ids"] == sample.prompt_ids
                       and e["token_ids"] == sample.response_ids for e in server.log)
            assert sample.loss_mask == [1] * len(turn.response_ids or [])
        assert t.turns[0].llm_raw_response.startswith("<think>push box</think>")
        if len(samples) > 1:  # Qwen3's re-render dropped the earlier replies' thoughts
            assert "push box" not in tok.decode(samples[-1].prompt_ids)
    assert max(len(t.turns) for t in trajs) > 1


def test_token_budget_ends_the_episode(served: tuple[TokenServer, Any]) -> None:
    server, tok = served
    policy = OpenAIPolicy(server.url, tokenizer=tok, max_tokens=64)
    trajs = _collect(policy, max_episode_tokens=40)  # no room for a second turn's prompt
    for t in trajs:
        assert t.end_reason == "token_budget" and len(t.turns) == 1
        assert len(t.token_view().response_ids) <= 40


def test_server_refuses_hostile_requests(served: tuple[TokenServer, Any]) -> None:
    server, tok = served
    url = server.url + "/completions"
    for body in ({"prompt": [len(tok) + 5]}, {"prompt": []}, {"prompt": [1], "max_tokens": -1},
                 {"prompt": [1], "n": True}, {"prompt": {"a": 1}}, {"prompt": [1], "model": "x"}):
        r = httpx.post(url, json=body, timeout=30, trust_env=False)
        assert r.status_code == 400, body
    r = httpx.post(url, content=b"{not json", timeout=30, trust_env=False,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    policy = OpenAIPolicy(server.url, tokenizer=tok, max_tokens=8, extra_body={"n": 0})
    [turn] = policy.generate_tokens([[{"role": "user", "content": "hi"}]], [None])
    assert not turn.has_ids and getattr(turn.text, "error", "")  # a FailedReply, not scored
    policy.close()
