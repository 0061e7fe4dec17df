"""End to end with the reference driver's own thermal model as the only source.

Real work heats the driver (first-order model, short time constant); npud reads it
through the supervisor, the background model is asked to leave with THERMAL, the
foreground model keeps executing, and idling cools the device back to NONE.
"""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import nn
from npumanager.client import ModelLoadRequest, ModelLoadRequestCallback, NpuManager
from npumanager.constants import (
    Importance,
    LoadStatus,
    ModelPriority,
    ThermalStatus,
    UnloadReason,
)
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model

pytestmark = pytest.mark.slow

CONFIG: dict[str, Any] = {
    "policy": {"name": "STATUS_QUO"},
    "thermal": {
        "sources": ["driver"],
        "poll_interval_s": 0.05,
        # Just above the model's 35 C ambient, so a few executions reach SEVERE.
        "thresholds_c": {
            "light": 36.0,
            "moderate": 37.0,
            "severe": 38.0,
            "critical": 500.0,
            "emergency": 501.0,
            "shutdown": 502.0,
        },
        "hysteresis_c": 0.5,
    },
    "driver": [
        {
            "name": "reference",
            "channels": 1,
            "options": {"thermal_tau_s": 0.3, "ambient_c": 35.0, "max_c": 95.0},
        }
    ],
}


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


def _cooled(line: str) -> bool:
    """npud's line for a thermal status change down to LIGHT or NONE."""
    return "thermal status" in line and ("-> LIGHT" in line or "-> NONE" in line)


def test_driver_heat_unloads_background_and_cooling_lets_it_back(runtime_dir: Path,
                                                                  state_dir: Path) -> None:
    # Its own state dir: the driver host's default one (/var/lib/npu) is the machine's.
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with (
        DaemonProcess(runtime_dir, CONFIG, drivers=True, env=env) as npud,
        NpuManager(runtime_dir) as fg,
        NpuManager(runtime_dir) as bg,
    ):
        if os.getuid() != 0:  # root is FOREGROUND already; npud's own uid is admin
            fg.set_uid_importance(os.getuid(), Importance.FOREGROUND)
        fg_req, fg_rec = ModelLoadRequest(id=1), Recorder()
        fg.request_can_load_model(fg_req, fg_rec)
        assert fg_rec.events.get(timeout=10) == ("can_load", LoadStatus.CAN_LOAD_NOW)
        bg_req = ModelLoadRequest(id=2, priority=ModelPriority.BACKGROUND)
        bg_rec = Recorder()
        bg.request_can_load_model(bg_req, bg_rec)
        assert bg_rec.events.get(timeout=10) == ("can_load", LoadStatus.CAN_LOAD_NOW)

        with nn.device("reference", runtime_dir) as dev:
            model = dev.prepare_model(add_model(4), grant=fg_rec.listener)
            fg_rec.listener.notify_model_loaded(fg_req)
            bg_rec.listener.notify_model_loaded(bg_req)
            x = np.zeros((1, 4), dtype=np.float32)
            # Work until the heat makes npud ask the background model to leave.
            deadline = time.monotonic() + 15.0
            while bg_rec.events.empty():
                out = model.execute({"x": x})
                assert out["y"].tolist() == [[1.0, 1.0, 1.0, 1.0]]
                assert time.monotonic() < deadline, "the driver never got hot"
            assert bg_rec.events.get() == ("unload", UnloadReason.THERMAL)
            status = fg.thermal_status()
            assert status.status >= ThermalStatus.SEVERE
            cooled_lines = npud.count_output(_cooled)  # LIGHT and NONE on the way up
            assert status.details["sensors"][0]["name"] == "driver/reference"
            bg_rec.listener.notify_model_unloaded(bg_req)

            # The foreground model keeps running while hot.
            assert model.execute({"x": x})["y"].shape == (1, 4)
            assert fg_rec.events.empty()

            # A new background request waits; idling cools the model and lets it in.
            req3, rec3 = ModelLoadRequest(id=3, priority=ModelPriority.BACKGROUND), Recorder()
            bg.request_can_load_model(req3, rec3)
            got = [bg_rec.events.get(timeout=10)]  # the COMPLETE for request 2
            assert rec3.events.get(timeout=10) == ("can_load", LoadStatus.NOT_PRIORITIZED)
            assert rec3.events.get(timeout=15) == ("can_load", LoadStatus.CAN_LOAD_NOW)
            # npud logs each status change: wait for the one back down to LIGHT or NONE.
            assert npud.wait_for_output(_cooled, 15, count=cooled_lines + 1), "never cooled"
            assert fg.thermal_status().status <= ThermalStatus.LIGHT
            assert got[0][0] == "complete"
            model.release()
    assert "thermal status" in npud.output and "driver/reference" in npud.output
