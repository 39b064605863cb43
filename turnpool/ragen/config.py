"""Configuration: RAGEN's YAML keys as they are, plus turnpool's own, validated.

``load_config(path, overrides)`` stacks, bottom to top: the packaged ``configs/base.yaml``
(RAGEN's defaults for the sections turnpool reads, and turnpool's keys), the packaged
``configs/envs.yaml`` (RAGEN's ``custom_envs``), the user's file (with Hydra-style
``defaults:`` resolved next to it, missing entries such as verl's ``ppo_trainer`` skipped), and
``key=value`` overrides.

turnpool owns ``seed``, ``use_parallel_envs``, ``agent_proxy``, ``es_manager``,
``custom_envs``, ``algorithm.filter_groups`` and ``turnpool`` (schema: `turnpool.ragen.schema`).
Everything else (trainer, actor_rollout_ref, critic, data, the rest of algorithm, lora,
ctx_manager, system, ...) is kept untouched and never resolved, so a full RAGEN config whose
``${...}`` interpolations point into verl's own config loads as it is.

`rollout_plan` turns a loaded config into a `turnpool.rollout.settings.RolloutPlan`; this is
where RAGEN's key names meet the rollout's settings, so nothing below this layer reads YAML.

    >>> cfg = load_config(overrides=["es_manager.train.env_groups=2",
    ...                              "es_manager.train.env_configs.n_groups=[2]"])
    >>> plan = rollout_plan(cfg)
    >>> (plan.num_groups, plan.group_size, plan.tags[0].tag)
    (2, 16, 'SimpleSokoban')
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from turnpool.policies import policy_names
from turnpool.ragen.schema import (
    ConfigError,
    ConfigWarning,
    Source,
    check_top_level,
    is_int,
    validate,
)
from turnpool.ragen.version import ragen_version
from turnpool.rollout.settings import (
    DEFAULT_MAX_TOKENS,
    AsyncSettings,
    CollectorSettings,
    RolloutPlan,
    TagSpec,
    TreeSettings,
    TurnSettings,
    collector_mode,
)

if TYPE_CHECKING:
    from turnpool.envs.base import TextEnv

__all__ = ["PACKAGED_DIR", "ConfigError", "ConfigWarning", "load_config", "pool_options",
           "policy_options", "rollout_plan", "to_yaml", "user_sets"]

log = logging.getLogger(__name__)

PACKAGED_DIR = Path(__file__).resolve().parent.parent / "configs"
OVERRIDES_SOURCE = "command-line overrides"
#: ``turnpool.*`` keys that are `turnpool.pool.EnvPool` keyword arguments, passed as set.
POOL_KEYS = ("backend", "num_workers", "mp_context", "step_timeout", "on_error", "fallback",
             "ray_address")


# ------------------------------------------------------------------ loading
def _read_yaml(path: Path) -> DictConfig:
    try:
        cfg = OmegaConf.load(path)
    except yaml.MarkedYAMLError as exc:  # PyYAML's own text spans lines: the cause and where
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML: {type(exc).__name__}: "
                          f"{exc.problem or exc.context}{where}") from exc
    except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {path}: {type(exc).__name__}: "
                          f"{exc}") from exc
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
    strict: bool | None = None,
) -> DictConfig:
    """Load and validate a config (see the module docstring for the layering).

    Unknown keys under RAGEN's sections warn (`ConfigWarning`, naming key and file); with
    ``strict`` (or ``turnpool.strict_config: true`` in any layer, or the environment variable
    ``TURNPOOL_STRICT_CONFIG=1``) they fail. Unknown top-level keys and unknown
    ``turnpool.*`` keys always fail (`turnpool.ragen.schema`).

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
    if strict is None:
        strict = os.environ.get("TURNPOOL_STRICT_CONFIG", "") not in ("", "0") or any(
            OmegaConf.select(layer, "turnpool.strict_config", default=False) is True
            for _, layer in layers)
    for source, layer in layers:
        check_top_level(layer, source)
        validate(layer, source, strict=strict)
    merged = OmegaConf.merge(*(layer for _, layer in layers))
    assert isinstance(merged, DictConfig)
    merged.turnpool.ragen_version = ragen_version(layers[2:])
    where = _where(layers)
    validate(merged, where, resolved=True, strict=strict)
    for mode in ("train", "val"):
        _check_mode(merged, mode, where)
    return merged


def user_sets(path: str | Path | DictConfig | Mapping[str, Any] | None, key: str) -> bool:
    """Whether the user's config (not turnpool's packaged defaults) sets top-level ``key``:
    RAGEN behaves differently without a ``seed`` section, so the facade must know."""
    if path is None:
        return False
    if isinstance(path, (DictConfig, Mapping)):
        return key in path
    return any(key in layer for _, layer in _layers_of(Path(path)))


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
    return int(v) if is_int(v) else DEFAULT_MAX_TOKENS


