"""The one-pass path of a repeated request (drivers/state_repeat.py ``repeat_begin`` and
``repeat_end``), on virtual time: its short-cut decides and records exactly what the
fast admission and a ``StepFinished`` decide and record, and every rule that can move
between two repeats (revocation, thermal hold-back, preemption by more important work,
a priority change, debouncing, the end of a grant, the quiet window) takes effect on
the very next repeat.

``Stream`` submits as the burst's thread does: the one pass while the state takes it,
else ``execute_fast``, else the full path; its steps end through ``repeat_end`` while
``completes`` says so, else a ``StepFinished``. The twin test runs the same random
script through that and through the fast path alone (``one_pass=False``) and compares
every instruction, report, decision and count: a short-cut that skipped a decision, a
report, a timer or a count fails it on the step where they part."""

from __future__ import annotations

import random
from typing import Any

import pytest

from npumanager.constants import ThermalStatus
from npumanager.drivers import events as ev
from npumanager.drivers.events import JobState
from npumanager.drivers.state import DriverParams
from npumanager.drivers.state_fast import FastKey
from npumanager.errors import GrantRevoked, InvalidArgument, NpuError
from npumanager.hal.types import EndReason, SchedulingConfig

from .state_harness import Harness, JobLife, reports

COMPLETED = EndReason.COMPLETED
#: Work at or below this effective priority is FOREGROUND (as the benches' camera's; an
#: unconfigured uid's priority lies below it too).
FG = 1000


def P(**kw: Any) -> DriverParams:
    return DriverParams(**{"foreground_priority": FG, **kw})


class Stream:
    """One burst's requests on conn ``conn``, model ``model``, as the shell submits them."""

    def __init__(self, h: Harness, conn: int, model: int, *, one_pass: bool = True) -> None:
        self.h, self.conn, self.model, self.one_pass = h, conn, model, one_pass
        self.key: FastKey | None = None
        self.ways: list[str] = []  # how each was admitted: one, fast, full

    def _note(self, ticket: int, out: list[ev.Instruction]) -> None:
        h = self.h
        h.state.validate()
        h.checker.jobs[ticket] = JobLife(steps=1)
        event = h.mk(ev.Event)
        h.checker.feed(event, out)
        h.checker.check_against(h.state)
        for ins in out:
            if isinstance(ins, ev.ArmTimer):
                h.timers[ins.key] = ins.at
        h.log.append((event, out))

    def submit(self) -> tuple[int, list[ev.Instruction]]:
        h = self.h
        ticket = next(h._tickets)
        sid = f"s{next(h._sid)}"
        if self.key is not None:
            if self.one_pass:
                # Anticipation's rehearsal first: it changes nothing (the twin test holds
                # it to that) and says whether the one pass will be taken.
                before = written(h.state)
                rehearsed = h.state.rehearse(self.key, h.now)
                assert written(h.state) == before  # (the straight line ran dry)
                step = h.state.repeat_begin(self.key, ticket, sid, h.now)
                assert rehearsed == (step is not None), (rehearsed, step)
                if step is not None:
                    self.ways.append("one")
                    self._note(ticket, [step])
                    return ticket, [step]
            out = h.state.execute_fast(self.key, ticket, sid, h.now)
            if out is not None:
                self.ways.append("fast")
                self._note(ticket, out)
                return ticket, out
            self.key = None
        self.ways.append("full")
        _, out = h.execute(self.conn, self.model, ticket=ticket)
        event = h.log[-1][0]
        assert isinstance(event, ev.ExecuteRequested)
        self.key = h.state.fast_key(event)
        return ticket, out

    def end(self, ticket: int, run_us: float = 100.0) -> list[ev.Instruction]:
        """The running step of ``ticket`` ends without an error."""
        h = self.h
        if self.one_pass and h.state.completes(ticket):
            event = h.mk(ev.StepFinished, ticket=ticket, run_us=run_us, error=None)
            out = h.state.repeat_end(ticket, run_us, event.stimulus_id, h.now)
            assert out is not None
            h.state.validate()
            h.checker.feed(event, out)
            h.checker.check_against(h.state)
            for ins in out:
                if isinstance(ins, ev.ArmTimer):
                    h.timers[ins.key] = ins.at
            h.log.append((event, out))
            return out
        return h.step_done(ticket, run_us=run_us)


