"""Blocking RPC clients for the SDKs, and the async handshake helper.

:class:`SyncRpcClient` sends from the caller's thread. With ``threaded=True``
a reader thread receives replies and server pushes (the manager SDK needs
pushes at any time); with ``threaded=False`` the calling thread reads its own
reply, which saves a thread hand-off per call (the device client's hot path).
If the connection is lost every waiting call raises ServiceUnavailable at once
and later calls raise it too: never a hang.
"""

from __future__ import annotations

import array
import collections
import logging
import socket
import threading
from collections.abc import Callable, Sequence

from npumanager.errors import NpuError, ProtocolError, ServiceUnavailable, error_from_wire
from npumanager.proto.v1.wire_pb2 import Hello, HelloReply
from npumanager.wire.conn import (
    ANC_SIZE,
    RECV_SIZE,
    Payload,
    RpcConnection,
    close_fds,
    frame_bytes,
    open_connection,
    take_fds,
)
from npumanager.wire.framing import (
    DEFAULT_MAX_FRAME,
    ERROR,
    PROTOCOL_VERSION,
    PUSH,
    REPLY,
    REQUEST,
    FrameDecoder,
    RawFrame,
)

log = logging.getLogger("npumanager.wire.client")

PushHandler = Callable[[str, bytes, list[int]], None]


class _Waiter:
    __slots__ = ("done", "error", "fds", "payload")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.payload = b""
        self.fds: list[int] = []
        self.error: NpuError | None = None


