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

Example:
    >>> import gymnasium, turnpool
    >>> envs = gymnasium.make_vec("turnpool/Bandit-v0", num_envs=2, backend="sequential")
    >>> obs, infos = envs.reset(seed=1)
    >>> len(obs), isinstance(envs, gymnasium.vector.VectorEnv)
    (2, True)
    >>> envs.close()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, iterate

from turnpool.envs.base import next_episode_seed
from turnpool.envs.registry import make, target_name

#: info keys the pool adds to an env's own info (not the env's: left out of vector infos)
POOL_INFO_KEYS = frozenset({"terminated", "truncated"})


class PoolVectorEnv(gymnasium.vector.VectorEnv[Any, Any, Any]):
    """``num_envs`` copies of a turnpool env in one `EnvPool` (module doc)."""

    def __init__(self, num_envs: int, turnpool_name: str, *, backend: str = "auto",
                 num_workers: int | None = None,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 render_mode: str | None = None, **env_kwargs: Any) -> None:
        from turnpool.pool.api import EnvPool

        self.num_envs = int(num_envs)
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
                            env_kwargs=env_kwargs, backend=backend, num_workers=num_workers)
        self._obs: list[str] = [""] * self.num_envs
        self._seeds: list[int | None] = [None] * self.num_envs
        self._ended = np.zeros(self.num_envs, dtype=np.bool_)

    # ------------------------------------------------------------------ reset
    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self._check_open()
        seeds = self._reset_seeds(seed)
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        ids = (list(range(self.num_envs)) if mask is None
               else [int(i) for i in np.flatnonzero(self._checked_mask(mask))])
        infos: dict[str, Any] = {}
        for i, (obs, info) in zip(ids, self._reset_envs(ids, [seeds[i] for i in ids])):
            self._obs[i] = obs
            self._ended[i] = False
            infos = self._add_info(infos, _env_info(info), i)
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

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The seed each env's current episode started from, as gymnasium's
        ``SyncVectorEnv`` reports its envs' seeds (-1, gymnasium's "unknown", before the
        env's first reset)."""
        return tuple(-1 if s is None else s for s in self._seeds)

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

    def _reset_envs(self, ids: list[int], seeds: list[int | None]
                    ) -> list[tuple[str, dict[str, Any]]]:
        """Reset ``ids`` with exactly these seeds (None: the one after the env's last
        seed, or a fresh one); envs whose seed is ``base + i`` for one base go in one call."""
        exact = [self._seed_for(i, s) for i, s in zip(ids, seeds)]
        by_base: dict[int, list[int]] = {}
        for i, s in zip(ids, exact):
            by_base.setdefault(s - i, []).append(i)  # group i's seed is base + i
        got: dict[int, tuple[str, dict[str, Any]]] = {}
        for base, members in by_base.items():
            obs, infos = self.pool.reset(seed=base, env_ids=members)
            got.update({i: (o, inf) for i, o, inf in zip(members, obs, infos)})
        for i, s in zip(ids, exact):
            self._seeds[i] = s
        return [got[i] for i in ids]

    def _seed_for(self, i: int, seed: int | None) -> int:
        if seed is not None:
            return seed
        last = self._seeds[i]
        if last is None:
            return int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 1)
        return next_episode_seed(last)

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        self._check_open()
        acts = self._actions(actions)
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terms = np.zeros(self.num_envs, dtype=np.bool_)
        truncs = np.zeros(self.num_envs, dtype=np.bool_)
        mode = self.autoreset_mode
        restart = [i for i in range(self.num_envs)
                   if self._ended[i] and mode == AutoresetMode.NEXT_STEP]
        if mode == AutoresetMode.DISABLED and self._ended.any():
            raise RuntimeError("autoreset_mode=DISABLED: reset the finished envs with "
                               "reset(options={'reset_mask': ...}) before stepping them")
        run = [i for i in range(self.num_envs) if i not in restart]
        per_env: dict[int, dict[str, Any]] = {}
        for i, (text, info) in zip(restart, self._reset_envs(restart, [None] * len(restart))):
            self._obs[i], per_env[i] = text, _env_info(info)
        finals: dict[int, dict[str, Any]] = {}
        if run:
            obs, rew, _, infos = self.pool.step([_plain(acts[i]) for i in run], run)
            for k, i in enumerate(run):
                info = infos[k]
                self._obs[i], rewards[i] = obs[k], float(rew[k])
                terms[i], truncs[i] = bool(info.get("terminated")), bool(info.get("truncated"))
                per_env[i] = _env_info(info)
            if mode == AutoresetMode.SAME_STEP:
                finals = self._restart_finished(run, terms | truncs, per_env)
        out: dict[str, Any] = {}
        for i in range(self.num_envs):
            if i in finals:
                out = self._add_info(out, finals[i], i)
            out = self._add_info(out, per_env[i], i)
        self._ended = terms | truncs
        return tuple(self._obs), rewards, terms, truncs, out

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

    def _restart_finished(self, run: list[int], ended: np.ndarray,
                          per_env: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """SAME_STEP: reset the envs that just ended; their end goes in ``final_*``."""
        done = [i for i in run if ended[i]]
        finals = {i: {"final_obs": self._obs[i], "final_info": per_env[i]} for i in done}
        for i, (obs, info) in zip(done, self._reset_envs(done, [None] * len(done))):
            self._obs[i], per_env[i] = obs, _env_info(info)
        return finals

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
        self.pool.close()


def _env_info(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k not in POOL_INFO_KEYS}


def _plain(action: Any) -> Any:
    """A batched action's element as the env takes it (numpy ints as Python ints)."""
    return action.item() if isinstance(action, np.generic) else action
