"""Length-prefixed binary frames (the layout is documented in ``proto/v1/wire.proto``).

A frame on the stream is::

    u32 length     big-endian; the bytes after this field (>= 12)
    u8  kind       1 REQUEST, 2 REPLY, 3 ERROR, 4 PUSH
    u8  n_fds      SCM_RIGHTS fds that travel with the frame (0..253)
    u16 name_len   big-endian; length of the name that follows the header
    u64 call_id    big-endian; pairs a REPLY/ERROR with its REQUEST (0 for pushes)
    name           UTF-8: the method (REQUEST, PUSH) or the error type (ERROR)
    payload        the method's protobuf message (or reply), serialized;
                   for ERROR the error message, UTF-8

A fixed header instead of a protobuf envelope around the payload: the payload
is encoded and decoded once, and a frame costs one ``struct`` call each way
(the envelope cost ~2.5 µs per frame per side, measured, on the grant path).

The decoder is incremental and bounded: a length above ``max_frame`` is
rejected before a byte of the body is buffered, so a hostile peer cannot make
us allocate what it announces; every other malformation (unknown kind, too
many fds, a name longer than the frame, a name that is not UTF-8) is a
:class:`ProtocolError`.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, NamedTuple

from npumanager.errors import FrameTooLarge, ProtocolError

if TYPE_CHECKING:
    from npumanager.proto.v1.wire_pb2 import Frame as PbFrame

PROTOCOL_VERSION = 2  # 2: binary frame header (1 was a protobuf Frame envelope)
#: The length prefix alone (what a reader needs before it knows the frame's size).
HEADER = struct.Struct(">I")
#: Length prefix + fixed header.
FRAME_HEADER = struct.Struct(">IBBHQ")
#: The fixed header after the length prefix.
BODY_HEADER = struct.Struct(">BBHQ")
MIN_BODY = BODY_HEADER.size  # 12
DEFAULT_MAX_FRAME = 1 << 20  # 1 MiB: big tensors go through shared memory, not frames.
MAX_FDS = 253  # SCM_MAX_FD
MAX_CALL_ID = (1 << 64) - 1

# The numbers of wire.proto's Frame.Kind (kept for readers that import them from here).
REQUEST = 1
REPLY = 2
ERROR = 3
PUSH = 4
_KINDS = (REQUEST, REPLY, ERROR, PUSH)

#: (kind, call_id, name, payload, n_fds): what the decoder yields, as a plain tuple on the
#: hot path. ``name`` is the method, or the error type of an ERROR frame.
RawFrame = tuple[int, int, str, bytes, int]


class WireFrame(NamedTuple):
    """One decoded frame, with readable field names (tests, tools)."""

    kind: int
    call_id: int
    method: str  # the error type for ERROR frames
    payload: bytes  # the UTF-8 message for ERROR frames
    n_fds: int = 0

    @property
    def error_type(self) -> str:
        return self.method if self.kind == ERROR else ""

    @property
    def error_message(self) -> str:
        return self.payload.decode(errors="replace") if self.kind == ERROR else ""


# Names are a small fixed set per service: encode/decode each once. Bounded so that a
# peer sending ever-new names cannot grow them.
_NAME_BYTES: dict[str, bytes] = {}
_NAME_STR: dict[bytes, str] = {}
_NAME_CACHE_MAX = 512


def name_bytes(name: str) -> bytes:
    b = _NAME_BYTES.get(name)
    if b is None:
        b = name.encode()
        if len(b) > 0xFFFF:
            raise ProtocolError(f"method or error name of {len(b)} bytes is too long")
        if len(_NAME_BYTES) < _NAME_CACHE_MAX:
            _NAME_BYTES[name] = b
    return b


def _name_str(raw: bytes) -> str:
    s = _NAME_STR.get(raw)
    if s is None:
        try:
            s = raw.decode()
        except UnicodeDecodeError:
            raise ProtocolError("frame name is not UTF-8") from None
        if len(_NAME_STR) < _NAME_CACHE_MAX:
            _NAME_STR[raw] = s
    return s


_pack = FRAME_HEADER.pack


def pack(kind: int, call_id: int, name: bytes, payload: bytes, n_fds: int = 0) -> bytes:
    """One frame's bytes (``name`` already encoded, see :func:`name_bytes`)."""
    return _pack(MIN_BODY + len(name) + len(payload), kind, n_fds, len(name), call_id) + \
        name + payload


