"""Fixtures for the env tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnpool.envs import datasets


@pytest.fixture
def dataset_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The paths `turnpool.envs.datasets.read_rows` reads during the test, in order."""
    reads: list[Path] = []
    real_read = datasets.read_rows

    def counting_read(p: Path) -> list[dict[str, object]]:
        reads.append(p)
        return real_read(p)

    monkeypatch.setattr(datasets, "read_rows", counting_read)
    return reads
