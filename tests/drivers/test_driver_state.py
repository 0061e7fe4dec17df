"""DriverState on virtual time: ordering, preemption between steps, cancel, FAILED,
debounce, thermal hold-back, the inline fast path, grants, models, tombstones, pools.
The harness validates the state and checks every lifecycle after each event."""

from __future__ import annotations

import pytest

from npumanager.constants import ThermalStatus
from npumanager.drivers import events as ev
from npumanager.drivers.events import JobState, WorkKind
from npumanager.drivers.state import DriverParams, GrantCheck
from npumanager.errors import (
    AttributionDenied,
    DirectAccessDenied,
    GrantMoved,
    GrantRequired,
    GrantRevoked,
    IllegalArgument,
    InvalidArgument,
)
from npumanager.hal.types import EndReason, SchedulingConfig

from .state_harness import INITIAL, PAUSED, RESUMED, Harness, kinds, reports

C, S = EndReason.COMPLETED, EndReason.CANCELLED_SYSTEM
COMPLETED = int(EndReason.COMPLETED)


def run_step(ticket: int, step: int = 0, last: bool = True, inline: bool = False,
             channel: int = 0, work: int | None = None) -> ev.RunStep:
    """RunStep for a job on channel 0 whose work id is its ticket (unless told)."""
    return ev.RunStep(ticket, step, last, inline, channel, ticket if work is None else work)


def inline_of(out: list[ev.Instruction]) -> list[ev.RunStep]:
    """The RunSteps in ``out`` as run_step() builds them (channel 0: the inline tests do
    not care which channel a job gets)."""
    return [ev.RunStep(i.ticket, i.step, i.last, i.inline, 0, i.work_id) for i in out
            if isinstance(i, ev.RunStep)]


# --- admission and priority ----------------------------------------------------------


def test_effective_priority_is_app_priority_plus_clamped_job_priority() -> None:
    h = Harness()
    h.configs(SchedulingConfig(uid=10, app_priority=250, min_priority=100, max_priority=300))
    assert h.state.effective_priority(10, None, 500) == 550
    assert h.state.effective_priority(10, None, 0) == 350
    assert h.state.effective_priority(10, None, 200) == 450


def test_unknown_uid_gets_priority_1000_direct_access_no_attribution() -> None:
    h = Harness()
    m = h.prepare(77)
    t, _ = h.execute(77, m, prio=5)
    assert h.state.jobs()[0].info.effective_priority == 1005
    with pytest.raises(AttributionDenied):
        h.execute(77, m, original_uid=78)
    assert h.state.job_state(t) is JobState.RUNNING


def test_no_direct_access_is_refused_and_nothing_is_reported() -> None:
    h = Harness()
    h.configs(SchedulingConfig(uid=10, app_priority=100, has_direct_access=False))
    m = h.prepare(10)
    with pytest.raises(DirectAccessDenied):
        h.execute(10, m)
    assert h.reports() == [] and h.state.jobs() == []


def test_attributed_work_uses_original_uids_priority() -> None:
    h = Harness()
    h.configs(SchedulingConfig(uid=10, app_priority=400, can_attribute_other_uid=True),
              SchedulingConfig(uid=20, app_priority=100, max_priority=50))
    m = h.prepare(10)
    h.execute(10, m, prio=500, original_uid=20)
    info = h.state.jobs()[0].info
    assert info.effective_priority == 150 and info.original_uid == 20 and info.uid == 10
    assert info.debug_pid == 10010


def test_invalid_configs_change_nothing() -> None:
    h = Harness()
    good = SchedulingConfig(uid=1, app_priority=100)
    h.configs(good)
    for bad in (
        [SchedulingConfig(uid=2, app_priority=-1)],
        [SchedulingConfig(uid=2, app_priority=1001)],
        [SchedulingConfig(uid=2, app_priority=1, min_priority=600, max_priority=500)],
        [SchedulingConfig(uid=2, app_priority=1), SchedulingConfig(uid=2, app_priority=2)],
    ):
        with pytest.raises(IllegalArgument):
            h.configs(*bad)
        with pytest.raises(IllegalArgument):
            h.configs(SchedulingConfig(uid=1, app_priority=5), *bad, replace=False)
        assert h.state.configs == {1: good}


