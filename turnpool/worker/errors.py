"""What a backend raises (`BackendUnavailable`, `WorkerLost`, `EnvBuildError`) and how an
error becomes text a reply may carry (`short_error`, `bounded`: no terminal colours, bounded
length)."""

from __future__ import annotations

import re

#: Cap on the length of an error text carried in ``info["error"]``.
MAX_ERROR_CHARS = 300


class BackendUnavailable(RuntimeError):
    """A backend could not start (missing package, start-method failure, worker import error)."""


class WorkerLost(RuntimeError):
    """A worker died (or was declared dead) before replying."""


class EnvBuildError(RuntimeError):
    """A backend's workers could not build some envs; ``errors`` maps env id -> cause.

    Raised by ``Backend.start`` (never turned into `BackendUnavailable`: the envs, not the
    backend, are broken, so no other backend would do better); the pool names the env type,
    tag and kwargs of the first one.
    """

    def __init__(self, errors: dict[int, str]) -> None:
        self.errors = dict(errors)
        env_id, why = sorted(self.errors.items())[0]
        more = len(self.errors) - 1
        super().__init__(f"env {env_id} could not be built: {why}"
                         + (f" (and {more} more)" if more else ""))



def short_error(exc: BaseException) -> str:
    """``"<ExcType>: message"``, bounded so a huge message cannot bloat replies."""
    return bounded(f"{type(exc).__name__}: {exc}")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def bounded(text: str) -> str:
    """``text`` without terminal colour codes, cut to `MAX_ERROR_CHARS`.

    A long text (a remote traceback) keeps its head and its last line: the last line of a
    traceback names the exception that was finally raised, which is the cause a user needs.
    """
    text = _ANSI.sub("", text)
    if len(text) <= MAX_ERROR_CHARS:
        return text
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    tail = lines[-1][-(MAX_ERROR_CHARS // 2):] if len(lines) > 1 else ""
    head = MAX_ERROR_CHARS - len(tail) - 5
    return text[:head].rstrip() + " ... " + tail if tail else text[: MAX_ERROR_CHARS - 3] + "..."

