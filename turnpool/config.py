"""Configuration: RAGEN's YAML keys as they are, plus turnpool's own, validated.

``load_config(path, overrides)`` stacks, bottom to top: the packaged ``configs/base.yaml``
(RAGEN's defaults for the sections turnpool reads, and turnpool's keys), the packaged
``configs/envs.yaml`` (RAGEN's ``custom_envs``), the user's file (with Hydra-style
``defaults:`` resolved next to it, missing entries such as verl's ``ppo_trainer`` skipped), and
``key=value`` overrides.

turnpool owns ``seed``, ``use_parallel_envs``, ``agent_proxy``, ``es_manager``,
``custom_envs``, ``algorithm.filter_groups`` and ``turnpool``. Inside those, an unknown or
ill-typed key is an error naming the key and the file it came from. Everything else (trainer,
actor_rollout_ref, critic, data, the rest of algorithm, lora, ctx_manager, system, ...) is kept
untouched and never resolved, so a full RAGEN config whose ``${...}`` interpolations point into
verl's own config loads as it is.

    >>> cfg = load_config(overrides=["es_manager.train.env_groups=2",
    ...                              "es_manager.train.env_configs.n_groups=[2]"])
    >>> plan = rollout_plan(cfg)
    >>> (plan.num_groups, plan.group_size, plan.tags[0].tag)
    (2, 16, 'SimpleSokoban')
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from turnpool.collector_async import AsyncSettings
from turnpool.managers import DEFAULT_MAX_TOKENS, TagSpec, TurnSettings
from turnpool.rewards import GROUPINGS, METHODS

log = logging.getLogger(__name__)

PACKAGED_DIR = Path(__file__).resolve().parent / "configs"
OVERRIDES_SOURCE = "command-line overrides"
ON_BUDGET_EXHAUSTED = ("raise", "keep_all", "return_short")
COLLECTOR_MODES = ("lockstep", "async")
MP_CONTEXTS = ("spawn", "forkserver", "fork")
ON_ERROR = ("flag", "raise")
_INTERP = re.compile(r"\$\{.*\}")


class ConfigError(ValueError):
    """A config problem; the message names the key and the file."""


# ------------------------------------------------------------------ schema
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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _list_of(pred: Any) -> Any:
    return lambda v: isinstance(v, list) and all(pred(x) for x in v)


INT, OPT_INT = _T("int", _is_int), _T("int", _is_int, nullable=True)
FLOAT, OPT_FLOAT = _T("number", _is_num), _T("number", _is_num, nullable=True)
BOOL = _T("bool", lambda v: isinstance(v, bool))
STR, OPT_STR = _T("string", lambda v: isinstance(v, str)), _T(
    "string", lambda v: isinstance(v, str), nullable=True)
LIST_STR = _T("list of strings", _list_of(lambda x: isinstance(x, str)))
OPT_LIST_INT = _T("list of ints", _list_of(_is_int), nullable=True)
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


# ------------------------------------------------------------------ loading
def _read_yaml(path: Path) -> DictConfig:
    try:
        cfg = OmegaConf.load(path)
    except (OSError, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return cfg


def _layers_of(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[str, DictConfig]]:
    """A file and the Hydra ``defaults:`` it names (next to it, else packaged), in order."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"config defaults form a cycle through {path}")
    cfg = _read_yaml(path)
    defaults = cfg.pop("defaults", None)
    if defaults is None:
        return [(str(path), cfg)]
    if not isinstance(defaults, ListConfig):
        raise ConfigError(f"defaults: expected a list (in {path})")
    layers: list[tuple[str, DictConfig]] = []
    self_added = False
    for entry in OmegaConf.to_container(defaults, resolve=False):  # type: ignore[union-attr]
        if entry == "_self_":
            layers.append((str(path), cfg))
            self_added = True
            continue
        if not isinstance(entry, str):
            log.debug("ignoring non-file defaults entry %r in %s", entry, path)
            continue
        name = entry if entry.endswith(".yaml") else entry + ".yaml"
        candidates = [path.parent / name, PACKAGED_DIR / name]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            log.info("defaults entry %r of %s not found; skipped (not a turnpool section)",
                     entry, path)
            continue
        layers.extend(_layers_of(found, (*seen, path)))
    if not self_added:
        layers.append((str(path), cfg))
    return layers


