"""Optional dependencies: one way to turn a missing extra into one line that names its fix.

Every optional import in turnpool goes through `require`, so a user who lacks an extra reads
``turnpool serve needs fastapi: pip install 'turnpool[serve]'`` instead of a traceback that
ends in ``ModuleNotFoundError``. The CLI prints a `MissingExtra` as that one line and exits 2.

    >>> from turnpool.extras import MissingExtra, require
    >>> require("json", feature="this doctest", extra="core").__name__
    'json'
    >>> try:
    ...     require("no_such_module_xyz", feature="turnpool serve", extra="serve")
    ... except MissingExtra as e:
    ...     print(e)
    turnpool serve needs no_such_module_xyz: pip install 'turnpool[serve]'

This module imports nothing from turnpool: every floor may use it.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """An optional dependency is not installed; ``str(e)`` is the one line to show."""

    def __init__(self, module: str, feature: str, extra: str) -> None:
        self.module, self.feature, self.extra = module, feature, extra
        super().__init__(f"{feature} needs {module}: pip install 'turnpool[{extra}]'",
                         name=module)


def require(module: str, *, feature: str, extra: str) -> ModuleType:
    """Import ``module`` or raise `MissingExtra` naming ``feature`` and the pip ``extra``.

    Only a missing ``module`` itself (or its top-level package) becomes `MissingExtra`; an
    ImportError raised inside an installed module propagates unchanged, so a broken install
    is not mistaken for a missing one.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        if exc.name not in (module, top):
            raise
        raise MissingExtra(top, feature, extra) from exc


__all__ = ["MissingExtra", "require"]
