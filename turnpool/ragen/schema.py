"""The schema of the config sections turnpool owns, and the check that names key and file.

RAGEN configs carry many sections turnpool never reads (trainer, actor_rollout_ref, ...), often
with ``${...}`` interpolations into verl's own config. So only the owned sections are walked.
Every message names the key and the layer (file, config object or command-line overrides)
that set it. The rules:

* an ill-typed key in an owned section is an error;
* an unknown key under RAGEN's sections (``seed``, ``agent_proxy``, ``es_manager``,
  ``custom_envs``, ``algorithm.filter_groups``) is a `ConfigWarning`, because RAGEN ignores
  keys it does not read and forks add their own; strict mode (``load_config(strict=True)``,
  ``turnpool.strict_config: true`` or ``TURNPOOL_STRICT_CONFIG=1``) makes it an error;
* an unknown key under ``turnpool`` and an unknown top-level section are errors that name the
  likely intended key: ``backend=thread`` on a command line is ``turnpool.backend``
  misspelled, not a new section. Top-level sections RAGEN and verl define are known.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from turnpool.rollout.scoring import GROUPINGS, METHODS
from turnpool.rollout.settings import TREE_MODES

ON_BUDGET_EXHAUSTED = ("raise", "keep_all", "return_short")
COLLECTOR_MODES = ("lockstep", "async")
#: RAGEN releases whose semantics turnpool reproduces (docs/ragen.md, "RAGEN v1 and v2").
RAGEN_VERSIONS = ("v1", "v2")
CONTEXT_WINDOW_MODES = ("full", "limited_multi_turn", "single_turn")
MP_CONTEXTS = ("spawn", "forkserver", "fork")
ON_ERROR = ("flag", "raise")
_INTERP = re.compile(r"\$\{.*\}")


class ConfigError(ValueError):
    """A config problem; the message names the key and the file."""


class ConfigWarning(UserWarning):
    """A key turnpool does not know under one of RAGEN's sections (RAGEN ignores it too)."""


#: Top-level sections of RAGEN's and verl's configs that turnpool keeps without reading.
FOREIGN_SECTIONS = frozenset({
    "defaults", "hydra", "system", "micro_batch_size_per_gpu", "ppo_mini_batch_size",
    "model_path", "enable_response_mask", "grpo_advantage_length_weight", "lora",
    "actor_rollout_ref", "critic", "data", "trainer", "ctx_manager", "model_config",
    "model_info", "reward_model", "custom_reward_function", "ray_init", "ray_kwargs",
    "global_profiler", "transfer_queue", "rollout", "reward", "critic_warmup",
    # RAGEN v2's trainer-side sections (docs/ragen.md, "RAGEN v2 keys turnpool ignores"):
    # verl's log-prob micro batch, the template/entropy-collapse diagnostics (they score
    # model log-probs), where its eval script writes results, and its critic switch.
    "log_prob_micro_batch_size_per_gpu", "collapse_detection", "output", "use_critic",
    # newer verl's ppo_trainer.yaml (0.9), which RAGEN's base.yaml lists in its defaults:
    # a RAGEN loop composed over it hands them to the manager.
    "model_engine", "distillation", "sandbox_fusion", "skip",
})
#: Sections whose unknown keys are someone else's business (RAGEN ignores them).
_LENIENT = ("seed", "agent_proxy", "es_manager", "custom_envs", "algorithm", "use_parallel_envs")


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
        "context_window_mode": _T("string", lambda v: isinstance(v, str),
                                  choices=CONTEXT_WINDOW_MODES),
        # RAGEN v2 pads or trims a batch to a multiple of the trainer's world size: a
        # trainer concern (the verl integration does it), read by nobody here.
        "batch_adjust_mode": _T("string", lambda v: isinstance(v, str),
                                choices=("copy", "delete")),
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
        "parallel_friendly": BOOL,
        "max_workers": OPT_INT,
    }),
    "algorithm": {
        # verl's own keys too (its dataclass target, newer verl's in-flight batches)
        "filter_groups": {"enable": BOOL, "max_num_gen_batches": INT, "metric": OPT_STR,
                          "_target_": OPT_STR, "max_inflight_gen_batches": INT},
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
        "strict_config": BOOL,
        "ragen_version": _T("string", lambda v: isinstance(v, str), choices=RAGEN_VERSIONS),
        "policy": _Open({"name": STR}, nullable=False),
        "collector": {
            "mode": _T("string", lambda v: isinstance(v, str), choices=COLLECTOR_MODES),
            "max_batch": OPT_INT,
            "max_wait_s": FLOAT,
            "policy_workers": INT,
            "target_groups": OPT_INT,
            "on_budget_exhausted": _T("string", lambda v: isinstance(v, str),
                                      choices=ON_BUDGET_EXHAUSTED),
            "tree": {
                "mode": _T("string", lambda v: isinstance(v, str), choices=TREE_MODES),
                "width": INT,
                "prefix_turns": INT,
                "score": STR,
            },
        },
    },
}

