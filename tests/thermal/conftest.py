"""Thermal fixtures: a fake sysfs tree, a virtual clock and a monitor reading them."""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager.config import Config
from npumanager.testing import VirtualClock
from npumanager.testing.fake_sysfs import FakeSysfs
from npumanager.thermal.monitor import ThermalMonitor

MonitorFactory = Callable[..., ThermalMonitor]


@pytest.fixture
def sysfs() -> Iterator[FakeSysfs]:
    d = Path(tempfile.mkdtemp(prefix="npu-sysfs-", dir="/tmp"))
    try:
        yield FakeSysfs(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def driver_temps() -> dict[str, float]:
    """What the drivers' thermal models report; tests mutate it."""
    return {}


@pytest.fixture
def make_monitor(
    sysfs: FakeSysfs, clock: VirtualClock, driver_temps: dict[str, float]
) -> MonitorFactory:
    def make(**overrides: Any) -> ThermalMonitor:
        section = copy.deepcopy(Config().section("thermal"))
        section.update(sources=["sysfs", "hwmon", "driver"], sysfs_root=str(sysfs.root))
        section.update(overrides)
        return ThermalMonitor(section, clock, lambda: driver_temps)

    return make
