"""ManagerState: the request lifecycle, deadlines, queue waits, the decision log, dump and
repr, and the hot path (virtual time)."""

from __future__ import annotations

import pytest

from npumanager.constants import (
    LoadStatus,
    Policy,
    RequestStatus,
)
from npumanager.errors import InvalidArgument, LimitExceeded, UnknownRequest
from npumanager.service import events as ev
from npumanager.service.policy import ManagerParams

from .state_harness import (
    BG,
    BIG,
    CACHED,
    FG,
    MID,
    SMALL,
    VIS,
    Harness,
    budget,
    completes,
    for_key,
    granted,
    status_of,
)

# --- lifecycle ----------------------------------------------------------------------


def test_lifecycle_grant_load_unload_complete() -> None:
    h = budget()
    out = h.request(FG, 1)
    assert [type(i) for i in out] == [ev.IssueGrant, ev.SendCanLoad]
    assert out == [
        ev.IssueGrant(FG, 1, "grant-0001", "default"),
        ev.SendCanLoad(FG, FG, 1, LoadStatus.CAN_LOAD_NOW, "grant-0001", "default"),
    ]
    assert h.state_of(FG, 1) == "granted"
    assert h.loaded(FG, 1) == []
    assert h.state_of(FG, 1) == "loaded"
    out = h.unloaded(FG, 1)
    assert out == [
        ev.EndGrant("grant-0001", FG, 1, revoked=False),
        ev.RequestEnded(FG, 1, RequestStatus.COMPLETE, "default"),
        ev.SendComplete(FG, FG, 1, RequestStatus.COMPLETE, "default"),
    ]
    assert h.state_of(FG, 1) is None
    assert h.state.budget_used == 0


def test_granted_request_may_unload_without_loading() -> None:
    h = budget()
    h.request(FG, 1)
    assert completes(h.unloaded(FG, 1)) == {(FG, 1): RequestStatus.COMPLETE}


def test_loaded_twice_is_harmless() -> None:
    h = budget()
    h.hold(FG, 1)
    assert h.loaded(FG, 1) == []


def test_cancel_queued_request() -> None:
    h = budget()
    h.hold(FG, 1, BIG)
    assert status_of(h.request(BG, 2), BG, 2) == LoadStatus.NOT_PRIORITIZED
    out = h.cancel(BG, 2)
    assert out == [ev.RequestEnded(BG, 2, RequestStatus.CANCELLED, "default"),
                   ev.SendComplete(BG, BG, 2, RequestStatus.CANCELLED, "default")]


def test_cancel_granted_request_ends_its_grant() -> None:
    h = budget()
    h.hold(FG, 1)
    out = h.cancel(FG, 1)
    assert out == [
        ev.EndGrant("grant-0001", FG, 1, revoked=False),
        ev.RequestEnded(FG, 1, RequestStatus.CANCELLED, "default"),
        ev.SendComplete(FG, FG, 1, RequestStatus.CANCELLED, "default"),
    ]


def test_unknown_request_raises_unknown_request() -> None:
    h = budget()
    for call in (h.cancel, h.loaded, h.unloaded):
        with pytest.raises(UnknownRequest):
            call(FG, 99)


def test_another_uids_request_cannot_be_named() -> None:
    h = budget()
    h.hold(FG, 1)
    with pytest.raises(UnknownRequest):
        h.cancel(BG, 1)
    assert h.state_of(FG, 1) == "loaded"


def test_loaded_before_grant_is_refused() -> None:
    h = budget()
    h.hold(FG, 1, BIG)
    h.request(BG, 2)
    with pytest.raises(InvalidArgument):
        h.loaded(BG, 2)
    with pytest.raises(InvalidArgument):
        h.unloaded(BG, 2)
    assert h.state_of(BG, 2) == "queued"


def test_reused_id_refused_while_live() -> None:
    h = budget()
    h.request(FG, 1)
    with pytest.raises(InvalidArgument, match="still live"):
        h.request(FG, 1, conn=77)
    assert h.state_of(FG, 1) == "granted"


def test_reused_id_refused_on_same_connection_even_after_it_ended() -> None:
    h = budget()
    h.request(FG, 1)
    h.unloaded(FG, 1)
    with pytest.raises(InvalidArgument, match="once per connection"):
        h.request(FG, 1)
    # Another connection of the same uid may use the id again.
    assert granted(h.request(FG, 1, conn=555)) == [(FG, 1)]


