"""The compile child's starvation bound, the decision (drivers/compile_starve.py) on a
virtual clock: time and the child's CPU time are passed in."""

from __future__ import annotations

from npumanager.drivers.compile_starve import CompileStarve

BOUND = 0.2


def test_a_child_that_gets_the_cpu_is_never_raised() -> None:
    g = CompileStarve(BOUND)
    g.begin(0.0, 0.0)
    for i in range(1, 200):  # 10 ms steps, 9 ms of CPU each: 10 % waiting, 20 s long
        assert g.tick(i * 0.01, i * 0.009) is None
    assert g.boosts == 0 and not g.end()


def test_a_starved_child_is_raised_for_one_bound_then_lowered() -> None:
    g = CompileStarve(BOUND)
    g.begin(10.0, 5.0)
    assert g.tick(10.1, 5.0) is None
    assert g.tick(10.2, 5.0) is None  # exactly the bound: not past it
    assert g.tick(10.21, 5.0) is True and g.raised
    assert g.tick(10.3, 5.05) is None  # raised: runs
    assert g.tick(10.42, 5.15) is False and not g.raised  # one bound later: lowered
    # Starved again: raised again only after another bound of waiting.
    assert g.tick(10.61, 5.15) is None
    assert g.tick(10.63, 5.15) is True
    assert g.boosts == 2
    assert g.end() is True  # the compile ended raised: the caller lowers it
    assert g.end() is False


def test_cpu_time_is_not_waiting() -> None:
    """Half the CPU: waits half the wall time; raised only once that half passes the bound."""
    g = CompileStarve(BOUND)
    g.begin(0.0, 0.0)
    assert g.tick(0.39, 0.195) is None  # waited 0.195
    assert g.tick(0.41, 0.205) is True  # waited 0.205


def test_time_stopped_on_purpose_is_not_starvation() -> None:
    """The quiet window's SIGSTOP (drivers/load_hold.py): the caller rebases after it."""
    g = CompileStarve(BOUND)
    g.begin(0.0, 0.0)
    g.rebase(5.0, 0.0)  # stopped from 0 to 5 s
    assert g.tick(5.1, 0.0) is None
    assert g.tick(5.21, 0.0) is True


def test_no_bound_never_raises() -> None:
    g = CompileStarve(0.0)
    g.begin(0.0, 0.0)
    assert g.tick(100.0, 0.0) is None and not g.end()
