"""Frames (``rgb_array`` observations) from env workers through shared memory, not pickles.

An env that produces an image writes it into its own shared-memory block (`FrameSlot`, made
once and reused while the frame size stays the same) and reports a small descriptor
``(block name, shape, dtype, sequence number)`` in its ``info``; the reader (the RAGEN facade,
in the driver process) maps the block and copies the frame out (`FrameReader`). Only the
descriptor is pickled between processes; the pixels are copied once, from the block.

The writer owns the block: it is unlinked when the env closes, and by Python's resource
tracker if the worker dies (multiprocessing workers share their parent's tracker, which also
sees the reader's mapping, so neither side leaks or double-unlinks).

Example:
    >>> import numpy as np
    >>> slot = FrameSlot()
    >>> desc = slot.write(np.full((2, 3, 3), 7, dtype=np.uint8))
    >>> reader = FrameReader()
    >>> int(reader.read(desc).sum()), reader.read(desc).shape
    (126, (2, 3, 3))
    >>> reader.close(); slot.close()
"""

from __future__ import annotations

import os
import uuid
from multiprocessing import shared_memory
from typing import Any

import numpy as np

#: ``(block name, shape, dtype string, sequence number)``
FrameDesc = tuple[str, tuple[int, ...], str, int]
#: The ``info`` key that carries a `FrameDesc`.
INFO_KEY = "frame_shm"
#: Frames larger than this are not put in shared memory (bounded resources).
MAX_FRAME_BYTES = 64 * 1024 * 1024


class FrameSlot:
    """The writer side: one reusable shared-memory block per env."""

    def __init__(self) -> None:
        self._shm: shared_memory.SharedMemory | None = None
        self._seq = 0

    def write(self, frame: np.ndarray) -> FrameDesc | None:
        """Copy ``frame`` into the block; its descriptor (None if it is too large)."""
        frame = np.ascontiguousarray(frame)
        if frame.nbytes == 0 or frame.nbytes > MAX_FRAME_BYTES:
            return None
        if self._shm is None or self._shm.size < frame.nbytes:
            self.close()
            name = f"tpf_{os.getpid()}_{uuid.uuid4().hex[:12]}"
            self._shm = shared_memory.SharedMemory(name=name, create=True, size=frame.nbytes)
        np.ndarray(frame.shape, frame.dtype, buffer=self._shm.buf)[...] = frame
        self._seq += 1
        return (self._shm.name, tuple(int(d) for d in frame.shape), frame.dtype.str, self._seq)

    def close(self) -> None:
        """Unlink the block. Idempotent."""
        shm, self._shm = self._shm, None
        if shm is not None:
            shm.close()
            try:
                shm.unlink()
            except FileNotFoundError:
                pass

    def __getstate__(self) -> dict[str, Any]:
        return {"_shm": None, "_seq": self._seq}  # a copy (group members) gets its own block


class FrameReader:
    """The reader side: maps blocks by name (kept open) and copies frames out."""

    def __init__(self) -> None:
        self._open: dict[str, shared_memory.SharedMemory] = {}
        self.bytes_copied = 0

    def read(self, desc: FrameDesc) -> np.ndarray:
        name, shape, dtype, _ = desc
        shm = self._open.get(name)
        if shm is None:
            shm = shared_memory.SharedMemory(name=name, create=False)
            self._open[name] = shm
        view = np.ndarray(shape, np.dtype(dtype), buffer=shm.buf)
        out = view.copy()
        del view
        self.bytes_copied += out.nbytes
        return out

    def close(self) -> None:
        """Unmap every block. Idempotent."""
        for shm in self._open.values():
            try:
                shm.close()
            except BufferError:
                pass
        self._open.clear()
