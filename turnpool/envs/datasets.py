"""Data files for the dataset-backed envs (Countdown, MetaMathQA), read once per process.

RAGEN loads its dataset in every env instance (128 env slots, 128 loads). Here a table is
built once per process for each ``(kind, file, options)`` and every env instance holds only
the small :class:`TableKey`; ``get_state`` snapshots therefore stay tiny and never copy data.
The key includes the file's size and modification time, so an edited file is read again by
envs created afterwards, while envs that already exist keep the table they started with.

Readable files: JSON Lines (``.jsonl``), a JSON list (``.json``), and Parquet (``.parquet``,
needs the optional ``pyarrow``). Bundled files live in ``turnpool/data/``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableKey:
    """Identifies one loaded table: what it is, which file version, and how it was built."""

    kind: str
    path: str
    mtime_ns: int
    size: int
    options: tuple[tuple[str, Any], ...] = ()


_TABLES: dict[TableKey, Any] = {}
_LOCK = threading.Lock()


def bundled_path(name: str) -> Path:
    """Path of a file shipped in ``turnpool/data/``."""
    return Path(str(resources.files("turnpool").joinpath("data", name)))


DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".pq")


def split_file(folder: Path, split: str) -> Path:
    """The data file of ``split`` in a dataset folder, as ``datasets.load_dataset(folder)``
    names splits: the file whose name starts with the split (``test.jsonl``,
    ``test-00000-of-00001.parquet``); a folder with one data file and no split in its name
    holds only ``train``."""
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and p.suffix.lower() in DATA_SUFFIXES)
    named = [p for p in files if p.stem == split or p.stem.startswith((f"{split}-", f"{split}_",
                                                                       f"{split}."))]
    if len(named) == 1:
        return named[0]
    if not named and split == "train" and len(files) == 1:
        return files[0]
    found = ", ".join(p.name for p in files) or "no data files"
    raise FileNotFoundError(
        f"{folder}: expected one data file for split {split!r}, found {found}")


def resolve_path(config: dict[str, Any], aliases: tuple[str, ...], bundled: str,
                 ragen_default: str | None = None, split: str = "train") -> Path:
    """The file named by the first set config key in ``aliases`` (a dataset folder gives its
    file for ``config["split"]``, else ``split``: `split_file`); else ``ragen_default`` (the
    path RAGEN reads when no key is set, relative to the working directory as RAGEN takes it)
    when that file exists; else the bundled file."""
    for key in aliases:
        value = config.get(key)
        if value:
            path = Path(os.fspath(value)).expanduser()
            if path.is_dir():
                return split_file(path, str(config.get("split") or split)).resolve()
            if not path.is_file():
                raise FileNotFoundError(
                    f"{key}={value!r} is not a local file or dataset folder (turnpool reads "
                    "local files only)")
            return path.resolve()
    if ragen_default and Path(ragen_default).is_file():
        logger.info("reading %s (RAGEN's default data path)", ragen_default)
        return Path(ragen_default).resolve()
    return bundled_path(bundled)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL, JSON-list or Parquet file, as dicts."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(
                "reading parquet needs pyarrow: pip install 'turnpool[data]'") from exc
        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
        return rows
    text = path.read_text(encoding="utf-8")
    if suffix == ".json" or text.lstrip().startswith("["):
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of rows")
        return [row for row in data if isinstance(row, dict)]
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
        if isinstance(row, dict):
            out.append(row)
    return out


def table_key(kind: str, path: Path, **options: Any) -> TableKey:
    """The key of ``path`` as it is on disk now, for the given build options."""
    st = path.stat()
    return TableKey(kind, str(path), st.st_mtime_ns, st.st_size, tuple(sorted(options.items())))


def get_table(key: TableKey, build: Callable[[list[dict[str, Any]], dict[str, Any]], Any]) -> Any:
    """The table for ``key``, built by ``build(rows, options)`` on first use in this process
    and shared by every caller afterwards."""
    table = _TABLES.get(key)
    if table is not None:
        return table
    with _LOCK:  # threads of one process wait for the first load instead of repeating it
        table = _TABLES.get(key)
        if table is None:
            rows = read_rows(Path(key.path))
            table = build(rows, dict(key.options))
            _TABLES[key] = table
            logger.debug("loaded %s table from %s (%d rows)", key.kind, key.path, len(rows))
    return table


def loaded_tables() -> dict[TableKey, Any]:
    """A copy of this process's table cache (for tests and diagnostics)."""
    return dict(_TABLES)
