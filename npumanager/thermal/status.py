"""Pure thermal status logic: thresholds, hysteresis, dwell, headroom, trend.

Nothing here reads a file or a clock; callers pass temperatures and ``now``.

- :func:`raw_status` maps one temperature onto the ladder NONE..SHUTDOWN.
- :class:`HysteresisTracker` follows one sensor: going up is immediate once
  the reading reaches a threshold; going down requires the reading to fall
  ``hysteresis_c`` below the threshold of the status it leaves (a Schmitt
  trigger per rung, so a noisy sensor oscillating around a threshold does not
  flap).
- :class:`DwellFilter` optionally holds a status for ``min_dwell_s`` before
  it may fall (rising is never delayed: heat is a safety matter).
- :func:`headroom` is Android's ``getThermalHeadroom`` normalisation:
  1.0 at the SEVERE threshold, 0.0 at ``span_c`` degrees below it.
- :class:`Trend` keeps recent readings and forecasts by least squares.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from npumanager.constants import ThermalStatus
from npumanager.errors import InvalidArgument

#: Statuses that begin at a threshold (NONE is everything below LIGHT).
LADDER: tuple[ThermalStatus, ...] = tuple(s for s in ThermalStatus if s != ThermalStatus.NONE)

#: Android's DEGREES_BETWEEN_ZERO_AND_ONE (ThermalManagerService.TemperatureWatcher).
DEFAULT_HEADROOM_SPAN_C = 30.0

Thresholds = Mapping[ThermalStatus, float]


def parse_thresholds(table: Mapping[str, object]) -> dict[ThermalStatus, float]:
    """``{light = 60.0, ...}`` from the config -> a full, non-decreasing ladder."""
    out: dict[ThermalStatus, float] = {}
    for key, value in table.items():
        try:
            status = ThermalStatus[key.strip().upper()]
        except KeyError:
            raise InvalidArgument(f"[thermal] thresholds_c: unknown status {key!r}") from None
        if status == ThermalStatus.NONE:
            raise InvalidArgument("[thermal] thresholds_c: NONE has no threshold")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise InvalidArgument(f"[thermal] thresholds_c.{key} must be a number, got {value!r}")
        out[status] = float(value)
    missing = [s.name.lower() for s in LADDER if s not in out]
    if missing:
        raise InvalidArgument(f"[thermal] thresholds_c: missing {', '.join(missing)}")
    check_ladder(out, "[thermal] thresholds_c")
    return out


def check_ladder(thresholds: Thresholds, where: str) -> None:
    prev: tuple[ThermalStatus, float] | None = None
    for s in LADDER:
        t = thresholds[s]
        if prev is not None and t < prev[1]:
            raise InvalidArgument(
                f"{where}: {s.name.lower()} ({t}) is below {prev[0].name.lower()} ({prev[1]})"
            )
        prev = (s, t)


def raw_status(temp_c: float, thresholds: Thresholds) -> ThermalStatus:
    """The highest status whose threshold ``temp_c`` reaches (no hysteresis)."""
    out = ThermalStatus.NONE
    for s in LADDER:
        if temp_c >= thresholds[s]:
            out = s
    return out


class HysteresisTracker:
    """The status of one sensor, with hysteresis."""

    def __init__(self, thresholds: Thresholds, hysteresis_c: float) -> None:
        if hysteresis_c < 0:
            raise InvalidArgument(f"[thermal] hysteresis_c must be >= 0, got {hysteresis_c}")
        self.thresholds = dict(thresholds)
        self.hysteresis_c = hysteresis_c
        self.status = ThermalStatus.NONE

    def update(self, temp_c: float) -> ThermalStatus:
        up = raw_status(temp_c, self.thresholds)
        if up >= self.status:
            self.status = up
            return up
        # Falling: leave each rung only once the reading is hysteresis_c below it.
        s = self.status
        while s > ThermalStatus.NONE and temp_c <= self.thresholds[s] - self.hysteresis_c:
            s = ThermalStatus(s - 1)
        self.status = s
        return s

    def __repr__(self) -> str:
        return f"HysteresisTracker(status={self.status.name}, hysteresis={self.hysteresis_c})"


class DwellFilter:
    """Hold a status at least ``min_dwell_s`` before it may fall; rising is immediate."""

    def __init__(self, min_dwell_s: float = 0.0) -> None:
        if min_dwell_s < 0:
            raise InvalidArgument(f"[thermal] min_dwell_s must be >= 0, got {min_dwell_s}")
        self.min_dwell_s = min_dwell_s
        self.status = ThermalStatus.NONE
        self.since: float | None = None

    def update(self, wanted: ThermalStatus, now: float) -> ThermalStatus:
        if (
            self.since is None
            or wanted > self.status
            or (wanted < self.status and now - self.since >= self.min_dwell_s)
        ):
            self.status, self.since = wanted, now
        return self.status


def headroom(temp_c: float, severe_c: float, span_c: float = DEFAULT_HEADROOM_SPAN_C) -> float:
    """Android's normalisation: 1.0 at SEVERE, 0.0 at ``span_c`` below it (never negative)."""
    if math.isnan(temp_c):
        return math.nan
    zero = severe_c - span_c
    if temp_c <= zero:
        return 0.0
    return (temp_c - zero) / span_c


class Trend:
    """Recent (time, temperature) samples of one sensor, for a linear forecast."""

    #: Android's TemperatureWatcher needs this many samples before it forecasts.
    MIN_SAMPLES = 3

    def __init__(self, window_s: float, max_samples: int = 600) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, now: float, temp_c: float) -> None:
        self.samples.append((now, temp_c))
        while self.samples and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()

    def latest(self) -> float:
        return self.samples[-1][1] if self.samples else math.nan

    def fit(self) -> tuple[float, float] | None:
        """(slope in degrees/s, fitted value at the latest sample) by least squares;
        None with too few samples or no time spread."""
        if len(self.samples) < self.MIN_SAMPLES:
            return None
        t0 = self.samples[0][0]
        xs = [t - t0 for t, _ in self.samples]
        ys = [v for _, v in self.samples]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx == 0:
            return None
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        return slope, my + slope * (xs[-1] - mx)

    def slope(self) -> float | None:
        f = self.fit()
        return None if f is None else f[0]

    def forecast(self, seconds: float) -> float:
        """The reading expected ``seconds`` after the latest sample, from the fitted line
        (smooths sensor noise); the latest reading if no trend is known."""
        last = self.latest()
        if seconds <= 0 or math.isnan(last):
            return last
        f = self.fit()
        if f is None:
            return last
        slope, fitted = f
        return fitted + slope * seconds
