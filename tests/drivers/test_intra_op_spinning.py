"""The reference driver's ``intra_op_spinning`` options: whether a session's intra-op pool
spins for work (ONNX Runtime's default) or blocks, per execution class, on every path that
builds a session (compile, compile with artifacts, a cache entry's load, JIT). Real ONNX
Runtime: the options are read back from the session it built, and the pool's threads
are listed from /proc."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

from npumanager.demo.models import mlp_model
from npumanager.drivers.base import CompileOptions
from npumanager.drivers.option_specs import option_problems
from npumanager.drivers.reference import OrtModel, ReferenceDriver

SPIN = "session.intra_op.allow_spinning"
BG, FG = CompileOptions(background=True), CompileOptions()
OPTIONS = {"intra_op_threads_background": 2, "intra_op_spinning_background": 0}


def onnx() -> bytes:
    return mlp_model("spin", 64, 3, 4, seed=3).onnx


def spinning(model: Any) -> str:
    """The session's spinning entry as ONNX Runtime holds it ("default": never set)."""
    assert isinstance(model, OrtModel)
    so = model.session.get_session_options()
    try:
        return str(so.get_session_config_entry(SPIN))
    except RuntimeError:  # no such entry: ONNX Runtime's default, spinning
        return "default"


def threads(model: Any) -> int:
    assert isinstance(model, OrtModel)
    return int(model.session.get_session_options().intra_op_num_threads)


def test_background_sessions_block_foreground_ones_keep_the_default() -> None:
    driver = ReferenceDriver(OPTIONS)
    bg, fg = driver.compile(onnx(), BG), driver.compile(onnx(), FG)
    assert (spinning(bg), threads(bg)) == ("0", 2)
    assert (spinning(fg), threads(fg)) == ("default", 1)
    # The per-class keys override the driver-wide one.
    both = ReferenceDriver({"intra_op_spinning": 0, "intra_op_spinning_foreground": 1})
    assert spinning(both.compile(onnx(), BG)) == "0"
    assert spinning(both.compile(onnx(), FG)) == "default"
    assert spinning(ReferenceDriver().compile(onnx(), BG)) == "default"


def test_every_path_that_builds_a_session_passes_it_on() -> None:
    driver = ReferenceDriver(OPTIONS)
    made = driver.compile_with_artifacts(onnx(), BG)
    assert (spinning(made), threads(made)) == ("0", 2)
    blobs = made.artifacts()
    loaded = driver.load_artifacts(*blobs, BG)
    assert (spinning(loaded), threads(loaded)) == ("0", 2)
    assert spinning(driver.load_artifacts(*blobs, FG)) == "default"
    jit = ReferenceDriver({**OPTIONS, "compile_mode": "jit"}).compile(onnx(), BG)
    x = np.ones((4, 64), np.float32)
    assert np.isfinite(jit.run({"x": x})["y"]).all()  # (compiled at its first run)
    assert spinning(jit._inner) == "0"  # type: ignore[attr-defined]


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_the_pools_threads_inherit_sched_idle_from_the_lowered_thread_that_builds() -> None:
    """The session built on a SCHED_IDLE thread (as the host's lowered loading thread
    does): every thread ONNX Runtime adds for its pool runs at SCHED_IDLE too."""
    def tids() -> set[int]:
        return {int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")}

    driver = ReferenceDriver({**OPTIONS, "intra_op_threads_background": 3})
    before = tids()
    box: dict[str, Any] = {}

    def build() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        box["model"] = driver.compile(onnx(), BG)

    t = threading.Thread(target=build)
    t.start()
    t.join()
    added = tids() - before
    assert len(added) >= 2  # a pool of three: two threads beside the caller's
    assert {os.sched_getscheduler(tid) for tid in added} == {os.SCHED_IDLE}
    out = box["model"].run({"x": np.ones((4, 64), np.float32)})
    assert out["y"].shape == (4, 64)


def test_check_config_refuses_a_value_other_than_0_or_1() -> None:
    assert list(option_problems("reference", {"intra_op_spinning_background": 0})) == []
    assert list(option_problems("reference", {"intra_op_spinning": 2})) == [
        "intra_op_spinning = 2 must be at most 1"]
    assert list(option_problems("reference", {"intra_op_spinning_foreground": True})) == [
        "intra_op_spinning_foreground = True must be an integer"]