def test_same_id_from_two_uids_is_two_requests() -> None:
    h = budget()
    h.request(FG, 7, MID)
    h.request(BG, 7, MID)
    assert h.state_of(FG, 7) == h.state_of(BG, 7) == "granted"
    h.unloaded(FG, 7)
    assert h.state_of(FG, 7) is None and h.state_of(BG, 7) == "granted"


def test_max_requests_per_uid() -> None:
    h = Harness(ManagerParams(max_requests_per_uid=2), policy=Policy.STATUS_QUO)
    h.request(FG, 1)
    h.request(FG, 2)
    with pytest.raises(LimitExceeded):
        h.request(FG, 3)
    h.unloaded(FG, 1)
    h.request(FG, 3)


def test_bad_size_or_priority_refused() -> None:
    h = budget()
    with pytest.raises(InvalidArgument):
        h.handle(h.mk(ev.RequestLoad, uid=FG, pid=1, conn=FG, request_id=1, size=9))
    assert h.state_of(FG, 1) is None


def test_terminal_status_ends_everything() -> None:
    h = budget()
    h.hold(FG, 1)
    h.unloaded(FG, 1)
    with pytest.raises(UnknownRequest):
        h.unloaded(FG, 1)
    assert h.advance(60) == []

# --- status quo ------------------------------------------------------------------------


def test_status_quo_grants_everything() -> None:
    h = Harness(policy=Policy.STATUS_QUO)
    for rid in range(20):
        assert granted(h.request(BG, rid, BIG)) == [(BG, rid)]
    assert h.state.budget_total is None

# --- unload deadline -----------------------------------------------------------------


def test_revocation_after_the_deadline() -> None:
    h = budget()
    h.hold(BG, 1, BIG)
    out = h.request(FG, 2, BIG)
    timer = next(i for i in out if isinstance(i, ev.ArmTimer))
    assert timer.at == h.now + 5.0
    assert h.advance(4.9) == []
    out = h.advance(0.2)
    assert for_key(out, BG, 1) == [
        ev.EndGrant("grant-0001", BG, 1, revoked=True),
        ev.RequestEnded(BG, 1, RequestStatus.REVOKED, "default"),
        ev.SendComplete(BG, BG, 1, RequestStatus.REVOKED, "default"),
    ]
    assert granted(out) == [(FG, 2)]
    story = [d.what for d in h.state.story(BG, 1)]
    assert story[-2:] == ["unload deadline passed", "revoked"]


def test_unloading_in_time_cancels_the_deadline() -> None:
    h = budget()
    h.hold(BG, 1, BIG)
    h.request(FG, 2, BIG)
    out = h.unloaded(BG, 1)
    assert any(isinstance(i, ev.CancelTimer) for i in out)
    assert h.advance(60) == []


def test_early_timer_is_rearmed() -> None:
    h = budget()
    h.hold(BG, 1, BIG)
    h.request(FG, 2, BIG)
    key = next(iter(h.timers))
    out = h.handle(h.mk(ev.TimerFired, key=key))  # fired too soon
    assert out == [ev.ArmTimer(key, h.timers[key])]
    assert h.state_of(BG, 1) == "unload_requested"


def test_stale_timer_does_nothing() -> None:
    h = budget()
    assert h.handle(h.mk(ev.TimerFired, key="unload:1:2:3")) == []


def test_custom_unload_deadline() -> None:
    h = Harness(ManagerParams(unload_deadline_s=0.5))
    h.importance(FG, 100)
    h.hold(BG, 1, BIG)
    h.request(FG, 2, BIG)
    assert completes(h.advance(0.5)) == {(BG, 1): RequestStatus.REVOKED}

# --- max queue wait ------------------------------------------------------------------


def test_max_queue_wait_cancels() -> None:
    h = Harness(ManagerParams(max_queue_wait_s=30.0))
    h.importance(FG, 100)
    h.hold(FG, 1, BIG)
    h.request(BG, 2, SMALL)
    assert h.advance(29) == []
    assert completes(h.advance(2)) == {(BG, 2): RequestStatus.CANCELLED}
    assert h.state_of(FG, 1) == "loaded"


def test_max_queue_wait_timer_cancelled_on_grant() -> None:
    h = Harness(ManagerParams(max_queue_wait_s=30.0))
    h.hold(FG, 1, BIG)
    h.request(BG, 2, SMALL)
    h.advance(10)
    assert granted(h.unloaded(FG, 1)) == [(BG, 2)]
    assert h.advance(60) == []
    assert h.state_of(BG, 2) == "granted"


def test_no_queue_wait_by_default() -> None:
    h = budget()
    h.hold(FG, 1, BIG)
    h.request(BG, 2)
    assert h.advance(3600) == []
    assert h.state_of(BG, 2) == "queued"

