"""``background_slice_us`` (hal/sched_slice.py): the host's lowered background threads and
its compile child get the slice before they are lowered (a SCHED_IDLE thread's cannot be
set), observed on the real kernel; foreground workers and the defaults keep the kernel's."""

from __future__ import annotations

import os

import pytest

from npumanager.config import Config
from npumanager.drivers.bg_threads import background_pool
from npumanager.drivers.compile_worker import CompileWorker
from npumanager.drivers.steps import StepRunner
from npumanager.hal import sched_slice as ss
from npumanager.hal.host_config import HostConfig
from npumanager.testing.onnx_models import matmul_model
from tests.drivers.test_background_lower import Probe, step

DEFAULT = ss.slice_ns()
pytestmark = pytest.mark.skipif(not DEFAULT, reason="no per-task EEVDF slice (Linux < 6.12)")


def test_the_config_key_reaches_the_host_config() -> None:
    cfg = Config.load(None, {"driver": [{"name": "ref", "plugin": "reference",
                                         "background_slice_us": 8000}]})
    assert HostConfig.from_config(cfg, "ref").background_slice_us == 8000
    assert HostConfig.from_config(Config.load(None, {}), "reference").background_slice_us == 0


@pytest.mark.parametrize("us", [0, 8000])
def test_step_workers_and_load_threads_keep_a_slice_set_before_lowering(us: int) -> None:
    runner = StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20,
                        background_sched="idle", background_nice=10, background_slice_us=us)
    loads = background_pool(1, "npu-t-bgcompile", "idle", 10, slice_us=us)
    want = us * 1000 if us else DEFAULT
    try:
        probe = Probe()
        assert step(runner, probe)[0] is None
        tid = probe.tids[0]
        assert os.sched_getscheduler(tid) == os.SCHED_IDLE
        assert ss.slice_ns(tid) == want
        assert loads.submit(lambda: (os.sched_getscheduler(0), ss.slice_ns())).result(10) \
            == (os.SCHED_IDLE, want)
        fg = Probe()
        assert step(runner, fg, background=False)[0] is None
        assert ss.slice_ns(fg.tids[0]) == DEFAULT  # a foreground worker: the kernel's
    finally:
        runner.close()
        loads.shutdown()


def test_the_compile_childs_threads_get_the_slice() -> None:
    worker = CompileWorker("slice-test", "idle", 10, slice_us=6000)
    try:
        worker.compile(matmul_model(dim=64, depth=2), level=1, threads=1, n_model=1,
                       n_data=1, max_bytes=1 << 30)
        pid = worker.pid
        assert pid is not None
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        got = {(os.sched_getscheduler(t), ss.slice_ns(t)) for t in tids}
        assert got == {(os.SCHED_IDLE, 6_000_000)}
    finally:
        worker.close()
