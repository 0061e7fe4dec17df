"""``background_lower`` (drivers/lowering.py): a background step worker lowered for good
("thread") or only around the backend's run ("run"), observed on the real kernel from
inside the run, from the step's begin hook (before the run, on the same thread) and from
the step's end (the worker's policy read by its tid once the step ended)."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

from npumanager.drivers import lowering
from npumanager.drivers.base import PreparedModel
from npumanager.drivers.bg_threads import background_pool
from npumanager.drivers.events import RunStep
from npumanager.drivers.steps import Execution, StepRunner


def policy() -> tuple[int, int]:
    tid = threading.get_native_id()
    return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)


class Probe(PreparedModel):
    """Records the calling thread's policy and nice value before its run and in it."""

    inputs: list[Any] = []
    outputs: list[Any] = []
    memory_bytes = 0

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.before: list[tuple[int, int]] = []
        self.inside: list[tuple[int, int]] = []
        self.tids: list[int] = []

    def begin_step(self, effective_priority: int, background: bool) -> None:
        self.before.append(policy())

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.inside.append(policy())
        self.tids.append(threading.get_native_id())
        if self.fail:
            raise RuntimeError("the backend failed")
        return {"y": np.zeros(1, np.float32)}

    def release(self) -> None:
        pass


def policy_of(tid: int) -> tuple[int, int]:
    return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)


def step(runner: StepRunner, probe: Probe, background: bool = True
         ) -> tuple[str | None, tuple[int, int]]:
    """One step; its error, and the policy of the thread that ran it once it ended."""
    ex = Execution(1, probe, {"x": np.zeros(1, np.float32)}, {})
    done = threading.Event()
    errors: list[str | None] = []

    def ended(error: str | None, us: float) -> None:
        errors.append(error)
        done.set()

    runner.start(ex, RunStep(1, 0, True, False, background=background), ended)
    assert done.wait(10)
    return errors[0], policy_of(probe.tids[0])


BASE = policy()


@pytest.mark.parametrize(("sched", "lowered"), [("idle", (os.SCHED_IDLE, BASE[1])),
                                                ("nice", (os.SCHED_OTHER, BASE[1] + 7))])
def test_run_lowers_the_worker_only_around_the_run(sched: str, lowered: tuple[int, int]
                                                   ) -> None:
    runner = StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20, background_sched=sched,
                        background_nice=7, background_lower="run")
    try:
        for fail in (False, True, False):  # a failed run is raised back too
            probe = Probe(fail)
            error, after = step(runner, probe)
            assert (error is not None) == fail
            assert probe.before == [BASE]  # normal while it runs Python before the run
            assert probe.inside == [lowered]
            assert after == BASE  # and after it
            assert policy() == BASE  # (the caller's thread untouched)
        fg = Probe()
        assert step(runner, fg, background=False)[1] == BASE
        assert fg.inside == [BASE]  # foreground steps are never lowered
    finally:
        runner.close()


def test_thread_keeps_the_worker_lowered_throughout() -> None:
    runner = StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20, background_sched="idle",
                        background_lower="thread")
    try:
        probe = Probe()
        _error, after = step(runner, probe)
        low = (os.SCHED_IDLE, BASE[1])
        assert probe.before == probe.inside == [low] and after == low
    finally:
        runner.close()


def test_normal_background_threads_are_never_lowered() -> None:
    runner = StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20,
                        background_sched="normal", background_lower="run")
    try:
        probe = Probe()
        assert step(runner, probe)[1] == BASE and probe.inside == [BASE]
    finally:
        runner.close()


def test_native_lowers_an_armed_thread_and_nothing_else() -> None:
    got: list[Any] = []

    def armed() -> None:
        got.append(lowering.arm_this_thread("idle", 19))
        got.append(policy())
        with lowering.native():
            got.append(policy())
        got.append(policy())

    def plain() -> None:
        with lowering.native():
            got.append(policy())

    for target in (armed, plain):
        t = threading.Thread(target=target)
        t.start()
        t.join()
    assert got == [True, BASE, (os.SCHED_IDLE, BASE[1]), BASE, BASE]
    assert lowering.current() is None  # (armed per thread: not this one)


def test_a_thread_that_may_not_return_is_lowered_for_good(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Where the kernel refuses the way back (RLIMIT_NICE: tests/security has the real
    uid case), the worker is lowered from its start, as with "thread"."""
    real = os.sched_setscheduler

    def no_way_back(tid: int, pol: int, param: Any) -> None:
        if pol == os.SCHED_OTHER:
            raise PermissionError(1, "Operation not permitted")
        real(tid, pol, param)

    monkeypatch.setattr(os, "sched_setscheduler", no_way_back)
    runner = StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20, background_sched="idle",
                        background_lower="run")
    try:
        probe = Probe()
        _error, after = step(runner, probe)
        low = (os.SCHED_IDLE, BASE[1])
        assert probe.before == probe.inside == [low] and after == low
    finally:
        runner.close()


def test_an_unknown_lowering_is_refused() -> None:
    with pytest.raises(ValueError, match="background_lower"):
        background_pool(1, "t", "idle", 19, lower="step")
    with pytest.raises(ValueError, match="background_lower"):
        StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20, background_sched="idle",
                    background_lower="always")


def test_the_key_reaches_the_host_config() -> None:
    from npumanager.config import Config
    from npumanager.hal.host_config import HostConfig

    cfg = Config.load(None, {"driver": [{"name": "ref", "plugin": "reference",
                                         "background_lower": "run"}]})
    assert HostConfig.from_config(cfg, "ref").background_lower == "run"
    assert HostConfig.from_config(Config.load(None, {}), "reference").background_lower == \
        HostConfig("x").background_lower


@pytest.mark.parametrize("lower", ["run", "thread"])
def test_a_background_session_build_is_lowered_as_the_key_says(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, lower: str) -> None:
    """The host's thread that builds a BACKGROUND model's session from the compile child's
    artifacts (real child, real ONNX Runtime): with "run" at normal priority but for the
    session build itself; with "thread" lowered throughout. (nice, not SCHED_IDLE: an idle
    child may starve while the suite keeps both cores busy.)"""
    import onnxruntime as ort

    from npumanager.drivers.prepare import Preparer
    from npumanager.drivers.reference import ReferenceDriver
    from npumanager.hal.host_config import HostConfig
    from tests.drivers.test_compile_worker import in_process, mlp, prepare

    builds: list[tuple[int, int]] = []
    real = ort.InferenceSession

    def watched(*a: Any, **k: Any) -> Any:  # the real session, its thread's policy noted
        builds.append(policy())
        return real(*a, **k)

    monkeypatch.setattr(ort, "InferenceSession", watched)
    entered: list[tuple[int, int]] = []

    class Watched(ReferenceDriver):
        def compile_in_worker(self, *a: Any) -> PreparedModel | None:
            entered.append(policy())
            return super().compile_in_worker(*a)

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    driver = Watched({})
    hc = HostConfig("reference", background_sched="nice", background_nice=9,
                    background_lower=lower)
    p = Preparer(hc, driver, driver.get_number_of_cache_files_needed(), state)
    try:
        onnx = mlp()
        got = prepare(p, onnx)
        x = np.ones((2, 64), np.float32)
        np.testing.assert_allclose(got.model.run({"x": x})["y"], in_process(onnx, x),
                                   rtol=1e-5, atol=1e-6)
    finally:
        p.close()
    low = (os.SCHED_OTHER, BASE[1] + 9)
    assert builds[0] == low  # the session built lowered either way
    assert entered == [BASE if lower == "run" else low]
