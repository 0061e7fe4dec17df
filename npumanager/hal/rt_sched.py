"""A thread's real-time class: SCHED_FIFO in, SCHED_OTHER out, and what npud checks first.

A SCHED_FIFO thread runs before every normal thread on its CPU until it blocks or a
higher FIFO thread wakes, so #15 puts the camera's frame path there while it serves
FOREGROUND work (bench/README.md: "Real-time foreground threads"). Linux lets a thread *leave*
SCHED_FIFO without privilege (:func:`set_other` on one's own threads) but *enter* it only
with CAP_SYS_NICE or RLIMIT_RTPRIO > 0; here (a VM whose root has CAP_SYS_NICE but not
CAP_SYS_RESOURCE, the hard RLIMIT_RTPRIO 0) only root's npud can, so npud applies
:func:`set_fifo` to a thread id it has checked, and this module is what both sides share:

* :func:`set_fifo` / :func:`set_other`: the policy change, by thread id, as an :class:`RtSet`
  (``ok`` False with the reason where the kernel refuses: EPERM without CAP_SYS_NICE,
  ESRCH for a thread gone). With ``tgid`` given, :func:`set_fifo` checks the thread
  belongs to that process before the call and again after it, and lowers it again if the
  id was reused in between (a thread id is recycled only after the kernel's whole pid
  space, 4M here, has wrapped, but the check costs one /proc read).
* :func:`sched_of`: a thread's policy, RT priority and reset-on-fork flag.
* :func:`owner_of`: the process (Tgid) and real uid a thread id belongs to
  (/proc/<tid>/status: /proc resolves any thread id, not only a process's leader).
* :func:`cpu_ns`: a thread's CPU time in ns (/proc/<tgid>/task/<tid>/schedstat, the
  scheduler's own sum of run time), to bound how long a FIFO thread may run.

A FIFO thread is set SCHED_RESET_ON_FORK, so a process it forks (a compile child) starts
normal. An unprivileged thread may not clear that flag, so :func:`set_other` keeps it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from npumanager.errors import InvalidArgument

#: The RT priorities npumanager hands out: 1..MAX_PRIORITY of the kernel's 1..99. Kept low
#: so the kernel's own RT threads (irq threads at 50, migration/watchdog at 99) stay above.
MIN_PRIORITY = 1
MAX_PRIORITY = 10


@dataclass(frozen=True, slots=True)
class RtSet:
    """What :func:`set_fifo` / :func:`set_other` did: ``ok`` (truthy) when the thread now
    has the policy asked for; ``why``: where not, what refused it."""

    ok: bool
    why: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True, slots=True)
class ThreadSched:
    """A thread's scheduling class: ``policy`` (os.SCHED_*, without the reset flag), its
    RT ``priority`` (0 for normal policies) and whether it is ``reset_on_fork``."""

    policy: int
    priority: int
    reset_on_fork: bool

    @property
    def fifo(self) -> bool:
        return self.policy == os.SCHED_FIFO


@dataclass(frozen=True, slots=True)
class ThreadOwner:
    """Whose a thread id is: its process (``tgid``) and that process's real ``uid``."""

    tgid: int
    uid: int


def check_priority(priority: int) -> int:
    """``priority`` if it is a whole number MIN_PRIORITY..MAX_PRIORITY; InvalidArgument
    otherwise."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidArgument(f"an RT priority is a whole number, not {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidArgument(f"an RT priority must be {MIN_PRIORITY}..{MAX_PRIORITY}, "
                              f"not {priority}")
    return priority


def _tid(tid: int) -> int:
    if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
        raise InvalidArgument(f"a thread id is a whole number >= 0, not {tid!r}")
    return tid


def sched_of(tid: int = 0) -> ThreadSched | None:
    """Thread ``tid``'s scheduling class (0: the calling thread); None for a thread gone."""
    tid = _tid(tid)
    try:
        raw = os.sched_getscheduler(tid)
        prio = os.sched_getparam(tid).sched_priority
    except OSError:
        return None
    return ThreadSched(raw & ~os.SCHED_RESET_ON_FORK, prio, bool(raw & os.SCHED_RESET_ON_FORK))


def owner_of(tid: int) -> ThreadOwner | None:
    """The process and real uid thread ``tid`` belongs to; None for no such thread."""
    tid = _tid(tid)
    if tid == 0:
        raise InvalidArgument("owner_of needs a thread id, not 0")
    tgid = uid = -1
    try:
        with open(f"/proc/{tid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    tgid = int(line.split()[1])
                elif line.startswith("Uid:"):
                    uid = int(line.split()[1])  # real, effective, saved, fs: the real one
                    break
    except (OSError, ValueError, IndexError):
        return None
    if tgid <= 0 or uid < 0:
        return None
    return ThreadOwner(tgid, uid)


def is_thread_of(tid: int, tgid: int) -> bool:
    """True when thread id ``tid`` is now a thread of process ``tgid``."""
    own = owner_of(tid) if tid > 0 else None
    return own is not None and own.tgid == tgid


def cpu_ns(tid: int, tgid: int | None = None) -> int | None:
    """Thread ``tid``'s CPU time so far in ns (the scheduler's sum_exec_runtime), read
    under process ``tgid`` when given (so a thread id of another process reads None);
    None for a thread gone."""
    tid = _tid(tid)
    path = (f"/proc/{tgid}/task/{tid}/schedstat" if tgid is not None
            else "/proc/thread-self/schedstat" if tid == 0 else f"/proc/{tid}/schedstat")
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _setscheduler(tid: int, policy: int, priority: int) -> str:
    """'' when the kernel took it, else why not."""
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(priority))
    except OSError as e:
        return f"sched_setscheduler: {e.strerror or e}"
    return ""


