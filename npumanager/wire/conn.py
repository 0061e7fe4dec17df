"""Asyncio RPC connections over Unix stream sockets, with fd passing.

asyncio's streams cannot carry SCM_RIGHTS, so a connection drives its
non-blocking socket with ``add_reader``/``add_writer`` and ``recvmsg``/
``sendmsg`` itself. Received fds queue up in arrival order; a frame takes its
``n_fds`` from the queue once its last byte is in (the kernel delivers
ancillary data with the first byte of the frame it was sent with, so they are
always there by then).

Received fds are bounded: at most ``max_fds_in_flight`` may wait in the
queue (per connection, and per uid through a shared :class:`FdBudget`), and
after each read every queued fd must be announced by the frame still being
received; any other fd is a ProtocolError that closes the connection and every
fd it sent (a peer must not pin our fd table with fds nobody will take).

One class serves both ends: a server wraps each accepted socket, a client
wraps the socket it connected. Incoming REQUESTs go to a handler table;
a handler may return a value (answered at once, in order) or a coroutine
(answered when it finishes).
"""

from __future__ import annotations

import array
import asyncio
import collections
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

from npumanager.errors import (
    CallerError,
    NpuError,
    ProtocolError,
    ServiceUnavailable,
    error_from_wire,
    error_to_wire,
)
from npumanager.fds import close_fds as close_fds  # re-exported: older imports name it here
from npumanager.paths import not_in_a_directory
from npumanager.proto.v1.wire_pb2 import Hello
from npumanager.wire.calls import (  # re-exported: importers name them here
    CallContext as CallContext,
)
from npumanager.wire.calls import (
    FdBudget as FdBudget,
)
from npumanager.wire.calls import (
    Handler as Handler,
)
from npumanager.wire.calls import (
    HandlerResult as HandlerResult,
)
from npumanager.wire.calls import (
    Payload as Payload,
)
from npumanager.wire.calls import (
    frame_bytes as frame_bytes,
)
from npumanager.wire.framing import (
    DEFAULT_MAX_FRAME,
    ERROR,
    FRAME_HEADER,
    MAX_FDS,
    MIN_BODY,
    PUSH,
    REPLY,
    REQUEST,
    FrameDecoder,
)
from npumanager.wire.unix import ANC_SIZE, RECV_SIZE, Peer, peer_credentials, take_fds

log = logging.getLogger("npumanager.wire")

#: A peer that stops reading gets disconnected once this much is queued for it.
MAX_WRITE_BACKLOG = 32 * 1024 * 1024
#: Queued fd-less frames are merged into one send up to about this many bytes.
GATHER_BYTES = 64 * 1024

_NO_FDS: tuple[int, ...] = ()
_pack_header = FRAME_HEADER.pack


