"""A local transformers model as a policy: chat template, left-padded batches, one lock.

Several rollout threads may share one ``HFPolicy``: a single ``threading.Lock`` serialises
the forward passes, since a torch model is not safe to run from two threads at once. Each call
still generates its whole batch in one ``generate`` call, so the batch is the unit of
parallelism.

Loading is strictly local (``HF_HUB_OFFLINE`` is set before transformers is imported and the
path must be a directory), so a typo never turns into a hub retry loop.

Decoding is greedy by default, which is deterministic. With ``temperature > 0`` each call draws
from a fresh seed ``(seed, call index)`` inside ``torch.random.fork_rng``, so the process-global
torch RNG is untouched; sampled replies then depend on the order of calls.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from turnpool.policies.base import Message, PolicyStats, TurnContext

logger = logging.getLogger(__name__)


class HFPolicy:
    """Batched generation with a local ``AutoModelForCausalLM``.

    Example:
        >>> policy = HFPolicy(model_path="path/to/model", max_new_tokens=32)  # doctest: +SKIP
        >>> policy.generate([[{"role": "user", "content": "hi"}]])            # doctest: +SKIP
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
    ) -> None:
        path = Path(model_path)
        if not path.is_dir():
            raise FileNotFoundError(
                f"hf policy: model_path {model_path!r} is not a local directory")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch = torch
        self.model_path = str(path)
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self.batch_size = max(1, int(batch_size))
        self.max_input_tokens = max_input_tokens
        self.assistant_prefix = assistant_prefix
        self.max_response_chars = int(max_response_chars)
        self.device = torch.device(device)
        self.stats = PolicyStats()
        self._lock = threading.Lock()
        self._calls = 0
        self._closed = False

        self.tokenizer = AutoTokenizer.from_pretrained(
            self.model_path, padding_side="left", local_files_only=True)
        self.tokenizer.padding_side = "left"
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model: Any = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=dtype if dtype == "auto" else getattr(torch, dtype),
            local_files_only=True)
        self.model: Any = model.to(self.device).eval()

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
            messages, tokenize=False, add_generation_prompt=True)
        return str(text) + self.assistant_prefix

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
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed((self.seed * 1_000_003 + self._calls) % (2**63))
            out = self.model.generate(
                input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], **gen_kwargs)
        new_tokens = out[:, enc["input_ids"].shape[1]:]
        texts = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return [(self.assistant_prefix + t)[: self.max_response_chars] for t in texts]
