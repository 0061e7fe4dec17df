"""Execution classes: the pure decision of which class a job runs in, and what the
driver state does with it (the reserved channel, background threads, no inline run).
The effect on latency is measured by bench/contention.py, not here."""

from __future__ import annotations

import pytest

from npumanager.drivers import events as ev
from npumanager.drivers.classes import (
    DEFAULT_FOREGROUND_PRIORITY,
    ExecClass,
    Protection,
    exec_class,
    may_start,
)
from npumanager.drivers.records import DriverParams
from npumanager.drivers.runqueue import RunQueue

from .state_harness import Harness

FG, BG = ExecClass.FOREGROUND, ExecClass.BACKGROUND


def steps(out: list[ev.Instruction]) -> list[ev.RunStep]:
    return [i for i in out if isinstance(i, ev.RunStep)]


@pytest.mark.parametrize(("eff", "threshold", "cls"), [
    (0, 200, FG), (100, 200, FG), (200, 200, FG), (201, 200, BG), (1400, 200, BG),
    (300, 300, FG), (301, 300, BG), (-5, -10, BG),
])
def test_class_is_a_function_of_effective_priority(eff: int, threshold: int,
                                                   cls: ExecClass) -> None:
    assert exec_class(eff, threshold) is cls


def test_default_threshold_puts_visible_in_foreground_and_services_in_background() -> None:
    # FOREGROUND 100 and VISIBLE 200 (job 0) are foreground; SERVICE 300 is not.
    assert exec_class(100, DEFAULT_FOREGROUND_PRIORITY) is FG
    assert exec_class(200, DEFAULT_FOREGROUND_PRIORITY) is FG
    assert exec_class(300, DEFAULT_FOREGROUND_PRIORITY) is BG


@pytest.mark.parametrize(("cls", "running", "channels", "reserved", "ok"), [
    (FG, 1, 2, 1, True), (FG, 0, 1, 0, True), (BG, 1, 2, 1, False), (BG, 0, 2, 1, True),
    (BG, 1, 2, 0, True), (BG, 2, 4, 2, False), (BG, 1, 4, 2, True),
])
def test_background_never_takes_a_reserved_channel(cls: ExecClass, running: int,
                                                   channels: int, reserved: int,
                                                   ok: bool) -> None:
    assert may_start(cls, running, channels, reserved) is ok


@pytest.mark.parametrize(("asked", "channels", "got"), [
    (0, 1, 0), (1, 1, 0), (1, 2, 1), (5, 2, 1), (2, 4, 2), (-1, 2, 0)])
def test_reservation_always_leaves_background_a_channel(asked: int, channels: int,
                                                        got: int) -> None:
    assert Protection(reserved_channels=asked).reserved(channels) == got


def test_run_queue_refuses_a_reservation_that_starves_background() -> None:
    with pytest.raises(ValueError):
        RunQueue(2, reserved=2)


def test_jobs_get_their_class_from_effective_priority() -> None:
    h = Harness(channels=2)
    h.priorities(u1=100, u2=300)
    fg_model, bg_model = h.prepare(1), h.prepare(2)
    _, out = h.execute(1, fg_model)
    assert [s.background for s in steps(out)] == [False]
    _, out = h.execute(2, bg_model)
    assert [s.background for s in steps(out)] == [True]
    # A job priority can push a foreground app's work over the threshold.
    h.step_done(1)
    _, out = h.execute(1, fg_model, prio=150)
    assert [s.background for s in steps(out)] == [True]


def test_the_threshold_is_a_knob() -> None:
    h = Harness(channels=1, foreground_priority=300)
    h.priorities(u2=300)
    _, out = h.execute(2, h.prepare(2))
    assert [s.background for s in steps(out)] == [False]


def test_model_class_follows_the_uids_app_priority() -> None:
    h = Harness(channels=1)
    h.priorities(u1=100, u2=300)
    assert h.state.model_class(1) is FG
    assert h.state.model_class(2) is BG
    assert h.state.model_class(99) is BG  # an unknown uid: 1000


def test_reserved_channel_waits_for_foreground_work() -> None:
    h = Harness(channels=2, reserved_channels=1)
    h.priorities(u1=100, u2=300, u3=300)
    bg1, bg2, fg = h.prepare(2), h.prepare(3), h.prepare(1)
    t1, out = h.execute(2, bg1, steps=100)
    assert len(steps(out)) == 1  # one channel for background work
    t2, out = h.execute(3, bg2)
    assert steps(out) == []  # the other channel is kept: it queues
    assert h.running() == [t1]
    # Foreground work starts at once on the kept channel, no step boundary needed.
    t3, out = h.execute(1, fg)
    assert [(s.ticket, s.background) for s in steps(out)] == [(t3, False)]
    assert sorted(h.running()) == sorted([t1, t3])
    # The background step ends: the one background channel goes round to t2 (equals).
    out = h.step_done(t1)
    assert [(s.ticket, s.background) for s in steps(out)] == [(t2, True)]
    # The foreground job ends: its channel stays free for the next foreground work.
    out = h.step_done(t3)
    assert steps(out) == []
    assert h.running() == [t2] and len(h.state.jobs()) == 2


def test_without_a_reservation_background_fills_every_channel() -> None:
    h = Harness(channels=2)
    h.priorities(u2=300, u3=300)
    _, a = h.execute(2, h.prepare(2), steps=10)
    _, b = h.execute(3, h.prepare(3), steps=10)
    assert len(steps(a)) == 1 and len(steps(b)) == 1


def _warm(h: Harness, conn: int, model: int, run_us: float) -> None:
    for _ in range(3):
        t, _ = h.execute(conn, model)
        h.step_done(t, run_us=run_us)


def test_background_work_on_background_threads_never_runs_inline_when_idle() -> None:
    # A 2 ms single-step job alone on the device runs inline (inline_idle_run_us) -
    # unless it is background work and background threads are on.
    for background_threads, inline in ((False, True), (True, False)):
        h = Harness(DriverParams(channels=1, enforce_admission=False,
                                 background_threads=background_threads))
        h.priorities(u2=300)
        model = h.prepare(2)
        _warm(h, 2, model, 2000.0)
        _, out = h.execute(2, model)
        assert [s.inline for s in steps(out)] == [inline]


def test_tiny_background_steps_stay_inline() -> None:
    h = Harness(DriverParams(channels=1, enforce_admission=False, background_threads=True))
    h.priorities(u2=300)
    model = h.prepare(2)
    _warm(h, 2, model, 50.0)
    _, out = h.execute(2, model)
    assert [s.inline for s in steps(out)] == [True]
