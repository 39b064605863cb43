"""Run turnpool's verl agent loop (``agent_name: turnpool``) on a batch, on CPU, without vLLM.

verl's AgentLoopWorker builds one loop object per trajectory with hydra and ``asyncio.gather``s
them; this script does the same with verl's real classes, but answers ``server_manager.generate``
with turnpool's tiny offline model instead of a vLLM/SGLang server. It prints, per trajectory,
the prompt and response lengths, how many response tokens the model produced (mask 1) and
how many came from the env and the chat template (mask 0), and the reward.

    python examples/verl_agent_loop.py --env sokoban --batch 8

In a real verl run, point ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` at a
YAML list with ``- name: turnpool`` / ``_target_: turnpool.integrations.verl.TurnpoolAgentLoop``,
set ``agent_name: turnpool`` in the dataset (or ``rollout.agent.default_agent_loop``), and
add a ``turnpool:`` section to the trainer config (``+turnpool.env_type=sokoban``, ...), and
set ``algorithm.adv_estimator=turnpool_grpo`` so failed envs stay out of group baselines;
``turnpool verl-config --env sokoban --out DIR`` writes all of it (YAML, group-seeded rows,
overrides).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-turn", type=int, default=3)
    parser.add_argument("--backend", default="process")
    parser.add_argument("--step-timeout", type=float, default=10.0)
    args = parser.parse_args()

    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.workers.rollout.replica import TokenOutput

    import turnpool.integrations.verl  # noqa: F401 - registers "turnpool"
    from turnpool.policies.hf import HFPolicy
    from turnpool.policies.tiny_llm import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="turnpool-verl-") as tmp:  # removed at the end
        model_dir = build_tiny_model(Path(tmp) / "model", sft_steps=100)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        policy = HFPolicy.from_model(AutoModelForCausalLM.from_pretrained(model_dir), tokenizer,
                                     max_new_tokens=32, temperature=1.0)

        class Server:
            async def generate(self, request_id: str, *, prompt_ids: list[int],
                               sampling_params: dict[str, Any], **kw: Any) -> Any:
                [(ids, logprobs)] = policy.generate_ids([list(prompt_ids)])
                return TokenOutput(token_ids=ids, log_probs=logprobs)

        config = OmegaConf.create({
            "actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 1024}},
            "data": {},
            "turnpool": {"env_type": args.env, "capacity": args.batch, "max_turn": args.max_turn,
                         "pool": {"backend": args.backend, "num_workers": 2,
                                  "step_timeout": args.step_timeout}}})
        server = Server()

        async def one(index: int) -> Any:
            loop = hydra.utils.instantiate(
                _agent_loop_registry["turnpool"], trainer_config=DictConfigWrap(config),
                server_manager=server, tokenizer=tokenizer, processor=None,
                dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data))
            return await loop.run({"temperature": 1.0}, raw_prompt=[], index=index,
                                  extra_info={"seed": index // args.group_size})

        async def batch() -> list[Any]:
            return list(await asyncio.gather(*[one(i) for i in range(args.batch)]))

        for i, out in enumerate(asyncio.run(batch())):
            model_tokens = sum(out.response_mask)
            print(f"trajectory {i}: prompt {len(out.prompt_ids)} tokens, response "
                  f"{len(out.response_ids)} ({model_tokens} model, "
                  f"{len(out.response_ids) - model_tokens} env/template), turns {out.num_turns}, "
                  f"reward {out.reward_score:+.2f}, failure {out.extra_fields['turnpool_failure']}")


if __name__ == "__main__":
    main()
