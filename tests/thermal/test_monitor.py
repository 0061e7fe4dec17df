"""ThermalMonitor on a virtual clock against a fake sysfs tree of real files."""

from __future__ import annotations

import json
import math

import pytest

from npumanager.constants import ThermalStatus as T
from npumanager.errors import InvalidArgument
from npumanager.testing import VirtualClock
from npumanager.testing.fake_sysfs import FakeSysfs
from npumanager.thermal.render import render_thermal

from .conftest import MonitorFactory


def test_status_follows_hottest_zone_through_every_threshold(
    sysfs: FakeSysfs, clock: VirtualClock, make_monitor: MonitorFactory
) -> None:
    z = sysfs.add_zone("x86_pkg_temp", 40.0)
    sysfs.add_zone("acpitz", 30.0)
    m = make_monitor()
    seen = []
    for temp in (40.0, 60.0, 70.0, 80.0, 90.0, 95.0, 100.0):
        sysfs.set_temp(z, temp)
        clock.advance(1.0)
        seen.append(m.poll())
    assert seen == [T.NONE, T.LIGHT, T.MODERATE, T.SEVERE, T.CRITICAL, T.EMERGENCY, T.SHUTDOWN]
    assert m.status == T.SHUTDOWN
    assert m.temperature_c == pytest.approx(100.0)


def test_max_over_sources_decides(
    sysfs: FakeSysfs,
    clock: VirtualClock,
    make_monitor: MonitorFactory,
    driver_temps: dict[str, float],
) -> None:
    sysfs.add_zone("acpitz", 45.0)
    sysfs.add_hwmon("coretemp", "Package id 0", 50.0)
    driver_temps["reference"] = 72.0
    m = make_monitor()
    assert m.poll() == T.MODERATE
    names = {s["name"]: s["source"] for s in m.describe()["sensors"]}
    assert names == {
        "thermal_zone0/acpitz": "sysfs",
        "hwmon0/coretemp/Package id 0": "hwmon",
        "driver/reference": "driver",
    }
    driver_temps["reference"] = 40.0
    clock.advance(1.0)
    assert m.poll() == T.NONE


def test_noisy_sensor_around_threshold_does_not_flap_through_monitor(
    sysfs: FakeSysfs, clock: VirtualClock, make_monitor: MonitorFactory
) -> None:
    z = sysfs.add_zone("soc", 79.0)
    m = make_monitor()
    statuses = []
    for temp in [79.4, 80.2, 79.1, 80.6, 78.9, 80.0, 78.4, 80.9, 79.7, 80.1] * 3:
        sysfs.set_temp(z, temp)
        clock.advance(0.5)
        statuses.append(m.poll())
    assert [h.status for h in m.history] == [T.MODERATE, T.SEVERE]
    assert statuses[-1] == T.SEVERE
    sysfs.set_temp(z, 77.5)
    clock.advance(0.5)
    assert m.poll() == T.MODERATE  # a real fall (>= hysteresis below) is followed


def test_min_dwell_holds_status_before_falling(
    sysfs: FakeSysfs, clock: VirtualClock, make_monitor: MonitorFactory
) -> None:
    z = sysfs.add_zone("soc", 85.0)
    m = make_monitor(min_dwell_s=5.0)
    assert m.poll() == T.SEVERE
    sysfs.set_temp(z, 50.0)
    clock.advance(2.0)
    assert m.poll() == T.SEVERE
    clock.advance(3.0)
    assert m.poll() == T.NONE