def load_config(
    path: str | Path | DictConfig | Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
) -> DictConfig:
    """Load and validate a config (see the module docstring for the layering).

    ``path`` may also be an already-built config object (a Hydra ``DictConfig`` as RAGEN
    passes around, or a dict); it is layered over the packaged defaults the same way.
    """
    layers: list[tuple[str, DictConfig]] = [
        (f"turnpool's packaged {n}", _read_yaml(PACKAGED_DIR / n))
        for n in ("base.yaml", "envs.yaml")
    ]
    if isinstance(path, (DictConfig, Mapping)):
        given = path if isinstance(path, DictConfig) else OmegaConf.create(dict(path))
        given = given.copy()
        OmegaConf.set_struct(given, False)  # Hydra hands configs over in struct mode
        OmegaConf.set_readonly(given, False)
        given.pop("defaults", None)
        layers.append(("the config object passed in", given))
    elif path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        layers.extend(_layers_of(p))
    dotlist = [o[1:] if o.startswith("+") else o for o in overrides]
    if dotlist:
        bad = [o for o in dotlist if "=" not in o]
        if bad:
            raise ConfigError(f"overrides must look like key=value, got {bad} "
                              f"(in {OVERRIDES_SOURCE})")
        try:
            layers.append((OVERRIDES_SOURCE, OmegaConf.from_dotlist(dotlist)))
        except OmegaConfBaseException as exc:
            raise ConfigError(f"cannot parse overrides {dotlist}: {exc}") from exc
    for source, layer in layers:
        validate(layer, source)
    merged = OmegaConf.merge(*(layer for _, layer in layers))
    assert isinstance(merged, DictConfig)
    where = _where(layers)
    validate(merged, where, resolved=True)
    for mode in ("train", "val"):
        _check_mode(merged, mode, where)
    return merged


def _where(layers: Sequence[tuple[str, DictConfig]]) -> Source:
    """dotted key -> the last layer that sets it (or its nearest parent)."""
    def sets(layer: DictConfig, dotted: str) -> bool:
        node: Any = layer
        for part in dotted.split("."):
            if not isinstance(node, DictConfig) or part not in node:
                return False
            node = node._get_node(part)
        return True

    def where(dotted: str) -> str:
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            for source, layer in reversed(layers):
                if sets(layer, ".".join(parts[:n])):
                    return source
        return layers[-1][0]
    return where


def _check_mode(cfg: DictConfig, mode: str, where: Source) -> None:
    """Cross-key checks of ``es_manager.<mode>`` (the ones RAGEN asserted, plus tag lookup)."""
    es = cfg.es_manager[mode]
    key = f"es_manager.{mode}"
    tags = list(es.env_configs.tags)
    custom = cfg.get("custom_envs") or {}
    for tag in tags:
        if tag not in custom:
            raise ConfigError(f"{key}.env_configs.tags names {tag!r}, which is not under "
                              f"custom_envs (in {where(key + '.env_configs.tags')})")
        if custom[tag].get("env_type") is None:
            raise ConfigError(f"custom_envs.{tag}.env_type is missing "
                              f"(in {where('custom_envs.' + tag)})")
    if es.group_size < 1 or es.env_groups < 1:
        raise ConfigError(f"{key}: env_groups and group_size must be >= 1 "
                          f"(in {where(key)})")
    _n_groups(es, key, where)


def _n_groups(es: Any, key: str, where: Source) -> list[int]:
    tags = list(es.env_configs.tags)
    n_groups = es.env_configs.get("n_groups")
    if not tags:
        raise ConfigError(f"{key}.env_configs.tags is empty (in {where(key)})")
    if n_groups is None:
        # RAGEN documents "divide equally if not set" without doing it; we do it.
        if es.env_groups < len(tags):
            raise ConfigError(f"{key}: {es.env_groups} env_groups cannot cover {len(tags)} "
                              f"tags (in {where(key + '.env_groups')})")
        q, r = divmod(int(es.env_groups), len(tags))
        return [q + (1 if i < r else 0) for i in range(len(tags))]
    n_groups = [int(x) for x in n_groups]
    if len(n_groups) != len(tags):
        raise ConfigError(f"{key}.env_configs: {len(tags)} tags but {len(n_groups)} n_groups "
                          f"(in {where(key + '.env_configs.n_groups')})")
    if sum(n_groups) != es.env_groups:
        raise ConfigError(f"{key}: sum of env_configs.n_groups {n_groups} = {sum(n_groups)} "
                          f"!= env_groups {es.env_groups} (n_groups in "
                          f"{where(key + '.env_configs.n_groups')}, env_groups in "
                          f"{where(key + '.env_groups')})")
    if any(n < 1 for n in n_groups):
        raise ConfigError(f"{key}.env_configs.n_groups must be >= 1 each, got {n_groups} "
                          f"(in {where(key + '.env_configs.n_groups')})")
    return n_groups


