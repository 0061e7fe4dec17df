"""Background lanes (drivers/runqueue.py, ``background_cpus = "lanes"``): background steps
running at once get lanes of their own, so the shell never puts two of them on one CPU
(two SCHED_IDLE threads on one CPU: the waking one waits for the scheduler's tick).
On the driver state's virtual clock, then the shell on the real kernel."""

from __future__ import annotations

import os
import random
import threading

import numpy as np
import pytest

from npumanager.drivers import events as ev
from npumanager.drivers.bg_threads import lane_cpus
from npumanager.drivers.events import RunStep
from npumanager.drivers.steps import Execution, StepRunner

from .state_harness import Harness
from .test_exec_class_shell import PolicyProbe


def step_of(out: list[ev.Instruction], ticket: int) -> ev.RunStep:
    steps = [i for i in out if isinstance(i, ev.RunStep) and i.ticket == ticket]
    assert len(steps) == 1, out
    return steps[0]


@pytest.mark.parametrize("lanes", [2, 0], ids=["lanes", "off"])
def test_an_llm_and_an_embedder_run_in_lanes_of_their_own(lanes: int) -> None:
    h = Harness(channels=3, reserved_channels=1, background_lanes=lanes)
    h.priorities(u1=100, u2=300, u3=300)  # a camera; an LLM and an embedder, equal
    cam, llm, emb = h.prepare(1), h.prepare(2), h.prepare(3)
    llm_ticket, out = h.execute(2, llm, steps=1000)
    llm_lanes = [step_of(out, llm_ticket).lane]
    emb_lanes, cam_lanes = [], []
    for i in range(30):
        ticket, out = h.execute(3, emb)  # a batch while the LLM's step runs
        emb_lanes.append(step_of(out, ticket).lane)
        if i % 10 == 0:
            frame, out = h.execute(1, cam)  # foreground: no lane
            cam_lanes.append(step_of(out, frame).lane)
            h.advance(0.0004)
            h.step_done(frame, run_us=400)
        h.advance(0.0005)
        h.step_done(ticket, run_us=500)
        h.advance(0.0035)
        out = h.step_done(llm_ticket, run_us=4000)
        llm_lanes.append(step_of(out, llm_ticket).lane)  # its next step
    assert cam_lanes == [None] * 3
    if lanes:
        # The LLM keeps its lane from step to step; each batch gets the other one.
        assert set(llm_lanes) == {0} and set(emb_lanes) == {1}
    else:
        assert set(llm_lanes) == set(emb_lanes) == {None}


def test_a_lane_freed_goes_to_the_next_background_step() -> None:
    h = Harness(channels=4, reserved_channels=1, background_lanes=2)
    h.priorities(u2=300, u3=300, u4=300)
    a, b, c = h.prepare(2), h.prepare(3), h.prepare(4)
    ta, out = h.execute(2, a)
    tb, out2 = h.execute(3, b)
    tc, out3 = h.execute(4, c)
    # Three background channels, two lanes: the third step runs without one.
    assert (step_of(out, ta).lane, step_of(out2, tb).lane, step_of(out3, tc).lane) == (
        0, 1, None)
    h.step_done(ta)
    td, out = h.execute(2, a)
    assert step_of(out, td).lane == 0  # lane 0 free again


@pytest.mark.parametrize(("channels", "reserved"), [(1, 0), (2, 1)])
def test_one_background_channel_has_no_lanes(channels: int, reserved: int) -> None:
    """One background step at a time: a lane would only pin it to one CPU."""
    h = Harness(channels=channels, reserved_channels=reserved, background_lanes=2)
    h.priorities(u2=300)
    ticket, out = h.execute(2, h.prepare(2), steps=3)
    assert step_of(out, ticket).lane is None


def run_mix(seed: int, lanes: int, events: int = 400) -> list[tuple[int | None, int]]:
    """Random work from three background uids and a foreground one on three channels
    (one reserved): executes of 1-4 steps, step ends, cancels, priority swaps. After
    every event the lanes of the background steps running are distinct, and a step
    started while a lane was free got one. Returns (lane, running background steps)
    of every background step started."""
    rng = random.Random(seed)
    h = Harness(channels=4, reserved_channels=1, background_lanes=lanes)
    h.priorities(u1=100, u2=300, u3=300, u4=300)
    models = {u: h.prepare(u) for u in (1, 2, 3, 4)}
    running: dict[int, int | None] = {}  # ticket -> lane of the step running now
    seen: list[tuple[int | None, int]] = []
    for _ in range(events):
        r = rng.random()
        if r < 0.4 or not running:
            uid = rng.choice((1, 2, 3, 4))
            _, out = h.execute(uid, models[uid], steps=rng.randint(1, 4))
        elif r < 0.85:
            h.advance(rng.choice((0.0002, 0.001, 0.004)))
            ticket = rng.choice(sorted(running))
            del running[ticket]  # its step is over (its next one may start now)
            out = h.step_done(ticket)
        elif r < 0.95:
            uid = rng.choice((2, 3, 4))
            out = h.cancel(uid, models[uid])
        else:
            h.priorities(**{f"u{rng.choice((2, 3, 4))}": rng.choice((100, 300))})
            out = []
        for ins in out:
            if isinstance(ins, ev.RunStep):
                if ins.background:
                    busy = [k for t, k in running.items() if k is not None]
                    free = lanes - len(busy)
                    assert ins.lane is not None or free <= 0 or not lanes, (seed, ins)
                    assert ins.lane is None or ins.lane not in busy, (seed, ins, running)
                    seen.append((ins.lane, len(running)))
                else:
                    assert ins.lane is None, ins
                running[ins.ticket] = ins.lane if ins.background else None
    return seen


