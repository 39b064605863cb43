"""``turnpool serve``: an OpenEnv-compatible server over an env pool, in the foreground.

    turnpool serve --env sokoban                        # 127.0.0.1:8100, process backend
    turnpool serve --config serve.yaml --port 0         # settings from YAML, a free port
    turnpool serve --env sokoban --frontends 2          # two front processes on one port
    turnpool serve --env sokoban --host 0.0.0.0 --allow-remote --token "$TOKEN"  # opt-in only
    turnpool serve --env sokoban --state-dir state/     # sessions survive a restart

Any host other than loopback is refused unless both ``--allow-remote`` and ``--token`` are
given. With ``--state-dir`` every session's seed and actions are journaled there
(``--fsync``: how far to disk, `turnpool.serve.journal`), and a server started again on the
same directory resumes every session first (`turnpool.serve.resume`): clients reconnect
with their session id (``/ws?session_id=ID``, or the ``session_id`` they send over HTTP).

The YAML holds `turnpool.serve.ServeSettings` fields (``env``, ``env_kwargs``, ``backend``,
``num_workers``, ``max_sessions``, ``step_timeout``, ``reset_timeout``, ``session_timeout``,
``http_session_timeout``, ``max_http_sessions``,
``seed``, ``backend_options``, ``frontends``); options given on the command line win.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import click
import yaml

from turnpool.backends import BACKENDS
from turnpool.cli.errors import (
    EXIT_USAGE,
    UserError,
    cannot_listen,
    did_you_mean,
    unknown_env,
)
from turnpool.cli.options import FirstName
from turnpool.worker.defaults import DEFAULT_STEP_TIMEOUT

TOKEN_ENV = "TURNPOOL_SERVE_TOKEN"
#: Not 8000: that is where vLLM and ``transformers serve`` listen by default, and so where
#: the openai policy's examples point.
DEFAULT_PORT = 8100
#: `turnpool.serve.journal.FSYNC_POLICIES` (not imported: that loads the web stack)
FSYNC_POLICIES = ("always", "batch", "never")


def load_settings(config_path: Path | None, overrides: dict[str, Any]) -> Any:
    """`ServeSettings` from an optional YAML file plus the options given on the command line."""
    from turnpool.serve import ServeSettings

    known = {f.name for f in dataclasses.fields(ServeSettings)}
    values: dict[str, Any] = {}
    if config_path is not None:
        if not config_path.is_file():
            raise UserError(f"config file {config_path} does not exist (configs/serve.yaml "
                            "in the repository is an example)", EXIT_USAGE)
        try:
            loaded = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"{config_path}: not YAML: {exc}", EXIT_USAGE) from exc
        if not isinstance(loaded, dict):
            raise UserError(f"{config_path}: expected a mapping of settings", EXIT_USAGE)
        unknown = sorted(set(loaded) - known)
        if unknown:
            hints = ", ".join(f"{k!r}{did_you_mean(str(k), known)}" for k in unknown)
            raise UserError(f"{config_path}: unknown settings {hints}; known: "
                            f"{', '.join(sorted(known))}", EXIT_USAGE)
        values.update(loaded)
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = ServeSettings(**values)
    except (TypeError, ValueError) as exc:
        raise UserError(str(exc), EXIT_USAGE) from exc
    problem = unknown_env(str(settings.env))
    if problem:
        raise UserError(problem, EXIT_USAGE)
    return settings


@click.command()
@click.option("--env", default=None, help="Env name or module:Class  [default: sokoban]")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="YAML file of serve settings.")
@click.option("--backend", type=click.Choice(list(BACKENDS)), default=None,
              help="Pool backend  [default: process]")
@click.option("--workers", "--num-workers", "num_workers", cls=FirstName,
              type=click.IntRange(min=1), default=None,
              help="Pool workers (default: backend's).")
@click.option("--max-sessions", type=int, default=None,
              help="Env slots = sessions held at once; more get a busy answer  [default: 256]")
@click.option("--step-timeout", type=float, default=None,
              help=f"Seconds one env turn may take  [default: {DEFAULT_STEP_TIMEOUT:g}]")
@click.option("--session-timeout", type=float, default=None,
              help="Idle seconds before a WebSocket session is closed  [default: never]")
@click.option("--seed", type=int, default=None, help="Base seed of seedless resets.")
@click.option("--frontends", type=click.IntRange(min=1), default=None,
              help="Front-end processes sharing the port, each serving its share of the "
                   "sessions over its share of the workers  [default: 1]")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind; anything but loopback needs --allow-remote and a token.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int,
              help="TCP port; 0 picks a free one (printed at start).")
@click.option("--allow-remote", is_flag=True, default=False,
              help="Allow binding a non-loopback interface.")
@click.option("--token", default=None,
              help=f"Bearer token every client must send (or set ${TOKEN_ENV}).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Journal every session here and resume the sessions it holds at start: "
                   "a killed or restarted server loses none.")
@click.option("--fsync", type=click.Choice(FSYNC_POLICIES), default="batch",
              show_default=True,
              help="With --state-dir: 'always' syncs each record before its reply (survives "
                   "a machine crash), 'batch' every 0.1 s, 'never' leaves it to the OS; all "
                   "survive a killed server.")
@click.option("--mode", type=click.Choice(("simulation", "production")), default=None,
              help="OpenEnv's server mode: 'production' serves no HTTP /reset, /step or "
                   "/state (MCP and WebSocket sessions only)  [default: simulation]")
def serve(env: str | None, config_path: Path | None, backend: str | None,
          num_workers: int | None, max_sessions: int | None, step_timeout: float | None,
          session_timeout: float | None, seed: int | None, frontends: int | None, host: str,
          port: int, allow_remote: bool, token: str | None, state_dir: Path | None,
          fsync: str, mode: str | None) -> None:
    """Serve envs over OpenEnv's protocol (WebSocket /ws and HTTP); Ctrl-C stops it."""
    from turnpool.serve import check_bind
    from turnpool.serve import serve as run
    from turnpool.serve.journal import JournalError

    token = token or os.environ.get(TOKEN_ENV) or None
    try:
        check_bind(host, token, allow_remote)
    except PermissionError:
        token_hint = f"a token (--token or ${TOKEN_ENV})"
        need = f"--allow-remote and {token_hint}" if not allow_remote else token_hint
        raise UserError(f"--host {host} listens beyond this machine: it needs {need}",
                        EXIT_USAGE) from None
    settings = load_settings(config_path, {
        "env": env, "backend": backend, "num_workers": num_workers,
        "max_sessions": max_sessions, "step_timeout": step_timeout,
        "session_timeout": session_timeout, "seed": seed, "frontends": frontends,
        "mode": mode})

    def ready(url: str) -> None:
        fronts = f" in {settings.frontends} fronts" if settings.frontends > 1 else ""
        click.echo(f"turnpool serve: {settings.env} x {settings.max_sessions} sessions on "
                   f"{settings.backend}{fronts}, at {url}  (OpenEnv: ws{url[4:]}/ws; status page: "
                   f"{url}/)", nl=True)

    def resumed(report: Any) -> None:
        lost = f"; {len(report.lost)} could not be resumed" if report.lost else ""
        click.echo(f"turnpool serve: resumed {report.sessions} sessions from {state_dir} "
                   f"in {report.seconds:.2f} s ({report.episodes} with an episode, "
                   f"{report.turns} turns replayed){lost}", err=True)

    try:
        run(settings, host, port, token, on_ready=ready, allow_remote=allow_remote,
            state_dir=state_dir, fsync=fsync, on_resumed=resumed)
    except JournalError as exc:
        raise UserError(str(exc), EXIT_USAGE) from exc
    except KeyboardInterrupt:  # Ctrl-C: the pool is already closed
        click.echo("turnpool serve: stopped")
    except OSError as exc:
        raise cannot_listen(host, port, exc) from exc
    except (ValueError, LookupError) as exc:  # a value the pool refuses
        raise UserError(str(exc.args[0] if exc.args else exc), EXIT_USAGE) from exc
