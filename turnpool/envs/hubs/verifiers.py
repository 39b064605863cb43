"""verifiers (v1) tasksets and envs: ``"verifiers:<id>"``.

An episode is one task (row) of a verifiers `Taskset`: the observation is the task's prompt
(``info["system_prompt"]`` carries its system prompt, if any), the one action is the model's
reply, and the reward is what verifiers' own scoring gives: `Task.score` runs the task's
``@vf.reward`` functions (and plugged judges that need no runtime) on a verifiers `Trace`
whose final reply is the action, and the reward is the trace's weighted sum
(``trace.reward``). ``info["rewards"]`` holds each named score. The episode terminates.

The model side is turnpool's: verifiers normally runs a harness program that calls a model
through its interception server; here the caller's action *is* that reply, so no harness,
runtime or model is started and nothing leaves the process.

Multi-turn (``guess-easy``, ``guess-hard``: `turnpool.envs.hubs.verifiers_guess`): a `vf.Env`
whose ``run(task, agents)`` talks to its seat through ``agents.player.interaction(task)``;
`Episode` runs that coroutine by hand, so each ``turn(message)`` of the env is an
observation and each action the seat's reply; when ``run`` returns, `Task.score` adds the
task's rewards to those the env recorded, and the trace's weighted sum is the last step's
reward (earlier steps: 0.0); ``info["trace_info"]`` is the env's ``trace.info``.

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
from collections.abc import AsyncIterator, Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from turnpool.envs.hubs.base import HubEnv
from turnpool.envs.registry import load_entry_point

#: Longest a scoring may take (verifiers' rewards are plain Python here; a hung one is a bug).
SCORE_TIMEOUT_S = 60.0


def run_coroutine(coro: Any) -> None:
    """Run ``coro`` to the end on an event loop of its own: in this thread, or in a helper
    thread when this one already runs a loop (an env stepped from async code, as in serving)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(asyncio.wait_for(coro, SCORE_TIMEOUT_S))
        finally:
            loop.close()
        return
    with ThreadPoolExecutor(1) as helper:
        helper.submit(asyncio.run, asyncio.wait_for(coro, SCORE_TIMEOUT_S)).result()


def new_trace(task: Any, reply: str | None = None) -> Any:
    """A fresh verifiers `Trace` of ``task`` (its final reply ``reply``, when given)."""
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    return Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key,
                                hash=task.hash),
                 agent=AgentInfo(config=AgentConfig()), root_reply=reply)


def score(task: Any, reply: str | None, trace: Any = None) -> tuple[float, dict[str, float]]:
    """verifiers' reward of ``reply`` to ``task``: its `Task.score` on a fresh `Trace` (or on
    ``trace``, where an `Env.run` already recorded its own rewards)."""
    trace = new_trace(task, reply) if trace is None else trace
    run_coroutine(task.score(trace))
    named = {k: r.score for k, r in trace.rewards.items() if r is not None}
    return float(trace.reward), named


class _Ask:
    """What a seat's turn awaits: handed up to the driver, which resumes it with the reply."""

    def __init__(self, message: Any) -> None:
        self.message = message

    def __await__(self) -> Generator[_Ask, str, str]:
        reply = yield self
        return reply


class _Interaction:
    """The model side of ``agents.<seat>.interaction(task)``: each `turn` is one action."""

    def __init__(self, trace: Any) -> None:
        self.trace = trace

    async def turn(self, message: Any = None) -> Any:
        from verifiers.v1.agent import Segment
        from verifiers.v1.types import AssistantMessage

        reply = await _Ask(message)
        self.trace.root_reply = reply
        return Segment(messages=[AssistantMessage(content=reply)])


class _Agents:
    """Every seat of a `vf.Env` played by the caller of `step`."""

    def __init__(self, trace: Any) -> None:
        self._trace = trace

    def __getattr__(self, name: str) -> Any:
        return self

    @asynccontextmanager
    async def interaction(self, task: Any) -> AsyncIterator[_Interaction]:
        yield _Interaction(self._trace)