class SyncRpcClient:
    def __init__(
        self,
        path: str,
        service: str,
        *,
        client_name: str = "",
        on_push: PushHandler | None = None,
        on_close: Callable[[BaseException | None], None] | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        threaded: bool = True,
        connect_timeout: float = 5.0,
    ) -> None:
        self.path = path
        self.service = service
        self.on_push = on_push
        self.on_close = on_close
        self.threaded = threaded
        self.closed = False
        self._released = False
        self._close_reason: BaseException | None = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(connect_timeout)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise ServiceUnavailable(
                f"no {service} service at {path} ({exc.strerror}); is `npu serve` running?"
            ) from None
        except OSError as exc:
            sock.close()
            raise ServiceUnavailable(f"cannot connect to {path}: {exc}") from None
        sock.settimeout(None)
        self.sock = sock
        self.max_frame = max_frame
        self._decoder = FrameDecoder(max_frame)
        self._pending_error: ProtocolError | None = None
        self._fdq: collections.deque[int] = collections.deque()
        self._send_lock = threading.Lock()
        # Unthreaded mode: one reader at a time (``_pumping``), handed off per batch.
        self._pump_cond = threading.Condition()
        self._pumping = False
        self._lock = threading.Lock()
        self._next_call = 1
        self._waiters: dict[int, _Waiter] = {}
        self._reader: threading.Thread | None = None
        if threaded:
            self._reader = threading.Thread(
                target=self._read_loop, name=f"npu-{service}-reader", daemon=True
            )
            self._reader.start()
        reply = HelloReply()
        try:
            payload, _ = self.call(
                "hello",
                Hello(protocol_version=PROTOCOL_VERSION, service=service, client_name=client_name),
            )
        except BaseException:
            self.close()
            raise
        reply.ParseFromString(payload)
        self.hello = reply

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        n = len(self._waiters)
        return f"<SyncRpcClient {self.service} at {self.path} {state}, {n} waiting>"

    # --- receiving --------------------------------------------------------

    def _recv_some(self) -> list[tuple[RawFrame, list[int]]]:
        if self._pending_error is not None:
            raise self._pending_error
        try:
            data, anc, _f, _a = self.sock.recvmsg(RECV_SIZE, ANC_SIZE)
        except OSError as exc:
            raise ServiceUnavailable(f"connection to {self.service} lost: {exc}") from None
        if anc:
            take_fds(anc, self._fdq)
        if not data:
            raise ServiceUnavailable(f"the {self.service} service closed the connection")
        out = []
        fdq = self._fdq
        frames = self._decoder.frames(data)
        for frame in frames:
            n_fds = frame[4]
            if n_fds > len(fdq):
                raise ProtocolError("frame announces more fds than arrived")
            out.append((frame, [fdq.popleft() for _ in range(n_fds)] if n_fds else []))
        if self._decoder.error is not None:
            # Route the good frames first; the next read reports the error.
            err, self._decoder.error = self._decoder.error, None
            self._pending_error = err
        return out

    def _route(self, frame: RawFrame, fds: list[int]) -> None:
        kind, call_id, name, payload, _n = frame
        if kind in (REPLY, ERROR):
            with self._lock:
                w = self._waiters.pop(call_id, None)
            if w is None:
                close_fds(fds)
                if kind == ERROR:
                    # call_id 0: the server tells us why it is dropping us.
                    self._close_reason = error_from_wire(name, payload.decode(errors="replace"))
                return
            if kind == REPLY:
                w.payload, w.fds = payload, fds
            else:
                close_fds(fds)
                w.error = error_from_wire(name, payload.decode(errors="replace"))
            w.done.set()
        elif kind == PUSH:
            if name == "goodbye":
                why = payload.decode(errors="replace")
                self._close_reason = ServiceUnavailable(
                    f"the {self.service} service is shutting down: {why}"
                )
            if self.on_push is not None:
                try:
                    self.on_push(name, payload, fds)
                except Exception:
                    log.exception("push handler for %s failed", name)
            else:
                close_fds(fds)
        else:
            close_fds(fds)  # a server does not call its clients here

    def _read_loop(self) -> None:
        exc: BaseException | None = None
        try:
            while not self.closed:
                for frame, fds in self._recv_some():
                    self._route(frame, fds)
        except NpuError as e:
            exc = e
        except Exception as e:
            log.exception("reader for %s failed", self.service)
            exc = e
        self._shutdown(self._close_reason or exc)

    def _shutdown(self, exc: BaseException | None) -> None:
        with self._lock:
            if self.closed and not self._waiters:
                return
            was_closed = self.closed
            self.closed = True
            waiters = list(self._waiters.values())
            self._waiters.clear()
        reason = exc if isinstance(exc, NpuError) else ServiceUnavailable(
            f"connection to the {self.service} service lost"
        )
        for w in waiters:
            w.error = reason if isinstance(reason, ServiceUnavailable) else ServiceUnavailable(
                str(reason))
            w.done.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if not was_closed and self.on_close is not None:
            try:
                self.on_close(exc)
            except Exception:
                log.exception("on_close hook failed")

    # --- sending --------------------------------------------------------

    def _send(self, data: bytes, fds: Sequence[int]) -> None:
        with self._send_lock:
            try:
                if fds:
                    n = self.sock.sendmsg(
                        [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    )
                    if n < len(data):
                        self.sock.sendall(data[n:])
                else:
                    self.sock.sendall(data)
            except OSError as exc:
                raise ServiceUnavailable(f"connection to {self.service} lost: {exc}") from None

    def push(self, method: str, payload: Payload | None = None, fds: Sequence[int] = ()) -> None:
        if self.closed:
            raise self._unavailable()
        self._send(frame_bytes(PUSH, 0, method, payload, len(fds), self.max_frame), fds)

    def _unavailable(self) -> ServiceUnavailable:
        why = f": {self._close_reason}" if self._close_reason else ""
        return ServiceUnavailable(f"not connected to the {self.service} service{why}")

    def call(
        self,
        method: str,
        payload: Payload | None = None,
        fds: Sequence[int] = (),
        timeout: float | None = None,
    ) -> tuple[bytes, list[int]]:
        """Call ``method``; returns (reply payload, received fds) or raises the peer's error."""
        w = _Waiter()
        with self._lock:
            if self.closed:
                raise self._unavailable()
            call_id = self._next_call
            self._next_call += 1
            self._waiters[call_id] = w
        try:
            data = frame_bytes(REQUEST, call_id, method, payload, len(fds), self.max_frame)
        except BaseException:
            with self._lock:
                self._waiters.pop(call_id, None)
            raise
        try:
            self._send(data, fds)
        except ServiceUnavailable as exc:
            self._shutdown(exc)
            raise
        if self.threaded:
            if not w.done.wait(timeout):
                with self._lock:
                    self._waiters.pop(call_id, None)
                raise TimeoutError(f"{method} got no reply within {timeout} s")
        else:
            self._pump_until(w)
        if w.error is not None:
            raise w.error
        return w.payload, w.fds

    def _pump_until(self, w: _Waiter) -> None:
        # One thread at a time reads; it routes every reply it receives. It must not
        # block in recv while holding a lock other callers wait on: a caller whose reply
        # it already routed would stay stuck until *its* reply came (a long execute).
        # So the reader hands off after every batch and wakes the waiting callers.
        while not w.done.is_set():
            with self._pump_cond:
                while self._pumping and not w.done.is_set():
                    self._pump_cond.wait()
                if w.done.is_set():
                    return
                self._pumping = True
            try:
                for frame, fds in self._recv_some():
                    self._route(frame, fds)
            except NpuError as exc:
                self._shutdown(self._close_reason or exc)
            finally:
                with self._pump_cond:
                    self._pumping = False
                    self._pump_cond.notify_all()

    def close(self) -> None:
        """Close the connection; safe to call more than once, from any thread."""
        with self._lock:
            already = self._released
            self._released = True
            self.closed = True
            waiters = list(self._waiters.values())
            self._waiters.clear()
        if already:
            return
        for w in waiters:
            w.error = ServiceUnavailable("client closed")
            w.done.set()
        with self._pump_cond:
            self._pump_cond.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        self.sock.close()
        close_fds(list(self._fdq))
        self._fdq.clear()

    def __enter__(self) -> SyncRpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def connect_async(
    path: str,
    service: str,
    handlers: dict[str, object] | None = None,
    *,
    client_name: str = "",
    max_frame: int = DEFAULT_MAX_FRAME,
    on_close: Callable[[RpcConnection, BaseException | None], None] | None = None,
) -> tuple[RpcConnection, HelloReply]:
    """Open an async connection and do the version handshake."""
    conn = await open_connection(
        path, handlers or {}, max_frame=max_frame, on_close=on_close, name=f"{service}-client"  # type: ignore[arg-type]
    )
    payload, _ = await conn.call(
        "hello", Hello(protocol_version=PROTOCOL_VERSION, service=service, client_name=client_name)
    )
    reply = HelloReply()
    reply.ParseFromString(payload)
    return conn, reply
