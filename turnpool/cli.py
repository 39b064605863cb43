"""The ``turnpool`` command line.

Sub-commands live next to the code they drive and are imported only when used, so
``turnpool envs`` does not pay for ray or transformers:

    turnpool rollout [--config F] [key=value ...] [--json F] [--out trajectories.jsonl]
    turnpool envs
    turnpool bench envs|pool|rollout|webshop [--json F]
    turnpool webshop serve
"""

from __future__ import annotations

import importlib

import click

# command name -> "module:attribute" of a click.Command
_COMMANDS: dict[str, str] = {
    "rollout": "turnpool.rollout_cli:rollout",
    "envs": "turnpool.rollout_cli:envs",
    "bench": "turnpool.cli:bench",
    "webshop": "turnpool.webshop.cli:webshop",
}

# bench name -> "module:attribute" of a click.Command
_BENCHES: dict[str, str] = {
    "envs": "turnpool.bench.envs:command",
    "pool": "turnpool.bench.pool:command",
    "rollout": "turnpool.bench.rollout:command",
    "webshop": "turnpool.bench.webshop:command",
}


class _LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use."""

    def __init__(self, *args: object, lazy: dict[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self._lazy, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self._lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attr = target.partition(":")
        cmd = getattr(importlib.import_module(module), attr)
        assert isinstance(cmd, click.Command)
        return cmd


@click.group(cls=_LazyGroup, lazy=_COMMANDS)
def main() -> None:
    """turnpool: parallel text environments for multi-turn LLM-agent RL."""


@click.group(cls=_LazyGroup, lazy=_BENCHES)
def bench() -> None:
    """Benchmarks: every number is measured side by side in one run."""


if __name__ == "__main__":
    main()
