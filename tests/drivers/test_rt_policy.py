"""drivers/rt_policy.py: when a burst's thread asks for SCHED_FIFO and when it lowers
itself, on a virtual clock."""

from __future__ import annotations

from npumanager.drivers.rt_policy import ASK, LOWER, NOTHING, RtPolicy
from npumanager.testing.clock import VirtualClock


def test_asks_once_per_foreground_stretch_and_lowers_on_background() -> None:
    clock, p = VirtualClock(), RtPolicy()
    assert p.serve(True, clock.now()) == ASK and p.want
    assert p.serve(True, clock.now()) == NOTHING  # asked already
    assert p.serve(False, clock.now()) == LOWER and not p.want
    assert p.serve(False, clock.now()) == NOTHING
    assert p.serve(True, clock.now()) == ASK


def test_a_long_run_lowers_and_backs_off() -> None:
    clock, p = VirtualClock(), RtPolicy()
    assert not p.ran(9000, 5000, clock.now(), 1.0)  # not at FIFO: nothing to lower
    p.serve(True, clock.now())
    assert not p.ran(5000, 5000, clock.now(), 1.0) and p.want  # at the bound: kept
    assert p.ran(5001, 5000, clock.now(), 1.0) and not p.want
    assert p.lowered_long == 1
    clock.advance(0.999)
    assert p.serve(True, clock.now()) == NOTHING  # backing off
    assert p.serve(False, clock.now()) == NOTHING  # (nothing to lower)
    clock.advance(0.001)
    assert p.serve(True, clock.now()) == ASK


def test_demoted_from_outside_backs_off_too() -> None:
    clock, p = VirtualClock(), RtPolicy()
    p.serve(True, clock.now())
    p.demoted(clock.now(), 2.0)
    assert not p.want
    clock.advance(1.5)
    assert p.serve(True, clock.now()) == NOTHING
    clock.advance(0.5)
    assert p.serve(True, clock.now()) == ASK
