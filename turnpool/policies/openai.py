"""Any OpenAI-compatible chat endpoint as a policy (vLLM, SGLang, ``transformers serve`` ...).

Requests go out on a bounded thread pool (``concurrency`` in flight at most, shared by every
thread that calls ``generate``). Nothing waits without a limit: each attempt has ``timeout``
seconds, retries are bounded (``max_retries``, exponential backoff) and a whole ``generate``
call has a ``deadline``. A request that still fails yields a `FailedReply` (empty text with
the reason), which the collector records as a ``policy_error`` (retried or dropped, never
scored), and is counted in ``policy.stats``; ``on_error="raise"`` raises instead. When every
request of a call failed because the endpoint cannot be reached (connection refused, unknown
host) after the bounded retries, ``generate`` raises `PolicyUnreachable` naming the URL: no
later call could succeed, and a rollout must not spend its time failing every episode.
Response bodies are read up to ``max_body_bytes`` and replies are cut to
``max_response_chars``: the server's text is hostile input like any model output.

Tokens (`OpenAIPolicy.generate_tokens`, what the collector uses): with a ``tokenizer`` (the
served model's, a local directory or an object) the policy renders the chat itself
(`turnpool.policies.tokens.ChatRenderer`: the first prompt, then only each new turn's ids
appended to what the model saw and sampled) and sends **token ids** to the completions
endpoint (``prompt`` = a list of ids, as vLLM and SGLang accept), reading back the sampled ids
(vLLM's ``return_token_ids``) and their log-probabilities: a multi-turn episode is then one
exact sequence (``token_path="tokens"``). Only when asked (``token_path="chat"``, or
``return_token_ids=True`` without a tokenizer) does it fall back to the chat endpoint, which
renders and tokenizes the whole chat itself every turn: each turn's ``prompt_ids`` is then a
whole prompt (``extends=False``, ``token_path="chat"`` on the turn) and a multi-turn episode
gives one sample per turn (`turnpool.rollout.trajectory.Trajectory.token_samples`).

Example (nothing listens on port 9 here: one attempt, then `PolicyUnreachable`)::

    policy = OpenAIPolicy(base_url="http://127.0.0.1:8000/v1", model="qwen", concurrency=8)
    replies = policy.generate([[{"role": "user", "content": "hi"}]])

    >>> policy = OpenAIPolicy(base_url="http://127.0.0.1:9/v1", model="qwen", max_retries=0)
    >>> policy.generate([[{"role": "user", "content": "hi"}]])
    Traceback (most recent call last):
    turnpool.policies.base.PolicyUnreachable: cannot reach the policy endpoint http://127.0.0.1:9/v1...
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

import httpx

from turnpool.policies.base import (
    FailedReply,
    Message,
    PolicyStats,
    PolicyUnreachable,
    TokenTurn,
    TurnContext,
)
from turnpool.policies.tokens import (
    ChatRenderer,
    check_history_mode,
    continue_chat,
    turn_limit,
)

logger = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class PolicyRequestError(RuntimeError):
    """Raised by ``generate`` for a failed request when ``on_error="raise"``."""


class _Reply(str):
    """A reply text that also carries the server's token ids (when it sent them)."""

    tokens: TokenTurn | None = None


def _tokens_of(reply: str) -> TokenTurn | None:
    """The token ids a reply carries: none for a `FailedReply` or a reply without them."""
    return reply.tokens if isinstance(reply, _Reply) else None


class _Failure(Exception):
    def __init__(self, reason: str, retryable: bool, timeout: bool = False,
                 unreachable: bool = False) -> None:
        super().__init__(reason)
        self.retryable = retryable
        self.timeout = timeout
        self.unreachable = unreachable


class _Unreachable(PolicyRequestError):
    """A request that failed only because nothing could be connected to."""


