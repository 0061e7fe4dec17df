"""Unix-socket facts under every RPC connection: who the peer is (SO_PEERCRED), the
receive sizes, fds out of SCM_RIGHTS ancillary data, and a listening socket."""

from __future__ import annotations

import array
import collections
import os
import socket
import struct
from dataclasses import dataclass

from npumanager.wire.framing import MAX_FDS

# Below glibc's mmap threshold (128 KiB): a larger recv buffer is mmapped and unmapped on
# every call, which tripled the round trip (measured: 23 µs vs 83 µs raw, 64 vs 256 KiB).
RECV_SIZE = 64 * 1024
#: Room for a whole frame's fds in one read (the kernel hands over one sendmsg's fds per
#: read and would close what does not fit).
MAX_FDS_PER_RECV = MAX_FDS
ANC_SIZE = socket.CMSG_SPACE(MAX_FDS_PER_RECV * 4)


@dataclass(frozen=True)
class Peer:
    """Who is on the other end, from SO_PEERCRED (never from what the peer says)."""

    uid: int
    pid: int
    gid: int


def peer_credentials(sock: socket.socket) -> Peer:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return Peer(uid=uid, pid=pid, gid=gid)


def take_fds(anc: list[tuple[int, int, bytes]], into: collections.deque[int]) -> None:
    """Append the fds of SCM_RIGHTS ancillary data to ``into``, in arrival order."""
    for level, kind, cdata in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(cdata[: len(cdata) - (len(cdata) % got.itemsize)])
            into.extend(got)


def make_unix_listener(path: str, mode: int = 0o666, backlog: int = 512) -> socket.socket:
    """A listening Unix socket at ``path`` (a stale file there is replaced)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o077)  # no window in which the socket is wider than asked
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    os.chmod(path, mode)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock
