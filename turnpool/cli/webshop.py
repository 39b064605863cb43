"""``turnpool webshop serve``: run the shop service in the foreground."""

from __future__ import annotations

import click


@click.group()
def webshop() -> None:
    """The local WebShop service."""


@webshop.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind; keep the loopback default unless you mean to share it.")
@click.option("--port", default=0, show_default=True, type=int,
              help="TCP port; 0 picks a free one (printed at start).")
@click.option("--catalog", "catalog_path", default=None, type=click.Path(exists=True),
              help="A catalog .json/.json.gz (default: the bundled one).")
@click.option("--latency-ms", default=0.0, show_default=True, type=float,
              help="Delay each agent-API reply without using CPU, to imitate a remote shop.")
def serve(host: str, port: int, catalog_path: str | None, latency_ms: float) -> None:
    """Serve the shop: HTML for browsers, text/JSON for agents. Ctrl-C stops it."""
    from turnpool.cli.errors import cannot_listen
    from turnpool.webshop.server import serve as run

    def ready(url: str) -> None:
        click.echo(f"webshop serving at {url}  (open {url}/ in a browser)", nl=True)

    try:
        run(host, port, catalog_path, latency_ms, on_ready=ready)
    except OSError as exc:  # e.g. the port is taken
        raise cannot_listen(host, port, exc) from exc
