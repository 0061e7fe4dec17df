"""Each thermal source against real files (or a stand-in pynvml), including failures."""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest

from npumanager.constants import ThermalStatus as T
from npumanager.errors import InvalidArgument
from npumanager.testing import VirtualClock
from npumanager.testing.fake_sysfs import FakeSysfs
from npumanager.thermal.sources import DriverModel, Hwmon, Nvml, ThermalZones

from .conftest import MonitorFactory


def test_zones_report_type_and_millidegrees(sysfs: FakeSysfs) -> None:
    sysfs.add_zone("x86_pkg_temp", 47.5)
    sysfs.add_zone("acpitz", 27.8)
    readings = ThermalZones(sysfs.root).read()
    assert [(r.name, r.source, r.temp_c) for r in readings] == [
        ("thermal_zone0/x86_pkg_temp", "sysfs", 47.5),
        ("thermal_zone1/acpitz", "sysfs", 27.8),
    ]
    assert (sysfs.root / "class/thermal/thermal_zone0/temp").read_text() == "47500\n"


def test_zone_types_filter(sysfs: FakeSysfs, make_monitor: MonitorFactory) -> None:
    sysfs.add_zone("x86_pkg_temp", 50.0)
    sysfs.add_zone("iwlwifi_1", 99.0)  # a hot wifi chip must not throttle the NPU
    m = make_monitor(zone_types=["x86_pkg_temp"])
    assert m.poll() == T.NONE
    assert [s["name"] for s in m.describe()["sensors"]] == ["thermal_zone0/x86_pkg_temp"]


def test_trip_points_set_that_zones_thresholds_when_configured(
    sysfs: FakeSysfs, clock: VirtualClock, make_monitor: MonitorFactory
) -> None:
    trips = [("passive", 60.0), ("hot", 72.0), ("critical", 85.0)]
    z = sysfs.add_zone("soc", 73.0, trips=trips)
    other = sysfs.add_zone("acpitz", 73.0)  # no trip points: the configured ladder
    ignored = make_monitor()
    assert ignored.poll() == T.MODERATE  # trip points ignored unless configured

    m = make_monitor(trip_points={"hot": "severe", "critical": "critical"})
    assert m.poll() == T.SEVERE
    sensors = {s["name"]: s for s in m.describe()["sensors"]}
    soc = sensors["thermal_zone0/soc"]
    assert soc["status"] == "SEVERE"
    assert soc["thresholds_c"]["severe"] == 72.0
    assert soc["thresholds_c"]["moderate"] == 70.0
    assert soc["thresholds_c"]["critical"] == 85.0
    assert sensors["thermal_zone1/acpitz"]["status"] == "MODERATE"
    sysfs.set_temp(z, 86.0)
    sysfs.set_temp(other, 40.0)
    clock.advance(1.0)
    assert m.poll() == T.CRITICAL


def test_trip_point_below_configured_lower_rungs_keeps_ladder_monotonic(
    sysfs: FakeSysfs, make_monitor: MonitorFactory
) -> None:
    sysfs.add_zone("soc", 66.0, trips=[("hot", 65.0)])
    m = make_monitor(trip_points={"hot": "severe"})
    assert m.poll() == T.SEVERE
    th = m.describe()["sensors"][0]["thresholds_c"]
    assert th["light"] == 60.0 and th["moderate"] == 65.0 and th["severe"] == 65.0


def test_hwmon_reads_name_and_label(sysfs: FakeSysfs, make_monitor: MonitorFactory) -> None:
    sysfs.add_hwmon("coretemp", "Package id 0", 55.0)
    sysfs.add_hwmon("coretemp", "Core 0", 81.0)
    sysfs.add_hwmon("nvme", None, 38.0)  # no label: tempN
    readings = Hwmon(sysfs.root).read()
    assert [(r.name, r.temp_c) for r in readings] == [
        ("hwmon0/coretemp/Package id 0", 55.0),
        ("hwmon0/coretemp/Core 0", 81.0),
        ("hwmon1/nvme/temp1", 38.0),
    ]
    assert [r.name for r in Hwmon(sysfs.root, names=["nvme"]).read()] == ["hwmon1/nvme/temp1"]
    assert make_monitor(sources=["hwmon"]).poll() == T.SEVERE


