"""The one WebSocket codec of turnpool (RFC 6455): frames and the opening handshake, for the
server's ``/ws`` path (`turnpool.serve.ws`) and the bench's load client alike.

Only what turnpool speaks: unfragmented frames out, fragmented messages in, no extensions or
subprotocols (clients negotiate without them).

Example:
    >>> data = encode_frame(OP_TEXT, b"hi", mask=b"\\x01\\x02\\x03\\x04")
    >>> decoder = FrameDecoder(max_bytes=1024)
    >>> decoder.feed(data[:3]) + decoder.feed(data[3:])
    [(True, 1, b'hi')]
    >>> accept_key("dGhlIHNhbXBsZSBub25jZQ==")
    's3pPLMBiTxaQ9kYGzzhZRbK+xOo='
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Callable
from urllib.parse import parse_qsl

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
#: The GUID of RFC 6455's handshake (section 1.3)
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

_apply_mask: Callable[[bytes, bytes], bytes] | None
try:  # the C unmasking of the websockets package (a dependency of the serve extra)
    from websockets.speedups import apply_mask as _apply_mask
except ImportError:  # pragma: no cover
    _apply_mask = None


def unmask(data: bytes, mask: bytes) -> bytes:
    """``data`` XOR the 4-byte ``mask``, repeated (masking and unmasking are the same)."""
    if _apply_mask is not None:
        return _apply_mask(data, mask)
    n = len(data)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")


#: `unmask` without its dispatch, for the one-frame path of every served step
_unmask = _apply_mask if _apply_mask is not None else unmask


_HEAD16 = struct.Struct("!BBH").pack
_HEAD64 = struct.Struct("!BBQ").pack


def encode_frame(opcode: int, payload: bytes, mask: bytes | None = None) -> bytes:
    """One unfragmented frame: unmasked (a server's) or masked with ``mask`` (a client's)."""
    n = len(payload)
    mbit = 0x80 if mask is not None else 0
    if n < 126:
        head = bytes((0x80 | opcode, mbit | n))
    elif n < 65536:  # a step's reply (~500 bytes)
        head = _HEAD16(0x80 | opcode, mbit | 126, n)
    else:
        head = _HEAD64(0x80 | opcode, mbit | 127, n)
    if mask is None:
        return head + payload
    return head + mask + (payload if mask == b"\0\0\0\0" else unmask(payload, mask))


def close_frame(code: int) -> bytes:
    return encode_frame(OP_CLOSE, struct.pack("!H", code))


class FrameError(Exception):
    """A frame the peer may not send: ``code`` is the close code to answer with."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class FrameDecoder:
    """Frames from a byte stream fed in pieces: ``feed`` gives each whole frame as
    ``(fin, opcode, payload)`` (unmasked); `FrameError` for one a peer may not send.
    ``masked``: the frames must be masked (a server reading a client) or not (a client)."""

    __slots__ = ("buf", "masked", "max_bytes")

    def __init__(self, max_bytes: int, masked: bool = True) -> None:
        self.max_bytes = max_bytes
        self.masked = masked
        self.buf = b""

    def feed(self, data: bytes) -> list[tuple[bool, int, bytes]]:
        n = len(data)
        if not self.buf and self.masked and n >= 6:  # the common read: one small frame
            b0, b1 = data[0], data[1]
            if b1 & 0x80 and (b1 & 0x7F) == n - 6 < 126 and not b0 & 0x70 and \
                    n - 6 <= self.max_bytes:
                return [(b0 >= 0x80, b0 & 0x0F, _unmask(data[6:], data[2:6]))]
        buf = self.buf + data if self.buf else data
        out: list[tuple[bool, int, bytes]] = []
        i, n = 0, len(buf)
        while n - i >= 2:
            b0, b1 = buf[i], buf[i + 1]
            length, at = b1 & 0x7F, i + 2
            if length == 126:
                if n - at < 2:
                    break
                length, at = int.from_bytes(buf[at:at + 2], "big"), at + 2
            elif length == 127:
                if n - at < 8:
                    break
                length, at = int.from_bytes(buf[at:at + 8], "big"), at + 8
            if bool(b1 & 0x80) != self.masked or b0 & 0x70:  # masking wrong, reserved bits
                raise FrameError(1002)
            if length > self.max_bytes:
                raise FrameError(1009)
            key = 4 if self.masked else 0
            if n - at < key + length:
                break
            payload = buf[at + key:at + key + length]
            if key:
                payload = unmask(payload, buf[at:at + 4])
            i = at + key + length
            out.append((bool(b0 & 0x80), b0 & 0x0F, payload))
        self.buf = buf[i:] if i < n else b""
        return out


