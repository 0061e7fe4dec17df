"""The quiet window (drivers/quiet.py): background steps kept clear of a paced
foreground stream's frames, on the driver state's virtual clock. Each policy test
runs the same story with the window off too: there the background step starts."""

from __future__ import annotations

import pytest

from npumanager.drivers import events as ev
from npumanager.drivers.quiet import Pace, QuietWindow
from npumanager.drivers.state import QUIET_TIMER

from .state_harness import Harness

PERIOD = 0.033  # a 30 fps camera
X_US = 2000  # the window: 2 ms


def started(out: list[ev.Instruction], ticket: int) -> bool:
    return any(isinstance(i, ev.RunStep) and i.ticket == ticket for i in out)


class Scene:
    """uid 1 a camera (app priority 100: foreground), uid 2 an LLM (300: background)
    decoding a long multi-step job, 3 channels with 1 reserved (npud's defaults)."""

    def __init__(self, window_us: int, tail_us: int = 0) -> None:
        self.h = h = Harness(channels=3, reserved_channels=1, quiet_window_us=window_us,
                             quiet_tail_us=tail_us)
        h.priorities(u1=100, u2=300)
        self.cam, self.llm = h.prepare(1), h.prepare(2)
        self.llm_ticket, out = h.execute(2, self.llm, steps=1000)
        assert started(out, self.llm_ticket)
        self.last_frame = h.now

    def frame(self, run_s: float = 0.001) -> list[ev.Instruction]:
        """A camera frame arrives now and runs for ``run_s``; what its end returned."""
        h = self.h
        self.last_frame = h.now
        ticket, out = h.execute(1, self.cam)
        assert started(out, ticket), "a frame never waits"
        h.advance(run_s)
        return h.step_done(ticket, run_us=run_s * 1e6)

    def llm_step(self, run_s: float = 0.004) -> list[ev.Instruction]:
        """The LLM's running step ends ``run_s`` after now; what that returned."""
        self.h.advance(run_s)
        return self.h.step_done(self.llm_ticket, run_us=run_s * 1e6)

    def pace(self, frames: int = 5) -> None:
        """Frames every PERIOD, the LLM stepping back to back in between; returns just
        after the last frame ended and its tail (if any) is over (the LLM's next step
        running)."""
        h = self.h
        for i in range(frames):
            if i:
                while (h.now + 0.004 < self.last_frame + PERIOD
                       and h.state.job_state(self.llm_ticket) is ev.JobState.RUNNING):
                    self.llm_step()
                h.advance(self.last_frame + PERIOD - h.now)
            self.frame()
            h.advance(h.state.params.quiet_tail_us / 1e6)
        assert h.state.job_state(self.llm_ticket) is ev.JobState.RUNNING


@pytest.mark.parametrize("window_us", [X_US, 0], ids=["quiet", "off"])
def test_no_background_step_starts_just_before_a_frame(window_us: int) -> None:
    s = Scene(window_us)
    s.pace()
    # 6 ms before the next frame the LLM's step ends: a 4 ms step would run into the
    # frame's window (due - 2 ms).
    due = s.last_frame + PERIOD
    s.h.advance(due - 0.0055 - s.h.now - 0.004)
    out = s.llm_step()
    if window_us == 0:
        assert started(out, s.llm_ticket)
        return
    assert not started(out, s.llm_ticket)
    assert s.h.state.job_state(s.llm_ticket) is ev.JobState.PAUSED
    assert s.h.timers[QUIET_TIMER] == pytest.approx(due + X_US / 1e6)
    # The frame comes on time and runs; when it ends the LLM goes on.
    s.h.advance(due - s.h.now)
    out = s.frame()
    assert started(out, s.llm_ticket)


def test_a_step_that_ends_well_before_the_window_goes_on() -> None:
    s = Scene(X_US)
    s.pace()
    due = s.last_frame + PERIOD
    s.h.advance(due - 0.012 - s.h.now - 0.004)  # ends 12 ms before the frame
    assert started(s.llm_step(), s.llm_ticket)


@pytest.mark.parametrize("window_us", [X_US, 0], ids=["quiet", "off"])
def test_no_background_step_starts_while_a_frame_runs(window_us: int) -> None:
    s = Scene(window_us)
    s.pace()
    h = s.h
    due = s.last_frame + PERIOD
    h.advance(due - h.now - 0.002)  # the LLM's step began long ago, ends mid-frame
    cam_ticket, _ = h.execute(1, s.cam)
    h.advance(0.002)
    out = h.step_done(s.llm_ticket, run_us=30000)
    assert started(out, s.llm_ticket) is (window_us == 0)
    if window_us:
        out = h.step_done(cam_ticket, run_us=2000)
        assert started(out, s.llm_ticket), "the frame's end lets background work go on"


def test_a_frame_that_does_not_come_holds_nothing_back_longer_than_the_window() -> None:
    s = Scene(X_US)
    s.pace()
    due = s.last_frame + PERIOD
    s.h.advance(due - 0.005 - s.h.now - 0.004)
    assert not started(s.llm_step(), s.llm_ticket)
    out = s.h.advance(0.005 + X_US / 1e6)  # past due + X: the timer fires
    assert started(out, s.llm_ticket)
    assert s.h.state.job_state(s.llm_ticket) is ev.JobState.RUNNING


def test_unpaced_foreground_work_holds_nothing_back() -> None:
    s = Scene(X_US)
    h = s.h
    # Frames at irregular times: 10, 50, 20, 90 ms apart.
    for gap in (0.010, 0.050, 0.020, 0.090):
        s.frame()
        h.advance(gap)
    assert not h.state.quiet.paced()  # type: ignore[union-attr]
    out = s.llm_step()
    assert started(out, s.llm_ticket)


