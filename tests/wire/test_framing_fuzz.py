"""Fuzz the frame decoder: random bytes in random chunks raise only ProtocolError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumanager.errors import FrameTooLarge, ProtocolError
from npumanager.proto.v1.wire_pb2 import Frame
from npumanager.wire.framing import (
    ERROR,
    PUSH,
    REPLY,
    REQUEST,
    FrameDecoder,
    WireFrame,
    encode,
    parse_frame,
)

MAX = 4096


def _feed_all(data: bytes, cuts: list[int]) -> list[bytes]:
    dec = FrameDecoder(MAX)
    bodies: list[bytes] = []
    pos = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        bodies.extend(dec.feed(data[pos:cut]) if cut > pos else [])
        pos = max(pos, cut)
    return bodies


def _frames_all(data: bytes, cuts: list[int]) -> list[WireFrame]:
    """The connections' path: FrameDecoder.frames, raising a deferred error at the end."""
    dec = FrameDecoder(MAX)
    got: list[WireFrame] = []
    pos = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut > pos:
            got.extend(WireFrame(*f) for f in dec.frames(data[pos:cut]))
            if dec.error is not None:
                raise dec.error
        pos = max(pos, cut)
    return got


@settings(max_examples=120, deadline=None)
@given(st.binary(max_size=2048), st.lists(st.integers(min_value=0, max_value=4096), max_size=8))
def test_random_bytes_raise_only_protocol_errors(data: bytes, cuts: list[int]) -> None:
    try:
        for body in _feed_all(data, cuts):
            parse_frame(body)
    except ProtocolError:
        pass
    try:
        _frames_all(data, cuts)
    except ProtocolError:
        pass


frames = st.builds(
    WireFrame,
    kind=st.sampled_from([REQUEST, REPLY, ERROR, PUSH]),
    call_id=st.integers(min_value=0, max_value=(1 << 64) - 1),
    method=st.text(max_size=20),
    payload=st.binary(max_size=300),
    n_fds=st.integers(min_value=0, max_value=253),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(frames, max_size=6), st.lists(st.integers(min_value=0, max_value=8192),
                                              max_size=10))
def test_valid_frames_survive_any_chunking(fs: list[WireFrame], cuts: list[int]) -> None:
    data = b"".join(encode(f) for f in fs)
    assert [parse_frame(b) for b in _feed_all(data, cuts)] == fs
    assert _frames_all(data, cuts) == fs


@settings(max_examples=100, deadline=None)
@given(st.lists(frames, min_size=1, max_size=4), st.integers(min_value=0, max_value=10_000),
       st.binary(min_size=1, max_size=64))
def test_corrupting_a_valid_stream_raises_only_protocol_errors(
        fs: list[WireFrame], at: int, junk: bytes) -> None:
    data = bytearray(b"".join(encode(f) for f in fs))
    at %= len(data)
    data[at:at + len(junk)] = junk
    try:
        for body in _feed_all(bytes(data), [at, at + 3]):
            parse_frame(body)
    except ProtocolError:
        pass
    try:
        _frames_all(bytes(data), [at, at + 3])
    except ProtocolError:
        pass


def test_protobuf_frame_envelope_still_encodes() -> None:
    """Old callers build a wire_pb2.Frame; encode() writes it in the binary layout."""
    f = parse_frame(encode(Frame(kind=Frame.REQUEST, call_id=7, method="hello",
                                 payload=b"abc", n_fds=2))[4:])
    assert f == WireFrame(REQUEST, 7, "hello", b"abc", 2)
    e = parse_frame(encode(Frame(kind=Frame.ERROR, call_id=3, error_type="InvalidArgument",
                                 error_message="bad ünïcode"))[4:])
    assert (e.kind, e.error_type, e.error_message) == (ERROR, "InvalidArgument", "bad ünïcode")


def test_layout_is_the_documented_one() -> None:
    """wire.proto documents the header byte by byte: keep them in step."""
    data = encode(WireFrame(PUSH, 0x0102030405060708, "m", b"pl", 3))
    assert data == struct.pack(">IBBHQ", 12 + 1 + 2, PUSH, 3, 1, 0x0102030405060708) + b"mpl"


@pytest.mark.parametrize(("body", "match"), [
    (b"\x01\x00\x00", "shorter than its header"),
    (struct.pack(">BBHQ", 9, 0, 0, 1), "unknown kind 9"),
    (struct.pack(">BBHQ", REQUEST, 254, 0, 1), "254 fds"),
    (struct.pack(">BBHQ", REQUEST, 0, 50, 1) + b"abc", "overruns"),
    (struct.pack(">BBHQ", REQUEST, 0, 2, 1) + b"\xff\xfe", "not UTF-8"),
])
def test_each_malformation_is_a_protocol_error(body: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        parse_frame(body)
    with pytest.raises(ProtocolError, match=match):
        FrameDecoder(MAX).frames(struct.pack(">I", len(body)) + body)


def test_oversized_length_is_refused_before_the_body_arrives() -> None:
    dec = FrameDecoder(MAX)
    with pytest.raises(FrameTooLarge):
        dec.frames(struct.pack(">I", MAX + 1))
    assert dec.buffered == 0


def test_good_frames_before_a_bad_one_come_out_first() -> None:
    good = encode(WireFrame(REQUEST, 1, "a", b"x"))
    bad = struct.pack(">I", 12) + struct.pack(">BBHQ", 77, 0, 0, 2)
    dec = FrameDecoder(MAX)
    assert [f[2] for f in dec.frames(good + bad + good)] == ["a"]
    assert isinstance(dec.error, ProtocolError)


def test_a_big_frame_arriving_in_pieces_is_not_rescanned() -> None:
    dec = FrameDecoder(1 << 20)
    data = encode(WireFrame(REPLY, 5, "", b"z" * 300_000))
    head, tail = data[:-10], data[-10:]
    for i in range(0, len(head), 1000):
        assert dec.frames(head[i:i + 1000]) == []
    assert dec.frames(tail) == [(REPLY, 5, "", b"z" * 300_000, 0)]
    assert dec.buffered == 0
