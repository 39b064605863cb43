"""``turnpool bench envs|pool|rollout|webshop|serve|serve-soak|soak|hol|tokens|sandbox|fork|hubs``:
each benchmark is imported only when run."""

from __future__ import annotations

import click

from turnpool.cli import LazyGroup

# bench name -> "module:attribute" of a click.Command
_BENCHES: dict[str, str] = {
    "envs": "turnpool.bench.envs:command",
    "pool": "turnpool.bench.pool:command",
    "rollout": "turnpool.bench.rollout:command",
    "webshop": "turnpool.bench.webshop:command",
    "serve": "turnpool.bench.serve:command",
    "serve-soak": "turnpool.bench.serve_soak:command",
    "soak": "turnpool.bench.soak:command",
    "hol": "turnpool.bench.hol:command",
    "tokens": "turnpool.bench.tokens:command",
    "sandbox": "turnpool.bench.sandbox:command",
    "ragen-threads": "turnpool.bench.ragen_threads:command",
    "fork": "turnpool.bench.fork:command",
    "hubs": "turnpool.bench.hubs:command",
}


@click.group(cls=LazyGroup, lazy=_BENCHES)
def bench() -> None:
    """Benchmarks: every number is measured side by side in one run."""
