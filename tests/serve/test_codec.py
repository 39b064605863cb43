"""The one WebSocket codec (`turnpool.serve.codec`), alone: frames in any split, the errors a
peer's frames earn, fragments joined, and the handshake."""

from __future__ import annotations

import os

import pytest

from turnpool.serve.codec import (
    OP_BINARY,
    OP_CONT,
    OP_PING,
    OP_TEXT,
    FrameDecoder,
    FrameError,
    MessageAssembler,
    accept_response,
    encode_frame,
    message_text,
    parse_upgrade,
    upgrade_request,
)


@pytest.mark.parametrize("size", [0, 125, 126, 65_535, 65_536])
def test_a_masked_frame_of_any_length_decodes_fed_byte_by_byte_or_whole(size: int) -> None:
    payload = os.urandom(size)
    data = encode_frame(OP_BINARY, payload, mask=os.urandom(4))
    whole = FrameDecoder(max_bytes=2**20).feed(data)
    assert whole == [(True, OP_BINARY, payload)]
    if size <= 126:  # byte by byte: the decoder keeps what it has not used
        decoder = FrameDecoder(max_bytes=2**20)
        got = [f for i in range(len(data)) for f in decoder.feed(data[i:i + 1])]
        assert got == whole


def test_several_frames_in_one_read_come_out_in_order() -> None:
    data = b"".join(encode_frame(OP_TEXT, f"m{i}".encode(), mask=b"\1\2\3\4")
                    for i in range(3))
    assert [p for _, _, p in FrameDecoder(1024).feed(data)] == [b"m0", b"m1", b"m2"]


def test_a_server_reads_only_masked_frames_and_a_client_only_unmasked_ones() -> None:
    with pytest.raises(FrameError) as unmasked:
        FrameDecoder(1024).feed(encode_frame(OP_TEXT, b"hi"))
    assert unmasked.value.code == 1002
    assert FrameDecoder(1024, masked=False).feed(encode_frame(OP_TEXT, b"hi")) == [
        (True, OP_TEXT, b"hi")]
    with pytest.raises(FrameError):
        FrameDecoder(1024, masked=False).feed(encode_frame(OP_TEXT, b"hi", mask=b"abcd"))


def test_an_oversize_frame_or_message_closes_with_1009() -> None:
    with pytest.raises(FrameError) as big:
        FrameDecoder(max_bytes=10).feed(encode_frame(OP_TEXT, b"x" * 11, mask=b"abcd"))
    assert big.value.code == 1009
    parts = MessageAssembler(max_bytes=10)
    assert parts.add(False, OP_TEXT, b"x" * 6) is None
    with pytest.raises(FrameError) as joined:
        parts.add(True, OP_CONT, b"x" * 6)
    assert joined.value.code == 1009


def test_fragments_join_and_control_frames_pass_between_them() -> None:
    parts = MessageAssembler(max_bytes=100)
    assert parts.add(False, OP_TEXT, b"he") is None
    assert parts.add(True, OP_PING, b"p") == (OP_PING, b"p")
    assert parts.add(True, OP_CONT, b"llo") == (OP_TEXT, b"hello")
    with pytest.raises(FrameError):  # a continuation with nothing to continue
        parts.add(True, OP_CONT, b"x")
    assert parts.add(False, OP_TEXT, b"a") is None
    with pytest.raises(FrameError):  # a new message before the last one ended
        parts.add(True, OP_TEXT, b"b")


def test_text_must_be_utf8_and_binary_is_read_leniently() -> None:
    with pytest.raises(FrameError) as bad:
        message_text(OP_TEXT, b"\xff")
    assert bad.value.code == 1007
    assert message_text(OP_BINARY, b"ok\xff") == "ok\ufffd"


def test_the_handshake_round_trips() -> None:
    request = upgrade_request("127.0.0.1", 8000, "dGhlIHNhbXBsZSBub25jZQ==", "/ws?token=t")
    head = request[:request.index(b"\r\n\r\n")]
    path, key, headers, query = parse_upgrade(head) or ("", "", {}, {})
    assert (path, key, query) == ("/ws", "dGhlIHNhbXBsZSBub25jZQ==", {"token": "t"})
    assert headers["host"] == "127.0.0.1:8000"
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in accept_response(key)
    assert parse_upgrade(b"GET /ws HTTP/1.1\r\nHost: x") is None  # not an upgrade