class MessageAssembler:
    """Whole messages from frames: fragments joined, control frames passed through.
    ``add`` gives ``(opcode, payload)`` for a complete message or control frame, None while
    a message is incomplete; `FrameError` for a broken sequence or an oversize message."""

    __slots__ = ("max_bytes", "opcode", "parts")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[bytes] = []
        self.opcode = 0

    def add(self, fin: bool, opcode: int, payload: bytes) -> tuple[int, bytes] | None:
        if opcode >= OP_CLOSE:
            return opcode, payload
        if opcode == OP_CONT:
            if not self.parts:
                raise FrameError(1002)
            self.parts.append(payload)
            if sum(map(len, self.parts)) > self.max_bytes:
                raise FrameError(1009)
            if not fin:
                return None
            whole, self.parts = b"".join(self.parts), []
            return self.opcode, whole
        if self.parts:
            raise FrameError(1002)
        if not fin:
            self.parts, self.opcode = [payload], opcode
            return None
        return opcode, payload


def message_text(opcode: int, payload: bytes) -> str:
    """The text of a data message (binary ones decoded leniently); `FrameError` else."""
    if opcode == OP_TEXT:
        try:
            return payload.decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError(1007) from None
    if opcode == OP_BINARY:
        return payload.decode("utf-8", "replace")
    raise FrameError(1002)


# ---------------------------------------------------------------------- the handshake
def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + _WS_GUID).digest()).decode()


UpgradeRequest = tuple[str, str, dict[str, str], dict[str, str]]


def parse_upgrade(head: bytes) -> UpgradeRequest | None:
    """``(path, key, headers, query)`` of a WebSocket upgrade request's head (the bytes
    before the blank line); None when ``head`` is not one."""
    try:
        text = head.decode("latin-1")
        line, *lines = text.split("\r\n")
        method, target, version = line.split(" ")
    except ValueError:
        return None
    path, _, query = target.partition("?")
    if method != "GET" or version != "HTTP/1.1":
        return None
    headers: dict[str, str] = {}
    for h in lines:
        name, sep, value = h.partition(":")
        if not sep:
            return None
        headers.setdefault(name.strip().lower(), value.strip())
    if headers.get("upgrade", "").lower() != "websocket" or \
            "upgrade" not in headers.get("connection", "").lower() or \
            headers.get("sec-websocket-version") != "13" or not headers.get("sec-websocket-key"):
        return None
    return (path, headers["sec-websocket-key"], headers,
            dict(parse_qsl(query, keep_blank_values=True)))


def accept_response(key: str) -> bytes:
    """The server's ``101 Switching Protocols`` answer to a request with ``key``."""
    return ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept_key(key)}\r\n\r\n").encode()


def upgrade_request(host: str, port: int, key: str, path: str = "/ws") -> bytes:
    """A client's upgrade request for ``path`` with ``key`` (base64 of 16 random bytes)."""
    return (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n").encode()


__all__ = ["FrameDecoder", "FrameError", "MessageAssembler", "accept_key", "accept_response",
           "close_frame", "encode_frame", "message_text", "parse_upgrade", "unmask",
           "upgrade_request"]
