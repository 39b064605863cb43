"""Train a tiny language model with TRL's GRPOTrainer on a turnpool env, on CPU.

The policy is turnpool's tiny offline Llama (built here, no download), briefly fine-tuned so
that it sometimes answers in the ``<think>...</think><answer>...</answer>`` format. The env is
turnpool's two-armed bandit with arms named for words the tiny model can say: ``Up`` pays 1.0,
``Down`` pays 0.1; anything else is invalid (reward 0, format penalty -0.1). At the start about
a third of the replies are a well-formed ``Up``; GRPO has to make that the rule. (A tiny model
that never emits a word cannot discover it by sampling, so the paying arm is one it can say.)
Rollouts go through `turnpool.integrations.trl.TurnpoolRollout` (turnpool's collector with
the trainer's model as the policy; envs on a turnpool pool), so this is the full path a real
run takes, at toy scale. This shows rewards and gradients flowing, not the task being learnt
(the model never names the other arm); ``trl_grpo_bandit_choice.py`` is the run where the
model's choice of arm is what GRPO changes.

    python examples/trl_grpo_bandit.py --steps 30

Writes ``runs/trl_grpo_bandit.png`` (reward per step) and ``runs/trl_grpo_bandit.json`` (or
the ``--out`` stem; the committed copies next to this file are a recorded run), and prints the
mean reward of the first and the last 10 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ENV_KWARGS = {"lo_arm_name": "Down", "lo_arm_score": 0.1, "hi_arm_name": "Up",
              "hi_arm_hiscore": 1.0, "hi_arm_hiscore_prob": 1.0, "hi_arm_loscore": 1.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sft-steps", type=int, default=40)
    parser.add_argument("--groups", type=int, default=4, help="GRPO groups per step")
    parser.add_argument("--group-size", type=int, default=4, help="num_generations")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", type=Path, default=Path("runs") / "trl_grpo_bandit")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from turnpool.integrations.trl import TurnpoolRollout, turnpool_reward
    from turnpool.policies.tiny_llm import build_tiny_model
    from turnpool.rollout.settings import CollectorSettings

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="turnpool-grpo-") as tmp:  # removed at the end
        work = Path(tmp)
        model_dir = build_tiny_model(work / "model", sft_steps=args.sft_steps, seed=0)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)

        rollout = TurnpoolRollout("bandit", ENV_KWARGS, settings=CollectorSettings(max_turn=1),
                                  pool_options={"backend": "sequential"}, max_new_tokens=16,
                                  seed=1000)
        batch = args.groups * args.group_size
        config = GRPOConfig(
            output_dir=str(work / "out"), per_device_train_batch_size=batch,
            num_generations=args.group_size, max_steps=args.steps, learning_rate=args.lr,
            max_completion_length=16, temperature=1.0, beta=0.0, logging_steps=1,
            save_strategy="no", report_to=[], use_cpu=True, seed=0, lr_scheduler_type="constant",
            disable_tqdm=True)
        dataset = Dataset.from_dict({"prompt": ["bandit"] * (batch * args.steps)})
        trainer = GRPOTrainer(model=model, reward_funcs=[turnpool_reward], args=config,
                              train_dataset=dataset, processing_class=tokenizer,
                              rollout_func=rollout)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        rollout.close()

        rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
        first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
        summary = {"steps": len(rewards), "seconds": round(seconds, 1),
                   "first10_mean_reward": round(first, 3), "last10_mean_reward": round(last, 3),
                   "rewards": [round(r, 4) for r in rewards]}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        _plot(rewards, args.out.with_suffix(".png"))
        print(f"{len(rewards)} steps in {seconds:.0f} s; mean reward first 10 steps {first:.3f}, "
              f"last 10 steps {last:.3f}")


def _plot(rewards: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(rewards) + 1), rewards, label="mean reward per step")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.set_title("TRL GRPO on CPU: tiny model, bandit (Up 1.0, Down 0.1)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
