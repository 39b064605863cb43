"""SkyRL-gym's envs by their SkyRL ids: ``"skyrl:gsm8k"``, ``"skyrl:gsm8k_multi_turn"``,
``"skyrl:aime"``, ...

A SkyRL-gym env is built per task: ``skyrl_gym.make(id, env_config=..., extras=row)`` where
``row`` is one row of a SkyRL dataset (``prompt``: chat messages; ``reward_spec`` or
``reward_model`` with the ``ground_truth``; ``extra_info``), then ``init(row["prompt"])``
gives the first observation and each ``step(text)`` returns ``observations`` (chat
messages), ``reward``, ``done`` and ``metadata``.

What turnpool adds, as for every library (`turnpool.envs.hubs.base`):

* **tasks and seeds**: ``tasks=[row, ...]`` are the dataset rows; the episode of seed ``s``
  is row ``s % len(tasks)``, its env built afresh at reset. Without ``tasks``, the math envs
  (gsm8k, gsm8k_multi_turn, aime) get one generated arithmetic question per seed (two
  three-digit numbers to add, from the env's own generator), in the row format and the
  answer format (``#### N`` for gsm8k, ``Answer: N`` for aime) those envs score;
* **observations as text**: the messages' contents, joined by blank lines (a step with no
  messages is ``""``); ``info["messages"]`` keeps them as SkyRL gives them;
* ``done`` is ``terminated`` (SkyRL has no truncation flag); ``metadata`` is the step's info;
  ``success`` is reward >= 1.0 at the end.

Ids that need a service or data (text2sql: a database; search, searchcode: a search server;
lcb: test cases) run given ``tasks`` (and the service) only.

Example:
    >>> import turnpool
    >>> env = turnpool.make("skyrl:gsm8k")
    >>> question, _ = env.reset(seed=4)
    >>> env.step("#### 0")[1:3]
    (0.0, True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from turnpool.envs.hubs.base import HubEnv

#: The ids whose generated default question turnpool provides, and how each row names the
#: ground truth and the answer format it scores.
GENERATED: dict[str, tuple[str, str]] = {
    "gsm8k": ("reward_spec", "Write the final answer as '#### N'."),
    "gsm8k_multi_turn": ("reward_spec", "Write the final answer as '#### N'."),
    "aime": ("reward_model", "End with 'Answer: N'."),
}


def generated_row(env_id: str, seed: int) -> dict[str, Any]:
    """The default task of ``env_id`` for ``seed``: an addition of two three-digit numbers."""
    a, b = (int(x) for x in np.random.default_rng(seed).integers(100, 1000, size=2))
    key, how = GENERATED[env_id]
    question = f"What is {a} + {b}? {how}"
    return {"prompt": [{"role": "user", "content": question}],
            key: {"ground_truth": str(a + b)}, "extra_info": {}}


def _text(messages: Any) -> str:
    if isinstance(messages, str):
        return messages
    return "\n\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m)
                       for m in messages or [])


class SkyRLEnv(HubEnv):
    """One SkyRL-gym env id over a list of tasks (see the module doc)."""

    hub_prefix = "skyrl"
    uses_global_rng = True  # SkyRL's envs are user code too: keep their draws to themselves

    def _build(self, env_id: str, kwargs: dict[str, Any]) -> Any:
        self.tasks: list[dict[str, Any]] = list(kwargs.pop("tasks", None) or [])
        self.env_config: Any = kwargs.pop("env_config", None)
        if kwargs:
            raise TypeError(f"skyrl:{env_id} takes tasks= and env_config=, "
                            f"not {', '.join(sorted(kwargs))}")
        if not self.tasks and env_id not in GENERATED:
            raise ValueError(f"skyrl:{env_id} needs tasks=[...] (rows of a SkyRL dataset); "
                             f"turnpool generates tasks for {', '.join(GENERATED)} only")
        return None  # built per task, at reset

    def row(self, seed: int) -> dict[str, Any]:
        """The task of the episode of ``seed``."""
        if self.tasks:
            return self.tasks[seed % len(self.tasks)]
        return generated_row(self.env_id, seed)

    def _library_reset(self, seed: int, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        import skyrl_gym

        self._library_close()
        row = self.row(seed)
        self.inner = skyrl_gym.make(self.env_id, env_config=self.env_config, extras=row)
        messages, meta = self.inner.init(row["prompt"])
        return _text(messages), {**dict(meta or {}), "messages": messages}

    def _library_step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        out = self.inner.step(action)
        info = {**dict(out.get("metadata") or {}), "messages": out.get("observations") or []}
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = out["postprocessed_action"]
        return _text(out.get("observations")), float(out["reward"]), bool(out["done"]), \
            False, info

    def _library_close(self) -> None:
        if self.inner is not None:
            self.inner.close()

    @classmethod
    def env_ids(cls) -> list[str]:
        from skyrl_gym.envs.registration import registry

        return sorted(registry)
