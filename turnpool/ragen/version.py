"""Which RAGEN a config is for: v1 (RAGEN-AI/RAGEN 5eb79b8) or v2 (mll-lab-nu/RAGEN 20daedc).

The version a config gets must be the one its user runs (docs/ragen.md, "RAGEN v1 and v2").
`ragen_version` decides from the user's layers (never turnpool's packaged defaults), in order:

1. ``turnpool.ragen_version`` where the user pins it;
2. keys only one RAGEN's configs carry (`V2_MARKERS`, `V1_MARKERS`; both: v2);
3. a config that is not a RAGEN training config (none of the trainer's sections,
   `TRAINER_SECTIONS`: turnpool's own configs, an empty one) is v2, turnpool's default;
4. a RAGEN training config is the installed RAGEN's, when ``ragen`` is importable (RAGEN's
   own loop is calling the manager): v2 ships env packages v1 lacks (`V2_ENV_PACKAGES`);
5. else its whole shape decides: without any of v2's keys it is v1's (v2's ``base.yaml``
   always sets ``collapse_detection``); this is a guess, so it warns once, naming the pin.

    >>> from omegaconf import OmegaConf
    >>> ragen_version([("mine", OmegaConf.create({"collapse_detection": {}}))])
    'v2'
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from turnpool.ragen.schema import ConfigWarning

log = logging.getLogger(__name__)

#: Keys only RAGEN v2 (mll-lab-nu/RAGEN) configs carry, and keys only 5eb79b8-era (v1) ones do.
V2_MARKERS = ("collapse_detection", "log_prob_micro_batch_size_per_gpu",
              "agent_proxy.context_window_mode", "agent_proxy.batch_adjust_mode",
              "custom_envs.*.parallel_friendly", "custom_envs.*.max_workers")
V1_MARKERS = ("use_parallel_envs", "agent_proxy.use_parallel_rollout",
              "agent_proxy.parallel_n_jobs", "es_manager.use_multiprocessing",
              "es_manager.sequential_env_types")
#: Top-level sections of a RAGEN training config (both versions' ``base.yaml``), which
#: turnpool's own configs do not have.
TRAINER_SECTIONS = ("actor_rollout_ref", "ctx_manager", "critic")
#: Env packages under ``ragen/env/`` that RAGEN v2 added (5eb79b8 has none of them).
V2_ENV_PACKAGES = ("sudoku", "search", "deepcoder", "game_2048", "rubikscube")
PIN_HINT = "pin turnpool.ragen_version=v1 or turnpool.ragen_version=v2 to choose"


def has_key(layer: DictConfig, dotted: str) -> bool:
    """Whether ``layer`` sets ``dotted`` (``*`` matches any one key)."""
    head, _, rest = dotted.partition(".")
    if head == "*":
        return any(isinstance(layer[k], DictConfig) and has_key(layer[k], rest)
                   for k in layer)
    if head not in layer:
        return False
    if not rest:
        return True
    node = layer._get_node(head)
    return isinstance(node, DictConfig) and has_key(node, rest)


def installed_ragen() -> str | None:
    """The version of the importable ``ragen`` package (found, not imported), or None."""
    try:
        spec = importlib.util.find_spec("ragen")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    roots = [Path(p) / "env" for p in spec.submodule_search_locations]
    if not any(root.is_dir() for root in roots):
        return None  # some other package named ragen
    return "v2" if any((root / name).is_dir() for root in roots
                       for name in V2_ENV_PACKAGES) else "v1"


def ragen_version(user_layers: Sequence[tuple[str, DictConfig]]) -> str:
    """Which RAGEN's semantics the user's config layers ask for (the module docstring)."""
    pinned = [OmegaConf.select(layer, "turnpool.ragen_version", default=None)
              for _, layer in user_layers]
    pinned = [p for p in pinned if p is not None]
    if pinned:
        return str(pinned[-1])
    v2 = any(has_key(layer, k) for _, layer in user_layers for k in V2_MARKERS)
    v1 = any(has_key(layer, k) for _, layer in user_layers for k in V1_MARKERS)
    if v1 and v2:
        log.info("the config has keys of both RAGEN v1 and v2; using v2 (%s)", PIN_HINT)
    if v1 or v2:
        return "v1" if v1 and not v2 else "v2"
    if not any(section in layer for _, layer in user_layers for section in TRAINER_SECTIONS):
        return "v2"  # turnpool's own config (or none): turnpool's default
    installed = installed_ragen()
    if installed is not None:
        log.info("RAGEN %s is installed here; its semantics apply (%s)", installed, PIN_HINT)
        return installed
    warnings.warn(f"turnpool: this RAGEN training config has none of RAGEN v2's keys, so "
                  f"it is taken as RAGEN v1's (5eb79b8); {PIN_HINT}", ConfigWarning, stacklevel=3)
    return "v1"


__all__ = ["PIN_HINT", "TRAINER_SECTIONS", "V1_MARKERS", "V2_ENV_PACKAGES", "V2_MARKERS",
           "has_key", "installed_ragen", "ragen_version"]
