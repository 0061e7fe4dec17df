"""How long a burst's execution polls for its answer before it blocks on the doorbell.

``model.burst(spin_us=N)``: N µs every execution (0, the default: never); ``None`` is
adaptive (an opt-in): the burst spins only while its stream runs back to back, only while spinning
gets its answers sooner than blocking does (measured on the stream itself), and for a
bounded, learned time: as ONNX Runtime's own pool spins for its next piece of work in an
unmanaged app (its intra-op threads spin by default).

Why spin at all: a blocked app is woken by the driver's ring, and on this kind of VM that
wake-up is much of what the driver's round trip adds (``bench/contention_embed_split.py``:
an embedder's batch on the background lane 0.45 ms against ORT's run of 0.23; the slowest
10 % of batches were the app waking after the answer). An app that polls the answer's
header is running when it lands.

Why measure whether it pays: where the driver runs the step on a ``SCHED_IDLE`` worker
(npud's defaults for BACKGROUND work), a spinning app at nice 0 keeps that worker off
its CPU, and the answer comes later than for a blocked app (bench ``managed`` against
``managed+spin-off``, quick pairs: embedder -6 / -7 %, LLM -9 / -17 %). So the stream
compares its own answer times: the median of its last ``TOOK`` blocked executions
against its last ``TOOK`` spun ones (ring to answer seen, back to back only), and spins
while the spun ones are faster. The mode not chosen is tried again for ``TOOK``
executions every ``EVERY`` (what it costs: at most ``TOOK / EVERY`` of the executions in
the worse mode). Measured with the comparison (#15, embed22; bench/README.md "Bursts"): no gain
for the contention bench's embedder on the background lane (76 / 78 % of unmanaged vs
80 / 77 % without, two full runs) and still a small loss on npud's defaults (-5 / +3 %
in two quick pairs): an opt-in, not the default.

Bounds, because a spin is CPU the app burns waiting:

* only a stream that calls again at once: the median of its last ``KEPT`` gaps (from an
  execution's return to the app's next call) at most ``BACK_TO_BACK_S``. A paced stream
  (a camera at 30 Hz, a voice assistant's queries) and an app that stopped never spin:
  the spin happens inside ``execute`` only, so an idle app burns nothing;
* at most ``MARGIN`` times the ``QUANTILE`` of its last ``KEPT`` answer times, and at
  most ``MAX_S``: per execution it burns at most that (its answer time, when the answer
  comes within it): while it waits, the stream's thread is on a core instead of asleep
  (bench/README.md "Bursts" has what it cost in the contention bench);
* a fixed spin (``spin_us`` > 0) whose answers stop coming within it (``MISSES`` in a
  row) blocks at once, and tries the spin again after ``RETRY`` executions.

The spin yields its CPU at each look (``os.sched_yield``): the driver's thread is woken
by the request's ring onto this CPU (a synchronous wake-up) and runs at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: Gaps and answer times kept for the spin's bound.
KEPT = 8
#: A stream is back to back while its gaps' median is at most this (the embedder's loop:
#: tens of µs between a return and its next call; a 30 Hz camera: 33 ms).
BACK_TO_BACK_S = 0.0005
#: The spin is at most MARGIN times this quantile of the kept answer times (the median),
#: and at most MAX_S.
QUANTILE = 0.5
MARGIN = 1.5
MAX_S = 0.001
#: Answer times kept per mode (blocked, spun) for the choice between them, and how often
#: the mode not chosen is tried again (executions).
TOOK = 16
EVERY = 256
#: After this many spins in a row without the answer a fixed spin blocks at once, and
#: spins again after RETRY executions.
MISSES = 3
RETRY = 32


class Spin:
    """One burst's spin: fixed (``spin_us`` > 0), never (0), or adaptive (None)."""

    def __init__(self, spin_us: float | None) -> None:
        #: The fixed spin, s (None: adaptive).
        self.fixed_s = None if spin_us is None else spin_us / 1e6
        self.misses = 0  # fixed: spins in a row that ended without the answer
        #: When the last execution returned to the app (CLOCK_MONOTONIC; 0: none yet).
        self.returned = 0.0
        self.gaps: list[float] = []
        self.waits: list[float] = []
        #: Adaptive: the answer times of back-to-back executions, blocked and spun (by
        #: ``spun``: False / True), the mode chosen, the executions left in a trial of
        #: the other one, and those since the last trial.
        self.took: tuple[list[float], list[float]] = ([], [])
        self.spinning = False
        self.trial = 0
        self.since = 0
        #: The mode of the execution under way (None: not back to back, not compared).
        self.mode: bool | None = None
        #: Executions that spun, and those whose answer the spin caught.
        self.spun = 0
        self.caught = 0

    @property
    def adaptive(self) -> bool:
        return self.fixed_s is None

    def called(self, now: float) -> None:
        """The app called ``execute`` at ``now``."""
        if self.returned and self.fixed_s is None:
            _keep(self.gaps, now - self.returned, KEPT)

    def done(self, now: float) -> None:
        """The execution returns to the app at ``now``."""
        self.returned = now

    def window(self) -> float:
        """How long this execution spins, s (0: it blocks at once)."""
        fixed = self.fixed_s
        if fixed is None:
            self.mode = None
            gaps, waits = self.gaps, self.waits
            if len(gaps) < KEPT or len(waits) < KEPT or _median(gaps) > BACK_TO_BACK_S:
                return 0.0
            self.mode = spin = self._pick()
            return min(MAX_S, MARGIN * _quantile(waits, QUANTILE)) if spin else 0.0
        if fixed <= 0:
            return 0.0
        if self.misses >= MISSES:
            # Answers take longer than the spin: block, and try the spin again now and
            # then (the stream may have got faster).
            self.misses += 1
            if self.misses >= RETRY:
                self.misses = MISSES - 1
            return 0.0
        return fixed

    def _pick(self) -> bool:
        """Adaptive, back to back: whether this execution spins. Blocked ones first (the
        baseline), then spun ones, then the faster mode, the other tried now and then."""
        blocked, spun = self.took
        if len(blocked) < TOOK:
            return False
        if len(spun) < TOOK:
            return True
        if self.trial > 0:
            self.trial -= 1
            return not self.spinning
        self.since += 1
        if self.since >= EVERY:
            self.since, self.trial = 0, TOOK - 1
            return not self.spinning
        return self.spinning

    def answered(self, waited: float, spun: bool, caught: bool) -> None:
        """An answer came ``waited`` s after the ring; ``spun``: this execution spun,
        ``caught``: the spin saw the answer."""
        if spun:
            self.spun += 1
            self.caught += caught
        if self.fixed_s is not None:
            if spun:
                self.misses = 0 if caught else self.misses + 1
            return
        _keep(self.waits, waited, KEPT)
        mode = self.mode
        if mode is None:
            return
        blocked, spun_took = self.took
        _keep(spun_took if mode else blocked, waited, TOOK)
        if self.trial == 0 and len(blocked) >= TOOK and len(spun_took) >= TOOK:
            self.spinning = _median(spun_took) < _median(blocked)

    def spin(self, span: float, ready: Callable[[], bool]) -> bool:
        """Poll ``ready`` for ``span`` s, yielding the CPU at each look; True: it was."""
        clock, yield_ = time.perf_counter, os.sched_yield
        end = clock() + span
        while True:
            if ready():
                return True
            if clock() >= end:
                return False
            # The doorbell's wake-up is a sync one: the driver's thread is queued on this
            # CPU, behind this spin (measured, 2 vCPUs: 85 of 90 wake-ups there, the
            # driver seeing a ring 783 µs late, p50, under a 700 µs spin). Yielding lets
            # it run at once (the same probe: 91 µs p50).
            yield_()


def _keep(kept: list[float], x: float, most: int) -> None:
    kept.append(x)
    if len(kept) > most:
        del kept[0]


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _quantile(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * q))]


__all__ = ["BACK_TO_BACK_S", "EVERY", "KEPT", "MARGIN", "MAX_S", "MISSES", "QUANTILE",
           "RETRY", "TOOK", "Spin"]
