"""What one call carries: its payload, its encoded frame, and what its handler gets.

A payload is bytes or a protobuf message; :func:`frame_bytes` encodes one frame
(framing.py) and refuses one over the frame bound; a handler is called with a
:class:`CallContext` (the connection, its verified peer, the fds received with the
call) and returns a :data:`HandlerResult`; received fds count against an
:class:`FdBudget`. Split out of conn.py (580 lines, at the module limit), which
re-exports these names: the connection drives the socket, this module owns the calls'
types.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

from google.protobuf.message import Message

from npumanager.errors import ProtocolError
from npumanager.wire.framing import FRAME_HEADER, MIN_BODY, name_bytes
from npumanager.wire.unix import Peer

if TYPE_CHECKING:
    from npumanager.wire.conn import RpcConnection

Payload: TypeAlias = bytes | Message
#: What a handler returns: a payload, or (payload, fds to send with it).
HandlerResult: TypeAlias = Payload | tuple[Payload, Sequence[int]] | None

_pack_header = FRAME_HEADER.pack


class FdBudget:
    """Received fds not yet handed to a handler, counted across connections (one budget
    per uid on a server): a uid with many connections cannot pin more than ``limit``."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def __repr__(self) -> str:
        return f"<FdBudget {self.used}/{self.limit}>"


class CallContext:
    """What a handler knows about the call: the connection and its verified peer."""

    __slots__ = ("conn", "fds", "method")

    def __init__(self, conn: RpcConnection, method: str, fds: list[int] | None = None) -> None:
        self.conn = conn
        self.method = method
        #: Received fds: the handler owns them and must close them.
        self.fds: list[int] = fds if fds is not None else []

    def __repr__(self) -> str:
        return f"<CallContext {self.method} on {self.conn!r} fds={self.fds}>"

    @property
    def peer(self) -> Peer:
        return self.conn.peer


class Handler(Protocol):
    def __call__(
        self, ctx: CallContext, payload: bytes
    ) -> HandlerResult | Awaitable[HandlerResult]: ...


def _payload_bytes(p: Payload | None) -> bytes:
    if p is None:
        return b""
    if type(p) is bytes:
        return p
    if isinstance(p, Message):
        return p.SerializeToString()
    return bytes(p)


def frame_bytes(kind: int, call_id: int, name: str, payload: Payload | None, n_fds: int,
                max_frame: int) -> bytes:
    """One encoded frame (see framing.py), refusing one larger than ``max_frame``."""
    body = _payload_bytes(payload)
    nb = name_bytes(name) if name else b""
    n = MIN_BODY + len(nb) + len(body)
    if n > max_frame:
        raise ProtocolError(f"outgoing frame of {n + 4} bytes exceeds {max_frame}")
    return _pack_header(n, kind, n_fds, len(nb), call_id) + nb + body