def written(st: Any) -> tuple[Any, ...]:
    """Everything the one pass writes: the rehearsal, which runs its straight line dry
    (state_repeat ``_repeat_commit``), must leave all of it as it was."""
    return (st.decisions(), repr(st.stats), st.epoch, repr(st._work_ids), repr(st._seq),
            [(j.ticket, j.state, j.channel, j.reported) for j in st.jobs()],
            {c.conn: sorted(j.ticket for j in c.jobs) for c in st._clients.values()},
            {m.model_id: sorted(j.ticket for j in m.jobs) for m in st._models.values()},
            repr(st._debounce._bursts), st.ledger.held(), sorted(st._queue.running),
            None if st.quiet is None else repr(vars(st.quiet)), st._ev)


def started(out: list[ev.Instruction], ticket: int) -> bool:
    return any(isinstance(i, ev.RunStep) and i.ticket == ticket for i in out)


def warm(s: Stream, n: int = 3) -> None:
    """``n`` repeats run to their end, 10 ms apart (inside the debounce window)."""
    for _ in range(n):
        t, out = s.submit()
        assert started(out, t)
        s.h.advance(0.01)
        s.end(t)


# --- the short-cut is taken, and it is the fast path's decision ----------------------


def test_an_idle_devices_repeats_take_one_pass_with_the_fast_paths_outcome() -> None:
    h = Harness(debounce_ms=50, foreground_priority=FG)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    warm(s, 5)
    # The first was admitted in full, and reported; the second had no pending end to
    # continue (the first was still live... no: it ended, its end pending): one pass.
    assert s.ways == ["full", "one", "one", "one", "one"]
    assert [k for k, _, _ in h.reports()] == ["requested", "started"]
    assert all(h.finish_of(t).reason is COMPLETED for t in range(1, 6))
    assert h.state.stats.submitted == h.state.stats.completed == 5


# --- each rule that moves between two repeats bites on the very next one --------------


def test_a_revocation_bites_on_the_next_repeat() -> None:
    h = Harness(P(channels=1, enforce_admission=True), debounce_ms=50)
    h.connect(1)
    h.grant("g1", 1)
    m = h.prepare(1, "g1")
    s = Stream(h, 1, m)
    warm(s)
    h.end_grant("g1", revoked=True)
    with pytest.raises(GrantRevoked):
        s.submit()
    assert h.state.jobs() == []


def test_a_revocation_while_the_step_runs_makes_its_end_a_cancellation() -> None:
    h = Harness(P(channels=1, enforce_admission=True), debounce_ms=50)
    h.connect(1)
    h.grant("g1", 1)
    m = h.prepare(1, "g1")
    s = Stream(h, 1, m)
    warm(s)
    t, _ = s.submit()
    assert s.ways[-1] == "one"
    h.end_grant("g1", revoked=True)
    assert not h.state.completes(t) and h.state.repeat_end(t, 1.0, "x", h.now) is None
    s.end(t)
    assert h.finish_of(t).reason is not COMPLETED


def test_a_grant_that_ends_unrevoked_bites_on_the_next_repeat() -> None:
    h = Harness(P(channels=1, enforce_admission=True), debounce_ms=50)
    h.connect(1)
    h.grant("g1", 1)
    m = h.prepare(1, "g1")
    s = Stream(h, 1, m)
    warm(s)
    h.end_grant("g1", revoked=False)
    with pytest.raises(NpuError):
        s.submit()
    assert h.state.jobs() == []


def test_thermal_hold_back_bites_on_the_next_repeat() -> None:
    h = Harness(debounce_ms=50, thermal_cutoff=500, foreground_priority=FG)
    h.priorities(u1=900)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    warm(s)
    h.thermal(ThermalStatus.CRITICAL)
    t, out = s.submit()
    assert s.ways[-1] != "one" and not started(out, t)
    assert h.state.job_state(t) is JobState.QUEUED
    out = h.thermal(ThermalStatus.NONE)
    assert started(out, t)


def test_more_important_waiting_work_goes_first_on_the_next_repeat() -> None:
    # One channel. uid 1 streams at 900; uid 2's job at 100 arrives while a repeat runs.
    h = Harness(debounce_ms=50, foreground_priority=FG)
    h.priorities(u1=900, u2=100)
    m1, m2 = h.prepare(1), h.prepare(2)
    s = Stream(h, 1, m1)
    warm(s)
    mine, _ = s.submit()
    urgent, out = h.execute(2, m2)
    assert not started(out, urgent)  # the channel is the stream's
    out = s.end(mine)
    assert started(out, urgent)  # the stream's end dispatches the waiting work
    nxt, out = s.submit()
    # The device is busy: the next repeat waits behind it, not one pass around it.
    assert s.ways[-1] == "fast" and not started(out, nxt)
    out = h.step_done(urgent)
    assert started(out, nxt)