def test_update_upserts_and_set_replaces() -> None:
    h = Harness()
    h.configs(SchedulingConfig(uid=1, app_priority=100))
    h.configs(SchedulingConfig(uid=2, app_priority=200), SchedulingConfig(uid=1, app_priority=150),
              replace=False)
    assert {u: c.app_priority for u, c in h.state.configs.items()} == {1: 150, 2: 200}
    h.configs(SchedulingConfig(uid=3, app_priority=300))
    assert set(h.state.configs) == {3}


def test_bad_execute_changes_nothing() -> None:
    h = Harness()
    m = h.prepare(1, inputs=("a", "b"), outputs=("y",))
    with pytest.raises(InvalidArgument, match="takes inputs"):
        h.execute(1, m, inputs=("a",))
    with pytest.raises(InvalidArgument, match="feedback"):
        h.execute(1, m, inputs=("a", "b"), steps=2, feedback=(("z", "a"),))
    with pytest.raises(InvalidArgument, match="no prepared model"):
        h.execute(1, m + 1, inputs=("a", "b"))
    h.connect(2)
    with pytest.raises(InvalidArgument, match="no prepared model"):
        h.execute(2, m, inputs=("a", "b"))  # another connection's model
    assert h.state.jobs() == [] and h.reports() == []


# --- ordering and the lifecycle ----------------------------------------------------------


def test_lowest_effective_priority_runs_first_fifo_on_ties() -> None:
    h = Harness()
    ms = {u: h.prepare(u) for u in (1, 2, 3, 4)}
    blocker, _ = h.execute(1, ms[1])
    a, _ = h.execute(2, ms[2], prio=500)
    b, _ = h.execute(3, ms[3], prio=100)
    c, _ = h.execute(4, ms[4], prio=100)
    order = []
    for _ in range(4):
        (t,) = h.running()
        order.append(t)
        h.step_done(t)
    assert order == [blocker, b, c, a]


def test_lifecycle_requested_started_then_ended_after_the_debounce_window() -> None:
    h = Harness(debounce_ms=50)
    m = h.prepare(1)
    t, out = h.execute(1, m, prio=7)
    assert kinds(out) == ["ReportWork", "ReportWork", "RunStep"]
    assert reports(out) == [("requested", 1, 0), ("started", 1, INITIAL)]
    assert out[-1] == run_step(t)
    h.now += 0.004
    out = h.step_done(t)
    assert out == [ev.FinishJob(t, 1, C, 1), ev.ArmTimer("debounce", h.now + 0.05)]
    assert h.advance(0.049) == []
    out = h.advance(0.002)
    assert reports(out) == [("ended", 1, COMPLETED)]
    # The end carries the time its work ended, not the time it was reported.
    assert out[0].info.timestamp_ms == int((1000.004) * 1000)  # type: ignore[attr-defined]
    assert all(i.info.job_priority == 7 for _, o in h.log for i in o
               if isinstance(i, ev.ReportWork))


def test_burst_within_the_window_reports_once() -> None:
    h = Harness(debounce_ms=50)
    m = h.prepare(1)
    first, _ = h.execute(1, m)
    h.step_done(first)
    h.advance(0.02)
    second, out = h.execute(1, m)  # inside the window: continues the burst silently
    assert out == [run_step(second)]
    out = h.step_done(second)
    assert out == [ev.FinishJob(second, 2, C, 1)]  # the armed timer is early enough
    assert reports(h.advance(0.04)) == []  # the timer fires early, re-arms
    assert reports(h.advance(0.02)) == [("ended", 2, COMPLETED)]
    assert [k for k, _, _ in h.reports()] == ["requested", "started", "ended"]
    _, out = h.execute(1, m)  # after the window a new burst is reported again
    assert reports(out) == [("requested", 3, 0), ("started", 3, INITIAL)]