class Episode:
    """One `vf.Env.run` driven by hand: the coroutine runs until a seat asks for a turn (the
    observation) and is resumed with each action; when it returns, `Task.score` adds the
    task's rewards to the ones the env recorded. Only envs whose ``run`` awaits nothing but
    its seats can be driven this way (anything else is a `RuntimeError`)."""

    def __init__(self, env: Any, task: Any) -> None:
        self.task, self.trace = task, new_trace(task)
        self.coro = env.run(task, _Agents(self.trace))

    def advance(self, reply: str | None) -> str | None:
        """The next message to the model, or None when the run returned."""
        try:
            asked = self.coro.send(reply)
        except StopIteration:
            return None
        if not isinstance(asked, _Ask):
            self.coro.close()
            raise RuntimeError("this verifiers Env awaits more than its seats' turns")
        return message_text(asked.message, self.task)

    def close(self) -> None:
        self.coro.close()


def message_text(message: Any, task: Any) -> str:
    """A turn's message as text (a bare first turn: the task's prompt)."""
    if message is None:
        return str(task.data.prompt_text)
    if isinstance(message, str):
        return message
    from verifiers.v1.types import content_text

    return "\n\n".join(content_text(getattr(m, "content", None) if not isinstance(m, dict)
                                      else m.get("content")) for m in message)


class VerifiersEnv(HubEnv):
    """One verifiers taskset (see the module doc)."""

    hub_prefix = "verifiers"

    def _build(self, env_id: str, kwargs: dict[str, Any]) -> Any:
        self.size = int(kwargs.pop("size", 64))
        self.config_kwargs = kwargs
        self._built_seed: int | None = None
        self._tasks: list[Any] = []
        self.task: Any = None
        self.episode: Episode | None = None
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
        if self.env_id in MULTI_TURN:
            from turnpool.envs.hubs.verifiers_guess import GuessConfig, GuessTaskset

            return GuessTaskset(GuessConfig(id=self.env_id, level=MULTI_TURN[self.env_id],
                                            size=self.size, seed=seed))
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
        self._library_close()
        if self.env_id not in MULTI_TURN:
            return self.task.data.prompt_text, info
        self.episode = Episode(guess_env(), self.task)
        return self.episode.advance(None) or self.task.data.prompt_text, info

    def _library_step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self.episode is None:
            reward, named = score(self.task, action)
            return self.task.data.prompt_text, reward, True, False, {"rewards": named}
        message = self.episode.advance(action)
        if message is not None:
            return message, 0.0, False, False, {}
        trace = self.episode.trace
        reward, named = score(self.task, None, trace)
        return action, reward, True, False, {"rewards": named, "trace_info": dict(trace.info)}

    def _library_close(self) -> None:
        episode, self.episode = self.episode, None
        if episode is not None:
            episode.close()

    @classmethod
    def check_id(cls, env_id: str) -> None:
        if ":" not in env_id:  # an entry point is checked when it is imported
            super().check_id(env_id)

    @classmethod
    def env_ids(cls) -> list[str]:
        from turnpool.envs.hubs.verifiers_tasks import ENV_IDS

        return [*ENV_IDS, *MULTI_TURN]


#: The bundled multi-turn ids (`turnpool.envs.hubs.verifiers_guess`) and their levels.
MULTI_TURN = {"guess-easy": "easy", "guess-hard": "hard"}


def guess_env() -> Any:
    """The bundled `GuessEnv`, made without `vf.Env.__init__`: that constructor resolves its
    taskset and harness through verifiers' plugin loader, which imports every built-in
    taskset (nemo_gym's needs mcp 2.0, which the rest of turnpool's dependencies rule out
    here); its ``run`` reads only the task and the agents."""
    from turnpool.envs.hubs.verifiers_guess import GuessEnv

    return object.__new__(GuessEnv)
