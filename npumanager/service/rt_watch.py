"""Real-time threads granted to apps: who may have one, and when npud takes it back.

Android's SchedulingPolicyService grants SCHED_FIFO to a calling app's own audio thread
after checking the caller; npud does the same for FOREGROUND apps (#15: the camera's
frame thread waits to be woken behind normal threads while a model loads). A FIFO
thread runs before every normal thread on its CPU until it blocks, so every app is a
hostile local user here and this module is the whole of what npud allows:

* :meth:`RtWatch.check`: a request is refused (a typed error) unless the feature is on
  (``[manager] app_rt_priority`` > 0), the thread is one of the *calling process's* own
  (its Tgid is the peer's SO_PEERCRED pid and its uid the peer's uid, read from /proc by
  the shell right before), not npud's, the caller's importance in npud's table is
  ``app_rt_importance`` (FOREGROUND, 100; VISIBLE, 200, under foreground protection) or
  more important, the uid holds fewer than ``app_rt_max_threads``
  (2) and is not in a cooldown.
* :meth:`RtWatch.tick` (the shell samples each granted thread's CPU time from its
  schedstat every ``app_rt_sample_s``): a thread is demoted back to SCHED_OTHER when it
  used more than ``app_rt_max_cpu_ms`` of CPU in the last ``app_rt_window_s`` (a frame
  thread that blocks between frames uses a few ms; a spinner is taken back within the
  budget plus one sampling period), when its uid's importance is no longer within
  ``app_rt_importance``,
  or when it is gone. A CPU demotion starts the uid's cooldown (``app_rt_cooldown_s``):
  no new grant for any of its threads, so rotating threads gains nothing.
* :meth:`RtWatch.conn_closed`: a grant lives as long as the connection that asked.

Pure: events in with ``now``, :class:`Demote` instructions out; no /proc, no syscalls
(service/rt_apps.py is the shell, hal/rt_sched.py the primitives).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from npumanager.constants import Importance
from npumanager.errors import (
    InvalidArgument,
    LimitExceeded,
    PermissionDenied,
    RealtimeUnavailable,
)
from npumanager.words import plural

#: The least important importance that may hold a real-time thread, by default
#: (``[manager] app_rt_importance``; foreground protection sets VISIBLE, voice29).
RT_IMPORTANCE = int(Importance.FOREGROUND)
#: The least important it may be set to: an app the user sees (a voice assistant).
RT_IMPORTANCE_MAX = int(Importance.VISIBLE)


class CpuWindow:
    """A granted thread's CPU samples (time, ns) over the last ``window_s``: what both
    watchdogs (app threads here, driver-host threads in .host_rt_watch) bound. The newest
    sample at or before the window's start is kept as the base, so the sum covers the
    whole window."""

    __slots__ = ("samples", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, cpu_ns: int) -> int:
        """One sample; the CPU used over the window now."""
        q = self.samples
        q.append((now, cpu_ns))
        while len(q) > 2 and q[1][0] <= now - self.window_s:
            q.popleft()
        return self.used_ns()

    def used_ns(self) -> int:
        """CPU used between the oldest sample kept and the newest."""
        q = self.samples
        return q[-1][1] - q[0][1] if len(q) >= 2 else 0

    def span_s(self) -> float:
        q = self.samples
        return q[-1][0] - q[0][0] if q else 0.0


@dataclass(frozen=True, slots=True)
class RtLimits:
    """The ``[manager] app_rt_*`` keys."""

    #: SCHED_FIFO priority given (0: the feature is off).
    priority: int = 0
    max_threads: int = 2
    #: CPU a granted thread may use in any ``window_s`` before it is demoted.
    max_cpu_ms: float = 200.0
    window_s: float = 1.0
    cooldown_s: float = 10.0
    sample_s: float = 0.15
    #: The least important importance whose apps may hold one (100..200).
    importance: int = RT_IMPORTANCE

    @classmethod
    def from_section(cls, m: Mapping[str, Any]) -> RtLimits:
        d = cls()
        return cls(priority=int(m.get("app_rt_priority", d.priority)),
                   max_threads=int(m.get("app_rt_max_threads", d.max_threads)),
                   max_cpu_ms=float(m.get("app_rt_max_cpu_ms", d.max_cpu_ms)),
                   window_s=float(m.get("app_rt_window_s", d.window_s)),
                   cooldown_s=float(m.get("app_rt_cooldown_s", d.cooldown_s)),
                   sample_s=float(m.get("app_rt_sample_s", d.sample_s)),
                   importance=int(m.get("app_rt_importance", d.importance)))


@dataclass(slots=True)
class RtGrant:
    """One granted thread: whose (peer uid and pid, npud's key for it, the connection
    that asked) and its CPU over the last window (set when it is granted)."""

    uid: int
    pid: int
    key: int
    conn: int
    tid: int
    since: float
    cpu: CpuWindow = field(default_factory=lambda: CpuWindow(1.0))


class Demote(NamedTuple):
    """Put ``grant``'s thread back to SCHED_OTHER (the shell checks first that the thread
    id is still that process's and uid's, so a reused id is never touched)."""

    grant: RtGrant
    #: "cpu", "not-foreground" (less important than app_rt_importance), "gone",
    #: "connection-closed" or "stopping".
    why: str
    detail: str


class RtWatch:
    """The granted threads and the uids in cooldown; see the module docstring."""

    def __init__(self, limits: RtLimits) -> None:
        self.limits = limits
        self.grants: dict[int, RtGrant] = {}  # by thread id
        self.cooldown_until: dict[int, float] = {}  # uid -> time
        self.granted_total = 0
        self.demoted_total: dict[str, int] = {}

    def __repr__(self) -> str:
        return (f"<RtWatch priority={self.limits.priority} | {len(self.grants)} granted, "
                f"{len(self.cooldown_until)} uid(s) in cooldown>")

    def of_uid(self, uid: int) -> list[RtGrant]:
        return [g for g in self.grants.values() if g.uid == uid]

    def check(self, now: float, *, uid: int, pid: int, key: int, conn: int, tid: int,
              owner: tuple[int, int] | None, importance: int, npud_pid: int) -> RtGrant:
        """The grant to apply for thread ``tid`` asked by peer (``uid``, ``pid``) on
        connection ``conn``; ``owner`` is (Tgid, uid) of the thread as /proc has it now
        (None: no such thread). Raises the refusal. A thread already granted to the same
        caller comes back as its grant (asking twice counts once)."""
        lim = self.limits
        if lim.priority <= 0:
            raise RealtimeUnavailable("real-time threads are off in npud's config "
                                      "([manager] app_rt_priority = 0)")
        if tid <= 0:
            raise InvalidArgument(f"a thread id is > 0, not {tid}")
        if owner is None:
            raise InvalidArgument(f"no thread {tid}")
        tgid, tuid = owner
        if pid <= 0 or tgid != pid or tuid != uid:
            raise PermissionDenied(f"thread {tid} is not a thread of the calling process "
                                   f"(pid {pid}, uid {uid}): only a caller's own threads "
                                   "get real-time priority")
        if tgid == npud_pid:
            raise PermissionDenied("npud's own threads get no real-time priority")
        until = self.cooldown_until.get(uid)
        if until is not None and now < until:
            raise LimitExceeded(f"uid {uid}'s real-time thread was demoted for using more "
                                f"than {lim.max_cpu_ms:g} ms of CPU in {lim.window_s:g} s; "
                                f"no new grant for {until - now:.1f} s")
        if importance > lim.importance:
            name = next((i.name for i in Importance if i == lim.importance), "importance")
            raise PermissionDenied(f"uid {uid}'s importance is {importance}; real-time "
                                   f"threads are for {name} ({lim.importance}) or more "
                                   "important apps ([manager] app_rt_importance)")
        held = self.grants.get(tid)
        if held is not None:
            if held.pid == pid and held.uid == uid:
                return held
            # The id was granted to a process that is gone and reused (the shell demotes
            # a gone thread at its next sample): this one is a new thread.
            del self.grants[tid]
        n = len(self.of_uid(uid))
        if n >= lim.max_threads:
            raise LimitExceeded(f"uid {uid} holds {plural(n, 'real-time thread')}, the "
                                f"most npud grants ([manager] app_rt_max_threads = "
                                f"{lim.max_threads})")
        return RtGrant(uid, pid, key, conn, tid, now)

    def granted(self, grant: RtGrant, now: float, cpu_ns: int | None) -> None:
        """The kernel took ``grant`` (the shell applied it); its CPU starts counting."""
        if grant.tid not in self.grants:
            self.granted_total += 1
        self.grants[grant.tid] = grant
        if not grant.cpu.samples:
            grant.cpu.window_s = self.limits.window_s
            if cpu_ns is not None:
                grant.cpu.add(now, cpu_ns)

    def tick(self, now: float, cpu_ns: Mapping[int, int | None],
             importance: Callable[[int], int]) -> list[Demote]:
        """One sample of every granted thread's CPU time (``cpu_ns`` by thread id; None:
        gone) and its key's importance now: the threads to demote."""
        for uid in [u for u, t in self.cooldown_until.items() if now >= t]:
            del self.cooldown_until[uid]
        lim = self.limits
        budget_ns = lim.max_cpu_ms * 1e6
        out: list[Demote] = []
        for g in list(self.grants.values()):
            cpu = cpu_ns.get(g.tid)
            if cpu is None:
                out.append(self._demote(g, "gone", f"thread {g.tid} of pid {g.pid} is gone"))
                continue
            used = g.cpu.add(now, cpu)
            if used > budget_ns:
                self.cooldown_until[g.uid] = now + lim.cooldown_s
                out.append(self._demote(
                    g, "cpu", f"thread {g.tid} used {used / 1e6:.0f} ms of CPU in "
                    f"{g.cpu.span_s():.2f} s (bound {lim.max_cpu_ms:g} ms in "
                    f"{lim.window_s:g} s); uid {g.uid} gets no grant for {lim.cooldown_s:g} s"))
                continue
            imp = importance(g.key)
            if imp > lim.importance:
                out.append(self._demote(g, "not-foreground",
                                        f"uid {g.uid}'s importance is now {imp}"))
        return out

    def conn_closed(self, conn: int) -> list[Demote]:
        """The connection ``conn`` closed: its grants end."""
        return [self._demote(g, "connection-closed", f"connection {conn} closed")
                for g in list(self.grants.values()) if g.conn == conn]

    def stop(self) -> list[Demote]:
        """npud stops: every grant ends (no watchdog would be left to bound them)."""
        return [self._demote(g, "stopping", "npud is stopping")
                for g in list(self.grants.values())]

    def _demote(self, g: RtGrant, why: str, detail: str) -> Demote:
        self.grants.pop(g.tid, None)
        self.demoted_total[why] = self.demoted_total.get(why, 0) + 1
        return Demote(g, why, detail)

    def info(self) -> dict[str, Any]:
        """For the dump (an admin's view)."""
        return {"priority": self.limits.priority,
                "granted": [{"uid": g.uid, "pid": g.pid, "tid": g.tid, "since": g.since,
                             "cpu_ms_in_window": round(g.cpu.used_ns() / 1e6, 1)}
                            for g in self.grants.values()],
                "cooldown": {str(u): t for u, t in self.cooldown_until.items()},
                "granted_total": self.granted_total,
                "demoted_total": dict(self.demoted_total)}
