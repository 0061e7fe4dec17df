"""A job's priority reaches OpenVINO at run time, under a real npud.

OpenVINO's priority knobs are compile-time properties (the CPU's compiled models refuse
every ``set_property``), so the driver runs each step on a variant of the model
compiled with its band's knobs (drivers/openvino.py: OvModel.begin_step). What reaches
this machine's CPU: the background variant's stream threads are created on the host's
lowered background thread and inherit its nice value (10); ``SCHEDULING_CORE_TYPE``
ECORE_ONLY reads back ANY_CORE here (no hybrid cores), ``ENABLE_CPU_PINNING`` False
holds. ``MODEL_PRIORITY``/``WORKLOAD_TYPE`` exist on GPU/NPU only: not run here.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import LoadStatus, ModelLoadRequest, ModelLoadRequestCallback, NpuManager, nn
from npumanager.hal import SchedulingConfig, connect_scheduling
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model
from npumanager.wire.client import SyncRpcClient
from tests.drivers.backends import needs_openvino

pytestmark = [needs_openvino, pytest.mark.slow]


@pytest.fixture
def npud(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    cfg = {"driver": [{"name": "openvino", "plugin": "openvino", "channels": 2,
                       "background_sched": "nice", "background_nice": 10,
                       "options": {"devices": ["CPU"]}}]}
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=90) as d:
        yield d


class Granted(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.listener: Any = None
        self.done = threading.Event()

    def on_can_load_model(self, request: Any, status: LoadStatus, listener: Any) -> None:
        if status == LoadStatus.CAN_LOAD_NOW:
            self.listener = listener
            self.done.set()


def _backend(runtime_dir: Path) -> dict[str, Any]:
    rpc = SyncRpcClient(str(driver_socket("openvino", runtime_dir)), SERVICE)
    try:
        payload, _ = rpc.call("device.stats", Empty())
        return dict(json.loads(payload)["backend"])
    finally:
        rpc.close()


def test_each_steps_band_runs_on_a_variant_with_its_knobs(
        npud: DaemonProcess, runtime_dir: Path) -> None:
    x = np.ones((1, 4), np.float32)
    # This uid is a foreground app (100) in the driver's table (as an admin sets it).
    with connect_scheduling("openvino", runtime_dir) as hal:
        hal.update_scheduling_configs([SchedulingConfig(os.getuid(), 100)])
    with NpuManager.connect(runtime_dir) as mgr:
        ans = Granted()
        mgr.request_can_load_model(ModelLoadRequest(1), ans)
        assert ans.done.wait(10)
        with nn.device("openvino", runtime_dir) as dev:
            model = dev.prepare_model(add_model(), grant=ans.listener)
            # Job priority 0: the foreground app's own work (HIGH band); 500 makes the
            # job BACKGROUND (effective 600 > 200): the LOW band.
            np.testing.assert_array_equal(model.execute({"x": x})["y"], x + 1)
            np.testing.assert_array_equal(model.execute({"x": x}, job_priority=500)["y"],
                                          x + 1)
            np.testing.assert_array_equal(model.execute({"x": x}, job_priority=500)["y"],
                                          x + 1)
            [state] = _backend(runtime_dir).values()
            model.release()
    assert state["prepared_as"] == "MEDIUM"
    assert state["steps"] == {"HIGH": 1, "LOW": 2}
    fg, bg = state["variants"]
    # The prepared variant served the foreground step: no knobs on the CPU, made on a
    # normal thread.
    assert (fg["bands"], fg["background"], fg["config"], fg["compiled_on_nice"]) == \
        (["HIGH"], False, {}, 0)
    # The background variant: made for the first LOW step, on the lowered thread.
    assert (bg["bands"], bg["background"]) == (["LOW"], True)
    assert bg["config"] == {"SCHEDULING_CORE_TYPE": "ECORE_ONLY",
                            "ENABLE_CPU_PINNING": "False"}
    assert bg["read_back"]["ENABLE_CPU_PINNING"] == "False"
    assert bg["read_back"]["SCHEDULING_CORE_TYPE"] in ("SchedulingCoreType.ANY_CORE",
                                                       "SchedulingCoreType.ECORE_ONLY")
    assert bg["compiled_on_nice"] == 10


def test_a_model_from_the_cache_makes_its_variants_from_the_verified_blob() -> None:
    """In process: an imported model's own export is no blob OpenVINO can import again;
    its variants come from the blob it was imported from, and compute the same."""
    from npumanager.drivers.base import CompileOptions
    from npumanager.drivers.openvino import OpenVinoDriver, job_band
    from npumanager.testing.backend_models import conv_net_onnx

    assert [job_band(p, bg) for p, bg in ((100, False), (125, False), (126, False),
                                          (-1, False), (100, True))] == [110, 110, 100,
                                                                          100, 90]
    conv = conv_net_onnx(seed=3)
    drv = OpenVinoDriver({"devices": ["CPU"]})
    try:
        blobs, _ = drv.compile(conv.data, CompileOptions()).artifacts()
        model = drv.load_artifacts(blobs, [], CompileOptions(priority=110))
        model.begin_step(600, True)
        assert conv.matches(model.run(conv.inputs))
        model.begin_step(100, False)
        assert conv.matches(model.run(conv.inputs))
        state = model.backend_state()
        assert state["prepared_as"] == "HIGH" and state["steps"] == {"LOW": 1, "HIGH": 1}
        assert [v["bands"] for v in state["variants"]] == [["HIGH"], ["LOW"]]
        model.release()
    finally:
        drv.close()
