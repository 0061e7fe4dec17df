"""The compile starvation bound's decision, pure (time and CPU time are passed in): when a
compile lowered to SCHED_IDLE has waited one bound (its wall time less its progress) it is
raised to nice 0 for one bound, then lowered, and the next raise needs another bound of
waiting. Used by the driver host (drivers/compile_starve.py: its compile child; drivers/
compile_watch.py: compiles in the host) and by npud where it watches a host's compile
itself (service/host_compile_watch.py)."""

from __future__ import annotations


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
