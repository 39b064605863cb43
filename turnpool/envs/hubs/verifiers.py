"""verifiers (v1) tasksets as single-turn envs: ``"verifiers:<id>"``.

An episode is one task (row) of a verifiers `Taskset`: the observation is the task's prompt
(``info["system_prompt"]`` carries its system prompt, if any), the one action is the model's
reply, and the reward is what verifiers' own scoring gives: `Task.score` runs the task's
``@vf.reward`` functions (and plugged judges that need no runtime) on a verifiers `Trace`
whose final reply is the action, and the reward is the trace's weighted sum
(``trace.reward``). ``info["rewards"]`` holds each named score. The episode terminates.

The model side is turnpool's: verifiers normally runs a harness program that calls a model
through its interception server; here the caller's action *is* that reply, so no harness,
runtime or model is started and nothing leaves the process.

Ids: the bundled tasksets of `turnpool.envs.hubs.verifiers_tasks` (``add-easy``,
``reverse-hard``, ...), or any taskset class by entry point,
``"verifiers:my_pkg.tasks:MyTaskset"`` (built with its config class's defaults plus kwargs).

Seeds: the episode of seed ``s`` is row ``s % size`` of the bundled taskset seeded
``s // size`` (``size`` 64 by default), as reasoning-gym's adapter walks its datasets; a
taskset named by entry point has no seed of its own, so seed ``s`` is row ``s % size`` of
its first ``size`` rows.
"""

from __future__ import annotations

import asyncio
from typing import Any

from turnpool.envs.hubs.base import HubEnv
from turnpool.envs.registry import load_entry_point


def score(task: Any, reply: str) -> tuple[float, dict[str, float]]:
    """verifiers' reward of ``reply`` to ``task``: its `Task.score` on a fresh `Trace`."""
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    trace = Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key,
                                 hash=task.hash),
                  agent=AgentInfo(config=AgentConfig()), root_reply=reply)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(task.score(trace))
    finally:
        loop.close()
    named = {k: r.score for k, r in trace.rewards.items() if r is not None}
    return float(trace.reward), named


class VerifiersEnv(HubEnv):
    """One verifiers taskset (see the module doc)."""

    hub_prefix = "verifiers"

    def _build(self, env_id: str, kwargs: dict[str, Any]) -> Any:
        self.size = int(kwargs.pop("size", 64))
        self.config_kwargs = kwargs
        self._built_seed: int | None = None
        self._tasks: list[Any] = []
        self.task: Any = None
        return None  # tasksets are built per chunk of seeds, on reset

    def tasks(self, taskset_seed: int) -> list[Any]:
        """The rows of the taskset seeded ``taskset_seed`` (kept while seeds stay in it)."""
        if self._built_seed != taskset_seed:
            self._tasks = list(self._taskset(taskset_seed))
            self._built_seed = taskset_seed
            if not self._tasks:
                raise ValueError(f"verifiers taskset {self.env_id!r} has no rows")
        return self._tasks

    def _taskset(self, seed: int) -> Any:
        if ":" not in self.env_id:
            from turnpool.envs.hubs.verifiers_tasks import taskset

            return taskset(self.env_id, seed=seed, size=self.size)
        from verifiers.v1 import TasksetConfig
        from verifiers.v1.utils.generic import concrete_type

        cls = load_entry_point(self.env_id)
        config_cls = concrete_type(cls, TasksetConfig) or TasksetConfig
        return cls(config_cls(id=self.env_id, **self.config_kwargs)).take(self.size)

    def _library_reset(self, seed: int, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        rows = self.tasks(seed // self.size)
        self.task = rows[seed % len(rows)]
        info = {"task_name": self.task.data.name}
        if self.task.data.system_prompt:
            info["system_prompt"] = self.task.data.system_prompt
        return self.task.data.prompt_text, info

    def _library_step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        reward, named = score(self.task, action)
        return self.task.data.prompt_text, reward, True, False, {"rewards": named}

    def _library_close(self) -> None:
        """Nothing to release: tasks are plain Python."""

    @classmethod
    def check_id(cls, env_id: str) -> None:
        if ":" not in env_id:  # an entry point is checked when it is imported
            super().check_id(env_id)

    @classmethod
    def env_ids(cls) -> list[str]:
        from turnpool.envs.hubs.verifiers_tasks import ENV_IDS

        return list(ENV_IDS)
