"""``background_ends`` (drivers/bg_ends.py) through a real driver host: a BACKGROUND burst
execution's steps end on the host's normal-priority ``npu-bgend`` thread ("thread", the
default) or on the lowered worker that ran them ("worker"); either way the job runs every
step, and the host has the thread only when it is asked for."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from npumanager import nn
from npumanager.testing.driver_host import running_driver
from npumanager.testing.onnx_models import add_model

pytestmark = pytest.mark.slow


def _threads(pid: int) -> dict[str, int]:
    """Kernel thread name -> scheduling policy, for every thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                out[f.read().strip()] = os.sched_getscheduler(int(tid))
        except (OSError, ProcessLookupError):
            continue
    return out


@pytest.mark.parametrize("where", ["thread", "worker"])
def test_background_burst_steps_end_where_the_config_says(
        runtime_dir: Path, state_dir: Path, tmp_path: Path, where: str) -> None:
    cfg = tmp_path / "npu.toml"
    cfg.write_text('[[driver]]\nname = "reference"\nplugin = "reference"\n'
                   f'background_sched = "idle"\nbackground_ends = "{where}"\n')
    x = {"x": np.zeros((1, 4), np.float32)}
    with running_driver("reference", runtime_dir, state_dir, config=cfg,
                        args=["--no-enforce-admission"]) as host:
        dev = nn.device("reference", runtime_dir)
        try:
            model = dev.prepare_model(add_model(4))
            with model.burst() as b:
                for steps in (1, 7, 30):
                    out = b.execute(x, job_priority=900, steps=steps, feedback={"y": "x"})
                    np.testing.assert_array_equal(out["y"], np.full((1, 4), steps, np.float32))
            threads = _threads(host.pid)
        finally:
            dev.close()
    # The steps ran on the lowered workers (a BACKGROUND job), and their ends were
    # submitted where the config said.
    assert threads.get("npu-bg_0") == os.SCHED_IDLE, threads
    if where == "thread":
        assert threads.get("npu-bgend") == os.SCHED_OTHER, threads
    else:
        assert "npu-bgend" not in threads, threads


def test_an_unknown_place_is_refused() -> None:
    from npumanager.drivers.bg_ends import StepEnds

    assert StepEnds.for_host("t", "worker", lambda *a: None) is None
    with pytest.raises(ValueError, match="background_ends"):
        StepEnds.for_host("t", "loop", lambda *a: None)
