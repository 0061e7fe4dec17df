"""The restart check's table push (testing/conformance/restart.py ``push_table``): it
returns only once the supervised driver applied the table.

The check used to schedule the push on the supervisor's loop and prepare at once. When
that loop's thread was slow to run (a loaded machine), the prepare reached the driver
first, from a uid it had no entry for: BACKGROUND, compiled on a SCHED_IDLE thread, which
beside busy normal-priority work made no progress for the client's whole 300 s (the torch
conformance run's hang). Here the loop is kept busy on purpose, so the race is lost every
time without the wait, on real processes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.clock import MonotonicClock
from npumanager.config import Config
from npumanager.hal.types import SchedulingConfig
from npumanager.nn.device import Device
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.service.supervisor import DriverSupervisor
from npumanager.testing.conformance.restart import push_table
from tests.drivers.supervisor_thread import supervisor_on_a_thread


class _Quiet:
    """DriverEvents that ignore everything."""

    def driver_up(self, *a: object) -> None: ...
    def driver_down(self, *a: object) -> None: ...
    def work_ended(self, *a: object) -> None: ...
    def model_memory(self, *a: object) -> None: ...
    def grant_end_applied(self, *a: object) -> None: ...


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    rt = Path(tempfile.mkdtemp(prefix="npu-rt-", dir="/tmp"))
    st = Path(tempfile.mkdtemp(prefix="npu-st-", dir="/tmp"))
    try:
        yield rt, st
    finally:
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(st, ignore_errors=True)


def _caller(dev: Device) -> dict[str, object]:
    """How the driver places this process's uid now (``device.stats``)."""
    payload, _ = dev.call(dev.connection(), "device.stats", Empty())
    caller = json.loads(payload)["caller"]
    assert isinstance(caller, dict)
    return caller


@pytest.mark.slow
def test_push_table_returns_once_the_driver_applied_it(dirs: tuple[Path, Path]) -> None:
    rt, st = dirs
    cfg = Config.load(overrides={
        "driver": [{"name": "reference", "plugin": "reference", "restart_backoff_s": 0.05}],
        "manager": {"enforce_admission": False}})
    sup = DriverSupervisor(cfg, rt, _Quiet(), MonotonicClock(), state_dir=st)
    uid = os.getuid()
    with supervisor_on_a_thread(sup) as loop, Device("reference", rt) as dev:
        assert _caller(dev)["app_priority"] == 1000  # no entry yet: UNKNOWN_UID_PRIORITY
        # The supervisor's thread gets to its loop late, as on a loaded machine.
        loop.call_soon_threadsafe(time.sleep, 0.5)
        push_table(sup, loop, [SchedulingConfig(uid=uid, app_priority=100,
                                                has_direct_access=False)])
        # What a prepare sent now would be compiled as.
        assert _caller(dev) == {"uid": uid, "app_priority": 100, "class": "foreground"}
