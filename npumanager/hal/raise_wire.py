"""What a driver host and npud say about raising a starved background compile (bench/README.md:
``background_starve_ms``; drivers/compile_starve.py, service/host_raise.py):
``hal.request_raise`` (host to npud: raise the compile tree ``(pid, tid)`` from
SCHED_IDLE to nice 0 for one bound; ``tid`` 0: every thread of process ``pid``; a
negative ``tid``: that thread alone, without the processes it forked) and
``hal.raise_applied`` (npud's answer: whether it did, and why not).

Fixed little-endian fields, not protobuf, as hal/rt_wire.py: decoded with their length
checked (a short or long payload is an InvalidArgument, never a partial read).
"""

from __future__ import annotations

import struct

from npumanager.errors import InvalidArgument

REQUEST = "hal.request_raise"
APPLIED = "hal.raise_applied"

_REQUEST = struct.Struct("<ii")  # pid, tid
_APPLIED = struct.Struct("<iiB")  # pid, tid, ok; then why (UTF-8, at most _WHY_MAX bytes)
_WHY_MAX = 200


def encode_request(pid: int, tid: int) -> bytes:
    return _REQUEST.pack(pid, tid)


def decode_request(payload: bytes) -> tuple[int, int]:
    """(pid, tid); InvalidArgument for a payload of the wrong size."""
    if len(payload) != _REQUEST.size:
        raise InvalidArgument(f"{REQUEST} takes {_REQUEST.size} bytes, not {len(payload)}")
    pid, tid = _REQUEST.unpack(bytes(payload))
    return int(pid), int(tid)


def encode_applied(pid: int, tid: int, ok: bool, why: str = "") -> bytes:
    return _APPLIED.pack(pid, tid, 1 if ok else 0) + why.encode("utf-8", "replace")[:_WHY_MAX]


def decode_applied(payload: bytes) -> tuple[int, int, bool, str]:
    """(pid, tid, ok, why); InvalidArgument for a payload too short or too long."""
    if not _APPLIED.size <= len(payload) <= _APPLIED.size + _WHY_MAX:
        raise InvalidArgument(f"{APPLIED} takes {_APPLIED.size}..{_APPLIED.size + _WHY_MAX} "
                              f"bytes, not {len(payload)}")
    pid, tid, ok = _APPLIED.unpack(bytes(payload[:_APPLIED.size]))
    return int(pid), int(tid), bool(ok), bytes(payload[_APPLIED.size:]).decode("utf-8", "replace")


#: Host to npud: watch (or stop watching) the compile tree ``(pid, tid)`` that runs in the
#: host itself (service/host_compile_watch.py); raises come back as ``APPLIED``.
WATCH = "hal.watch_compile"
_WATCH = struct.Struct("<iiB")  # pid, tid, on


def encode_watch(pid: int, tid: int, on: bool) -> bytes:
    return _WATCH.pack(pid, tid, 1 if on else 0)


def decode_watch(payload: bytes) -> tuple[int, int, bool]:
    """(pid, tid, on); InvalidArgument for a payload of the wrong size."""
    if len(payload) != _WATCH.size:
        raise InvalidArgument(f"{WATCH} takes {_WATCH.size} bytes, not {len(payload)}")
    pid, tid, on = _WATCH.unpack(bytes(payload))
    return int(pid), int(tid), bool(on)
