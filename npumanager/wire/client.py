"""Blocking RPC clients for the SDKs, and the async handshake helper.

:class:`SyncRpcClient` sends from the caller's thread. With ``threaded=True``
a reader thread receives replies and server pushes (the manager SDK needs
pushes at any time); with ``threaded=False`` the calling thread reads its own
reply, which saves a thread hand-off per call (the device client's hot path).
If the connection is lost every waiting call raises ServiceUnavailable at once
and later calls raise it too: never a hang.

Every wait is bounded (``ServiceUnavailable`` when it runs out, and the
connection is closed, so a late answer cannot be mistaken for another's):

* connecting: ``connect_timeout`` (5 s);
* the handshake: ``hello_timeout`` (:data:`HELLO_TIMEOUT_S`, 10 s): a server that
  accepted but does not answer (out of fds, wedged) is not serving;
* every call: ``call_timeout``, by default :func:`default_call_timeout` of the
  service: 30 s for npud (it answers every call at once; grants come by push),
  300 s for a driver (an execute is answered when the work is done, which may
  wait behind more important work). ``$NPU_CALL_TIMEOUT_S`` overrides both
  defaults; a call's own ``timeout=`` overrides the client's.
* sending: a peer that stops reading fails the send after ``call_timeout``.
"""

from __future__ import annotations

import array
import asyncio
import collections
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

from npumanager.errors import (
    CallerError,
    NpuError,
    ProtocolError,
    ServiceUnavailable,
    error_from_wire,
)
from npumanager.paths import not_in_a_directory
from npumanager.proto.v1.wire_pb2 import Hello, HelloReply
from npumanager.wire.conn import (
    Payload,
    RpcConnection,
    close_fds,
    frame_bytes,
    open_connection,
)
from npumanager.wire.framing import (
    DEFAULT_MAX_FRAME,
    ERROR,
    MAX_FDS,
    PROTOCOL_VERSION,
    PUSH,
    REPLY,
    REQUEST,
    FrameDecoder,
    RawFrame,
)
from npumanager.wire.unix import ANC_SIZE, RECV_SIZE, take_fds

log = logging.getLogger("npumanager.wire.client")

#: How long a client waits for the server's answer to its hello.
HELLO_TIMEOUT_S = 10.0
#: Default call timeouts per service (see the module docstring); others get the driver's.
CALL_TIMEOUT_S = {"manager": 30.0}
DRIVER_CALL_TIMEOUT_S = 300.0
#: In unthreaded mode a blocked read wakes this often to check its call's deadline.
_READ_TICK_S = 1.0


