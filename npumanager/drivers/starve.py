"""A bound on how long background steps wait for the CPU at SCHED_IDLE.

``background_sched = "idle"`` runs background steps on SCHED_IDLE threads: the kernel
gives them a core only when no normal thread wants it. On a machine kept busy by
normal-priority work that is close to never: measured here (2 vCPUs, two nice-0 busy
loops, an 8 ms step of numpy work on one thread), a SCHED_IDLE step took 264 ms of wall
time (p50; 539 ms at worst) against 8 ms alone, nice 19 the same — and a long step
takes ~33x its CPU time however long it is. The background work still gets nowhere
while the machine stays busy.

The bound (``background_starve_ms``): a background step that waited longer than that
(its wall time from submission to its end, less its own CPU time) makes the *next*
background step run at normal priority; the one after returns to SCHED_IDLE. A step
submitted while an idle step has been outstanding longer than the bound runs at normal
priority too (the class made no progress meanwhile), and so does a step that did not
even start within the bound (moved before a SCHED_IDLE thread picked it up). So
background work gets at least one step at normal priority per bound, and costs the
foreground nothing while the machine has idle time (no step waits that long then).

Threads, not a policy switch per step: an unprivileged thread cannot leave SCHED_IDLE
(the kernel treats it as nice 20 and RLIMIT_NICE is 0 by default), so the boosted step
runs on a normal-priority worker (:class:`~.steps.StepRunner`).

:class:`StarveGuard` is the decision, pure: time and CPU time are passed in; the caller
holds a lock around it (steps start and end on several threads).
"""

from __future__ import annotations


class StarveGuard:
    """Which background steps run at normal priority instead of SCHED_IDLE."""

    __slots__ = ("_owed", "_pending", "boosted", "starve_s", "starved")

    def __init__(self, starve_s: float) -> None:
        #: 0: no bound (every background step runs at SCHED_IDLE).
        self.starve_s = starve_s
        #: Steps on the idle workers not ended yet: token -> when submitted.
        self._pending: dict[int, float] = {}
        #: A step that waited past the bound ended: the next one runs at normal priority.
        self._owed = False
        #: Steps run at normal priority, and idle steps that waited past the bound.
        self.boosted = 0
        self.starved = 0

    def __repr__(self) -> str:
        return (f"<StarveGuard {self.starve_s * 1e3:g} ms: {len(self._pending)} pending, "
                f"{self.boosted} boosted, {self.starved} starved>")

    def route(self, token: int, now: float) -> bool:
        """A background step is submitted: True to run it at normal priority; False: at
        SCHED_IDLE (then :meth:`ended` must follow, or :meth:`moved`)."""
        if self.starve_s > 0:
            if self._owed:
                self._owed = False
                self.boosted += 1
                return True
            if self._pending and now - min(self._pending.values()) >= self.starve_s:
                self.boosted += 1
                return True
        self._pending[token] = now
        return False

    def ended(self, token: int, now: float, cpu_s: float) -> None:
        """The idle step ``token`` ended at ``now`` after ``cpu_s`` of its own CPU time."""
        at = self._pending.pop(token, None)
        if at is None or self.starve_s <= 0:
            return
        if (now - at) - cpu_s > self.starve_s:
            self.starved += 1
            self._owed = True

    def overdue(self, token: int, now: float) -> bool:
        """Whether the idle step ``token`` (not started yet, the caller knows) has waited
        past the bound: the caller moves it to normal priority (:meth:`moved`)."""
        at = self._pending.get(token)
        return at is not None and self.starve_s > 0 and now - at >= self.starve_s

    def moved(self, token: int) -> None:
        """The idle step ``token`` was taken off the idle workers to run at normal priority."""
        if self._pending.pop(token, None) is not None:
            self.boosted += 1

    def counts(self) -> dict[str, float]:
        return {"starve_ms": self.starve_s * 1e3, "boosted": self.boosted,
                "starved": self.starved, "pending": len(self._pending)}