class OpenAIPolicy:
    """Chat completions over HTTP with a concurrency limit, timeouts and bounded retries.

    ``model=None`` leaves the field out of the request: servers pinned to one model (such as
    ``transformers serve DIR``) reject any other name.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str = "EMPTY",
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float | None = None,
        seed: int | None = None,
        stop: list[str] | None = None,
        concurrency: int = 8,
        timeout: float = 60.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        backoff_max: float = 8.0,
        deadline: float | None = None,
        on_error: str = "empty",
        extra_body: dict[str, Any] | None = None,
        max_response_chars: int = 65536,
        max_body_bytes: int = 8 * 2**20,
        return_token_ids: bool = False,
        tokenizer: Any = None,
        token_path: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        history: str = "verbatim",
        sampling: dict[str, Any] | None = None,
    ) -> None:
        if on_error not in ("empty", "raise"):
            raise ValueError(f"on_error must be 'empty' or 'raise', got {on_error!r}")
        if concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise ValueError("need concurrency >= 1, max_retries >= 0 and timeout > 0")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.completions_url = base_url.rstrip("/") + "/completions"
        if isinstance(tokenizer, str):
            tokenizer = _load_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.token_path = token_path or ("tokens" if tokenizer is not None else "chat")
        if self.token_path not in ("tokens", "chat"):
            raise ValueError(f"token_path must be 'tokens' or 'chat', got {token_path!r}")
        if self.token_path == "tokens" and tokenizer is None:
            raise ValueError("token_path='tokens' needs the served model's tokenizer")
        self.template_kwargs = dict(template_kwargs or {})
        self.history = check_history_mode(history)
        #: extra sampling fields for the request body (top_k, min_p, repetition_penalty, ...)
        self.sampling = dict(sampling or {})
        self._renderer = (ChatRenderer(tokenizer, self.template_kwargs)
                          if tokenizer is not None else None)
        self.model = model
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.top_p = top_p
        self.seed = seed
        self.stop = stop
        self.concurrency = int(concurrency)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.backoff_max = float(backoff_max)
        self.deadline = deadline
        self.on_error = on_error
        self.extra_body = dict(extra_body or {})
        self.max_response_chars = int(max_response_chars)
        self.max_body_bytes = int(max_body_bytes)
        self.return_token_ids = bool(return_token_ids)
        self.stats = PolicyStats()
        self._stats_lock = threading.Lock()
        self._closing = threading.Event()
        self._client = httpx.Client(
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(self.timeout),
            limits=httpx.Limits(max_connections=self.concurrency,
                                max_keepalive_connections=self.concurrency),
            trust_env=False,
        )
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency,
                                        thread_name_prefix="turnpool-openai")
        self._closed = False

    # ------------------------------------------------------------------ protocol
    def generate(
        self, batch: list[list[Message]], contexts: list[TurnContext] | None = None
    ) -> list[str]:
        """One reply per conversation; a failed request gives a `FailedReply` (empty text with
        the reason; or raises, see on_error)."""
        if not batch:
            return []
        return self._run([(self.url, self._payload(messages)) for messages in batch])

    def _run(self, requests: list[tuple[str, dict[str, Any]]]) -> list[str]:
        """POST each ``(url, body)`` on the thread pool under one call budget; a failed
        request gives a `FailedReply` (or raises, see ``on_error``)."""
        if not requests:
            return []
        if self._closed:
            raise RuntimeError("openai policy is closed")
        batch = requests
        start = time.monotonic()
        budget = self._call_budget(len(batch))
        until = start + budget
        futures: list[Future[str]] = [
            self._pool.submit(self._request, url, body, until) for url, body in batch]
        # Attempts stop at ``until`` by themselves; the extra ``timeout`` only catches a server
        # that trickles bytes slowly enough to dodge httpx's per-read timeout.
        _, not_done = wait_futures(futures, timeout=budget + self.timeout)
        replies: list[str] = []
        failures: list[str] = []
        unreachable = 0
        for fut in futures:
            if fut in not_done:
                fut.cancel()
                replies.append(FailedReply("deadline exceeded"))
                failures.append("deadline exceeded")
                self._count(failures=1, timeouts=1, error="deadline exceeded")
                continue
            exc = fut.exception()
            if exc is None:
                replies.append(fut.result())
            else:
                replies.append(FailedReply(str(exc)))
                failures.append(str(exc))
                unreachable += isinstance(exc, _Unreachable)
        with self._stats_lock:
            self.stats.calls += 1
            self.stats.generate_seconds += time.monotonic() - start
        if unreachable == len(batch):
            raise PolicyUnreachable(f"cannot reach the policy endpoint {batch[0][0]} after "
                                    f"{self.max_retries + 1} attempt(s): {failures[0]}")
        if failures and self.on_error == "raise":
            raise PolicyRequestError(f"{len(failures)}/{len(batch)} requests failed; "
                                     f"first: {failures[0]}")
        return replies

    def generate_tokens(
        self, batch: list[list[Message]], prefixes: list[list[int] | None],
        contexts: list[TurnContext] | None = None, budgets: list[int | None] | None = None,
    ) -> list[TokenTurn]:
        """Replies with their token ids (see the module doc). On the token path each
        conversation continues from ``prefixes[i]``; on the chat path the server's ids are
        returned (``has_ids`` False where it sent none, or without ``return_token_ids``).
        ``budgets``: see `turnpool.policies.base.TokenPolicy`. A failed request keeps its
        `FailedReply` as the text, so the collector sees a ``policy_error`` and never scores
        it."""
        if self.token_path == "chat":
            return [_tokens_of(reply) or TokenTurn.text_only(reply)
                    for reply in self.generate(batch, contexts)]
        if len(prefixes) != len(batch):
            raise ValueError(f"{len(prefixes)} prefixes for {len(batch)} conversations")
        assert self._renderer is not None
        out: list[TokenTurn | None] = []
        jobs: list[tuple[int, list[int], bool, dict[str, Any]]] = []
        for k, (messages, prefix) in enumerate(zip(batch, prefixes)):
            new, extends = continue_chat(self.tokenizer, messages, prefix,
                                         history=self.history, renderer=self._renderer)
            limit = turn_limit(self.max_tokens, budgets[k] if budgets is not None else None,
                               new, extends)
            if limit < 1:
                out.append(TokenTurn("", new, [], [], extends, stop="token_budget"))
                continue
            out.append(None)
            prompt = (list(prefix) if extends and prefix else []) + new
            jobs.append((k, new, extends, self._completion_body(prompt, limit)))
        replies = self._run([(self.completions_url, body) for *_, body in jobs])
        for (k, new, extends, _), reply in zip(jobs, replies):
            turn = _tokens_of(reply)
            out[k] = TokenTurn.text_only(reply) if turn is None else TokenTurn(
                text=turn.text, prompt_ids=new, response_ids=turn.response_ids,
                logprobs=turn.logprobs, extends=extends, path="tokens")
        return [turn for turn in out if turn is not None]

    def close(self) -> None:
        """Stop the thread pool and the HTTP client (idempotent; in-flight requests abort)."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def __enter__(self) -> OpenAIPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _call_budget(self, n: int) -> float:
        """Seconds one ``generate`` call may take: ``deadline``, or enough for every retry."""
        if self.deadline is not None:
            return float(self.deadline)
        waves = math.ceil(n / self.concurrency)
        return waves * (self.max_retries + 1) * (self.timeout + self.backoff_max)

    def _payload(self, messages: list[Message]) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": messages, "max_tokens": self.max_tokens,
                                "temperature": self.temperature, "stream": False}
        for key, value in (("model", self.model), ("top_p", self.top_p), ("seed", self.seed),
                           ("stop", self.stop)):
            if value is not None:
                body[key] = value
        if self.return_token_ids:
            body.update(logprobs=True, return_token_ids=True)
        body.update(self.extra_body)
        return body

    def _completion_body(self, prompt: list[int], max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": int(max_tokens),
                                "temperature": self.temperature, "stream": False,
                                "logprobs": 0, "return_token_ids": True,
                                "skip_special_tokens": False}
        for key, value in (("model", self.model), ("top_p", self.top_p), ("seed", self.seed),
                           ("stop", self.stop)):
            if value is not None:
                body[key] = value
        body.update(self.sampling)
        body.update(self.extra_body)
        return body

    def _request(self, url: str, body: dict[str, Any], until: float) -> str:
        """One request: attempts with backoff until success, a permanent error or time."""
        attempt = 0
        while True:
            remaining = until - time.monotonic()
            if remaining <= 0 or self._closing.is_set():
                reason = "closed" if self._closing.is_set() else "deadline exceeded"
                self._count(failures=1, timeouts=int(reason != "closed"), error=reason)
                raise PolicyRequestError(reason)
            self._count(requests=1)
            try:
                return self._attempt(url, body, min(self.timeout, remaining))
            except _Failure as exc:
                if exc.timeout:
                    self._count(timeouts=1)
                if not exc.retryable or attempt >= self.max_retries:
                    self._count(failures=1, error=str(exc))
                    logger.debug("request to %s failed after %d attempt(s): %s",
                                 url, attempt + 1, exc)
                    if exc.unreachable:
                        raise _Unreachable(str(exc)) from None
                    raise PolicyRequestError(str(exc)) from None
            attempt += 1
            self._count(retries=1)
            pause = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
            if self._closing.wait(min(pause, max(0.0, until - time.monotonic()))):
                continue  # closed while backing off: the loop head reports it

    def _attempt(self, url: str, body: dict[str, Any], timeout: float) -> str:
        try:
            with self._client.stream("POST", url, json=body,
                                     timeout=httpx.Timeout(timeout)) as response:
                raw = bytearray()
                for chunk in response.iter_bytes():
                    raw += chunk
                    if len(raw) > self.max_body_bytes:
                        raise _Failure(f"response body over {self.max_body_bytes} bytes",
                                       retryable=False)
                status = response.status_code
        except httpx.ConnectTimeout as exc:
            raise _Failure(f"connect timeout after {timeout:.1f}s ({type(exc).__name__})",
                           retryable=True, timeout=True, unreachable=True) from None
        except httpx.TimeoutException as exc:
            raise _Failure(f"timeout after {timeout:.1f}s ({type(exc).__name__})",
                           retryable=True, timeout=True) from None
        except httpx.ConnectError as exc:  # refused, unknown host: nothing to talk to
            raise _Failure(f"{type(exc).__name__}: {exc}", retryable=True,
                           unreachable=True) from None
        except httpx.HTTPError as exc:
            raise _Failure(f"{type(exc).__name__}: {exc}", retryable=True) from None
        if status != 200:
            snippet = bytes(raw[:200]).decode("utf-8", "replace")
            raise _Failure(f"HTTP {status}: {snippet}", retryable=status in _RETRY_STATUS)
        if "prompt" in body:
            return self._completion_reply(raw, body)
        try:
            data = json.loads(raw)
            content = data["choices"][0]["message"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise _Failure(f"malformed response: {type(exc).__name__}", retryable=False) from None
        if not isinstance(content, str):
            return ""
        text = content[: self.max_response_chars]
        return _with_tokens(text, data) if self.return_token_ids else text

    def _completion_reply(self, raw: bytearray, body: dict[str, Any]) -> str:
        """A completions response on the token path: the sampled ids are the truth; the text
        is decoded from them here (the server's text is not needed)."""
        try:
            choice = json.loads(raw)["choices"][0]
            ids = [int(i) for i in choice["token_ids"]]
            lps = [float(x) for x in ((choice.get("logprobs") or {}).get("token_logprobs")
                                      or [])][: len(ids)]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise _Failure(f"no token ids in the completion ({type(exc).__name__}); the "
                           f"server must support return_token_ids (vLLM >= 0.10.2)",
                           retryable=False) from None
        if len(ids) > int(body["max_tokens"]):
            raise _Failure(f"the server sampled {len(ids)} tokens, over max_tokens",
                           retryable=False)
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        reply = _Reply(text[: self.max_response_chars])
        reply.tokens = TokenTurn(text=str(reply), prompt_ids=list(body["prompt"]),
                                 response_ids=ids,
                                 logprobs=[0.0 if math.isnan(x) else x for x in lps]
                                 + [0.0] * (len(ids) - len(lps)), extends=False)
        return reply

    def _count(self, requests: int = 0, failures: int = 0, retries: int = 0,
               timeouts: int = 0, error: str | None = None) -> None:
        with self._stats_lock:
            self.stats.requests += requests
            self.stats.failures += failures
            self.stats.retries += retries
            self.stats.timeouts += timeouts
            if error is not None:
                self.stats.errors.append(error[:200])
                del self.stats.errors[:-100]


def _load_tokenizer(path: str) -> Any:
    """The served model's tokenizer from a local directory (never a hub download)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _with_tokens(text: str, data: Any) -> str:
    """``text`` as a `_Reply` carrying the response's token ids, when it has usable ones."""
    try:
        choice = data["choices"][0]
        prompt = [int(i) for i in data["prompt_token_ids"]]
        ids = [int(i) for i in choice["token_ids"]]
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [float(c["logprob"]) for c in content][: len(ids)]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return text
    reply = _Reply(text)
    reply.tokens = TokenTurn(text=text, prompt_ids=prompt, response_ids=ids,
                             logprobs=logprobs + [0.0] * (len(ids) - len(logprobs)),
                             extends=False, path="chat")
    return reply
