"""SearchQA: answer a question, searching for documents first (RAGEN v2's ``search`` env).

RAGEN v2's rules (HotpotQA-style), written from them:

* data: rows with ``question`` and ``ground_truth`` (a string or a list of strings) from
  ``train_path`` / ``data_path`` (JSONL, JSON or Parquet; the first ``max_instances`` rows);
  without one, RAGEN's default ``data/search/train.parquet`` (relative to the working
  directory, as RAGEN reads it) when that file exists, else a small bundled set of generated
  questions (where RAGEN fails). ``reset(seed)`` asks row ``seed % len(data)``;
* ``search[query]``: the results text (``mock_mode``: RAGEN's two placeholder documents; else
  a POST of ``{"query", "top_k"}`` to ``retrieval_server_url + "/retrieve"``, formatted as
  RAGEN formats them), reward 0; the episode ends when the step count reaches ``max_steps``;
* ``finish[answer]``: reward ``correct_reward`` on an exact match after SQuAD normalisation,
  else ``correct_reward * F1`` when F1 >= ``f1_threshold``, else ``incorrect_reward``; the
  episode ends;
* other non-empty text: an answer is extracted from it (``\\boxed{}``, bold text, "the answer
  is ...", the first sentence) and scored the same way, ``action_is_valid`` False; empty text is
  invalid and only ends the episode at ``max_steps``.

Retrieval failures become texts, as in RAGEN (never exceptions): a connection error, a timeout,
an error status. Responses are read up to `MAX_RESPONSE_BYTES`.

Example:
    >>> env = SearchQAEnv(mock_mode=True)
    >>> obs, _ = env.reset(seed=0)
    >>> obs.splitlines()[-1]
    'Available actions: search[<query>], finish[<answer>]'
"""

from __future__ import annotations

import json
import re
import string
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

import turnpool.envs.datasets as datasets
from turnpool.envs.base import TextEnv

BUNDLED = "search_qa_sample.jsonl"
PATH_KEYS = ("data_path", "train_path")
#: RAGEN v2's ``SearchEnvConfig.train_path`` default, read relative to the working directory
RAGEN_TRAIN_PATH = "data/search/train.parquet"
ACTIONS_LINE = "Available actions: search[<query>], finish[<answer>]"
MAX_RESPONSE_BYTES = 8 << 20
_PUNCTUATION = frozenset(string.punctuation)