def test_the_quiet_timer_leaves_the_fast_admission_valid() -> None:
    s = Scene(X_US)
    s.pace()
    due = s.last_frame + PERIOD
    s.h.advance(due - 0.005 - s.h.now - 0.004)
    s.llm_step()
    epoch = s.h.state.epoch
    s.h.advance(0.010)  # the quiet timer fires
    assert s.h.state.epoch == epoch


def test_pace_needs_agreeing_intervals() -> None:
    p = Pace(0.0)
    for t in (0.033, 0.066):
        p.arrived(t)
    assert p.period is None  # two intervals are not a pace yet
    p.arrived(0.100)
    assert p.period == pytest.approx(0.033, abs=0.002)
    q = Pace(0.0)
    for t in (0.010, 0.060, 0.080, 0.170):
        q.arrived(t)
    assert q.period is None


def test_hold_end_is_the_window_around_the_next_frame() -> None:
    w = QuietWindow(0.002)
    for i in range(5):
        w.arrived("cam", i * PERIOD)
    last = 4 * PERIOD
    assert w.hold_end(last + 0.010, 0.004, ()) is None
    assert w.hold_end(last + 0.028, 0.004, ()) == pytest.approx(last + PERIOD + 0.002)
    # A running frame holds until it ends, one period after it arrived at the latest.
    assert w.hold_end(last + 0.010, 0.004, {"cam"}) == pytest.approx(last + PERIOD)
    assert w.hold_end(last + PERIOD + 0.001, 0.004, {"cam"}) is None
    # A step longer than half the period is counted as half of it: it may start in the
    # first half (right after a frame), never later.
    assert w.hold_end(last + 0.005, 0.030, ()) is None
    assert w.hold_end(last + 0.016, 0.030, ()) is not None
    # One frame missed: the next one is expected; two missed: the stream stopped.
    assert w.hold_end(last + PERIOD + 0.028, 0.004, ()) is not None
    assert w.hold_end(last + 3 * PERIOD, 0.004, ()) is None


@pytest.mark.parametrize("window_us", [X_US, 0], ids=["quiet", "off"])
def test_a_frame_that_outruns_its_period_holds_background_work_one_period_at_most(
        window_us: int) -> None:
    """A foreground app paces itself, then sends one frame that never ends (a job of a
    million steps): background work of every uid is held while it runs, for one period
    from its arrival, not for as long as it runs."""
    s = Scene(window_us)
    s.pace()
    h = s.h
    due = s.last_frame + PERIOD
    h.advance(due - h.now)
    endless, _ = h.execute(1, s.cam, steps=1_000_000)
    h.advance(0.002)
    out = h.step_done(s.llm_ticket, run_us=20000)  # the LLM's step ends mid-frame
    assert started(out, s.llm_ticket) is (window_us == 0)
    if window_us == 0:
        return
    assert h.timers[QUIET_TIMER] == pytest.approx(due + PERIOD)
    out = h.advance(PERIOD)  # a whole period since the frame arrived: the timer fires
    assert started(out, s.llm_ticket), "held for as long as the frame runs"
    assert h.state.job_state(endless) is ev.JobState.RUNNING
    # And it stays free to step while that frame runs on.
    for _ in range(3):
        assert started(s.llm_step(), s.llm_ticket)


def test_the_tail_holds_background_steps_for_the_window_after_a_frame_ends() -> None:
    """The camera app takes its answer after the frame's end: the LLM's step that ends
    while the frame runs starts the window's width after the frame ended, not at once
    (bench/contention_trace.py: the camera's thread waited behind a SCHED_IDLE step
    started the moment the frame ended)."""
    s = Scene(X_US, tail_us=X_US)
    s.pace()
    h = s.h
    due = s.last_frame + PERIOD
    h.advance(due - h.now - 0.003)  # the LLM's step runs into the frame
    cam_ticket, _ = h.execute(1, s.cam)
    h.advance(0.001)
    assert not started(h.step_done(s.llm_ticket, run_us=8000), s.llm_ticket)
    h.advance(0.0005)
    frame_end = h.now
    assert not started(h.step_done(cam_ticket, run_us=1500), s.llm_ticket)
    assert h.timers[QUIET_TIMER] == pytest.approx(frame_end + X_US / 1e6)
    assert not started(h.advance(X_US / 1e6 / 2), s.llm_ticket)
    assert started(h.advance(X_US / 1e6 / 2), s.llm_ticket)


def test_the_tail_is_once_per_frame_and_only_for_paced_streams() -> None:
    w = QuietWindow(0.002, 0.002)
    w.arrived("cam", 0.0)
    w.ended("cam", 0.001)
    assert w.hold_end(0.0015, 0.004, ()) is None, "one frame is no pace: no tail"
    for i in range(1, 5):
        w.arrived("cam", i * PERIOD)
    last = 4 * PERIOD
    w.ended("cam", last + 0.001)
    assert w.hold_end(last + 0.002, 0.004, ()) == pytest.approx(last + 0.003)
    assert w.hold_end(last + 0.002, 0.004, (), tail=False) is None  # the load hold's view
    assert w.hold_end(last + 0.0031, 0.004, ()) is None, "the tail is over"
    w.ended("cam", last + 0.004)  # a second end of the same frame: not a second tail
    assert w.hold_end(last + 0.0045, 0.004, ()) is None
    w.arrived("cam", last + PERIOD)
    assert w.hold_end(last + PERIOD + 0.0005, 0.004, ()) is None, "its frame has not ended"
