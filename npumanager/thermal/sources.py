"""Thermal sources: where temperatures come from.

Each source returns the readings it could take this poll. None of them ever
raises for an unreadable sensor: a file or device that fails is logged once
(per path) and skipped, so a flaky or vanished sensor never takes npud down.

- :class:`ThermalZones` — Linux thermal zones,
  ``{sysfs_root}/class/thermal/thermal_zone*/{temp,type,trip_point_N_temp,_type}``
  (millidegrees Celsius). Trip points of the types named in ``trip_points``
  (e.g. ``{hot = "severe", critical = "critical"}``) lower that zone's own
  threshold for the mapped status.
- :class:`Hwmon` — ``{sysfs_root}/class/hwmon/hwmon*/temp*_input`` with the
  chip's ``name`` and the sensor's ``temp*_label``.
- :class:`Nvml` — GPU temperatures through ``pynvml`` when it is importable
  and finds a GPU; otherwise it reports nothing.
- :class:`DriverModel` — the drivers' own thermal models (the reference
  driver's first-order model), read through a callable npud supplies.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from npumanager.constants import ThermalStatus, parse_thermal_status
from npumanager.errors import InvalidArgument

log = logging.getLogger("npumanager.thermal")


@dataclass(frozen=True)
class Reading:
    """One sensor's temperature this poll.

    ``thresholds`` holds per-sensor overrides of the configured ladder (from
    trip points); the monitor uses them for this sensor only."""

    name: str
    source: str
    temp_c: float
    thresholds: dict[ThermalStatus, float] = field(default_factory=dict)


class ThermalSource(Protocol):
    name: str

    def read(self) -> list[Reading]: ...


class _LogOnce:
    """Log a failing path the first time only; log again after it recovered and failed anew."""

    def __init__(self) -> None:
        self._failing: set[str] = set()

    def failed(self, key: str, exc: BaseException | str) -> None:
        if key not in self._failing:
            self._failing.add(key)
            log.warning("thermal: cannot read %s (%s); skipping it", key, exc)

    def ok(self, key: str) -> None:
        self._failing.discard(key)


def _read_text(path: Path) -> str:
    return path.read_text().strip()


def _millideg(path: Path) -> float:
    return int(_read_text(path)) / 1000.0


def parse_trip_map(table: Mapping[str, object]) -> dict[str, ThermalStatus]:
    """``{hot = "severe", critical = "critical"}`` -> trip type -> status."""
    out: dict[str, ThermalStatus] = {}
    for trip_type, level in table.items():
        try:
            status = parse_thermal_status(str(level))
        except ValueError as exc:
            raise InvalidArgument(f"[thermal] trip_points.{trip_type}: {exc}") from None
        if status == ThermalStatus.NONE:
            raise InvalidArgument(f"[thermal] trip_points.{trip_type}: NONE has no threshold")
        out[trip_type] = status
    return out


_ZONE_RE = re.compile(r"thermal_zone(\d+)$")
_TRIP_RE = re.compile(r"trip_point_(\d+)_temp$")


class ThermalZones:
    name = "sysfs"

    def __init__(
        self,
        sysfs_root: str | Path,
        zone_types: Iterable[str] = (),
        trip_points: Mapping[str, ThermalStatus] | None = None,
    ) -> None:
        self.base = Path(sysfs_root) / "class" / "thermal"
        self.zone_types = set(zone_types)
        self.trip_points = dict(trip_points or {})
        self._log = _LogOnce()

    def _zones(self) -> list[Path]:
        try:
            found = [p for p in self.base.iterdir() if _ZONE_RE.match(p.name)]
        except OSError as exc:
            self._log.failed(str(self.base), exc)
            return []
        self._log.ok(str(self.base))
        return sorted(found, key=lambda p: int(_ZONE_RE.match(p.name).group(1)))  # type: ignore[union-attr]

    def _trips(self, zone: Path) -> dict[ThermalStatus, float]:
        out: dict[ThermalStatus, float] = {}
        if not self.trip_points:
            return out
        for temp_file in zone.glob("trip_point_*_temp"):
            m = _TRIP_RE.match(temp_file.name)
            if m is None:
                continue
            try:
                trip_type = _read_text(zone / f"trip_point_{m.group(1)}_type")
                temp = _millideg(temp_file)
            except (OSError, ValueError):
                continue  # a trip point is a refinement; the configured ladder still applies
            status = self.trip_points.get(trip_type)
            if status is not None and temp > 0:
                out[status] = min(temp, out.get(status, temp))
        return out

    def read(self) -> list[Reading]:
        out: list[Reading] = []
        for zone in self._zones():
            try:
                ztype = _read_text(zone / "type")
            except OSError:
                ztype = zone.name
            if self.zone_types and ztype not in self.zone_types:
                continue
            key = str(zone / "temp")
            try:
                temp = _millideg(zone / "temp")
            except (OSError, ValueError) as exc:
                self._log.failed(key, exc)
                continue
            self._log.ok(key)
            out.append(Reading(f"{zone.name}/{ztype}", self.name, temp, self._trips(zone)))
        return out


_HWMON_RE = re.compile(r"hwmon(\d+)$")
_INPUT_RE = re.compile(r"temp(\d+)_input$")


def hwmon_chips(base: Path) -> list[Path]:
    """``base``'s hwmonN chips in order (OSError where ``base`` cannot be listed)."""
    return sorted(p for p in base.iterdir() if _HWMON_RE.match(p.name))


