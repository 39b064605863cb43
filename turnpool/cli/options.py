"""Options shared by the commands: one spelling each, the old ones kept as hidden aliases.

    >>> import click
    >>> @click.command()
    ... @click.option("--workers", "--num-workers", "workers", cls=FirstName, type=int,
    ...               help="Workers.")
    ... def cmd(workers: int) -> None:
    ...     click.echo(workers)
    >>> from click.testing import CliRunner
    >>> CliRunner().invoke(cmd, ["--num-workers", "3"]).output
    '3\\n'
    >>> "--num-workers" in CliRunner().invoke(cmd, ["--help"]).output
    False
"""

from __future__ import annotations

import click


class FirstName(click.Option):
    """An option whose later spellings are hidden aliases: ``--help`` shows the first only,
    so every command shows one spelling and older scripts keep working."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        opts = self.opts
        self.opts = opts[:1]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = opts
