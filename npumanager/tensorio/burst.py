"""The layout of a burst's shared memory, shared by the client runtime and the driver host.

One sealed memfd per burst (NNAPI's ``ANeuralNetworksBurst``: a request/response
channel for one model, set up once)::

    0                 header (64 bytes, below)
    64                request area:  a serialized ``Execute`` (req_size bytes)
    64 + req_size     response area: an ``ExecuteResult`` or a ``BurstError``
    data_start        tensors: inputs the client wrote, outputs the driver wrote

Header (little-endian): magic, version, then the client's ``req_seq`` and
``req_len``, then the driver's ``resp_seq``, ``resp_status`` and ``resp_len``, then
(at 40) the client's flags, written before it opens the burst: ``FLAG_SAME`` says it
takes a ``SAME`` response (no payload: the outputs lie where its last ``OK`` response
for the same request said; :mod:`npumanager.drivers.burst_fixed`). At 44 and 52 the
client's clock (``CLOCK_MONOTONIC`` ns, the clock the driver's ``time.perf_counter``
reads on Linux) on each request: when the call began and when the request was rung
(written just before ``req_seq``; 0: not stamped). The driver uses them only to
learn the stream's pace (:mod:`npumanager.drivers.anticipate`): a stamp is a hint
about the client's own requests, clamped there, never trusted for anything else.
A side writes its payload first and its sequence number last; the other side
reads the number first. A status may carry MOVED bits (below): the model's grant moved
to the device's other host, its runtime follows (nn/model_move.py). The doorbell
(one byte on a socketpair) is a system call, a full barrier on every architecture;
a client that spins on ``resp_seq`` instead relies on x86's store order and re-reads
the payload only after it saw the number change.

Everything the driver reads from here is checked: lengths against the areas,
the request copied out before it is parsed (the client may change the memory
at any time), tensors bounds-checked as in any pool.
"""

from __future__ import annotations

import struct

from npumanager.tensorio.codec import ALIGN

MAGIC = 0x4E505542  # "NPUB"
VERSION = 1
HEADER = 64
_HDR = struct.Struct("<IIQI")  # magic, version, req_seq, req_len
_REQ = struct.Struct("<QI")  # req_seq, req_len at offset 8
_RESP = struct.Struct("<QII")  # resp_seq, resp_status, resp_len at offset 24
REQ_AT = 8
RESP_AT = 24
FLAGS_AT = 40
_FLAGS = struct.Struct("<I")
CALLED_AT = 44
RUNG_AT = 52
_STAMPS = struct.Struct("<QQ")  # called, rung (CLOCK_MONOTONIC ns; 0: none)

#: Response statuses.
OK = 0
ERROR = 1
SAME = 2
#: Bits the driver ORs into a status while the burst's model's grant has moved to the
#: device's other host (service/grant_moves.py): MOVED, and MOVED_TO_LANE when that is
#: its background lane (else its main host). The answer itself is right all the same.
MOVED = 0x100
MOVED_TO_LANE = 0x200
STATUS_MASK = 0xFF


def moved_bits(lane: str) -> int:
    """The status bits that say the grant moved to ``lane``'s host ("": the main one)."""
    return MOVED | (MOVED_TO_LANE if lane else 0)


def moved_lane(status: int) -> str | None:
    """The lane a status says the grant moved to (None: it did not)."""
    if not status & MOVED:
        return None
    return "background" if status & MOVED_TO_LANE else ""

#: Client flags.
FLAG_SAME = 1

#: Smallest request and response areas a driver accepts.
MIN_AREA = 4096
#: Largest request area a driver accepts. The driver parses a request as one message, and
#: parsing holds the host's GIL all along: 16 MiB held it ~0.16 s, stalling every other
#: uid's executions. Larger inputs go in the data area (as the client puts big tensors).
MAX_REQUEST_AREA = 1 << 20
#: Largest response area a driver accepts (the driver writes it, the client parses it).
MAX_AREA = 16 << 20


def data_start(req_size: int, resp_size: int) -> int:
    """Where tensors begin: after the header and both areas, aligned."""
    end = HEADER + req_size + resp_size
    return (end + ALIGN - 1) // ALIGN * ALIGN


def init_header(buf: bytearray | memoryview | object) -> None:
    _HDR.pack_into(buf, 0, MAGIC, VERSION, 0, 0)  # type: ignore[arg-type]


def read_request_header(buf: object) -> tuple[int, int]:
    """(req_seq, req_len) as the client last wrote them."""
    seq, n = _REQ.unpack_from(buf, REQ_AT)  # type: ignore[arg-type]
    return int(seq), int(n)


def write_request_header(buf: object, seq: int, length: int) -> None:
    # The length first, the sequence number (what the driver looks at) last.
    struct.pack_into("<I", buf, REQ_AT + 8, length)  # type: ignore[arg-type]
    struct.pack_into("<Q", buf, REQ_AT, seq)  # type: ignore[arg-type]


def read_response_header(buf: object) -> tuple[int, int, int]:
    """(resp_seq, resp_status, resp_len) as the driver last wrote them."""
    seq, status, n = _RESP.unpack_from(buf, RESP_AT)  # type: ignore[arg-type]
    return int(seq), int(status), int(n)


def write_response_header(buf: object, seq: int, status: int, length: int) -> None:
    struct.pack_into("<II", buf, RESP_AT + 8, status, length)  # type: ignore[arg-type]
    struct.pack_into("<Q", buf, RESP_AT, seq)  # type: ignore[arg-type]


def write_client_flags(buf: object, flags: int) -> None:
    _FLAGS.pack_into(buf, FLAGS_AT, flags)  # type: ignore[arg-type]


def read_client_flags(buf: object) -> int:
    return int(_FLAGS.unpack_from(buf, FLAGS_AT)[0])  # type: ignore[arg-type]


def write_stamps(buf: object, called_ns: int, rung_ns: int) -> None:
    """The client's clock for the request about to be rung (before its ``req_seq``)."""
    _STAMPS.pack_into(buf, CALLED_AT, called_ns, rung_ns)  # type: ignore[arg-type]


def read_stamps(buf: object) -> tuple[int, int]:
    """(called, rung) as the client wrote them: any two numbers (check before use)."""
    called, rung = _STAMPS.unpack_from(buf, CALLED_AT)  # type: ignore[arg-type]
    return int(called), int(rung)