def test_one_timer_per_window_for_a_stream_of_work() -> None:
    h = Harness(debounce_ms=50)
    m = h.prepare(1)
    arms = 0
    for _ in range(100):
        t, out = h.execute(1, m)
        out += h.step_done(t)
        out += h.advance(0.001)
        arms += sum(isinstance(i, ev.ArmTimer) for i in out)
    assert arms <= 3


def test_other_uid_is_not_suppressed_by_a_debouncing_uid() -> None:
    h = Harness(channels=2)
    a = h.prepare(1)
    b = h.prepare(2)
    ta, _ = h.execute(1, a)
    h.step_done(ta)
    _, out = h.execute(2, b)
    assert reports(out) == [("requested", 2, 0), ("started", 2, INITIAL)]


def test_zero_debounce_reports_every_end_at_once() -> None:
    h = Harness(debounce_ms=0)
    m = h.prepare(1)
    t, _ = h.execute(1, m)
    assert reports(h.step_done(t)) == [("ended", 1, COMPLETED)]


def test_no_callback_no_reports_and_no_timer() -> None:
    h = Harness(listening=False)
    m = h.prepare(1)
    t, out = h.execute(1, m)
    assert out == [run_step(t)]
    assert h.step_done(t) == [ev.FinishJob(t, 1, C, 1)]
    assert h.timers == {}


def test_clearing_the_callback_drops_pending_ends() -> None:
    h = Harness()
    m = h.prepare(1)
    t, _ = h.execute(1, m)
    h.step_done(t)
    h.handle(h.mk(ev.CallbackSet, listening=False))
    h.handle(h.mk(ev.CallbackSet, listening=True, debounce_ms=50))
    assert reports(h.advance(1.0)) == []


# --- multi-step jobs ---------------------------------------------------------------------


def test_multi_step_job_pauses_for_more_important_work_and_resumes() -> None:
    h = Harness(debounce_ms=0)
    h.priorities(u1=400, u2=100)
    bg_m, fg_m = h.prepare(1), h.prepare(2)
    bg, _ = h.execute(1, bg_m, steps=3, feedback=(("y", "x"),))
    assert h.step_done(bg) == [run_step(bg, 1, last=False)]  # nothing waits: continues
    fg, out = h.execute(2, fg_m)
    assert reports(out) == [("requested", 2, 0)] and h.running() == [bg]  # never interrupted
    out = h.step_done(bg)  # step 2 done: yields to fg
    assert reports(out) == [("ended", 1, PAUSED), ("started", 2, INITIAL)]
    assert out[-1] == run_step(fg)
    assert h.state.job_state(bg) is JobState.PAUSED
    out = h.step_done(fg)
    assert reports(out) == [("ended", 2, COMPLETED), ("started", 1, RESUMED)]
    assert out[-1] == run_step(bg, 2, last=True)
    h.step_done(bg)
    assert h.finish_of(bg) == ev.FinishJob(bg, 1, C, 3)


def test_equal_priority_work_takes_the_channel_at_the_next_step_boundary() -> None:
    h = Harness(debounce_ms=0)
    a, b = h.prepare(1), h.prepare(2)
    bg, _ = h.execute(1, a, steps=2)
    other, _ = h.execute(2, b)  # same effective priority (unknown uids, job 0)
    assert h.running() == [bg]  # a step is never interrupted
    out = h.step_done(bg)  # round robin: the equal waiting goes first
    assert reports(out) == [("ended", 1, PAUSED), ("started", 2, INITIAL)]
    assert out[-1] == run_step(other)
    out = h.step_done(other)
    assert reports(out) == [("ended", 2, COMPLETED), ("started", 1, RESUMED)]
    assert out[-1] == run_step(bg, 1, last=True)
    h.step_done(bg)
    assert h.finish_of(bg) == ev.FinishJob(bg, 1, C, 2)


