"""What every hub adapter shares: `HubEnv` (a library's env as a `TextEnv`), the scoped
global RNG, the offline listing behind ``turnpool envs --hub``.

A library env keeps its own rules: its observations, rewards, ``terminated`` / ``truncated``
and info keys reach the caller unchanged (info values made plain: numpy -> Python, anything
else unpicklable -> its ``repr``). What a library lacks is added in one way, the same for every
hub:

* **seed**: turnpool's reset seed (an int, derived from the env's generator when the caller
  gives none) is handed to the library; a library without seeds gets a choice made with
  ``self.np_random`` (the adapter's docstring says which: a dataset row, a task);
* **success**: the library's own flag where it reports one (`HubEnv.library_success`), else
  "the episode terminated with reward >= ``success_reward``" (1.0: full marks);
* **actions**: free text (the library parses it, in its own answer format); an action that is
  not a string, or longer than ``max_action_chars``, is ``action_is_valid=False`` and no
  library step is taken (LLM text is bounded before it reaches library code);
* a step after the episode ended is ``action_is_valid=False`` without a library call;
* **global RNG**: libraries that draw from or reseed Python's ``random`` / ``numpy.random``
  (GEM seeds both on reset) run inside `GlobalRngScope`: the env keeps its own copy of those
  states, swapped in around each library call and out again after, so nothing leaks to the
  caller or to other envs of the process, and the same seed gives the same episode on every
  backend. Such classes set ``uses_global_rng``, so the thread backend refuses to run two of
  them side by side (a thread switch inside a library call would interleave their draws).

Group members are reset with the group's seed, never copied (``get_state`` is not offered),
and branches replay (``snapshot_by_state = False``): library objects are not ours to copy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from turnpool.envs.base import TextEnv
from turnpool.envs.gym_adapter import obs_to_text
from turnpool.envs.hub_table import GlobalRngScope, Hub, hub
from turnpool.envs.registry import load_entry_point

#: Longest action text handed to a library (longer LLM text: invalid, no step).
MAX_ACTION_CHARS = 32_768


def plain(value: Any) -> Any:
    """An info value as plain, picklable Python: numpy -> Python, containers element by element,
    any other object -> its ``repr``."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return repr(value)


