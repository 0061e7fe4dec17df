"""Property test: random submits, step completions, failures, cancels, thermal changes and
clock advances never break the scheduler's invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumanager.constants import ThermalStatus
from npumanager.drivers.scheduler import DONE, QUEUED, RUNNING, Job, Scheduler
from npumanager.hal.types import EndReason, SchedulingConfig, StartReason, WorkInfo
from npumanager.testing import VirtualClock


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, WorkInfo, int]] = []
        self.finished: list[Job] = []
        self.scheduler: Scheduler | None = None

    def run_step(self, job: Job, channel: int) -> None:
        s = self.scheduler
        assert s is not None
        # Thermal hold-back: nothing above the cutoff starts a step at CRITICAL and above.
        assert not (s.thermal >= ThermalStatus.CRITICAL and job.info.effective_priority > 500)

    def abort_step(self, job: Job) -> None:
        pass

    def job_finished(self, job: Job) -> None:
        self.finished.append(job)

    def work_event(self, kind: str, info: WorkInfo, reason: int) -> None:
        self.events.append((kind, info, reason))


ops = st.lists(st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 4), st.integers(0, 1000), st.integers(1, 4)),
    st.tuples(st.just("done"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("thermal"), st.sampled_from(list(ThermalStatus))),
    st.tuples(st.just("advance"), st.integers(0, 120)),
), max_size=60)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(ops=ops, channels=st.integers(1, 3), debounce=st.sampled_from([0, 50]))
def test_scheduler_invariants(ops: list[tuple[object, ...]], channels: int,
                              debounce: int) -> None:
    clock = VirtualClock()
    sink = Sink()
    s = Scheduler(channels, clock, sink, debounce_ms=debounce, thermal_cutoff=500)
    sink.scheduler = s
    s.set_configs([SchedulingConfig(uid=1, app_priority=100),
                   SchedulingConfig(uid=2, app_priority=600)])
    jobs: list[Job] = []
    for op in ops:
        kind = op[0]
        if kind == "submit":
            _, uid, prio, steps = op
            jobs.append(s.submit(uid=int(uid), job_priority=int(prio), steps=int(steps)))
        elif kind == "done":
            running = [j for j in jobs if j.state == RUNNING]
            if running:
                j = running[int(op[1]) % len(running)]
                s.step_done(j, RuntimeError("x") if op[2] and j.step == 0 else None)
        elif kind == "cancel" and jobs:
            s.cancel(jobs[int(op[1]) % len(jobs)], EndReason.CANCELLED_USER)
        elif kind == "thermal":
            s.set_thermal(ThermalStatus(op[1]))
        elif kind == "advance":
            clock.advance(int(op[1]) / 1000)
            s.fire_due()
        running = [j for j in jobs if j.state == RUNNING]
        assert len(running) <= channels
        assert len({j.channel for j in running}) == len(running)
        # Work conservation: a free channel never coexists with dispatchable queued work.
        queued = [j for j in jobs if j.state == QUEUED and s._dispatchable(j)]
        assert not (queued and len(running) < channels)
    # Drain: finish everything; every job ends exactly once.
    s.set_thermal(ThermalStatus.NONE)
    for _ in range(1000):
        running = [j for j in jobs if j.state == RUNNING]
        if not running:
            break
        s.step_done(running[0])
    clock.advance(1.0)
    s.fire_due()
    assert all(j.state == DONE for j in jobs)
    assert sorted(id(j) for j in sink.finished) == sorted(id(j) for j in jobs)
    ids = [j.id for j in jobs]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # Lifecycle order per work item; its timestamps never go backwards. (A debounced
    # end keeps the time its work ended, so across uids the stream may interleave.)
    seen: dict[int, list[str]] = {}
    last_ts: dict[int, int] = {}
    for k, info, reason in sink.events:
        assert info.timestamp_ms >= last_ts.get(info.id, 0)
        last_ts[info.id] = info.timestamp_ms
        seen.setdefault(info.id, []).append(k)
        if k == "started" and reason == StartReason.INITIAL:
            assert seen[info.id][0] == "requested"
    for kinds in seen.values():
        if "requested" in kinds:
            assert kinds[0] == "requested"
    # Every reported burst ends: the last event of each uid is an end.
    for uid in {info.uid for _, info, _ in sink.events}:
        last = [k for k, info, _ in sink.events if info.uid == uid][-1]
        assert last == "ended"
    assert s.next_deadline() is None
