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
then return to nice 0, never below (no more than any process starts with). Root may set
that limit only with CAP_SYS_RESOURCE, which it lacks in a container (and here): with
``compile_raise = "npud"`` (opt-in; bench/README.md has the numbers) such a host asks npud instead
(:class:`CompileRaiser`; ``hal.request_raise``, checked and applied by
service/host_raise.py), and lowers the child again itself (lowering needs no privilege).
A host with neither (``compile_raise = "self"``, no npud attached, npud refusing) leaves
the compile at SCHED_IDLE; ``device.stats``' ``compile_child`` says which way it raises
(``via``) and ``compile_raises`` how often it, or npud, did, and npud's refusals.

:class:`CompileStarve` is the decision, pure (hal/starve_bound.py, which npud uses too):
time and the child's CPU time are passed in. The same bound covers compiles that run in the
host itself (drivers/compile_watch.py).
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Callable

from npumanager.hal import proc_tree
from npumanager.hal.starve_bound import CompileStarve

log = logging.getLogger("npumanager.drivers.compile_starve")

__all__ = ["NICE_LIMIT_FOR_NICE_0", "CompileRaiser", "CompileStarve", "allow_nice_0",
           "can_raise", "process_cpu_s", "set_process_sched"]

#: RLIMIT_NICE that lets a thread at nice 0 leave SCHED_IDLE (20 - nice 0).
NICE_LIMIT_FOR_NICE_0 = 20


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


class CompileRaiser:
    """How the host raises a starved compile tree (hal/proc_tree.py: ``(pid, tid)``, tid 0
    a whole process) and lowers it again: itself where RLIMIT_NICE allows (``local``), by
    asking npud otherwise (``ask``, set once the host has its link: thread-safe, False when
    no npud is attached). Lowering is always the host's own."""

    def __init__(self, name: str, local: bool | None = None) -> None:
        self.name = name
        self.local = can_raise() if local is None else local
        self.ask: Callable[[int, int], bool] | None = None
        #: Ask npud to watch a compile in the host (tree, on): drivers/compile_watch.py.
        self.ask_watch: Callable[[int, int, bool], bool] | None = None
        #: npud said it never will (the bound off there, npud without CAP_SYS_NICE).
        self.refused = ""
        #: Counts: raised by the host itself, asked of npud, raised by npud, refused by it.
        self.own = self.asked = self.by_npud = self.npud_refused = 0

    @property
    def via(self) -> str:
        """"self", "npud" or "none" (the compile stays at SCHED_IDLE)."""
        return "self" if self.local else ("npud" if self.ask is not None and not self.refused
                                          else "none")

    def up(self, pid: int, tid: int = 0, *, children: bool = True) -> bool:
        """Raise the tree now (or ask npud to); False where nothing can. ``children``
        False: thread ``tid`` alone (npud is asked with ``-tid``)."""
        if self.local:
            try:
                proc_tree.raise_idle(proc_tree.tree(pid, tid) if children
                                     else [(pid, tid)])
                self.own += 1
                return True
            except PermissionError as exc:
                log.info("%s: the host may not raise its compiles (%s): asking npud",
                         self.name, exc)
                self.local = False
        if self.ask is None or self.refused:
            return False
        if self.ask(pid, tid if children else -tid):
            self.asked += 1
            return True
        return False

    @staticmethod
    def down(pid: int, tid: int = 0, *, children: bool = True) -> None:
        """The tree back to SCHED_IDLE (what is still at nice 0 of it)."""
        if not children:
            proc_tree.lower_to_idle([(pid, tid)])
            return
        # A thread (or child process) started by a raised one while the tree is walked
        # inherits nice 0 and is not in that walk: walk again until a pass lowers nothing
        # (a few passes at most; each bounded by MAX_THREADS).
        for _ in range(3):
            if not proc_tree.lower_to_idle(proc_tree.tree(pid, tid)):
                return

    def applied(self, pid: int, tid: int, ok: bool, why: str) -> None:
        """npud's answer to a raise asked for ``(pid, tid)``."""
        if ok:
            self.by_npud += 1
            return
        self.npud_refused += 1
        if "not permitted" in why or "is off" in why:
            if not self.refused:
                log.warning("%s: npud cannot raise starved compiles (%s): they stay at "
                            "SCHED_IDLE", self.name, why)
            self.refused = why
        else:
            log.info("%s: npud refused to raise compile %d/%d: %s", self.name, pid, tid, why)

    def counts(self) -> dict[str, int]:
        """For ``device.stats`` (``compile_raises``)."""
        return {"raised_self": self.own, "asked_npud": self.asked,
                "raised_npud": self.by_npud, "refused_npud": self.npud_refused}
