"""The openvino driver passes the public HAL conformance suite (CPU here)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from npumanager.testing.conformance import ConformanceTarget, HalConformance
from npumanager.testing.driver_host import running_driver
from npumanager.testing.onnx_models import add_model, step_model
from tests.drivers.backends import needs_openvino

pytestmark = needs_openvino


@pytest.fixture(scope="module")
def conformance_target() -> Iterator[ConformanceTarget]:
    rt = Path(tempfile.mkdtemp(prefix="npu-rt-", dir="/tmp"))
    st = Path(tempfile.mkdtemp(prefix="npu-st-", dir="/tmp"))
    try:
        with running_driver("openvino", rt, st):
            yield ConformanceTarget(
                name="openvino", runtime_dir=rt, state_dir=st,
                model=add_model(4), inputs={"x": np.ones((1, 4), np.float32)},
                step_model=step_model(4, work_dim=160, work_depth=2),
                step_inputs={"state": np.zeros((1, 4), np.float32)},
                step_feedback={"state_out": "state"},
                plugin="openvino",
            )
    finally:
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(st, ignore_errors=True)


class TestOpenVinoConformance(HalConformance):
    """All checks against one openvino driver process on its first device."""
