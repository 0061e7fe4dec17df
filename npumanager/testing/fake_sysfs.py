"""A fake sysfs tree of real files, for thermal tests and demos.

Point ``[thermal] sysfs_root`` at ``FakeSysfs.root`` and the thermal sources
read these files exactly as they read ``/sys``: millidegrees in
``class/thermal/thermal_zoneN/temp`` and ``class/hwmon/hwmonN/tempM_input``.
Writes are atomic (write + rename) so a reader never sees half a number.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Zone:
    path: Path

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class HwmonSensor:
    chip: Path
    index: int

    @property
    def input(self) -> Path:
        return self.chip / f"temp{self.index}_input"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _milli(temp_c: float) -> str:
    return f"{round(temp_c * 1000)}\n"


class FakeSysfs:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.thermal = self.root / "class" / "thermal"
        self.hwmon = self.root / "class" / "hwmon"
        self.thermal.mkdir(parents=True, exist_ok=True)
        self.hwmon.mkdir(parents=True, exist_ok=True)

    def add_zone(self, type: str, temp_c: float, trips: Iterable[tuple[str, float]] = ()) -> Zone:
        """A new ``thermal_zoneN`` with ``type``, ``temp`` and trip points given as
        ``(trip type, temp_c)`` pairs (``[("passive", 70), ("hot", 85), ("critical", 95)]``)."""
        n = sum(1 for p in self.thermal.iterdir() if p.name.startswith("thermal_zone"))
        zone = self.thermal / f"thermal_zone{n}"
        zone.mkdir()
        _write(zone / "type", f"{type}\n")
        for i, (trip_type, trip_c) in enumerate(trips):
            _write(zone / f"trip_point_{i}_type", f"{trip_type}\n")
            _write(zone / f"trip_point_{i}_temp", _milli(trip_c))
        _write(zone / "temp", _milli(temp_c))
        return Zone(zone)

    def set_temp(self, zone: Zone | HwmonSensor, temp_c: float) -> None:
        path = zone.path / "temp" if isinstance(zone, Zone) else zone.input
        _write(path, _milli(temp_c))

    def add_hwmon(self, name: str, label: str | None, temp_c: float) -> HwmonSensor:
        """A sensor on the chip called ``name`` (created on first use) with ``label``."""
        chip = None
        for p in sorted(self.hwmon.iterdir()):
            if (p / "name").read_text().strip() == name:
                chip = p
                break
        if chip is None:
            n = sum(1 for _ in self.hwmon.iterdir())
            chip = self.hwmon / f"hwmon{n}"
            chip.mkdir()
            _write(chip / "name", f"{name}\n")
        index = 1 + sum(1 for _ in chip.glob("temp*_input"))
        sensor = HwmonSensor(chip, index)
        if label is not None:
            _write(chip / f"temp{index}_label", f"{label}\n")
        _write(sensor.input, _milli(temp_c))
        return sensor

    def break_file(self, zone: Zone | HwmonSensor, content: str = "garbage\n") -> None:
        """Make a sensor unreadable as a number (a driver returning junk)."""
        path = zone.path / "temp" if isinstance(zone, Zone) else zone.input
        _write(path, content)

    def remove(self, zone: Zone | HwmonSensor) -> None:
        """The sensor's file disappears (hot-unplug, driver unload)."""
        path = zone.path / "temp" if isinstance(zone, Zone) else zone.input
        path.unlink()

    def __repr__(self) -> str:
        return f"FakeSysfs({str(self.root)!r})"