def test_headroom_forecast_from_rising_trend(
    sysfs: FakeSysfs, clock: VirtualClock, make_monitor: MonitorFactory
) -> None:
    z = sysfs.add_zone("soc", 50.0)
    m = make_monitor()
    assert math.isnan(m.headroom())
    assert math.isnan(m.headroom(10.0))
    for i in range(6):  # +1 C per second: 50 .. 55
        sysfs.set_temp(z, 50.0 + i)
        m.poll()
        clock.advance(1.0)
    # SEVERE is 80, span 30: headroom = (t - 50) / 30.
    assert m.headroom() == pytest.approx(5 / 30)
    assert m.headroom(0) == pytest.approx(5 / 30)
    assert m.headroom(10.0) == pytest.approx(15 / 30)  # 65 C expected in 10 s
    assert m.headroom(25.0) == pytest.approx(1.0)  # reaches SEVERE (80 C) in 25 s
    d = m.describe()
    assert d["headroom_forecast"] == pytest.approx(15 / 30, abs=1e-3)
    assert d["sensors"][0]["slope_c_per_s"] == pytest.approx(1.0)


def test_override_forces_status_and_reset_returns_to_sensors(
    sysfs: FakeSysfs, clock: VirtualClock, make_monitor: MonitorFactory
) -> None:
    z = sysfs.add_zone("soc", 40.0)
    m = make_monitor()
    assert m.poll() == T.NONE
    assert m.override(T.SEVERE) == T.SEVERE
    assert m.status == T.SEVERE
    sysfs.set_temp(z, 72.0)
    clock.advance(1.0)
    assert m.poll() == T.SEVERE  # sensors moved, the override holds
    assert m.computed_status == T.MODERATE
    d = m.describe()
    assert (d["status"], d["override"], d["computed_status"]) == ("SEVERE", "SEVERE", "MODERATE")
    assert m.override(None) == T.MODERATE
    assert m.describe()["override"] is None
    assert m.describe()["overridden"] is False
    assert [(h.status, h.cause) for h in m.history] == [
        (T.SEVERE, "override"),
        (T.MODERATE, "override reset"),
    ]


def test_override_works_with_no_sources_at_all(clock: VirtualClock) -> None:
    from npumanager.config import Config
    from npumanager.thermal.monitor import ThermalMonitor

    m = ThermalMonitor(Config().section("thermal"), clock, lambda: {})
    assert m.poll() == T.NONE
    m.override(T.CRITICAL)
    assert m.poll() == T.CRITICAL
    assert math.isnan(m.headroom())
    json.dumps(m.describe(), allow_nan=False)


def test_stale_sensor_is_dropped(
    sysfs: FakeSysfs, clock: VirtualClock, make_monitor: MonitorFactory
) -> None:
    z = sysfs.add_zone("soc", 85.0)
    m = make_monitor(stale_after_s=10.0)
    assert m.poll() == T.SEVERE
    sysfs.remove(z)
    clock.advance(5.0)
    assert m.poll() == T.SEVERE  # a glitch keeps the last status for a while
    clock.advance(6.0)
    assert m.poll() == T.NONE
    assert m.history[-1].cause == "no sensor readings"


def test_describe_is_strict_json_and_renders(
    sysfs: FakeSysfs, clock: VirtualClock, make_monitor: MonitorFactory
) -> None:
    sysfs.add_zone("soc", 91.0)
    m = make_monitor()
    m.poll()
    d = json.loads(json.dumps(m.describe(), allow_nan=False))
    assert d["status"] == "CRITICAL" and d["status_value"] == 4
    assert d["thresholds_c"]["severe"] == 80.0 and d["hysteresis_c"] == 2.0
    assert d["history"][0]["cause"] == "sensor thermal_zone0/soc at 91.0 C"
    text = render_thermal(d)
    assert "thermal status: CRITICAL" in text
    assert "thermal_zone0/soc" in text and "91.0" in text
    m.override(T.LIGHT)
    assert "override; sensors say CRITICAL" in render_thermal(m.describe())
    assert "CRITICAL" in repr(m) or "LIGHT" in repr(m)


def test_bad_config_is_rejected(make_monitor: MonitorFactory) -> None:
    with pytest.raises(InvalidArgument, match="unknown"):
        make_monitor(sources=["sysfs", "lava"])
    with pytest.raises(InvalidArgument, match="hysteresis_c must be >= 0"):
        make_monitor(hysteresis_c=-1.0)
    with pytest.raises(InvalidArgument, match=r"trip_points\.hot"):
        make_monitor(trip_points={"hot": "boiling"})
