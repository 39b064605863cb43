"""MetaMathQA: answer a math word problem; retries earn less (RAGEN's MetaMathQA env).

The observation is the question (``query``); the action is the answer text. An answer is
correct when it equals the reference after lowercasing and removing all whitespace; the
reference is what follows ``"The answer is:"`` in the row's ``response`` (MetaMathQA's
schema). A correct answer on attempt ``k`` (0-based) earns ``1 / 2**k``, shows ``"Correct!"``
and ends the episode; a wrong one shows ``"Incorrect. Please think again."`` and earns 0.
With ``max_attempts`` set, the episode is truncated after that many wrong answers; by default
(``None``) it never ends on a wrong answer, as RAGEN's env (both versions): the turn budget of
the manager or collector ends it. Answers longer than ``max_answer_chars``
are not examined and count as a wrong, invalid attempt.

Data: ``data_path`` (or RAGEN's ``dataset_path``) names a local JSON-list / JSONL / Parquet
file with ``query`` and ``response`` columns; rows without ``"The answer is:"`` are skipped.
Nothing is downloaded. Without a path, a bundled sample of generated arithmetic word problems
is used (``scripts/gen_metamathqa.py``). The file is read once per process and shared by all
env instances; ``reset(seed)`` picks a row with the env's generator.

Example:
    >>> env = MetaMathQAEnv()
    >>> question, _ = env.reset(seed=0)
    >>> env.step(answer_for(question))[:3]
    ('Correct!', 1.0, True)
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import turnpool.envs.datasets as datasets
from turnpool.envs.base import TextEnv

logger = logging.getLogger(__name__)

BUNDLED = "metamathqa_sample.jsonl"
PATH_KEYS = ("data_path", "dataset_path")
ANSWER_MARK = "The answer is:"
CORRECT = "Correct!"
INCORRECT = "Incorrect. Please think again."


def normalize(text: str) -> str:
    """Lowercase and drop all whitespace: the comparison form of answers."""
    return "".join(text.lower().split())


def extract_answer(response: str) -> str | None:
    """The text after the first ``"The answer is:"`` in a MetaMathQA response, stripped."""
    head, mark, tail = response.partition(ANSWER_MARK)
    return tail.strip() if mark and tail.strip() else None


@dataclass(frozen=True)
class QATable:
    """Questions and reference answers, with a question -> row index for the oracle."""

    questions: tuple[str, ...]
    answers: tuple[str, ...]
    index: dict[str, int] = field(repr=False)


def _build_table(rows: list[dict[str, Any]], options: dict[str, Any]) -> QATable:
    questions: list[str] = []
    answers: list[str] = []
    index: dict[str, int] = {}
    skipped = 0
    for row in rows:
        query, response = row.get("query"), row.get("response")
        answer = extract_answer(response) if isinstance(response, str) else None
        if not isinstance(query, str) or not query.strip() or answer is None:
            skipped += 1
            continue
        index.setdefault(query, len(questions))
        questions.append(query)
        answers.append(answer)
    if skipped:
        logger.warning("metamathqa data: skipped %d rows without query or answer", skipped)
    if not questions:
        raise ValueError("metamathqa data has no usable rows (columns: query, response)")
    return QATable(tuple(questions), tuple(answers), index)


def data_key(config: dict[str, Any]) -> datasets.TableKey:
    """Which table an env with this config uses."""
    return datasets.table_key("metamathqa", datasets.resolve_path(config, PATH_KEYS, BUNDLED))


def load_table(config: dict[str, Any] | None = None) -> QATable:
    """The question table for a config (shared, loaded once per process)."""
    table: QATable = datasets.get_table(data_key(config or {}), _build_table)
    return table


def answer_for(question: str, config: dict[str, Any] | None = None) -> str | None:
    """The reference answer to a question of the configured data set, or None."""
    table = load_table(config)
    row = table.index.get(question)
    return None if row is None else table.answers[row]


def oracle(obs: str, env_config: dict[str, Any]) -> list[str]:
    """The reference answer when ``obs`` is a question of the data set, else ``[]``."""
    answer = answer_for(obs, env_config) if isinstance(obs, str) else None
    return [] if answer is None else [answer]


class MetaMathQAEnv(TextEnv):
    """Question answering with decaying reward for retries; see the module docstring."""

    action_kind = "free_text"
    #: what RAGEN's env reports in ``info`` (the RAGEN facade shows only these)
    ragen_info_keys = ("action_is_valid", "success")
    instruction = "Solve the math problem and give only the final answer. "

    #: RAGEN's cache_dir and split (the split a ``dataset_path`` folder is read for)
    extra_kwargs = frozenset({"cache_dir", "split"})

    def __init__(
        self, data_path: str | Path | None = None, dataset_path: str | Path | None = None,
        max_attempts: int | None = None, max_answer_chars: int = 1000, **config: Any,
    ) -> None:
        # RAGEN's cache_dir and render_mode are accepted and unused (no downloads).
        super().__init__(data_path=data_path, dataset_path=dataset_path,
                         max_attempts=max_attempts, max_answer_chars=max_answer_chars, **config)
        if max_attempts is not None and int(max_attempts) < 1:
            raise ValueError("max_attempts must be at least 1 (or None for no limit)")
        self.max_attempts = None if max_attempts is None else int(max_attempts)
        self.max_answer_chars = int(max_answer_chars)
        self._data_key = data_key(self.config)
        load_table(self.config)  # fail at construction, not at the first reset
        self.row = 0
        self.attempt = 0
        self.done = False
        self._text = ""

    @property
    def table(self) -> QATable:
        """The shared question table (not part of ``get_state`` snapshots)."""
        table: QATable = datasets.get_table(self._data_key, _build_table)
        return table

    @property
    def question(self) -> str:
        return self.table.questions[self.row]

    @property
    def correct_answer(self) -> str:
        return self.table.answers[self.row]

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        # RAGEN: ``random.randint`` under ``random.seed(seed)``; here from a local generator
        self.row = random.Random(seed).randint(0, len(self.table.questions) - 1)
        self.attempt = 0
        self.done = False
        self._text = self.question
        return self._text

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done:
            return self._text, 0.0, True, False, {"action_is_valid": False}
        readable = isinstance(action, str) and len(action) <= self.max_answer_chars
        given = normalize(action) if readable else ""
        correct = given != "" and given == normalize(self.correct_answer)
        reward = 1.0 / 2**self.attempt if correct else 0.0
        self.attempt += 1
        out_of_attempts = self.max_attempts is not None and self.attempt >= self.max_attempts
        self.done = correct or out_of_attempts
        self._text = CORRECT if correct else INCORRECT
        return self._text, reward, correct, self.done and not correct, {
            "success": correct, "action_is_valid": given != "", "action_is_effective": correct}

    def _render_text(self) -> str:
        return self._text

    def anchor_obs(self) -> str:
        # The question identifies the state; the attempt count is a counter, left out.
        return self.question


MetaMathQAEnv.oracle = staticmethod(oracle)
#: the reference answer of a question text (RAGEN's facade attaches it as ``correct_answer``)
MetaMathQAEnv.answer_for_obs = staticmethod(answer_for)