@pytest.mark.parametrize("seed", range(12))
def test_random_mixes_never_put_two_background_steps_in_one_lane(seed: int) -> None:
    seen = run_mix(seed, lanes=2)
    assert any(lane == 1 for lane, _ in seen)  # (the mix ran steps side by side)


def test_without_lanes_every_step_has_none() -> None:
    assert {lane for lane, _ in run_mix(1, lanes=0)} == {None}


class LaneProbe(PolicyProbe):
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tid = threading.get_native_id()
        self.cpus = os.sched_getaffinity(tid)
        self.policy = os.sched_getscheduler(tid)
        self.thread = tid
        return {"y": np.zeros(1, np.float32)}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_each_lane_runs_on_a_lowered_thread_kept_on_a_cpu_of_its_own() -> None:
    runner = StepRunner("t", 3, inline_limit=1024, max_frame=1 << 20, background_sched="idle",
                        background_cpus="lanes")
    cpus = lane_cpus()
    assert cpus == sorted(os.sched_getaffinity(0))

    def run(lane: int | None, background: bool = True) -> LaneProbe:
        probe = LaneProbe()
        done = threading.Event()
        runner.start(Execution(1, probe, {"x": np.zeros(1, np.float32)}, {}),
                     RunStep(1, 0, True, False, background=background, lane=lane),
                     lambda error, us: done.set())
        assert done.wait(10)
        return probe

    try:
        first = [run(k) for k in range(len(cpus))]
        for k, p in enumerate(first):
            assert p.cpus == {cpus[k]} and p.policy == os.SCHED_IDLE
        assert run(0).thread == first[0].thread  # lane 0's own thread, again
        other = run(None)  # no lane: the shared background threads, every CPU
        assert other.cpus == set(cpus) and other.policy == os.SCHED_IDLE
        fg = run(None, background=False)
        assert fg.cpus == set(cpus) and fg.policy == os.SCHED_OTHER
    finally:
        runner.close()


def test_the_lanes_key_reaches_the_state() -> None:
    from npumanager.config import Config
    from npumanager.drivers.messages import params_from
    from npumanager.hal.host_config import HostConfig

    cfg = Config.load(None, {"driver": [{"name": "ref", "plugin": "reference",
                                         "background_cpus": "lanes"}]})
    p = params_from(HostConfig.from_config(cfg, "ref"))
    assert p.background_lanes == len(lane_cpus())
    assert params_from(HostConfig("x")).background_lanes == 0


@pytest.mark.parametrize("except_loads", [True, False], ids=["except-loads", "lanes"])
def test_no_lanes_while_a_background_model_prepares(except_loads: bool) -> None:
    """``background_cpus = "lanes-except-loads"``: background steps started while a
    BACKGROUND uid's model prepares get no lane; a FOREGROUND uid's prepare changes
    nothing; once the prepare ends, lanes again."""
    h = Harness(channels=3, reserved_channels=1, background_lanes=2,
                lanes_except_loads=except_loads)
    h.priorities(u1=100, u2=300, u3=300, u5=300)  # camera; LLM, embedder; a loader
    llm, emb = h.prepare(2), h.prepare(3)
    h.prepare(1)
    h.connect(5)

    def batch() -> int | None:
        ticket, out = h.execute(3, emb)
        lane = step_of(out, ticket).lane
        h.advance(0.0005)
        h.step_done(ticket, run_us=500)
        return lane

    llm_ticket, out = h.execute(2, llm, steps=1000)
    assert step_of(out, llm_ticket).lane == 0
    assert batch() == 1
    h.handle(h.mk(ev.PrepareBegun, conn=1, prepare_id=7, nbytes=10))  # foreground
    assert batch() == 1
    h.handle(h.mk(ev.PrepareBegun, conn=5, prepare_id=8, nbytes=10))  # background
    assert batch() == (None if except_loads else 1)
    h.handle(h.mk(ev.PrepareEnded, prepare_id=7))
    assert batch() == (None if except_loads else 1)
    h.handle(h.mk(ev.PrepareEnded, prepare_id=8))
    assert batch() == 1


def test_the_lanes_except_loads_key_reaches_the_state() -> None:
    from npumanager.config import Config
    from npumanager.drivers.messages import params_from
    from npumanager.hal.host_config import HostConfig

    cfg = Config.load(None, {"driver": [{"name": "ref", "plugin": "reference",
                                         "background_cpus": "lanes-except-loads"}]})
    p = params_from(HostConfig.from_config(cfg, "ref"))
    assert p.background_lanes == len(lane_cpus()) and p.lanes_except_loads
    assert not params_from(HostConfig("x")).lanes_except_loads