#: Top-level sections where only part of the subtree is turnpool's.
_PARTIAL = {"algorithm"}


Source = Callable[[str], str]


def _walk(schema: Any, value: Any, path: str, source: Source, *, resolved: bool,
          strict: bool = False) -> None:
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
            _walk(schema.item, item, f"{path}.{name}", source, resolved=resolved,
                  strict=strict)
        return
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a mapping, got {value!r} (in {source(path)})")
    partial = path in _PARTIAL
    for k, v in value.items():
        if k not in schema:
            if partial:
                continue
            _unknown(f"{path}.{k}", sorted(schema), source, resolved=resolved, strict=strict)
            continue
        _walk(schema[k], v, f"{path}.{k}", source, resolved=resolved, strict=strict)


def _unknown(key: str, known: Sequence[str], source: Source, *, resolved: bool,
             strict: bool) -> None:
    """An unknown key: an error under ``turnpool`` or in strict mode, else one warning."""
    parent, _, name = key.rpartition(".")
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean {parent}.{near[0]}?" if near else ""
    msg = (f"unknown key {key} (in {source(key)}){hint} known keys of {parent}: "
           f"{', '.join(known)}")
    if strict or not key.startswith(_LENIENT):
        raise ConfigError(msg)
    if not resolved:  # each layer is checked once unresolved, then the merge once resolved
        warnings.warn(msg + " (ignored, as RAGEN ignores it)", ConfigWarning, stacklevel=5)


def check_top_level(cfg: DictConfig, source: str) -> None:
    """Unknown top-level keys fail, naming the likely intended one (``backend`` ->
    ``turnpool.backend``)."""
    turnpool_keys = sorted(SCHEMA["turnpool"])
    known = sorted(set(SCHEMA) | FOREIGN_SECTIONS)
    for key in cfg:
        k = str(key)
        if k in SCHEMA or k in FOREIGN_SECTIONS:
            continue
        if k in turnpool_keys or k.split(".")[0] in turnpool_keys:
            hint = f"turnpool.{k}"
        else:
            near = difflib.get_close_matches(k, known + [f"turnpool.{t}" for t in turnpool_keys],
                                             n=1, cutoff=0.6)
            hint = near[0] if near else ""
        raise ConfigError(f"unknown top-level key {k!r} (in {source})"
                          + (f"; did you mean {hint}?" if hint else "")
                          + f" top-level sections: {', '.join(known)}")


def validate(cfg: DictConfig, source: str | Source, *, resolved: bool = False,
             strict: bool = False) -> None:
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
        _walk(schema, value, section, source, resolved=resolved, strict=strict)


def _plain(node: DictConfig, key: str, source: Source, resolve: bool, path: str) -> Any:
    try:
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)):
            return OmegaConf.to_container(child, resolve=resolve)
        return node[key] if resolve else child._value()  # type: ignore[union-attr]
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.__class__.__name__}: {exc}) "
                          f"(in {source(path)})") from exc
