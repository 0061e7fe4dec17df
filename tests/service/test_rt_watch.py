"""The pure core of npud's real-time grants to apps (service/rt_watch.py): who may have a
SCHED_FIFO thread, and when the watchdog takes it back. Time and CPU samples are inputs."""

from __future__ import annotations

import pytest

from npumanager.errors import (
    InvalidArgument,
    LimitExceeded,
    PermissionDenied,
    RealtimeUnavailable,
)
from npumanager.service.rt_watch import RtGrant, RtLimits, RtWatch

#: FIFO spinners here: one such test at a time (tests/conftest.py).
pytestmark = pytest.mark.fifo

UID, PID, NPUD = 5000, 4242, 1
FG, VISIBLE = 100, 200
MS = 1_000_000


def watch(**kw: float) -> RtWatch:
    return RtWatch(RtLimits(**{"priority": 1, **kw}))  # type: ignore[arg-type]


def ask(w: RtWatch, tid: int, *, now: float = 0.0, uid: int = UID, pid: int = PID,
        owner: tuple[int, int] | None = None, importance: int = FG, conn: int = 1,
        cpu: int | None = 0) -> RtGrant:
    g = w.check(now, uid=uid, pid=pid, key=uid, conn=conn, tid=tid,
                owner=(pid, uid) if owner is None else owner, importance=importance,
                npud_pid=NPUD)
    w.granted(g, now, cpu)
    return g


def fg(_key: int) -> int:
    return FG


def test_rt_off_by_default_refuses_with_realtime_unavailable() -> None:
    w = RtWatch(RtLimits())
    with pytest.raises(RealtimeUnavailable, match="app_rt_priority = 0"):
        ask(w, 4243)


def test_rt_a_thread_of_another_process_or_uid_is_refused() -> None:
    w = watch()
    with pytest.raises(PermissionDenied, match="not a thread of the calling process"):
        ask(w, 99, owner=(PID + 1, UID))  # another process of the same uid
    with pytest.raises(PermissionDenied, match="not a thread of the calling process"):
        ask(w, 99, owner=(PID, UID + 1))  # the caller's pid, another uid's thread
    with pytest.raises(PermissionDenied, match="npud's own"):
        ask(w, NPUD, pid=NPUD, owner=(NPUD, UID))
    with pytest.raises(InvalidArgument, match="no thread"):
        w.check(0, uid=UID, pid=PID, key=UID, conn=1, tid=7, owner=None, importance=FG,
                npud_pid=NPUD)
    with pytest.raises(InvalidArgument):
        ask(w, 0)
    assert not w.grants


def test_rt_only_foreground_uids_get_one() -> None:
    w = watch()
    with pytest.raises(PermissionDenied, match="FOREGROUND"):
        ask(w, 4243, importance=VISIBLE)
    assert ask(w, 4243, importance=FG).tid == 4243


def test_rt_app_rt_importance_visible_lets_a_visible_uid_have_one_and_no_less() -> None:
    # (voice29: what foreground protection sets, so a voice assistant's thread is granted)
    w = watch(importance=VISIBLE)
    assert ask(w, 4243, importance=VISIBLE).tid == 4243
    with pytest.raises(PermissionDenied, match=r"VISIBLE \(200\)"):
        ask(w, 4244, uid=UID + 1, pid=4244, importance=300)
    # Demoted once its uid is less important than VISIBLE, kept while it is VISIBLE.
    assert w.tick(0.15, {4243: MS}, lambda key: VISIBLE) == []
    out = w.tick(0.3, {4243: MS}, lambda key: 300)
    assert [(d.grant.tid, d.why) for d in out] == [(4243, "not-foreground")]


def test_rt_at_most_max_threads_per_uid_and_asking_twice_counts_once() -> None:
    w = watch(max_threads=2)
    ask(w, 4243)
    ask(w, 4243)
    ask(w, 4244)
    with pytest.raises(LimitExceeded, match="app_rt_max_threads = 2"):
        ask(w, 4245)
    # Another uid has its own count.
    ask(w, 7000, uid=UID + 1, pid=7000)
    assert len(w.grants) == 3 and w.granted_total == 3


