"""RAGEN's ``EnvStateManager`` (seed 001; RAGEN v1 and v2) over the pool: its shapes and rules.

`EnvStateManager(config, mode)` is RAGEN's ``es_manager`` interface, ``reset(seed)`` /
``step(all_env_inputs)`` / ``get_rollout_states()`` / ``render()`` / ``close()``, returning the
rollout-cache dicts RAGEN's ContextManager reads. The contract (docs/ragen.md): with the same
config and seed it returns what RAGEN's manager returns, value for value and type for type:

* ``es.envs`` exists from construction, one entry per env with ``tag, group_id, env_id, env,
  config, status, max_actions_per_traj``; ``status`` is the live `EnvStatus` the manager
  updates (replaced at each reset); ``env`` is a handle (`EnvHandle`) because the env object
  itself lives in the pool's workers;
* the rollout cache is RAGEN's: ``penalty`` starts at the int ``0``; a turn that executed
  nothing records reward ``0`` (int) and ``info {}``; ``actions`` holds the executed action
  *ids* (the strings themselves for envs without an action lookup); ``info`` holds only the
  keys RAGEN's env reports; whole-number rewards of envs whose RAGEN class returns ints stay
  ints; ``step`` returns the cache dicts themselves, as RAGEN does;
* the format penalty follows RAGEN's manager only (an unknown action name, or no action at
  all): an env's own ``action_is_valid`` never adds one;
* seeds: train ``seed.train + counter`` (counter += env_groups); an explicit train seed ``s``
  sets the counter to ``s - base + 1``; val: ``seed.val`` (or 123) every time; without a
  ``seed`` section in the user's config, train draws ``randint(0, 1_000_000)`` (from a local
  generator, never the global one);
* an input for an env that has finished is stepped (RAGEN does not check), within what is
  left of its action budget;
* ``get_rollout_states`` adds RAGEN's metrics: ``{tag}/success`` (float), ``{tag}/num_actions``
  (int), every info key averaged over ``len(history) - 1`` (numpy floats),
  ``{tag}/pass@{group_size}``, ``history[-1]['metrics']`` (the per-turn lists) and, for the
  ``MetamathQA`` tag, ``correct_answer``;
* ``rgb_array`` envs (VisualSimpleSokoban) show ``"<images>"`` as the state plus ``images``:
  PIL images when Pillow is installed (numpy arrays otherwise). The frame is drawn in this
  process from the observation text the worker already sent (`SokobanEnv.frame_from_obs`), so
  no pixels are pickled between processes.

Under RAGEN v2 (``turnpool.ragen_version``, the default; docs/ragen.md "RAGEN v1 and v2")
the manager is v2's: every turn's ``info`` carries ``raw_reward`` (summed over the turn's
actions, whose infos are merged in order), a turn with no valid action adds
``manager_invalid_action`` to its info and to the next state entry, and the metrics add
``episodic_return``, ``max_tile``, ``final_score`` and WebShop's ``traj_sum/``. In both
versions a non-numeric info value is logged and left out of the metrics.

Where the envs run: in this process unless the config asks for workers
(``turnpool.backend`` other than ``auto``, or ``es_manager.use_multiprocessing``). A plain
script without ``if __name__ == "__main__"`` therefore never starts processes behind the
user's back.

Example:
    >>> es = EnvStateManager({"es_manager": {"train": {"env_groups": 1, "group_size": 2,
    ...     "env_configs": {"tags": ["Bandit"], "n_groups": [1]}}}, "seed": {"train": 7}})
    >>> [e["status"].seed for e in es.envs]   # entries exist before the first reset
    [None, None]
    >>> cache = es.reset()
    >>> out = es.step([{"env_id": 0, "actions": ["Youtuber"], "llm_response": "",
    ...                 "llm_raw_response": ""}])
    >>> out, es.envs[0]["status"].terminated   # env 0 is done after one pull
    ([], True)
    >>> es.close()
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from turnpool.envs.frames import INFO_KEY as FRAME_KEY
from turnpool.envs.frames import FrameReader
from turnpool.envs.registry import resolve
from turnpool.pool import EnvPool, TurnResult
from turnpool.ragen.config import load_config, pool_options, rollout_plan, user_sets
from turnpool.rollout.collector import build_pool
from turnpool.rollout.episode import RAW_REWARD_KEY, step_singly
from turnpool.rollout.metrics import POOL_INFO_KEYS, TURN_LVL_METRICS

log = logging.getLogger(__name__)

#: What RAGEN's rollout cache shows as the state of an image observation (once per image).
IMAGE_PLACEHOLDER = "<images>"


@dataclass
class EnvStatus:
    """RAGEN's per-env status (``terminated`` = done for any reason, as RAGEN uses it)."""

    truncated: bool = False
    terminated: bool = False
    num_actions: int = 0
    rewards: list[float] = field(default_factory=list)
    seed: int | None = None


