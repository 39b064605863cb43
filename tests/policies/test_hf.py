"""The local transformers policy, on a tiny Llama model built offline once per test run."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from turnpool.policies import make_policy
from turnpool.policies.hf import HFPolicy
from turnpool.policies.tiny_llm import SFT_REPLY, build_tiny_model, sample_conversations
from turnpool.ragen.rollout_manager import SharedLLMInferenceManager
from turnpool.rollout.projection import parse_response

pytestmark = pytest.mark.timeout(180)


def prompts(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    return sample_conversations(n, seed=seed, turns=3)


@pytest.fixture(scope="module")
def noisy_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Untrained weights with a large scale: greedy output is junk that differs per prompt,
    which makes a mix-up between batch rows visible."""
    return build_tiny_model(tmp_path_factory.mktemp("noisy-llama"), init_std=1.0, seed=1)


def test_tiny_model_folder_is_portable_and_deterministic(tiny_model_dir: Path,
                                                         tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    cfg = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"  # loadable by transformers 4
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.padding_side == "left" and len(tok) <= 520
    enc = tok([SFT_REPLY, "Up"], padding=True)
    assert set(enc) == {"input_ids", "attention_mask"}
    assert enc["attention_mask"][1][0] == 0  # the shorter row is padded on the left
    assert "<answer>" in tok.convert_ids_to_tokens(enc["input_ids"][0])  # one whole-tag token
    assert tok.decode(enc["input_ids"][0], skip_special_tokens=True) == SFT_REPLY
    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    for name in ("tokenizer.json", "model.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_hf_policy_generates_parseable_actions_greedily(tiny_model_dir: Path) -> None:
    policy = make_policy({"name": "hf", "model_path": str(tiny_model_dir),
                          "max_new_tokens": 32})
    assert isinstance(policy, HFPolicy)
    batch = prompts(12)
    first = policy.generate(batch)
    assert len(first) == 12
    assert policy.generate(batch) == first  # greedy decoding is deterministic
    parsed = [parse_response(r, max_actions=1) for r in first]
    ok = [p for p in parsed if p.format_valid and p.actions[0] in {"Up", "Down", "Left", "Right"}]
    assert len(ok) >= 10, first
    assert policy.generate([]) == []
    assert policy.stats.requests == 24 and policy.stats.calls == 2
    policy.close()
    policy.close()
    with pytest.raises(RuntimeError, match="closed"):
        policy.generate(batch)


def test_threads_sharing_one_model_get_their_own_rows(noisy_model_dir: Path) -> None:
    shared = SharedLLMInferenceManager(model_path=str(noisy_model_dir), max_new_tokens=8)
    batches = [prompts(3 + k, seed=10 + k) for k in range(4)]
    expected = [shared.generate(b) for b in batches]
    assert len({r for rows in expected for r in rows}) == sum(len(b) for b in batches)
    results: dict[tuple[int, int], list[str]] = {}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for rep in range(2):
                results[(k, rep)] = shared.generate(batches[k])
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    for (k, _), got in results.items():
        assert got == expected[k]
    assert len(results) == 8


def test_batched_rows_match_single_prompt_generation(noisy_model_dir: Path) -> None:
    policy = HFPolicy(model_path=str(noisy_model_dir), max_new_tokens=8)
    batch = prompts(8, seed=3)  # different lengths, so rows are left-padded differently
    together = policy.generate(batch)
    alone = [policy.generate([conv])[0] for conv in batch]
    # Padding changes matrix shapes, so a near-tie could in principle flip a late token;
    # a row mix-up would break every row.
    assert sum(a == b for a, b in zip(together, alone)) >= 6
    assert all(a[:2] == b[:2] for a, b in zip(together, alone))


def test_sampling_is_seeded_and_leaves_global_torch_rng_alone(noisy_model_dir: Path) -> None:
    import torch

    batch = prompts(4, seed=5)
    kw: dict[str, Any] = {"model_path": str(noisy_model_dir), "max_new_tokens": 8,
                          "temperature": 1.0}
    state = torch.get_rng_state()
    runs = [HFPolicy(seed=9, **kw).generate(batch) for _ in range(2)]
    assert torch.equal(torch.get_rng_state(), state)
    assert runs[0] == runs[1]
    assert HFPolicy(seed=10, **kw).generate(batch) != runs[0]


def test_every_token_draw_is_fresh_and_reproducible(noisy_model_dir: Path) -> None:
    """A GRPO group asks for the same prompt several times, one call each (verl's server
    manager does): each call samples anew, and a policy with the same seed replays them all."""
    import torch

    kw: dict[str, Any] = {"model_path": str(noisy_model_dir), "max_new_tokens": 8,
                          "temperature": 1.0}
    prompt = [5, 6, 7, 8, 9]
    state = torch.get_rng_state()
    runs = []
    for _ in range(2):
        policy = HFPolicy(seed=4, **kw)
        runs.append([policy.generate_ids([prompt])[0][0] for _ in range(4)]
                    + [t.response_ids for t in policy.generate_tokens(
                        [[{"role": "user", "content": "hi"}]] * 2, [None, None])])
    assert torch.equal(torch.get_rng_state(), state)
    assert runs[0] == runs[1]  # reproducible from the seed
    assert len({tuple(r) for r in runs[0][:4]}) == 4  # distinct samples of one prompt
    assert runs[0][4] != runs[0][5]


def test_hf_policy_only_loads_local_directories(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="local directory"):
        HFPolicy(model_path=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="local directory"):
        HFPolicy(model_path="gpt2")


# ------------------------------------------------------------------ a full rollout
def rollout_overrides(policy: str) -> list[str]:
    """Two Sokoban groups of two, three turns, in-process, with the given policy."""
    return ["es_manager.train.env_groups=2", "es_manager.train.group_size=2",
            "es_manager.train.env_configs.tags=[SimpleSokoban]",
            "es_manager.train.env_configs.n_groups=[2]", "agent_proxy.max_turn=3",
            "turnpool.backend=sequential", f"turnpool.policy={policy}"]


def test_full_rollout_with_the_hf_policy(tiny_model_dir: Path, tmp_path: Path) -> None:
    from turnpool.ragen.rollout_manager import collector_from_config
    from turnpool.rollout.trajectory import read_jsonl

    policy = f"{{name: hf, model_path: '{tiny_model_dir}', max_new_tokens: 48}}"
    with collector_from_config(overrides=rollout_overrides(policy)) as collector:
        assert isinstance(collector.policy, HFPolicy)
        batch = collector.collect(seed=3)
        again = collector.collect(seed=3)
        generated = collector.policy.stats.requests
    assert batch.to_jsonl(tmp_path / "a.jsonl") == 4
    again.to_jsonl(tmp_path / "b.jsonl")
    # Greedy decoding and seeded envs: the same seed gives the same file.
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert [t.to_dict() for t in read_jsonl(tmp_path / "a.jsonl")] == \
        [t.to_dict() for t in batch.trajectories]
    turns = [turn for traj in batch.trajectories for turn in traj.turns]
    assert generated == 2 * len(turns)  # one generation per played turn, per collect
    assert all(turn.llm_raw_response for turn in turns)
    for traj in batch.trajectories:
        roles = [m["role"] for m in traj.messages]
        assert roles[:2] == ["system", "user"] and roles.count("assistant") == len(traj.turns)
        replies = [m["content"] for m in traj.messages if m["role"] == "assistant"]
        assert replies == [turn.llm_response for turn in traj.turns]
    by_group: dict[int, set[str]] = {}
    for traj in batch.trajectories:
        by_group.setdefault(traj.group_id, set()).add(traj.turns[0].state)
    assert len(by_group) == 2 and all(len(s) == 1 for s in by_group.values())
    # The fine-tuned model answers in format, so actions reach the envs.
    assert batch.metrics["SimpleSokoban/valid_action_ratio"] > 0.5
    assert batch.metrics["env_steps"] >= 4
