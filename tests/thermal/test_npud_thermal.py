"""End to end: a real npud polls a fake sysfs tree; heating it makes background models leave."""

from __future__ import annotations

import json
import queue
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager.cli.main import main as npu
from npumanager.client import ModelLoadRequest, ModelLoadRequestCallback, NpuManager
from npumanager.constants import (
    LoadStatus,
    ModelPriority,
    RequestStatus,
    ThermalStatus,
    UnloadReason,
)
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.fake_sysfs import FakeSysfs

pytestmark = pytest.mark.slow


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

    def next(self, timeout: float = 10.0) -> tuple[str, Any]:
        return self.events.get(timeout=timeout)

    def quiet(self) -> bool:
        return self.events.empty()


@pytest.fixture
def sysfs() -> Iterator[FakeSysfs]:
    d = Path(tempfile.mkdtemp(prefix="npu-sysfs-", dir="/tmp"))
    try:
        yield FakeSysfs(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def load(mgr: NpuManager, rid: int, priority: ModelPriority) -> tuple[ModelLoadRequest, Recorder]:
    req = ModelLoadRequest(id=rid, priority=priority)
    rec = Recorder()
    mgr.request_can_load_model(req, rec)
    assert rec.next() == ("can_load", LoadStatus.CAN_LOAD_NOW)
    rec.listener.notify_model_loaded(req)
    return req, rec


def test_heating_unloads_background_keeps_foreground_and_says_why(
    runtime_dir: Path, sysfs: FakeSysfs, capsys: pytest.CaptureFixture[str]
) -> None:
    zone = sysfs.add_zone("soc", 40.0)
    config = {
        "manager": {"unload_deadline_s": 0.5},
        "policy": {"name": "STATUS_QUO"},
        "thermal": {"sources": ["sysfs"], "sysfs_root": str(sysfs.root), "poll_interval_s": 0.02},
    }
    with (
        DaemonProcess(runtime_dir, config=config) as npud,
        NpuManager(runtime_dir) as fg,
        NpuManager(runtime_dir) as bg,
    ):
        # Both connections are this test's uid (FOREGROUND as root, or GONE otherwise): the
        # BACKGROUND priority puts the second model's rank above PERCEPTIBLE either way.
        fg_req, fg_rec = load(fg, 1, ModelPriority.NORMAL)
        _, bg_rec = load(bg, 2, ModelPriority.BACKGROUND)

        sysfs.set_temp(zone, 85.0)  # SEVERE
        assert bg_rec.next() == ("unload", UnloadReason.THERMAL)
        # The background holder ignores it: revoked at the unload deadline.
        assert bg_rec.next() == ("complete", RequestStatus.REVOKED)

        dump = fg.dump()
        th = dump["thermal"]
        assert th["status"] == "SEVERE"
        assert [s["name"] for s in th["sensors"]] == ["thermal_zone0/soc"]
        assert th["history"][-1]["cause"] == "sensor thermal_zone0/soc at 85.0 C"
        story = [d["what"] for d in fg.story(bg.uid, 2)]
        assert "asked to unload" in story and "revoked" in story

        assert npu(["thermal", "status", "--runtime-dir", str(runtime_dir)]) == 0
        out = capsys.readouterr().out
        assert "SEVERE" in out and "thermal_zone0/soc" in out

        # New background requests wait while hot; cooling lets them in.
        req3 = ModelLoadRequest(id=3, priority=ModelPriority.BACKGROUND)
        rec3 = Recorder()
        bg.request_can_load_model(req3, rec3)
        assert rec3.next() == ("can_load", LoadStatus.NOT_PRIORITIZED)
        sysfs.set_temp(zone, 79.0)  # within hysteresis of SEVERE: still waits
        sysfs.set_temp(zone, 45.0)
        assert rec3.next() == ("can_load", LoadStatus.CAN_LOAD_NOW)

        # The foreground model was never asked to leave.
        assert fg_rec.quiet()
        fg_rec.listener.notify_model_unloaded(fg_req)
        assert fg_rec.next() == ("complete", RequestStatus.COMPLETE)
    # The logs say why, too.
    assert "thermal status NONE -> SEVERE (sensor thermal_zone0/soc at 85.0 C)" in npud.output


def test_override_and_reset_through_npud(
    runtime_dir: Path, sysfs: FakeSysfs, capsys: pytest.CaptureFixture[str]
) -> None:
    sysfs.add_zone("soc", 40.0)
    config = {
        "policy": {"name": "STATUS_QUO"},
        "thermal": {"sources": ["sysfs"], "sysfs_root": str(sysfs.root), "poll_interval_s": 0.05},
    }
    with DaemonProcess(runtime_dir, config=config), NpuManager(runtime_dir) as mgr:
        if not mgr.admin:
            pytest.skip("override needs an admin caller")
        _, rec = load(mgr, 1, ModelPriority.OPPORTUNISTIC)
        info = mgr.override_thermal_status(ThermalStatus.CRITICAL)
        assert info.status == ThermalStatus.CRITICAL and info.overridden
        assert rec.next() == ("unload", UnloadReason.THERMAL)
        rt = ["--runtime-dir", str(runtime_dir)]
        assert npu(["thermal", "status", "--json", *rt]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["status"] == "CRITICAL" and shown["overridden"] is True
        assert shown["computed_status"] == "NONE"
        assert npu(["thermal", "reset", *rt]) == 0
        capsys.readouterr()
        assert mgr.thermal_status().status == ThermalStatus.NONE
        assert npu(["thermal", "override", "Emergency", *rt]) == 0
        assert mgr.thermal_status().status == ThermalStatus.EMERGENCY
        assert npu(["thermal", "override", "5", *rt]) == 0
        mgr.reset_thermal_status()