def encode(frame: WireFrame | PbFrame) -> bytes:
    """Encode a :class:`WireFrame`, or a ``wire_pb2.Frame`` (kept for old callers and tools:
    its error_type/error_message become the name and payload of an ERROR frame)."""
    if isinstance(frame, WireFrame):
        kind, call_id, method, payload, n_fds = frame
    else:
        kind, call_id, n_fds = int(frame.kind), int(frame.call_id), int(frame.n_fds)
        if kind == ERROR:
            method, payload = frame.error_type, frame.error_message.encode()
        else:
            method, payload = frame.method, frame.payload
    if kind not in _KINDS or not 0 <= n_fds <= MAX_FDS or not 0 <= call_id <= MAX_CALL_ID:
        raise ProtocolError(f"cannot encode frame kind={kind} n_fds={n_fds} call_id={call_id}")
    return pack(kind, call_id, name_bytes(method), payload, n_fds)


def _parse_at(data: bytes, start: int, end: int) -> RawFrame:
    """Decode the frame body data[start:end] (the length prefix already checked)."""
    if end - start < MIN_BODY:
        raise ProtocolError(f"frame of {end - start} bytes is shorter than its header")
    kind, n_fds, name_len, call_id = BODY_HEADER.unpack_from(data, start)
    if kind not in _KINDS:
        raise ProtocolError(f"frame has unknown kind {kind}")
    if n_fds > MAX_FDS:
        raise ProtocolError(f"frame claims {n_fds} fds; at most {MAX_FDS} can travel")
    p = start + MIN_BODY + name_len
    if p > end:
        raise ProtocolError(f"frame name of {name_len} bytes overruns the frame")
    name = _name_str(data[start + MIN_BODY : p]) if name_len else ""
    return kind, call_id, name, data[p:end], n_fds


def parse_frame(body: bytes) -> WireFrame:
    """Decode one frame body (the bytes after the length prefix)."""
    return WireFrame(*_parse_at(body, 0, len(body)))


class FrameDecoder:
    """Splits a byte stream into frames.

    :meth:`frames` returns decoded frames (the connections' hot path);
    :meth:`feed` returns raw bodies for :func:`parse_frame`. Use one or the other.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._need = 0  # bytes the buffered partial frame needs before it can be decoded
        #: A malformation found after good frames in the same chunk: those are returned
        #: first, the caller raises this after handling them (see :meth:`frames`).
        self.error: ProtocolError | None = None

    def frames(self, data: bytes) -> list[RawFrame]:
        """Decode every complete frame in ``data`` (after what was buffered).

        Raises ProtocolError (FrameTooLarge for an oversized announced length)
        when the first bad frame comes before any good one; otherwise returns the
        good ones and leaves the error in :attr:`error`."""
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return []  # a big frame still arriving: no rescanning, no copies
            data = bytes(buf)
            buf.clear()
        out: list[RawFrame] = []
        end = len(data)
        pos = 0
        unpack = HEADER.unpack_from
        try:
            while end - pos >= 4:
                (n,) = unpack(data, pos)
                if n > self.max_frame:
                    raise FrameTooLarge(
                        f"frame of {n} bytes exceeds the bound of {self.max_frame}")
                stop = pos + 4 + n
                if stop > end:
                    break
                out.append(_parse_at(data, pos + 4, stop))
                pos = stop
        except ProtocolError as exc:
            if not out:
                raise
            self.error = exc
            return out
        if pos < end:
            buf += memoryview(data)[pos:]
            self._need = 4 + HEADER.unpack_from(data, pos)[0] if end - pos >= 4 else 4
        return out

    def feed(self, data: bytes) -> list[bytes]:
        """Split ``data`` into frame bodies (bounds checked, bodies not decoded)."""
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

    def pending_fds(self) -> int:
        """How many fds the partial frame buffered here may still take: the ``n_fds`` its
        header announces, :data:`MAX_FDS` while that header is incomplete (not known
        yet), 0 when nothing is buffered. Received fds beyond this were announced by no
        frame (see RpcConnection)."""
        buf = self._buf
        if not buf:
            return 0
        if len(buf) < FRAME_HEADER.size:
            return MAX_FDS
        # A header claiming more is refused once its frame is complete; until then it
        # must not widen the bound (found by fuzzing).
        return min(int(buf[5]), MAX_FDS)
