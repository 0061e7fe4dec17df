"""A ``cpu.idle`` cgroup for a driver host's background threads (``background_cgroup``).

Why: under EEVDF (Linux 6.6+) ``SCHED_IDLE`` is a low weight, not a strict priority: a
normal thread that wakes with a little negative lag (the camera app right after the
driver answered its frame) is passed over for an eligible ``SCHED_IDLE`` thread, which
then keeps the CPU until the next tick (4 ms at HZ 250). An entity in a cgroup with
``cpu.idle = 1`` is compared at the level where it meets the waking thread: a top-level
idle group is preempted at once by any non-idle entity and has the minimum weight there
(bench/cgroup_idle.py measures both; drivers/classes.py has the table).

Where: a group directly below the cpu hierarchy's root (``npumanager-bg.<npud pid>.
<host>``), so that it meets every app's thread, or the app's own top-level group, at the
root. A group nested in npud's own (non-idle) group would be idle only against its
siblings: at the root it would count as npud's group, at normal weight.

Who may do what (npud makes it, as root; the host only uses it):

* npud creates the directory (root's, 0755: nobody else may make groups in it or change
  its ``cpu.idle``/``cpu.shares``), sets ``cpu.idle = 1`` and gives the driver's user its
  ``tasks`` and ``cgroup.procs`` files (0644 stays: the owner writes, others read). The
  path reaches the host in its host config, from npud's command line; never from a
  client.
* The kernel lets a writer move a thread into a v1 group only if the writer is root or
  the thread's own uid (checked with the opener's credentials): the driver's user can
  move its own threads in, never an app's; an app cannot open the files at all.
* Nobody but root can take a thread out again (out means into another group's ``tasks``,
  and every other group is root's). So only threads that stay background join: the
  step workers of ``background_sched = "idle"`` and the loading threads; a starved step
  runs on a separate normal-priority thread that never joins (drivers/starve.py), and
  the compile child joins only where its own starvation bound is off (it could not be
  raised out of the group: drivers/compile_starve.py).

cgroup v2 is not used: there a process's threads may be split only inside a threaded
subtree below the process's own cgroup, where an idle child is idle against the host's
other threads only, and the cpu controller is not delegated in this container anyway.
Where no v1 cpu hierarchy with ``cpu.idle`` is writable (not root, a container, a kernel
before 5.15), npud logs it once and the background threads stay at ``SCHED_IDLE`` only.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger("npumanager.hal.idle_cgroup")

#: The choices of the [[driver]] key ``background_cgroup``.
BACKGROUND_CGROUP = ("auto", "off")
#: Groups npud makes: PREFIX.<npud pid>.<host name>.
PREFIX = "npumanager-bg"
#: The files the driver's user is given: a thread id (``tasks``) or a process id
#: (``cgroup.procs``, every thread of it) written there moves it into the group.
HANDED_OVER = ("tasks", "cgroup.procs")

#: Kinds of background thread the host has (see :func:`joins`).
STEP = "step"            # a SCHED_IDLE step worker (npu-bg_N)
COMPILE = "compile"      # a lowered loading thread of the host (npu-bgcompile_N)
BOOST = "boost"          # a normal-priority worker for starved steps (npu-bgb_N)
COMPILE_CHILD = "compile-child"  # the lowered compile process


def joins(kind: str, background_sched: str, *, child_can_raise: bool = False) -> bool:
    """Whether a background thread (or the compile child) of ``kind`` joins the idle
    group. Only what stays background for good: the host cannot take a thread out again
    (see the module docstring), so a thread that a starvation bound may raise stays
    where it is. Only with ``background_sched = "idle"``: "nice" and "share" rank
    background work by weight among itself (a group would flatten that), "normal" not
    at all."""
    if background_sched != "idle":
        return False
    if kind in (STEP, COMPILE):
        return True
    if kind == COMPILE_CHILD:
        return not child_can_raise
    return False


def v1_cpu_root(mounts: str) -> Path | None:
    """The mount point of the cgroup-v1 hierarchy with the cpu controller, from the text
    of /proc/self/mounts; None if there is none."""
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and "cpu" in parts[3].split(","):
            return Path(parts[1])
    return None


def group_name(host: str, pid: int | None = None) -> str:
    """The group of ``host``'s background threads made by the npud of ``pid``."""
    safe = re.sub(r"[^A-Za-z0-9_:-]", "_", host)[:64] or "driver"
    return f"{PREFIX}.{os.getpid() if pid is None else pid}.{safe}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(root: Path) -> None:
    """Remove the empty groups of npuds that are gone (a crash left them)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        parts = entry.name.split(".", 2)
        if len(parts) == 3 and parts[0] == PREFIX and parts[1].isdigit() \
                and not _alive(int(parts[1])):
            try:
                entry.rmdir()
            except OSError:
                pass  # still has threads (an orphaned host serving out its grace)


def create(host: str, uid: int, gid: int, root: Path | None = None) -> Path:
    """npud, as root: the idle group of ``host``'s background threads, its ``tasks`` and
    ``cgroup.procs`` handed to ``uid``/``gid``. OSError (with what failed) when the
    hierarchy is missing, not writable or has no ``cpu.idle``."""
    if root is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError as exc:
            raise OSError(f"cannot read the mounts: {exc}") from None
        root = v1_cpu_root(mounts)
        if root is None:
            raise OSError("no cgroup-v1 cpu hierarchy is mounted")
    remove_stale(root)
    group = root / group_name(host)
    try:
        group.mkdir(mode=0o755, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot create {group}: {exc.strerror or exc}") from None
    try:
        if not (group / "cpu.idle").exists():
            raise OSError(f"{root} has no cpu.idle (Linux 5.15 or later)")
        (group / "cpu.idle").write_text("1")
        for name in HANDED_OVER:
            os.chown(group / name, uid, gid)
    except OSError as exc:
        remove(group)
        raise OSError(f"cannot set up {group}: {getattr(exc, 'strerror', None) or exc}"
                      ) from None
    return group


def remove(group: Path) -> None:
    """npud: the host is gone; its group goes too (once empty: a thread that lingers
    keeps it, and :func:`remove_stale` of a later npud removes it)."""
    try:
        group.rmdir()
    except OSError:
        pass


class IdleGroup:
    """The host's side: moves its own threads (or its compile child) into the group npud
    made. A failed move is logged once, and the thread stays at ``SCHED_IDLE`` only."""

    def __init__(self, path: str, background_sched: str) -> None:
        self.path = Path(path) if path else None
        self.background_sched = background_sched
        self.joined = 0  # threads and processes moved in (tests, stats)
        self._warned = False

    def join_this_thread(self, kind: str) -> bool:
        """The calling thread, if a thread of ``kind`` joins (:func:`joins`)."""
        import threading

        if self.path is None or not joins(kind, self.background_sched):
            return False
        return self._write("tasks", threading.get_native_id())

    def join_process(self, pid: int, *, can_raise: bool) -> bool:
        """Every thread of process ``pid`` (the compile child), if it joins."""
        if self.path is None or not joins(COMPILE_CHILD, self.background_sched,
                                          child_can_raise=can_raise):
            return False
        return self._write("cgroup.procs", pid)

    def _write(self, name: str, ident: int) -> bool:
        assert self.path is not None
        try:
            fd = os.open(self.path / name, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, f"{ident}\n".encode())
            finally:
                os.close(fd)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("background threads stay out of %s (SCHED_IDLE only): %s",
                            self.path, exc.strerror or exc)
            return False
        self.joined += 1
        return True
