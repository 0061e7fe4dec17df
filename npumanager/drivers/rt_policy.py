"""When a burst's thread asks for SCHED_FIFO and when it lowers itself (bench/README.md: "Real-time
foreground threads"); pure, one per burst, driven by drivers/rt_threads.py.

A burst's thread is at FIFO only while it serves FOREGROUND work (the spot where
``foreground_slice_us`` is applied). It lowers itself (no privilege needed) when its steps
run as BACKGROUND, when its burst closes, when one run at FIFO took longer than
``foreground_rt_max_run_us`` (a FIFO thread runs before every normal thread on its CPU:
a long run there starves them), or when the kernel's RLIMIT_RTTIME backstop fired
(SIGXCPU). After the last two it does not ask again for ``backoff_s``.
"""

from __future__ import annotations

#: What :meth:`RtPolicy.serve` says to do.
NOTHING, ASK, LOWER = 0, 1, 2


class RtPolicy:
    """One burst thread's FIFO state: ``want`` (it asked for FIFO, or has it, and should)
    and ``until`` (no asking before then)."""

    __slots__ = ("lowered_long", "until", "want")

    def __init__(self) -> None:
        self.want = False
        self.until = 0.0
        #: Runs that took longer than the bound at FIFO (each lowered the thread).
        self.lowered_long = 0

    def serve(self, foreground: bool, now: float) -> int:
        """Its steps now run here as FOREGROUND (``foreground``) or as BACKGROUND: ASK for
        FIFO (not yet wanted, and not backing off), LOWER (wanted until now), or NOTHING."""
        if foreground:
            if not self.want and now >= self.until:
                self.want = True
                return ASK
            return NOTHING
        if self.want:
            self.want = False
            return LOWER
        return NOTHING

    def ran(self, run_us: float, max_run_us: float, now: float, backoff_s: float) -> bool:
        """A run of ``run_us`` ended: True when it ran at FIFO longer than ``max_run_us``
        (the thread is to lower itself, and not ask again for ``backoff_s``)."""
        if not self.want or run_us <= max_run_us:
            return False
        self.lowered_long += 1
        self.demoted(now, backoff_s)
        return True

    def demoted(self, now: float, backoff_s: float) -> None:
        """Lowered from outside (SIGXCPU): not wanted, and not asked for ``backoff_s``."""
        self.want = False
        self.until = now + backoff_s
