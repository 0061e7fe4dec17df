"""Two devices under a real npud (two reference driver hosts): one budget each, a
request pinned to a device, a grant valid on its device only, and `npu status` showing
each device's budget."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelSize,
    NpuManager,
    nn,
)
from npumanager.errors import GrantRequired, InvalidArgument
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model

pytestmark = pytest.mark.slow

A, B = "ref-a", "ref-b"
BIG = ModelSize.GREATER_THAN_2G


@pytest.fixture
def npud(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    cfg = {
        "policy": {"name": "BUDGET", "max_budget": 4},
        "driver": [{"name": A, "plugin": "reference", "channels": 1, "grant_wait_s": 0.2},
                   {"name": B, "plugin": "reference", "channels": 1, "grant_wait_s": 0.2}],
    }
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60) as d:
        yield d


class Answers(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.statuses: list[LoadStatus] = []
        self.listener: Any = None
        self.changed = threading.Condition()

    def on_can_load_model(self, request: Any, status: LoadStatus, listener: Any) -> None:
        with self.changed:
            self.statuses.append(status)
            self.listener = listener
            self.changed.notify_all()

    def wait(self, status: LoadStatus) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: status in self.statuses, 10), self.statuses


def test_two_devices_two_budgets_and_a_grant_valid_on_its_device_only(
        npud: DaemonProcess, runtime_dir: Path) -> None:
    devs = nn.devices(runtime_dir)
    assert [(d.name, d.number) for d in devs] == [(A, 0), (B, 1)]
    for d in devs:
        d.close()
    with NpuManager.connect(runtime_dir) as mgr:
        on_a, on_b = Answers(), Answers()
        mgr.request_can_load_model(ModelLoadRequest(1, BIG), on_a)  # the first device
        mgr.request_can_load_model(ModelLoadRequest(2, BIG, device=B), on_b)
        on_a.wait(LoadStatus.CAN_LOAD_NOW)  # each fills its own device's budget of 4
        on_b.wait(LoadStatus.CAN_LOAD_NOW)
        with pytest.raises(InvalidArgument, match="ref-a, ref-b"):
            mgr.request_can_load_model(ModelLoadRequest(3, device="ref-c"), Answers())
        dump = mgr.dump()
        assert {b["device"]: b["used"] for b in dump["budgets"]} == {A: 4, B: 4}
        x = np.zeros((1, 4), np.float32)
        with nn.device(A, runtime_dir) as dev_a, nn.device(B, runtime_dir) as dev_b:
            with pytest.raises(GrantRequired):  # B's grant means nothing to A's driver
                dev_a.prepare_model(add_model(), grant=on_b.listener)
            model = dev_b.prepare_model(add_model(), grant=on_b.listener)
            np.testing.assert_array_equal(model.execute({"x": x})["y"], x + 1)
            model.release()
            model = dev_a.prepare_model(add_model(), grant=on_a.listener)
            np.testing.assert_array_equal(model.execute({"x": x})["y"], x + 1)
            model.release()
        status = subprocess.run(
            [sys.executable, "-m", "npumanager", "status", "--runtime-dir", str(runtime_dir)],
            capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert f"{A}: 4 of 4 used" in status.stdout, status.stdout
        assert f"{B}: 4 of 4 used" in status.stdout, status.stdout
