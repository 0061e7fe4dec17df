"""Anticipation's poll slot in turns between uids (drivers/poll_turns.py), through the
host's side of it (``Anticipate.take``) as a burst's thread uses it: paced streams
simulated frame by frame on a virtual clock, each declaring its window, asking for the
slot when its window opens and letting it go when its request comes."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from npumanager.drivers.anticipate import Anticipate
from npumanager.drivers.burst_counters import BurstCounters
from npumanager.drivers.poll_turns import KEPT_UIDS, FirstCome, PollTurns
from npumanager.testing import VirtualClock

PERIOD = 1 / 30
WINDOW = 300e-6


@dataclass
class Stream:
    """What ``Anticipate.take`` reads of a burst, and what became of its windows."""

    burst_id: int
    uid: int
    #: Where its window opens in each frame (s after the frame's start).
    phase: float
    #: From this frame on its request comes before its window (served without the slot).
    early_from: int | None = None
    counters: BurstCounters = field(default_factory=BurstCounters)
    #: Per frame: "took", "busy", "deferred" or "early".
    log: list[str] = field(default_factory=list)

    @property
    def polled(self) -> int:
        return self.log.count("took")

    def longest_run_without(self) -> int:
        run = best = 0
        for what in self.log:
            run = 0 if what == "took" else run + 1
            best = max(best, run)
        return best


def simulate(streams: list[Stream], frames: int, *, rotate: bool = True) -> Anticipate:
    """Every stream plans its window a frame ahead, asks for the slot when it opens and,
    holding it, polls until its request (the window's middle), as await_request does;
    the events run in time order on a virtual clock. ``rotate=False``: the slot first
    come, first served."""
    side = Anticipate(WINDOW, threading.Lock(), lambda s: True,
                      turns=PollTurns() if rotate else FirstCome())
    clock = VirtualClock(100.0)

    def request(s: Stream) -> None:  # it comes while the holder polls: the slot is let go
        side.turns.ended(s.burst_id)
        side.polling.release()

    def window_opens(s: Stream, f: int) -> None:
        if s.early_from is not None and f >= s.early_from:
            s.log.append("early")
            side.turns.ended(s.burst_id, served_early=True)
            return
        held = side.polling.locked()
        if side.take(s, clock.now()):  # type: ignore[arg-type]
            s.log.append("took")
            clock.call_at(clock.now() + WINDOW / 2, lambda: request(s))
            return
        s.log.append("busy" if held else "deferred")
        side.turns.ended(s.burst_id)  # it blocks on its doorbell

    for f in range(frames):
        t0 = 100.0 + f * PERIOD
        for s in streams:  # planned once its last request was served
            side.turns.planned(s.burst_id, s.uid, t0 + s.phase, t0 + s.phase + WINDOW)
            clock.call_at(t0 + s.phase, lambda s=s, f=f: window_opens(s, f))
        clock.advance(t0 + PERIOD - clock.now())
    return side


def test_turns_two_uids_whose_windows_overlap_every_frame_alternate() -> None:
    a, b = Stream(1, 1001, 0.010), Stream(2, 1002, 0.010 + 50e-6)
    side = simulate([a, b], 60)
    assert a.polled == b.polled == 30, (a.log, b.log)
    assert a.longest_run_without() == b.longest_run_without() == 1
    # Each window given up or skipped is counted on its burst.
    assert b.counters.busy == 30 and a.counters.deferred == 30
    assert side.turns.taken == 60 and side.turns.busy == 30 and side.turns.deferred == 30


def test_turns_first_come_first_served_starves_the_later_stream() -> None:
    """The behaviour the turns replace: the same frames without them, the stream whose
    window opens later never polls."""
    a, b = Stream(1, 1001, 0.010), Stream(2, 1002, 0.010 + 50e-6)
    simulate([a, b], 60, rotate=False)
    assert (a.polled, b.polled) == (60, 0)


def test_turns_windows_that_do_not_overlap_are_never_given_up() -> None:
    a, b = Stream(1, 1001, 0.010), Stream(2, 1002, 0.010 + 2 * WINDOW)
    side = simulate([a, b], 40)
    assert a.polled == b.polled == 40
    assert side.turns.deferred == side.turns.busy == 0


def test_turns_one_uids_streams_share_first_come_first_served() -> None:
    """Turns are per uid: two streams of one uid are that uid's business."""
    a, b = Stream(1, 1001, 0.010), Stream(2, 1001, 0.010 + 50e-6)
    simulate([a, b], 20)
    assert (a.polled, b.polled) == (20, 0)
    assert a.counters.deferred == b.counters.deferred == 0


def test_turns_a_uid_with_many_streams_gets_no_more_turns_than_one_with_one() -> None:
    """A hostile uid paces three streams just ahead of the victim's window: the victim
    still polls every other frame, never skipped twice in a row."""
    hostile = [Stream(i, 666, 0.010 + i * 10e-6) for i in range(1, 4)]
    victim = Stream(9, 1002, 0.010 + 50e-6)
    simulate([*hostile, victim], 60)
    assert victim.polled == 30 and victim.longest_run_without() == 1, victim.log
    assert sum(h.polled for h in hostile) == 30


def test_turns_a_uid_served_early_makes_nobody_give_windows_up() -> None:
    """A uid owed a turn whose requests then come before its window (it needs none)
    lapses its claim: the other uid gives up one window, not every one."""
    a, b = Stream(1, 1001, 0.010), Stream(2, 1002, 0.010 + 50e-6, early_from=1)
    simulate([a, b], 20)
    assert b.log[0] == "busy" and a.log[1] == "deferred" and a.polled == 19, (a.log, b.log)


def test_turns_an_owed_uid_whose_window_is_over_or_elsewhere_is_not_waited_for() -> None:
    turns = PollTurns()
    turns.owed.add(1002)
    turns.last_turn[1001] = 5.0
    turns.planned(1, 1001, 10.0, 10.001)
    turns.planned(2, 1002, 10.0005, 10.0015)
    assert not turns.ask(1, 10.0)  # overlapping and not over
    turns.planned(2, 1002, 10.002, 10.003)
    assert turns.ask(1, 10.0)  # after this one's window
    turns.planned(2, 1002, 9.0, 10.0)
    turns.planned(1, 1001, 9.5, 10.5)
    assert turns.ask(1, 10.0)  # over by now


def test_turns_keep_a_bounded_record_of_uids() -> None:
    turns = PollTurns()
    for uid in range(3 * KEPT_UIDS):
        turns.planned(uid, uid, float(uid), uid + 0.5)
        turns.took(uid, float(uid))
        turns.ended(uid)
    assert len(turns.last_turn) <= KEPT_UIDS
    assert not turns.windows and not turns.owed