def default_call_timeout(service: str) -> float:
    """``$NPU_CALL_TIMEOUT_S`` if set, else the service's default."""
    env = os.environ.get("NPU_CALL_TIMEOUT_S")
    if env:
        try:
            value = float(env)
        except ValueError:
            value = 0.0
        if value > 0:
            return value
        log.warning("ignoring NPU_CALL_TIMEOUT_S=%r (want seconds > 0)", env)
    return CALL_TIMEOUT_S.get(service, DRIVER_CALL_TIMEOUT_S)


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1_000_000))

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
        hello_timeout: float = HELLO_TIMEOUT_S,
        call_timeout: float | None = None,
    ) -> None:
        self.path = path
        self.service = service
        #: Seconds a call waits for its reply (see the module docstring).
        self.call_timeout = call_timeout if call_timeout is not None else \
            default_call_timeout(service)
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
        except NotADirectoryError:
            sock.close()
            raise ServiceUnavailable(f"cannot connect to {path}: {not_in_a_directory(path)}"
                                     ) from None
        except OSError as exc:
            sock.close()
            raise ServiceUnavailable(f"cannot connect to {path}: {exc}") from None
        sock.settimeout(None)
        # Kernel-side timeouts keep the socket blocking (no poll() per call on the hot
        # path): a send to a peer that stopped reading fails after call_timeout, and in
        # unthreaded mode a read wakes every tick so a waiting caller can give up.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(self.call_timeout))
        if not threaded:
            tick = max(0.01, min(_READ_TICK_S, hello_timeout / 4, self.call_timeout / 4))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(tick))
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
                timeout=hello_timeout,
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
        except BlockingIOError:
            return []  # SO_RCVTIMEO's tick (unthreaded mode): the caller checks its deadline
        except OSError as exc:
            raise ServiceUnavailable(f"connection to {self.service} lost: {exc}") from None
        fdq = self._fdq
        if anc:
            take_fds(anc, fdq)
            if len(fdq) > MAX_FDS:
                raise ProtocolError(f"{len(fdq)} fds received; a frame carries at most "
                                    f"{MAX_FDS}")
        if not data:
            raise ServiceUnavailable(f"the {self.service} service closed the connection")
        out = []
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
        elif fdq and len(fdq) > self._decoder.pending_fds():
            self._pending_error = ProtocolError(f"{len(fdq)} fds arrived that no frame "
                                                f"announced")
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
        # Waiters learn why: a refusal they can act on keeps its type (LimitExceeded when
        # the server turned the connection away), anything else is ServiceUnavailable.
        reason = exc if isinstance(exc, NpuError) else ServiceUnavailable(
            f"connection to the {self.service} service lost"
        )
        for w in waiters:
            w.error = (type(reason)(str(reason))
                       if isinstance(reason, (CallerError, ServiceUnavailable))
                       else ServiceUnavailable(str(reason)))
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

    def _unavailable(self) -> NpuError:
        reason = self._close_reason
        if isinstance(reason, CallerError):  # refused: e.g. LimitExceeded, keep its type
            return type(reason)(str(reason))
        why = f": {reason}" if reason else ""
        return ServiceUnavailable(f"not connected to the {self.service} service{why}")

    def _send_failed(self, exc: ServiceUnavailable) -> NpuError:
        """The send failed; if the server refused us (it says why, then closes, possibly
        before our frame went out) that reason is in our receive queue: read it."""
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=1.0)  # it routes what arrived, then sees the close
        elif not self.threaded:
            try:
                for _ in range(4):
                    for frame, fds in self._recv_some():
                        self._route(frame, fds)
            except NpuError:
                pass
        return self._unavailable() if isinstance(self._close_reason, CallerError) else exc

    def call(
        self,
        method: str,
        payload: Payload | None = None,
        fds: Sequence[int] = (),
        timeout: float | None = None,
    ) -> tuple[bytes, list[int]]:
        """Call ``method``; returns (reply payload, received fds) or raises the peer's error.

        ``timeout``: seconds to wait for the reply (default: the client's
        ``call_timeout``); past it the connection is closed and ServiceUnavailable raised."""
        if timeout is None:
            timeout = self.call_timeout
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
            err = self._send_failed(exc)
            self._shutdown(err)
            raise err from None
        if self.threaded:
            if not w.done.wait(timeout):
                self._timed_out(call_id, w, method, timeout)
        else:
            self._pump_until(w, time.monotonic() + timeout)
            if not w.done.is_set():
                self._timed_out(call_id, w, method, timeout)
        if w.error is not None:
            raise w.error
        return w.payload, w.fds

    def _timed_out(self, call_id: int, w: _Waiter, method: str, timeout: float) -> None:
        with self._lock:
            gone = self._waiters.pop(call_id, None) is None
        if gone:  # answered (or failed) just now; whoever took it sets w at once
            w.done.wait()
            return
        err = ServiceUnavailable(
            f"the {self.service} service did not answer {method} within {timeout} s; "
            f"connection closed")
        log.warning("%s", err)
        self._shutdown(err)
        raise err

    def _pump_until(self, w: _Waiter, deadline: float) -> None:
        # One thread at a time reads; it routes every reply it receives. It must not
        # block in recv while holding a lock other callers wait on: a caller whose reply
        # it already routed would stay stuck until *its* reply came (a long execute).
        # So the reader hands off after every batch and wakes the waiting callers.
        while not w.done.is_set():
            with self._pump_cond:
                while self._pumping and not w.done.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._pump_cond.wait(left)
                if w.done.is_set() or time.monotonic() >= deadline:
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
    connect_timeout: float = 5.0,
    hello_timeout: float = HELLO_TIMEOUT_S,
    call_timeout: float | None = None,
) -> tuple[RpcConnection, HelloReply]:
    """Open an async connection and do the version handshake, each bounded in time (see
    the module docstring); ``call_timeout`` (default by service) bounds every later call."""
    conn = await open_connection(
        path, handlers or {}, max_frame=max_frame, on_close=on_close,  # type: ignore[arg-type]
        name=f"{service}-client", connect_timeout=connect_timeout,
        call_timeout=call_timeout if call_timeout is not None else default_call_timeout(service),
    )
    hello = Hello(protocol_version=PROTOCOL_VERSION, service=service, client_name=client_name)
    try:
        payload, _ = await asyncio.wait_for(conn.call("hello", hello), hello_timeout)
    except TimeoutError:
        conn.close(None)
        raise ServiceUnavailable(f"the {service} service at {path} did not answer hello "
                                 f"within {hello_timeout} s") from None
    except BaseException:
        conn.close(None)
        raise
    reply = HelloReply()
    reply.ParseFromString(payload)
    return conn, reply