class EnvHandle:
    """What ``es.envs[i]['env']`` is: the env lives in a pool worker, so this handle offers
    what RAGEN's code reads from an env object: ``config`` (with ``action_lookup``),
    ``render()`` and, for envs that have one, ``correct_answer``."""

    def __init__(self, manager: EnvStateManager, env_id: int, config: SimpleNamespace) -> None:
        self._manager, self.env_id, self.config = manager, env_id, config

    def render(self) -> Any:
        return self._manager._render_one(self.env_id)

    @property
    def correct_answer(self) -> Any:
        return self._manager._correct_answer(self.env_id)


class _TagInfo:
    """Per-tag facts the manager needs from the env class (resolved once, in this process)."""

    def __init__(self, env_type: str, env_kwargs: Mapping[str, Any]) -> None:
        cls, defaults = resolve(env_type)
        self.cls = cls
        self.kwargs = {**defaults, **dict(env_kwargs)}
        effective = cls.effective_config  # RAGEN env classes (adapter)
        if callable(effective):
            self.kwargs = effective(self.kwargs)
        lookup = self.kwargs.get("action_lookup") or cls.action_lookup
        self.lookup = {int(k): str(v) for k, v in dict(lookup).items()} if lookup else None
        found = cls.episode_lookup
        self.episode_lookup: Any = found if callable(found) else None
        self.info_keys: tuple[str, ...] | None = cls.ragen_info_keys
        self.int_rewards = cls.ragen_int_rewards
        self.visual = self.kwargs.get("render_mode") == "rgb_array" and callable(
            cls.frame_from_obs)
        self.config = SimpleNamespace(**self.kwargs)
        self.config.action_lookup = self.lookup