class RpcConnection:
    """One end of an RPC connection driven by the running event loop.

    ``require_hello``: the server's connections accept only ``hello`` until
    :meth:`open_gate` (the handshake) has been called."""

    def __init__(
        self,
        sock: socket.socket,
        handlers: dict[str, Handler],
        *,
        peer: Peer | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        on_close: Callable[[RpcConnection, BaseException | None], None] | None = None,
        name: str = "conn",
        require_hello: bool = False,
        max_fds_in_flight: int = MAX_FDS,
        fd_budget: FdBudget | None = None,
        fd_methods: frozenset[str] | None = None,
        call_timeout: float | None = None,
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.handlers = handlers
        self.peer = peer if peer is not None else peer_credentials(sock)
        self.name = name
        self.max_frame = max_frame
        self.on_close = on_close
        #: Set by the server's handshake (``hello``): what the peer said, and whether it
        #: is an admin. A service keeps its own typed per-connection state, keyed by
        #: the connection.
        self.hello: Hello | None = None
        self.admin = False
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder(max_frame)
        self._fdq: collections.deque[int] = collections.deque()
        self._out: collections.deque[tuple[bytes | memoryview, Sequence[int]]] = (
            collections.deque())
        self._out_bytes = 0
        self._writing = False
        self._next_call = 1
        self._calls: dict[int, asyncio.Future[tuple[bytes, list[int]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self._corked = False
        self._gated = require_hello
        self._closed_evt = asyncio.Event()
        #: Received fds that may wait for their frame (0: this service takes no fds).
        self.max_fds_in_flight = max_fds_in_flight
        self._fd_budget = fd_budget
        #: Methods that may receive fds (None: any; the handler owns what it gets).
        self.fd_methods = fd_methods
        #: A call unanswered this long (at most twice this) closes the connection with
        #: ServiceUnavailable; None waits forever (servers: their peers do not answer calls).
        self.call_timeout = call_timeout
        self._watchdog: asyncio.TimerHandle | None = None
        self._watch_mark = 0
        #: Why the peer said it drops us (an ERROR frame with call id 0), for pending calls.
        self._peer_error: NpuError | None = None
        self._fileno = sock.fileno()
        self._recvmsg = sock.recvmsg
        self._send = sock.send
        self._loop.add_reader(self._fileno, self._on_readable)

    def __repr__(self) -> str:
        return (
            f"<RpcConnection {self.name} uid={self.peer.uid} pid={self.peer.pid} "
            f"calls={len(self._calls)} backlog={self._out_bytes}>"
        )

    def open_gate(self) -> None:
        """The handshake is done: every handler may be called from now on."""
        self._gated = False

    # --- reading --------------------------------------------------------

    def _on_readable(self) -> None:
        if self.closed:
            return
        try:
            data, anc, _flags, _addr = self._recvmsg(RECV_SIZE, ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close(exc)
            return
        if anc and not self._took_fds(anc):
            return
        if not data:
            self.close(None)
            return
        decoder = self._decoder
        # Corked while dispatching: the pushes and replies these frames cause leave in
        # one send (a push + its reply in one wakeup of the peer, not two).
        self._corked = True
        try:
            for kind, call_id, name, payload, n_fds in decoder.frames(data):
                fds = self._frame_fds(n_fds) if n_fds else []
                if kind in (REPLY, ERROR):
                    self._answered(kind, call_id, name, payload, fds)
                else:
                    self._dispatch(kind, call_id, name, payload, fds)
                    if self.closed:
                        return
            if decoder.error is not None:
                raise decoder.error
            if self._fdq and len(self._fdq) > decoder.pending_fds():
                raise ProtocolError(
                    f"{len(self._fdq)} fds arrived that no frame announced "
                    f"({decoder.pending_fds()} may follow with the frame being received)")
        except ProtocolError as exc:
            self._corked = False
            self._protocol_error(exc)
            return
        finally:
            self._corked = False
        if self._out and not self._writing:
            self._flush_now()

    def _took_fds(self, anc: list[tuple[int, int, bytes]]) -> bool:
        """Queue received fds within the bounds; on a breach close (False)."""
        fdq = self._fdq
        before = len(fdq)
        take_fds(anc, fdq)
        got = len(fdq) - before
        budget = self._fd_budget
        if budget is not None:
            budget.used += got
        if len(fdq) > self.max_fds_in_flight:
            what = ("this service takes no fds" if not self.max_fds_in_flight else
                    f"at most {self.max_fds_in_flight} may wait for their frame")
            self._protocol_error(ProtocolError(f"{len(fdq)} fds received: {what}"))
            return False
        if budget is not None and budget.used > budget.limit:
            self._protocol_error(ProtocolError(
                f"uid {self.peer.uid} has {budget.used} fds waiting for their frames; "
                f"the bound is {budget.limit}"))
            return False
        return True

    def _frame_fds(self, n_fds: int) -> list[int]:
        fdq = self._fdq
        if n_fds > len(fdq):
            raise ProtocolError(f"frame announces {n_fds} fds but {len(fdq)} arrived")
        if self._fd_budget is not None:
            self._fd_budget.used -= n_fds
        return [fdq.popleft() for _ in range(n_fds)]

    def _protocol_error(self, exc: ProtocolError) -> None:
        # A malformed frame closes this connection only; tell the peer why.
        log.warning("%s: closing after protocol error: %s", self, exc)
        self._reply_error(0, exc)
        self._flush_now()
        self.close(exc)

    def _answered(self, kind: int, call_id: int, name: str, payload: bytes,
                  fds: list[int]) -> None:
        fut = self._calls.pop(call_id, None)
        if fut is None or fut.done():
            close_fds(fds)
            if kind == ERROR and call_id == 0:
                log.warning("%s: peer reported %s: %s", self, name,
                            payload.decode(errors="replace"))
                self._peer_error = error_from_wire(name, payload.decode(errors="replace"))
            return
        if kind == REPLY:
            fut.set_result((payload, fds))
        else:
            close_fds(fds)
            fut.set_exception(error_from_wire(name, payload.decode(errors="replace")))

    def _dispatch(self, kind: int, call_id: int, method: str, payload: bytes,
                  fds: list[int]) -> None:
        if fds and self.fd_methods is not None and method not in self.fd_methods:
            close_fds(fds)
            raise ProtocolError(f"{method!r} takes no fds; {len(fds)} came with it")
        handler = self.handlers.get(method)
        if handler is None:
            close_fds(fds)
            if kind == REQUEST:
                self._reply_error(call_id, ProtocolError(f"unknown method {method!r}"))
            return
        if self._gated and method != "hello":
            close_fds(fds)
            if kind == REQUEST:
                self._reply_error(call_id, ProtocolError(
                    f"{method!r} before hello: open with the version handshake"))
            return
        try:
            result = handler(CallContext(self, method, fds), payload)
        except BaseException as exc:
            self._handler_failed(kind, call_id, method, exc)
            return
        if not result and (result is None or type(result) is bytes):
            if kind == REQUEST:  # the common empty reply, without the general path
                self._write(_pack_header(MIN_BODY, REPLY, 0, 0, call_id), _NO_FDS)
        elif hasattr(result, "__await__"):
            task = self._loop.create_task(
                self._finish(kind, call_id, method, cast(Awaitable[HandlerResult], result)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif kind == REQUEST:
            self._reply(call_id, result)

    async def _finish(self, kind: int, call_id: int, method: str,
                      aw: Awaitable[HandlerResult]) -> None:
        try:
            result = await aw
        except asyncio.CancelledError:
            if kind == REQUEST and not self.closed:
                self._reply_error(call_id, ServiceUnavailable("call cancelled: shutting down"))
            raise
        except GeneratorExit:
            raise  # the coroutine is being closed (its loop is gone): nobody to answer
        except BaseException as exc:
            self._handler_failed(kind, call_id, method, exc)
            return
        if kind == REQUEST:
            self._reply(call_id, result)

    def _handler_failed(self, kind: int, call_id: int, method: str,
                        exc: BaseException) -> None:
        if not isinstance(exc, NpuError):
            log.exception("%s: handler for %s failed", self, method, exc_info=exc)
        if kind == REQUEST:
            self._reply_error(call_id, exc)
        # a failed push has nobody to answer

    def _reply(self, call_id: int, result: HandlerResult) -> None:
        fds: Sequence[int] = _NO_FDS
        if isinstance(result, tuple):
            result, fds = result
        self._write(frame_bytes(REPLY, call_id, "", result, len(fds), self.max_frame), fds)

    def _reply_error(self, call_id: int, exc: BaseException) -> None:
        etype, msg = error_to_wire(exc)
        data = msg.encode(errors="replace")
        # An error message is for people: cut it rather than exceed the frame bound.
        data = data[: max(0, self.max_frame - MIN_BODY - len(etype) - 16)]
        self._write(frame_bytes(ERROR, call_id, etype, data, 0, self.max_frame), _NO_FDS)

    # --- writing --------------------------------------------------------

    def _write(self, data: bytes, fds: Sequence[int]) -> None:
        """Send one encoded frame now if nothing is queued, else queue it behind."""
        if self.closed:
            return
        if fds or self._corked or self._out:
            self._out.append((data, list(fds) if fds else _NO_FDS))
            self._out_bytes += len(data)
            if self._out_bytes > MAX_WRITE_BACKLOG:
                log.warning("%s: peer is not reading (%d bytes queued); closing", self,
                            self._out_bytes)
                self.close(ServiceUnavailable("peer not reading"))
                return
            if not self._writing and not self._corked:
                self._flush_now()
            return
        try:
            n = self._send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            self._lost_on_send(exc)
            return
        if n < len(data):
            self._out.append((memoryview(data)[n:], _NO_FDS))
            self._out_bytes += len(data) - n
            self._writing = True
            self._loop.add_writer(self._fileno, self._on_writable)

    def _lost_on_send(self, exc: OSError) -> None:
        """The peer is gone. If it said why before closing (a server refusing the
        connection: LimitExceeded), that frame is in our receive queue: read it so
        pending calls get that reason, then close."""
        for _ in range(4):
            if self.closed:
                return
            self._on_readable()
        self.close(exc)

    def _flush_now(self) -> None:
        out = self._out
        while out:
            data, fds = out[0]
            if not fds and len(out) > 1 and not out[1][1]:
                # Consecutive fd-less frames leave in one send: one wakeup of the peer.
                out.popleft()
                parts = [data]
                total = len(data)
                while out and not out[0][1] and total < GATHER_BYTES:
                    d = out.popleft()[0]
                    parts.append(d)
                    total += len(d)
                data = b"".join(parts)
                out.appendleft((data, _NO_FDS))
            try:
                if fds:
                    n = self.sock.sendmsg(
                        [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    )
                else:
                    n = self._send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                self.close(exc)
                return
            self._out_bytes -= n
            if n < len(data):
                if n:  # the fds went with the first byte
                    out[0] = (memoryview(data)[n:], _NO_FDS)
                if not self._writing:
                    self._writing = True
                    self._loop.add_writer(self._fileno, self._on_writable)
                return
            out.popleft()
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self._fileno)

    def _on_writable(self) -> None:
        if not self.closed:
            self._flush_now()

    # --- public API -----------------------------------------------------

    def push(self, method: str, payload: Payload | None = None, fds: Sequence[int] = ()) -> None:
        """Send a one-way message. Never blocks; silently dropped once closed."""
        if self.closed:
            return
        self._write(frame_bytes(PUSH, 0, method, payload, len(fds), self.max_frame), fds)

    async def call(
        self, method: str, payload: Payload | None = None, fds: Sequence[int] = ()
    ) -> tuple[bytes, list[int]]:
        """Call a method on the peer; returns (reply payload, fds) or raises its error."""
        if self.closed:
            raise ServiceUnavailable(f"connection {self.name} is closed")
        call_id = self._next_call
        self._next_call = call_id + 1
        data = frame_bytes(REQUEST, call_id, method, payload, len(fds), self.max_frame)
        fut: asyncio.Future[tuple[bytes, list[int]]] = self._loop.create_future()
        self._calls[call_id] = fut
        if self._watchdog is None and self.call_timeout is not None:
            self._arm_watchdog()
        self._write(data, fds)
        return await fut

    # One timer per connection, not one per call (a timer per call costs more than the
    # rest of a call's bookkeeping): each tick remembers the next call id; a call still
    # pending at the following tick, issued before that mark, has waited a whole period.
    def _arm_watchdog(self) -> None:
        assert self.call_timeout is not None
        self._watch_mark = self._next_call
        self._watchdog = self._loop.call_later(self.call_timeout, self._watchdog_tick)

    def _watchdog_tick(self) -> None:
        self._watchdog = None
        if self.closed or not self._calls:
            return
        oldest = next(iter(self._calls))  # ids are issued in order; dicts keep it
        if oldest < self._watch_mark:
            log.warning("%s: no reply to call %d within %s s; closing", self, oldest,
                        self.call_timeout)
            self.close(ServiceUnavailable(
                f"{self.name}: no reply within {self.call_timeout} s; the connection is "
                f"closed"))
            return
        self._arm_watchdog()

    def close(self, exc: BaseException | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._loop.remove_reader(self._fileno)
            if self._writing:
                self._loop.remove_writer(self._fileno)
        except (ValueError, OSError):
            pass
        self.sock.close()
        if self._fd_budget is not None:
            self._fd_budget.used -= len(self._fdq)
        close_fds(list(self._fdq))
        self._fdq.clear()
        self._out.clear()  # fds queued to send belong to their callers: not closed here
        self._out_bytes = 0
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._calls:
            # Pending calls learn why: the peer's own reason (e.g. LimitExceeded when a
            # server refuses the connection), ours, or that the connection is gone.
            for fut in self._calls.values():
                if not fut.done():
                    fut.set_exception(self._close_error(exc))
        self._calls.clear()
        for task in list(self._tasks):
            task.cancel()
        self._closed_evt.set()
        if self.on_close is not None:
            try:
                self.on_close(self, exc)
            except Exception:
                log.exception("%s: on_close hook failed", self)

    def _close_error(self, exc: BaseException | None) -> NpuError:
        """What pending calls raise: a refusal the caller can act on keeps its type
        (LimitExceeded when a server turns the connection away), anything else is
        ServiceUnavailable with the reason."""
        why = self._peer_error or exc
        if isinstance(why, (CallerError, ServiceUnavailable)):
            return type(why)(str(why))
        return ServiceUnavailable(f"connection {self.name} closed"
                                  + (f": {why}" if why is not None else ""))

    async def wait_closed(self) -> None:
        await self._closed_evt.wait()


async def open_connection(
    path: str,
    handlers: dict[str, Handler] | None = None,
    *,
    max_frame: int = DEFAULT_MAX_FRAME,
    on_close: Callable[[RpcConnection, BaseException | None], None] | None = None,
    name: str = "client",
    connect_timeout: float = 5.0,
    call_timeout: float | None = None,
) -> RpcConnection:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, path), connect_timeout)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        raise ServiceUnavailable(f"nothing is listening at {path}: {exc.strerror}") from None
    except TimeoutError:
        sock.close()
        raise ServiceUnavailable(f"connecting to {path} took over {connect_timeout} s"
                                 ) from None
    except NotADirectoryError:
        sock.close()
        raise ServiceUnavailable(f"cannot connect to {path}: {not_in_a_directory(path)}"
                                 ) from None
    except OSError as exc:
        sock.close()
        raise ServiceUnavailable(f"cannot connect to {path}: {exc}") from None
    return RpcConnection(sock, handlers or {}, max_frame=max_frame, on_close=on_close, name=name,
                         call_timeout=call_timeout)