# ------------------------------------------------------------------ typed views
@dataclass(frozen=True)
class PoolSettings:
    """How the pool runs (after mapping RAGEN's parallelism switches to a backend)."""

    backend: str = "auto"
    num_workers: int | None = None
    mp_context: str | None = None
    step_timeout: float | None = 30.0
    on_error: str = "flag"
    fallback: bool = True
    ray_address: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutPlan:
    """Everything a rollout needs, read from the sections turnpool owns."""

    mode: str
    tags: list[TagSpec]
    group_size: int
    seed_base: int | None
    turn: TurnSettings
    max_turn: int
    grouping: str
    method: str
    use_turn_scores: bool
    filter_groups: bool
    max_num_gen_batches: int
    on_budget_exhausted: str
    target_groups: int | None
    collector_mode: str
    pool: PoolSettings
    policy: dict[str, Any] = field(default_factory=dict)
    async_settings: AsyncSettings = field(default_factory=AsyncSettings)

    @property
    def num_groups(self) -> int:
        return sum(t.n_groups for t in self.tags)


def _section(cfg: DictConfig, key: str) -> Any:
    node = OmegaConf.select(cfg, key, default=None)
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _max_tokens_fallback(cfg: DictConfig) -> int:
    try:
        v = OmegaConf.select(cfg, "actor_rollout_ref.rollout.response_length", default=None)
    except OmegaConfBaseException:
        return DEFAULT_MAX_TOKENS
    return int(v) if _is_int(v) else DEFAULT_MAX_TOKENS


def pool_settings(cfg: DictConfig) -> PoolSettings:
    """Map RAGEN's switches to one backend; an explicit ``turnpool.backend`` wins.

    ``agent_proxy.use_parallel_rollout`` -> ``joblib`` with ``parallel_n_jobs`` workers (seed
    002); ``es_manager.use_multiprocessing`` -> ``process_pool`` with ``max_workers`` and
    ``sequential_env_types`` (those env types stay in the calling process; seed 001);
    ``use_parallel_envs: false`` -> ``sequential``.
    """
    tp = _section(cfg, "turnpool") or {}
    ap = _section(cfg, "agent_proxy") or {}
    es = _section(cfg, "es_manager") or {}
    backend = str(tp.get("backend", "auto"))
    workers = tp.get("num_workers")
    options: dict[str, Any] = {}
    if backend == "auto":
        if ap.get("use_parallel_rollout"):
            backend = "joblib"
            n_jobs = ap.get("parallel_n_jobs", -1)
            workers = workers if workers is not None else (n_jobs if n_jobs and n_jobs > 0
                                                           else None)
        elif es.get("use_multiprocessing"):
            backend = "process_pool"
            options["max_workers"] = es.get("max_workers")
            options["sequential_env_types"] = list(es.get("sequential_env_types") or [])
        elif cfg.get("use_parallel_envs") is False:
            backend = "sequential"
    return PoolSettings(backend=backend, num_workers=workers, mp_context=tp.get("mp_context"),
                        step_timeout=tp.get("step_timeout"),
                        on_error=str(tp.get("on_error", "flag")),
                        fallback=bool(tp.get("fallback", True)),
                        ray_address=tp.get("ray_address"), options=options)


