"""The compile child held around paced foreground frames (drivers/load_hold.py), on
the driver state's virtual clock: when it is stopped and continued, and the bounds
that keep a foreground stream from holding a background load forever."""

from __future__ import annotations

import itertools

import pytest

from npumanager.drivers import events as ev
from npumanager.drivers.load_hold import LOAD_TIMER

from .state_harness import Harness

PERIOD = 0.033  # a 30 fps camera
X = 0.001  # npud's default window


def holds(out: list[ev.Instruction]) -> list[bool]:
    return [i.stop for i in out if isinstance(i, ev.HoldLoads)]


class Scene:
    """uid 1 a camera (app priority 100: foreground), uid 2 loading a background model
    (300); 3 channels, 1 reserved; the window X wide (0: off)."""

    def __init__(self, window_s: float = X) -> None:
        self.h = h = Harness(channels=3, reserved_channels=1,
                             quiet_window_us=window_s * 1e6, hold_loads=True)
        h.priorities(u1=100, u2=300)
        self.cam = h.prepare(1)
        h.connect(2)
        self.prepares = 0
        #: (time, stop) of every HoldLoads, in order.
        self.hold_log: list[tuple[float, bool]] = []
        self.last_frame = h.now
        self._seen = len(h.log)

    def note(self, out: list[ev.Instruction]) -> list[ev.Instruction]:
        """Log the holds of every event handled since the last note, at its time."""
        for event, got in self.h.log[self._seen:]:
            self.hold_log += [(event.now, s) for s in holds(got)]
        self._seen = len(self.h.log)
        return out

    def begin_load(self, conn: int = 2) -> int:
        self.prepares += 1
        self.note(self.h.handle(self.h.mk(ev.PrepareBegun, conn=conn,
                                          prepare_id=self.prepares, nbytes=1000)))
        return self.prepares

    def end_load(self, prepare_id: int) -> None:
        self.note(self.h.handle(self.h.mk(ev.PrepareEnded, prepare_id=prepare_id)))

    def advance(self, dt: float) -> None:
        self.note(self.h.advance(dt))

    def frame(self, run_s: float = 0.001) -> None:
        """A camera frame arrives now and runs for ``run_s``."""
        h = self.h
        self.last_frame = h.now
        ticket, out = h.execute(1, self.cam)
        self.note(out)
        self.advance(run_s)
        self.note(h.step_done(ticket, run_us=run_s * 1e6))

    def frames(self, n: int, run_s: float = 0.001, period: float = PERIOD) -> None:
        """``n`` frames ``period`` apart, the first now; returns at the last one's end."""
        for i in range(n):
            if i:
                self.advance(self.last_frame + period - self.h.now)
            self.frame(run_s)

    def stopped(self) -> bool:
        return bool(self.hold_log) and self.hold_log[-1][1]

    def stops(self) -> list[tuple[float, float]]:
        """(start, length) of every stop that ended."""
        out, start = [], None
        for t, stop in self.hold_log:
            if stop:
                assert start is None, "stopped twice"
                start = t
            else:
                assert start is not None, "continued while running"
                out.append((start, t - start))
                start = None
        return out


def test_the_child_is_stopped_from_due_minus_x_until_the_frame_ends() -> None:
    s = Scene()
    s.frames(5)  # paced now
    s.begin_load()
    assert not s.stopped(), "nothing is due yet: the compile runs"
    due = s.last_frame + PERIOD
    assert s.h.timers[LOAD_TIMER] == pytest.approx(due - X)
    s.advance(due - X - s.h.now - 1e-4)
    assert not s.stopped()
    s.advance(2e-4)
    assert s.stopped() and s.hold_log[-1][0] == pytest.approx(due - X)
    s.advance(due - s.h.now)
    s.frame(0.0015)  # arrives on time, runs 1.5 ms: its end continues the child
    assert not s.stopped()
    assert s.stops() == [(pytest.approx(due - X), pytest.approx(X + 0.0015))]
    # And so every frame: about 2.5 ms of every 33.
    s.frames(10, run_s=0.0015)
    lengths = [length for _, length in s.stops()]
    assert len(lengths) == 10 and max(lengths) == pytest.approx(X + 0.0015)


def test_a_frame_that_does_not_come_holds_until_due_plus_x() -> None:
    s = Scene()
    s.frames(5)
    s.begin_load()
    due = s.last_frame + PERIOD
    s.advance(due + X + 1e-4 - s.h.now)  # the camera stopped
    assert s.stops() == [(pytest.approx(due - X), pytest.approx(2 * X))]
    s.advance(1.0)  # one more missed frame is still waited for, then nothing
    assert len(s.stops()) == 2 and not s.stopped()
    assert LOAD_TIMER not in s.h.timers


def test_the_load_ending_continues_the_child_at_once() -> None:
    s = Scene()
    s.frames(5)
    pid = s.begin_load()
    s.advance(s.last_frame + PERIOD - s.h.now)  # inside the window
    assert s.stopped()
    s.end_load(pid)
    assert not s.stopped()
    s.advance(1.0)
    assert not s.stopped() and len(s.hold_log) == 2


@pytest.mark.parametrize("window_s", [X, 0.0])
def test_nothing_held_without_a_window_a_pace_or_a_background_load(window_s: float) -> None:
    s = Scene(window_s)
    s.frames(5)
    s.begin_load(conn=1)  # the camera's own (foreground) prepare: never held
    s.frames(5)
    assert s.hold_log == []
    s.begin_load(conn=2)
    s.frames(5)
    assert bool(s.hold_log) == (window_s > 0)
    s2 = Scene(window_s)
    s2.begin_load()
    s2.advance(1.0)  # a background load with no paced stream: never held
    assert s2.hold_log == []


@pytest.mark.parametrize(("period", "run_s"), [
    (0.0025, 0.0024),  # near the fastest pace believed, each frame nearly a period
    (PERIOD, 0.1),  # frames that run three periods each
    (0.005, 0.004),
])
def test_a_foreground_stream_cannot_hold_a_load_forever(period: float, run_s: float) -> None:
    """Whatever the pace and however long the frames run: each stop lasts at most one
    period and the child runs at least as long as its last stop after it, so the load
    keeps at least half of the time."""
    s = Scene()
    s.frames(6, run_s=min(run_s, period * 0.9), period=period)
    s.begin_load()
    t0 = s.h.now
    s.frames(200, run_s=run_s, period=period)
    s.advance(period)
    stops = s.stops()
    assert stops, "the stream held nothing"
    elapsed = s.h.now - t0
    held = sum(length for _, length in stops) + (
        s.h.now - s.hold_log[-1][0] if s.stopped() else 0.0)
    assert all(length <= period + 1e-9 for _, length in stops), stops
    assert held <= elapsed / 2 + period, (held, elapsed)
    for (a, la), (b, _) in itertools.pairwise(stops):
        assert b - (a + la) >= la - 1e-9, "stopped again before it ran as long"
    # The state's own counts agree.
    hold = s.h.state.load_hold
    assert hold is not None and hold.longest_s <= period + 1e-9


def test_off_by_default() -> None:
    h = Harness(channels=3, reserved_channels=1, quiet_window_us=1000)
    assert h.state.load_hold is None