def test_more_important_queued_work_is_not_jumped_by_a_repeat() -> None:
    # Two channels, both busy with uid 3's work; uid 2 (100) queued before the repeat.
    h = Harness(P(channels=2, enforce_admission=False), debounce_ms=50)
    h.priorities(u1=500, u2=100, u3=100)
    m1, m2, m3 = h.prepare(1), h.prepare(2), h.prepare(3)
    s = Stream(h, 1, m1)
    warm(s)
    a, _ = h.execute(3, m3)
    mine, _ = s.submit()  # the other channel is free: it runs
    waiting, _ = h.execute(2, m2)
    s.end(mine)  # the freed channel goes to uid 2
    assert h.running() == [a, waiting]
    nxt, _ = s.submit()
    assert s.ways[-1] != "one" and h.state.job_state(nxt) is JobState.QUEUED


def test_a_priority_change_bites_on_the_next_repeat() -> None:
    h = Harness(debounce_ms=50, foreground_priority=FG)
    h.priorities(u1=100)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    warm(s)
    h.configs(SchedulingConfig(uid=1, app_priority=800), replace=False)
    t, _ = s.submit()
    assert s.ways[-1] == "full"
    job = next(j for j in h.state.jobs() if j.ticket == t)
    assert job.info.effective_priority == 800


@pytest.mark.parametrize("extra", [{}, {"background_share": True},
                                   {"background_lanes": 1, "channels": 2},
                                   {"channels": 2, "reserved_channels": 1}])
def test_a_background_stream_takes_one_pass_where_the_dispatch_weighs_nothing(
        extra: dict[str, Any]) -> None:
    """With background_one_pass, a BACKGROUND repeat on an idle device takes the one pass
    (embed22), its step a background one (without it, never); not where the full
    dispatch has something to weigh: the background's share, its lanes, or a channel
    background work may not take (another background job holds the one open to it)."""
    params = {"channels": 1, "enforce_admission": False, "foreground_priority": 200,
              "background_one_pass": True, **extra}
    h = Harness(DriverParams(**params), debounce_ms=50)
    h.priorities(u1=900)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    blocked = extra.get("reserved_channels")
    if blocked:
        m2 = h.prepare(1)
        other, out = h.execute(1, m2)  # a background job on the one channel open to it
        assert started(out, other)
        t, out = s.submit()
        assert not started(out, t) and "one" not in s.ways
        h.step_done(other)
        s.end(t)
        return
    for _ in range(4):
        t, out = s.submit()
        assert started(out, t)
        assert all(i.background for i in out if isinstance(i, ev.RunStep)), out
        s.h.advance(0.01)
        s.end(t)
    assert ("one" in s.ways) == (not extra), s.ways
    off = Harness(DriverParams(**{**params, "background_one_pass": False}), debounce_ms=50)
    off.priorities(u1=900)
    s = Stream(off, 1, off.prepare(1))
    warm(s, 4)
    assert "one" not in s.ways


def test_debouncing_bites_on_the_next_repeat() -> None:
    h = Harness(debounce_ms=50, foreground_priority=FG)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    warm(s)
    assert s.ways[-1] == "one"
    h.advance(0.06)  # the window passes: the burst's end is reported
    assert [k for k, _, _ in h.reports()] == ["requested", "started", "ended"]
    t, out = s.submit()
    # A new burst of work: its requested and started are reported, so not one pass.
    assert s.ways[-1] == "fast"
    assert [k for k, _, _ in reports(out)] == ["requested", "started"]
    s.end(t)


def test_nobody_listening_takes_one_pass_without_reports() -> None:
    h = Harness(listening=False, foreground_priority=FG)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    warm(s, 4)
    assert s.ways == ["full", "one", "one", "one"] and h.reports() == []


def test_the_job_bound_bites_on_a_one_pass_repeat() -> None:
    from npumanager.drivers.bounds import Limits
    from npumanager.errors import LimitExceeded

    h = Harness(DriverParams(channels=2, enforce_admission=False,
                             limits=Limits(max_jobs_per_uid=1), foreground_priority=FG),
                debounce_ms=50)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    warm(s)
    t, _ = s.submit()  # running; the uid holds its one job
    assert s.ways[-1] == "one"
    with pytest.raises(LimitExceeded):
        s.submit()
    h.state.validate()
    s.end(t)
    t, _ = s.submit()
    assert h.state.job_state(t) is JobState.RUNNING


def test_a_released_model_bites_on_the_next_repeat() -> None:
    h = Harness(debounce_ms=50, foreground_priority=FG)
    m = h.prepare(1)
    s = Stream(h, 1, m)
    warm(s)
    h.release(1, m)
    with pytest.raises(InvalidArgument):
        s.submit()


