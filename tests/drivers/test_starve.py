"""The bound on background starvation at SCHED_IDLE (drivers/starve.py): which background
steps run at normal priority, on virtual time (``now`` and CPU times passed in)."""

from __future__ import annotations

from npumanager.drivers.starve import StarveGuard

BOUND = 0.2


def test_steps_that_do_not_wait_past_the_bound_stay_idle() -> None:
    g = StarveGuard(BOUND)
    now = 100.0
    for token in range(1, 50):
        assert g.route(token, now) is False
        # Waited 0.19 s beyond its 1 s of CPU: below the bound.
        now += 1.19
        g.ended(token, now, cpu_s=1.0)
    assert (g.boosted, g.starved) == (0, 0)


def test_a_long_step_on_an_idle_machine_is_not_starved() -> None:
    """Its own CPU time is not waiting: a 5 s step that ran all along moves nothing."""
    g = StarveGuard(BOUND)
    assert not g.route(1, 0.0)
    g.ended(1, 5.0, cpu_s=4.95)
    assert not g.route(2, 5.0)
    assert g.counts()["starved"] == 0


def test_a_starved_step_makes_the_next_one_run_at_normal_priority_then_idle_again() -> None:
    g = StarveGuard(BOUND)
    assert not g.route(1, 0.0)
    g.ended(1, 0.5, cpu_s=0.01)  # waited 0.49 s for the CPU
    assert g.route(2, 0.5) is True  # the next step: normal priority (no ended() for it)
    assert g.route(3, 0.52) is False  # and back to SCHED_IDLE
    g.ended(3, 0.53, cpu_s=0.01)
    assert not g.route(4, 0.53)
    assert g.counts() == {"starve_ms": 200.0, "boosted": 1, "starved": 1, "pending": 1}


def test_one_boost_per_starved_step_however_many_were_owed() -> None:
    g = StarveGuard(BOUND)
    for t in (1, 2):
        assert not g.route(t, 0.0)
    g.ended(1, 1.0, cpu_s=0.0)
    g.ended(2, 1.0, cpu_s=0.0)
    assert g.route(3, 1.0) and not g.route(4, 1.0)


def test_a_step_outstanding_past_the_bound_boosts_the_next_submission() -> None:
    """Several jobs: one idle step has made no progress for the bound; the next background
    step (another job's) does not join it at SCHED_IDLE."""
    g = StarveGuard(BOUND)
    assert not g.route(1, 0.0)
    assert not g.route(2, 0.1)  # 0.1 s: within the bound
    assert g.route(3, 0.2) is True  # step 1 outstanding for 0.2 s
    assert g.route(4, 0.3) is True  # still: every submission meanwhile
    g.ended(1, 0.31, cpu_s=0.3)  # step 1 ran, it was not starved (0.01 s waiting)
    g.ended(2, 0.32, cpu_s=0.2)
    assert not g.route(5, 0.32)


def test_a_step_not_started_within_the_bound_is_moved() -> None:
    g = StarveGuard(BOUND)
    assert not g.route(1, 10.0)
    assert not g.overdue(1, 10.19)
    assert g.overdue(1, 10.21)
    g.moved(1)
    assert g.counts()["boosted"] == 1 and g.counts()["pending"] == 0
    assert not g.overdue(1, 11.0)
    g.ended(1, 11.0, cpu_s=0.0)  # a stale end of a moved step changes nothing
    assert not g.route(2, 11.0)


def test_zero_is_no_bound() -> None:
    g = StarveGuard(0.0)
    assert not g.route(1, 0.0)
    g.ended(1, 100.0, cpu_s=0.0)
    assert not g.route(2, 100.0) and not g.route(3, 200.0)
    assert not g.overdue(2, 1000.0)
    assert (g.boosted, g.starved) == (0, 0)
