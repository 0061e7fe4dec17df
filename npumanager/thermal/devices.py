"""Each device's own temperature: ``[thermal] devices`` maps a device to its sensor.

A machine with a CPU, a GPU and an NPU heats unevenly: a hot GPU must shrink the GPU's
budget, not the NPU's. ``[thermal] devices`` names, for a device (as ``nn.devices()``
names it), the file its temperature is read from; the status computed from it (the
configured thresholds and hysteresis, the same ladder as the machine's) is that
device's own: npud feeds it as ``ThermalChanged(device=...)`` and the device's budget
follows the worse of it and the machine's status (service/devices.py). A device with
no sensor of its own follows the machine's status alone.

Specs (a string, or a list of them: the hottest counts):

* ``"zone:NAME"``: the thermal zone ``{sysfs_root}/class/thermal/thermal_zoneN`` whose
  directory name or ``type`` is NAME (``"zone:gpu-thermal"``, ``"zone:thermal_zone3"``);
* ``"hwmon:CHIP"`` or ``"hwmon:CHIP/LABEL"``: the hwmon chip whose ``name`` is CHIP,
  its input labelled LABEL (without one: its first ``temp*_input``);
* ``"file:PATH"``: a file of millidegrees Celsius (relative paths under ``sysfs_root``).

A zone or hwmon input claimed by a device no longer counts for the machine's status
(``claimed``: the machine sources' names of what was read), so one hot GPU does not
make the whole machine SEVERE when ``sources`` reads every zone. A ``file:`` sensor
claims nothing. Unreadable sensors are logged once and skipped; a device whose sensors
have not been read for ``stale_after_s`` falls back to NONE (the machine's status).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npumanager.constants import ThermalStatus
from npumanager.errors import InvalidArgument
from npumanager.thermal.sources import hwmon_chips, hwmon_inputs, hwmon_name
from npumanager.thermal.status import HysteresisTracker, Thresholds

log = logging.getLogger("npumanager.thermal")

_ZONE_RE = re.compile(r"thermal_zone(\d+)$")
KINDS = ("zone", "hwmon", "file")


def _text(path: Path) -> str:
    return path.read_text().strip()


def parse_device_sensors(table: object) -> dict[str, list[tuple[str, str]]]:
    """``[thermal] devices`` -> device -> [(kind, what)]; InvalidArgument naming the bad
    entry."""
    if not isinstance(table, Mapping):
        raise InvalidArgument(f"[thermal] devices must be a table, got {table!r}")
    out: dict[str, list[tuple[str, str]]] = {}
    for device, specs in table.items():
        listed = [specs] if isinstance(specs, str) else specs
        if not isinstance(listed, list) or not listed:
            raise InvalidArgument(f"[thermal] devices: {device!r} needs a sensor spec or a "
                                  f"list of them, got {specs!r}")
        parsed = []
        for spec in listed:
            kind, _, what = str(spec).partition(":") if isinstance(spec, str) else ("", "", "")
            if kind not in KINDS or not what:
                raise InvalidArgument(
                    f"[thermal] devices: {device!r}: {spec!r} is not one of zone:NAME, "
                    f"hwmon:CHIP[/LABEL], file:PATH")
            parsed.append((kind, what))
        out[str(device)] = parsed
    return out


@dataclass
class _DeviceSensors:
    device: str
    specs: list[tuple[str, str]]
    tracker: HysteresisTracker
    temp_c: float = math.nan
    last_seen: float | None = None
    #: What was read last poll: (spec, path, temp).
    read: list[tuple[str, str, float]] = field(default_factory=list)


class DeviceThermal:
    """Every device's own status from its sensors; polled with the machine's monitor."""

    def __init__(self, section: Mapping[str, Any], thresholds: Thresholds,
                 hysteresis_c: float, valid_range_c: tuple[float, float],
                 stale_after_s: float) -> None:
        self.root = Path(str(section.get("sysfs_root", "/sys")))
        self.valid_range_c = valid_range_c
        self.stale_after_s = stale_after_s
        self.devices: dict[str, _DeviceSensors] = {
            dev: _DeviceSensors(dev, specs, HysteresisTracker(dict(thresholds), hysteresis_c))
            for dev, specs in parse_device_sensors(section.get("devices", {})).items()}
        #: The machine sources' reading names of the zones/hwmon inputs devices read.
        self.claimed: set[str] = set()
        self._failing: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.devices)

    def poll(self, now: float) -> dict[str, ThermalStatus]:
        """Read every device's sensors once; each device's status."""
        claimed: set[str] = set()
        out: dict[str, ThermalStatus] = {}
        for dev in self.devices.values():
            dev.read = []
            for kind, what in dev.specs:
                spec = f"{kind}:{what}"
                try:
                    path, machine_name = self._resolve(kind, what)
                    temp = int(_text(path)) / 1000.0
                except (OSError, ValueError, LookupError) as exc:
                    if spec not in self._failing:
                        self._failing.add(spec)
                        log.warning("thermal: %s's sensor %s unreadable (%s); skipping it",
                                    dev.device, spec, exc)
                    continue
                if machine_name:
                    claimed.add(machine_name)
                low, high = self.valid_range_c
                if not low <= temp <= high:
                    if spec not in self._failing:
                        self._failing.add(spec)
                        log.warning("thermal: %s's sensor %s reads %.1f C, outside %s..%s C;"
                                    " ignoring it", dev.device, spec, temp, low, high)
                    continue
                self._failing.discard(spec)
                dev.read.append((spec, str(path), temp))
            if dev.read:
                dev.temp_c = max(t for _, _, t in dev.read)
                dev.last_seen = now
                dev.tracker.update(dev.temp_c)
            elif dev.last_seen is None or now - dev.last_seen > self.stale_after_s:
                dev.temp_c = math.nan
                dev.tracker = HysteresisTracker(dev.tracker.thresholds, dev.tracker.hysteresis_c)
            out[dev.device] = dev.tracker.status
        self.claimed = claimed
        return out

    def _resolve(self, kind: str, what: str) -> tuple[Path, str]:
        """(the file to read, the machine sources' name for it or "")."""
        if kind == "file":
            path = Path(what)
            return (path if path.is_absolute() else self.root / path), ""
        if kind == "zone":
            base = self.root / "class" / "thermal"
            for zone in sorted(p for p in base.iterdir() if _ZONE_RE.match(p.name)):
                try:
                    ztype = _text(zone / "type")
                except OSError:
                    ztype = zone.name
                if what in (zone.name, ztype):
                    return zone / "temp", f"{zone.name}/{ztype}"
            raise LookupError(f"no thermal zone named {what!r} in {base}")
        chip_name, _, label = what.partition("/")
        base = self.root / "class" / "hwmon"
        for chip in hwmon_chips(base):
            name = hwmon_name(chip)
            if name != chip_name:
                continue
            for inp, own in hwmon_inputs(chip):
                if not label or label == own:
                    return inp, f"{chip.name}/{name}/{own}"
        raise LookupError(f"no hwmon input {what!r} in {base}")

    def describe(self) -> dict[str, Any]:
        return {d.device: {"status": d.tracker.status.name,
                           "temp_c": None if math.isnan(d.temp_c) else round(d.temp_c, 3),
                           "sensors": [f"{kind}:{what}" for kind, what in d.specs],
                           "read": [{"sensor": s, "path": p, "temp_c": round(t, 3)}
                                    for s, p, t in d.read]}
                for d in self.devices.values()}


__all__ = ["DeviceThermal", "parse_device_sensors"]
