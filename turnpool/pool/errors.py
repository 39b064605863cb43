"""The pool's exceptions (`turnpool.pool.api` raises them; importable from there too)."""

from __future__ import annotations


class EnvError(RuntimeError):
    """Raised with ``on_error="raise"`` when envs failed; ``errors`` maps env id -> reason."""

    def __init__(self, errors: dict[int, str]) -> None:
        self.errors = dict(errors)
        shown = "; ".join(f"env {i}: {e}" for i, e in list(self.errors.items())[:5])
        more = f" (+{len(self.errors) - 5} more)" if len(self.errors) > 5 else ""
        super().__init__(f"{len(self.errors)} env(s) failed: {shown}{more}")


class EnvConstructionError(ValueError):
    """Envs of the pool could not be built (raised by the constructor, on every backend);
    the message names the env type, tag, kwargs and the cause."""