def test_unreadable_file_is_skipped_and_logged_once(
    sysfs: FakeSysfs,
    clock: VirtualClock,
    make_monitor: MonitorFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = sysfs.add_zone("soc", 50.0)
    sysfs.add_zone("acpitz", 75.0)
    sysfs.break_file(bad)
    m = make_monitor()
    with caplog.at_level(logging.WARNING, logger="npumanager.thermal"):
        for _ in range(3):
            assert m.poll() == T.MODERATE  # the good zone still counts
            clock.advance(1.0)
    msgs = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert len(msgs) == 1 and "thermal_zone0/temp" in msgs[0]
    # It recovers, and a later failure is logged again.
    sysfs.set_temp(bad, 91.0)
    assert m.poll() == T.CRITICAL
    sysfs.remove(bad)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="npumanager.thermal"):
        m.poll()
        m.poll()
    assert sum("cannot read" in r.getMessage() for r in caplog.records) == 1


def test_unreadable_temp_file_is_skipped(sysfs: FakeSysfs) -> None:
    z = sysfs.add_zone("soc", 50.0)
    sysfs.add_zone("acpitz", 40.0)
    (z.path / "temp").unlink()
    (z.path / "temp").mkdir()  # EISDIR: unreadable even for root
    assert [r.name for r in ThermalZones(sysfs.root).read()] == ["thermal_zone1/acpitz"]


def test_missing_sysfs_root_reports_nothing(sysfs: FakeSysfs, make_monitor: MonitorFactory) -> None:
    m = make_monitor(sysfs_root=str(sysfs.root / "nowhere"))
    assert m.poll() == T.NONE
    assert m.describe()["sensors"] == []


def test_zone_with_missing_type_uses_its_directory_name(sysfs: FakeSysfs) -> None:
    z = sysfs.add_zone("soc", 42.0)
    (z.path / "type").unlink()
    assert [r.name for r in ThermalZones(sysfs.root).read()] == ["thermal_zone0/thermal_zone0"]


def _no_pynvml(name: str) -> types.ModuleType:
    raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_nvml_absent_reports_nothing_never_crashes() -> None:
    src = Nvml(import_module=_no_pynvml)
    assert src.read() == []
    assert src.read() == []
    src.close()


def test_real_pynvml_without_gpu_reports_nothing() -> None:
    """The real bindings (nvidia-ml-py): here there is no NVIDIA driver, so nvmlInit fails;
    on a GPU machine every GPU reports a plausible temperature."""
    pytest.importorskip("pynvml")
    src = Nvml(use_thresholds=True)
    readings = src.read()
    assert all(r.source == "nvml" and 0.0 < r.temp_c < 150.0 for r in readings)
    assert src.read() == [] or len(src.read()) == len(readings)
    src.close()


def test_nvml_source_in_config_without_pynvml(
    sysfs: FakeSysfs, make_monitor: MonitorFactory
) -> None:
    sysfs.add_zone("soc", 65.0)
    m = make_monitor(sources=["sysfs", "nvml"])
    # Whether or not pynvml is installed here, the monitor keeps working.
    assert m.poll() in (T.LIGHT, T.MODERATE, T.SEVERE, T.CRITICAL, T.EMERGENCY, T.SHUTDOWN)
    m.close()


