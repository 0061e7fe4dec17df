"""npud's tie to a driver host started by hand (`npu driver NAME --config FILE`), by which
its burst threads get ``foreground_rt_priority`` grants as npud's own hosts' do
(service/host_rt.py).

npud adopts a host already serving ``RT/drivers/NAME.sock`` (supervisor.py:
``_attach_existing``). One an earlier npud started is tied by that npud's record
(service/host_records.py); one started by hand has none. What npud has instead is its own
connection to the socket: at connect the kernel stored the credentials of the process that
last called listen() on it (SO_PEERCRED), and SO_PEERPIDFD (Linux 6.5) gives a pidfd of
exactly that process, not of whichever holds its pid now. npud ties the host when:

* the socket's credentials say root, and the process the pidfd names runs as root (real,
  effective, saved and filesystem uids 0; read from /proc and then checked to be the
  pidfd's process: it had not exited, so its pid was not yet anyone else's). Only root
  binds in ``RT/drivers`` (npud's, 0755: paths.secure_dir), so the driver's user and the
  apps cannot serve there, and a process of theirs at the peer's pid is refused. A thread
  of a root process at SCHED_FIFO is nothing that process could not take itself (root
  has CAP_SYS_NICE, which RLIMIT_RTPRIO does not bind); what npud's grant adds is the
  policy its own hosts run under: the thread checked to be the host's, at most
  ``MAX_THREADS`` at once, the RLIMIT_RTTIME hard bound (`npu driver` sets it before
  anything else, by hand too), and the CPU watchdog with its cool-down;
* where the kernel lacks SO_PEERPIDFD (older than 6.5), the pidfd is pidfd_open() of the
  peer's pid, with the same checks: if the listener had exited before npud connected and
  another process took its pid, that process is tied only if it runs as root, which
  gains nothing from a grant (above) and is no app's.

The pidfd is kept while npud serves the host (:meth:`HandTie.close` when it lets go). At
each grant (:meth:`HandTie.check`) the process must not have exited (a pid reused since
names another process; the pidfd still names the one that exited) and must still run as
root. A host npud cannot tie keeps serving, at normal priority; npud says why in its log
(where the entry wants FIFO) and `npu status`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npumanager.service import host_records
from npumanager.service.host_records import HostRecord, uids_of
from npumanager.wire.unix import Peer

log = logging.getLogger("npumanager.service.supervisor")

#: getsockopt(SOL_SOCKET, SO_PEERPIDFD): Linux 6.5's (Python 3.11's socket lacks the name).
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)


@dataclass(eq=False)
class HandTie:
    """A host started by hand that npud may grant to: the pidfd of its process."""

    pid: int
    pidfd: int
    #: How the pidfd was had: "SO_PEERPIDFD", or "pidfd_open" (a kernel older than 6.5).
    how: str

    def check(self) -> str:
        """'' while the process is the one tied and runs as root, else why not."""
        if self.pidfd < 0:
            return "npud let go of it"
        uids = uids_of(self.pid)
        if exited(self.pidfd):  # (after the read: a live pidfd means it was this process)
            return f"process {self.pid} has exited"
        if uids is None or any(uids):
            return f"process {self.pid} does not run as root (uids {uids})"
        return ""

    def close(self) -> None:
        fd, self.pidfd = self.pidfd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def exited(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has exited (a pidfd reads as readable then)."""
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return bool(p.poll(0))


def pidfd_pid(pidfd: int) -> int | None:
    """The pid a pidfd names in this process's pid namespace (-1: it exited); None when
    its fdinfo does not say."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _peer_pidfd(sock: socket.socket, pid: int) -> tuple[int, str] | str:
    """A pidfd of the process that listened on ``sock``'s peer (SO_PEERPIDFD), or, on a
    kernel without it, of ``pid``; else why none."""
    try:
        return int(sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)), "SO_PEERPIDFD"
    except OSError as exc:
        if exc.errno not in (errno.ENOPROTOOPT, errno.EINVAL, errno.EOPNOTSUPP):
            return f"SO_PEERPIDFD of its socket failed: {exc.strerror or exc}"
    try:
        return os.pidfd_open(pid), "pidfd_open"
    except ProcessLookupError:
        return f"process {pid} has exited"
    except OSError as exc:
        return f"pidfd_open({pid}) failed: {exc.strerror or exc}"


def tie(sock: socket.socket, peer: Peer) -> HandTie | str:
    """Tie the host serving npud's connected socket ``sock`` (``peer``: its SO_PEERCRED),
    or say why not."""
    if peer.uid != 0:
        return f"its socket's listener (pid {peer.pid}) runs as uid {peer.uid}, not root"
    got = _peer_pidfd(sock, peer.pid)
    if isinstance(got, str):
        return got
    pidfd, how = got
    named = pidfd_pid(pidfd)
    if named != peer.pid:
        os.close(pidfd)
        return (f"process {peer.pid} has exited" if named == -1 else
                f"the socket's listener is not process {peer.pid} (its pidfd names {named})")
    tied = HandTie(peer.pid, pidfd, how)
    why = tied.check()
    if why:
        tied.close()
        return why
    return tied


def tie_adopted(record: Path, sock: socket.socket, peer: Peer, manager: Mapping[str, Any],
                entry: Mapping[str, Any]) -> HostRecord | HandTie | str:
    """What ties a host npud adopts to a process it may grant real-time priority to: the
    record of the npud that started it (``record``: its path; service/host_records.py),
    else, for a host started by hand, its socket's listener (:func:`tie`); else why
    neither does, logged where the host's ``[[driver]]`` entry wants FIFO threads
    (``foreground_rt_priority``) and shown by `npu status` (service/host_lanes.host_pids)."""
    rec = host_records.tie(record, peer.pid, manager)
    if isinstance(rec, HostRecord):
        return rec
    hand = tie(sock, peer)
    if isinstance(hand, HandTie):
        return hand
    why = f"{rec}; {hand}"
    if int(entry.get("foreground_rt_priority", 0) or 0):
        log.warning("driver %s: its adopted host (pid %d) gets no real-time grants: %s",
                    entry.get("name", "?"), peer.pid, why)
    return why


def grantable(tie_: HostRecord | HandTie | str, pid: int) -> int | str:
    """An adopted host's pid where real-time grants may go (``tie_``: what
    :func:`tie_adopted` returned for it), or why not: checked again at each grant."""
    if isinstance(tie_, HandTie):
        why = tie_.check() if pid == tie_.pid else f"pid {pid} is not the one tied"
        return f"host started by hand {pid}: {why}" if why else pid
    return host_records.grantable(tie_, pid)


def release(tie_: HostRecord | HandTie | str) -> None:
    """npud lets go of an adopted host: its pidfd, if it holds one, is closed."""
    if isinstance(tie_, HandTie):
        tie_.close()


__all__ = ["HandTie", "grantable", "release", "tie", "tie_adopted"]