def test_less_important_work_waits_for_a_multi_step_job() -> None:
    h = Harness(debounce_ms=0)
    h.priorities(u1=100, u2=400)
    a, b = h.prepare(1), h.prepare(2)
    job, _ = h.execute(1, a, steps=3)
    low, _ = h.execute(2, b)
    assert h.step_done(job) == [run_step(job, 1, last=False)]  # keeps its channel
    assert h.step_done(job) == [run_step(job, 2, last=True)]
    h.step_done(job)
    assert h.running() == [low]


# --- cancel, fail, revoke -------------------------------------------------------------


def test_cancel_queued_at_once_and_running_after_its_step() -> None:
    h = Harness(debounce_ms=0)
    a, b = h.prepare(1), h.prepare(2)
    running, _ = h.execute(1, a)
    queued, _ = h.execute(2, b)
    out = h.cancel(2, b)
    assert out[-1] == ev.FinishJob(queued, 2, EndReason.CANCELLED_USER, 0)
    assert reports(out) == [("ended", 2, int(EndReason.CANCELLED_USER))]
    assert h.cancel(1, a) == [ev.AbortStep(running)]
    assert h.cancel(1, a) == []  # asked once
    assert h.state.job_state(running) is JobState.RUNNING
    out = h.step_done(running, error="aborted")
    assert out[-1] == ev.FinishJob(running, 1, EndReason.CANCELLED_USER, 1)


def test_cancel_names_one_execution_or_all() -> None:
    h = Harness(channels=1)
    m = h.prepare(1)
    t1, _ = h.execute(1, m, exec_id=11)
    t2, _ = h.execute(1, m, exec_id=12)
    t3, _ = h.execute(1, m, exec_id=13)
    h.cancel(1, m, exec_id=12)
    assert h.state.job_state(t2) is None and h.state.job_state(t3) is JobState.QUEUED
    out = h.cancel(1, m)
    assert ev.AbortStep(t1) in out and h.state.job_state(t3) is None


def test_backend_error_ends_failed_with_its_message() -> None:
    h = Harness(debounce_ms=0)
    m = h.prepare(1)
    t, _ = h.execute(1, m)
    out = h.step_done(t, error="ValueError: bad shape")
    assert out[-1] == ev.FinishJob(t, 1, EndReason.FAILED, 1, "ValueError: bad shape")
    assert reports(out) == [("ended", 1, int(EndReason.FAILED))]


def test_client_gone_cancels_its_work_releases_models_after_their_step_and_pools() -> None:
    h = Harness(channels=2)
    m = h.prepare(1)
    pool = h.handle(h.mk(ev.PoolRegistered, conn=1, size=4096))
    assert pool == [ev.PoolReady(1, 1)]
    running, _ = h.execute(1, m)
    h.execute(1, m)
    queued, _ = h.execute(1, m)
    out = h.gone(1)
    assert ev.AbortStep(running) in out and ev.ClosePool(1) in out
    assert ev.FinishJob(queued, 3, EndReason.CANCELLED_USER, 0) in out
    assert not any(isinstance(i, ev.ReleaseModel) for i in out), "a step still runs"
    out = h.step_done(running)
    out += h.step_done(2)
    assert out.count(ev.ReleaseModel(m)) == 1
    assert h.state.jobs() == []


# --- thermal ------------------------------------------------------------------------------