def set_fifo(tid: int, priority: int, tgid: int | None = None) -> RtSet:
    """Put thread ``tid`` (0: the calling thread) at SCHED_FIFO ``priority`` with
    reset-on-fork. With ``tgid``, only if the thread is one of that process's, checked
    before and after the call (a thread that turned out another's is lowered again).
    InvalidArgument for a priority outside MIN..MAX_PRIORITY."""
    check_priority(priority)
    tid = _tid(tid)
    if tgid is not None:
        if tid == 0:
            raise InvalidArgument("set_fifo with a tgid needs the thread's id, not 0")
        if not is_thread_of(tid, tgid):
            return RtSet(False, f"thread {tid} is not a thread of process {tgid}")
    why = _setscheduler(tid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, priority)
    if why:
        return RtSet(False, why)
    if tgid is not None and not is_thread_of(tid, tgid):
        _setscheduler(tid, os.SCHED_OTHER | os.SCHED_RESET_ON_FORK, 0)
        return RtSet(False, f"thread {tid} left process {tgid} during the call; lowered again")
    return RtSet(True)


def set_other(tid: int = 0) -> RtSet:
    """Put thread ``tid`` (0: the calling thread) back at SCHED_OTHER, its nice value and
    reset-on-fork flag kept (an unprivileged thread may not clear that flag). Needs no
    privilege for one's own threads."""
    tid = _tid(tid)
    now = sched_of(tid)
    if now is None:
        return RtSet(False, f"no thread {tid}")
    flag = os.SCHED_RESET_ON_FORK if now.reset_on_fork else 0
    why = _setscheduler(tid, os.SCHED_OTHER | flag, 0)
    return RtSet(not why, why)


#: The RLIMIT_RTTIME hard limit (µs) of a process whose threads npud puts at FIFO: a thread
#: that runs this long at RT without blocking is killed by the kernel (SIGKILL). A driver
#: host lowers its own to this before it gives up root (cli/driver.py), which no
#: unprivileged process can undo; npud checks it (:func:`rttime_limits`) before a grant.
RTTIME_HARD_US = 500_000
#: RLIMIT_RTTIME's soft limit (µs) such a process sets for itself: a FIFO thread that runs
#: this long without blocking gets SIGXCPU, on which the process lowers its FIFO threads
#: (drivers/rt_threads.py for a host, hal/rt_backstop.py for an app): 50 ms, ten times
#: foreground_rt_max_run_us's default, two frames of a 30 fps camera.
RTTIME_SOFT_US = 50_000


def rttime_limits(pid: int) -> tuple[int | None, int | None] | None:
    """Process ``pid``'s RLIMIT_RTTIME (soft, hard) in µs, None for unlimited, read from
    /proc/<pid>/limits (prlimit of another uid's process needs CAP_SYS_RESOURCE; this
    does not); None when the process is gone or the line unreadable."""
    try:
        with open(f"/proc/{pid}/limits", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Max realtime timeout"):
                    soft, hard = line.split()[3:5]
                    return (None if soft == "unlimited" else int(soft),
                            None if hard == "unlimited" else int(hard))
    except (OSError, ValueError):
        return None
    return None


def drop_own_rtprio() -> None:
    """This process's RLIMIT_RTPRIO to 0, soft and hard (lowering needs no privilege and
    cannot be refused; raising it back needs CAP_SYS_RESOURCE): it and its children can
    then never put a thread of their own at SCHED_FIFO/RR; only a process with
    CAP_SYS_NICE (npud, after its checks) can."""
    import resource

    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))


def bound_own_rttime(hard_us: int = RTTIME_HARD_US) -> str:
    """This process's RLIMIT_RTTIME hard limit to at most ``hard_us`` (its soft one kept at
    or below it): lowering needs no privilege, raising it back CAP_SYS_RESOURCE. '' when
    done, else why not."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_RTTIME)
        new_hard = hard_us if hard == resource.RLIM_INFINITY else min(hard, hard_us)
        new_soft = new_hard if soft == resource.RLIM_INFINITY else min(soft, new_hard)
        resource.setrlimit(resource.RLIMIT_RTTIME, (new_soft, new_hard))
    except (OSError, ValueError) as e:
        return f"RLIMIT_RTTIME not lowered: {e}"
    return ""
