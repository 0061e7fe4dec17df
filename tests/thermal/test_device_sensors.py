"""Each device's own sensor ([thermal] devices): its status holds back only its budget.

Unit level (the monitor on a virtual clock against a fake sysfs tree of real files) and
end to end (a real npud and one reference driver host serving two devices)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from npumanager.client import ModelLoadRequest, ModelLoadRequestCallback, NpuManager
from npumanager.constants import LoadStatus, ModelPriority, ThermalStatus, UnloadReason
from npumanager.errors import InvalidArgument
from npumanager.testing import VirtualClock
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.fake_sysfs import FakeSysfs

from .conftest import MonitorFactory

SEVERE, NONE = ThermalStatus.SEVERE, ThermalStatus.NONE


def test_a_devices_zone_sets_its_status_and_leaves_the_machine_alone(
        make_monitor: MonitorFactory, sysfs: FakeSysfs, clock: VirtualClock) -> None:
    pkg = sysfs.add_zone("x86_pkg_temp", 45.0)
    gpu = sysfs.add_zone("gpu-thermal", 45.0)
    npu = sysfs.add_hwmon("intel_vpu", "npu", 40.0)
    sysfs.add_hwmon("intel_vpu", "other", 99.0)  # the NPU spec names the "npu" input only
    mon = make_monitor(sources=["sysfs", "hwmon"], hwmon_names=["coretemp"],
                       devices={"ov:GPU": "zone:gpu-thermal", "ov:NPU": "hwmon:intel_vpu/npu",
                                "ov:CPU": ["file:class/thermal/thermal_zone0/temp"]})
    assert mon.poll() == NONE
    assert mon.device_status == {"ov:GPU": NONE, "ov:NPU": NONE, "ov:CPU": NONE}
    sysfs.set_temp(gpu, 85.0)
    # The GPU's zone is the GPU's: the machine stays NONE though "sysfs" reads every zone.
    assert mon.poll() == NONE
    assert mon.device_status == {"ov:GPU": SEVERE, "ov:NPU": NONE, "ov:CPU": NONE}
    assert [s["name"] for s in mon.describe()["sensors"]] == ["thermal_zone0/x86_pkg_temp"]
    assert mon.describe()["device_sensors"]["ov:GPU"]["read"] == [
        {"sensor": "zone:gpu-thermal", "path": str(gpu.path / "temp"), "temp_c": 85.0}]
    sysfs.set_temp(npu, 91.0)
    sysfs.set_temp(pkg, 71.0)  # the machine's own sensor (and the CPU's file) moves
    assert mon.poll() == ThermalStatus.MODERATE
    assert mon.device_status == {"ov:GPU": SEVERE, "ov:NPU": ThermalStatus.CRITICAL,
                                 "ov:CPU": ThermalStatus.MODERATE}
    sysfs.set_temp(gpu, 79.0)  # within the hysteresis of SEVERE: held
    mon.poll()
    assert mon.device_status["ov:GPU"] == SEVERE
    sysfs.set_temp(gpu, 77.0)
    mon.poll()
    assert mon.device_status["ov:GPU"] == ThermalStatus.MODERATE
    sysfs.set_temp(gpu, 40.0)
    mon.poll()
    assert mon.device_status["ov:GPU"] == NONE


def test_an_unreadable_sensor_is_skipped_then_stale(
        make_monitor: MonitorFactory, sysfs: FakeSysfs, clock: VirtualClock) -> None:
    gpu = sysfs.add_zone("gpu-thermal", 85.0)
    mon = make_monitor(sources=["sysfs"], stale_after_s=5.0,
                       devices={"ov:GPU": "zone:gpu-thermal", "ov:NPU": "zone:absent"})
    mon.poll()
    assert mon.device_status == {"ov:GPU": SEVERE, "ov:NPU": NONE}
    sysfs.break_file(gpu)
    clock.advance(4.0)
    mon.poll()
    assert mon.device_status["ov:GPU"] == SEVERE  # one bad read: the last status holds
    clock.advance(2.0)
    mon.poll()
    assert mon.device_status["ov:GPU"] == NONE  # stale: the machine's status alone
    # A zone that failed to read is not claimed: it counts for the machine again.
    assert mon.device_thermal.claimed == set()


@pytest.mark.parametrize("devices", [{"a": "zone"}, {"a": "disk:x"}, {"a": []}, {"a": 3},
                                     "zone:x"])
def test_bad_specs_are_refused(make_monitor: MonitorFactory, devices: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"\[thermal\] devices"):
        make_monitor(devices=devices)


class Recorder(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.listener: Any = None

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        self.listener = listener
        self.events.put(("can_load", status))

    def on_request_unload_model(self, request: Any, reason: Any) -> None:
        self.events.put(("unload", reason))

    def on_model_load_request_complete(self, request: Any, status: Any) -> None:
        self.events.put(("complete", status))


def _load(mgr: NpuManager, rid: int, device: str) -> tuple[ModelLoadRequest, Recorder]:
    req = ModelLoadRequest(rid, priority=ModelPriority.BACKGROUND, device=device)
    rec = Recorder()
    mgr.request_can_load_model(req, rec)
    assert rec.events.get(timeout=10) == ("can_load", LoadStatus.CAN_LOAD_NOW)
    rec.listener.notify_model_loaded(req)
    return req, rec


@pytest.mark.slow
def test_one_devices_severe_sheds_only_that_devices_holders(
        runtime_dir: Path, state_dir: Path, sysfs: FakeSysfs) -> None:
    """A real npud, one reference host serving ref:a and ref:b, each with a zone of its
    own: ref:a's zone at SEVERE asks ref:a's background holder to unload (THERMAL) and
    halves ref:a's budget; ref:b's holder and budget are untouched; the machine stays
    NONE."""
    sysfs.add_zone("x86_pkg_temp", 40.0)
    zone_a = sysfs.add_zone("npu-a", 40.0)
    sysfs.add_zone("npu-b", 40.0)
    config = {
        "policy": {"name": "BUDGET", "max_budget": 4},
        "driver": [{"name": "ref", "plugin": "reference", "channels": 1,
                    "options": {"devices": ["a", "b"]}}],
        "thermal": {"sources": ["sysfs"], "sysfs_root": str(sysfs.root),
                    "poll_interval_s": 0.02,
                    "devices": {"ref:a": "zone:npu-a", "ref:b": "zone:npu-b"}},
    }
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, config, drivers=True, env=env, ready_timeout=60), \
            NpuManager(runtime_dir) as mgr:
        req_a, rec_a = _load(mgr, 1, "ref:a")
        _, rec_b = _load(mgr, 2, "ref:b")
        sysfs.set_temp(zone_a, 85.0)
        assert rec_a.events.get(timeout=10) == ("unload", UnloadReason.THERMAL)
        dump = mgr.dump()
        budgets = {b["device"]: b for b in dump["budgets"]}
        assert budgets["ref:a"]["thermal"]["own_status"] == "SEVERE"
        assert budgets["ref:a"]["thermal_scaled"] == 2
        assert budgets["ref:b"]["thermal"]["status"] == "NONE"
        assert budgets["ref:b"]["thermal_scaled"] == 4
        assert dump["thermal"]["status"] == "NONE"
        assert dump["thermal"]["devices"] == {"ref:a": "SEVERE", "ref:b": "NONE"}
        assert dump["thermal"]["device_sensors"]["ref:a"]["status"] == "SEVERE"
        status = subprocess.run(
            [sys.executable, "-m", "npumanager", "status", "--runtime-dir", str(runtime_dir)],
            capture_output=True, text=True, timeout=60)
        assert "ref:a: 1 of 4 used (1 being unloaded); thermal limit 2; thermal SEVERE" \
            in status.stdout, status.stdout
        assert "ref:b: 1 of 4 used\n" in status.stdout, status.stdout
        assert "thermal:  NONE  40.0 C  headroom 0.00\n" in status.stdout, status.stdout
        rec_a.listener.notify_model_unloaded(req_a)
        # Hot, ref:a keeps new background work waiting; cooled, it takes it.
        rec3 = Recorder()
        mgr.request_can_load_model(
            ModelLoadRequest(3, priority=ModelPriority.BACKGROUND, device="ref:a"), rec3)
        assert rec3.events.get(timeout=10) == ("can_load", LoadStatus.NOT_PRIORITIZED)
        sysfs.set_temp(zone_a, 40.0)
        assert rec3.events.get(timeout=10) == ("can_load", LoadStatus.CAN_LOAD_NOW)
        assert rec_b.events.empty(), "ref:b's holder was never asked anything"


@pytest.mark.slow
def test_npud_refuses_a_sensor_for_a_device_it_does_not_have(
        runtime_dir: Path, state_dir: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "npud.toml"
    cfg.write_text('[[driver]]\nname = "ref"\nplugin = "reference"\n[driver.options]\n'
                   'devices = ["a", "b"]\n[thermal]\ndevices = { "ref:c" = "zone:x" }\n')
    proc = subprocess.run(
        [sys.executable, "-m", "npumanager", "serve", "--runtime-dir", str(runtime_dir),
         "--config", str(cfg)], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, NPU_STATE_DIR=str(state_dir)))
    assert proc.returncode == 1
    assert ("InvalidArgument: [thermal] devices names ref:c; npud's devices are ref:a, ref:b"
            in proc.stderr), proc.stderr