def test_thermal_critical_holds_back_low_priority_work() -> None:
    h = Harness(debounce_ms=0, thermal_cutoff=500)
    h.priorities(u1=100, u2=900)
    hi, lo = h.prepare(1), h.prepare(2)
    h.thermal(ThermalStatus.CRITICAL)
    low, out = h.execute(2, lo)
    assert h.running() == [] and h.state.job_state(low) is JobState.QUEUED
    assert "1 held back" in repr(h.state)
    high, _ = h.execute(1, hi)
    assert h.running() == [high]
    h.step_done(high)
    assert h.running() == []
    out = h.thermal(ThermalStatus.SEVERE)
    assert out[-1] == run_step(low)


def test_thermal_pauses_a_low_priority_multi_step_job_between_steps() -> None:
    h = Harness(debounce_ms=0)
    h.priorities(u2=900)
    m = h.prepare(2)
    t, _ = h.execute(2, m, steps=3)
    h.thermal(ThermalStatus.EMERGENCY)
    assert reports(h.step_done(t)) == [("ended", 1, PAUSED)]
    assert h.state.job_state(t) is JobState.PAUSED
    out = h.thermal(ThermalStatus.NONE)
    assert reports(out) == [("started", 1, RESUMED)] and out[-1] == run_step(t, 1, False)


def test_ids_increase_and_channels_fill() -> None:
    h = Harness(channels=3)
    ms = {u: h.prepare(u) for u in range(1, 6)}
    tickets = [h.execute(u, ms[u])[0] for u in range(1, 6)]
    assert [j.info.id for j in h.state.jobs()] == [1, 2, 3, 4, 5]
    assert h.running() == tickets[:3]
    assert "3/3 channels busy | 2 queued (0 held back)" in repr(h.state)


# --- the inline fast path ---------------------------------------------------------------


def test_cheap_model_runs_inline_once_measured() -> None:
    h = Harness(listening=False, channels=2, inline_run_us=150.0)
    m = h.prepare(1)
    for i in range(3):
        t, out = h.execute(1, m)
        assert inline_of(out) == [run_step(t, inline=False)], f"run {i}: not measured yet"
        h.step_done(t, run_us=40.0)
    t, out = h.execute(1, m)
    assert inline_of(out) == [run_step(t, inline=True)]
    # One slow (preempted) run does not push it off the path: the median decides.
    h.step_done(t, run_us=9000.0)
    t, out = h.execute(1, m)
    assert inline_of(out) == [run_step(t, inline=True)]


def test_medium_single_step_job_runs_inline_only_when_alone() -> None:
    h = Harness(listening=False, channels=2, inline_run_us=150.0, inline_idle_run_us=5000.0)
    m = h.prepare(1)
    for _ in range(3):
        t, _ = h.execute(1, m)
        h.step_done(t, run_us=1000.0)
    t, out = h.execute(1, m)
    assert inline_of(out) == [run_step(t, inline=True)]
    _, out = h.execute(1, m)  # another one runs: not alone
    assert inline_of(out) == [run_step(t + 1, inline=False)]
    h.step_done(t, run_us=1000.0)
    h.step_done(t + 1, run_us=1000.0)
    _, out = h.execute(1, m, steps=2)  # never a multi-step job: it must stay preemptible
    assert inline_of(out) == [run_step(t + 2, last=False, inline=False)]


# --- grants, models, tombstones ----------------------------------------------------------


def enforced() -> Harness:
    h = Harness(DriverParams(channels=1, enforce_admission=True))
    h.handle(h.mk(ev.ManagerAttached, enforce_admission=True))
    return h


def test_grant_checks_for_prepare() -> None:
    h = enforced()
    with pytest.raises(GrantRequired, match="only with a grant"):
        h.state.check_grant("", 5)
    assert h.state.check_grant("g1", 5) is GrantCheck.UNKNOWN  # npud's push may be late
    h.grant("g1", 5)
    assert h.state.check_grant("g1", 5) is GrantCheck.LIVE
    with pytest.raises(GrantRequired, match="not issued to uid 6"):
        h.state.check_grant("g1", 6)
    h.end_grant("g1", revoked=False)
    with pytest.raises(GrantRevoked, match="already ended"):
        h.state.check_grant("g1", 5)
    h.handle(h.mk(ev.ManagerAttached, enforce_admission=False))
    assert h.state.check_grant("", 5) is GrantCheck.NOT_NEEDED


