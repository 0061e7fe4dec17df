"""A bound on how long a background compile starves at SCHED_IDLE (the compile child).

A BACKGROUND model compiles in the host's compile child (:mod:`.compile_worker`), lowered
as a whole: at SCHED_IDLE the kernel runs it only when no normal thread wants a core, so
on a machine kept busy by normal-priority work a prepare makes close to no progress (the
steps' case, :mod:`.starve`, measured 33x its CPU time there). Background *steps* get a
bound (``background_starve_ms``); so does a background prepare here:

* while a compile runs, the host watches the child, from the request on, or from the
  child's start when the request starts it (a new child imports ONNX Runtime and reads
  the request at SCHED_IDLE before its receipt: watched only from the receipt, a child
  starved before it was never raised): its wait (wall time since then, less the CPU
  time the child used meanwhile) past the bound raises the child's
  every thread to SCHED_OTHER at nice 0 for one bound of wall time, then lowers them
  again; the next raise needs another bound of starvation. So a starved compile runs at
  normal priority about half the time, and a machine with idle cores never raises it (its
  wait stays near zero).
* time the child spends stopped by the quiet window (:mod:`.load_hold`) is not
  starvation: the watch starts over after it.

Raising needs the host to be allowed: an unprivileged process leaves SCHED_IDLE only if
its RLIMIT_NICE permits its nice value (sched(7), since 2.6.39: SCHED_IDLE counts as
nice 20, nice 0 needs a limit of 20), and the default limit is 0. A host started as root
(npud as root starts it so, then it becomes its driver user: ``npu driver --run-as``)
sets its RLIMIT_NICE to 20 before it drops root: its threads and its compile child may
then return to nice 0, never below (no more than any process starts with). A host
without that limit keeps its compile child at SCHED_IDLE throughout (``can_raise``
False; said once in its log and in ``device.stats``).

:class:`CompileStarve` is the decision, pure: time and the child's CPU time are passed
in.
"""

from __future__ import annotations

import os
import resource

#: RLIMIT_NICE that lets a thread at nice 0 leave SCHED_IDLE (20 - nice 0).
NICE_LIMIT_FOR_NICE_0 = 20


class CompileStarve:
    """When the compile child, lowered, runs at normal priority instead."""

    __slots__ = ("_boosted_at", "_cpu0", "_since", "boosts", "raised", "starve_s")

    def __init__(self, starve_s: float) -> None:
        #: 0: no bound (the child stays lowered).
        self.starve_s = starve_s
        self.raised = False
        self._since = 0.0
        self._cpu0 = 0.0
        self._boosted_at = 0.0
        self.boosts = 0  # times raised (stats, tests)

    def __repr__(self) -> str:
        return (f"<CompileStarve {self.starve_s * 1e3:g} ms: "
                f"{'raised' if self.raised else 'lowered'}, {self.boosts} boosts>")

    def counts(self) -> dict[str, float]:
        """For ``device.stats`` (``compile_child``): the bound in ms (0: off, as where the
        host may not raise the child) and how many times it raised the child so far."""
        return {"starve_ms": self.starve_s * 1e3, "raises": self.boosts}

    def begin(self, now: float, cpu_s: float) -> None:
        """A compile starts (the child lowered): its wait counts from here."""
        self.raised = False
        self.rebase(now, cpu_s)

    def rebase(self, now: float, cpu_s: float) -> None:
        """What came before ``now`` is not starvation (the child was stopped on purpose)."""
        self._since, self._cpu0 = now, cpu_s

    def tick(self, now: float, cpu_s: float) -> bool | None:
        """During a compile: True to raise the child now, False to lower it again, None to
        leave it as it is. ``cpu_s``: the child's CPU time so far (all its threads)."""
        if self.starve_s <= 0:
            return None
        if self.raised:
            if now - self._boosted_at >= self.starve_s:
                self.raised = False
                self.rebase(now, cpu_s)
                return False
            return None
        waited = (now - self._since) - (cpu_s - self._cpu0)
        if waited > self.starve_s:
            self.raised = True
            self._boosted_at = now
            self.boosts += 1
            return True
        return None

    def end(self) -> bool:
        """The compile is over: True when the child must be lowered again (it was raised)."""
        was, self.raised = self.raised, False
        return was


def can_raise(to_nice: int = 0) -> bool:
    """Whether this process (and a child it starts) may leave SCHED_IDLE (or a higher nice
    value) for nice ``to_nice``: root, or RLIMIT_NICE at least 20 - ``to_nice`` (the
    kernel's can_nice)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NICE)
    return os.geteuid() == 0 or soft == resource.RLIM_INFINITY or (
        soft >= NICE_LIMIT_FOR_NICE_0 - to_nice)


def allow_nice_0() -> None:
    """As root, before dropping it: let this process and its children return to nice 0
    (RLIMIT_NICE 20; never lower than 0). A limit already set higher is brought to 20."""
    try:
        resource.setrlimit(resource.RLIMIT_NICE,
                           (NICE_LIMIT_FOR_NICE_0, NICE_LIMIT_FOR_NICE_0))
    except (OSError, ValueError):
        pass  # not root: the limit stays, and so does the child at SCHED_IDLE


def process_cpu_s(pid: int) -> float | None:
    """CPU time (user + system, all threads) of process ``pid``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def set_process_sched(pid: int, sched: str, nice: int) -> None:
    """Every thread of ``pid`` to ``sched`` ("idle", "nice" at ``nice``, "normal": nice 0):
    a policy is per thread, and ONNX Runtime's pool threads exist already. PermissionError
    when the rlimit does not allow the raise; a thread that exits meanwhile is skipped."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return  # gone
    for tid in tids:
        try:
            if sched == "idle":
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            else:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, tid, nice if sched == "nice" else 0)
        except ProcessLookupError:
            continue
