"""reasoning-gym's procedural datasets as single-turn envs: ``"rg:<dataset>"``.

An episode is one item of a dataset: the observation is its ``question``, the one action is
the answer text (the projection takes it from ``<answer>...</answer>``, reasoning-gym's own
answer format), the reward is the dataset's ``score_answer(answer, item)`` and the episode
terminates. ``info["score"]`` repeats the score; ``success`` is full marks (score 1.0).
Some scorers raise on text they cannot read (prime_factorization's on a word): such an answer
scores 0.0 and ends the episode too, with ``info["scoring_error"]`` saying why (LLM text never
makes an env fail).

Seeds: reasoning-gym seeds a dataset, not an item. The episode of seed ``s`` is item
``s % size`` of the dataset built with ``seed = s // size`` (``size`` its config's, 500 by
default), so consecutive seeds walk through one dataset, built once, as reasoning-gym's own
``ReseedingDataset`` walks through chunks. Every other kwarg is the dataset's config
(``rg:leg_counting`` with ``min_animals=3``, ...), checked by reasoning-gym.

Three generators iterate over sets of strings (`HASH_DEPENDENT`), so their questions depend
on Python's string hash: identical across processes (the process backends, Ray, a rerun) only
when ``PYTHONHASHSEED`` is set in the environment (workers inherit it); the adapter logs a
warning when one is built without it.

Some generators draw from the process-global ``random`` (pool_matrix), so the adapter runs
the library in its own global RNG scope (`turnpool.envs.hubs.base.GlobalRngScope`).

Example:
    >>> import turnpool
    >>> env = turnpool.make("rg:basic_arithmetic", size=10)
    >>> question, info = env.reset(seed=12)    # item 2 of the dataset seeded 1
    >>> obs, reward, terminated, truncated, info = env.step("not a number")
    >>> reward, terminated, info["success"]
    (0.0, True, False)
"""

from __future__ import annotations

import logging
import os
from typing import Any

from turnpool.envs.hubs.base import HubEnv

log = logging.getLogger(__name__)

#: Datasets whose items follow the iteration order of sets of strings (see the module doc).
HASH_DEPENDENT = frozenset({"isomorphic_strings", "polynomial_multiplication", "ransom_note"})


class ReasoningGymEnv(HubEnv):
    """One reasoning-gym dataset (see the module doc)."""

    hub_prefix = "rg"
    uses_global_rng = True

    def _build(self, env_id: str, kwargs: dict[str, Any]) -> Any:
        from reasoning_gym.factory import DATASETS

        if env_id in HASH_DEPENDENT and "PYTHONHASHSEED" not in os.environ:
            log.warning("rg:%s depends on Python's string hash: set PYTHONHASHSEED for the "
                        "same items in every process", env_id)
        config_cls = DATASETS[env_id][1]
        self.config_kwargs = {k: v for k, v in kwargs.items() if k not in ("seed", "size")}
        self.size = int(kwargs.get("size", config_cls().size))
        self._built_seed: int | None = None
        self.entry: dict[str, Any] = {}
        return None  # the dataset is built per chunk of seeds, on reset

    def dataset(self, dataset_seed: int) -> Any:
        """The dataset seeded ``dataset_seed`` (kept while consecutive seeds stay in it)."""
        if self.inner is None or self._built_seed != dataset_seed:
            from reasoning_gym import create_dataset

            self.inner = create_dataset(self.env_id, seed=dataset_seed, size=self.size,
                                        **self.config_kwargs)
            self._built_seed = dataset_seed
        return self.inner

    def _library_reset(self, seed: int, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        data = self.dataset(seed // self.size)
        self.entry = data[seed % self.size]
        return self.entry["question"], {}

    def _library_step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        try:
            score = float(self.inner.score_answer(action, self.entry))
        except Exception as exc:  # noqa: BLE001 - a scorer that chokes on the text scores 0
            first = (str(exc).splitlines() or [""])[0][:200]
            return self.entry["question"], 0.0, True, False, {
                "score": 0.0, "scoring_error": f"{type(exc).__name__}: {first}"}
        return self.entry["question"], score, True, False, {"score": score}

    def library_success(self, reward: float, terminated: bool,
                        info: dict[str, Any]) -> bool | None:
        return None if "scoring_error" not in info else False

    def _library_close(self) -> None:
        """Nothing to release: a dataset is plain Python."""

    @classmethod
    def env_ids(cls) -> list[str]:
        from reasoning_gym.factory import DATASETS

        return sorted(DATASETS)
