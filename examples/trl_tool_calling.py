"""GRPO with TRL's tool loop on a turnpool env: ``environment_factory``, tool calls, CPU.

The tiny offline Llama (built here, no download) is first fine-tuned to answer an episode's
first message with a Qwen-style ``<tool_call>`` JSON call of one of the env's tools
(`turnpool.policies.tiny_llm.teach_tool_calls`), under TRL's Qwen2.5 chat template. Then the
README's block runs as written: ``GRPOTrainer(environment_factory=...)`` parses the calls and
each call steps a turnpool env (bandit: the tools are ``dragon()`` and ``phoenix()``).

    python examples/trl_tool_calling.py
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.parse_args(argv)  # no options: --help describes the run, then exits
    # the model, TRL's output and the env workers' files live in a folder removed at the end
    with tempfile.TemporaryDirectory(prefix="turnpool-tools-") as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            train(Path(tmp))
        finally:
            os.chdir(cwd)


def train(work: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from turnpool.integrations.trl import environment_factory as factory
    from turnpool.policies.tiny_llm import build_tiny_model, teach_tool_calls

    model_dir = build_tiny_model(work / "model", sft_steps=100, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = qwen2_5_chat_template
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    teach_tool_calls(model, tokenizer, factory("bandit", pool_options={"backend": "sequential"},
                                               capacity=1), "Pull an arm.")

    # --- the README block
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from turnpool.integrations.trl import environment_factory

    Bandit = environment_factory("bandit", capacity=64,
                                 pool_options={"backend": "process", "step_timeout": 10})
    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Pull an arm."}]] * 8,
                            "seed": [0, 0, 0, 0, 1, 1, 1, 1]})  # a GRPO group shares its seed
    cfg = GRPOConfig(output_dir="grpo-bandit", per_device_train_batch_size=8, num_generations=4,
                     max_completion_length=96, max_tool_calling_iterations=1, max_steps=1,
                     report_to=[], bf16=False)  # bf16=True on a bf16 GPU
    trainer = GRPOTrainer(model, args=cfg, train_dataset=ds, processing_class=tokenizer,
                          environment_factory=Bandit)
    trainer.train()
    # ---
    envs = trainer.environments
    print(f"env steps from tool calls: {sum(e.tool_steps for e in envs)} "
          f"over {len(envs)} episodes; rejected calls: {sum(len(e.invalid_calls) for e in envs)}")


if __name__ == "__main__":
    main()
