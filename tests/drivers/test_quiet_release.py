"""``quiet_release`` (drivers/quiet_release.py): a released model is freed by the event
loop off the host's lock, at a moment the quiet window leaves clear, on a virtual clock."""

from __future__ import annotations

from pathlib import Path

from npumanager.drivers import quiet_release as qr
from npumanager.drivers.quiet import QuietWindow
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.testing.clock import VirtualClock
from tests.drivers.test_host_shell import Stack, run, settle, uid

PERIOD = 1 / 30


class Model:
    def __init__(self) -> None:
        self.freed_at: float | None = None
        self.clock: VirtualClock | None = None

    def release(self) -> None:
        assert self.freed_at is None, "freed once"
        assert self.clock is not None
        self.freed_at = self.clock.now()


def paced(clock: VirtualClock) -> tuple[QuietWindow, float]:
    """A camera paced at 30 Hz, frames of 0.5 ms; the last one ended now. Returns the
    window and the next frame's due time."""
    q = QuietWindow(0.001)
    t = clock.now()
    for _ in range(6):
        q.arrived("cam", t)
        q.ended("cam", t + 0.0005)
        t += PERIOD
    t -= PERIOD
    clock.advance(t + 0.0005 - clock.now())
    return q, t + PERIOD


def model(clock: VirtualClock) -> Model:
    m = Model()
    m.clock = clock
    return m


def test_freed_at_once_when_no_frame_is_near_but_only_from_the_loop() -> None:
    clock = VirtualClock()
    q, _due = paced(clock)
    rel = qr.QuietReleases(clock, lambda now, run_s: q.hold_end(now, run_s, set()))
    m = model(clock)
    rel.add(m)
    assert m.freed_at is None  # (not inside the caller: it may hold the host's lock)
    clock.advance(0)
    assert m.freed_at == clock.now() and (rel.freed, rel.late) == (1, 0)


def test_a_release_due_into_a_frames_window_waits_until_the_frame_has_passed() -> None:
    clock = VirtualClock()
    q, due = paced(clock)
    clock.advance(due - 0.002 - clock.now())  # 2 ms before the next frame: 3 ms won't fit
    rel = qr.QuietReleases(clock, lambda now, run_s: q.hold_end(now, run_s, set()))
    m = model(clock)
    rel.add(m)
    clock.advance(0.0029)
    assert m.freed_at is None, "held through the window around the frame"
    clock.advance(0.0002)  # due + 1 ms: the window is over (the frame never came)
    assert m.freed_at is not None and abs(m.freed_at - (due + 0.001)) < 1e-9
    assert rel.late == 0


def test_a_running_frame_holds_it_and_its_end_lets_it_go() -> None:
    clock = VirtualClock()
    q, due = paced(clock)
    clock.advance(due - clock.now())
    q.arrived("cam", due)  # the frame runs
    running = {"cam"}
    rel = qr.QuietReleases(clock, lambda now, run_s: q.hold_end(now, run_s, running))
    m = model(clock)
    rel.add(m)
    clock.advance(0.0004)
    assert m.freed_at is None
    q.ended("cam", clock.now())
    running.clear()
    clock.advance(PERIOD)  # looked at again at the held frame's latest end, then freed
    assert m.freed_at is not None and m.freed_at <= due + PERIOD


def test_a_hold_that_never_ends_frees_it_after_max_wait() -> None:
    clock = VirtualClock()
    t0 = clock.now()
    rel = qr.QuietReleases(clock, lambda now, run_s: now + 0.001)
    ms = [model(clock), model(clock)]
    for m in ms:
        rel.add(m)
    clock.advance(qr.MAX_WAIT_S - 0.001)
    assert all(m.freed_at is None for m in ms)
    clock.advance(0.002)
    assert all(m.freed_at is not None and m.freed_at - t0 <= qr.MAX_WAIT_S + 0.001
               for m in ms)
    assert (rel.freed, rel.late) == (2, 2)


def test_one_release_per_look_and_close_frees_the_rest() -> None:
    clock = VirtualClock()
    rel = qr.QuietReleases(clock, lambda now, run_s: None)
    a, b, c = model(clock), model(clock), model(clock)
    rel.add(a)
    rel.add(b)
    clock.advance(0)
    assert a.freed_at is not None and b.freed_at is not None  # (each in a look of its own)
    held = qr.QuietReleases(clock, lambda now, run_s: now + 1.0)
    held.add(c)
    held.close()
    assert c.freed_at is not None
    clock.advance(1.0)  # (nothing left to fire)


def test_the_host_frees_a_revoked_model_from_the_loop(runtime_dir: Path,
                                                     state_dir: Path) -> None:
    async def body(s: Stack) -> None:
        await s.grant("g1", uid())
        await s.prepare("g1", b"gated")
        gated = s.driver.models[0]
        assert s.host.res.releases is not None
        await s.hal.call("hal.grant_ended", pb.GrantEnded(grant_id="g1", revoked=True))
        await settle()
        s.clock.advance(0)
        await settle()
        assert gated.released and s.host.res.releases.freed == 1

    run(runtime_dir, state_dir, body, quiet_release=True)
