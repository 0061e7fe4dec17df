"""What a driver host and npud say about a burst thread's SCHED_FIFO (bench/README.md: "Real-time
foreground threads"): ``hal.request_rt`` (host to npud: put my thread ``tid`` at FIFO
``priority``) and ``hal.rt_applied`` (npud's answer: whether it did, and why not).

Fixed little-endian fields, not protobuf: two integers each way, decoded with their
length checked (a short or long payload is an InvalidArgument, never a partial read).
"""

from __future__ import annotations

import struct

from npumanager.errors import InvalidArgument

REQUEST = "hal.request_rt"
APPLIED = "hal.rt_applied"

_REQUEST = struct.Struct("<iI")  # tid, priority
_APPLIED = struct.Struct("<iB")  # tid, ok; then why (UTF-8, at most _WHY_MAX bytes)
_WHY_MAX = 200


def encode_request(tid: int, priority: int) -> bytes:
    return _REQUEST.pack(tid, priority)


def decode_request(payload: bytes) -> tuple[int, int]:
    """(tid, priority); InvalidArgument for a payload of the wrong size."""
    if len(payload) != _REQUEST.size:
        raise InvalidArgument(f"{REQUEST} takes {_REQUEST.size} bytes, not {len(payload)}")
    tid, priority = _REQUEST.unpack(bytes(payload))
    return int(tid), int(priority)


def encode_applied(tid: int, ok: bool, why: str = "") -> bytes:
    return _APPLIED.pack(tid, 1 if ok else 0) + why.encode("utf-8", "replace")[:_WHY_MAX]


def decode_applied(payload: bytes) -> tuple[int, bool, str]:
    """(tid, ok, why); InvalidArgument for a payload too short or too long."""
    if not _APPLIED.size <= len(payload) <= _APPLIED.size + _WHY_MAX:
        raise InvalidArgument(f"{APPLIED} takes {_APPLIED.size}..{_APPLIED.size + _WHY_MAX} "
                              f"bytes, not {len(payload)}")
    tid, ok = _APPLIED.unpack(bytes(payload[:_APPLIED.size]))
    return int(tid), bool(ok), bytes(payload[_APPLIED.size:]).decode("utf-8", "replace")
