"""GRPO that learns the env's choice: a bandit whose paying arm the policy starts out avoiding.

The tiny offline Llama (turnpool.policies.tiny_llm, built here, no download) is fine-tuned to
answer the bandit prompt with ``<think>pick an arm</think><answer>ARM</answer>``, where ARM is
``Up`` in 85% of the SFT replies and ``Down`` in 15%. The env pays the other way: ``Down`` 1.0
(success), ``Up`` 0.1. So the untrained policy's *choice* decides the reward, and the arm that
pays is the one it was taught to avoid: sampled at temperature 1 it starts at 10-20% success.
GRPO (TRL's GRPOTrainer, rollouts through `turnpool.integrations.trl.TurnpoolRollout`) then
trains it; the same run with learning rate 0 (same model, same seeds) is the control.

    python examples/trl_grpo_bandit_choice.py   # 50 steps x 32 episodes, 10-15 min on 2 cores

Writes ``runs/trl_grpo_bandit_choice.png`` (success per step, both runs) and
``runs/trl_grpo_bandit_choice.json`` (or the ``--out`` stem; the committed copies
next to this file are a recorded run). Success = share of the step's episodes that
pulled the paying arm. Randomness: the SFT draws from local generators
(`turnpool.policies.tiny_llm.fine_tune_replies`); GRPOTrainer seeds torch from ``--seed``
(its own ``set_seed``) and turnpool seeds every generate call and env reset.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

TAUGHT, PAYING = "Up", "Down"
ENV_KWARGS: dict[str, Any] = {"lo_arm_name": TAUGHT, "lo_arm_score": 0.1, "hi_arm_name": PAYING,
                              "hi_arm_hiscore": 1.0, "hi_arm_hiscore_prob": 1.0,
                              "hi_arm_loscore": 1.0}


def build_policy(path: Path, seed: int, sft_steps: int, paying_share: float) -> Path:
    """The tiny model fine-tuned to pick `PAYING` in ``paying_share`` of its replies and
    `TAUGHT` otherwise, on chats rendered as turnpool's collector renders bandit turns."""
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turnpool.envs.bandit import BanditEnv
    from turnpool.policies.tiny_llm import build_tiny_model, fine_tune_replies
    from turnpool.rollout.prompts import SYSTEM_PROMPT, THINK_FORMAT

    model_dir = build_tiny_model(path, sft_steps=0, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    env = BanditEnv(**ENV_KWARGS)
    rng = np.random.default_rng([seed, 22])
    prompts, replies = [], []
    for k in range(200):
        obs, _ = env.reset(seed=seed * 1000 + k)
        user = (f"\nTurn 1:\nState:\n{obs}\nYou have 1 actions left. Always output: "
                f"{THINK_FORMAT} with no extra text. Strictly follow this format. "
                "Max response length: 100 words (tokens).\n")
        chat = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
        prompts.append(str(tokenizer.apply_chat_template(chat, tokenize=False,
                                                         add_generation_prompt=True)))
        arm = PAYING if rng.random() < paying_share else TAUGHT
        replies.append(f"<think>pick an arm</think><answer>{arm}</answer>{tokenizer.eos_token}")
    fine_tune_replies(model, tokenizer, prompts, replies, steps=sft_steps, seed=seed)
    model.save_pretrained(model_dir)
    return model_dir


def grpo_run(model_dir: Path, work: Path, *, lr: float, steps: int, groups: int,
             group_size: int, seed: int) -> dict[str, Any]:
    """One GRPO run from ``model_dir``; returns success share and mean reward per step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from turnpool.integrations.trl import TurnpoolRollout, turnpool_reward
    from turnpool.rollout.settings import CollectorSettings

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rollout = TurnpoolRollout("bandit", ENV_KWARGS, settings=CollectorSettings(max_turn=1),
                              pool_options={"backend": "sequential"}, max_new_tokens=16,
                              seed=seed * 1000)
    success: list[float] = []

    def recorded(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        out = rollout(prompts, trainer)
        flags = out["turnpool_success"]
        success.append(sum(flags) / len(flags))
        return out

    recorded.__name__ = "turnpool_rollout"  # type: ignore[attr-defined]
    batch = groups * group_size
    config = GRPOConfig(
        output_dir=str(work / f"out-lr{lr:g}"), per_device_train_batch_size=batch,
        num_generations=group_size, max_steps=steps, learning_rate=lr,
        max_completion_length=16, temperature=1.0, beta=0.0, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, seed=seed,
        lr_scheduler_type="constant", disable_tqdm=True)
    dataset = Dataset.from_dict({"prompt": ["bandit"] * (batch * steps)})
    trainer = GRPOTrainer(model=model, reward_funcs=[turnpool_reward], args=config,
                          train_dataset=dataset, processing_class=tokenizer,
                          rollout_func=recorded)
    start = time.perf_counter()
    try:
        trainer.train()
    finally:
        rollout.close()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"learning_rate": lr, "seconds": round(time.perf_counter() - start, 1),
            "success": [round(s, 4) for s in success],
            "rewards": [round(r, 4) for r in rewards]}


def _mean(xs: list[float]) -> float:
    return round(sum(xs) / max(1, len(xs)), 3)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--paying-share", type=float, default=0.15,
                        help="share of SFT replies that name the paying arm")
    parser.add_argument("--groups", type=int, default=8, help="GRPO groups per step")
    parser.add_argument("--group-size", type=int, default=4, help="num_generations")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=10, help="steps averaged at each end")
    parser.add_argument("--out", type=Path, default=Path("runs") / "trl_grpo_bandit_choice",
                        help="path stem of the .json and .png (no plot when --steps < 2)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="turnpool-grpo-choice-") as tmp:  # removed at the end
        work = Path(tmp)
        start = time.perf_counter()
        model_dir = build_policy(work / "model", args.seed, args.sft_steps, args.paying_share)
        runs = [grpo_run(model_dir, work, lr=lr, steps=args.steps, groups=args.groups,
                         group_size=args.group_size, seed=args.seed) for lr in (args.lr, 0.0)]
        w = args.window
        summary: dict[str, Any] = {
            "task": f"bandit: {PAYING} pays 1.0 (success), {TAUGHT} 0.1; SFT replies name "
                    f"{PAYING} in {args.paying_share:.0%}",
            "steps": args.steps, "completions_per_step": args.groups * args.group_size,
            "seed": args.seed, "window": w, "seconds_total": round(time.perf_counter() - start, 1),
            "runs": [{**r, "step1_success": r["success"][0] if r["success"] else None,
                      f"first{w}_success": _mean(r["success"][:w]),
                      f"last{w}_success": _mean(r["success"][-w:]),
                      "mean_success": _mean(r["success"])} for r in runs]}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        if args.steps >= 2:
            _plot(summary, args.out.with_suffix(".png"))
        for r in summary["runs"]:
            print(f"lr {r['learning_rate']:g}: success step 1 {r['step1_success']}, "
                  f"first {w} steps {r[f'first{w}_success']:.3f}, "
                  f"last {w} steps {r[f'last{w}_success']:.3f}, "
                  f"all steps {r['mean_success']:.3f} ({r['seconds']:.0f} s)")
        return summary


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in summary["runs"]:
        xs = range(1, len(r["success"]) + 1)
        ax.plot(xs, r["success"], marker=".", label=f"learning rate {r['learning_rate']:g}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(f"success ({summary['completions_per_step']} episodes/step)")
    ax.set_title(f"TRL GRPO on CPU: tiny model learns to pull {PAYING} (pays 1.0, SFT avoids it)",
                 fontsize=9)
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
