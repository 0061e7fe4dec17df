"""The shell applies the execution class: background steps run on lowered threads,
foreground steps on normal ones (observed from inside the step, on the real kernel)."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

from npumanager.drivers.base import PreparedModel
from npumanager.drivers.bg_threads import background_pool, lower_this_thread
from npumanager.drivers.events import RunStep
from npumanager.drivers.steps import Execution, StepRunner


class PolicyProbe(PreparedModel):
    """Records the scheduling policy and nice value of the thread that runs it."""

    inputs: list[Any] = []
    outputs: list[Any] = []
    memory_bytes = 0

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tid = threading.get_native_id()
        self.seen.append((os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)))
        return {"y": np.zeros(1, np.float32)}

    def release(self) -> None:
        pass


def run_on(runner: StepRunner, background: bool) -> tuple[int, int]:
    probe = PolicyProbe()
    ex = Execution(1, probe, {"x": np.zeros(1, np.float32)}, {})
    done = threading.Event()
    runner.start(ex, RunStep(1, 0, True, False, background=background),
                 lambda error, us: done.set())
    assert done.wait(10)
    return probe.seen[0]


@pytest.mark.parametrize(("sched", "policy", "nice"), [
    ("idle", os.SCHED_IDLE, 0), ("nice", os.SCHED_OTHER, 7), ("normal", os.SCHED_OTHER, 0)])
def test_background_steps_run_on_lowered_threads(sched: str, policy: int, nice: int) -> None:
    runner = StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20, background_sched=sched,
                        background_nice=7)
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    try:
        assert run_on(runner, background=True) == (policy, base + nice)
        # Foreground steps keep normal threads, before and after.
        assert run_on(runner, background=False) == (os.SCHED_OTHER, base)
        assert run_on(runner, background=True) == (policy, base + nice)
    finally:
        runner.close()


def test_a_lowered_thread_leaves_its_process_alone() -> None:
    me = threading.get_native_id()
    got: list[int] = []

    def lowered() -> None:
        lower_this_thread("idle", 19)
        got.append(os.sched_getscheduler(threading.get_native_id()))

    t = threading.Thread(target=lowered)
    t.start()
    t.join()
    assert got == [os.SCHED_IDLE]
    assert os.sched_getscheduler(me) == os.SCHED_OTHER


def test_an_unknown_background_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="background_sched"):
        background_pool(1, "t", "realtime", 19)


def test_the_host_process_takes_the_shortest_switch_interval_its_devices_ask_for() -> None:
    import sys

    from npumanager.cli.driver import apply_switch_interval
    from npumanager.config import Config
    from npumanager.hal.host_config import HostConfig

    cfg = Config.load(None, {"driver": [{"name": "ref", "plugin": "reference",
                                         "switch_interval_us": 700}]})
    assert HostConfig.from_config(cfg, "ref").switch_interval_us == 700
    assert HostConfig.from_config(Config.load(None, {}), "reference").switch_interval_us == 0
    before = sys.getswitchinterval()
    try:
        apply_switch_interval([HostConfig("a", switch_interval_us=700),
                               HostConfig("b", switch_interval_us=500), HostConfig("c")])
        assert sys.getswitchinterval() == pytest.approx(500e-6)
        sys.setswitchinterval(before)
        apply_switch_interval([HostConfig("a"), HostConfig("b", switch_interval_us=-1)])
        assert sys.getswitchinterval() == before  # 0 or less: Python's own
    finally:
        sys.setswitchinterval(before)


def test_with_fair_share_yielding_background_steps_run_idle_the_others_niced() -> None:
    runner = StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20, background_sched="share",
                        background_nice=7)
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def policy(yields: bool) -> tuple[int, int]:
        probe = PolicyProbe()
        ex = Execution(1, probe, {"x": np.zeros(1, np.float32)}, {})
        done = threading.Event()
        runner.start(ex, RunStep(1, 0, True, False, background=True, yields=yields),
                     lambda error, us: done.set())
        assert done.wait(10)
        return probe.seen[0]

    try:
        assert policy(yields=False) == (os.SCHED_OTHER, base + 7)
        assert policy(yields=True)[0] == os.SCHED_IDLE
        assert run_on(runner, background=False) == (os.SCHED_OTHER, base)
    finally:
        runner.close()


class CpuProbe(PolicyProbe):
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.cpus = os.sched_getaffinity(threading.get_native_id())
        return {"y": np.zeros(1, np.float32)}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_spare_cpus_keep_background_steps_off_the_first_cpu() -> None:
    runner = StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20, background_sched="idle",
                        background_cpus="spare")
    mine = sorted(os.sched_getaffinity(0))
    try:
        for background, want in ((True, set(mine[1:])), (False, set(mine))):
            probe = CpuProbe()
            done = threading.Event()
            runner.start(Execution(1, probe, {"x": np.zeros(1, np.float32)}, {}),
                         RunStep(1, 0, True, False, background=background),
                         lambda error, us, done=done: done.set())
            assert done.wait(10)
            assert probe.cpus == want
    finally:
        runner.close()
    with pytest.raises(ValueError, match="background_cpus"):
        StepRunner("t", 1, inline_limit=1024, max_frame=1 << 20, background_cpus="some")


def test_the_new_driver_keys_reach_the_host_and_its_state() -> None:
    from npumanager.config import Config
    from npumanager.drivers.messages import params_from
    from npumanager.hal.host_config import HostConfig

    cfg = Config.load(None, {"driver": [{"name": "ref", "plugin": "reference",
                                         "quiet_window_us": 1500, "background_cpus": "spare",
                                         "background_sched": "share"}]})
    hc = HostConfig.from_config(cfg, "ref")
    assert (hc.quiet_window_us, hc.background_cpus) == (1500, "spare")
    p = params_from(hc)
    assert p.quiet_window_us == 1500 and p.background_share and p.background_threads
    d = HostConfig.from_config(Config.load(None, {}), "reference")
    assert not params_from(d).background_share
    # npud's default: a 1 ms quiet window (drivers/classes.py says why).
    assert d.quiet_window_us == HostConfig("x").quiet_window_us == 1000
    assert params_from(d).quiet_window_us == 1000
