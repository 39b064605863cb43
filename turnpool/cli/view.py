"""``turnpool view PATH``: a web page over a file turnpool wrote, on 127.0.0.1.

    turnpool rollout --out t.jsonl --record run.jsonl.gz
    turnpool view t.jsonl                 # episodes, turn by turn; groups side by side
    turnpool view run.jsonl.gz --port 0   # a record; "Replay and compare" finds a divergence
    turnpool rollout turnpool.collector.tree.mode=best_of_n --tree-out tree.jsonl
    turnpool view tree.jsonl --env sokoban
    turnpool view t.jsonl --config configs/frozen_lake.yaml   # the kwargs its boards need

The kind of file is told from its content (`turnpool.view.files`). It needs the ``serve``
extra (fastapi, uvicorn); without it, one line names the extra.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import click

from turnpool.cli.errors import EXIT_USAGE, UserError

log = logging.getLogger(__name__)
#: a tag name that may be put into a config override
_TAG = re.compile(r"[A-Za-z0-9_]+")

_EPILOG = """\b
Examples:
  turnpool view trajectories.jsonl
  turnpool view run.jsonl.gz --port 0
  turnpool view tree.jsonl --env sokoban
"""


@click.command(epilog=_EPILOG)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port on 127.0.0.1; 0 picks a free one (the URL is printed).")
@click.option("--env", "env", default=None,
              help="The env of a --tree-out file (tree nodes do not name it); boards are "
                   "drawn only with it.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="The config the rollout ran with (default: the packaged one): the env "
                   "kwargs of a trajectory file's tags, for envs whose boards need a replay.")
def view(path: str, port: int, env: str | None, config_path: str | None = None) -> None:
    """Show PATH (rollout --out .jsonl/.parquet, --record, --tree-out) as a web page."""
    from pathlib import Path

    from turnpool.extras import require

    if not Path(path).is_file():
        raise UserError(f"{path}: no such file", EXIT_USAGE)

    require("fastapi", feature="turnpool view", extra="serve")
    require("uvicorn", feature="turnpool view", extra="serve")
    from turnpool.view.files import ViewError, load
    from turnpool.view.server import serve_view

    try:
        run = load(path, env=env)
    except ViewError as exc:
        raise UserError(str(exc), EXIT_USAGE) from exc
    if run.kind == "rollout":  # trajectories do not carry their env kwargs; the config does
        kwargs = tag_kwargs(config_path, {e.tag for e in run.episodes})
        for e in run.episodes:
            e.env_kwargs = dict(kwargs.get(e.tag, {}))

    def ready(url: str) -> None:
        click.echo(f"turnpool view: {len(run.episodes)} episodes ({run.kind}) of {path} at "
                   f"{url} (Ctrl-C stops)")

    try:
        serve_view(run, port, on_ready=ready)
    except OSError as exc:
        raise UserError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc} "
                        f"(--port 0 picks a free one)", EXIT_USAGE) from exc
    except KeyboardInterrupt:
        pass
    click.echo("turnpool view: stopped")


def tag_kwargs(config_path: str | None, tags: set[str]) -> dict[str, dict[str, Any]]:
    """Each tag's env kwargs as a rollout of ``config_path`` (None: the packaged config)
    builds them; a tag the config does not have, or cannot build, is left out (its boards
    then come from the registered defaults, checked against the file as ever)."""
    from turnpool.ragen.config import ConfigError, load_config, rollout_plan

    out: dict[str, dict[str, Any]] = {}
    try:
        known = set(load_config(config_path).get("custom_envs") or {})
    except (ConfigError, OSError) as exc:
        raise UserError(f"--config {config_path}: {exc}", EXIT_USAGE) from exc
    for tag in sorted(t for t in tags if t in known and _TAG.fullmatch(t)):
        only = [f"es_manager.train.env_configs.tags=[{tag}]", "es_manager.train.env_groups=1",
                "es_manager.train.env_configs.n_groups=[1]"]
        try:
            out[tag] = rollout_plan(load_config(config_path, only), "train").tags[0].env_kwargs
        except Exception as exc:  # noqa: BLE001 - boards are a nicety; the page still works
            log.debug("no env kwargs for tag %s: %s", tag, exc)
    return out
