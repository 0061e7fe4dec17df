"""npud's side of the compile starvation bound where a driver host may not apply it itself
(bench/README.md: ``background_starve_ms``; drivers/compile_starve.py).

A BACKGROUND prepare compiles at SCHED_IDLE (the host's compile child, or a lowered host
thread with its g++ children). Past the bound the host raises the starved compile to nice
0 for one bound, but leaving SCHED_IDLE needs RLIMIT_NICE 20, which a host gets only where
its root could set it (CAP_SYS_RESOURCE; systemd's LimitNICE). Without it the host asks
(``hal.request_raise``, hal/raise_wire.py, on the link npud opened to it) and npud, after
checking, raises the tree here and answers (``hal.raise_applied``). What npud checks:

* the driver's bound is on (``background_starve_ms`` > 0 and ``background_sched`` idle or
  share: nothing else is lowered to SCHED_IDLE);
* the host is a process this npud started and has not exited (its pid from the spawn,
  never the socket's peer credentials, as service/host_rt.py);
* the target is that host's thread (never the whole host: a thread id is needed) or a
  process descending from it (its PPid chain reaches the host), of the host's real uid;
  so never npud, pid 1, another uid's process, or one of the driver user's own processes
  that the host did not start; checked again after the call, each raised thread too,
  and one that turned out another's is lowered again;
* at most one raise per host per 1.5 bounds (:data:`RATE_BOUNDS`; the host's own decision
  asks one per two: raised one bound, then another bound of starvation before the next):
  a flood of requests gets refusals, not normal priority.

Only threads at SCHED_IDLE are raised, and only to SCHED_OTHER at nice 0: never below 0,
never real-time (hal/proc_tree.py). The host lowers them again after one bound (no
privilege needed); npud does too, one bound after the raise, for those it raised that
are still at nice 0. Why npud lowers them as well: a raise then lasts one bound whatever
the host does (a host that hangs or is subverted cannot turn one grant into normal
priority for good), and it costs npud one timer per raise, at most one per 1.5 bounds
per host. It is defence in depth rather than a privilege bound: nice 0 is where every
process starts, and a host could fork its compiles at nice 0 in the first place.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from npumanager.clock import LoopClock
from npumanager.errors import InvalidArgument, LimitExceeded, NpuError, PermissionDenied
from npumanager.fds import close_fds
from npumanager.hal import proc_tree, raise_wire
from npumanager.wire.conn import CallContext

log = logging.getLogger("npumanager.service.host_raise")

#: A host's raises are at least this many bounds apart. The host's own rhythm is two (raised
#: one bound, then another bound of starvation); the half bound of slack absorbs the delay
#: of a request on a busy loop, so the host's rhythm is never refused. Normal priority is
#: then at most 1 / 1.5 of a compile's wall time, whatever the host asks.
RATE_BOUNDS = 1.5


class HostRaises:
    """The raises npud made for driver hosts' starved compiles."""

    def __init__(self, clock: LoopClock) -> None:
        self._clock = clock
        self._last: dict[int, float] = {}  # host pid: when npud last raised for it
        #: (when, host pid, threads): raised threads npud lowers again at ``when``.
        self._due: list[tuple[float, int, list[tuple[int, int]]]] = []
        self._warned = False
        self.raised = self.refused = self.lowered = 0

    def raise_tree(self, host: int | str | None, pid: int, tid: int, bound_s: float) -> int:
        """Raise the tree ``(pid, tid)`` (hal/proc_tree.py; ``-tid``: thread ``tid`` alone)
        of driver host process ``host`` for ``bound_s`` if every check holds (``bound_s``:
        the driver's bound, 0 off); the number of threads raised. Refused with a typed
        error: InvalidArgument (no such ids, the whole host, nothing at SCHED_IDLE),
        PermissionDenied (the bound off, not a host npud started, not the host's, npud
        not permitted), LimitExceeded (the rate bound)."""
        try:
            n = self._raise(host, pid, tid, bound_s)
        except NpuError as e:
            self.refused += 1
            if "not permitted" in str(e) and not self._warned:
                self._warned = True
                log.warning("cannot raise driver hosts' starved compiles (%s): npud lacks "
                            "CAP_SYS_NICE; they stay at SCHED_IDLE", e)
            raise
        self.raised += 1
        return n

    def _raise(self, host: int | str | None, pid: int, tid: int, bound_s: float) -> int:
        if bound_s <= 0:
            raise PermissionDenied("the compile starvation bound is off for this driver")
        host = host_of(host)
        alone, tid = tid < 0, abs(tid)  # (a negative thread id: that thread alone)
        if pid <= 0 or tid > 0x3FFFFFFF:
            raise InvalidArgument(f"no process {pid} thread {tid}")
        if pid == host and tid == 0:
            raise InvalidArgument("a whole driver host is never raised: name its compiling "
                                  "thread")
        owner = self.check(host, pid, tid)
        now = self._clock.now()
        last = self._last.get(host)
        if last is not None and now < last + RATE_BOUNDS * bound_s:
            raise LimitExceeded(f"driver host {host} had a compile raised {now - last:.3f} s "
                                f"ago: at most one raise per {RATE_BOUNDS * bound_s:g} s")
        try:
            raised = proc_tree.raise_idle([(pid, tid)] if alone else proc_tree.tree(pid, tid))
        except PermissionError as e:
            raise PermissionDenied(f"sched_setscheduler: {e.strerror or e} "
                                   f"(not permitted)") from None
        # Checked again: the target, and each thread raised (a pid reused during the walk
        # by another's process is lowered again).
        wrong = self._not_its(host, owner.uid, pid, tid)
        stray = [(p, t) for p, t in raised
                 if wrong or self._not_its(host, owner.uid, p, t)]
        if stray:
            proc_tree.lower_to_idle(stray)
            raised = [x for x in raised if x not in stray]
        if wrong:
            raise PermissionDenied(f"{wrong} (after the call; lowered again)")
        if not raised:
            raise InvalidArgument(f"nothing of process {pid} thread {tid} is at SCHED_IDLE")
        self._last[host] = now
        self._due.append((now + bound_s, host, raised))
        self._arm(now + bound_s)
        return len(raised)

    def check(self, host: int, pid: int, tid: int) -> proc_tree.ProcInfo:
        """The host's own info if the tree ``(pid, tid)`` (``-tid``: the thread alone) is
        its to raise; PermissionDenied otherwise, InvalidArgument for the whole host."""
        if pid == host and tid == 0:
            raise InvalidArgument("a whole driver host is never raised: name its compiling "
                                  "thread")
        owner = proc_tree.proc_info(host)
        if owner is None:
            raise PermissionDenied(f"driver host {host} is gone")
        why = self._not_its(host, owner.uid, pid, abs(tid))
        if why:
            raise PermissionDenied(why)
        return owner

    @staticmethod
    def _not_its(host: int, uid: int, pid: int, tid: int) -> str:
        """Why ``(pid, tid)`` is not host ``host``'s to raise ('' when it is)."""
        info = proc_tree.proc_info(pid)
        if info is None or not proc_tree.descends_from(pid, host):
            return f"process {pid} is not driver host {host} or a process it started"
        if info.uid != uid:
            return f"process {pid} runs as uid {info.uid}, not the host's uid {uid}"
        if tid and not os.path.exists(f"/proc/{pid}/task/{tid}"):
            return f"thread {tid} is not a thread of process {pid}"
        return ""

    def _arm(self, when: float) -> None:
        try:
            self._clock.call_at(when, self._fire)
        except RuntimeError:
            pass  # (off any loop, as a test is: :meth:`tick` by hand)

    def _fire(self) -> None:
        self.tick()

    def tick(self) -> int:
        """Lower again what npud raised one bound ago and is still at nice 0 (unless the
        host did already); how many threads it lowered."""
        now, keep, n = self._clock.now(), [], 0
        for when, host, threads in self._due:
            if when > now:
                keep.append((when, host, threads))
                continue
            owner = proc_tree.proc_info(host)
            mine = [(p, t) for p, t in threads
                    if owner is not None and not self._not_its(host, owner.uid, p, t)]
            n += proc_tree.lower_to_idle(mine)
        self._due = keep
        self.lowered += n
        return n

    def pending(self) -> int:
        """Raises not yet lowered by npud (tests)."""
        return len(self._due)

    def handler(self, pid_of: Callable[[], int | str | None], bound_s: float
                ) -> Callable[[CallContext, bytes], None]:
        """The ``hal.request_raise`` handler of one driver's link: ``pid_of()`` is the pid
        of the host process npud started (or adopted, recorded) for it; a text: why there
        is none (service/supervisor.py)."""

        def on_request(ctx: CallContext, payload: bytes) -> None:
            close_fds(ctx.fds)
            try:
                pid, tid = raise_wire.decode_request(payload)
            except ValueError as e:
                log.warning("driver host sent a bad %s: %s", raise_wire.REQUEST, e)
                return
            try:
                self.raise_tree(pid_of(), pid, tid, bound_s)
                ok, why = True, ""
            except NpuError as e:  # (its type leads the answer's text)
                ok, why = False, f"{type(e).__name__}: {e}"
            if not ctx.conn.closed:
                ctx.conn.push(raise_wire.APPLIED, raise_wire.encode_applied(pid, tid, ok, why))

        return on_request


def host_of(host: int | str | None) -> int:
    """The host's pid; PermissionDenied where the supervisor said why there is none."""
    if host is None or isinstance(host, str):
        raise PermissionDenied(host or "not a host this npud started (adopted, or exited)")
    return host


def bound_of(entry: dict[str, object]) -> float:
    """The compile starvation bound (s) of a ``[[driver]]`` entry: 0 where nothing of its
    host's compiles is at SCHED_IDLE (``background_sched`` nice or normal)."""
    if str(entry.get("background_sched", "idle")) not in ("idle", "share"):
        return 0.0
    ms = entry.get("background_starve_ms", 200)
    return max(0.0, float(ms if isinstance(ms, (int, float)) else 0)) / 1e3
