"""A tiny offline LLM: a Llama-style chat model, its byte-level BPE tokenizer, and a server.

Tests and benchmarks need a real ``transformers`` model (for the ``hf`` policy and for an
OpenAI-compatible server such as ``transformers serve``) without downloading anything. This
module trains a 512-token byte-level BPE on synthetic env-like text, builds a ~100k-parameter
Llama with a ChatML template and, optionally, fine-tunes it for a few seconds so that its
greedy replies look like ``<think>...</think><answer>Up</answer>``. `transformers_server` runs
``transformers serve`` on such a folder for OpenAI-compatible tests.

Randomness: all text comes from a ``numpy.random.Generator`` seeded from ``seed``; weights are
initialised from a local ``torch.Generator``; the fine-tuning runs inside
``torch.random.fork_rng`` so the process-global torch RNG is left as it was.

Example (the tokenizer alone takes well under a second; ``build_tiny_model("tiny-llama",
sft_steps=100)`` writes the fine-tuned model folder in a few CPU-seconds)::

    >>> from turnpool.policies.tiny_llm import build_tokenizer
    >>> tok = build_tokenizer(seed=0)
    >>> tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    '<|im_start|>user\\nhi<|im_end|>\\n'
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import MethodType
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SOKOBAN_ACTIONS = ("Up", "Down", "Left", "Right")
_THOUGHTS = ("push box", "move to the box", "the target is near", "go around the wall",
             "avoid the hole", "reach the goal")


def _sokoban_grid(rng: np.random.Generator, size: int = 6) -> str:
    rows = []
    for r in range(size):
        if r in (0, size - 1):
            rows.append("#" * size)
            continue
        inner = rng.choice(["_", "_", "_", "#"], size=size - 2)
        rows.append("#" + "".join(inner) + "#")
    cells = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    picks = rng.choice(len(cells), size=3, replace=False)
    grid = [list(row) for row in rows]
    for sym, idx in zip("PXO", picks):
        r, c = cells[int(idx)]
        grid[r][c] = sym
    return "\n".join("".join(row) for row in grid)


def _lake_grid(rng: np.random.Generator, size: int = 4) -> str:
    cells = rng.choice(["_", "_", "_", "O"], size=(size, size))
    cells[0, 0] = "P"
    cells[-1, -1] = "G"
    return "\n".join("".join(row) for row in cells)


def _reply(rng: np.random.Generator, n_actions: int = 1) -> str:
    thought = _THOUGHTS[int(rng.integers(len(_THOUGHTS)))]
    actions = " || ".join(SOKOBAN_ACTIONS[int(i)] for i in rng.integers(4, size=n_actions))
    return f"<think>{thought}</think><answer>{actions}</answer>"


#: What the fine-tuned model answers: one fixed, well-formed turn whose move is legal in both
#: Sokoban and FrozenLake. A constant target is learnt in few steps and does not depend on
#: prompt wording; tests that need prompt-dependent output use an untrained model instead.
SFT_REPLY = "<think>push box</think><answer>Up</answer>"


def _turn_reply(turn: int) -> str:
    """An earlier assistant turn inside a sampled chat (varies with the turn number)."""
    action = SOKOBAN_ACTIONS[(turn - 1) % len(SOKOBAN_ACTIONS)]
    return f"<think>{_THOUGHTS[(turn - 1) % len(_THOUGHTS)]}</think><answer>{action}</answer>"


_GAMES = {
    "sokoban": (
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes "
        "to targets. When you are right next to a box, you can push it by moving in the same "
        "direction. The answer should be a sequence of actions, like "
        "<answer>Right || Right || Up</answer>",
        "#: wall, _: empty, O: target, \u221a: box on target, X: box, P: player, "
        "S: player on target",
        "Up, Down, Left, Right"),
    "frozen_lake": (
        "You are solving the FrozenLake puzzle. Forbid the hole and go to the target. You may "
        "move to the unintended direction due to the slippery ice. Example answer format: "
        "<think>I should go left then go up.</think><answer>Left || Up</answer>",
        "P: player, _: empty, O: hole, G: goal, X: player in hole, \u221a: player on goal",
        "Left, Down, Right, Up"),
}


def _turn_text(rng: np.random.Generator, game: str, turn: int) -> str:
    grid = _sokoban_grid(rng) if game == "sokoban" else _lake_grid(rng)
    left = int(rng.integers(1, 11))
    return (f"\nTurn {turn}:\nState:\n{grid}\nYou have {left} actions left. Always output: "
            "<think> [Your thoughts] </think> <answer> [your answer] </answer> with no extra "
            "text. Strictly follow this format. Max response length: 100 words (tokens).\n")


def sample_conversation(rng: np.random.Generator, turns: int = 1) -> list[dict[str, str]]:
    """A RAGEN-style chat (instruction, legend, actions, then ``turns`` turns) ending in a
    user message; earlier turns carry assistant replies and a reward line."""
    game = "sokoban" if rng.random() < 0.6 else "frozen_lake"
    instruction, legend, actions = _GAMES[game]
    user = (f"{instruction}\nThe meaning of each symbol in the state is:\n{legend}\n"
            f"Your available actions are:\n{actions}\nYou can make up to 10 actions, "
            'separated by the action separator " || "\n')
    messages = [{"role": "system", "content": "You're a helpful assistant. "}]
    for turn in range(1, turns + 1):
        user += _turn_text(rng, game, turn)
        messages.append({"role": "user", "content": user})
        if turn < turns:
            messages.append({"role": "assistant", "content": _turn_reply(turn)})
            user = f"Reward:\n{float(rng.choice([0.0, -0.1, 1.0]))}\n"
    return messages


def sample_conversations(n: int, seed: int = 0, turns: int = 1) -> list[list[dict[str, str]]]:
    """``n`` prompts like the ones a rollout sends, for tests and benchmarks."""
    rng = np.random.default_rng([seed, 3])
    return [sample_conversation(rng, 1 + (i % turns)) for i in range(n)]


def synthetic_corpus(seed: int = 0, n_lines: int = 3000) -> list[str]:
    """Env-like text (grids, countdown targets, answer strings) for tokenizer training."""
    rng = np.random.default_rng([seed, 1])
    lines: list[str] = []
    for i in range(n_lines):
        kind = i % 6
        if kind == 0:
            lines.append(_sokoban_grid(rng, int(rng.integers(5, 9))))
        elif kind == 1:
            lines.append(_lake_grid(rng, int(rng.integers(3, 7))))
        elif kind == 2:
            nums = [int(x) for x in rng.integers(1, 100, size=int(rng.integers(2, 5)))]
            lines.append(f"Target: {int(rng.integers(1, 200))}, nums: {nums}")
        elif kind == 3:
            lines.append(_reply(rng, int(rng.integers(1, 4))))
        elif kind == 4:
            chat = sample_conversation(rng, int(rng.integers(1, 3)))
            lines.extend(m["content"] for m in chat[1:])
        else:
            arms = "phoenix dragon" if rng.random() < 0.5 else "dragon phoenix"
            lines.append(f"<|im_start|>user\nChoose an arm: {arms}. The answer is: "
                         f"{int(rng.integers(0, 1000))}<|im_end|>")
    return lines


def build_tokenizer(seed: int = 0, vocab_size: int = 512) -> Any:
    """A ``PreTrainedTokenizerFast`` (byte-level BPE, ChatML, left padding)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
    # Whole-tag tokens (as chat models such as Qwen have for <think>): the token after a tag
    # then depends on the tag alone, which a 2-layer model learns fast and keeps on long
    # prompts. Not "special", so decoding keeps them.
    tok.add_tokens([AddedToken(tag, normalized=False, special=False) for tag in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
        chat_template=CHATML_TEMPLATE,
    )


def build_tiny_model(
    path: str | os.PathLike[str],
    sft_steps: int = 0,
    seed: int = 0,
    max_position_embeddings: int = 2048,
    init_std: float = 0.02,
) -> Path:
    """Write a tiny Llama chat model and its tokenizer to ``path`` and return the path.

    ``sft_steps > 0`` fine-tunes on RAGEN-style Sokoban and FrozenLake chats (see
    `sample_conversation`) so that greedy decoding answers `SFT_REPLY`
    (``<think>push box</think><answer>Up</answer>``); 100 steps cost about 4 CPU-seconds.
    A large ``init_std`` without fine-tuning gives a model whose (meaningless) greedy output
    varies strongly with the prompt, which is what batch-alignment tests need.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                else:
                    param.normal_(0.0, init_std, generator=gen)
        if sft_steps > 0:
            torch.manual_seed(seed)
            threads = torch.get_num_threads()
            # 64-wide matrices gain nothing from intra-op threads, and on a busy machine
            # spinning OpenMP workers only slow each step down; restored right after.
            torch.set_num_threads(1)
            try:
                _fine_tune(model, tokenizer, sft_steps, seed)
            finally:
                torch.set_num_threads(threads)
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _make_loadable_by_v4(out)
    logger.info("tiny model written to %s (%d parameters, sft_steps=%d)",
                out, sum(p.numel() for p in model.parameters()), sft_steps)
    return out


def _fine_tune(model: Any, tokenizer: Any, steps: int, seed: int,
               batch_size: int = 16, lr: float = 3e-3, tail_tokens: int = 64) -> None:
    """Supervised steps on (prompt, reply) pairs; the loss covers only the reply tokens."""
    import torch

    rng = np.random.default_rng([seed, 2])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        prompts, replies = [], []
        for _ in range(batch_size):
            turns = int(rng.integers(1, 4))
            messages = sample_conversation(rng, turns)
            prompts.append(tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True))
            replies.append(SFT_REPLY + "<|im_end|>")
        ids, labels = [], []
        for prompt, reply in zip(prompts, replies):
            # Only the end of the prompt: short rows keep a step cheap, and with whole-tag
            # tokens the reply hardly depends on the context, so it carries over to
            # full-length multi-turn prompts (48/48 in trials over four seeds).
            p = tokenizer(prompt, add_special_tokens=False)["input_ids"][-tail_tokens:]
            r = tokenizer(reply, add_special_tokens=False)["input_ids"]
            ids.append(p + r)
            labels.append([-100] * len(p) + r)
        loss = _train_step(model, optimizer, tokenizer.pad_token_id, ids, labels)
    logger.info("tiny model fine-tuned for %d steps, final loss %.3f", steps, loss.item())


def fine_tune_replies(model: Any, tokenizer: Any, prompts: Sequence[str],
                      replies: Sequence[str], steps: int, seed: int = 0, batch_size: int = 16,
                      lr: float = 3e-3, tail_tokens: int = 64, full_context: float = 0.0,
                      threads: int = 1) -> float:
    """Supervised steps teaching ``model`` to answer rendered ``prompts[i]`` with
    ``replies[i]`` (each step draws ``batch_size`` pairs with a local generator; the loss covers
    the reply tokens; only the last ``tail_tokens`` of a prompt are fed, which keeps steps cheap,
    except that a fraction ``full_context`` of the steps feed whole prompts (a quarter of the
    batch, so those steps cost about as much as the others), so the reply also holds at full
    prompt length). ``threads``: torch intra-op threads for the steps (one suits the tiny model,
    whose matrices are too small to split; a 100M-parameter model gains from more).
    Used to give the tiny model a behaviour a test needs, such as calling tools. Returns the
    last step's loss; leaves the model in eval mode and the global torch RNG untouched."""
    import torch

    if len(prompts) != len(replies) or not prompts:
        raise ValueError("need as many replies as prompts, and at least one")
    rng = np.random.default_rng([seed, 3])
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    loss = torch.tensor(float("nan"))
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        model.train()
        for _ in range(steps):
            ids, labels = [], []
            long = full_context > 0 and rng.random() < full_context
            for k in rng.integers(0, len(prompts), size=max(1, batch_size // 4) if long
                                  else batch_size):
                p = tokenizer(prompts[k], add_special_tokens=False)["input_ids"]
                r = tokenizer(replies[k], add_special_tokens=False)["input_ids"]
                p = p if long else p[-tail_tokens:]
                ids.append(p + r)
                labels.append([-100] * len(p) + r)
            loss = _train_step(model, optimizer, tokenizer.pad_token_id, ids, labels)
    finally:
        torch.set_num_threads(before)
        model.eval()
    return float(loss.item())


def teach_tool_calls(model: Any, tokenizer: Any, env_class: type, user_text: str,
                     seeds: Sequence[int] = range(8), steps: int = 150, seed: int = 0) -> float:
    """Fine-tune ``model`` to answer an `turnpool.integrations.trl_env.environment_factory`
    episode's first message with one Qwen-style ``<tool_call>`` JSON call of a random tool
    (of the env's tools, as TRL lists them: public methods other than ``reset`` and
    ``get_reward``, by name). Prompts are rendered as ``GRPOTrainer`` renders them: the row's
    user text plus the env's ``reset`` text, with the tools, through the template TRL trains
    with (``tokenizer.chat_template`` should be a Qwen2.5/Qwen3 template). Returns the loss."""
    import inspect

    from trl.chat_template_utils import (
        get_training_chat_template,
        is_chat_template_prefix_preserving,
    )

    env = env_class()
    methods = sorted((name, fn) for name, fn in inspect.getmembers(
        env_class, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward"))
    names = [name for name, _ in methods]
    tools = [MethodType(fn, env) for _, fn in methods]
    template = (None if is_chat_template_prefix_preserving(tokenizer)
                else get_training_chat_template(tokenizer))
    rng = np.random.default_rng([seed, 4])
    prompts, replies = [], []
    for s in seeds:
        chat = [{"role": "user", "content": user_text + env.reset(seed=int(s))}]
        rendered = str(tokenizer.apply_chat_template(chat, tools=tools, chat_template=template,
                                                     tokenize=False, add_generation_prompt=True))
        for _ in range(4):
            name = names[int(rng.integers(len(names)))]
            prompts.append(rendered)
            replies.append(f'<tool_call>\n{{"name": "{name}", "arguments": {{}}}}\n'
                           f"</tool_call>{tokenizer.eos_token}")
    return fine_tune_replies(model, tokenizer, prompts, replies, steps=steps, seed=seed, lr=5e-3,
                             batch_size=8, tail_tokens=48, full_context=0.5)


def _make_loadable_by_v4(path: Path) -> None:
    """transformers 5 writes a tokenizer class that version 4 does not know; name the common one."""
    cfg_file = path / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["padding_side"] = "left"
    cfg["model_input_names"] = ["input_ids", "attention_mask"]
    if "chat_template" not in cfg and not (path / "chat_template.jinja").exists():
        cfg["chat_template"] = CHATML_TEMPLATE
    cfg_file.write_text(json.dumps(cfg, indent=2), encoding="utf-8")


# ----------------------------------------------------------------------- a real test server
_SERVE_MAIN = ("import sys; from transformers.cli.transformers import main; "
               "sys.argv[0] = 'transformers'; sys.exit(main())")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies, so no server outlives it."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def transformers_server(
    model_dir: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    startup_timeout: float = 120.0,
    extra_args: tuple[str, ...] = (),
) -> Iterator[str]:
    """Run ``transformers serve MODEL_DIR`` on CPU; yield its ``/v1`` base URL; stop it after.

    The server is pinned to ``model_dir`` (send requests without a ``model`` field, or with the
    directory as the model name). Readiness is polled on ``/health`` until ``startup_timeout``;
    the process group is terminated (then killed) on exit.
    """
    import httpx

    port = port or free_port(host)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-c", _SERVE_MAIN, "serve", str(model_dir), "--host", host,
           "--port", str(port), "--device", "cpu", *extra_args]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, preexec_fn=_die_with_parent)
    try:
        _wait_healthy(f"http://{host}:{port}/health", proc, startup_timeout, log, httpx)
        yield f"http://{host}:{port}/v1"
    finally:
        _stop_group(proc)
        log.close()


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float, log: Any,
                  httpx: Any) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read()[-2000:].decode("utf-8", "replace")
            raise RuntimeError(f"transformers serve exited with {proc.returncode}:\n{tail}")
        try:
            if httpx.get(url, timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # polling interval of a readiness probe, not synchronisation
    raise TimeoutError(f"transformers serve not ready at {url} after {timeout:.0f}s")


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)


def _train_step(model: Any, optimizer: Any, pad: int, ids: list[list[int]],
                labels: list[list[int]]) -> Any:
    """One optimizer step on left-padded ``ids`` whose loss covers ``labels`` (-100: not
    trained); returns the loss."""
    import torch

    width = max(len(x) for x in ids)
    device = next(model.parameters()).device  # a model moved to a GPU trains there
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)
    label_ids = torch.tensor([[-100] * (width - len(x)) + x for x in labels], device=device)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
    loss = model(input_ids=input_ids, attention_mask=mask, labels=label_ids).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss
