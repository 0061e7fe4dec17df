"""DriverState's fast admission of a repeated request (drivers/state_fast.py), on virtual
time: the shell's burst thread admits a repeat with what the full admission of the same
request found (``fast_key``) while the state's epoch stands still, else in full. Each
test below drives a stream the way the shell does (``Stream.submit``) and shows that a
scheduling rule still bites on the fast path: effective priority, preemption between
steps, thermal hold-back, revocation, debouncing, the job bound. Each fails if the fast
path admitted with what it found before the change (or skipped the shared admission)."""

from __future__ import annotations

import pytest

from npumanager.constants import ThermalStatus
from npumanager.drivers import events as ev
from npumanager.drivers.bounds import Limits
from npumanager.drivers.events import JobState
from npumanager.drivers.state import DriverParams
from npumanager.drivers.state_fast import FastKey
from npumanager.errors import GrantRevoked, InvalidArgument, LimitExceeded
from npumanager.hal.types import EndReason, SchedulingConfig

from .state_harness import PAUSED, Harness, JobLife, reports

COMPLETED = EndReason.COMPLETED


class Stream:
    """One burst's requests, submitted as the shell does: fast while the key holds, else
    an ExecuteRequested (whose admission makes the next key)."""

    def __init__(self, h: Harness, conn: int, model: int, *, steps: int = 1,
                 prio: int = 0) -> None:
        self.h, self.conn, self.model, self.steps, self.prio = h, conn, model, steps, prio
        self.key: FastKey | None = None
        self.fast = 0  # executions admitted fast
        self.full = 0

    def submit(self) -> int:
        h = self.h
        ticket = next(h._tickets)
        if self.key is not None:
            out = h.state.execute_fast(self.key, ticket, f"s{next(h._sid)}", h.now)
            if out is not None:
                self.fast += 1
                h.state.validate()
                h.checker.jobs[ticket] = JobLife(steps=self.steps)
                event = h.mk(ev.Event)
                h.checker.feed(event, out)
                h.checker.check_against(h.state)
                for ins in out:
                    if isinstance(ins, ev.ArmTimer):
                        h.timers[ins.key] = ins.at
                h.log.append((event, out))
                return ticket
            self.key = None
        self.full += 1
        h.execute(self.conn, self.model, steps=self.steps, prio=self.prio, ticket=ticket)
        event = h.log[-1][0]
        assert isinstance(event, ev.ExecuteRequested)
        self.key = h.state.fast_key(event)
        return ticket

    def run(self, n: int = 1) -> list[int]:
        """``n`` executions, each run to its end (one channel, nothing else queued)."""
        done = []
        for _ in range(n):
            t = self.submit()
            assert self.h.running() == [t]
            for _ in range(self.steps):
                self.h.step_done(t, run_us=1000.0)
            done.append(t)
        return done


def test_repeats_are_admitted_fast_while_only_neutral_events_happen() -> None:
    h = Harness(debounce_ms=0)
    m, other = h.prepare(1), h.prepare(2)
    s = Stream(h, 1, m)
    s.run(3)
    # Another uid's execution, a new pool, a new model: nothing the checks read.
    t, _ = h.execute(2, other)
    h.step_done(t)
    h.handle(h.mk(ev.PoolRegistered, conn=1, size=4096))
    h.prepare(3)
    s.run(3)
    assert (s.full, s.fast) == (1, 5)
    assert all(h.finish_of(t).reason == COMPLETED for t in range(1, 8))


def test_a_priority_change_bites_on_the_next_repeat() -> None:
    # One channel, busy; uid 1 streams, uid 2 waits at app priority 500.
    h = Harness(debounce_ms=0)
    h.priorities(u1=100, u2=500, u3=100)
    m1, m2, m3 = h.prepare(1), h.prepare(2), h.prepare(3)
    s = Stream(h, 1, m1)
    s.run(2)
    # npud makes uid 1 less important than uid 2.
    h.configs(SchedulingConfig(uid=1, app_priority=900), replace=False)
    busy, _ = h.execute(3, m3)
    waiting, _ = h.execute(2, m2)
    mine = s.submit()
    assert h.state.job_state(mine) is JobState.QUEUED
    h.step_done(busy)
    # uid 2 (500) runs before uid 1 (now 900): with the old key's 100 it would not.
    assert h.running() == [waiting]
    assert s.full == 2, "the priority change sent the repeat through the full path"
    job = next(j for j in h.state.jobs() if j.ticket == mine)
    assert job.info.effective_priority == 900


def test_more_important_work_preempts_a_fast_admitted_job_between_steps() -> None:
    h = Harness(debounce_ms=0)
    h.priorities(u1=900, u2=100)
    m1, m2 = h.prepare(1), h.prepare(2)
    s = Stream(h, 1, m1, steps=3)
    s.run(1)
    t = s.submit()
    assert s.fast == 1
    h.step_done(t)  # step 1 of 3: still alone, it keeps its channel
    urgent, _ = h.execute(2, m2)
    out = h.step_done(t)  # step 2 ends with uid 2's job waiting: paused for it
    assert h.state.job_state(t) is JobState.PAUSED
    assert h.running() == [urgent]
    work = next(j for j in h.state.jobs() if j.ticket == t).info.id
    assert ("ended", work, PAUSED) in reports(out)


def test_thermal_hold_back_bites_on_the_next_repeat() -> None:
    h = Harness(debounce_ms=0, thermal_cutoff=500)
    h.priorities(u1=900)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    s.run(2)
    h.thermal(ThermalStatus.CRITICAL)
    t = s.submit()
    assert h.running() == [] and h.state.job_state(t) is JobState.QUEUED
    out = h.thermal(ThermalStatus.NONE)
    assert h.running() == [t] and any(isinstance(i, ev.RunStep) for i in out)


def test_a_revoked_grant_bites_on_the_next_repeat() -> None:
    h = Harness(DriverParams(channels=1, enforce_admission=True), debounce_ms=0)
    h.connect(1)
    h.grant("g1", 1)
    m = h.prepare(1, "g1")
    s = Stream(h, 1, m)
    s.run(2)
    h.end_grant("g1", revoked=True)
    with pytest.raises(GrantRevoked):
        s.submit()
    assert h.state.jobs() == []


def test_a_released_model_bites_on_the_next_repeat() -> None:
    h = Harness(debounce_ms=0)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    s.run(2)
    h.release(1, m)
    with pytest.raises(InvalidArgument, match="no prepared model"):
        s.submit()


def test_fast_repeats_are_debounced_like_any_work() -> None:
    h = Harness(debounce_ms=50)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    first = s.run(1)[0]
    for _ in range(4):  # inside the window: no requested/started, no end yet
        h.advance(0.01)
        s.run(1)
    assert s.fast == 4
    kinds = [k for k, _, _ in h.reports()]
    assert kinds == ["requested", "started"], h.reports()
    h.advance(0.051)  # the window passes: one end, the stream's last
    assert [k for k, _, _ in h.reports()] == ["requested", "started", "ended"]
    # A repeat after the window is a new burst of work: reported again, fast or not.
    s.run(1)
    assert s.fast == 5
    assert [k for k, _, _ in h.reports()][3:] == ["requested", "started"]
    assert first == 1


def test_the_job_bound_bites_on_a_fast_repeat() -> None:
    h = Harness(DriverParams(channels=1, enforce_admission=False,
                             limits=Limits(max_jobs_per_uid=2)), debounce_ms=0)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    s.run(1)
    a = s.submit()  # running
    b = s.submit()  # queued: the uid holds 2 jobs now
    assert s.fast == 2 and h.state.job_state(b) is JobState.QUEUED
    with pytest.raises(LimitExceeded):
        s.submit()
    h.step_done(a)
    assert h.running() == [b]


def _completes_agrees(h: Harness, ticket: int) -> bool:
    """``completes(ticket)``, checked against what the step's end then does: the shell
    answers a burst execution on that word before it submits the end."""
    said = h.state.completes(ticket)
    out = h.step_done(ticket)
    ended = [i for i in out if isinstance(i, ev.FinishJob) and i.ticket == ticket]
    assert said == (len(ended) == 1 and ended[0].reason is COMPLETED), (said, out)
    return said


def test_completes_says_whether_the_end_of_a_step_completes_its_job() -> None:
    """The word the burst's early answer rests on: a running last step nobody cancelled
    completes; a step with more to come, a cancelled one and one whose grant was revoked
    under it do not, nor does a queued job (each checked against the StepFinished that
    follows)."""
    h = Harness(DriverParams(channels=2, enforce_admission=True), debounce_ms=0)
    h.connect(1)
    h.connect(2)
    h.grant("g1", 1)
    h.grant("g2", 2, request_id=2)
    m = h.prepare(1, "g1")
    s = Stream(h, 1, m)
    s.run(1)
    t = s.submit()
    assert s.fast == 1 and _completes_agrees(h, t)
    # Three steps: the first two end with more to come.
    multi, _ = h.execute(1, m, steps=3)
    assert not _completes_agrees(h, multi)
    assert not _completes_agrees(h, multi)
    assert _completes_agrees(h, multi)
    # Cancelled while its step runs: the step's end is the cancellation.
    t = s.submit()
    h.cancel(1, m)
    assert not _completes_agrees(h, t)
    # Queued behind a busy device: nothing of it runs, so no step of it can end.
    m2 = h.prepare(2, "g2")
    a, _ = h.execute(2, m2)
    b, _ = h.execute(2, m2)
    queued = s.submit()
    assert h.state.job_state(queued) is JobState.QUEUED and not h.state.completes(queued)
    h.step_done(a)
    h.step_done(b)
    assert h.state.job_state(queued) is JobState.RUNNING
    # Its grant revoked while the step runs.
    h.end_grant("g1", revoked=True)
    assert not _completes_agrees(h, queued)
    assert not h.state.completes(12345)  # no such job
