"""ModelHolder (the part of a Ray actor that needs no Ray) against a real npud and driver."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from npumanager import NpuManager
from npumanager.constants import Importance, ModelSize
from npumanager.errors import DeviceUnavailable
from npumanager.ray.holder import HolderConfig, ModelHolder
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model
from tests.ray.conftest import FG_UID, ForegroundApp, needs_root, npud_config

pytestmark = [pytest.mark.slow, needs_root]

X = np.zeros((1, 4), np.float32)


@pytest.fixture
def npud(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, npud_config(), drivers=True, env=env,
                       ready_timeout=60) as d:
        with NpuManager(runtime_dir) as admin:
            admin.set_uid_importance(FG_UID, Importance.FOREGROUND)
        yield d


def holder(rt: Path, **kw: object) -> tuple[ModelHolder, list[str]]:
    left: list[str] = []
    cfg = HolderConfig(model=add_model(4, bias=2.0), size=ModelSize.GREATER_THAN_2G,
                       **kw)  # type: ignore[arg-type]
    return ModelHolder(cfg, rt, node="test", on_leave=left.append), left


def kinds(h: ModelHolder) -> list[str]:
    return [e["event"] for e in h.status()["events"]]


def test_wait_mode_gives_way_to_a_foreground_app_then_serves_again(
        npud: DaemonProcess, runtime_dir: Path) -> None:
    h, left = holder(runtime_dir, on_unload="wait", call_wait_s=0.2)
    try:
        assert h.start()
        assert h.execute({"x": X})["y"].tolist() == [[2.0] * 4]
        app = ForegroundApp(runtime_dir)
        try:
            loaded = app.wait_for("loaded")  # granted once the holder gave its model back
            assert [e["status"] for e in app.events if e["event"] == "status"] == [
                "WAIT_FOR_UNLOAD", "CAN_LOAD_NOW"]
            assert loaded["y"] == [[2.0] * 4]  # ones + 1
            assert h.wait_state({"waiting"}, 10)  # it asked again after its release
            with pytest.raises(DeviceUnavailable, match="not loaded"):
                h.execute({"x": X})
            app.release()
        finally:
            app.kill()
        assert h.wait_ready(20)
        assert h.execute({"x": X})["y"].tolist() == [[2.0] * 4]
        ev = kinds(h)
        assert ev.index("unload_requested") < ev.index("released") < ev.index("requested", 2)
        assert [e["reason"] for e in h.events if e["event"] == "unload_requested"] == [
            "PREEMPTED"]
        assert h.grants == 2 and left == []
    finally:
        h.close()


def test_restart_mode_leaves_after_releasing(npud: DaemonProcess, runtime_dir: Path) -> None:
    h, left = holder(runtime_dir, on_unload="restart")
    try:
        assert h.start()
        app = ForegroundApp(runtime_dir)
        try:
            app.wait_for("loaded")
            app.release()
        finally:
            app.kill()
        h._worker.join(10)  # on_leave runs last, on the holder's worker thread
        assert h.state == "left" and left == ["unload requested (PREEMPTED)"]
        assert kinds(h)[-2:] == ["released", "leaving"]
    finally:
        h.close()


def test_restart_mode_leaves_a_node_that_grants_nothing_in_time(
        npud: DaemonProcess, runtime_dir: Path) -> None:
    app = ForegroundApp(runtime_dir)
    try:
        app.wait_for("loaded")  # the foreground app holds the device; the holder does not fit
        h, left = holder(runtime_dir, on_unload="restart", grant_timeout_s=0.5)
        try:
            assert not h.start()
            h._worker.join(10)  # on_leave runs last, on the holder's worker thread
            assert left == ["no grant on this node within 0.5 s"]
        finally:
            h.close()
        app.release()
    finally:
        app.kill()


def test_node_resources_name_each_available_device(npud: DaemonProcess,
                                                   runtime_dir: Path) -> None:
    import json
    import subprocess
    import sys

    from npumanager.ray import node_resources

    assert node_resources(runtime_dir) == {"npu:reference": 1.0}
    assert node_resources(runtime_dir, slots={"reference": 3}) == {"npu:reference": 3.0}
    assert node_resources(runtime_dir, slots=0) == {}
    out = subprocess.run([sys.executable, "-m", "npumanager.ray", "resources", "--runtime-dir",
                          str(runtime_dir), "--slots", "2"], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == {"npu:reference": 2.0}


def test_resources_without_npud_fail_with_one_line(runtime_dir: Path) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "npumanager.ray", "resources", "--runtime-dir",
                        str(runtime_dir)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("npumanager.ray: ServiceUnavailable")
