"""``turnpool envs``: the registered envs (entry point, actions, defaults) and the packaged
RAGEN task tags, as tables or JSON.

    turnpool envs --json envs.json
    turnpool envs --all          # also the envs turnpool's own tests and benchmarks use
    turnpool envs --hub gem      # GEM's env ids, and whether each runs offline here
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import Any

import click
from omegaconf import OmegaConf
from rich.console import Console

from turnpool.cli.errors import is_test_env, missing_extra
from turnpool.cli.layout import fit, make_table, vertical
from turnpool.envs.registry import registered, resolve
from turnpool.ragen.config import PACKAGED_DIR
from turnpool.rollout.prompts import describe_env

log = logging.getLogger(__name__)


def env_rows(include_test_envs: bool = False) -> list[dict[str, Any]]:
    """One row per registered env: entry point, actions, default keyword arguments; the
    synthetic envs of turnpool's tests and benchmarks only with ``include_test_envs``."""
    rows = []
    for name, spec in sorted(registered().items()):
        if is_test_env(spec.entry_point) and not include_test_envs:
            continue
        row: dict[str, Any] = {"name": name, "entry_point": spec.entry_point}
        try:
            cls, defaults = resolve(name)
        except Exception as exc:  # noqa: BLE001 - an optional env may fail to import any way
            missing = missing_extra(exc, "envs")
            row["error"] = (f"needs {missing.module}: pip install 'turnpool[{missing.extra}]'"
                            if missing else f"{type(exc).__name__}: {exc}")
            rows.append(row)
            continue
        kwargs = {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values()
                  if p.default is not inspect.Parameter.empty}
        kwargs.update(defaults)
        try:
            desc = describe_env(name)
            lookup = desc.action_lookup
            row["actions"] = ([lookup[k] for k in sorted(lookup)] if lookup
                              else list(desc.episode_action_names or []) or None)
        except Exception as exc:  # noqa: BLE001 - a user env may fail to build any way
            row["actions"] = None
            log.debug("cannot describe %s: %s", name, exc)
        row["defaults"] = {k: _plain(v) for k, v in kwargs.items()}
        row["doc"] = (inspect.getdoc(cls) or "").splitlines()[0] if inspect.getdoc(cls) else ""
        rows.append(row)
    return rows


def tag_rows() -> list[dict[str, Any]]:
    """RAGEN task tags shipped in the packaged ``envs.yaml``."""
    custom = OmegaConf.to_container(OmegaConf.load(PACKAGED_DIR / "envs.yaml").custom_envs)
    assert isinstance(custom, dict)
    return [{"tag": tag, "env_type": c.get("env_type"),
             "max_actions_per_traj": c.get("max_actions_per_traj"),
             "env_config": c.get("env_config") or {}} for tag, c in custom.items()]


def _plain(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return repr(v)


@click.command()
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the tables as JSON.")
@click.option("--all", "show_all", is_flag=True, default=False,
              help="Also list the synthetic envs of turnpool's tests and benchmarks "
                   "(cpu, faulty, sleep, trivial).")
@click.option("--hub", "hub_name", default=None, metavar="LIBRARY",
              help="List one library's env ids instead (gem, rg, textarena, skyrl), "
                   "each built and reset offline to say whether it runs here.")
@click.option("--no-check", is_flag=True, default=False,
              help="With --hub: list the ids without building them.")
def envs(json_path: str | None, show_all: bool, hub_name: str | None, no_check: bool) -> None:
    """Registered envs (with their defaults) and the packaged RAGEN task tags."""
    if hub_name is not None:
        _hub_listing(hub_name, json_path, check=not no_check)
        return
    rows, tags = env_rows(show_all), tag_rows()
    console = Console()
    listed = []
    for r in rows:
        if "error" in r:
            listed.append([r["name"], r["entry_point"], "-", f"unavailable: {r['error']}"])
            continue
        defaults = ", ".join(f"{k}={v!r}" for k, v in r["defaults"].items())
        actions = ", ".join(r["actions"]) if r["actions"] else "free text"
        listed.append([r["name"], r["doc"], actions, defaults or "-"])
    # one block per env: long defaults wrap at spaces instead of breaking words in a cell
    console.print(vertical(make_table("registered envs", ["name", "about", "actions",
                                                          "defaults"], listed)))
    ttable = make_table("config tags (custom_envs in the packaged envs.yaml)",
                        ["tag", "env_type", "max actions", "env_config"],
                        [[t["tag"], str(t["env_type"]), str(t["max_actions_per_traj"]),
                          json.dumps(t["env_config"], ensure_ascii=False)] for t in tags],
                        right=["max actions"])
    console.print(fit(console, ttable))
    if json_path:
        Path(json_path).write_text(json.dumps({"envs": rows, "tags": tags}, indent=2,
                                              ensure_ascii=False) + "\n", encoding="utf-8")


def _hub_listing(name: str, json_path: str | None, *, check: bool) -> None:
    """``turnpool envs --hub NAME``: one row per id the library offers."""
    from turnpool.cli.errors import UserError, user_errors
    from turnpool.envs.hub_table import hub
    from turnpool.envs.hubs.base import listing

    try:
        prefix = hub(name).prefix
    except KeyError as exc:
        raise UserError(str(exc.args[0])) from None
    with user_errors("envs"):
        rows = listing(prefix, check=check)
    runs = sum(bool(r.runs) for r in rows)
    table = make_table(f"{prefix}: {runs} of {len(rows)} ids run offline here"
                       if check else f"{prefix}: {len(rows)} ids",
                       ["name", "runs", "why not"],
                       [[r.name, {True: "yes", False: "no", None: "-"}[r.runs], r.reason]
                        for r in rows])
    console = Console()
    console.print(fit(console, table))
    if json_path:
        Path(json_path).write_text(json.dumps([vars(r) for r in rows], indent=2,
                                              ensure_ascii=False) + "\n", encoding="utf-8")
