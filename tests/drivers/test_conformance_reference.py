"""The reference driver passes the public HAL conformance suite (VTS analog)."""

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


def reference_target(rt: Path, st: Path) -> ConformanceTarget:
    return ConformanceTarget(
        name="reference", runtime_dir=rt, state_dir=st,
        model=add_model(4), inputs={"x": np.ones((1, 4), np.float32)},
        step_model=step_model(4, work_dim=160, work_depth=2),
        step_inputs={"state": np.zeros((1, 4), np.float32)},
        step_feedback={"state_out": "state"},
        plugin="reference",
    )


@pytest.fixture(scope="module")
def conformance_target() -> Iterator[ConformanceTarget]:
    rt = Path(tempfile.mkdtemp(prefix="npu-rt-", dir="/tmp"))
    st = Path(tempfile.mkdtemp(prefix="npu-st-", dir="/tmp"))
    try:
        with running_driver("reference", rt, st):
            yield reference_target(rt, st)
    finally:
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(st, ignore_errors=True)


class TestReferenceConformance(HalConformance):
    """All checks against one reference driver process."""
