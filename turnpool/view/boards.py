"""Boards as PNG images: whatever the episode's env offers, else nothing (the page shows the
observation text either way).

Two ways, tried in order:

1. the env class's ``frame_from_obs(text, env_kwargs)`` hook (Sokoban's): the frame is drawn
   from the observation text alone;
2. an env whose class lists ``"rgb_array"`` in ``metadata["render_modes"]``: the episode is
   replayed in this process (reset with its seed, then the executed actions, with the file's
   kwargs or the registered defaults) and ``render("rgb_array")`` drawn, but only if every
   observation on the way equals the file's, so a board never shows a state the agent did
   not see.

Only envs registered by name are built: a file names its env as text, and a
``"module:Class"`` in a file must not import code. The PNG is written here (zlib, no imaging
library).

    >>> import numpy as np
    >>> png = png_bytes(np.zeros((2, 3, 3), dtype=np.uint8))
    >>> png[:8] == b"\\x89PNG\\r\\n\\x1a\\n", int.from_bytes(png[16:20], "big")
    (True, 3)
"""

from __future__ import annotations

import logging
import struct
import zlib
from typing import Any

import numpy as np

from turnpool.envs.base import TextEnv
from turnpool.envs.registry import make, registered, resolve
from turnpool.view.files import Episode

log = logging.getLogger(__name__)

#: largest frame turned into a PNG (pixels), so one odd env cannot stall the page
MAX_PIXELS = 4096 * 4096
#: longest observation text handed to an env's frame hook
MAX_OBS_CHARS = 100_000


def png_bytes(frame: np.ndarray) -> bytes:
    """An ``(h, w, 3)`` or ``(h, w)`` uint8 array as PNG (8-bit RGB or grey, no filter)."""
    a = np.ascontiguousarray(frame)
    if a.dtype != np.uint8:
        a = np.clip(a, 0, 255).astype(np.uint8)
    if a.ndim == 3 and a.shape[2] == 4:
        a = np.ascontiguousarray(a[:, :, :3])
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] != 3):
        raise ValueError(f"not an image: shape {a.shape}")
    h, w = a.shape[:2]
    colour = 2 if a.ndim == 3 else 0
    rows = np.concatenate([np.zeros((h, 1), np.uint8), a.reshape(h, -1)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)) + chunk(b"IEND", b""))


def env_class(env_type: str | None) -> type[TextEnv] | None:
    """The class of a registered env name (None for anything else)."""
    if not env_type or env_type not in registered():
        return None
    try:
        return resolve(env_type)[0]
    except Exception as exc:  # noqa: BLE001 - a missing extra, a broken user env: no board
        log.debug("no board for %s: %s", env_type, exc)
        return None


def board_way(episode: Episode) -> str | None:
    """How this episode's boards are drawn: ``"hook"``, ``"replay"`` or None."""
    cls = env_class(episode.env_type)
    if cls is None:
        return None
    if cls.frame_from_obs is not None:
        return "hook"
    modes = cls.metadata.get("render_modes") or ()
    if "rgb_array" in modes and episode.seed is not None:
        return "replay"
    return None


def board(episode: Episode, k: int) -> bytes | None:
    """The PNG of the ``k``-th observation of ``episode`` (``k == len(steps)``: the last),
    or None where the env offers none."""
    observations = episode.observations()
    if not 0 <= k < len(observations):
        return None
    way = board_way(episode)
    try:
        frame = _hooked(episode, observations[k]) if way == "hook" else None
        if frame is None and _replayable(episode):
            frame = _replayed(episode, k)  # also a text its hook cannot read (coord formats)
    except Exception as exc:  # noqa: BLE001 - env code on file content: no board, not a 500
        log.debug("no board for episode %s turn %s: %s", episode.id, k, exc)
        return None
    if frame is None or frame.size == 0 or frame.shape[0] * frame.shape[1] > MAX_PIXELS:
        return None
    return png_bytes(frame)


def _replayable(episode: Episode) -> bool:
    cls = env_class(episode.env_type)
    return (cls is not None and episode.seed is not None
            and "rgb_array" in (cls.metadata.get("render_modes") or ()))


def _hooked(episode: Episode, obs: str) -> np.ndarray | None:
    """The hook's frame, or None where the text is too long or not one the hook reads."""
    if len(obs) > MAX_OBS_CHARS:
        return None
    cls = env_class(episode.env_type)
    hook = None if cls is None else cls.frame_from_obs
    if hook is None:
        return None
    try:
        frame = hook(obs, episode.env_kwargs)
    except (ValueError, KeyError):
        return None
    return None if frame is None else np.asarray(frame)


def _replayed(episode: Episode, k: int) -> np.ndarray | None:
    """Replay to the ``k``-th observation and draw it, or None if the replay disagrees."""
    assert episode.env_type is not None
    observations = episode.observations()
    env: Any = make(episode.env_type, **episode.env_kwargs)
    try:
        obs, _ = env.reset(seed=episode.seed)
        if str(obs) != observations[0]:
            return None
        for j, step in enumerate(episode.steps[:k]):
            for action in step.executed:
                obs = env.step(action)[0]
            if str(obs) != observations[j + 1]:
                return None
        return np.asarray(env.render("rgb_array"))
    finally:
        env.close()


__all__ = ["board", "board_way", "env_class", "png_bytes"]