# ------------------------------------------------------------------------------- scoring
def normalize(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1(prediction: str, truth: str) -> tuple[float, float, float]:
    """Token ``(f1, precision, recall)``; yes / no / noanswer must match exactly."""
    pred, gold = normalize(prediction), normalize(truth)
    if pred != gold and (pred in ("yes", "no", "noanswer") or gold in ("yes", "no", "noanswer")):
        return 0.0, 0.0, 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def extract_answer(response: str) -> str:
    """An answer read out of free text (RAGEN's fallback order)."""
    text = re.sub(r"<think>.*?</think>", "", response.strip(), flags=re.DOTALL)
    text = re.sub(r"\s+", " ", text).strip()
    if not text:
        return ""
    boxed = re.search(r"\\boxed\{([^}]+)\}", text)
    if boxed:
        return boxed.group(1).strip()
    for pattern in (r"\*\*([^*]+)\*\*", r"\*([^*]+)\*"):
        found = [m.strip() for m in re.findall(pattern, text)
                 if len(m.strip()) > 2 and not re.match(r"^[^\w]*$", m.strip())]
        if found:
            return found[0]
    for pattern in (r"(?:the\s+)?(?:correct\s+)?answer\s+is\s*:?\s*([^.!?]+)",
                    r"(?:therefore|thus|so|hence)\s*,?\s*([^.!?]+)"):
        match = re.search(pattern, text, re.IGNORECASE)
        if match:
            answer = re.sub(r"^\W+|\W+$", "", match.group(1).strip())
            if len(answer) > 3:
                return answer
    sentences = [s.strip() for s in re.split(r"[.!?]+", text) if len(s.strip()) > 5]
    return sentences[0] if sentences else text[:100].strip()


def score(answer: str, truth: str | list[str], correct: float, incorrect: float,
          threshold: float) -> tuple[float, dict[str, Any]]:
    """``(reward, metadata)`` as RAGEN's reward function computes them."""
    truths = [truth] if isinstance(truth, str) else list(truth)
    best: tuple[float, float, float] = (0.0, 0.0, 0.0)  # f1, precision, recall
    match, method, exact = "", None, False
    for gold in (str(t).strip() for t in truths):
        if normalize(answer) == normalize(gold):
            exact, best, match, method = True, (1.0, 1.0, 1.0), gold, "exact_match"
            break
        scored = f1(answer, gold)
        if scored[0] > best[0]:
            best, match, method = scored, gold, "f1_score"
    right = exact or best[0] >= threshold
    reward = (correct if exact else correct * best[0]) if right else incorrect
    return reward, {"extracted_answer": answer, "ground_truths": truths, "best_match": match,
                    "f1_score": best[0], "precision": best[1], "recall": best[2],
                    "exact_match": exact, "evaluation_method": method,
                    "f1_threshold": threshold, "reward": reward}


# ----------------------------------------------------------------------------- retrieval
def mock_results(query: str) -> str:
    """RAGEN's placeholder documents for ``mock_mode``."""
    return (f"[Document 1] (ID: mock_1, Score: 0.900)\nMock search result for query: "
            f"'{query}'. This is a placeholder document for testing purposes.\n\n"
            f"[Document 2] (ID: mock_2, Score: 0.750)\nAnother mock document related to: "
            f"'{query}'. Replace with real retrieval server for actual training.")


def format_results(results: list[Any], max_results: int, max_total_chars: int) -> str:
    """Documents as RAGEN shows them: numbered, contents cut at 800 characters, the whole
    cut at ``max_total_chars``."""
    parts = []
    for i, result in enumerate(results[:max_results], 1):
        item = result if isinstance(result, dict) else {}
        content = str(item.get("content", ""))
        content = content[:800] + "..." if len(content) > 800 else content
        parts.append(f"[Document {i}] (ID: {item.get('id', f'doc_{i}')}, Score: "
                     f"{float(item.get('score', 0.0)):.3f})\n{content}")
    out = "\n\n".join(parts)
    return out[:max_total_chars] + "..." if len(out) > max_total_chars else out


def retrieve(url: str, query: str, top_k: int, timeout: float, max_total_chars: int) -> str:
    """The results text from a retrieval server, or RAGEN's text for what went wrong."""
    body = json.dumps({"query": query, "top_k": min(top_k, 50)}).encode()
    request = urllib.request.Request(f"{url}/retrieve", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            data = json.loads(response.read(MAX_RESPONSE_BYTES))
    except urllib.error.HTTPError as exc:
        text = f"Retrieval server error (status {exc.code})"
        try:
            error = json.loads(exc.read(MAX_RESPONSE_BYTES))
            text += f": {error.get('error', 'Unknown error')}" if isinstance(error, dict) else ""
        except ValueError:
            pass
        return text
    except TimeoutError:
        return f"Search request timed out after {timeout} seconds."
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            return f"Search request timed out after {timeout} seconds."
        return f"Could not connect to retrieval server at {url}. Is it running?"
    except (OSError, ValueError) as exc:
        return f"Search error: {exc}"
    results = data.get("results", []) if isinstance(data, dict) else []
    if not results:
        return "No relevant documents found for the query."
    return format_results(results, top_k, max_total_chars)


# ---------------------------------------------------------------------------------- data
def _build_table(rows: list[dict[str, Any]], options: dict[str, Any]
                 ) -> tuple[tuple[str, str | list[str]], ...]:
    limit = int(options.get("max_instances") or 0)
    table = tuple((str(r["question"]), r["ground_truth"] if isinstance(r["ground_truth"], str)
                   else [str(t) for t in r["ground_truth"]])
                  for r in rows if "question" in r and "ground_truth" in r)
    table = table[:limit] if limit else table
    if not table:
        raise ValueError("search data has no usable rows (columns: question, ground_truth)")
    return table


def data_key(config: dict[str, Any]) -> datasets.TableKey:
    """Which table an env with this config asks from."""
    path = datasets.resolve_path(config, PATH_KEYS, BUNDLED, RAGEN_TRAIN_PATH)
    return datasets.table_key("search_qa", path,
                              max_instances=int(config.get("max_instances", 20000) or 0))


def load_table(key: datasets.TableKey) -> tuple[tuple[str, str | list[str]], ...]:
    """The question table (shared, loaded once per process)."""
    rows: tuple[tuple[str, str | list[str]], ...] = datasets.get_table(key, _build_table)
    return rows


def oracle(obs: str, env_config: dict[str, Any]) -> list[str]:
    """``finish[<reference answer>]`` for a question of the configured data (no search
    needed), ``[]`` for any other page."""
    head, tail = "Question: ", f"\n{ACTIONS_LINE}"
    if not (obs.startswith(head) and obs.endswith(tail)):
        return []
    question = obs[len(head):-len(tail)]
    truth = next((t for q, t in load_table(data_key(env_config)) if q == question), None)
    answer = truth if isinstance(truth, str) else truth[0] if truth else None
    return [] if answer is None else [f"finish[{answer}]"]


# ----------------------------------------------------------------------------------- env
class SearchQAEnv(TextEnv):
    """Search, then answer; see the module docstring for the rules."""

    action_kind = "free_text"
    ragen_info_keys = ("action_is_effective", "action_is_valid", "success", "action_type",
                       "query", "answer", "raw_action", "extracted_answer", "reward_metadata")
    #: RAGEN's dataset_name only names the data set
    extra_kwargs = frozenset({"dataset_name"})

    def __init__(self, data_path: str | None = None, train_path: str | None = None,
                 max_instances: int = 20000, mock_mode: bool = False,
                 retrieval_server_url: str = "http://127.0.0.1:8000",
                 retrieval_timeout: float = 30.0, max_search_results: int = 5,
                 max_total_chars: int = 4000, max_steps: int = 10,
                 correct_reward: float = 1.0, incorrect_reward: float = 0.0,
                 f1_threshold: float = 0.3, render_mode: str = "text", **config: Any) -> None:
        super().__init__(data_path=data_path, train_path=train_path,
                         max_instances=max_instances, render_mode=render_mode, **config)
        self.mock_mode = bool(mock_mode)
        self.url = str(retrieval_server_url).rstrip("/")
        self.timeout = float(retrieval_timeout)
        self.max_search_results = int(max_search_results)
        self.max_total_chars = int(max_total_chars)
        self.max_steps = int(max_steps)
        self.correct_reward, self.incorrect_reward = correct_reward, incorrect_reward
        self.f1_threshold = float(f1_threshold)
        self._key = data_key(self.config)
        load_table(self._key)  # fail at construction, not at the first reset
        self.question, self.step_count, self.text = "", 0, ""
        self.truth: str | list[str] = ""

    @property
    def table(self) -> tuple[tuple[str, str | list[str]], ...]:
        return load_table(self._key)

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.question, self.truth = self.table[seed % len(self.table)]
        self.step_count = 0
        self.text = f"Question: {self.question}\n{ACTIONS_LINE}"
        return self.text

    def _search(self, query: str) -> str:
        if self.mock_mode:
            return mock_results(query)
        return retrieve(self.url, query, self.max_search_results, self.timeout,
                        self.max_total_chars)

    def _scored(self, answer: str) -> tuple[float, dict[str, Any]]:
        return score(answer, self.truth, self.correct_reward, self.incorrect_reward,
                     self.f1_threshold)

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.step_count += 1
        text = action.strip() if isinstance(action, str) else ""
        if text.startswith("search[") and text.endswith("]"):
            query = text[7:-1]
            done = self.step_count >= self.max_steps
            tail = ("Maximum search steps reached. Episode ended without an answer." if done
                    else ACTIONS_LINE)
            self.text = f"Search results for '{query}':\n{self._search(query)}\n\n{tail}"
            return self.text, 0.0, done, False, {
                "action_is_effective": True, "action_is_valid": True, "success": False,
                "action_type": "search", "query": query}
        if text.startswith("finish[") and text.endswith("]"):
            answer = text[7:-1]
            reward, meta = self._scored(answer)
            self.text = f"Your answer: {answer}. Reward: {reward:.2f}"
            return self.text, reward, True, False, {
                "action_is_effective": True, "action_is_valid": True,
                "success": meta["exact_match"] or reward > 0, "action_type": "finish",
                "answer": answer, "reward_metadata": meta}
        if not text:
            self.text = ("Invalid action. Use search[<query>] to search or finish[<answer>] "
                         f"to answer.\n{ACTIONS_LINE}")
            return self.text, 0.0, self.step_count >= self.max_steps, False, {
                "action_is_effective": False, "action_is_valid": False, "success": False,
                "action_type": "invalid"}
        extracted = extract_answer(text)
        reward, meta = self._scored(extracted)
        self.text = f"Your answer (extracted): {extracted}. Reward: {reward:.2f}"
        return self.text, reward, True, False, {
            "action_is_effective": True, "action_is_valid": False,
            "success": meta["exact_match"] or reward > 0, "action_type": "fallback",
            "raw_action": text, "extracted_answer": extracted, "reward_metadata": meta}

    def _render_text(self) -> str:
        return self.text


SearchQAEnv.oracle = staticmethod(oracle)
