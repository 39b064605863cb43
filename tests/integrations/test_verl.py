"""verl's agent loop on turnpool: the registered ``turnpool`` loop, built the way verl's
AgentLoopWorker builds it, runs a batch with a generate function backed by the tiny model
(no vLLM here), and a hanging env is cut at step_timeout."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import hydra
import pytest
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

import turnpool.integrations.verl  # noqa: F401 - registers "turnpool"
from turnpool.policies.hf import HFPolicy


class TinyServer:
    """verl's server_manager.generate, answered by the tiny model on CPU."""

    def __init__(self, model_dir: Path) -> None:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.policy = HFPolicy.from_model(model, tok, max_new_tokens=16, temperature=1.0)
        self.calls = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any], **kw: Any) -> TokenOutput:
        self.calls += 1
        [(ids, logprobs)] = self.policy.generate_ids([list(prompt_ids)])
        return TokenOutput(token_ids=ids, log_probs=logprobs)


def _run_batch(model_dir: Path, section: dict[str, Any], rows: list[dict[str, Any]],
               template: str | None = None, data: dict[str, Any] | None = None,
               response_length: int = 512) -> tuple[list[AgentLoopOutput], Any, float]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    if template is not None:
        tok.chat_template = template
    server = TinyServer(model_dir)
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {
                                "prompt_length": 2048, "response_length": response_length}},
                            "data": data or {}, "turnpool": section})

    async def one(row: dict[str, Any]) -> AgentLoopOutput:
        loop = hydra.utils.instantiate(
            _agent_loop_registry["turnpool"], trainer_config=DictConfigWrap(cfg),
            server_manager=server, tokenizer=tok, processor=None, dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data))
        out: AgentLoopOutput = await loop.run({"temperature": 1.0}, raw_prompt=[], **row)
        return out

    async def batch() -> list[AgentLoopOutput]:
        return list(await asyncio.gather(*[one(r) for r in rows]))

    start = time.monotonic()
    outs = asyncio.run(batch())
    return outs, tok, time.monotonic() - start


