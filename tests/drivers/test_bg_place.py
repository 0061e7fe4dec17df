"""Steered lanes (drivers/bg_place.py, ``background_cpus = "steer"``): the thread a lane's
step wakes is given, just before, every CPU but those the other background steps run on;
a step alone may run anywhere. The decision alone, then the shell on the real kernel."""

from __future__ import annotations

import os
import random
import threading

import numpy as np
import pytest

from npumanager.drivers.bg_place import steer
from npumanager.drivers.bg_threads import current_cpu, lane_cpus
from npumanager.drivers.events import RunStep
from npumanager.drivers.steps import Execution, StepRunner

from .test_exec_class_shell import PolicyProbe


def test_a_step_alone_may_run_anywhere_and_one_beside_another_avoids_its_cpu() -> None:
    cpus = [0, 1]
    assert steer(cpus, {}, 0) == {0, 1}
    assert steer(cpus, {1: 0}, 0) == {1}  # lane 1's step runs on CPU 0
    assert steer(cpus, {0: 1}, 1) == {0}
    assert steer(cpus, {0: 1}, 0) == {0, 1}  # (its own last CPU does not count)
    # Every CPU taken (more steps than CPUs, or a CPU the host may not use): all of them.
    assert steer(cpus, {1: 0, 2: 1}, 0) == {0, 1}
    assert steer([2, 3, 5], {1: 7}, 0) == {2, 3, 5}
    assert steer([2, 3, 5], {1: 3, 2: 5}, 0) == {2}


@pytest.mark.parametrize("seed", range(6))
def test_random_mixes_never_steer_onto_another_lanes_cpu_while_one_is_free(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        allowed = rng.sample(range(8), rng.randint(1, 8))
        lanes = rng.randint(1, 6)
        lane = rng.randrange(lanes)
        running = {k: rng.randrange(10) for k in range(lanes) if rng.random() < 0.5}
        got = steer(allowed, running, lane)
        others = {cpu for k, cpu in running.items() if k != lane}
        assert got and got <= set(allowed)
        if set(allowed) - others:
            assert got == set(allowed) - others
        else:
            assert got == set(allowed)


class Holder(PolicyProbe):
    """A step that records where it runs and, if told to, waits until released."""

    def __init__(self, hold: bool = False) -> None:
        super().__init__()
        self.hold = hold
        self.entered = threading.Event()
        self.release = threading.Event()
        self.cpu: int | None = None

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tid = threading.get_native_id()
        self.cpus = os.sched_getaffinity(tid)
        self.policy = os.sched_getscheduler(tid)
        self.thread = tid
        self.cpu = current_cpu()
        self.entered.set()
        if self.hold:
            assert self.release.wait(60)
        return {"y": np.zeros(1, np.float32)}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_lanes_thread_is_steered_off_the_cpu_of_the_step_beside_it() -> None:
    runner = StepRunner("t", 3, inline_limit=1024, max_frame=1 << 20, background_sched="idle",
                        background_cpus="steer")
    cpus = set(lane_cpus())

    def start(lane: int, probe: Holder) -> threading.Event:
        done = threading.Event()
        runner.start(Execution(1, probe, {"x": np.zeros(1, np.float32)}, {}),
                     RunStep(1, 0, True, False, background=True, lane=lane),
                     lambda error, us: done.set())
        return done

    try:
        # Each lane's first step: its thread starts with every CPU (no pin, unlike "lanes").
        for lane in (0, 1):
            first = Holder()
            assert start(lane, first).wait(60)
            assert first.cpus == cpus and first.policy == os.SCHED_IDLE
        # Lane 0's step runs (and stays); lane 1's next step is steered off its CPU.
        held = Holder(hold=True)
        held_done = start(0, held)
        assert held.entered.wait(60)
        at = runner._lane_cpu[0]  # where lane 0's step started (it sleeps there now)
        beside = Holder()
        assert start(1, beside).wait(60)
        assert beside.cpus == cpus - {at} and beside.cpu != at
        held.release.set()
        assert held_done.wait(60)
        # Alone again: lane 1's next step may run anywhere.
        alone = Holder()
        assert start(1, alone).wait(60)
        assert alone.cpus == cpus and alone.thread == beside.thread
    finally:
        runner.close()


def test_the_steer_key_reaches_the_state() -> None:
    from npumanager.config import Config
    from npumanager.drivers.messages import params_from
    from npumanager.hal.host_config import HostConfig

    cfg = Config.load(None, {"driver": [{"name": "ref", "plugin": "reference",
                                         "background_cpus": "steer"}]})
    p = params_from(HostConfig.from_config(cfg, "ref"))
    assert p.background_lanes == len(lane_cpus())
