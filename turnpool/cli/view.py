"""``turnpool view PATH``: a web page over a file turnpool wrote, on 127.0.0.1.

    turnpool rollout --out t.jsonl --record run.jsonl.gz
    turnpool view t.jsonl                 # episodes, turn by turn; groups side by side
    turnpool view run.jsonl.gz --port 0   # a record; "Replay and compare" finds a divergence
    turnpool rollout turnpool.collector.tree.mode=best_of_n --tree-out tree.jsonl
    turnpool view tree.jsonl --env sokoban

The kind of file is told from its content (`turnpool.view.files`). It needs the ``serve``
extra (fastapi, uvicorn); without it, one line names the extra.
"""

from __future__ import annotations

import click

from turnpool.cli.errors import EXIT_USAGE, UserError

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
def view(path: str, port: int, env: str | None) -> None:
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
