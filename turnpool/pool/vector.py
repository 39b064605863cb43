"""`PoolVectorEnv`: gymnasium's vector API over an `EnvPool`.

Code written against ``gymnasium.vector.VectorEnv`` (``reset(seed=...)``, ``step(actions)``,
batched spaces, autoreset, ``reset(options={"reset_mask": ...})``) runs on the pool: any
backend, one message per worker per step, deadlines and fault isolation. Results are step for
step those of gymnasium's own ``SyncVectorEnv`` over the same ids: env ``i`` of
``reset(seed=s)`` is seeded ``s + i``, a seedless reset of a finished env uses the seed
`turnpool.envs.base.next_episode_seed` derives from its last one (what the env's own
``reset()`` does), and the three autoreset modes behave as gymnasium defines them
(``NEXT_STEP``: a finished env resets on the following ``step``, reward 0; ``SAME_STEP``: it
resets at once and ``info["final_obs"]`` / ``info["final_info"]`` keep the end; ``DISABLED``:
the caller resets with ``reset_mask``).

Infos are gymnasium's batched dicts (values and ``_key`` masks) of the env infos, without
the keys the pool adds for its own bookkeeping.

Before its first reset, env ``i`` reports ``np_random_seed`` ``seed + i`` (``seed`` a
constructor argument, 0 by default: `EnvPool`'s own schedule) and a seedless first reset
plays exactly those seeds, so every episode is reproducible from its seed alone.

gymnasium's ``AsyncVectorEnv`` extras work as there: ``reset_async`` / ``reset_wait``,
``step_async`` / ``step_wait`` (``reset`` and ``step`` are the two halves in one call) on the
pool's own async calls, with ``AlreadyPendingCallError``, ``NoAsyncCallError`` and
``multiprocessing.TimeoutError`` (after which the call stays pending: wait again, or
``close()``); ``call``, ``get_attr`` and ``set_attr`` reach the envs in their workers
(`EnvPool.call`). Under ``DISABLED`` a finished env that is not reset is stepped on, as
``AsyncVectorEnv`` does.

Example:
    >>> import gymnasium, turnpool
    >>> envs = gymnasium.make_vec("turnpool/Bandit-v0", num_envs=2, backend="sequential")
    >>> obs, infos = envs.reset(seed=1)
    >>> len(obs), isinstance(envs, gymnasium.vector.VectorEnv)
    (2, True)
    >>> envs.close()
"""

from __future__ import annotations

import multiprocessing
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import AutoresetMode
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import batch_space, iterate

from turnpool.envs.base import next_episode_seed
from turnpool.envs.registry import make, target_name
from turnpool.worker.defaults import DEFAULT_STEP_TIMEOUT
from turnpool.worker.results import ResetResult, TurnResult

#: info keys the pool adds to an env's own info (not the env's: left out of vector infos)
POOL_INFO_KEYS = frozenset({"terminated", "truncated"})


@dataclass
class _Pending:
    """The vector env's call in progress: gymnasium's state, the envs still to answer and
    their answers (a ``SAME_STEP`` step has a turn and then a reset for a finished env)."""

    state: AsyncState
    ids: list[int]
    waiting: set[int] = field(default_factory=set)
    turns: dict[int, TurnResult] = field(default_factory=dict)
    resets: dict[int, ResetResult] = field(default_factory=dict)
    #: ``SAME_STEP``: the finished envs' resets were sent
    restarted: bool = False


