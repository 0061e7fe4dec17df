"""The driver scheduler on a virtual clock: ordering, preemption, cancel, fail, debounce,
thermal hold-back. Steps are finished by hand, so nothing here sleeps."""

from __future__ import annotations

from typing import Any

import pytest

from npumanager.constants import ThermalStatus
from npumanager.drivers.scheduler import Job, Scheduler
from npumanager.errors import AttributionDenied, DirectAccessDenied, IllegalArgument
from npumanager.hal.types import EndReason, SchedulingConfig, StartReason, WorkInfo
from npumanager.testing import VirtualClock


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, WorkInfo, int]] = []
        self.started: list[tuple[Job, int]] = []
        self.finished: list[Job] = []
        self.aborted: list[Job] = []

    def run_step(self, job: Job, channel: int) -> None:
        self.started.append((job, channel))

    def abort_step(self, job: Job) -> None:
        self.aborted.append(job)

    def job_finished(self, job: Job) -> None:
        self.finished.append(job)

    def work_event(self, kind: str, info: WorkInfo, reason: int) -> None:
        self.events.append((kind, info, reason))

    def kinds(self) -> list[tuple[str, int, int]]:
        """(kind, work id, reason) for every event."""
        return [(k, i.id, r) for k, i, r in self.events]

    def running(self) -> list[Job]:
        out: list[Job] = []
        for j, _ in self.started:
            if j.state == "running" and j not in out:
                out.append(j)
        return out


def make(channels: int = 1, debounce_ms: int = 50, **kw: Any) -> tuple[Scheduler, Sink,
                                                                         VirtualClock]:
    clock = VirtualClock()
    sink = Sink()
    return Scheduler(channels, clock, sink, debounce_ms=debounce_ms, **kw), sink, clock


def test_effective_priority_is_app_priority_plus_clamped_job_priority() -> None:
    s, _sink, _ = make()
    s.set_configs([SchedulingConfig(uid=10, app_priority=250, min_priority=100,
                                    max_priority=300)])
    assert s.effective_priority(10, None, 500) == 550
    assert s.effective_priority(10, None, 0) == 350
    assert s.effective_priority(10, None, 200) == 450


def test_unknown_uid_gets_priority_1000_direct_access_no_attribution() -> None:
    s, _sink, _ = make()
    job = s.submit(uid=77, job_priority=5)
    assert job.info.effective_priority == 1005
    with pytest.raises(AttributionDenied):
        s.submit(uid=77, original_uid=78)


def test_no_direct_access_is_refused_without_events() -> None:
    s, sink, _ = make()
    s.set_configs([SchedulingConfig(uid=10, app_priority=100, has_direct_access=False)])
    with pytest.raises(DirectAccessDenied):
        s.submit(uid=10)
    assert sink.events == []


def test_attributed_work_uses_original_uids_priority() -> None:
    s, _sink, _ = make()
    s.set_configs([
        SchedulingConfig(uid=10, app_priority=400, can_attribute_other_uid=True),
        SchedulingConfig(uid=20, app_priority=100, max_priority=50),
    ])
    job = s.submit(uid=10, original_uid=20, job_priority=500)
    assert job.info.effective_priority == 150
    assert job.info.original_uid == 20 and job.info.uid == 10


def test_invalid_configs_change_nothing() -> None:
    s, _, _ = make()
    good = [SchedulingConfig(uid=1, app_priority=100)]
    s.set_configs(good)
    for bad in (
        [SchedulingConfig(uid=2, app_priority=-1)],
        [SchedulingConfig(uid=2, app_priority=1001)],
        [SchedulingConfig(uid=2, app_priority=1, min_priority=600, max_priority=500)],
        [SchedulingConfig(uid=2, app_priority=1), SchedulingConfig(uid=2, app_priority=2)],
    ):
        with pytest.raises(IllegalArgument):
            s.set_configs(bad)
        with pytest.raises(IllegalArgument):
            s.update_configs([SchedulingConfig(uid=1, app_priority=5), *bad])
        assert s.configs == {1: good[0]}


def test_update_upserts_and_set_replaces() -> None:
    s, _, _ = make()
    s.set_configs([SchedulingConfig(uid=1, app_priority=100)])
    s.update_configs([SchedulingConfig(uid=2, app_priority=200),
                      SchedulingConfig(uid=1, app_priority=150)])
    assert {u: c.app_priority for u, c in s.configs.items()} == {1: 150, 2: 200}
    s.set_configs([SchedulingConfig(uid=3, app_priority=300)])
    assert set(s.configs) == {3}


def test_lowest_effective_priority_runs_first_fifo_on_ties() -> None:
    s, sink, _ = make(channels=1)
    blocker = s.submit(uid=1, job_priority=0)
    a = s.submit(uid=2, job_priority=500)
    b = s.submit(uid=3, job_priority=100)
    c = s.submit(uid=4, job_priority=100)
    order = []
    for _ in range(4):
        job = sink.running()[0]
        order.append(job)
        s.step_done(job)
    assert order == [blocker, b, c, a]


def test_lifecycle_requested_started_ended_after_debounce() -> None:
    s, sink, clock = make(debounce_ms=50)
    job = s.submit(uid=1, job_priority=7)
    s.step_done(job)
    assert sink.kinds() == [("requested", job.id, 0), ("started", job.id, StartReason.INITIAL)]
    clock.advance(0.049)
    s.fire_due()
    assert len(sink.events) == 2
    clock.advance(0.002)
    s.fire_due()
    assert sink.kinds()[-1] == ("ended", job.id, EndReason.COMPLETED)
    stamps = [i.timestamp_ms for _, i, _ in sink.events]
    assert stamps == sorted(stamps)
    assert all(i.job_priority == 7 for _, i, _ in sink.events)


