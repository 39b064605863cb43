"""Reading the golden RAGEN traces in ``tests/fixtures/ragen`` (recorded from RAGEN's own env
code; see docs/ragen.md for how). Values are stored as JSON with floats tagged
``{"float": x}``, so an int reward and a float reward stay apart; images as a sha256 of the
raw ``uint8`` bytes plus the shape."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ragen"


@cache
def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return data


def tagged(value: Any) -> Any:
    """A value in the fixtures' encoding (floats tagged, arrays hashed)."""
    if isinstance(value, dict):
        return {str(k): tagged(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [tagged(v) for v in value]
    if isinstance(value, np.ndarray):
        return {"image_sha256": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest(),
                "shape": list(value.shape)}
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return {"float": float(value)}
    return value


def untag(value: Any) -> Any:
    """The plain value (floats untagged) for comparisons where the type does not matter."""
    if isinstance(value, dict):
        if set(value) == {"float"}:
            return value["float"]
        return {k: untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untag(v) for v in value]
    return value