def pool_options(cfg: DictConfig) -> dict[str, Any]:
    """`EnvPool` keyword arguments: the ``turnpool.*`` pool keys the config sets, with RAGEN's
    parallelism switches mapped to a backend while ``turnpool.backend`` is ``auto``.

    ``agent_proxy.use_parallel_rollout`` -> ``joblib`` with ``parallel_n_jobs`` workers;
    ``es_manager.use_multiprocessing`` -> ``process_pool`` with ``max_workers`` and
    ``sequential_env_types`` (those env types stay in the calling process);
    ``use_parallel_envs: false`` -> ``sequential``; RAGEN v2's ``custom_envs.<tag>.
    parallel_friendly`` with ``max_workers`` > 1 -> ``process`` with that many workers (see
    `_parallel_friendly_workers`). A backend mapped so is still ``auto``'s choice: it falls
    back to sequential when it cannot start (a plain script's unguarded top level starts no
    worker processes) unless ``turnpool.fallback`` says otherwise. Keys left unset take
    EnvPool's defaults.
    """
    tp = _section(cfg, "turnpool") or {}
    ap = _section(cfg, "agent_proxy") or {}
    es = _section(cfg, "es_manager") or {}
    options = {k: tp[k] for k in POOL_KEYS if k in tp}
    if options.get("backend", "auto") != "auto":
        return options
    if ap.get("use_parallel_rollout"):
        options["backend"] = "joblib"
        n_jobs = ap.get("parallel_n_jobs", -1)
        if options.get("num_workers") is None and n_jobs and n_jobs > 0:
            options["num_workers"] = n_jobs
    elif es.get("use_multiprocessing"):
        options["backend"] = "process_pool"
        options["max_workers"] = es.get("max_workers")
        options["sequential_env_types"] = list(es.get("sequential_env_types") or [])
    elif cfg.get("use_parallel_envs") is False:
        options["backend"] = "sequential"
    elif _parallel_friendly_workers(cfg):
        options["backend"] = "process"
        options.setdefault("num_workers", _parallel_friendly_workers(cfg))
    if options.get("backend", "auto") != "auto":  # still auto's choice: fall back as auto does
        options.setdefault("fallback", True)       # (an unguarded script gets no processes)
    return options


def _parallel_friendly_workers(cfg: DictConfig) -> int:
    """RAGEN v2's per-tag thread pools (``custom_envs.<tag>.parallel_friendly`` with
    ``max_workers`` > 1) as one worker count: the most any used tag asks for (0: none asks).
    turnpool runs them on the ``process`` backend: the same envs in parallel, with the
    sequential run's results (v2's threads share the global RNG and differ run to run)."""
    custom = _section(cfg, "custom_envs") or {}
    used = {t for mode in ("train", "val")
            for t in (OmegaConf.select(cfg, f"es_manager.{mode}.env_configs.tags",
                                       default=None) or [])}
    asks = [int(custom[t].get("max_workers") or 1) for t in used
            if t in custom and custom[t].get("parallel_friendly")]
    return max((n for n in asks if n > 1), default=0)


def _reset_takes_mode(env_type: str) -> bool:
    """Whether RAGEN's env of this type reads the manager's mode at reset (WebShop's split):
    such env classes say so with ``ragen_reset_mode = True`` and get ``mode=`` as a kwarg."""
    from turnpool.envs.registry import resolve

    try:
        cls, _ = resolve(env_type)
    except (ImportError, ValueError, KeyError, AttributeError):
        return False  # reported where the env is built
    return bool(cls.ragen_reset_mode)


def _is_ragen_class(env_type: str) -> bool:
    """Whether ``env_type`` is a RAGEN env class run through `turnpool.envs.ragen_adapter`."""
    from turnpool.envs.registry import resolve

    try:
        _, defaults = resolve(env_type)
    except (ImportError, ValueError, KeyError, AttributeError):
        return False
    return "ragen_env" in defaults


def _env_class(env_type: str) -> type[TextEnv] | None:
    """The class ``env_type`` builds (None when it cannot be resolved here: the build says
    why)."""
    from turnpool.envs.registry import resolve

    try:
        cls, _ = resolve(env_type)
    except (ImportError, ValueError, KeyError, AttributeError):
        return None
    return cls


def _instance_numbers(cfg: DictConfig, mode: str) -> list[tuple[dict[str, Any], ...]]:
    """RAGEN v2's per-class instance numbers for ``mode``'s envs, one tuple per tag entry
    (empty where the class is not numbered, `TextEnv.ragen_v2_instance_kwarg`). v2's
    ``LLMAgentProxy`` builds the train manager's envs, then the val manager's, in one
    process, and a class counter runs on across both."""
    custom = _section(cfg, "custom_envs") or {}
    counts: dict[type[TextEnv], int] = {}
    out: list[tuple[dict[str, Any], ...]] = []
    for m in ("train", "val"):
        section = cfg.es_manager.get(m)
        if section is None:
            continue
        size = int(section.group_size)
        n_groups = _n_groups(section, f"es_manager.{m}", lambda _k: "the loaded config")
        for tag, n in zip(section.env_configs.tags, n_groups):
            cls = _env_class(str(custom[tag]["env_type"]))
            key = cls.ragen_v2_instance_kwarg if cls is not None else None
            members: tuple[dict[str, Any], ...] = ()
            if cls is not None and key is not None:
                first = counts.get(cls, 0)
                members = tuple({key: first + j} for j in range(n * size))
                counts[cls] = first + n * size
            if m == mode:
                out.append(members)
        if m == mode:
            break
    return out


