"""`load_entry_point`: text (``"package.module:name"``) to the object it names.

A module of its own, below `turnpool.envs.registry` (which re-exports it) so that the modules
the registry calls (`turnpool.envs.ragen_adapter`) resolve names the same way without an
import circle.
"""

from __future__ import annotations

import importlib
from typing import Any


def load_entry_point(entry: str) -> Any:
    """The object an entry point ``"package.module:name"`` names, its module imported now.

    The one place where a name given as text becomes an object: the env registry, RAGEN env
    classes (`turnpool.envs.ragen_adapter`), the backend registry, the policy kinds, tree
    scores, the CLI's lazy commands and ``turnpool``'s lazy public names all resolve here."""
    module_name, _, attr = entry.partition(":")
    # getattr: the attribute's name is data (the entry point's text), not known to the code
    return getattr(importlib.import_module(module_name), attr)