def test_model_under_a_grant_reports_its_memory_and_is_revoked_with_it() -> None:
    h = enforced()
    h.grant("g1", 1)
    h.connect(1)
    out = h.handle(h.mk(ev.ModelPrepared, conn=1, grant_id="g1", memory_bytes=123456,
                        inputs=frozenset({"x"}), outputs=frozenset({"y"})))
    assert out == [ev.ModelReady(1, 1), ev.ReportModelMemory("g1", 123456)]
    t, _ = h.execute(1, 1, steps=5)
    out = h.end_grant("g1")
    assert out == [ev.AbortStep(t)]
    out = h.step_done(t)
    why = "grant g1… was revoked by npud; the model was released"
    assert [i for i in out if not isinstance(i, ev.ReportWork | ev.ArmTimer)] == [
        ev.FinishJob(t, 1, S, 1, None, why), ev.ReleaseModel(1)]
    with pytest.raises(GrantRevoked, match="was revoked"):
        h.execute(1, 1)
    h.connect(2)
    with pytest.raises(InvalidArgument):  # the tombstone speaks to its own connection only
        h.execute(2, 1)
    assert [d.what for d in h.state.story(model_id=1)] == ["prepared", "revoked"]
    assert [d.what for d in h.state.story(grant_id="g1")] == ["issued", "revoked"]


def test_grant_ending_while_compiling_refuses_the_model() -> None:
    h = enforced()
    h.grant("g1", 1)
    h.connect(1)
    h.end_grant("g1", revoked=False)
    with pytest.raises(GrantRevoked, match="while the model was prepared"):
        h.handle(h.mk(ev.ModelPrepared, conn=1, grant_id="g1", memory_bytes=1,
                      inputs=frozenset({"x"}), outputs=frozenset({"y"})))
    assert h.state.model_ids() == []


def test_release_is_for_the_owner_only() -> None:
    h = Harness()
    m = h.prepare(1)
    h.connect(2)
    assert h.release(2, m) == []
    assert h.release(1, m) == [ev.ReleaseModel(m)]
    assert h.release(1, m) == []


def test_pools_belong_to_their_connection() -> None:
    h = Harness()
    h.connect(1)
    h.connect(2)
    assert h.handle(h.mk(ev.PoolRegistered, conn=1, size=4096)) == [ev.PoolReady(1, 1)]
    assert h.handle(h.mk(ev.PoolUnregistered, conn=2, pool_id=1)) == []
    assert h.handle(h.mk(ev.PoolUnregistered, conn=1, pool_id=1)) == [ev.ClosePool(1)]
    with pytest.raises(InvalidArgument):
        h.handle(h.mk(ev.PoolRegistered, conn=1, size=0))


# --- story and repr ---------------------------------------------------------------------


def test_story_tells_one_work_items_life() -> None:
    h = Harness(debounce_ms=0)
    h.priorities(u1=400, u2=100)
    a, b = h.prepare(1), h.prepare(2)
    bg, _ = h.execute(1, a, steps=2)
    h.execute(2, b)
    h.step_done(bg)
    h.step_done(2)
    h.step_done(bg)
    story = h.state.story(1)
    assert [d.what for d in story] == ["admitted", "paused", "resumed", "ended"]
    assert story[0].details == {"model": a, "eff": 400, "steps": 2}
    assert str(story[-1]).endswith("work 1: ended reason=COMPLETED steps=2")
    with pytest.raises(InvalidArgument):
        h.state.story()


