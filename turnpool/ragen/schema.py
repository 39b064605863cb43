"""The schema of the config sections turnpool owns, and the check that names key and file.

RAGEN configs carry many sections turnpool never reads (trainer, actor_rollout_ref, ...), often
with ``${...}`` interpolations into verl's own config. So only the owned sections are walked;
inside them an unknown or ill-typed key is an error that names the key and the layer (file,
config object or command-line overrides) that set it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from turnpool.rollout.scoring import GROUPINGS, METHODS

ON_BUDGET_EXHAUSTED = ("raise", "keep_all", "return_short")
COLLECTOR_MODES = ("lockstep", "async")
MP_CONTEXTS = ("spawn", "forkserver", "fork")
ON_ERROR = ("flag", "raise")
_INTERP = re.compile(r"\$\{.*\}")


class ConfigError(ValueError):
    """A config problem; the message names the key and the file."""


class _T:
    """A leaf type: ``check`` says whether a (plain, resolved) value fits."""

    def __init__(self, name: str, ok: Any, nullable: bool = False,
                 choices: Sequence[Any] | None = None) -> None:
        self.name, self.ok, self.nullable, self.choices = name, ok, nullable, choices

    def check(self, v: Any) -> bool:
        if v is None:
            return self.nullable
        if not self.ok(v):
            return False
        return self.choices is None or v in self.choices

    def describe(self) -> str:
        d = self.name + (" or null" if self.nullable else "")
        return d + (f" (one of {', '.join(map(str, self.choices))})" if self.choices else "")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _list_of(pred: Any) -> Any:
    return lambda v: isinstance(v, list) and all(pred(x) for x in v)


INT, OPT_INT = _T("int", is_int), _T("int", is_int, nullable=True)
FLOAT, OPT_FLOAT = _T("number", _is_num), _T("number", _is_num, nullable=True)
BOOL = _T("bool", lambda v: isinstance(v, bool))
STR, OPT_STR = _T("string", lambda v: isinstance(v, str)), _T(
    "string", lambda v: isinstance(v, str), nullable=True)
LIST_STR = _T("list of strings", _list_of(lambda x: isinstance(x, str)))
OPT_LIST_INT = _T("list of ints", _list_of(is_int), nullable=True)
OPT_DICT = _T("mapping", lambda v: isinstance(v, dict), nullable=True)


class _Open:
    """A mapping whose keys belong to someone else (env kwargs, policy options)."""

    def __init__(self, known: dict[str, _T] | None = None, nullable: bool = True) -> None:
        self.known, self.nullable = known or {}, nullable


class _MapOf:
    """A mapping of user-chosen names to one schema (``custom_envs.<tag>``)."""

    def __init__(self, item: dict[str, Any]) -> None:
        self.item = item


_MODE = {
    "env_groups": INT,
    "group_size": INT,
    "env_configs": {"tags": LIST_STR, "n_groups": OPT_LIST_INT},
}

SCHEMA: dict[str, Any] = {
    "seed": {"train": OPT_INT, "val": OPT_INT},
    "use_parallel_envs": BOOL,
    "agent_proxy": {
        "max_turn": INT,
        "action_sep": STR,
        "max_actions_per_turn": INT,
        "max_context_window": OPT_INT,
        "use_turn_scores": BOOL,
        "enable_think": BOOL,
        "reward_normalization": {
            "grouping": _T("string", lambda v: isinstance(v, str), choices=GROUPINGS),
            "method": _T("string", lambda v: isinstance(v, str), choices=METHODS),
        },
        "use_parallel_rollout": BOOL,
        "parallel_n_jobs": INT,
    },
    "es_manager": {
        "format_penalty": FLOAT,
        "use_multiprocessing": BOOL,
        "max_workers": OPT_INT,
        "sequential_env_types": LIST_STR,
        "train": _MODE,
        "val": _MODE,
    },
    "custom_envs": _MapOf({
        "env_type": STR,
        "max_actions_per_traj": INT,
        "env_instruction": OPT_STR,
        "max_tokens": INT,
        "env_config": _Open(),
        "grid_vocab": OPT_DICT,
        "action_lookup": OPT_DICT,
    }),
    "algorithm": {
        "filter_groups": {"enable": BOOL, "max_num_gen_batches": INT, "metric": OPT_STR},
    },
    "turnpool": {
        "backend": STR,
        "num_workers": OPT_INT,
        "mp_context": _T("string", lambda v: isinstance(v, str), nullable=True,
                         choices=MP_CONTEXTS),
        "step_timeout": OPT_FLOAT,
        "on_error": _T("string", lambda v: isinstance(v, str), choices=ON_ERROR),
        "fallback": BOOL,
        "ray_address": OPT_STR,
        "policy": _Open({"name": STR}, nullable=False),
        "collector": {
            "mode": _T("string", lambda v: isinstance(v, str), choices=COLLECTOR_MODES),
            "max_batch": OPT_INT,
            "max_wait_s": FLOAT,
            "policy_workers": INT,
            "target_groups": OPT_INT,
            "on_budget_exhausted": _T("string", lambda v: isinstance(v, str),
                                      choices=ON_BUDGET_EXHAUSTED),
        },
    },
}

#: Top-level sections where only part of the subtree is turnpool's.
_PARTIAL = {"algorithm"}


Source = Callable[[str], str]


def _walk(schema: Any, value: Any, path: str, source: Source, *, resolved: bool) -> None:
    """Check ``value`` (a plain container) against ``schema``; raise naming path and file."""
    if isinstance(value, str) and _INTERP.search(value) and not resolved:
        return  # checked once the merged config is resolved
    if isinstance(schema, _T):
        if not schema.check(value):
            raise ConfigError(f"{path}: expected {schema.describe()}, got {value!r} "
                              f"(in {source(path)})")
        return
    if isinstance(schema, _Open):
        if value is None and schema.nullable:
            return
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r} (in {source(path)})")
        for k, t in schema.known.items():
            if k in value:
                _walk(t, value[k], f"{path}.{k}", source, resolved=resolved)
        return
    if isinstance(schema, _MapOf):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r} (in {source(path)})")
        for name, item in value.items():
            _walk(schema.item, item, f"{path}.{name}", source, resolved=resolved)
        return
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a mapping, got {value!r} (in {source(path)})")
    partial = path in _PARTIAL
    for k, v in value.items():
        if k not in schema:
            if partial:
                continue
            known = ", ".join(sorted(schema))
            raise ConfigError(f"unknown key {path}.{k} (in {source(f'{path}.{k}')}); "
                              f"known keys of {path}: {known}")
        _walk(schema[k], v, f"{path}.{k}", source, resolved=resolved)


def validate(cfg: DictConfig, source: str | Source, *, resolved: bool = False) -> None:
    """Check the sections turnpool owns; other sections are not looked at (or resolved).

    ``source`` names where ``cfg`` came from: a file name, or a function from a dotted key
    to the file that set it (for a merged config).
    """
    if isinstance(source, str):
        name = source
        source = lambda _path: name  # noqa: E731
    for section, schema in SCHEMA.items():
        if section not in cfg:
            continue
        if section in _PARTIAL:
            node = cfg[section]
            if not isinstance(node, DictConfig):
                continue
            keys = [str(k) for k in node if k in schema]
            value = {k: _plain(node, k, source, resolved, section + "." + k) for k in keys}
        else:
            value = _plain(cfg, section, source, resolved, section)
        _walk(schema, value, section, source, resolved=resolved)


def _plain(node: DictConfig, key: str, source: Source, resolve: bool, path: str) -> Any:
    try:
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)):
            return OmegaConf.to_container(child, resolve=resolve)
        return node[key] if resolve else child._value()  # type: ignore[union-attr]
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.__class__.__name__}: {exc}) "
                          f"(in {source(path)})") from exc