def test_burst_within_debounce_window_reports_once() -> None:
    s, sink, clock = make(debounce_ms=50)
    first = s.submit(uid=1)
    s.step_done(first)
    clock.advance(0.02)
    s.fire_due()
    second = s.submit(uid=1)  # inside the window: continues the burst silently
    s.step_done(second)
    assert [k for k, _, _ in sink.events] == ["requested", "started"]
    clock.advance(0.06)
    s.fire_due()
    assert sink.kinds()[-1] == ("ended", second.id, EndReason.COMPLETED)
    assert [k for k, _, _ in sink.events] == ["requested", "started", "ended"]
    assert s.next_deadline() is None
    # After the window a new request is reported again.
    third = s.submit(uid=1)
    assert sink.kinds()[-2:] == [("requested", third.id, 0),
                                 ("started", third.id, StartReason.INITIAL)]


def test_other_uid_is_not_suppressed_by_a_debouncing_uid() -> None:
    s, sink, _clock = make(channels=2)
    a = s.submit(uid=1)
    s.step_done(a)
    b = s.submit(uid=2)
    assert ("requested", b.id, 0) in sink.kinds()


def test_zero_debounce_reports_end_at_once() -> None:
    s, sink, _ = make(debounce_ms=0)
    job = s.submit(uid=1)
    s.step_done(job)
    assert sink.kinds()[-1] == ("ended", job.id, EndReason.COMPLETED)


def test_multi_step_job_pauses_for_more_important_work_and_resumes() -> None:
    s, sink, _ = make(channels=1, debounce_ms=0)
    s.set_configs([SchedulingConfig(uid=1, app_priority=400),
                   SchedulingConfig(uid=2, app_priority=100)])
    bg = s.submit(uid=1, steps=3)
    s.step_done(bg)  # step 1 done, nothing waiting: continues without events
    assert sink.running() == [bg]
    fg = s.submit(uid=2)
    assert sink.running() == [bg]  # a step is never interrupted
    s.step_done(bg)  # step 2 done: yields to fg
    assert sink.running() == [fg]
    assert ("ended", bg.id, EndReason.PAUSED) in sink.kinds()
    paused_at = sink.kinds().index(("ended", bg.id, EndReason.PAUSED))
    assert sink.kinds()[paused_at + 1] == ("started", fg.id, StartReason.INITIAL)
    s.step_done(fg)
    assert sink.running() == [bg]
    assert ("started", bg.id, StartReason.RESUMED) in sink.kinds()
    s.step_done(bg)
    assert bg.end_reason == EndReason.COMPLETED and bg.step == 3


def test_equal_priority_later_work_does_not_preempt() -> None:
    s, sink, _ = make(channels=1, debounce_ms=0)
    bg = s.submit(uid=1, steps=2)
    other = s.submit(uid=2)  # same effective priority (both unknown uids, job 0)
    s.step_done(bg)
    assert sink.running() == [bg]
    s.step_done(bg)
    assert sink.running() == [other]


def test_cancel_queued_and_running() -> None:
    s, sink, _ = make(channels=1, debounce_ms=0)
    running = s.submit(uid=1)
    queued = s.submit(uid=2)
    s.cancel(queued, EndReason.CANCELLED_USER)
    assert queued.end_reason == EndReason.CANCELLED_USER
    s.cancel(running, EndReason.CANCELLED_SYSTEM)
    assert sink.aborted == [running] and running.state == "running"
    s.step_done(running, RuntimeError("aborted"))
    assert running.end_reason == EndReason.CANCELLED_SYSTEM
    assert ("ended", running.id, EndReason.CANCELLED_SYSTEM) in sink.kinds()


def test_backend_error_ends_failed_with_the_error() -> None:
    s, sink, _ = make(debounce_ms=0)
    job = s.submit(uid=1)
    err = ValueError("bad shape")
    s.step_done(job, err)
    assert job.end_reason == EndReason.FAILED and job.error is err
    assert sink.kinds()[-1] == ("ended", job.id, EndReason.FAILED)


def test_thermal_critical_holds_back_low_priority_work() -> None:
    s, sink, _ = make(channels=1, debounce_ms=0, thermal_cutoff=500)
    s.set_configs([SchedulingConfig(uid=1, app_priority=100),
                   SchedulingConfig(uid=2, app_priority=900)])
    s.set_thermal(ThermalStatus.CRITICAL)
    low = s.submit(uid=2)
    assert sink.running() == [] and low.state == "queued"
    high = s.submit(uid=1)
    assert sink.running() == [high]
    s.step_done(high)
    assert sink.running() == []
    s.set_thermal(ThermalStatus.SEVERE)
    assert sink.running() == [low]


def test_thermal_pauses_multi_step_low_priority_job_between_steps() -> None:
    s, sink, _ = make(channels=1, debounce_ms=0)
    s.set_configs([SchedulingConfig(uid=2, app_priority=900)])
    job = s.submit(uid=2, steps=3)
    s.set_thermal(ThermalStatus.EMERGENCY)
    s.step_done(job)
    assert ("ended", job.id, EndReason.PAUSED) in sink.kinds()
    assert job.state == "queued"
    s.set_thermal(ThermalStatus.NONE)
    assert ("started", job.id, StartReason.RESUMED) in sink.kinds()


def test_ids_increase_and_channels_fill() -> None:
    s, sink, _ = make(channels=3)
    jobs = [s.submit(uid=i) for i in range(5)]
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
    assert len(sink.running()) == 3
    assert sorted(ch for _, ch in sink.started) == [0, 1, 2]
    assert "3/3 channels busy" in repr(s)
