"""Fuzz the frame decoder: random bytes in random chunks raise only ProtocolError."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from npumanager.errors import ProtocolError
from npumanager.proto.v1.wire_pb2 import Frame
from npumanager.wire.framing import FrameDecoder, encode, parse_frame

MAX = 4096


def _feed_all(data: bytes, cuts: list[int]) -> list[bytes]:
    dec = FrameDecoder(MAX)
    bodies: list[bytes] = []
    pos = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        bodies.extend(dec.feed(data[pos:cut]) if cut > pos else [])
        pos = max(pos, cut)
    return bodies


@settings(max_examples=120, deadline=None)
@given(st.binary(max_size=2048), st.lists(st.integers(min_value=0, max_value=4096), max_size=8))
def test_random_bytes_raise_only_protocol_errors(data: bytes, cuts: list[int]) -> None:
    try:
        for body in _feed_all(data, cuts):
            parse_frame(body)
    except ProtocolError:
        pass


frames = st.builds(
    Frame,
    kind=st.sampled_from([Frame.REQUEST, Frame.REPLY, Frame.ERROR, Frame.PUSH]),
    call_id=st.integers(min_value=0, max_value=(1 << 64) - 1),
    method=st.text(max_size=20),
    payload=st.binary(max_size=300),
    n_fds=st.integers(min_value=0, max_value=253),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(frames, max_size=6), st.lists(st.integers(min_value=0, max_value=8192),
                                              max_size=10))
def test_valid_frames_survive_any_chunking(fs: list[Frame], cuts: list[int]) -> None:
    data = b"".join(encode(f) for f in fs)
    got = [parse_frame(b) for b in _feed_all(data, cuts)]
    assert got == fs


@settings(max_examples=100, deadline=None)
@given(st.lists(frames, min_size=1, max_size=4), st.integers(min_value=0, max_value=10_000),
       st.binary(min_size=1, max_size=64))
def test_corrupting_a_valid_stream_raises_only_protocol_errors(
        fs: list[Frame], at: int, junk: bytes) -> None:
    data = bytearray(b"".join(encode(f) for f in fs))
    at %= len(data)
    data[at:at + len(junk)] = junk
    try:
        for body in _feed_all(bytes(data), [at, at + 3]):
            parse_frame(body)
    except ProtocolError:
        pass