# --- log, story, dump, repr ------------------------------------------------------------


def test_story_replays_one_request() -> None:
    h = budget()
    h.hold(BG, 1, BIG)
    h.request(FG, 2, BIG)
    h.unloaded(BG, 1)
    story = h.state.story(FG, 2)
    assert [d.what for d in story] == ["requested", "wait_for_unload", "granted"]
    assert all(d.key == (FG, 2) for d in story)
    assert [d.what for d in h.state.story(BG, 1)][-2:] == ["asked to unload", "complete"]


def test_decision_log_is_bounded() -> None:
    h = Harness(ManagerParams(decision_log_size=10), policy=Policy.STATUS_QUO)
    for rid in range(50):
        h.request(FG, rid)
    assert len(h.state.decisions()) == 10


def test_dump_is_json_and_complete() -> None:
    import json

    h = budget()
    h.hold(BG, 1, BIG)
    h.now += 2
    h.request(FG, 2, BIG)
    h.request(CACHED, 3, SMALL)
    d = json.loads(json.dumps(h.state.dump(h.now + 1)))
    assert d["policy"] == {
        "name": "budget",
        "max_budget": 4,
        "weights": {"0": 1, "1": 2, "2": 4},
        "memory_budget_bytes": 0,
    }
    assert d["budget"]["used"] == 4 and d["budget"]["thermal_scaled"] == 4
    assert d["thermal"]["status"] == "NONE"
    assert d["uids"][str(FG)]["importance"] == 100
    assert d["uids"][str(FG)]["app_priority"] == 100
    reqs = {(r["uid"], r["request_id"]): r for r in d["requests"]}
    assert reqs[(BG, 1)]["state"] == "unload_requested"
    assert reqs[(BG, 1)]["age_s"] == 3.0
    assert reqs[(BG, 1)]["grant"] == "grant-00"
    assert reqs[(FG, 2)]["state"] == "waiting"
    assert reqs[(CACHED, 3)]["rank"] == 400
    assert d["queue"] == [[FG, 2], [CACHED, 3]]


def test_repr_reads_like_a_summary() -> None:
    h = budget()
    h.hold(VIS, 1, SMALL)
    h.hold(VIS, 2, SMALL)
    h.request(VIS, 3, SMALL)
    h.request(VIS, 4, BIG)
    assert repr(h.state) == "policy=budget 3/4 used | 2 loaded, 1 granted, 1 waiting"

def test_hot_path_never_scans_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """With thousands of requests queued, a request that fits, its load and its unload
    touch only the queue's head (the bench's "p99 at 10,000 queued" target)."""
    import itertools

    from npumanager.service.ranking import RankQueue
    from npumanager.service.state import ManagerState
    from npumanager.service.table import RequestTable

    ids = itertools.count()
    s = ManagerState(grant_ids=lambda: f"g{next(ids)}")

    def e(cls: type[ev.Event], **kw: object) -> ev.Event:
        return cls(stimulus_id="x", now=1.0, **kw)  # type: ignore[arg-type]

    s.handle(e(ev.ImportanceChanged, uid=FG, importance=100))
    s.handle(e(ev.ImportanceChanged, uid=VIS, importance=200))
    s.handle(e(ev.RequestLoad, uid=VIS, pid=1, conn=VIS, request_id=0, size=MID))
    for i in range(3_000):
        uid = 20_000 + i % 100
        s.handle(e(ev.RequestLoad, uid=uid, pid=1, conn=uid, request_id=i, size=BIG))
    assert s.dump(1.0)["counts"]["queued"] == 3_000

    def boom(*_: object, **__: object) -> None:
        raise AssertionError("the hot path scanned the queue")

    monkeypatch.setattr(RankQueue, "ordered", boom)
    monkeypatch.setattr(ManagerState, "_rebalance", boom)
    monkeypatch.setattr(RequestTable, "counts", boom)
    pops = 0
    real_peek = RankQueue.peek

    def counting_peek(self: RankQueue) -> object:
        nonlocal pops
        pops += 1
        return real_peek(self)

    monkeypatch.setattr(RankQueue, "peek", counting_peek)
    for rid in range(1, 50):
        out = s.handle(e(ev.RequestLoad, uid=FG, pid=1, conn=FG, request_id=rid))
        assert granted(out) == [(FG, rid)]
        s.handle(e(ev.ModelLoaded, uid=FG, conn=FG, request_id=rid))
        s.handle(e(ev.ModelUnloaded, uid=FG, conn=FG, request_id=rid))
    assert pops <= 2 * 49  # one look at the head per request and per unload