# --- the twin: one pass and the fast path, event for event ---------------------------


def _norm(out: list[ev.Instruction]) -> list[Any]:
    return [repr(i) for i in out]


def _inside(h: Harness) -> tuple[Any, ...]:
    """What the state holds that its instructions need not show (yet): the quiet
    window's paces and hold, the debounce bursts and timers, the ledger, every job."""
    st = h.state
    quiet = st.quiet
    return (None if quiet is None else (repr(quiet.streams), quiet.wake_at, quiet.holding),
            repr(st._debounce._bursts), st._timer_at, st._quiet_at, st.ledger.held(),
            [(j.ticket, j.state, j.channel, j.step, j.reported, j.cls, j.info)
             for j in st.jobs()], st.stats, st.epoch)


@pytest.mark.parametrize("seed", range(32))
def test_one_pass_records_what_the_fast_path_records(seed: int) -> None:
    rng = random.Random(seed)
    # (foreground_priority 200: the stream's repeats at 300 and 900 are BACKGROUND, and
    # take the one pass too where the dispatch has nothing to weigh for them)
    channels = rng.choice((1, 2, 3))
    params = dict(channels=channels, enforce_admission=True,
                  quiet_window_us=rng.choice((0.0, 1000.0)), thermal_cutoff=500,
                  foreground_priority=rng.choice((FG, 200)),
                  reserved_channels=rng.choice((0, channels - 1)),
                  background_share=rng.random() < 0.2,
                  background_lanes=rng.choice((0, 0, 1)),
                  background_one_pass=rng.random() < 0.8)
    listening = rng.random() < 0.8
    debounce = rng.choice((0, 50, 50))
    twins = []
    for one_pass in (True, False):
        h = Harness(DriverParams(**params), listening=listening, debounce_ms=debounce)
        for conn in (1, 2):
            h.connect(conn)
            h.grant(f"g{conn}", conn, request_id=conn)
        ms = [h.prepare(1, "g1"), h.prepare(2, "g2")]
        twins.append((h, Stream(h, 1, ms[0], one_pass=one_pass), ms))
    mine: list[int | None] = [None, None]
    others: list[list[int]] = [[], []]
    for _ in range(400):
        op = rng.random()
        prio = rng.choice((100, 300, 900))
        dt = rng.choice((0.001, 0.01, 0.033, 0.06))
        status = rng.choice((ThermalStatus.NONE, ThermalStatus.CRITICAL))
        pick = rng.random()
        outs = []
        for i, (h, s, ms) in enumerate(twins):
            try:
                if op < 0.5:
                    t = mine[i]
                    if t is None:
                        mine[i], out = s.submit()
                    elif h.state.job_state(t) is JobState.RUNNING:
                        out = s.end(t)
                        mine[i] = None
                    else:
                        out = ["waits"]  # type: ignore[list-item]
                elif op < 0.6:
                    t, out = h.execute(2, ms[1], prio=prio)
                    others[i].append(t)
                elif op < 0.72:
                    run = [t for t in others[i] if h.state.job_state(t) is JobState.RUNNING]
                    out = h.step_done(run[int(pick * len(run))]) if run else []
                    if mine[i] is not None and h.state.job_state(mine[i]) is None:
                        mine[i] = None
                elif op < 0.92:
                    out = h.advance(dt)
                elif op < 0.95:
                    out = h.thermal(status)
                elif op < 0.98:
                    out = h.configs(SchedulingConfig(uid=1, app_priority=prio),
                                    replace=False)
                else:
                    out = h.cancel(2, ms[1])
                    others[i] = [t for t in others[i] if h.state.job_state(t) is not None]
            except NpuError as exc:
                out = [f"raised {type(exc).__name__}"]  # type: ignore[list-item]
            outs.append(_norm(out))
            others[i] = [t for t in others[i] if h.state.job_state(t) is not None]
            if mine[i] is not None and h.state.job_state(mine[i]) is None:
                mine[i] = None
        assert outs[0] == outs[1], (seed, twins[0][1].ways[-3:])
        assert _inside(twins[0][0]) == _inside(twins[1][0]), (seed, twins[0][1].ways[-3:])
    (a, sa, _), (b, sb, _) = twins
    # (listening with no debounce window, every execution is reported: never one pass)
    if params["foreground_priority"] == FG:
        assert ("one" in sa.ways) == (not listening or debounce > 0)
    assert "one" not in sb.ways
    assert a.state.decisions() == b.state.decisions()
    assert a.state.stats == b.state.stats
    assert a.reports() == b.reports()
    assert a.state.epoch == b.state.epoch
