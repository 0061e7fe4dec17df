"""An RPC server on a Unix socket: handshake, identity, bounds.

Every connection must open with ``hello`` (a version handshake) within
``hello_timeout`` (5 s) or it is closed; the caller's identity comes from
SO_PEERCRED only. Bounded per uid: connections, and received fds waiting for
their frame (per connection too, see conn.py). A malformed frame closes that
connection alone. When ``accept`` fails (out of fds: EMFILE/ENFILE) the server
backs off up to 1 s between tries and logs once per episode, not per try.
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import resource
import socket
import time
from collections import Counter
from collections.abc import Callable

from npumanager.errors import LimitExceeded, ProtocolError
from npumanager.proto.v1.wire_pb2 import Hello, HelloReply
from npumanager.version import __version__
from npumanager.wire.conn import CallContext, FdBudget, Handler, HandlerResult, RpcConnection
from npumanager.wire.framing import DEFAULT_MAX_FRAME, MAX_FDS, PROTOCOL_VERSION
from npumanager.wire.unix import Peer, make_unix_listener, peer_credentials

log = logging.getLogger("npumanager.wire.server")

#: A new connection must say hello within this many seconds.
HELLO_TIMEOUT_S = 5.0
#: Received fds one uid may have waiting for their frames, over all its connections.
MAX_FDS_IN_FLIGHT_PER_UID = 2 * MAX_FDS
#: Longest pause between accept tries while accept fails.
ACCEPT_BACKOFF_MAX_S = 1.0


def raise_fd_limit(want: int = 65536) -> int:
    """Raise the soft RLIMIT_NOFILE toward the hard limit (at most ``want``); returns the
    soft limit now. A server holds one fd per connection and the fds clients pass; the
    usual soft default (1024) is reached by a few busy local users."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return int(soft)


class Throttled:
    """Log one line per ``interval`` for an event a peer can repeat at will, with the
    count since the last line: a hostile client must not fill the log."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self.log = logger
        self.interval = interval
        self._last = float("-inf")
        self._since = 0
        self.total = 0

    def note(self, level: int, msg: str, *args: object) -> None:
        self.total += 1
        now = time.monotonic()
        if now - self._last < self.interval:
            self._since += 1
            return
        more = f" (and {self._since} more like it since the last such line)" if self._since \
            else ""
        self.log.log(level, msg + more, *args)
        self._last = now
        self._since = 0


def supplementary_groups(pid: int) -> set[int]:
    """The peer's groups as the kernel lists them (/proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


def resolve_group(name_or_gid: str | int | None, *, warn: bool = True) -> int | None:
    """The admin group's gid, None if unset or unknown (warned once, by npud: a driver
    host, given npud's config, passes ``warn=False``)."""
    if name_or_gid is None or name_or_gid == "":
        return None
    if isinstance(name_or_gid, int):
        return name_or_gid
    try:
        return int(name_or_gid)
    except ValueError:
        pass
    try:
        return grp.getgrnam(name_or_gid).gr_gid
    except KeyError:
        if warn:
            log.warning("[manager] admin_group %r does not exist: only root and npud's own "
                        "uid are admins", name_or_gid)
        return None


def is_admin(peer: Peer, admin_gid: int | None, server_uid: int | None = None) -> bool:
    """Root, the daemon's own uid, or a member of the configured admin group."""
    if peer.uid == 0 or (server_uid is not None and peer.uid == server_uid):
        return True
    if admin_gid is None:
        return False
    return peer.gid == admin_gid or admin_gid in supplementary_groups(peer.pid)


