"""The ``turnpool`` command line.

One module per command in this package, each imported only when used, so ``turnpool envs``
does not pay for ray or transformers:

    turnpool rollout [--config F] [key=value ...] [--json F] [--out trajectories.jsonl]
                     [--record run.jsonl.gz]
    turnpool replay run.jsonl.gz [--backend B] [--workers N]
    turnpool envs [--all]
    turnpool bench envs|pool|rollout|webshop [--json F]
    turnpool webshop serve
    turnpool serve --env sokoban [--config F] [--backend B] [--host H --port P]
    turnpool verl-config --env sokoban --out DIR [--train-groups N] [--val-groups M]
    turnpool view trajectories.jsonl|run.jsonl.gz|tree.jsonl [--port P]

Every command runs under `turnpool.cli.errors.user_errors`: a mistake the user can fix (a
missing extra, an unknown env, a config file that is not there) is one ``Error:`` line with the
exit code of docs/reliability.md, the same in every command.
"""

from __future__ import annotations

import click

# command name -> "module:attribute" of a click.Command
_COMMANDS: dict[str, str] = {
    "rollout": "turnpool.cli.rollout:rollout",
    "replay": "turnpool.cli.replay:replay",
    "envs": "turnpool.cli.envs:envs",
    "bench": "turnpool.cli.bench:bench",
    "webshop": "turnpool.cli.webshop:webshop",
    "serve": "turnpool.cli.serve:serve",
    "verl-config": "turnpool.cli.verl_config:verl_config",
    "view": "turnpool.cli.view:view",
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

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        words = [name or ""]
        if isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
            words.append(rest[0])  # `webshop serve`
        ctx.meta["turnpool.command"] = " ".join(words)
        return name, cmd, rest

    def invoke(self, ctx: click.Context) -> object:
        """Run the sub-command; an error a user can fix is one line and its exit code."""
        from turnpool.cli.errors import user_errors

        with user_errors(lambda: str(ctx.meta.get("turnpool.command", ""))):
            return super().invoke(ctx)


_EPILOG = """\b
Examples:
  turnpool rollout                            # Sokoban, oracle policy, auto backend
  turnpool rollout --backend process --workers 4 --policy random --seed 7
  turnpool rollout turnpool.collector.mode=async --json summary.json
  turnpool rollout --record run.jsonl.gz      # then: turnpool replay run.jsonl.gz
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
