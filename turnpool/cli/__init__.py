"""The ``turnpool`` command line.

One module per command in this package, each imported only when used, so ``turnpool envs``
does not pay for ray or transformers:

    turnpool rollout [--config F] [key=value ...] [--json F] [--out trajectories.jsonl]
    turnpool envs
    turnpool bench envs|pool|rollout|webshop [--json F]
    turnpool webshop serve
    turnpool serve --env sokoban [--config F] [--backend B] [--host H --port P]
    turnpool verl-config --env sokoban --out DIR [--train-groups N] [--val-groups M]
"""

from __future__ import annotations

import click

# command name -> "module:attribute" of a click.Command
_COMMANDS: dict[str, str] = {
    "rollout": "turnpool.cli.rollout:rollout",
    "envs": "turnpool.cli.envs:envs",
    "bench": "turnpool.cli.bench:bench",
    "webshop": "turnpool.cli.webshop:webshop",
    "serve": "turnpool.cli.serve:serve",
    "verl-config": "turnpool.cli.verl_config:verl_config",
}


class LazyGroup(click.Group):
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
        from turnpool.envs.registry import load_entry_point

        cmd = load_entry_point(target)
        assert isinstance(cmd, click.Command)
        return cmd


_EPILOG = """\b
Examples:
  turnpool rollout                            # Sokoban, oracle policy, auto backend
  turnpool rollout --backend process --workers 4 --policy random --seed 7
  turnpool rollout turnpool.collector.mode=async --json summary.json
  turnpool envs                               # registered envs and RAGEN tags
  turnpool bench pool                         # quick (<= 1 min); --full for the grid
"""


def _version() -> str:
    from turnpool import __version__

    return __version__


@click.group(cls=LazyGroup, lazy=_COMMANDS, epilog=_EPILOG)
@click.version_option(_version(), "--version", "-V", prog_name="turnpool")
def main() -> None:
    """turnpool: parallel text environments for multi-turn LLM-agent RL."""
