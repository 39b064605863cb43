"""Token-level trajectories: with the hf policy every turn records prompt/response ids and
log-probabilities, `Trajectory.token_view` is the exact sequence the model saw and produced
(loss mask 1 on its tokens, 0 on env/template tokens), and the JSONL carries it."""

from __future__ import annotations

import json
from pathlib import Path

from turnpool.policies import make_policy
from turnpool.policies.hf import HFPolicy
from turnpool.pool import EnvPool
from turnpool.rollout.collector import TrajectoryCollector
from turnpool.rollout.settings import CollectorSettings
from turnpool.rollout.trajectory import read_jsonl, token_prefix, write_jsonl


def test_hf_turns_form_one_token_sequence(tiny_model_dir: Path, tmp_path: Path) -> None:
    policy = HFPolicy(str(tiny_model_dir), max_new_tokens=24, temperature=1.0, seed=3)
    pool = EnvPool("frozen_lake", env_num=2, group_n=2, backend="sequential")
    with TrajectoryCollector(pool, policy, settings=CollectorSettings(max_turn=3),
                             owns_pool=True) as col:
        batch = col.collect(seed=5)
    tok = policy.tokenizer
    multi = 0
    for t in batch.trajectories:
        assert t.has_tokens
        view = t.token_view()
        assert len(view.response_ids) == len(view.loss_mask) == len(view.logprobs)
        pos = 0
        for k, turn in enumerate(t.turns):
            assert turn.prompt_extends is (k > 0)
            if k > 0:
                env = view.response_ids[pos:pos + len(turn.prompt_ids or [])]
                assert env == turn.prompt_ids and not any(view.loss_mask[pos:pos + len(env)])
                text = tok.decode(env)
                assert text.startswith("\n<|im_start|>user\nReward:")
                assert f"\nTurn {k + 1}:\nState:\n" in text
                assert text.endswith("<|im_start|>assistant\n")
                pos += len(env)
                multi += 1
            ids = view.response_ids[pos:pos + len(turn.response_ids or [])]
            assert ids == turn.response_ids and all(view.loss_mask[pos:pos + len(ids)])
            assert tok.decode(ids, skip_special_tokens=True) == turn.llm_raw_response
            assert all(lp <= 0.0 for lp in turn.logprobs or [])
            assert len(turn.logprobs or []) == len(ids)
            pos += len(ids)
        assert pos == len(view.response_ids)
        first = tok.decode(view.prompt_ids)
        assert first.startswith("<|im_start|>system") and first.endswith("assistant\n")
        assert token_prefix(t.turns) == view.prompt_ids + view.response_ids
    assert multi > 0  # some episode had a second turn to check the masked env tokens on

    path = tmp_path / "t.jsonl"
    write_jsonl(batch.trajectories, path)
    line = json.loads(path.read_text().splitlines()[0])
    assert line["tokens"]["loss_mask"] == batch.trajectories[0].token_view().loss_mask
    back = list(read_jsonl(path))
    assert [b.token_view() for b in back] == [t.token_view() for t in batch.trajectories]


def test_text_policies_leave_token_fields_out_of_jsonl(tmp_path: Path) -> None:
    pool = EnvPool("bandit", env_num=1, group_n=2, backend="sequential")
    with TrajectoryCollector(pool, make_policy({"name": "random"}),
                             settings=CollectorSettings(max_turn=1), owns_pool=True) as col:
        batch = col.collect()
    path = tmp_path / "t.jsonl"
    write_jsonl(batch.trajectories, path)
    line = json.loads(path.read_text().splitlines()[0])
    assert "tokens" not in line and "prompt_ids" not in line["turns"][0]
    assert not batch.trajectories[0].has_tokens