class HubEnv(TextEnv):
    """A library's env as a `TextEnv` (see the module doc); one subclass per library.

    Subclasses set `hub_prefix` and implement `_build` (the library env for an id and its
    kwargs), `_library_reset`, `_library_step`, and the class method `env_ids` (what the
    library offers); `_library_close` and `library_success` when the library has them.
    """

    #: this adapter's entry in `turnpool.envs.hub_table.HUBS`
    hub_prefix: ClassVar[str] = ""
    action_kind = "free_text"
    extra_kwargs = None  # every kwarg goes to the library
    snapshot_by_state = False
    #: the library's env (None before it is built and after close)
    inner: Any = None
    #: the reward at termination that counts as success when the library reports none
    success_reward: ClassVar[float] = 1.0

    def __init__(self, env_id: str, max_action_chars: int = MAX_ACTION_CHARS,
                 **kwargs: Any) -> None:
        super().__init__(env_id=env_id, max_action_chars=max_action_chars, **kwargs)
        self.hub: Hub = hub(self.hub_prefix)
        self.env_id = env_id
        self.max_action_chars = int(max_action_chars)
        self._rng_scope = GlobalRngScope() if self.uses_global_rng else None
        self._text = ""
        self._done = False
        self._reset_info: dict[str, Any] = {}
        library_kwargs = {k: v for k, v in kwargs.items() if k != "render_mode"}
        self.inner = None
        with self.library_call():  # importing a library may draw from the global RNG too
            self.library = self.hub.require()
            self.inner = self._build(env_id, library_kwargs)

    # ------------------------------------------------------------------ subclass hooks
    def _build(self, env_id: str, kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _library_reset(self, seed: int, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        raise NotImplementedError

    def _library_step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        raise NotImplementedError

    def _library_close(self) -> None:
        try:
            close = self.inner.close
        except AttributeError:  # a library env without close: nothing to release
            return
        close()

    def library_success(self, reward: float, terminated: bool,
                        info: dict[str, Any]) -> bool | None:
        """The library's own success flag for this step, or None when it reports none."""
        flag = info.get("success")
        return flag if isinstance(flag, bool) else None

    @classmethod
    def env_ids(cls) -> list[str]:
        """Every id the library offers (whether or not it runs here)."""
        raise NotImplementedError

    @classmethod
    def check_id(cls, env_id: str) -> None:
        """`KeyError` (one line, naming the listing command) for an id the library lacks."""
        if env_id not in cls.env_ids():
            h = hub(cls.hub_prefix)
            raise KeyError(f"{h.title} has no env {env_id!r}; "
                           f"`turnpool envs --hub {h.prefix}` lists them")

    # ------------------------------------------------------------------ the TextEnv side
    @contextmanager
    def library_call(self) -> Iterator[None]:
        """Around every call into the library: the env's own global RNG states when the
        library uses them (`GlobalRngScope`), nothing otherwise."""
        with self._rng_scope if self._rng_scope is not None else nullcontext():
            yield

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        return obs, {**self._reset_info, **info}

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        if self._rng_scope is not None:
            self._rng_scope.seed(seed)
        with self.library_call():
            obs, info = self._library_reset(seed, options)
        self._text, self._done = obs_to_text(obs), False
        self._reset_info = plain(dict(info or {}))
        return self._text

    def parse_action(self, action: Any) -> Any:
        if isinstance(action, str) and len(action) <= self.max_action_chars:
            return action
        return None

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action is None or self._done:
            return self._text, 0.0, self._done, False, {"action_is_valid": False}
        with self.library_call():
            obs, reward, terminated, truncated, inner = self._library_step(action)
        before, self._text = self._text, obs_to_text(obs)
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        self._done = terminated or truncated
        info = plain(dict(inner or {}))
        flag = self.library_success(reward, terminated, info)
        info.update(action_is_valid=True, action_is_effective=self._text != before,
                    success=flag if flag is not None
                    else terminated and reward >= self.success_reward)
        return self._text, reward, terminated, truncated, info

    def _render_text(self) -> str:
        return self._text

    def get_state(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__}: library envs are reset, not copied")

    def close(self) -> None:
        inner, self.inner = self.inner, None
        if inner is not None:
            self.inner = inner
            try:
                with self.library_call():
                    self._library_close()
            finally:
                self.inner = None


# ------------------------------------------------------------------------ the listing
@dataclass(frozen=True)
class HubRow:
    """One id a library offers: its turnpool name and whether it runs offline here."""

    name: str
    #: None: not checked
    runs: bool | None
    #: why not (one line), or ``""``
    reason: str = ""


def adapter(h: Hub) -> type[HubEnv]:
    """The adapter class of a hub (its module imported now; the library when it builds)."""
    cls = load_entry_point(h.entry_point)
    assert isinstance(cls, type) and issubclass(cls, HubEnv)
    return cls


def probe(name: str) -> str:
    """``""`` when the env builds, resets with seed 0 and closes here; else why not."""
    from turnpool.envs.registry import make

    try:
        env = make(name)
        try:
            env.reset(seed=0)
        finally:
            env.close()
    except Exception as exc:  # noqa: BLE001 - any library failure is this id's answer
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"{type(exc).__name__}: {first}"
    return ""


#: The environment a probe runs under: no library may reach a model or dataset hub.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def listing(prefix: str, *, check: bool = True, timeout: float = 900.0) -> list[HubRow]:
    """Every id of one library as a `HubRow`; with ``check``, each is built and reset in a
    child process kept offline (`OFFLINE_ENV`), so that probing downloads nothing and cannot
    leave state in the caller. `turnpool.extras.MissingExtra` when the library is missing."""
    h = hub(prefix)
    h.require()
    ids = adapter(h).env_ids()
    if not check:
        return [HubRow(f"{h.prefix}:{i}", None) for i in ids]
    child = f"from turnpool.envs.hubs.base import probe_all; probe_all({h.prefix!r})"
    proc = subprocess.run([sys.executable, "-c", child],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **OFFLINE_ENV}, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"probing {h.title} envs failed: {tail}")
    return [HubRow(**json.loads(line[len(_ROW):])) for line in proc.stdout.splitlines()
            if line.startswith(_ROW)]


#: Marks the child's result lines among whatever a library prints.
_ROW = "turnpool-hub-row "


def probe_all(prefix: str) -> None:
    """The child side of `listing`: one JSON row per id on stdout."""
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    h = hub(prefix)
    for env_id in adapter(h).env_ids():
        name = f"{h.prefix}:{env_id}"
        reason = probe(name)
        print(_ROW + json.dumps(asdict(HubRow(name, not reason, reason))), flush=True)