class EnvStateManager:
    """RAGEN's environment state manager on top of an `EnvPool` (see the module docstring)."""

    def __init__(self, config: Any = None, mode: str = "train") -> None:
        self.sys_config = load_config(config)
        self.mode = mode
        self.plan = rollout_plan(self.sys_config, mode)
        es = self.sys_config.es_manager
        self.config = es[mode]
        self.env_groups = self.plan.num_groups
        self.group_size = self.plan.group_size
        self.format_penalty = self.plan.collector.turn.format_penalty
        #: RAGEN v2's manager contract (`turnpool.ragen.config.ragen_version`)
        self.v2 = self.plan.collector.turn.ragen_version == "v2"
        has_seed = user_sets(config, "seed")
        self.base_seed: int | None = self.plan.collector.seed_base if has_seed else None
        self.seed_counter = 0
        self._seed_rng = random.Random()  # RAGEN's unseeded draw, from a local generator
        self._use_mp = bool(es.get("use_multiprocessing", False))
        self._pool_use_mp = self._use_mp
        self.pool = self._build_pool()
        self._tags = {t.tag: _TagInfo(t.env_type, t.env_kwargs) for t in self.plan.tags}
        self.envs: list[dict[str, Any]] = []
        for env_id, tag in enumerate(self.pool.tags):
            spec = next(t for t in self.plan.tags if t.tag == tag)
            info = self._tags[tag]
            self.envs.append({"tag": tag, "group_id": env_id // self.group_size,
                              "env_id": env_id,
                              "env": EnvHandle(self, env_id, SimpleNamespace(
                                  **vars(info.config))),
                              "config": SimpleNamespace(**vars(info.config)),
                              "status": EnvStatus(),
                              "max_actions_per_traj": spec.max_actions_per_traj})
        self.rollout_cache: list[dict[str, Any]] | None = None
        self._lookups: list[dict[int, str] | None] = [None] * len(self.envs)
        self._first_state: list[str] = [""] * len(self.envs)
        self._state: list[str] = [""] * len(self.envs)
        self._frames: list[Any] = [None] * len(self.envs)  # shared-memory frame descriptors
        self._grids: list[Any] = [None] * len(self.envs)  # the last "grid" an env reported
        self._reader = FrameReader()
        self._closed = False

    # ------------------------------------------------------------------ backend
    @property
    def use_multiprocessing(self) -> bool:
        """Run envs in a process pool; setting it takes effect at the next `reset`."""
        return self._use_mp

    @use_multiprocessing.setter
    def use_multiprocessing(self, value: bool) -> None:
        self._use_mp = bool(value)

    def _build_pool(self) -> EnvPool:
        cfg = self.sys_config.copy()
        cfg.es_manager.use_multiprocessing = self._use_mp
        options = pool_options(cfg)
        if options.get("backend", "auto") == "auto":
            # Nobody asked for workers: stay in this process (a script without a
            # ``__main__`` guard would otherwise re-run itself in each spawned worker).
            options["backend"] = "sequential"
        return build_pool(self.plan.tags, self.group_size, options,
                          seed=self.plan.collector.seed_base or 0)

    @property
    def backend_name(self) -> str:
        return str(self.pool.backend_name)

    # ------------------------------------------------------------------ seeds
    def _next_seed(self, seed: int | None) -> int:
        """RAGEN's seed rule for a batch (see the module docstring)."""
        if seed is None:
            if self.mode == "train":
                if self.base_seed is not None:
                    seed = self.base_seed + self.seed_counter
                    self.seed_counter += self.env_groups
                else:
                    seed = self._seed_rng.randint(0, 1_000_000)
            else:
                seed = 123 if self.base_seed is None else self.base_seed
        elif self.mode == "train" and self.base_seed is not None:
            self.seed_counter = int(seed) - self.base_seed + 1
        return int(seed)

    # ------------------------------------------------------------------ RAGEN API
    def reset(self, seed: int | None = None) -> list[dict[str, Any]]:
        """New episodes; returns the rollout cache (one dict per env)."""
        if self._use_mp != self._pool_use_mp:
            self.pool.close()
            self.pool = self._build_pool()
            self._pool_use_mp = self._use_mp
        obs, infos = self.pool.reset(seed=self._next_seed(seed))
        seeds = self.pool.env_seeds
        cache: list[dict[str, Any]] = []
        for entry, text, env_seed, env_info in zip(self.envs, obs, seeds, infos):
            i, tag = entry["env_id"], entry["tag"]
            self._frames[i] = env_info.get(FRAME_KEY)
            self._grids[i] = env_info.get("grid")
            entry["status"] = EnvStatus(seed=env_seed)
            self._first_state[i] = self._state[i] = str(text)
            info = self._tags[tag]
            self._lookups[i] = (info.episode_lookup(str(text), info.kwargs)
                                if info.episode_lookup else info.lookup)
            lookup = self._lookups[i]
            entry["env"].config.action_lookup = entry["config"].action_lookup = lookup
            c = {"env_id": i, "history": [], "group_id": entry["group_id"], "tag": tag,
                 "penalty": 0}
            c["history"].append(self._state_entry(i, entry["max_actions_per_traj"]))
            cache.append(c)
        self.rollout_cache = cache
        return cache

    def step(self, all_env_inputs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Apply ``{env_id, actions, llm_response, llm_raw_response}`` inputs; return the
        cache dicts of the envs that are still running (done envs are not sent back)."""
        if self.rollout_cache is None:
            raise RuntimeError("call reset() before step()")
        plans = []
        for inp in all_env_inputs:
            i = int(inp["env_id"])
            entry = self.envs[i]
            actions = [str(a) for a in (inp.get("actions") or [])]
            valid = self._map_actions(i, actions)
            left = entry["max_actions_per_traj"] - entry["status"].num_actions
            plans.append((inp, i, actions, valid, valid[:max(0, left)]))
        runs = [(i, run) for _, i, _, _, run in plans]
        results = step_singly(self._execute, runs) if self.v2 else self._execute(runs)
        outputs = []
        for (inp, i, actions, valid, run), result in zip(plans, results):
            if self._record(inp, i, actions, valid, run, result):
                outputs.append(self.rollout_cache[i])
        return outputs

    def _record(self, inp: Mapping[str, Any], i: int, actions: list[str], valid: list[Any],
                run: list[Any], result: TurnResult | None) -> bool:
        """Record one env's turn in its cache entry; whether the env is still running."""
        assert self.rollout_cache is not None
        entry, cache = self.envs[i], self.rollout_cache[i]
        status: EnvStatus = entry["status"]
        info = self._tags[entry["tag"]]
        n = 0 if result is None else int(result.n_executed)
        reward: float | int = 0
        turn_info: dict[str, Any] = {}
        turn_done = False
        if result is not None and result.error:
            log.warning("env %d failed: %s", i, result.error)
            turn_done = True
        elif result is not None and n > 0:
            reward = self._reward(info, result.reward_sum)
            turn_info = self._info(info, result.info)
            turn_done = bool(result.terminated or result.truncated)
        if result is not None:
            self._state[i] = str(result.obs)
            if n > 0:
                self._frames[i] = result.info.get(FRAME_KEY)
                self._grids[i] = result.info.get("grid", self._grids[i])
        if self.v2:  # v2's manager: the turn's raw reward always, and a turn with no action
            turn_info["raw_reward"] = float(0.0 if result is None or n == 0
                                            else result.info.get(RAW_REWARD_KEY, 0.0))
            if not valid:
                turn_info["manager_invalid_action"] = True
        if len(valid) != len(actions) or not valid:
            cache["penalty"] += self.format_penalty
        status.num_actions += n
        status.rewards.append(reward)
        if turn_done:
            status.terminated = True
            status.truncated = not turn_info.get("success", False)
        cache["history"][-1].update({
            "actions": list(run[:n]), "reward": reward, "info": turn_info,
            "llm_response": inp["llm_response"], "llm_raw_response": inp["llm_raw_response"]})
        cache["history"].append(self._state_entry(
            i, entry["max_actions_per_traj"] - status.num_actions))
        if self.v2 and not valid:
            cache["history"][-1]["manager_invalid_action"] = True
        if status.num_actions >= entry["max_actions_per_traj"] and not turn_done:
            status.truncated = status.terminated = True
            turn_done = True
        return not turn_done

    def get_rollout_states(self) -> list[dict[str, Any]]:
        """The rollout cache with RAGEN's metrics added (see the module docstring)."""
        if self.rollout_cache is None:
            raise RuntimeError("call reset() before get_rollout_states()")
        for entry, cache in zip(self.envs, self.rollout_cache):
            status: EnvStatus = entry["status"]
            env_metric: dict[str, Any] = {
                "success": float(status.terminated and not status.truncated),
                "num_actions": status.num_actions}
            custom = _turn_metrics(cache["history"], entry["tag"])
            if self.v2:
                env_metric.update(_v2_metrics(custom, cache, self._grids[entry["env_id"]]))
            else:
                for k, v in custom.items():
                    if "Webshop" not in k or k in TURN_LVL_METRICS:  # v1's test, on the key
                        env_metric[k] = np.sum(v) / (len(cache["history"]) - 1)
                    else:
                        env_metric[k] = np.sum(v)
            cache["history"][-1]["metrics"] = custom
            cache["metrics"] = {f"{entry['tag']}/{k}": v for k, v in env_metric.items()}
            if entry["tag"] == "MetamathQA":
                cache["correct_answer"] = entry["env"].correct_answer
        group_success: dict[tuple[str, int], list[float]] = {}
        for entry, cache in zip(self.envs, self.rollout_cache):
            group_success.setdefault((entry["tag"], entry["group_id"]), []).append(
                cache["metrics"].get(f"{entry['tag']}/success", 0.0))
        for entry, cache in zip(self.envs, self.rollout_cache):
            key = (entry["tag"], entry["group_id"])
            cache["metrics"][f"{entry['tag']}/pass@{self.group_size}"] = float(
                any(group_success[key]))
        return self.rollout_cache

    def render(self) -> list[Any]:
        return [self._render_one(i) for i in range(len(self.envs))]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._reader.close()
            self.pool.close()

    def __enter__(self) -> EnvStateManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers
    def _map_actions(self, env_id: int, actions: list[str]) -> list[Any]:
        """RAGEN's ``_extract_map_valid_actions``: names -> ids (any case), unknown dropped;
        envs without a lookup get the strings unchanged."""
        lookup = self._lookups[env_id]
        if lookup is None:
            return list(actions)
        ids = {v.lower(): k for k, v in lookup.items()}
        return [ids[a.lower()] for a in actions if a.lower() in ids]

    def _execute(self, runs: list[tuple[int, list[Any]]]) -> list[TurnResult | None]:
        """One pool call for every env with something to run; None where nothing ran."""
        todo = [k for k, (_, run) in enumerate(runs) if run]
        out: list[TurnResult | None] = [None] * len(runs)
        # an env named twice in one call is stepped twice, in order, as RAGEN's loop does
        while todo:
            seen: set[int] = set()
            now: list[int] = []
            later: list[int] = []
            for k in todo:
                (later if runs[k][0] in seen else now).append(k)
                seen.add(runs[k][0])
            stepped = self.pool.step_turns([list(runs[k][1]) for k in now],
                                           [runs[k][0] for k in now])
            for k, r in zip(now, stepped):
                out[k] = r
            todo = later
        return out

    @staticmethod
    def _reward(info: _TagInfo, value: float) -> float | int:
        if info.int_rewards and float(value).is_integer():
            return int(value)
        return value

    @staticmethod
    def _info(tag: _TagInfo, info: Mapping[str, Any]) -> dict[str, Any]:
        keys = tag.info_keys
        if keys is not None:  # the env's own keys, even one the pool also uses (Sudoku's error)
            return {k: v for k, v in info.items() if k in keys}
        return {k: v for k, v in info.items() if k not in POOL_INFO_KEYS}

    def _state_entry(self, env_id: int, actions_left: int) -> dict[str, Any]:
        state = self._render_one(env_id)
        if isinstance(state, str):
            return {"state": state, "actions_left": actions_left}
        images = [_as_image(state)]
        return {"state": IMAGE_PLACEHOLDER * len(images), "images": images,
                "actions_left": actions_left}

    def _render_one(self, env_id: int) -> Any:
        info = self._tags[self.envs[env_id]["tag"]]
        text = self._state[env_id]
        frame_of = info.cls.frame_from_obs
        if info.visual and frame_of is not None:
            return frame_of(text, info.kwargs)
        if self._frames[env_id] is not None:  # an env that sends frames through shared memory
            return self._reader.read(self._frames[env_id])
        return text

    def _correct_answer(self, env_id: int) -> Any:
        info = self._tags[self.envs[env_id]["tag"]]
        answer_for = info.cls.answer_for_obs
        return answer_for(self._first_state[env_id], info.kwargs) if answer_for else None


def _turn_metrics(history: list[dict[str, Any]], tag: str) -> dict[str, list[float]]:
    """Every info key of every turn as a list of floats (RAGEN's ``custom_metric``). A value
    that is not a number is logged and skipped, its key kept with what was numeric (v2's
    rule; v1 raised, so no v1 run that worked sees a difference)."""
    custom: dict[str, list[float]] = {}
    for turn in history:
        for k, v in turn.get("info", {}).items():
            if k == "success":
                continue
            values = custom.setdefault(k, [])
            try:
                values.append(float(v))
            except (TypeError, ValueError):
                log.warning("Skipping non-numeric metric '%s' with value %r for env %s.",
                            k, v, tag)
    return custom


def _v2_metrics(custom: dict[str, list[float]], cache: dict[str, Any], grid: Any
                ) -> dict[str, Any]:
    """RAGEN v2's per-env metrics after ``success`` and ``num_actions``."""
    out: dict[str, Any] = {}
    if grid is not None:
        out["max_tile"] = int(np.max(np.asarray(grid)))
    if RAW_REWARD_KEY in custom:
        out["episodic_return"] = float(np.sum(custom[RAW_REWARD_KEY]))
    webshop = "webshop" in cache["tag"].lower()
    for k, v in custom.items():
        if not webshop or k in TURN_LVL_METRICS:
            out[k] = np.sum(v) / (len(cache["history"]) - 1)
        else:
            out["traj_sum/" + k] = np.sum(v)
    if custom.get("score"):
        out["final_score"] = float(custom["score"][-1])
    return out


def _as_image(frame: np.ndarray) -> Any:
    """A PIL RGB image (RAGEN's ``_handle_mm_state``), or the array without Pillow."""
    try:
        from PIL import Image
    except ImportError:
        return frame
    return Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8), mode="RGB")