def rollout_plan(cfg: DictConfig, mode: str = "train") -> RolloutPlan:
    """The typed view of a loaded config for ``mode`` ("train" or "val")."""
    if mode not in ("train", "val"):
        raise ConfigError(f"mode must be 'train' or 'val', got {mode!r}")
    es = _section(cfg, "es_manager")
    ap = _section(cfg, "agent_proxy")
    custom = _section(cfg, "custom_envs") or {}
    mode_cfg = cfg.es_manager[mode]
    n_groups = _n_groups(mode_cfg, f"es_manager.{mode}", lambda _k: "the loaded config")
    fallback_tokens = _max_tokens_fallback(cfg)
    tags: list[TagSpec] = []
    for tag, n in zip(es[mode]["env_configs"]["tags"], n_groups):
        c = custom[tag]
        tags.append(TagSpec(
            tag=tag, env_type=str(c["env_type"]), n_groups=n,
            env_kwargs=dict(c.get("env_config") or {}),
            max_actions_per_traj=int(c.get("max_actions_per_traj", 10)),
            env_instruction=c.get("env_instruction"),
            max_tokens=int(c.get("max_tokens") or fallback_tokens),
            grid_vocab=c.get("grid_vocab"), action_lookup=c.get("action_lookup"),
        ))
    rn = ap.get("reward_normalization") or {}
    fg = _section(cfg, "algorithm.filter_groups") or {}
    tp = _section(cfg, "turnpool") or {}
    col = tp.get("collector") or {}
    seeds = _section(cfg, "seed") or {}
    enable = bool(fg.get("enable", False))
    max_batches = int(fg.get("max_num_gen_batches", 10))
    if enable and max_batches < 1:
        raise ConfigError("algorithm.filter_groups.max_num_gen_batches must be >= 1 when "
                          "filter_groups.enable is true (turnpool never resamples without "
                          "bound)")
    window = ap.get("max_context_window")
    return RolloutPlan(
        mode=mode, tags=tags, group_size=int(mode_cfg.group_size),
        seed_base=seeds.get(mode),
        turn=TurnSettings(action_sep=str(ap.get("action_sep", "||")),
                          max_actions_per_turn=int(ap.get("max_actions_per_turn", 5)),
                          enable_think=bool(ap.get("enable_think", True)),
                          max_context_window=-1 if window is None else int(window),
                          format_penalty=float(es.get("format_penalty", -0.1))),
        max_turn=int(ap.get("max_turn", 5)),
        grouping=str(rn.get("grouping", "state")), method=str(rn.get("method", "identity")),
        use_turn_scores=bool(ap.get("use_turn_scores", False)),
        filter_groups=enable, max_num_gen_batches=max_batches,
        on_budget_exhausted=str(col.get("on_budget_exhausted", "raise")),
        target_groups=col.get("target_groups"),
        collector_mode=str(col.get("mode", "lockstep")),
        pool=pool_settings(cfg),
        policy=policy_options(tp.get("policy") or {}),
        async_settings=_async_settings(col),
    )


def _async_settings(col: Mapping[str, Any]) -> AsyncSettings:
    defaults = AsyncSettings()
    try:
        return AsyncSettings(
            max_batch=col.get("max_batch", defaults.max_batch),
            max_wait_s=float(col.get("max_wait_s", defaults.max_wait_s)),
            policy_workers=int(col.get("policy_workers", defaults.policy_workers)))
    except ValueError as exc:
        raise ConfigError(f"turnpool.collector: {exc}") from exc


def policy_options(section: Mapping[str, Any]) -> dict[str, Any]:
    """``turnpool.policy`` -> ``make_policy``'s dict: the chosen kind's own section, then any
    options given next to ``name`` (switching ``name`` never drags another kind's options)."""
    from turnpool.policies import policy_names

    kinds = set(policy_names())
    name = section.get("name", "oracle")
    if name not in kinds:
        raise ConfigError(f"turnpool.policy.name: unknown policy {name!r}; choose one of "
                          f"{', '.join(sorted(kinds))}")
    own = section.get(name) or {}
    if not isinstance(own, Mapping):
        raise ConfigError(f"turnpool.policy.{name}: expected a mapping of options")
    flat = {k: v for k, v in section.items() if k != "name" and k not in kinds}
    return {"name": name, **own, **flat}


def to_yaml(cfg: DictConfig | Mapping[str, Any]) -> str:
    """The config as YAML, interpolations left as written."""
    return OmegaConf.to_yaml(cfg, resolve=False)