def ragen_defaults(cls: type[TextEnv], version: str) -> dict[str, Any]:
    """The env kwargs under which a RAGEN ``version`` config builds ``cls`` (its dataclass's
    defaults where they differ from the class's own)."""
    return dict(cls.ragen_v2_defaults if version == "v2" else cls.ragen_v1_defaults)


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
    tp = _section(cfg, "turnpool") or {}
    v2 = str(tp.get("ragen_version", "v2")) == "v2"
    numbered = _instance_numbers(cfg, mode) if v2 else []
    tags: list[TagSpec] = []
    for k, (tag, n) in enumerate(zip(es[mode]["env_configs"]["tags"], n_groups)):
        c = custom[tag]
        cls = _env_class(str(c["env_type"]))
        env_kwargs = dict(c.get("env_config") or {})
        if cls is not None:  # the version's dataclass defaults, then the config
            env_kwargs = {**ragen_defaults(cls, "v2" if v2 else "v1"), **env_kwargs}
        if "mode" not in env_kwargs and "split" not in env_kwargs \
                and _reset_takes_mode(str(c["env_type"])):
            env_kwargs["mode"] = mode
        elif mode != "train" and _is_ragen_class(str(c["env_type"])):
            env_kwargs["reset_mode"] = mode  # RAGEN's manager resets its envs with its mode
        tags.append(TagSpec(
            tag=tag, env_type=str(c["env_type"]), n_groups=n,
            env_kwargs=env_kwargs,
            max_actions_per_traj=int(c.get("max_actions_per_traj", 10)),
            env_instruction=c.get("env_instruction"),
            max_tokens=int(c.get("max_tokens") or fallback_tokens),
            grid_vocab=c.get("grid_vocab"), action_lookup=c.get("action_lookup"),
            member_kwargs=numbered[k] if numbered else (),
        ))
    rn = ap.get("reward_normalization") or {}
    fg = _section(cfg, "algorithm.filter_groups") or {}
    col = tp.get("collector") or {}
    seeds = _section(cfg, "seed") or {}
    enable = bool(fg.get("enable", False))
    max_batches = int(fg.get("max_num_gen_batches", 10))
    if enable and max_batches < 1:
        raise ConfigError("algorithm.filter_groups.max_num_gen_batches must be >= 1 when "
                          "filter_groups.enable is true (turnpool never resamples without "
                          "bound)")
    window = ap.get("max_context_window")
    try:
        collector = CollectorSettings(
            max_turn=int(ap.get("max_turn", 5)),
            turn=TurnSettings(action_sep=str(ap.get("action_sep", "||")),
                              max_actions_per_turn=int(ap.get("max_actions_per_turn", 5)),
                              enable_think=bool(ap.get("enable_think", True)),
                              max_context_window=-1 if window is None else int(window),
                              format_penalty=float(es.get("format_penalty", -0.1)),
                              ragen_version=str(tp.get("ragen_version", "v2")),
                              context_window_mode=str(ap.get("context_window_mode", "full"))),
            grouping=str(rn.get("grouping", "state")), method=str(rn.get("method", "identity")),
            use_turn_scores=bool(ap.get("use_turn_scores", False)),
            filter_groups=enable, max_num_gen_batches=max_batches,
            on_budget_exhausted=str(col.get("on_budget_exhausted", "raise")),
            target_groups=col.get("target_groups"), seed_base=seeds.get(mode), mode=mode,
            collector_mode=collector_mode(col.get("mode", "lockstep")),
            async_settings=_async_settings(col), tree=_tree_settings(col))
    except ValueError as exc:  # settings that contradict each other (tree + async)
        raise ConfigError(f"turnpool.collector: {exc}") from exc
    return RolloutPlan(tags=tags, group_size=int(mode_cfg.group_size), collector=collector,
                       pool=pool_options(cfg), policy=policy_options(tp.get("policy") or {}))


def _tree_settings(col: Mapping[str, Any]) -> TreeSettings:
    """``turnpool.collector.tree`` (`turnpool.rollout.settings.TreeSettings`)."""
    tree = col.get("tree") or {}
    keys = ("mode", "width", "prefix_turns", "score")
    try:
        return TreeSettings(**{k: tree[k] for k in keys if k in tree})
    except ValueError as exc:
        raise ConfigError(f"turnpool.collector.tree: {exc}") from exc


def _async_settings(col: Mapping[str, Any]) -> AsyncSettings:
    keys = ("max_batch", "max_wait_s", "policy_workers")
    try:
        return AsyncSettings(**{k: col[k] for k in keys if k in col})
    except ValueError as exc:
        raise ConfigError(f"turnpool.collector: {exc}") from exc


def policy_options(section: Mapping[str, Any]) -> dict[str, Any]:
    """``turnpool.policy`` -> ``make_policy``'s dict: the chosen kind's own section, then any
    options given next to ``name`` (switching ``name`` never drags another kind's options)."""
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
