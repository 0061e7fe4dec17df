"""A compile's process tree in /proc, and its threads raised from SCHED_IDLE to nice 0 and
lowered back: what both the driver host and npud use for the compile starvation bound
(drivers/compile_starve.py, service/host_raise.py).

A tree is named by ``(pid, tid)``: ``tid`` 0 is every thread of process ``pid`` and every
process descending from it (the compile child); a thread id is that thread of ``pid`` and
every process it forked, and theirs (a host thread compiling with torch's g++ children).
A thread's children are read from ``/proc/<pid>/task/<tid>/children`` (the kernel lists a
child under the thread that forked it), so a tree never takes in the host's other threads
or another compile's children.

Only SCHED_IDLE threads are raised, and only to SCHED_OTHER at nice 0, never below, never
real-time; lowering puts a thread at SCHED_OTHER nice 0 back to SCHED_IDLE. A tree is at
most ``MAX_THREADS`` threads (npud walks it for a request: its work stays bounded).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The most threads a tree is taken to have (those past it are left as they are).
MAX_THREADS = 512
#: The most parents walked up from a process to find the host (a deeper one is not its).
MAX_DEPTH = 32


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """Of a process (or thread) id: its parent process and its real uid."""

    ppid: int
    uid: int


def proc_info(pid: int) -> ProcInfo | None:
    """``pid``'s parent and real uid (/proc/<pid>/status); None for no such process."""
    ppid = uid = -1
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("PPid:"):
                    ppid = int(line.split()[1])
                elif line.startswith("Uid:"):
                    uid = int(line.split()[1])  # real, effective, saved, fs: the real one
                    break
    except (OSError, ValueError, IndexError):
        return None
    return None if ppid < 0 or uid < 0 else ProcInfo(ppid, uid)


def descends_from(pid: int, ancestor: int) -> bool:
    """True when process ``pid`` is ``ancestor`` or descends from it (its PPid chain,
    at most MAX_DEPTH parents up, reaches ``ancestor``)."""
    if pid <= 0 or ancestor <= 0:
        return False
    for _ in range(MAX_DEPTH):
        if pid == ancestor:
            return True
        info = proc_info(pid)
        if info is None or info.ppid <= 1:
            return False
        pid = info.ppid
    return False


def threads_of(pid: int) -> list[int]:
    """The thread ids of process ``pid`` ([] when it is gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []


def children_of(pid: int, tid: int) -> list[int]:
    """The processes thread ``tid`` of ``pid`` forked that still run."""
    try:
        with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def tree(pid: int, tid: int = 0) -> list[tuple[int, int]]:
    """(pid, tid) of every thread of the tree ``(pid, tid)`` (see the module docstring),
    at most MAX_THREADS; [] when its root is gone."""
    out: list[tuple[int, int]] = []
    if tid:
        if not os.path.exists(f"/proc/{pid}/task/{tid}"):
            return []
        roots = [(pid, tid)]
    else:
        roots = [(pid, t) for t in threads_of(pid)]
    todo = list(roots)
    seen = {pid}
    while todo and len(out) < MAX_THREADS:
        p, t = todo.pop(0)
        out.append((p, t))
        for child in children_of(p, t):
            if child not in seen:
                seen.add(child)
                todo.extend((child, ct) for ct in threads_of(child))
    return out


def thread_cpu(pid: int, tid: int) -> tuple[float, bool] | None:
    """Thread ``tid`` of ``pid``: its CPU time (user + system, s) and whether it is
    runnable now (state R); None when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        ticks = int(fields[11]) + int(fields[12])
    except (ValueError, IndexError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK"), fields[0] == b"R"


def raise_idle(threads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each of ``threads`` that is at SCHED_IDLE to SCHED_OTHER at nice 0; the ones raised.
    PermissionError when the kernel refuses (no privilege: RLIMIT_NICE below 20, not
    CAP_SYS_NICE); a thread gone meanwhile is skipped."""
    done = []
    for pid, tid in threads:
        try:
            if (os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK != os.SCHED_IDLE
                    or not os.path.exists(f"/proc/{pid}/task/{tid}")):
                continue
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, 0)
        except ProcessLookupError:
            continue
        done.append((pid, tid))
    return done


def lower_to_idle(threads: list[tuple[int, int]]) -> int:
    """Each of ``threads`` still a thread of its process and at SCHED_OTHER nice 0 back to
    SCHED_IDLE (needs no privilege for one's own); how many were lowered."""
    n = 0
    for pid, tid in threads:
        try:
            if (os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK != os.SCHED_OTHER
                    or os.getpriority(os.PRIO_PROCESS, tid) != 0
                    or not os.path.exists(f"/proc/{pid}/task/{tid}")):
                continue
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            n += 1
        except OSError:
            continue
    return n


class TreeProgress:
    """A thread tree's progress clock: its CPU time, plus the wall time it spent with no
    thread runnable (blocked, not starved). Wall time less this is its starvation."""

    def __init__(self, pid: int, tid: int, children: bool = True) -> None:
        self.pid, self.tid, self.children = pid, tid, children
        self._cpu: dict[tuple[int, int], float] = {}
        self._at: float | None = None
        self.progress = 0.0

    def sample(self, now: float) -> float | None:
        """The progress so far; None when the tree's root thread is gone."""
        threads = (tree(self.pid, self.tid) if self.children
                   else [(self.pid, self.tid)] if thread_cpu(self.pid, self.tid)
                   else [])
        if not threads:
            return None
        seen: dict[tuple[int, int], float] = {}
        runnable, moved = False, 0.0
        for key in threads:
            got = thread_cpu(*key)
            if got is None:
                continue
            cpu, running = got
            seen[key] = cpu
            runnable = runnable or running
            # (a thread new since the last sample started after it: all its time counts)
            moved += cpu - self._cpu.get(key, 0.0 if self._at is not None else cpu)
        if self._at is not None:
            self.progress += moved if runnable else max(moved, now - self._at)
        self._cpu, self._at = seen, now
        return self.progress
