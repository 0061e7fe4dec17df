"""Length-prefixed frames: a 4-byte big-endian length, then a serialized Frame.

The decoder is incremental and bounded: a length above ``max_frame`` is
rejected before a byte of the body is buffered, so a hostile peer cannot make
us allocate what it announces.
"""

from __future__ import annotations

import struct

from google.protobuf.message import DecodeError

from npumanager.errors import FrameTooLarge, ProtocolError
from npumanager.proto.v1.wire_pb2 import Frame

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 1 << 20  # 1 MiB: big tensors go through shared memory, not frames.

REQUEST = Frame.REQUEST
REPLY = Frame.REPLY
ERROR = Frame.ERROR
PUSH = Frame.PUSH


def encode(frame: Frame) -> bytes:
    body = frame.SerializeToString()
    return HEADER.pack(len(body)) + body


def parse_frame(body: bytes) -> Frame:
    frame = Frame()
    try:
        frame.ParseFromString(body)
    except DecodeError as exc:
        raise ProtocolError(f"malformed frame ({len(body)} bytes): {exc}") from None
    if frame.kind not in (REQUEST, REPLY, ERROR, PUSH):
        raise ProtocolError(f"frame has unknown kind {frame.kind}")
    if frame.n_fds > 253:  # SCM_MAX_FD
        raise ProtocolError(f"frame claims {frame.n_fds} fds; at most 253 can travel")
    return frame


class FrameDecoder:
    """Splits a byte stream into frame bodies."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= HEADER.size:
            (n,) = HEADER.unpack_from(buf, pos)
            if n > self.max_frame:
                raise FrameTooLarge(f"frame of {n} bytes exceeds the bound of {self.max_frame}")
            if len(buf) - pos - HEADER.size < n:
                break
            start = pos + HEADER.size
            out.append(bytes(buf[start : start + n]))
            pos = start + n
        if pos:
            del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)
