"""npud's record of each driver host it started, by which a restarted npud ties a host it
adopts to its own records (service/host_rt.py: real-time grants to an adopted host).

A restarted npud attaches to the hosts an earlier one left running (supervisor.py:
``_attach_existing``); what it knows of such a host is the pid SO_PEERCRED names, the
process that last listened on the socket, which a host could have handed to any process
of its user. So when npud starts a host it writes ``RT/drivers/NAME.host`` (NAME: the
host's first device): the pid from the spawn, the process's start time
(``/proc/PID/stat`` field 22, clock ticks since boot), the uid it runs as (the driver's
configured user, which the host becomes right after exec) and the kernel's boot id.
``RT/drivers`` is npud's (0755, checked when npud starts: paths.secure_dir), so the
driver's user cannot write there; the file is npud's, 0644, written under a temporary
name and renamed, and read with O_NOFOLLOW only if it is still npud's and writable by no
one else.

An adopted host is tied (:func:`adopt`) only when the record is of this boot, its pid is
the peer's, the process now at that pid started at the recorded time (a pid recycled
since has another), and its uids (real, effective, saved, filesystem) are all the
recorded one, which is the driver's configured user. :func:`check` repeats the process
checks at every grant (the host may have exited and its pid been reused since). The
record stays while the host runs, also when npud detaches or is killed (the next npud
reads it), and goes when npud stops the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from npumanager.service.driver_launch import driver_user

FORMAT = 1
SUFFIX = ".host"


@dataclass(frozen=True, slots=True)
class HostRecord:
    pid: int
    #: /proc/PID/stat's starttime: clock ticks after boot.
    start: int
    uid: int
    boot: str


def start_time(pid: int) -> int | None:
    """Process ``pid``'s start time in clock ticks after boot; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        # (the command name, field 2, may hold spaces and parentheses: split after it)
        return int(raw[raw.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def uids_of(pid: int) -> tuple[int, ...] | None:
    """Process ``pid``'s real, effective, saved and filesystem uids; None when gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return tuple(int(x) for x in line.split()[1:5])
    except (OSError, ValueError):
        return None
    return None


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def record_path(socket_path: Path) -> Path:
    """``RT/drivers/NAME.host`` beside the host's ``NAME.sock``."""
    return socket_path.with_suffix(SUFFIX)


def write(path: Path, pid: int, uid: int) -> str:
    """Record the host npud just spawned (``pid``, running as ``uid``); '' when written,
    else why not (the host then gets no grant from a later npud that adopts it)."""
    start = start_time(pid)
    if start is None:
        return f"process {pid} is gone"
    data = json.dumps({"format": FORMAT, **asdict(HostRecord(pid, start, uid, boot_id()))})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return f"cannot write {path}: {exc.strerror or exc}"
    return ""


def read(path: Path) -> HostRecord | str:
    """The record at ``path``, or why there is none to trust."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return f"npud has no record of it ({path})"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return f"{path} is not a file of npud's"
        if st.st_mode & 0o022:
            return f"{path} is writable by others"
        raw = os.read(fd, 4096)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    try:
        d = json.loads(raw)
        if d.get("format") != FORMAT:
            return f"{path} has an unknown format"
        rec = HostRecord(int(d["pid"]), int(d["start"]), int(d["uid"]), str(d["boot"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return f"{path} is not a host record"
    return rec


def remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def check(rec: HostRecord, pid: int) -> str:
    """'' when process ``pid`` is now the host ``rec`` records, else why not."""
    if rec.boot != boot_id():
        return "npud's record of it is from another boot"
    if pid != rec.pid:
        return f"pid {pid} is not the host npud started (pid {rec.pid})"
    start = start_time(pid)
    if start is None:
        return f"process {pid} has exited"
    if start != rec.start:
        return (f"process {pid} is not the host npud started: it started at tick {start}, "
                f"the host at {rec.start} (a recycled pid)")
    uids = uids_of(pid)
    if uids is None or any(u != rec.uid for u in uids):
        return f"process {pid} does not run as the driver's user (uid {rec.uid}): {uids}"
    return ""


def adopt(path: Path, pid: int, uid: int) -> HostRecord | str:
    """The record tying adopted host ``pid`` to the npud that started it, if it holds
    (the driver's configured user now ``uid``); else why not."""
    rec = read(path)
    if isinstance(rec, str):
        return rec
    if rec.uid != uid:
        return f"npud's record names uid {rec.uid}, not the driver's user (uid {uid})"
    why = check(rec, pid)
    return why or rec


def tie(path: Path, pid: int, manager: Mapping[str, Any]) -> HostRecord | str:
    """:func:`adopt` for the supervisor (service/hand_ties.tie_adopted): the driver's user
    from ``[manager] driver_user``."""
    try:
        uid = driver_user(str(manager.get("driver_user", ""))).uid
    except LookupError as exc:
        return str(exc)
    return adopt(path, pid, uid)


def grantable(rec: HostRecord | str, pid: int) -> int | str:
    """An adopted host's pid where real-time grants may go (``rec``: what :func:`adopt`
    returned for it), or why not: checked again at each grant."""
    why = rec if isinstance(rec, str) else check(rec, pid)
    return f"adopted host {pid}: {why}" if why else pid
