"""The HAL conformance checks (the VTS analog). Each takes a :class:`Session`
and raises AssertionError (or the driver's error) when the driver misbehaves."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from npumanager.errors import (
    AttributionDenied,
    DirectAccessDenied,
    GrantRequired,
    GrantRevoked,
    IllegalArgument,
)
from npumanager.hal.types import EndReason, SchedulingConfig, StartReason, WorkInfo
from npumanager.testing.conformance.harness import Session

Check = Callable[[Session], None]
CHECKS: dict[str, Check] = {}


def check(fn: Check) -> Check:
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def _count_at_least(kind: str, n: int) -> Callable[[list[tuple[str, WorkInfo, int]]], bool]:
    return lambda ev: sum(k == kind for k, _, _ in ev) >= n


def _cfg(s: Session, **kw: object) -> SchedulingConfig:
    return SchedulingConfig(uid=s.uid, **kw)  # type: ignore[arg-type]


@check
def check_config_validation_and_atomicity(s: Session) -> None:
    s.reset()
    s.hal.set_scheduling_configs([_cfg(s, app_priority=100)])
    s.hal.update_scheduling_configs([SchedulingConfig(uid=4242, app_priority=300)])
    blocked = [_cfg(s, app_priority=100, has_direct_access=False)]
    s.hal.set_scheduling_configs(blocked)
    bad_tables = [
        [SchedulingConfig(uid=4242, app_priority=-1)],
        [SchedulingConfig(uid=4242, app_priority=-100)],
        [SchedulingConfig(uid=4242, app_priority=1001)],
        [SchedulingConfig(uid=4242, app_priority=10, min_priority=700, max_priority=600)],
        [SchedulingConfig(uid=4242, app_priority=1), SchedulingConfig(uid=4242, app_priority=2)],
    ]
    model = s.prepare()
    for bad in bad_tables:
        # The valid entry first: an atomic call must not apply it either.
        for call in (s.hal.set_scheduling_configs, s.hal.update_scheduling_configs):
            try:
                call([_cfg(s, app_priority=100), *bad])
            except IllegalArgument:
                pass
            else:
                raise AssertionError(f"{call.__name__} accepted {bad}")
        try:
            model.execute(s.target.inputs)
        except DirectAccessDenied:
            pass
        else:
            raise AssertionError("a rejected call changed the table")


@check
def check_unconfigured_uid_defaults(s: Session) -> None:
    s.reset()
    model = s.prepare()
    model.execute(s.target.inputs, job_priority=5)  # direct access allowed
    events = s.log.wait_for(lambda ev: any(k == "ended" for k, _, _ in ev))
    info = next(i for k, i, _ in events if k == "requested")
    assert info.effective_priority == 1005, f"unknown uid: effective {info.effective_priority}"
    try:
        model.execute(s.target.inputs, original_uid=s.uid + 1)
    except AttributionDenied:
        pass
    else:
        raise AssertionError("an unconfigured uid attributed work to another uid")


@check
def check_callback_replace_and_clear(s: Session) -> None:
    from npumanager.hal.client import connect_scheduling
    from npumanager.testing.conformance.harness import EventLog

    s.reset()
    model = s.prepare()
    other_log = EventLog()
    with connect_scheduling(s.target.name, s.target.runtime_dir) as other:
        other.set_callback(other_log, 0)  # replaces the session's callback
        model.execute(s.target.inputs)
        other_log.wait_for(lambda ev: any(k == "ended" for k, _, _ in ev))
        assert s.log.snapshot() == [], "a replaced callback still got events"
        other.set_callback(None)
        model.execute(s.target.inputs)
        time.sleep(0.1)
        assert len(other_log.snapshot()) == 3, "a cleared callback still got events"
        assert s.log.snapshot() == []
    s.reset()


@check
def check_lifecycle_order_and_fields(s: Session) -> None:
    import os

    s.reset()
    s.hal.set_scheduling_configs([_cfg(s, app_priority=250)])
    model = s.prepare()
    t0 = time.monotonic()
    model.execute(s.target.inputs, job_priority=500, feature_id=77)
    events = s.log.wait_for(lambda ev: any(k == "ended" for k, _, _ in ev))
    assert time.monotonic() - t0 < 5.0
    assert [(k, r) for k, _, r in events] == [
        ("requested", 0), ("started", StartReason.INITIAL), ("ended", EndReason.COMPLETED),
    ], events
    infos = [i for _, i, _ in events]
    assert len({i.id for i in infos}) == 1
    for i in infos:
        assert i.job_priority == 500
        assert i.effective_priority >= 250 and i.effective_priority == 750
        assert i.uid == s.uid and i.original_uid == s.uid
        assert i.debug_pid == os.getpid()
        assert i.debug_feature_id == 77
    stamps = [i.timestamp_ms for i in infos]
    assert stamps == sorted(stamps), stamps
    model.execute(s.target.inputs)
    later = s.log.wait_for(lambda ev: len(ev) >= 6)
    assert later[3][1].id > infos[0].id, "work ids must increase"


@check
def check_job_priority_raises_effective_priority(s: Session) -> None:
    s.reset()
    s.hal.set_scheduling_configs([_cfg(s, app_priority=250)])
    model = s.prepare()
    model.execute(s.target.inputs, job_priority=1000)
    model.execute(s.target.inputs, job_priority=0)
    events = s.log.wait_for(lambda ev: sum(k == "ended" for k, _, _ in ev) >= 2)
    hi, lo = [i.effective_priority for k, i, _ in events if k == "requested"]
    assert hi > lo, (hi, lo)


@check
def check_effective_priority_ordering_and_thermal_hold_back(s: Session) -> None:
    """Work queued together starts lowest effective priority first. Thermal CRITICAL holds
    back work above the cutoff (500) so both jobs are queued when it lifts."""
    from npumanager.constants import ThermalStatus
    from npumanager.proto.v1 import driver_pb2 as pb

    s.reset()
    s.hal.set_scheduling_configs([_cfg(s, app_priority=600)])
    model = s.prepare()
    s.admin.call("hal.set_thermal_status", pb.ThermalStatusMsg(status=ThermalStatus.CRITICAL))
    threads = []
    try:
        for prio, n in ((500, 1), (100, 2)):
            th = threading.Thread(target=model.execute, args=(s.target.inputs,),
                                  kwargs={"job_priority": prio})
            th.start()
            threads.append(th)
            s.log.wait_for(_count_at_least("requested", n))
        time.sleep(0.05)
        assert not any(k == "started" for k, _, _ in s.log.snapshot()), "not held back"
    finally:
        s.admin.call("hal.set_thermal_status", pb.ThermalStatusMsg(status=ThermalStatus.NONE))
        for th in threads:
            th.join(30)
    # The starts reach the callback connection, not the one the executions answered on:
    # wait for them rather than read what has arrived so far.
    events = s.log.wait_for(_count_at_least("started", 2))
    starts = [i.job_priority for k, i, _ in events if k == "started"]
    assert starts == [100, 500], f"the more important job must start first: {starts}"


@check
def check_multi_step_job_pauses_and_resumes(s: Session) -> None:
    s.reset()
    channels = s.device.capabilities.channels
    bg = s.prepare(step=True)
    fg = s.prepare()
    with s.background(bg, channels, steps=10_000, job_priority=1000):
        s.log.wait_for(lambda ev: sum(k == "started" for k, _, _ in ev) >= channels)
        fg.execute(s.target.inputs, job_priority=0)
        events = s.log.wait_for(lambda ev: any(
            k == "started" and r == StartReason.RESUMED for k, _, r in ev))
    paused = [i.id for k, i, r in events if k == "ended" and r == EndReason.PAUSED]
    resumed = [i.id for k, i, r in events if k == "started" and r == StartReason.RESUMED]
    assert paused and resumed and resumed[0] in paused, events
    ended = s.log.wait_for(lambda ev: sum(
        k == "ended" and r == EndReason.CANCELLED_USER for k, _, r in ev) >= channels)
    assert ended


@check
def check_debouncing(s: Session) -> None:
    # A window two executions fit in on a loaded machine too: with 300 ms, two executions
    # of a warm OpenVINO model did not (the suite with 4 workers on 2 cores).
    window_ms = 1000
    s.reset()
    model = s.prepare()
    # Warm: a backend's first execution may compile or allocate (reported at once: 0 ms).
    model.execute(s.target.inputs)
    s.log.wait_for(lambda ev: any(k == "ended" for k, _, _ in ev), timeout=30)
    s.reset(debounce_ms=window_ms)
    try:
        t0 = time.monotonic()
        model.execute(s.target.inputs)
        second_sent = time.monotonic()
        model.execute(s.target.inputs)  # within the window: continues the burst
        second_done = time.monotonic()
        assert second_done - t0 < window_ms / 1000.0, "the model is too slow for this check"
        events = s.log.wait_for(lambda ev: any(k == "ended" for k, _, _ in ev),
                                timeout=window_ms / 1000.0 + 30)
        ended_at = time.monotonic()
        # The second work ended after it was sent: its window cannot have passed before
        # ``second_sent`` + window (however late its reply came back here).
        assert ended_at - second_sent >= window_ms / 1000.0 * 0.95, \
            "end reported before the window"
        time.sleep(0.05)
        kinds = [k for k, _, _ in s.log.snapshot()]
        assert kinds == ["requested", "started", "ended"], kinds
        ids = [i.id for k, i, _ in events if k in ("requested", "ended")]
        assert ids[1] > ids[0], "the end carries the burst's last work"
    finally:
        s.reset()


@check
def check_direct_access(s: Session) -> None:
    s.reset()
    s.hal.set_scheduling_configs([_cfg(s, app_priority=100, has_direct_access=False)])
    model = s.prepare()
    try:
        model.execute(s.target.inputs)
    except DirectAccessDenied:
        pass
    else:
        raise AssertionError("work ran for a uid without direct access")
    assert s.log.snapshot() == [], "refused work must not be reported"


@check
def check_attribution(s: Session) -> None:
    s.reset()
    other = s.uid + 4242
    s.hal.set_scheduling_configs([_cfg(s, app_priority=400),
                                  SchedulingConfig(uid=other, app_priority=100)])
    model = s.prepare()
    try:
        model.execute(s.target.inputs, original_uid=other)
    except AttributionDenied:
        pass
    else:
        raise AssertionError("attribution without the right was accepted")
    s.hal.update_scheduling_configs([_cfg(s, app_priority=400, can_attribute_other_uid=True)])
    model.execute(s.target.inputs, original_uid=other, job_priority=10)
    events = s.log.wait_for(lambda ev: any(k == "ended" for k, _, _ in ev))
    info = events[0][1]
    assert info.original_uid == other and info.uid == s.uid
    assert info.effective_priority == 110, "attributed work takes the original uid's priority"


@check
def check_cancel_reports_cancelled_user(s: Session) -> None:
    s.reset()
    bg = s.prepare(step=True)
    with s.background(bg, 1, job_priority=0):
        s.log.wait_for(lambda ev: any(k == "started" for k, _, _ in ev))
    events = s.log.wait_for(lambda ev: any(k == "ended" for k, _, _ in ev))
    assert (events[-1][0], events[-1][2]) == ("ended", EndReason.CANCELLED_USER), events


@check
def check_admission_and_revocation(s: Session) -> None:
    s.reset()
    for grant in (None, "0" * 32, s.grant(uid=s.uid + 1)):
        try:
            s.device.prepare_model(s.target.model, grant=grant)
        except GrantRequired:
            pass
        else:
            raise AssertionError(f"prepared without a valid grant ({grant!r})")
    grant_id = s.grant()
    model = s.prepare(grant_id=grant_id)
    model.execute(s.target.inputs)
    s.end_grant(grant_id, revoked=True)
    try:
        model.execute(s.target.inputs)
    except GrantRevoked:
        pass
    else:
        raise AssertionError("a revoked grant's model still executed")


@check
def check_revocation_cancels_running_work(s: Session) -> None:
    s.reset()
    grant_id = s.grant()
    bg = s.prepare(step=True, grant_id=grant_id)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            bg.execute(s.target.step_inputs, steps=10_000, feedback=s.target.step_feedback)
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=run)
    th.start()
    s.log.wait_for(lambda ev: any(k == "started" for k, _, _ in ev))
    s.end_grant(grant_id, revoked=True)
    th.join(30)
    assert errors and isinstance(errors[0], GrantRevoked), errors
    events = s.log.wait_for(lambda ev: any(k == "ended" for k, _, _ in ev))
    assert events[-1][2] == EndReason.CANCELLED_SYSTEM, events
