"""Shared set-up of the trainer-integration tests (TRL's experimental-API warnings off)."""

from __future__ import annotations

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
