"""An RPC server on a Unix socket: handshake, identity, bounds.

Every connection must open with ``hello`` (a version handshake); the caller's
identity comes from SO_PEERCRED only. Connections per uid are bounded. A
malformed frame closes that connection alone.
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import socket
from collections import Counter
from collections.abc import Callable

from npumanager.errors import LimitExceeded, ProtocolError
from npumanager.proto.v1.wire_pb2 import Hello, HelloReply
from npumanager.version import __version__
from npumanager.wire.conn import (
    CallContext,
    Handler,
    HandlerResult,
    Peer,
    RpcConnection,
    make_unix_listener,
    peer_credentials,
)
from npumanager.wire.framing import DEFAULT_MAX_FRAME, PROTOCOL_VERSION

log = logging.getLogger("npumanager.wire.server")


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


def resolve_group(name_or_gid: str | int | None) -> int | None:
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
        log.warning("admin group %r does not exist; only root is admin", name_or_gid)
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
    ) -> None:
        self.path = path
        self.service = service
        self.mode = mode
        self.max_frame = max_frame
        self.max_connections_per_uid = max_connections_per_uid
        self.admin_gid = admin_gid
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self.connections: set[RpcConnection] = set()
        self._per_uid: Counter[int] = Counter()
        self._sock: socket.socket | None = None
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
        conn.admin = is_admin(conn.peer, self.admin_gid, os.getuid())
        conn.open_gate()
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
        self._sock = make_unix_listener(self.path, self.mode)
        self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop())

    async def _accept_loop(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self._sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:
                log.warning("%s: accept failed: %s", self, exc)
                await asyncio.sleep(0.01)
                continue
            try:
                self._accepted(sock)
            except Exception:
                log.exception("%s: setting up a connection failed", self)
                sock.close()

    def _accepted(self, sock: socket.socket) -> None:
        peer = peer_credentials(sock)
        if self._per_uid[peer.uid] >= self.max_connections_per_uid:
            log.warning("uid %d has %d connections; refusing another", peer.uid,
                        self._per_uid[peer.uid])
            conn = RpcConnection(sock, {}, peer=peer, max_frame=self.max_frame, name="refused")
            conn._reply_error(0, LimitExceeded(
                f"uid {peer.uid} already has {self.max_connections_per_uid} connections "
                f"to {self.service}"))
            conn._flush_now()
            conn.close()
            return
        self._per_uid[peer.uid] += 1
        conn = RpcConnection(
            sock,
            self._handlers,
            peer=peer,
            max_frame=self.max_frame,
            on_close=self._closed,
            name=f"{self.service}:{peer.uid}/{peer.pid}",
            require_hello=True,
        )
        self.connections.add(conn)
        if self.on_connect is not None:
            self.on_connect(conn)

    def _closed(self, conn: RpcConnection, exc: BaseException | None) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self._per_uid[conn.peer.uid] -= 1
            if self._per_uid[conn.peer.uid] <= 0:
                del self._per_uid[conn.peer.uid]
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
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        for conn in list(self.connections):
            if goodbye is not None:
                conn.push("goodbye", goodbye.encode())
                conn._flush_now()
            conn.close()
