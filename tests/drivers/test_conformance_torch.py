"""The torch (AOTInductor) driver passes the public HAL conformance suite (cpu here)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from npumanager.service.driver_launch import driver_user
from npumanager.testing.conformance import ConformanceTarget, HalConformance
from npumanager.testing.driver_host import running_driver
from tests.drivers.backends import inductor_dir, needs_torch

pytestmark = [needs_torch, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def conformance_target() -> Iterator[ConformanceTarget]:
    from npumanager.testing.backend_models import torch_add_program, torch_step_program

    rt = Path(tempfile.mkdtemp(prefix="npu-rt-", dir="/tmp"))
    st = Path(tempfile.mkdtemp(prefix="npu-st-", dir="/tmp"))
    options = {"inductor_cache_dir": str(inductor_dir())}
    user = driver_user("")  # whom npud's supervisor starts the host as
    config = st / "npud.toml"
    config.write_text(f'[[driver]]\nname = "torch"\nplugin = "torch"\n'
                      f'[driver.options]\ninductor_cache_dir = "{options["inductor_cache_dir"]}"\n')
    target = ConformanceTarget(
        name="torch", runtime_dir=rt, state_dir=st,
        model=torch_add_program(4), inputs={"x": np.ones((1, 4), np.float32)},
        step_model=torch_step_program(4, work_dim=160, work_depth=2),
        step_inputs={"state": np.zeros((1, 4), np.float32)},
        step_feedback={"state_out": "state"},
        plugin="torch", options=options,
        supervised_options={"inductor_cache_dir": str(inductor_dir(user.uid, user.gid))},
    )
    try:
        with running_driver("torch", rt, st, config=config, timeout=120):
            yield target
    finally:
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(st, ignore_errors=True)


class TestTorchConformance(HalConformance):
    """All checks against one torch driver process on cpu."""
