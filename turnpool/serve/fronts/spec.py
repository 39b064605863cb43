"""What one front process of a multi-front server runs (picklable: it crosses a spawn), and
the port the fronts share."""

from __future__ import annotations

import dataclasses
import math
import os
import socket

from turnpool.serve.engine import ServeSettings
from turnpool.serve.fronts.placement import LoadBoard


@dataclasses.dataclass(frozen=True)
class FrontSpec:
    """What front ``index`` of ``count`` runs (picklable: it crosses a spawn)."""

    index: int
    count: int
    settings: ServeSettings
    host: str
    port: int
    token: str | None
    directory: str
    #: ``--state-dir``: each front journals its sessions in ``front<k>/`` of it
    state_dir: str | None = None
    fsync: str = "batch"

    def http_path(self, k: int) -> str:
        """Front ``k``'s private HTTP socket (requests proxied to it)."""
        return os.path.join(self.directory, f"front{k}.http")

    def fd_path(self, k: int) -> str:
        """Front ``k``'s datagram socket (connections passed to it)."""
        return os.path.join(self.directory, f"front{k}.fd")

    @property
    def journal_dir(self) -> str | None:
        """Where this front journals its sessions (None: nowhere)."""
        if self.state_dir is None:
            return None
        return os.path.join(self.state_dir, f"front{self.index}")

    @property
    def loads_path(self) -> str:
        return LoadBoard.path_in(self.directory)


def front_settings(settings: ServeSettings, index: int, count: int) -> ServeSettings:
    """Front ``index``'s share: ``max_sessions`` and the HTTP cap split evenly (rounded up),
    the workers split evenly (one at least; all cores when ``num_workers`` is unset), and the
    slots' seeds those of its block of an undivided server."""
    per = math.ceil(settings.max_sessions / count)
    workers = settings.num_workers or os.cpu_count() or 1
    return dataclasses.replace(
        settings, frontends=1, max_sessions=per, seed=settings.seed + index * per,
        num_workers=max(1, round(workers / count)),
        max_http_sessions=max(1, math.ceil(settings.http_cap() / count)))


def reuse_port_socket(host: str, port: int, listen: bool) -> socket.socket:
    """A TCP socket bound with ``SO_REUSEPORT`` (listening if asked)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


__all__ = ["FrontSpec", "front_settings", "reuse_port_socket"]