def hwmon_name(chip: Path) -> str:
    """A chip's ``name``, or its directory's name where the driver gives none."""
    try:
        return _read_text(chip / "name")
    except OSError:
        return chip.name


def hwmon_inputs(chip: Path) -> Iterator[tuple[Path, str]]:
    """A chip's temperature inputs: each tempN_input with its label, ``tempN`` where the
    driver gives none (the machine's sources and ``[thermal] devices`` read chips alike)."""
    for inp in sorted(chip.glob("temp*_input")):
        m = _INPUT_RE.match(inp.name)
        if m is None:
            continue
        try:
            label = _read_text(chip / f"temp{m.group(1)}_label")
        except OSError:
            label = f"temp{m.group(1)}"
        yield inp, label


class Hwmon:
    name = "hwmon"

    def __init__(self, sysfs_root: str | Path, names: Iterable[str] = ()) -> None:
        self.base = Path(sysfs_root) / "class" / "hwmon"
        self.names = set(names)
        self._log = _LogOnce()

    def read(self) -> list[Reading]:
        out: list[Reading] = []
        try:
            chips = hwmon_chips(self.base)
        except OSError as exc:
            self._log.failed(str(self.base), exc)
            return out
        self._log.ok(str(self.base))
        for chip in chips:
            chip_name = hwmon_name(chip)
            if self.names and chip_name not in self.names:
                continue
            for inp, label in hwmon_inputs(chip):
                key = str(inp)
                try:
                    temp = _millideg(inp)
                except (OSError, ValueError) as exc:
                    self._log.failed(key, exc)
                    continue
                self._log.ok(key)
                out.append(Reading(f"{chip.name}/{chip_name}/{label}", self.name, temp))
        return out


class Nvml:
    """GPU temperature via NVML. No pynvml, no driver or no GPU -> no readings, never a crash.

    With ``use_thresholds`` the GPU's own slowdown / shutdown temperatures set
    its SEVERE / SHUTDOWN thresholds."""

    name = "nvml"

    def __init__(
        self, use_thresholds: bool = False, import_module: Callable[[str], ModuleType] | None = None
    ) -> None:
        self.use_thresholds = use_thresholds
        self._import = import_module or importlib.import_module
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._tried = False
        self._log = _LogOnce()

    def _init(self) -> None:
        self._tried = True
        try:
            nvml = self._import("pynvml")
        except ImportError as exc:
            log.info("thermal: pynvml is not installed (%s); the nvml source reports nothing", exc)
            return
        try:
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # NVMLError and friends: no driver, no GPU
            log.info("thermal: NVML found no GPU (%s); the nvml source reports nothing", exc)
            self._handles = []
            return
        self._nvml = nvml

    def read(self) -> list[Reading]:
        if not self._tried:
            self._init()
        nvml = self._nvml
        out: list[Reading] = []
        if nvml is None:
            return out
        for i, h in enumerate(self._handles):
            key = f"nvml gpu{i}"
            try:
                temp = float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
            except Exception as exc:
                self._log.failed(key, exc)
                continue
            self._log.ok(key)
            out.append(Reading(f"gpu{i}", self.name, temp, self._thresholds(nvml, h)))
        return out

    def _thresholds(self, nvml: Any, handle: Any) -> dict[ThermalStatus, float]:
        out: dict[ThermalStatus, float] = {}
        if not self.use_thresholds:
            return out
        for attr, status in (
            ("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", ThermalStatus.SEVERE),
            ("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", ThermalStatus.SHUTDOWN),
        ):
            try:
                value = float(nvml.nvmlDeviceGetTemperatureThreshold(handle, getattr(nvml, attr)))
            except Exception:
                continue
            if value > 0:
                out[status] = value
        return out

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


class DriverModel:
    """Temperatures of the drivers' own thermal models (``DriverControl.temperatures()``)."""

    name = "driver"

    def __init__(self, driver_temps: Callable[[], Mapping[str, float]]) -> None:
        self.driver_temps = driver_temps
        self._log = _LogOnce()

    def read(self) -> list[Reading]:
        try:
            temps = dict(self.driver_temps())
        except Exception as exc:
            self._log.failed("driver temperatures", exc)
            return []
        self._log.ok("driver temperatures")
        return [
            Reading(f"driver/{name}", self.name, float(t))
            for name, t in sorted(temps.items())
            if isinstance(t, int | float) and t == t  # skip NaN
        ]


KNOWN_SOURCES = ("sysfs", "hwmon", "nvml", "driver")
