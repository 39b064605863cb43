"""A local OpenAI-compatible server that answers in token ids, the way vLLM does.

Real runs generate with vLLM or SGLang behind an OpenAI-compatible API; neither runs here
(no GPU), so tests and benchmarks need a server with the same wire format over a small local
model: `TokenServer` serves any ``transformers`` causal LM (the tiny offline one in tests) on
127.0.0.1 from a thread of the calling process.

Endpoints (the subset of vLLM's API that token-level training uses):

* ``POST /v1/completions`` - ``prompt`` is a text, a list of token ids, or a list of such
  lists; ``return_token_ids`` adds ``prompt_token_ids`` and ``token_ids`` to every choice,
  ``logprobs`` (an int) adds ``{"tokens", "token_logprobs", "top_logprobs"}`` for the sampled
  tokens (``return_tokens_as_token_ids`` writes tokens as ``"token_id:<id>"``). Sampling:
  ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``,
  ``seed``, ``n``. Choices are prompt-major (the ``n`` choices of a prompt are adjacent).
* ``POST /v1/chat/completions`` - the chat rendered with the model's template and
  tokenized by the server (as vLLM does); ``return_token_ids`` adds ``prompt_token_ids``
  (top level) and the choice's ``token_ids``; ``logprobs`` adds ``{"content": [...]}``.
* ``GET /v1/models``, ``GET /health``.

Every generation is appended to `TokenServer.log` (``prompt_ids``, ``token_ids``,
``logprobs``, ``endpoint``, ``sampling``): what the server received and sampled, for tests
to compare with what a client recorded. Requests are bounded (body size, prompt and reply
lengths); the server binds loopback only.

Example (``model`` and ``tokenizer`` loaded from `turnpool.policies.tiny_llm.build_tiny_model`'s
folder; not run as a doctest, building the model takes seconds)::

    with TokenServer(model, tokenizer) as server:
        policy = OpenAIPolicy(server.url, tokenizer=tokenizer, return_token_ids=True)
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from turnpool.policies.hf import HFPolicy
from turnpool.policies.tokens import encode_text, render_chat

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 2**20
MAX_PROMPT_TOKENS = 32_768
MAX_TOKENS = 4096
MAX_PROMPTS = 256


class RequestError(ValueError):
    """A request the server refuses (HTTP 400)."""


class TokenServer:
    """vLLM's token-id wire format over a local model, on ``http://127.0.0.1:<port>/v1``.

    ``model_name`` is what ``/v1/models`` lists; requests may name it or leave it out.
    Greedy decoding at ``temperature`` 0; otherwise each request samples with its ``seed``
    (or the server's request counter), never the process-global RNG.
    """

    def __init__(self, model: Any, tokenizer: Any, *, model_name: str = "tiny",
                 port: int = 0) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._requests = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="turnpool-token-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The ``/v1`` base URL."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=10)
        self._httpd.server_close()

    def __enter__(self) -> TokenServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ generation
    def sample(self, prompts: list[list[int]], body: dict[str, Any], endpoint: str
               ) -> list[tuple[list[int], list[float]]]:
        """``n`` replies per prompt (prompt-major), each ``(ids, logprobs)``; logged."""
        n = _int(body.get("n", 1), "n", 1, 16)
        max_tokens = _int(body.get("max_tokens") or 16, "max_tokens", 1, MAX_TOKENS)
        temperature = float(body.get("temperature", 1.0) or 0.0)
        sampling = {k: body[k] for k in ("top_k", "min_p", "repetition_penalty")
                    if body.get(k) is not None}
        if sampling.get("top_k") in (0, -1):
            sampling.pop("top_k")
        with self._lock:
            self._requests += 1
            seed = int(body["seed"]) if body.get("seed") is not None else self._requests
            policy = HFPolicy.from_model(
                self.model, self.tokenizer, max_new_tokens=max_tokens, temperature=temperature,
                top_p=float(body.get("top_p") or 1.0), seed=seed, sampling=sampling)
            batch = [p for p in prompts for _ in range(n)]
            out = policy.generate_ids(batch)
            for prompt, (ids, lps) in zip(batch, out):
                self.log.append({"endpoint": endpoint, "prompt_ids": list(prompt),
                                 "token_ids": list(ids), "logprobs": list(lps),
                                 "sampling": {"temperature": temperature,
                                              "max_tokens": max_tokens, **sampling}})
        return out

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        prompts = self._prompts(body.get("prompt"))
        n = int(body.get("n", 1) or 1)
        out = self.sample(prompts, body, "completions")
        want_lp = body.get("logprobs") is not None
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        choices = []
        for k, (ids, lps) in enumerate(out):
            choice: dict[str, Any] = {
                "index": k, "text": self.tokenizer.decode(ids, skip_special_tokens=True),
                "finish_reason": self._finish(ids, body)}
            if body.get("return_token_ids"):
                choice["prompt_token_ids"] = prompts[k // n]
                choice["token_ids"] = ids
            if want_lp:
                tokens = [f"token_id:{i}" if as_ids else self.tokenizer.decode([i])
                          for i in ids]
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": lps,
                                      "top_logprobs": [{t: lp} for t, lp in zip(tokens, lps)]}
            else:
                choice["logprobs"] = None
            choices.append(choice)
        return {"object": "text_completion", "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": sum(len(p) for p in prompts),
                          "completion_tokens": sum(len(ids) for ids, _ in out)}}

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise RequestError("messages must be a list of {role, content} objects")
        kwargs = body.get("chat_template_kwargs") or {}
        prompt = encode_text(self.tokenizer, render_chat(self.tokenizer, messages, True,
                                                         dict(kwargs)))
        self._check_prompt(prompt)
        [(ids, lps)] = self.sample([prompt], {**body, "n": 1}, "chat")
        choice: dict[str, Any] = {
            "index": 0, "finish_reason": self._finish(ids, body),
            "message": {"role": "assistant",
                        "content": self.tokenizer.decode(ids, skip_special_tokens=True)}}
        data: dict[str, Any] = {"object": "chat.completion", "model": self.model_name,
                                "choices": [choice]}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [
                {"token": self.tokenizer.decode([i]), "logprob": lp, "top_logprobs": []}
                for i, lp in zip(ids, lps)]}
        if body.get("return_token_ids"):
            data["prompt_token_ids"] = prompt
            choice["token_ids"] = ids
        return data

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompts = [encode_text(self.tokenizer, prompt)]
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
            prompts = [list(prompt)]
        elif isinstance(prompt, list) and 0 < len(prompt) <= MAX_PROMPTS and all(
                isinstance(p, list) and p and all(isinstance(i, int) for i in p)
                for p in prompt):
            prompts = [list(p) for p in prompt]
        else:
            raise RequestError("prompt must be a text, a list of token ids or a list of those")
        for p in prompts:
            self._check_prompt(p)
        return prompts

    def _check_prompt(self, ids: list[int]) -> None:
        vocab = len(self.tokenizer)
        if not ids or len(ids) > MAX_PROMPT_TOKENS:
            raise RequestError(f"a prompt must have 1 to {MAX_PROMPT_TOKENS} tokens")
        if any(isinstance(i, bool) or not 0 <= i < vocab for i in ids):
            raise RequestError(f"token ids must be in [0, {vocab})")

    def _finish(self, ids: list[int], body: dict[str, Any]) -> str:
        return "length" if len(ids) >= int(body.get("max_tokens") or 16) else "stop"


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise RequestError(f"{name} must be an integer in [{lo}, {hi}]")
    return value


def _handler(server: TokenServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("token server: " + format, *args)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.rstrip("/") in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            elif self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [
                    {"id": server.model_name, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            route = {"/v1/completions": server.completions,
                     "/v1/chat/completions": server.chat}.get(self.path.rstrip("/"))
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if route is None:
                self._send(404, {"error": {"message": "not found"}})
                return
            if not 0 < length <= MAX_BODY_BYTES:
                self._send(413 if length > MAX_BODY_BYTES else 400,
                           {"error": {"message": "bad Content-Length"}})
                self.close_connection = True
                return
            try:
                body = json.loads(self.rfile.read(length))
                if not isinstance(body, dict):
                    raise RequestError("the body must be a JSON object")
                model = body.get("model")
                if model is not None and model != server.model_name:
                    raise RequestError(f"unknown model {str(model)[:80]!r}")
                self._send(200, route(body))
            except (RequestError, ValueError, TypeError) as exc:
                self._send(400, {"error": {"message": str(exc)[:300]}})

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    return Handler
