"""A local transformers model as a policy: chat template, left-padded batches, one lock.

Several rollout threads may share one ``HFPolicy``: a single ``threading.Lock`` serialises
the forward passes, since a torch model is not safe to run from two threads at once. Each call
still generates its whole batch in one ``generate`` call, so the batch is the unit of
parallelism.

Loading is strictly local (``HF_HUB_OFFLINE`` is set before transformers is imported and the
path must be a directory), so a typo never turns into a hub retry loop.

Decoding is greedy by default, which is deterministic. With ``temperature > 0`` every draw (each
``generate`` chunk and each ``generate_ids`` call, however it is reached) samples from a fresh
seed ``(seed, draw index)`` inside ``torch.random.fork_rng``, so the process-global torch RNG is
untouched, two calls on the same prompt (a GRPO group's members) get distinct samples, and a run
is reproducible from ``seed`` and the order of calls.

``generate_tokens`` (the `turnpool.policies.base.TokenPolicy` side) continues each
conversation from the tokens it already has (`turnpool.policies.tokens.continue_chat`) and
returns prompt and reply ids with the reply's log-probabilities; `HFPolicy.from_model` wraps
a model already in memory (a trainer's), so rollouts sample from the weights being trained.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from turnpool.policies.base import Message, PolicyStats, TokenTurn, TurnContext
from turnpool.policies.tokens import ChatRenderer, check_history_mode, continue_chat, encode_text

logger = logging.getLogger(__name__)


def _torch_dtype(name: str) -> Any:
    """The torch dtype named ``name`` (``"float32"``, ``"bfloat16"``, ...)."""
    import torch

    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
             "float64": torch.float64}.get(name)
    if dtype is None:
        raise ValueError(f"dtype must be 'auto', 'float32', 'float16', 'bfloat16' or "
                         f"'float64', got {name!r}")
    return dtype


class HFPolicy:
    """Batched generation with a local ``AutoModelForCausalLM``.

    Example (a model folder such as `turnpool.policies.tiny_llm.build_tiny_model` writes; not
    run as a doctest, loading a model takes seconds)::

        policy = HFPolicy(model_path="path/to/model", max_new_tokens=32)
        replies = policy.generate([[{"role": "user", "content": "hi"}]])
    """

    def __init__(
        self,
        model_path: str,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 64,
        max_input_tokens: int | None = None,
        assistant_prefix: str = "",
        max_response_chars: int = 65536,
        sampling: dict[str, Any] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        history: str = "verbatim",
    ) -> None:
        path = Path(model_path)
        if not path.is_dir():
            raise FileNotFoundError(
                f"hf policy: model_path {model_path!r} is not a local directory")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._settings(str(path), torch.device(device), max_new_tokens, temperature, top_p,
                       seed, batch_size, max_input_tokens, assistant_prefix, max_response_chars)
        self.tokenizer = AutoTokenizer.from_pretrained(
            self.model_path, padding_side="left", local_files_only=True)
        self.tokenizer.padding_side = "left"
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.sampling = dict(sampling or {})
        self.template_kwargs = dict(template_kwargs or {})
        self.history = check_history_mode(history)
        model: Any = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=dtype if dtype == "auto" else _torch_dtype(dtype),
            local_files_only=True)
        self.model: Any = model.to(self.device).eval()

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, max_new_tokens: int = 128,
                   temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                   batch_size: int = 64, max_input_tokens: int | None = None,
                   assistant_prefix: str = "", max_response_chars: int = 65536,
                   sampling: dict[str, Any] | None = None,
                   template_kwargs: dict[str, Any] | None = None,
                   history: str = "verbatim") -> HFPolicy:
        """A policy over a model and tokenizer already loaded (say, a trainer's). The model is
        used as it is (device, dtype, train/eval mode are the caller's); generation runs under
        ``torch.inference_mode``. The tokenizer is not modified: padding is done here.

        ``sampling`` adds ``generate`` keyword arguments (``top_k``, ``min_p``,
        ``repetition_penalty``, ...; used when sampling), ``template_kwargs`` go to the chat
        template (``enable_thinking``), ``history`` is a `turnpool.policies.tokens` mode."""
        self = cls.__new__(cls)
        self._settings("", next(model.parameters()).device, max_new_tokens, temperature, top_p,
                       seed, batch_size, max_input_tokens, assistant_prefix, max_response_chars)
        self.tokenizer = tokenizer
        self.model = model
        self.sampling = dict(sampling or {})
        self.template_kwargs = dict(template_kwargs or {})
        self.history = check_history_mode(history)
        return self

    def _settings(self, model_path: str, device: Any, max_new_tokens: int, temperature: float,
                  top_p: float, seed: int, batch_size: int, max_input_tokens: int | None,
                  assistant_prefix: str, max_response_chars: int) -> None:
        """The generation settings and bookkeeping both constructors share."""
        import torch

        self._torch = torch
        self.model_path = model_path
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self.batch_size = max(1, int(batch_size))
        self.max_input_tokens = max_input_tokens
        self.assistant_prefix = assistant_prefix
        self.max_response_chars = int(max_response_chars)
        self.device = device
        self.sampling = {}
        self.template_kwargs = {}
        self.history = "verbatim"
        self._renderer: ChatRenderer | None = None
        self.stats = PolicyStats()
        self._lock = threading.Lock()
        self._calls = 0
        self._draws = 0
        self._draw_lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ protocol
    def generate(
        self, batch: list[list[Message]], contexts: list[TurnContext] | None = None
    ) -> list[str]:
        """One reply per conversation; ``contexts`` is not needed by a language model."""
        if not batch:
            return []
        if self._closed:
            raise RuntimeError("hf policy is closed")
        prompts = [self._render(messages) for messages in batch]
        replies: list[str] = []
        with self._lock:
            start = time.perf_counter()
            self._calls += 1
            self.stats.calls += 1
            for lo in range(0, len(prompts), self.batch_size):
                replies.extend(self._generate_chunk(prompts[lo:lo + self.batch_size]))
            self.stats.requests += len(prompts)
            self.stats.generate_seconds += time.perf_counter() - start
        return replies

    def close(self) -> None:
        """Drop the model reference (idempotent)."""
        with self._lock:
            self._closed = True
            self.model = None

    # ------------------------------------------------------------------ internals
    def _render(self, messages: list[Message]) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.template_kwargs)
        return str(text) + self.assistant_prefix

    def _next_seed(self) -> int:
        """The seed of the next draw: ``(seed, draw index)``; every draw gets its own."""
        with self._draw_lock:
            self._draws += 1
            draw = self._draws
        return (self.seed * 1_000_003 + draw) % (2**63)

    def _generate_chunk(self, prompts: list[str]) -> list[str]:
        torch = self._torch
        enc_kwargs: dict[str, Any] = {"padding": True, "return_tensors": "pt",
                                      "add_special_tokens": False}
        if self.max_input_tokens:
            enc_kwargs.update(truncation=True, max_length=int(self.max_input_tokens))
        enc = self.tokenizer(prompts, **enc_kwargs).to(self.device)
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": self.tokenizer.eos_token_id,
        }
        if self.temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p)
            gen_kwargs.update({k: v for k, v in self.sampling.items() if v is not None})
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(self._next_seed())
            out = self.model.generate(
                input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], **gen_kwargs)
        new_tokens = out[:, enc["input_ids"].shape[1]:]
        texts = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return [(self.assistant_prefix + t)[: self.max_response_chars] for t in texts]

    # ------------------------------------------------------------------ tokens
    def generate_tokens(
        self, batch: list[list[Message]], prefixes: list[list[int] | None],
        contexts: list[TurnContext] | None = None, budgets: list[int | None] | None = None,
    ) -> list[TokenTurn]:
        """Replies with their tokens; each conversation continues from ``prefixes[i]`` (see
        `turnpool.policies.base.TokenPolicy`, ``budgets`` included)."""
        if len(prefixes) != len(batch):
            raise ValueError(f"{len(prefixes)} prefixes for {len(batch)} conversations")
        if not batch:
            return []
        if self._closed:
            raise RuntimeError("hf policy is closed")
        forced = encode_text(self.tokenizer, self.assistant_prefix) if self.assistant_prefix else []
        # (input ids, new ids, extends, reply limit); limit < 1: no room left, no generation
        inputs: list[tuple[list[int], list[int], bool, int]] = []
        renderer = self.renderer
        for k, (messages, prefix) in enumerate(zip(batch, prefixes)):
            new, extends = continue_chat(self.tokenizer, messages, prefix,
                                         history=self.history, renderer=renderer)
            new = new + forced
            ids = (list(prefix) if extends and prefix else []) + new
            if self.max_input_tokens and len(ids) > int(self.max_input_tokens):
                ids = ids[-int(self.max_input_tokens):]
                new, extends = ids, False
            limit = self.max_new_tokens
            budget = budgets[k] if budgets is not None else None
            if budget is not None:
                limit = min(limit, int(budget) - (len(new) if extends else len(forced)))
            inputs.append((ids, new, extends, limit))
        out: list[TokenTurn | None] = [
            TokenTurn("", new, [], [], extends, stop="token_budget") if limit < 1 else None
            for _, new, extends, limit in inputs]
        todo = [k for k, turn in enumerate(out) if turn is None]
        with self._lock:
            start = time.perf_counter()
            self._calls += 1
            self.stats.calls += 1
            for lo in range(0, len(todo), self.batch_size):
                chunk = todo[lo:lo + self.batch_size]
                replies = self.generate_ids([inputs[k][0] for k in chunk],
                                            max(inputs[k][3] for k in chunk))
                for k, (reply, logps) in zip(chunk, replies):
                    _, new, extends, limit = inputs[k]
                    reply, logps = reply[:limit], logps[:limit]
                    text = str(self.tokenizer.decode(reply, skip_special_tokens=True))
                    out[k] = TokenTurn(
                        text=(self.assistant_prefix + text)[: self.max_response_chars],
                        prompt_ids=new, response_ids=reply, logprobs=logps, extends=extends)
            self.stats.requests += len(todo)
            self.stats.generate_seconds += time.perf_counter() - start
        return [turn for turn in out if turn is not None]

    @property
    def renderer(self) -> ChatRenderer:
        """The `turnpool.policies.tokens.ChatRenderer` for this tokenizer and template."""
        if self._renderer is None:
            self._renderer = ChatRenderer(self.tokenizer, self.template_kwargs)
        return self._renderer

    def generate_ids(self, prompts: list[list[int]], max_new_tokens: int | None = None
                     ) -> list[tuple[list[int], list[float]]]:
        """Sample from token ids (left-padded here); each reply is cut after its first
        end-of-turn token and comes with its tokens' log-probabilities (of the distribution
        sampled from: after temperature, top-k/top-p/min-p and repetition penalty)."""
        torch = self._torch
        pad = self.tokenizer.pad_token_id
        pad = self.tokenizer.eos_token_id if pad is None else pad
        ends = sorted(self.renderer.end_ids)
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts],
                                 device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                            device=self.device)
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": int(max_new_tokens or self.max_new_tokens),
            "pad_token_id": pad, "eos_token_id": ends,
            "output_scores": True, "return_dict_in_generate": True}
        if self.temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p,
                              top_k=None)
            gen_kwargs.update({k: v for k, v in self.sampling.items() if v is not None})
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(self._next_seed())
            res = self.model.generate(input_ids=input_ids, attention_mask=mask, **gen_kwargs)
            new = res.sequences[:, width:]
            steps = min(len(res.scores), new.shape[1])
            logps = torch.stack([torch.log_softmax(res.scores[t].float(), dim=-1)
                                 .gather(1, new[:, t:t + 1]).squeeze(1)
                                 for t in range(steps)], dim=1) if steps else None
        replies: list[tuple[list[int], list[float]]] = []
        for b in range(new.shape[0]):
            ids = [int(i) for i in new[b, :steps].tolist()]
            stop = next((k for k, i in enumerate(ids) if i in self.renderer.end_ids), None)
            if stop is not None:
                ids = ids[: stop + 1]
            lp = [] if logps is None else [float(x) for x in logps[b, : len(ids)].tolist()]
            replies.append((ids, lp))
        return replies