def test_rt_a_spinning_thread_is_demoted_within_its_budget_and_the_uid_cools_down() -> None:
    w = watch(max_cpu_ms=200, window_s=1.0, cooldown_s=10.0)
    ask(w, 4243, cpu=0)
    # 150 ms samples of a thread that runs all the time.
    assert w.tick(0.15, {4243: 150 * MS}, fg) == []
    out = w.tick(0.30, {4243: 300 * MS}, fg)
    assert [(d.grant.tid, d.why) for d in out] == [(4243, "cpu")]
    assert not w.grants
    with pytest.raises(LimitExceeded, match="no new grant"):
        ask(w, 4244, now=5.0)  # a new thread does not get around the cooldown
    w.tick(10.31, {}, fg)
    assert ask(w, 4244, now=10.31).tid == 4244


def test_rt_a_frame_thread_that_blocks_keeps_its_grant() -> None:
    w = watch(max_cpu_ms=200, window_s=1.0)
    ask(w, 4243, cpu=0)
    cpu = 0
    for i in range(1, 200):  # 30 s at 150 ms samples, 20 ms of CPU each: 133 ms/s
        cpu += 20 * MS
        assert w.tick(i * 0.15, {4243: cpu}, fg) == []
    assert 4243 in w.grants


def test_rt_the_window_slides_a_burst_of_work_long_ago_does_not_count() -> None:
    w = watch(max_cpu_ms=200, window_s=1.0)
    ask(w, 4243, cpu=0)
    assert w.tick(0.15, {4243: 150 * MS}, fg) == []  # 150 ms at once
    for i in range(2, 12):
        assert w.tick(i * 0.15, {4243: 150 * MS + i * MS}, fg) == []
    assert w.tick(12 * 0.15, {4243: 150 * MS + 12 * MS + 120 * MS}, fg) == []


def test_rt_demoted_when_the_uid_stops_being_foreground_or_the_thread_is_gone() -> None:
    w = watch()
    ask(w, 4243)
    ask(w, 8000, uid=UID + 1, pid=8000)
    out = w.tick(0.15, {4243: MS, 8000: None}, lambda key: VISIBLE if key == UID else FG)
    assert sorted((d.grant.tid, d.why) for d in out) == [(4243, "not-foreground"),
                                                         (8000, "gone")]
    assert not w.grants and not w.cooldown_until


def test_rt_closing_the_connection_ends_its_grants_only() -> None:
    w = watch()
    ask(w, 4243, conn=1)
    ask(w, 4244, conn=2)
    assert [d.grant.tid for d in w.conn_closed(1)] == [4243]
    assert list(w.grants) == [4244]
    assert [d.why for d in w.stop()] == ["stopping"]
    assert w.demoted_total == {"connection-closed": 1, "stopping": 1}


def test_rt_a_reused_thread_id_of_another_process_is_a_new_grant() -> None:
    w = watch()
    ask(w, 4243)
    g = ask(w, 4243, pid=PID + 7)  # PID exited; its thread id now names one of PID+7's
    assert (g.pid, len(w.grants)) == (PID + 7, 1)


def test_rt_limits_come_from_the_manager_section() -> None:
    lim = RtLimits.from_section({"app_rt_priority": 3, "app_rt_max_threads": 1,
                                 "app_rt_max_cpu_ms": 50, "app_rt_window_s": 0.5,
                                 "app_rt_importance": 200})
    assert (lim.priority, lim.max_threads, lim.max_cpu_ms, lim.window_s,
            lim.importance) == (3, 1, 50.0, 0.5, 200)
    assert RtLimits.from_section({}).importance == 100
    assert "priority=3" in repr(RtWatch(lim))


def test_rt_a_non_admins_dump_shows_only_its_own_threads() -> None:
    from npumanager.service.visibility import admin_view, own_view

    w = watch(cooldown_s=10.0)
    ask(w, 4243)
    ask(w, 8000, uid=UID + 1, pid=8000, cpu=0)
    w.tick(0.15, {4243: 0, 8000: 500 * MS}, fg)  # uid+1 spun: demoted, in cooldown
    ask(w, 8001, uid=UID + 2, pid=8001)
    dump = {"realtime": w.info()}
    mine = own_view(dump, {UID})["realtime"]
    assert [g["tid"] for g in mine["granted"]] == [4243] and mine["cooldown"] == {}
    theirs = own_view(dump, {UID + 1})["realtime"]
    assert theirs["granted"] == [] and list(theirs["cooldown"]) == [str(UID + 1)]
    assert len(admin_view(dump)["realtime"]["granted"]) == 2