class _FakeNvml(types.ModuleType):
    """Just the pynvml calls the source makes."""

    NVML_TEMPERATURE_GPU = 0
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1

    def __init__(self, temps: list[float], fail_init: bool = False) -> None:
        super().__init__("pynvml")
        self.temps = temps
        self.fail_init = fail_init
        self.shut = False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.temps)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> float:
        if self.temps[h] < 0:
            raise RuntimeError("GPU is lost")
        return self.temps[h]

    def nvmlDeviceGetTemperatureThreshold(self, h: int, which: int) -> float:
        return {1: 87.0, 0: 98.0}[which]

    def nvmlShutdown(self) -> None:
        self.shut = True


def test_nvml_reads_each_gpu_and_its_thresholds() -> None:
    fake = _FakeNvml([61.0, 88.0])

    def imp(name: str) -> Any:
        return fake

    src = Nvml(use_thresholds=True, import_module=imp)
    readings = src.read()
    assert [(r.name, r.source, r.temp_c) for r in readings] == [
        ("gpu0", "nvml", 61.0),
        ("gpu1", "nvml", 88.0),
    ]
    assert readings[1].thresholds == {T.SEVERE: 87.0, T.SHUTDOWN: 98.0}
    fake.temps[0] = -1.0  # a GPU falls off the bus: skipped, the other still read
    assert [r.name for r in src.read()] == ["gpu1"]
    src.close()
    assert fake.shut


def test_nvml_without_gpu_reports_nothing() -> None:
    fake = _FakeNvml([], fail_init=True)
    src = Nvml(import_module=lambda name: fake)
    assert src.read() == []


def test_driver_model_source(caplog: pytest.LogCaptureFixture) -> None:
    temps = {"reference": 71.25, "npu1": float("nan")}
    assert [(r.name, r.temp_c) for r in DriverModel(lambda: temps).read()] == [
        ("driver/reference", 71.25)
    ]

    def broken() -> dict[str, float]:
        raise ConnectionError("supervisor restarting")

    src = DriverModel(broken)
    with caplog.at_level(logging.WARNING, logger="npumanager.thermal"):
        assert src.read() == []
        assert src.read() == []
    assert sum("cannot read" in r.getMessage() for r in caplog.records) == 1


def test_a_source_that_raises_never_crashes_the_monitor(
    sysfs: FakeSysfs, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    from npumanager.config import Config
    from npumanager.thermal.monitor import ThermalMonitor

    class Exploding:
        name = "exploding"

        def read(self) -> list[Any]:
            raise OSError("bus error")

    sysfs.add_zone("soc", 82.0)
    m = ThermalMonitor(
        Config().section("thermal"),
        clock,
        lambda: {},
        sources=[Exploding(), ThermalZones(sysfs.root)],
    )
    with caplog.at_level(logging.WARNING, logger="npumanager.thermal"):
        assert m.poll() == T.SEVERE
        assert m.poll() == T.SEVERE
    assert sum("source exploding failed" in r.getMessage() for r in caplog.records) == 1
    assert m.describe()["failing_sources"] == ["exploding"]


def test_implausible_readings_are_ignored_and_logged_once(
    sysfs: FakeSysfs,
    clock: VirtualClock,
    make_monitor: MonitorFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = sysfs.add_zone("soc", -273.2)  # a failed sensor's sentinel
    sysfs.add_hwmon("nvme", "Composite", 255.0)
    sysfs.add_zone("acpitz", 61.0)
    m = make_monitor()
    with caplog.at_level(logging.WARNING, logger="npumanager.thermal"):
        assert m.poll() == T.LIGHT  # not SHUTDOWN from the 255 C sentinel
        assert m.poll() == T.LIGHT
    msgs = [r.getMessage() for r in caplog.records if "outside" in r.getMessage()]
    assert len(msgs) == 2
    sysfs.set_temp(broken, 91.0)  # it recovers: counted again
    clock.advance(1.0)
    assert m.poll() == T.CRITICAL
    with pytest.raises(InvalidArgument, match="valid_range_c"):
        make_monitor(valid_range_c=[100.0, 0.0])