def test_agent_loop_runs_a_batch(tiny_model_dir: Path) -> None:
    section = {"env_type": "sokoban", "env_kwargs": {"dim_room": [6, 6]}, "capacity": 4,
               "max_turn": 2, "pool": {"backend": "thread", "num_workers": 2}}
    rows = [{"index": i, "extra_info": {"seed": 40 + i // 2}} for i in range(6)]
    outs, tok, _ = _run_batch(tiny_model_dir, section, rows)
    assert len(outs) == 6
    for out in outs:
        n = len(out.response_ids)
        assert n > 0 and len(out.response_mask) == n and len(out.response_logprobs or []) == n
        assert set(out.response_mask) <= {0, 1} and out.response_mask[0] == 1
        assert out.extra_fields["turnpool_failure"] is None
        assert out.reward_score is not None and out.num_turns >= 3
        zeros = [t for t, m in zip(out.response_ids, out.response_mask) if m == 0]
        if zeros:  # a second turn: the env's answer sits between the replies, masked
            assert "Reward:" in tok.decode(zeros) and "Turn 2" in tok.decode(zeros)
        assert all(lp == 0.0 for lp, m in zip(out.response_logprobs or [], out.response_mask)
                   if m == 0)
        assert all(lp < 0.0 for lp, m in zip(out.response_logprobs or [], out.response_mask)
                   if m == 1)
        tensors = out.as_dict()
        assert tensors["responses"].shape == tensors["response_mask"].shape
    # members of a group (same seed) see the same first prompt; other groups do not
    assert outs[0].prompt_ids == outs[1].prompt_ids != outs[2].prompt_ids
    assert [o.extra_fields["turnpool_seed"] for o in outs] == [40, 40, 41, 41, 42, 42]


@pytest.mark.parametrize("response_length", [1024, 200])
def test_agent_loop_qwen3_template_runs_to_the_true_end(tiny_model_dir: Path,
                                                        response_length: int) -> None:
    """Qwen3's stock template drops earlier thoughts when it re-renders a chat: the loop keeps
    the sampled history and plays to max_turn, and turnpool_end names the true reason."""
    from trl.chat_template_utils import qwen3_chat_template

    section = {"env_type": "sokoban", "env_kwargs": {"dim_room": [6, 6]}, "capacity": 4,
               "max_turn": 3, "max_actions_per_traj": 50,
               "pool": {"backend": "thread", "num_workers": 2}}
    rows = [{"index": i, "extra_info": {"seed": 7 + i}} for i in range(4)]
    outs, tok, _ = _run_batch(tiny_model_dir, section, rows, template=qwen3_chat_template,
                              data={"apply_chat_template_kwargs": {"enable_thinking": False}},
                              response_length=response_length)
    for out in outs:
        turns = (out.num_turns - 1) // 2
        end = out.extra_fields["turnpool_end"]
        text = tok.decode(out.prompt_ids + out.response_ids)
        # every generation prompt got the template's empty thought (enable_thinking=False)
        assert text.count("<think>\n\n</think>") == turns
        assert len(out.response_ids) <= response_length
        if end == "max_turn":
            assert turns == 3
        elif end == "response_length":
            assert turns < 3 and response_length == 200
        else:
            assert end in ("terminated", "truncated")
    ends = [o.extra_fields["turnpool_end"] for o in outs]
    assert ("max_turn" in ends) if response_length == 1024 else ("response_length" in ends)


def test_agent_loop_hanging_env_is_cut(tiny_model_dir: Path) -> None:
    section = {"env_type": "sleep", "env_kwargs": {"sleep_ms": 3_600_000}, "capacity": 2,
               "max_turn": 3, "pool": {"backend": "process", "num_workers": 1,
                                       "step_timeout": 2.0}}
    outs, _, elapsed = _run_batch(tiny_model_dir, section,
                                  [{"index": i, "seed": 3} for i in range(2)])
    assert elapsed < 90
    for out in outs:
        assert out.extra_fields["turnpool_failure"] is not None
        assert "timeout" in out.extra_fields["turnpool_error"]
        assert sum(out.response_mask) == 0  # marked: no gradient from a failed env
        assert out.num_turns == 3  # one turn, then the env was cut
        assert out.extra_fields["turnpool_attempts"] == 2  # replayed once from its seed


@pytest.fixture(scope="module")
def untrained_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model before fine-tuning: its next-token distribution is broad."""
    from turnpool.policies.tiny_llm import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("untrained-llama"), seed=2)


def test_group_members_sample_distinct_replies(untrained_model_dir: Path,
                                              tmp_path: Path) -> None:
    """verl's AgentLoopWorker, 2 groups x 4 at temperature 1, each reply one ``generate`` call
    of its own (as verl's server manager makes them): members of a group share the prompt,
    never the sample."""
    section = {"env_type": "bandit", "capacity": 8, "max_turn": 1,
               "pool": {"backend": "thread", "num_workers": 2}}
    out = _worker_generate(untrained_model_dir, section, [{"seed": 70 + i // 4} for i in range(8)],
                           [f"g{i // 4}" for i in range(8)], tmp_path)
    prompts, responses = out.batch["prompts"], out.batch["responses"]
    for g in (0, 4):
        assert len({tuple(p.tolist()) for p in prompts[g:g + 4]}) == 1
        assert len({tuple(r.tolist()) for r in responses[g:g + 4]}) == 4


def _worker_generate(model_dir: Path, section: dict[str, Any], extra_info: list[dict[str, Any]],
                     uid: list[str], tmp_path: Path) -> Any:
    """verl's own AgentLoopWorker (its generated PPO config, the agent-loop YAML a user ships,
    ``default_agent_loop=turnpool``) runs one batch; its server manager is `TinyServer`."""
    import os

    import numpy as np
    import verl
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    config = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer", "config",
                                         "_generated_ppo_trainer.yaml"))
    OmegaConf.set_struct(config, False)
    loops = tmp_path / "agent_loop.yaml"
    loops.write_text("- name: turnpool\n  _target_: turnpool.integrations.verl.TurnpoolAgentLoop\n")
    rollout = config.actor_rollout_ref.rollout
    config.actor_rollout_ref.model.path = str(model_dir)
    rollout.name, rollout.prompt_length, rollout.response_length = "vllm", 2048, 512
    rollout.agent.agent_loop_config_path = str(loops)
    rollout.agent.default_agent_loop = "turnpool"
    config.turnpool = section
    worker = AgentLoopWorker(config, llm_client=TinyServer(model_dir))
    n = len(extra_info)
    batch = DataProto.from_dict(non_tensors={
        "raw_prompt": np.array([[] for _ in range(n)], dtype=object), "index": np.arange(n),
        "extra_info": np.array(extra_info, dtype=object), "uid": np.array(uid, dtype=object)})
    return asyncio.run(worker.generate_sequences(batch))


def test_a_hanging_env_is_replayed_and_never_biases_its_group(tiny_model_dir: Path,
                                                              tmp_path: Path) -> None:
    """verl's AgentLoopWorker on 2 groups x 4; one member of group 0 hangs on every try. It is
    replayed once from its seed, then marked; verl's advantage step with
    ``adv_estimator=turnpool_grpo`` gives the healthy rows exactly the advantages of the batch
    without the failed row, where verl's plain GRPO does not."""
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn

    section = {"env_type": "sleep", "env_kwargs": {"sleep_ms": 1, "episode_len": 2},
               "capacity": 4, "max_turn": 2, "retries": 1,
               "pool": {"backend": "process", "num_workers": 1, "step_timeout": 2.0}}
    extra: list[dict[str, Any]] = [{"seed": 5 + i // 4} for i in range(8)]
    extra[1]["env_kwargs"] = {"sleep_ms": 3_600_000}
    uid = [f"g{i // 4}" for i in range(8)]
    start = time.monotonic()
    out = _worker_generate(tiny_model_dir, section, extra, uid, tmp_path)
    assert time.monotonic() - start < 120
    failure = list(out.non_tensor_batch["turnpool_failure"])
    assert [i for i, f in enumerate(failure) if f is not None] == [1]
    assert list(out.non_tensor_batch["turnpool_attempts"]) == [1, 2, 1, 1, 1, 1, 1, 1]
    rewards, mask = out.batch["rm_scores"], out.batch["response_mask"]
    assert int(mask[1].sum()) == 0 and all(int(mask[i].sum()) > 0 for i in range(8) if i != 1)

    index = out.non_tensor_batch["uid"]
    # what verl's compute_advantage calls for a registered estimator
    adv, _ = get_adv_estimator_fn("turnpool_grpo")(
        token_level_rewards=rewards, response_mask=mask, index=index, config=None)
    healthy = [i for i in range(8) if i != 1]
    alone, _ = compute_grpo_outcome_advantage(rewards[healthy], mask[healthy], index[healthy])
    assert torch.equal(adv[healthy], alone)
    assert torch.count_nonzero(adv[1]) == 0
    # verl's own grpo counts the failed row in group 0's mean: the healthy rows move
    plain, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    assert not torch.equal(plain[[0, 2, 3]], alone[:3])


def test_loop_options_need_an_env() -> None:
    from turnpool.integrations.verl import loop_options

    with pytest.raises(ValueError, match="env_type"):
        loop_options(OmegaConf.create({}), {})
    opts = loop_options(OmegaConf.create({"turnpool": {"env_type": "bandit"}}),
                        {"extra_info": {"seed": 9, "env_kwargs": {"lo_arm_score": 0.2}}})
    assert opts["seed"] == 9 and opts["env_kwargs"] == {"lo_arm_score": 0.2}
