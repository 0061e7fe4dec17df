"""ThermalMonitor: npud's view of the device's thermal state.

Built from the ``[thermal]`` config section. npud calls :meth:`poll` every
``poll_interval_s``: it reads every configured source once, runs each sensor
through its own hysteresis tracker (a sensor may carry its own thresholds from
trip points), takes the highest sensor status, applies the optional minimum
dwell, and returns the *effective* status — the admin override when one is
set. When the effective status differs from the last one, npud feeds
``ThermalChanged(status)`` to ``ManagerState`` and tells the drivers.

The monitor owns no timer and reads time only from the :class:`Clock` it is
given, so tests drive it on a virtual clock against a fake sysfs tree.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from npumanager.clock import Clock
from npumanager.constants import ThermalStatus
from npumanager.errors import InvalidArgument
from npumanager.thermal.devices import DeviceThermal
from npumanager.thermal.sources import (
    KNOWN_SOURCES,
    DriverModel,
    Hwmon,
    Nvml,
    Reading,
    ThermalSource,
    ThermalZones,
    parse_trip_map,
)
from npumanager.thermal.status import (
    DEFAULT_HEADROOM_SPAN_C,
    LADDER,
    DwellFilter,
    HysteresisTracker,
    Thresholds,
    Trend,
    headroom,
    parse_thresholds,
)

log = logging.getLogger("npumanager.thermal")

HISTORY_SIZE = 32


def _float(section: Mapping[str, Any], key: str, default: float, minimum: float = 0.0) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"[thermal] {key} must be a number, got {value!r}")
    if value < minimum:
        raise InvalidArgument(f"[thermal] {key} must be >= {minimum}, got {value}")
    return float(value)


def sensor_ladder(
    base: Thresholds, overrides: Mapping[ThermalStatus, float]
) -> dict[ThermalStatus, float]:
    """The configured ladder with a sensor's own thresholds (trip points) applied.

    Rungs the sensor does not set are pulled in so the ladder stays
    non-decreasing (a ``hot`` trip at 65 C mapped to SEVERE also lowers a
    configured MODERATE of 70 C to 65 C)."""
    out = dict(base)
    out.update(overrides)
    for i in range(len(LADDER) - 2, -1, -1):  # lower rungs never above the next one up
        s, up = LADDER[i], LADDER[i + 1]
        if s not in overrides:
            out[s] = min(out[s], out[up])
    for i in range(1, len(LADDER)):  # and higher rungs never below the one beneath
        s, down = LADDER[i], LADDER[i - 1]
        out[s] = max(out[s], out[down])
    return out


@dataclass
class _Sensor:
    name: str
    source: str
    tracker: HysteresisTracker
    trend: Trend
    temp_c: float
    last_seen: float


@dataclass(frozen=True)
class Transition:
    at: float
    status: ThermalStatus
    cause: str  # "sensor NAME at T C", "override", "override reset", "sensors stale"


class ThermalMonitor:
    def __init__(
        self,
        section: Mapping[str, Any],
        clock: Clock,
        driver_temps: Callable[[], Mapping[str, float]],
        *,
        sources: list[ThermalSource] | None = None,
    ) -> None:
        """``sources`` replaces the configured ones (tests, embedding); normally None."""
        self.clock = clock
        self.thresholds = parse_thresholds(section.get("thresholds_c", {}))
        self.hysteresis_c = _float(section, "hysteresis_c", 2.0)
        self.min_dwell_s = _float(section, "min_dwell_s", 0.0)
        self.poll_interval_s = _float(section, "poll_interval_s", 1.0, minimum=0.001)
        self.forecast_s = _float(section, "forecast_s", 10.0)
        self.trend_window_s = _float(section, "trend_window_s", 30.0, minimum=0.001)
        self.headroom_span_c = _float(
            section, "headroom_span_c", DEFAULT_HEADROOM_SPAN_C, minimum=0.001
        )
        self.stale_after_s = _float(section, "stale_after_s", 30.0)
        valid = section.get("valid_range_c", [-40.0, 200.0])
        if (
            not isinstance(valid, list | tuple)
            or len(valid) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in valid)
            or valid[0] >= valid[1]
        ):
            raise InvalidArgument(f"[thermal] valid_range_c must be [low, high], got {valid!r}")
        self.valid_range_c = (float(valid[0]), float(valid[1]))
        self._implausible: set[str] = set()
        self.source_names: list[str] = list(section.get("sources", ["driver"]))
        self.sources: list[ThermalSource] = (
            sources if sources is not None else self._build_sources(section, driver_temps)
        )
        self._sensors: dict[str, _Sensor] = {}
        self._dwell = DwellFilter(self.min_dwell_s)
        self._computed = ThermalStatus.NONE
        self._override: ThermalStatus | None = None
        self._effective = ThermalStatus.NONE
        self._changed_at = clock.now()
        self._last_poll: float | None = None
        self._failing_sources: set[str] = set()
        self.history: deque[Transition] = deque(maxlen=HISTORY_SIZE)
        #: Devices with sensors of their own ([thermal] devices): their statuses.
        self.device_thermal = DeviceThermal(section, self.thresholds, self.hysteresis_c,
                                            self.valid_range_c, self.stale_after_s)
        self.device_status: dict[str, ThermalStatus] = {}

    def _build_sources(
        self, section: Mapping[str, Any], driver_temps: Callable[[], Mapping[str, float]]
    ) -> list[ThermalSource]:
        unknown = [s for s in self.source_names if s not in KNOWN_SOURCES]
        if unknown:
            raise InvalidArgument(
                f"[thermal] sources: unknown {unknown}; known: {list(KNOWN_SOURCES)}"
            )
        root = str(section.get("sysfs_root", "/sys"))
        built: list[ThermalSource] = []
        for name in self.source_names:
            if name == "sysfs":
                trips = parse_trip_map(section.get("trip_points", {}))
                built.append(ThermalZones(root, section.get("zone_types", []), trips))
            elif name == "hwmon":
                built.append(Hwmon(root, section.get("hwmon_names", [])))
            elif name == "nvml":
                built.append(Nvml(bool(section.get("nvml_thresholds", False))))
            else:
                built.append(DriverModel(driver_temps))
        return built

    # --- polling ------------------------------------------------------------

    def poll(self) -> ThermalStatus:
        """Read every source once and return the effective status (the override if set)."""
        now = self.clock.now()
        self._last_poll = now
        # Devices' own sensors first: what they claim does not count for the machine.
        if self.device_thermal:
            self.device_status = self.device_thermal.poll(now)
        claimed = self.device_thermal.claimed
        for src in self.sources:
            try:
                readings = src.read()
            except Exception as exc:  # a source must never take npud down
                if src.name not in self._failing_sources:
                    self._failing_sources.add(src.name)
                    log.warning("thermal: source %s failed (%s); skipping it", src.name, exc)
                continue
            self._failing_sources.discard(src.name)
            for r in readings:
                if r.name not in claimed and self._plausible(r):
                    self._record(r, now)
        for name in [n for n, s in self._sensors.items() if now - s.last_seen > self.stale_after_s]:
            log.warning(
                "thermal: sensor %s has not reported for %.0f s; dropping it",
                name,
                self.stale_after_s,
            )
            del self._sensors[name]
        hottest = max(self._sensors.values(), key=lambda s: s.tracker.status, default=None)
        wanted = hottest.tracker.status if hottest is not None else ThermalStatus.NONE
        computed = self._dwell.update(wanted, now)
        if computed != self._computed:
            self._computed = computed
            cause = (
                f"sensor {hottest.name} at {hottest.temp_c:.1f} C"
                if hottest is not None
                else "no sensor readings"
            )
            self._set_effective(cause, now)
        return self._effective

    def _plausible(self, r: Reading) -> bool:
        """Sensors report sentinels when they fail (-273.2, 255.0, 32767): not heat."""
        low, high = self.valid_range_c
        if low <= r.temp_c <= high:
            self._implausible.discard(r.name)
            return True
        if r.name not in self._implausible:
            self._implausible.add(r.name)
            log.warning(
                "thermal: sensor %s reads %.1f C, outside %s..%s C; ignoring it",
                r.name, r.temp_c, low, high,
            )  # fmt: skip
        return False

    def _record(self, r: Reading, now: float) -> None:
        s = self._sensors.get(r.name)
        ladder = sensor_ladder(self.thresholds, r.thresholds)
        if s is None:
            s = _Sensor(
                r.name,
                r.source,
                HysteresisTracker(ladder, self.hysteresis_c),
                Trend(self.trend_window_s),
                r.temp_c,
                now,
            )
            self._sensors[r.name] = s
        else:
            s.tracker.thresholds = ladder
        s.temp_c, s.last_seen = r.temp_c, now
        s.tracker.update(r.temp_c)
        s.trend.add(now, r.temp_c)

    def _set_effective(self, cause: str, now: float) -> None:
        effective = self._override if self._override is not None else self._computed
        if effective == self._effective:
            return
        old, self._effective, self._changed_at = self._effective, effective, now
        self.history.append(Transition(now, effective, cause))
        level = logging.WARNING if effective > old else logging.INFO
        log.log(level, "thermal status %s -> %s (%s)", old.name, effective.name, cause)

    # --- admin override -----------------------------------------------------

    def override(self, status: ThermalStatus | None) -> ThermalStatus:
        """Force the effective status (``cmd thermalservice override-status``); None resets.
        Returns the effective status."""
        self._override = None if status is None else ThermalStatus(status)
        cause = "override reset" if status is None else "override"
        self._set_effective(cause, self.clock.now())
        return self._effective

    # --- queries ------------------------------------------------------------

    @property
    def status(self) -> ThermalStatus:
        """The effective status: the override if set, else the computed one."""
        return self._effective

    @property
    def computed_status(self) -> ThermalStatus:
        return self._computed

    @property
    def override_status(self) -> ThermalStatus | None:
        return self._override

    @property
    def temperature_c(self) -> float:
        """The hottest current reading; NaN with none."""
        return max((s.temp_c for s in self._sensors.values()), default=math.nan)

    def headroom(self, forecast_s: float | None = None) -> float:
        """Android's thermal headroom: 1.0 = at the SEVERE threshold, 0.0 = ``headroom_span_c``
        below it. With ``forecast_s`` > 0, forecast that many seconds ahead from each sensor's
        recent trend (least squares over ``trend_window_s``). The highest over sensors; NaN
        when no sensor has reported. The override does not change headroom (it is about
        temperatures)."""
        best = math.nan
        for s in self._sensors.values():
            temp = s.trend.forecast(forecast_s or 0.0)
            h = headroom(temp, s.tracker.thresholds[ThermalStatus.SEVERE], self.headroom_span_c)
            if math.isnan(best) or h > best:
                best = h
        return best

    def describe(self) -> dict[str, Any]:
        """A JSON-able snapshot for ``npu status`` / ``npu thermal status`` (NaN -> None)."""
        now = self.clock.now()

        def num(x: float) -> float | None:
            return None if math.isnan(x) else round(x, 3)

        return {
            "status": self._effective.name,
            "status_value": int(self._effective),
            "computed_status": self._computed.name,
            "override": None if self._override is None else self._override.name,
            "overridden": self._override is not None,
            "since_s": round(now - self._changed_at, 3),
            "temperature_c": num(self.temperature_c),
            "headroom": num(self.headroom()),
            "forecast_s": self.forecast_s,
            "headroom_forecast": num(self.headroom(self.forecast_s)),
            "sources": list(self.source_names),
            "failing_sources": sorted(self._failing_sources),
            "sensors": [
                {
                    "name": s.name,
                    "source": s.source,
                    "temp_c": round(s.temp_c, 3),
                    "status": s.tracker.status.name,
                    "thresholds_c": {k.name.lower(): v for k, v in s.tracker.thresholds.items()},
                    "age_s": round(now - s.last_seen, 3),
                    "slope_c_per_s": (None if (sl := s.trend.slope()) is None else round(sl, 4)),
                }
                for s in sorted(self._sensors.values(), key=lambda s: s.name)
            ],
            "thresholds_c": {k.name.lower(): v for k, v in self.thresholds.items()},
            # Not "devices": npud's dump has that key (each device's status in effect).
            "device_sensors": self.device_thermal.describe(),
            "hysteresis_c": self.hysteresis_c,
            "min_dwell_s": self.min_dwell_s,
            "poll_interval_s": self.poll_interval_s,
            "last_poll_age_s": None if self._last_poll is None else round(now - self._last_poll, 3),
            "history": [
                {"ago_s": round(now - t.at, 3), "status": t.status.name, "cause": t.cause}
                for t in self.history
            ],
        }

    def close(self) -> None:
        for src in self.sources:
            close = getattr(src, "close", None)
            if callable(close):
                close()

    def __repr__(self) -> str:
        o = f" (override {self._override.name})" if self._override is not None else ""
        return (
            f"<ThermalMonitor status={self._effective.name}{o} | {len(self._sensors)} sensors, "
            f"max {self.temperature_c:.1f} C, headroom {self.headroom():.2f}>"
        )