def test_repr_reads_like_a_status_line() -> None:
    h = Harness(channels=2)
    h.grant("g", 1)
    m = h.prepare(1, grant="g")
    h.execute(1, m)
    assert repr(h.state) == ("<DriverState driver: 1/2 channels busy | 0 queued (0 held back) "
                             "| 1 models, 1 grants | thermal=NONE | callback on>")
    assert WorkKind.ENDED.value == "ended"


def test_inputs_are_checked_against_the_model_types_before_any_work_is_queued() -> None:
    import numpy as np

    from npumanager.tensorio import TensorSpec

    h = Harness()
    h.connect(1)
    out = h.handle(h.mk(ev.ModelPrepared, conn=1, grant_id=None, memory_bytes=1,
                        inputs=frozenset({"x"}), outputs=frozenset({"y"}),
                        input_specs=(TensorSpec("x", "float32", (-1, 3)),)))
    (m,) = [i.model_id for i in out if isinstance(i, ev.ModelReady)]
    bad = [({"x": np.ones((2, 4), np.float32)}, r"input 'x' expects tensor\(float\)\[\?,3\]: "
                                                 "dimension 1 is 3"),
           ({"x": np.ones((2, 3), np.int64)}, r"got tensor\(int64\)"),
           ({"x": np.ones(3, np.float32)}, r"\(rank 2\)"),
           ({"x": [np.ones(3, np.float32)]}, "got a sequence"),
           ({"z": np.ones((1, 3), np.float32)}, "model has no input 'z'"),
           ({}, r"input 'x' .* is missing")]
    for values, message in bad:
        with pytest.raises(InvalidArgument, match=message):
            h.execute(1, m, inputs=tuple(values), values=values)
    assert h.state.stats.submitted == 0 and h.state.load()[2] == 0  # nothing was queued
    _, out = h.execute(1, m, values={"x": np.ones((5, 3), np.float32)})
    assert h.state.stats.submitted == 1 and any(isinstance(i, ev.RunStep) for i in out)


def test_a_moved_grants_models_keep_serving_and_nothing_new_is_prepared_under_it() -> None:
    """hal.grant_moved: npud put the grant on the device's other host. The models here keep
    running (marked moved: each answer says where to), a prepare under it is refused
    (GrantMoved), a release reports the bytes freed (npud counts the copy there once), a
    grant issued again undoes the move, and its end still drops what is left."""
    h = enforced()
    h.grant("g1", 1)
    h.connect(1)
    m1 = h.prepare(1, "g1", memory=100)
    m2 = h.prepare(1, "g1", memory=50)
    h.handle(h.mk(ev.GrantMoved, grant_id="g1", lane="background"))
    assert h.state.moved == {m1: "background", m2: "background"}
    with pytest.raises(GrantMoved, match="moved to its background lane"):
        h.state.check_grant("g1", 1)
    t, out = h.execute(1, m1)
    assert any(isinstance(i, ev.RunStep) for i in out), out  # served here all the same
    out = h.step_done(t)
    assert any(isinstance(i, ev.FinishJob) and i.error is None for i in out), out
    out = h.release(1, m1)
    assert ev.ReportModelMemory("g1", 100, freed=True) in out, out
    assert h.state.moved == {m2: "background"}
    # Moved back before the app followed: valid here again, nothing marked moved.
    h.grant("g1", 1)
    assert h.state.moved == {} and h.state.check_grant("g1", 1) is GrantCheck.LIVE
    h.handle(h.mk(ev.GrantMoved, grant_id="g1", lane=""))
    out = h.end_grant("g1", revoked=False)
    assert ev.ReleaseModel(m2) in out and h.state.moved == {}
    assert not any(isinstance(i, ev.ReportModelMemory) for i in out), out
    h.handle(h.mk(ev.GrantMoved, grant_id="g1", lane=""))  # ended: nothing to move
    assert h.state.moved == {}
    assert [d.what for d in h.state.story(grant_id="g1")] == [
        "issued", "moved", "moved back", "moved", "ended"]