class PoolVectorEnv(gymnasium.vector.VectorEnv[Any, Any, Any]):
    """``num_envs`` copies of a turnpool env in one `EnvPool` (module doc)."""

    def __init__(self, num_envs: int, turnpool_name: str, *, backend: str = "auto",
                 num_workers: int | None = None,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 render_mode: str | None = None, seed: int = 0,
                 step_timeout: float | None = DEFAULT_STEP_TIMEOUT, **env_kwargs: Any) -> None:
        from turnpool.pool.api import EnvPool

        self.num_envs = int(num_envs)
        #: env ``i``'s first seedless reset plays ``seed + i``
        self.seed = int(seed)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        if render_mode is not None:
            env_kwargs["render_mode"] = render_mode
        probe = make(turnpool_name, **env_kwargs)
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        self.render_mode = render_mode
        self._frame_from_obs = getattr(type(probe), "frame_from_obs", None)
        self._env_kwargs = dict(env_kwargs)
        probe.close()
        if render_mode not in (None, "text") and (render_mode != "rgb_array"
                                                  or self._frame_from_obs is None):
            # frames are drawn here from the texts, never shipped from the workers
            raise ValueError(f"{target_name(turnpool_name)} draws no {render_mode!r} frames "
                             "in a vector env: the vector env renders 'text', and "
                             "'rgb_array' for envs with a frame_from_obs hook")
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        # the env's metadata (render_modes, render_fps: render wrappers read them), as
        # gymnasium's SyncVectorEnv copies its first env's
        self.metadata = {**probe.metadata, "autoreset_mode": self.autoreset_mode}
        self.pool = EnvPool(turnpool_name, env_num=self.num_envs, group_n=1,
                            env_kwargs=env_kwargs, backend=backend, num_workers=num_workers,
                            step_timeout=step_timeout)
        self._call: _Pending | None = None
        self._obs: list[str] = [""] * self.num_envs
        self._seeds: list[int | None] = [None] * self.num_envs
        self._ended = np.zeros(self.num_envs, dtype=np.bool_)

    # ------------------------------------------------------------------ reset
    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(self, seed: int | Sequence[int | None] | None = None,
                    options: dict[str, Any] | None = None) -> None:
        """Send the resets (``reset``'s arguments); `reset_wait` collects them."""
        self._check_idle("reset_async")
        seeds = self._reset_seeds(seed)
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        ids = (list(range(self.num_envs)) if mask is None
               else [int(i) for i in np.flatnonzero(self._checked_mask(mask))])
        self._call = _Pending(AsyncState.WAITING_RESET, ids)
        self._send_resets(ids, [seeds[i] for i in ids])

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """The results of `reset_async` (``multiprocessing.TimeoutError`` after ``timeout``
        seconds; the resets stay pending)."""
        call = self._wait_for(AsyncState.WAITING_RESET, timeout)
        infos: dict[str, Any] = {}
        for i in call.ids:
            result = call.resets[i]
            self._obs[i] = result.obs
            self._ended[i] = False
            infos = self._add_info(infos, _env_info(result.info), i)
        self._call = None
        return tuple(self._obs), infos

    def _checked_mask(self, mask: Any) -> np.ndarray:
        """``options["reset_mask"]`` as gymnasium's vector envs take it, or the error they
        raise (a bool array of shape ``(num_envs,)`` with at least one True)."""
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
        if mask.shape != (self.num_envs,):
            raise ValueError(f"`options['reset_mask']` must have shape `({self.num_envs},)`, "
                             f"got {mask.shape}")
        if mask.dtype != np.bool_:
            raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, "
                            f"got {mask.dtype}")
        if not mask.any():
            raise ValueError("`options['reset_mask']` must contain a boolean array with at "
                             f"least one True value, got reset_mask={mask}")
        return mask

    def _check_open(self) -> None:
        if self.closed:
            raise gymnasium.error.ClosedEnvironmentError(
                "this vector env is closed: make a new one")

    def _check_idle(self, what: str) -> None:
        self._check_open()
        if self._call is not None:
            state = self._call.state.value
            raise AlreadyPendingCallError(f"Calling `{what}` while waiting for a pending call "
                                          f"to `{state}` to complete", str(state))

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The seed each env's current episode started from, as gymnasium's
        ``SyncVectorEnv`` reports its envs' seeds; before an env's first reset, the seed
        its first seedless reset plays (``seed + i``)."""
        return tuple(self.seed + i if s is None else s for i, s in enumerate(self._seeds))

    def _reset_seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, int | np.integer):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"a list of seeds must have num_envs={self.num_envs} entries, "
                             f"got {len(seeds)}")
        return [None if s is None else int(s) for s in seeds]

    def _send_resets(self, ids: list[int], seeds: list[int | None]) -> None:
        """Reset ``ids`` with exactly these seeds (None: the one after the env's last seed,
        or ``seed + i`` before its first), in one pool call (a group is one env here)."""
        exact = {i: self._seed_for(i, s) for i, s in zip(ids, seeds)}
        if not ids:
            return
        try:
            self.pool.reset_async(seed=exact, env_ids=ids)
        except Exception:  # refused before anything was sent (a negative seed)
            self._call = None
            raise
        for i, s in exact.items():
            self._seeds[i] = s
        assert self._call is not None
        self._call.waiting.update(ids)

    def _seed_for(self, i: int, seed: int | None) -> int:
        if seed is not None:
            return seed
        last = self._seeds[i]
        return self.seed + i if last is None else next_episode_seed(last)

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send one action per env (``NEXT_STEP``: a finished env's reset instead);
        `step_wait` collects the results."""
        self._check_idle("step_async")
        acts = self._actions(actions)
        restart = ([i for i in range(self.num_envs) if self._ended[i]]
                   if self.autoreset_mode == AutoresetMode.NEXT_STEP else [])
        skip = set(restart)
        run = [i for i in range(self.num_envs) if i not in skip]
        self._call = call = _Pending(AsyncState.WAITING_STEP, run)
        self._send_resets(restart, [None] * len(restart))
        if run:
            self.pool.step_async(env_ids=run, action_lists=[[_plain(acts[i])] for i in run])
            call.waiting.update(run)

    def step_wait(self, timeout: float | None = None
                  ) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """The results of `step_async` (``multiprocessing.TimeoutError`` after ``timeout``
        seconds; the step stays pending). ``SAME_STEP`` resets the envs that just finished
        before it answers, within the same ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        call = self._wait_for(AsyncState.WAITING_STEP, timeout, end)
        if self.autoreset_mode == AutoresetMode.SAME_STEP and not call.restarted:
            call.restarted = True
            done = [i for i in call.ids if call.turns[i].done]
            self._send_resets(done, [None] * len(done))
            self._wait_for(AsyncState.WAITING_STEP, timeout, end)
        return self._step_results(call)

    def _step_results(self, call: _Pending) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terms = np.zeros(self.num_envs, dtype=np.bool_)
        truncs = np.zeros(self.num_envs, dtype=np.bool_)
        out: dict[str, Any] = {}
        for i in range(self.num_envs):
            turn, reset = call.turns.get(i), call.resets.get(i)
            info: dict[str, Any] = {}
            if turn is not None:
                self._obs[i], rewards[i] = turn.obs, turn.reward_sum
                terms[i], truncs[i] = turn.terminated, turn.truncated
                info = _env_info(turn.info)
            if reset is not None:  # NEXT_STEP's restart, or SAME_STEP's end kept in final_*
                if turn is not None:
                    out = self._add_info(out, {"final_obs": turn.obs, "final_info": info}, i)
                self._obs[i], info = reset.obs, _env_info(reset.info)
            out = self._add_info(out, info, i)
        self._ended = terms | truncs
        self._call = None
        return tuple(self._obs), rewards, terms, truncs, out

    def _wait_for(self, state: AsyncState, timeout: float | None,
                  end: float | None = None) -> _Pending:
        """The pending call in ``state`` once every env it waits for has answered (gymnasium's
        errors when there is none, or when ``timeout`` passes first)."""
        self._check_open()
        call = self._call
        if call is None or call.state != state:
            verb = state.value
            raise NoAsyncCallError(f"Calling `{verb}_wait` without any prior call to "
                                   f"`{verb}_async`.", verb)
        if end is None and timeout is not None:
            end = time.monotonic() + timeout
        while call.waiting:
            left = None if end is None else max(0.0, end - time.monotonic())
            got = self.pool.poll(timeout=left, min_ready=len(call.waiting))
            for i, result in got:
                call.waiting.discard(i)
                if isinstance(result, TurnResult):
                    call.turns[i] = result
                else:
                    call.resets[i] = result
            if call.waiting and end is not None and time.monotonic() >= end:
                raise multiprocessing.TimeoutError(f"The call to `{state.value}_wait` has "
                                                   f"timed out after {timeout} second(s).")
            if call.waiting and not got and not self.pool.in_flight:
                raise RuntimeError(f"envs {sorted(call.waiting)[:5]} were sent but nothing "
                                   "is in flight")  # a pool bug, never a wait without end
        return call

    def _actions(self, actions: Any) -> list[Any]:
        """One action per env, or the errors gymnasium's vector envs raise: a bare action is
        a `TypeError`, a batch of another length a `ValueError`."""
        if isinstance(actions, str | int | float | np.generic) or (
                isinstance(actions, np.ndarray) and actions.ndim == 0):
            raise TypeError(f"step takes one action per env (num_envs={self.num_envs}), "
                            f"got a bare {type(actions).__name__}")
        acts = list(iterate(self.action_space, actions))
        if len(acts) != self.num_envs:
            raise ValueError(f"step takes num_envs={self.num_envs} actions, got {len(acts)}")
        return acts

    # ------------------------------------------------------------------ calls into envs
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Each env's method ``name`` called with ``args`` / ``kwargs`` in its worker (an
        attribute: its value), as gymnasium's ``AsyncVectorEnv.call``; values must pickle."""
        self._check_idle("call")
        return tuple(self.pool.call(name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each env's attribute ``name`` (`call` of it, as in gymnasium)."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | object) -> None:
        """Set each env's attribute ``name``: ``values`` one per env, or one for all."""
        self._check_open()
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError("Values must be a list or tuple with length equal to the number "
                             f"of environments. Got `{len(values)}` values for "
                             f"{self.num_envs} environments.")
        self._check_idle("set_attr")
        self.pool.set_attr(name, values)

    def render(self) -> tuple[Any, ...] | None:
        """Each env drawn in ``render_mode``, from its observation text (a turnpool env's
        observation is its text rendering): ``"text"`` (or None, as a turnpool env's own
        ``render()``) the texts, ``"rgb_array"`` the frames of the env class's
        ``frame_from_obs`` (Sokoban, FrozenLake), so no pixels cross processes."""
        self._check_open()
        draw = self._frame_from_obs
        if self.render_mode in (None, "text") or draw is None:  # the constructor checked
            return tuple(self._obs)
        return tuple(draw(text, self._env_kwargs) for text in self._obs)

    def close_extras(self, **kwargs: Any) -> None:
        if self._call is not None:  # the pool's close drops what is in flight
            warnings.warn("Calling `close` while waiting for a pending call to "
                          f"`{self._call.state.value}` to complete.", UserWarning, stacklevel=3)
            self._call = None
        self.pool.close()


def _env_info(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k not in POOL_INFO_KEYS}


def _plain(action: Any) -> Any:
    """A batched action's element as the env takes it (numpy ints as Python ints)."""
    return action.item() if isinstance(action, np.generic) else action