class RpcServer:
    def __init__(
        self,
        path: str,
        service: str,
        handlers: dict[str, Handler],
        *,
        mode: int = 0o666,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_connections_per_uid: int = 64,
        admin_gid: int | None = None,
        on_connect: Callable[[RpcConnection], None] | None = None,
        on_disconnect: Callable[[RpcConnection, BaseException | None], None] | None = None,
        hello_timeout: float = HELLO_TIMEOUT_S,
        max_fds_in_flight: int = MAX_FDS,
        max_fds_in_flight_per_uid: int = MAX_FDS_IN_FLIGHT_PER_UID,
        fd_methods: frozenset[str] | None = None,
        listen_sock: socket.socket | None = None,
        owner_uid: int | None = None,
    ) -> None:
        """``max_fds_in_flight``: received fds one connection may have waiting for their
        frame (0 for a service whose methods take no fds); ``fd_methods``: the methods
        that may receive fds (None: any). ``listen_sock``: a listening socket bound at
        ``path`` by someone else (npud binds a driver's: the driver's user cannot write
        ``drivers/``); this server then neither binds nor removes the path.
        ``owner_uid``: the uid whose processes are admins besides root and the admin
        group (default: this process's own; a driver gives npud's, so that sharing a
        user like ``nobody`` with other daemons makes none of them its admin)."""
        self.path = path
        self.service = service
        self.mode = mode
        self.max_frame = max_frame
        self.max_connections_per_uid = max_connections_per_uid
        self.admin_gid = admin_gid
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self.hello_timeout = hello_timeout
        self.max_fds_in_flight = max_fds_in_flight
        self.max_fds_in_flight_per_uid = max_fds_in_flight_per_uid
        self.fd_methods = fd_methods
        self.connections: set[RpcConnection] = set()
        self._per_uid: Counter[int] = Counter()
        self._fd_budgets: dict[int, FdBudget] = {}
        self._awaiting_hello: dict[RpcConnection, asyncio.TimerHandle] = {}
        #: Times accept failed (out of fds, ...), and connections closed by a bound.
        self.accept_failures = 0
        self._silent = Throttled(log)
        self._refused = Throttled(log)
        self._sock: socket.socket | None = listen_sock
        self._adopted = listen_sock is not None
        self.owner_uid = os.getuid() if owner_uid is None else owner_uid
        #: (st_dev, st_ino) of the socket file we bound: removed at close only if the path
        #: still is that file (a successor may have bound there since). None: npud bound it.
        self._bound: tuple[int, int] | None = None
        self._accept_task: asyncio.Task[None] | None = None
        # Connections refuse every method but hello until the handshake (RpcConnection's
        # gate: one flag test per call instead of a wrapper around every handler).
        self._handlers: dict[str, Handler] = {**handlers, "hello": self._hello}

    def __repr__(self) -> str:
        return f"<RpcServer {self.service} at {self.path}: {len(self.connections)} connections>"

    def _hello(self, ctx: CallContext, payload: bytes) -> HandlerResult:
        hello = Hello()
        hello.ParseFromString(payload)
        conn = ctx.conn
        if hello.protocol_version != PROTOCOL_VERSION:
            # Tell the client why, then drop it once the error is out.
            asyncio.get_running_loop().call_soon(conn.close, None)
            raise ProtocolError(
                f"protocol version {hello.protocol_version} is not supported by this "
                f"{self.service} service (it speaks {PROTOCOL_VERSION}); upgrade npumanager"
            )
        if hello.service and hello.service != self.service:
            asyncio.get_running_loop().call_soon(conn.close, None)
            raise ProtocolError(
                f"this socket serves {self.service!r}, not {hello.service!r}; check the path"
            )
        conn.hello = hello
        conn.admin = is_admin(conn.peer, self.admin_gid, self.owner_uid)
        conn.open_gate()
        timer = self._awaiting_hello.pop(conn, None)
        if timer is not None:
            timer.cancel()
        return HelloReply(
            protocol_version=PROTOCOL_VERSION,
            service=self.service,
            server_version=__version__,
            uid=conn.peer.uid,
            pid=max(conn.peer.pid, 0),
            admin=conn.admin,
            max_frame=self.max_frame,
        )

    async def start(self) -> None:
        raise_fd_limit()
        if self._sock is None:
            self._sock = make_unix_listener(self.path, self.mode)
            st = os.lstat(self.path)
            self._bound = (st.st_dev, st.st_ino)
        else:
            self._sock.setblocking(False)
            # Listening again makes this process the one its clients' SO_PEERCRED names (a
            # Linux socket keeps the credentials of its last listen(), here the binder's:
            # npud, which hands driver hosts their sockets). A new npud attaching to an
            # orphaned host takes that pid as the host's, and signals it at its own stop.
            self._sock.listen(512)
        self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop())

    async def _accept_loop(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        failing = 0  # consecutive failed accepts: one line when it starts, one when it ends
        delay = 0.0
        while True:
            try:
                sock, _ = await loop.sock_accept(self._sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:
                # Out of fds (EMFILE/ENFILE) the listening socket stays readable: without a
                # pause this is a hot loop, and one log line per try filled the disk.
                self.accept_failures += 1
                if not failing:
                    log.error("%s: accept failed: %s; retrying with back-off (up to %s s), "
                              "quietly until it works again", self, exc, ACCEPT_BACKOFF_MAX_S)
                failing += 1
                delay = min(ACCEPT_BACKOFF_MAX_S, delay * 2 if delay else 0.01)
                await asyncio.sleep(delay)
                continue
            if failing:
                log.warning("%s: accepting again after %d failed tries", self, failing)
                failing = 0
                delay = 0.0
            try:
                self._accepted(sock)
            except Exception:
                log.exception("%s: setting up a connection failed", self)
                sock.close()

    def _accepted(self, sock: socket.socket) -> None:
        peer = peer_credentials(sock)
        if self._per_uid[peer.uid] >= self.max_connections_per_uid:
            self._refused.note(logging.WARNING, "%s: uid %d has %d connections; refusing "
                               "another", self, peer.uid, self._per_uid[peer.uid])
            conn = RpcConnection(sock, {}, peer=peer, max_frame=self.max_frame, name="refused")
            conn._reply_error(0, LimitExceeded(
                f"uid {peer.uid} already has {self.max_connections_per_uid} connections "
                f"to {self.service}"))
            conn._flush_now()
            conn.close()
            return
        self._per_uid[peer.uid] += 1
        budget = self._fd_budgets.get(peer.uid)
        if budget is None:
            budget = self._fd_budgets[peer.uid] = FdBudget(self.max_fds_in_flight_per_uid)
        conn = RpcConnection(
            sock,
            self._handlers,
            peer=peer,
            max_frame=self.max_frame,
            on_close=self._closed,
            name=f"{self.service}:{peer.uid}/{peer.pid}",
            require_hello=True,
            max_fds_in_flight=self.max_fds_in_flight,
            fd_budget=budget,
            fd_methods=self.fd_methods,
        )
        self.connections.add(conn)
        self._awaiting_hello[conn] = asyncio.get_running_loop().call_later(
            self.hello_timeout, self._hello_overdue, conn)
        if self.on_connect is not None:
            self.on_connect(conn)

    def _hello_overdue(self, conn: RpcConnection) -> None:
        """An unauthenticated connection holds a slot and fds: it has ``hello_timeout``."""
        self._awaiting_hello.pop(conn, None)
        if conn.closed:
            return
        self._silent.note(logging.INFO, "%s: closing %r: no hello within %s s", self, conn,
                          self.hello_timeout)
        conn._reply_error(0, ProtocolError(
            f"no hello within {self.hello_timeout} s: open with the version handshake"))
        conn._flush_now()
        conn.close()

    def _closed(self, conn: RpcConnection, exc: BaseException | None) -> None:
        timer = self._awaiting_hello.pop(conn, None)
        if timer is not None:
            timer.cancel()
        if conn in self.connections:
            self.connections.discard(conn)
            uid = conn.peer.uid
            self._per_uid[uid] -= 1
            if self._per_uid[uid] <= 0:
                del self._per_uid[uid]
                self._fd_budgets.pop(uid, None)
        if self.on_disconnect is not None:
            self.on_disconnect(conn, exc)

    async def close(self, goodbye: str | None = None) -> None:
        """Stop accepting, tell clients (push ``goodbye``), close all, remove the socket."""
        if self._accept_task is not None:
            self._accept_task.cancel()
            try:
                await self._accept_task
            except asyncio.CancelledError:
                pass
            self._accept_task = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                # Only our own socket file: a successor (a driver host npud started while
                # this orphaned one served its last clients) may have bound the path since.
                st = os.lstat(self.path)
                if self._bound == (st.st_dev, st.st_ino):
                    os.unlink(self.path)
            except FileNotFoundError:
                pass
        conns = list(self.connections)
        for conn in conns:
            if goodbye is not None:
                conn.push("goodbye", goodbye.encode())
                conn._flush_now()
            conn.close()
        # Closing cancelled their handlers (a prepare waiting for its grant, an execute):
        # let them finish unwinding now, not be destroyed pending when the loop ends.
        pending = [t for conn in conns for t in conn._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=2.0)
