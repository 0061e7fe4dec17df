"""ManagerState after an npud restart: drivers report held grants, clients claim their live
requests, npud reconciles and applies the policy (service/adoption.py)."""

from __future__ import annotations

from typing import Any

from npumanager.constants import LoadStatus, RequestStatus, UnloadReason
from npumanager.service import events as ev
from npumanager.service.adoption import ADOPT_TIMER
from npumanager.service.policy import ManagerParams

from .state_harness import Harness, budget, completes, for_key, granted, status_of, unloads


def held(h: Harness, *grants: tuple[str, int, int], nbytes: int = 0) -> list[ev.Instruction]:
    return h.handle(h.mk(ev.DriverHeld, name="reference", grants=tuple(
        ev.HeldGrant(g, uid, rid, nbytes) for g, uid, rid in grants)))


def claim(h: Harness, uid: int, rid: int, state: str, grant: str = "", size: int = 0,
          priority: int = 0, conn: int | None = None, **kw: Any) -> list[ev.Instruction]:
    return h.handle(h.mk(ev.ClaimRequest, uid=uid, pid=uid + 10000,
                         conn=uid if conn is None else conn, request_id=rid, size=size,
                         priority=priority, state=state, grant_id=grant, **kw))


def whats(h: Harness, uid: int, rid: int) -> list[str]:
    return [d.what for d in h.state.story(uid, rid)]


def test_a_claim_the_driver_holds_is_adopted_loaded_without_a_callback() -> None:
    h = budget()
    held(h, ("g-a", 1000, 1), nbytes=4096)
    assert h.timers[ADOPT_TIMER] == h.now + ManagerParams().adopt_grace_s
    out = claim(h, 1000, 1, "loaded", "g-a", size=1)
    assert [type(i) for i in for_key(out, 1000, 1)] == [ev.IssueGrant]
    assert h.state_of(1000, 1) == "loaded"
    assert h.state.budget_used == 2
    assert ADOPT_TIMER not in h.timers  # every held grant claimed: the window closes
    assert whats(h, 1000, 1) == ["held by driver after restart", "adopted"]
    # It behaves as any holder afterwards.
    out = h.unloaded(1000, 1)
    assert completes(out) == {(1000, 1): RequestStatus.COMPLETE}


def test_a_claim_no_driver_knows_becomes_granted_not_loaded() -> None:
    h = budget()
    out = claim(h, 1000, 1, "loaded", "g-lost")
    assert out == [ev.IssueGrant(1000, 1, "g-lost", "default")]
    assert h.state_of(1000, 1) == "granted"
    h.loaded(1000, 1)  # the app prepares again under its grant
    assert h.state_of(1000, 1) == "loaded"


def test_an_unclaimed_held_grant_is_revoked_when_the_window_closes() -> None:
    h = budget()
    held(h, ("g-a", 1000, 1), ("g-b", 1001, 1))
    claim(h, 1000, 1, "loaded", "g-a")
    out = h.advance(ManagerParams().adopt_grace_s)
    assert [i for i in out if isinstance(i, ev.EndGrant)] == [
        ev.EndGrant("g-b", 1001, 1, revoked=True)]
    assert "unclaimed grant revoked" in whats(h, 1001, 1)


def test_new_requests_wait_while_held_grants_may_still_be_claimed() -> None:
    h = budget()
    held(h, ("g-a", 1000, 1))
    out = h.request(2000, 1, size=2)
    assert status_of(out, 2000, 1) == LoadStatus.NOT_PRIORITIZED
    # The claim arrives: adopting it fills the budget; the newcomer is granted only what fits.
    out = claim(h, 1000, 1, "loaded", "g-a", size=1)
    assert granted(out) == []  # 2 held + 4 > 4
    h2 = budget()
    held(h2, ("g-a", 1000, 1))
    h2.request(2000, 1, size=0)
    out = claim(h2, 1000, 1, "loaded", "g-a", size=1)
    assert granted(out) == [(2000, 1)]


def test_a_claim_no_driver_knows_gets_no_more_than_a_new_request_would() -> None:
    """Only the client vouches for a grant no driver holds: it may not push the budget over
    its cap (others would be asked to unload for it) nor pass a request waiting ahead."""
    h = budget()
    h.importance(1000, 400)
    h.importance(2000, 100)
    h.request(1000, 1, size=2)
    h.loaded(1000, 1)  # 4 of 4 used
    out = claim(h, 2000, 1, "loaded", "g-forged", size=0)
    assert completes(out) == {(2000, 1): RequestStatus.REVOKED}
    assert unloads(out) == {}
    assert h.state_of(2000, 1) is None and h.state_of(1000, 1) == "loaded"
    assert "no room" in str(h.state.story(2000, 1)[-1].details)
    h.unloaded(1000, 1)
    out = claim(h, 2000, 2, "granted", "g-forged-2", size=0)
    assert h.state_of(2000, 2) == "granted"  # room again, nobody waiting: as a new request


def test_a_claim_for_another_requests_grant_is_refused_revoked() -> None:
    h = budget()
    held(h, ("g-a", 1000, 1))
    out = claim(h, 1000, 2, "loaded", "g-a")
    assert completes(out) == {(1000, 2): RequestStatus.REVOKED}
    assert h.state_of(1000, 2) is None
    story = h.state.story(1000, 2)
    assert story[-1].what == "not adopted" and "not this one" in str(story[-1].details)
    out = claim(h, 1000, 1, "loaded", "g-a")  # the rightful owner still gets it
    assert h.state_of(1000, 1) == "loaded"


def test_a_grant_claimed_twice_is_refused_the_second_time() -> None:
    h = budget()
    claim(h, 1000, 1, "granted", "g-x")
    out = claim(h, 1001, 1, "granted", "g-x")
    assert completes(out) == {(1001, 1): RequestStatus.REVOKED}
    assert "already held" in str(h.state.story(1001, 1)[-1].details)


def test_a_waiting_claim_is_a_new_request() -> None:
    h = budget()
    out = claim(h, 1000, 1, "waiting", size=1)
    assert status_of(out, 1000, 1) == LoadStatus.CAN_LOAD_NOW
    assert whats(h, 1000, 1)[0] == "re-registered after npud restart"


def test_over_budget_after_adoption_the_worst_holder_is_asked_to_unload() -> None:
    h = budget()
    h.importance(1000, 100)
    h.importance(1001, 400)
    held(h, ("g-a", 1000, 1), ("g-b", 1001, 1))
    claim(h, 1000, 1, "loaded", "g-a", size=2)
    out = claim(h, 1001, 1, "loaded", "g-b", size=2)  # 4 + 4 > 4
    assert unloads(out) == {(1001, 1): UnloadReason.POLICY_CHANGED}
    h.unloaded(1001, 1)
    assert h.state.budget_used == 4


def test_a_claim_that_was_unloading_keeps_its_deadline_without_a_second_ask() -> None:
    h = budget()
    held(h, ("g-a", 1000, 1))
    out = claim(h, 1000, 1, "unload_requested", "g-a", unload_reason=UnloadReason.THERMAL)
    assert unloads(out) == {}
    assert h.state_of(1000, 1) == "unload_requested"
    out = h.advance(ManagerParams().unload_deadline_s)
    assert completes(out) == {(1000, 1): RequestStatus.REVOKED}


def test_client_gone_during_adoption_drops_its_adopted_requests() -> None:
    h = budget()
    held(h, ("g-a", 1000, 1), ("g-b", 1001, 1))
    claim(h, 1000, 1, "loaded", "g-a")
    out = h.gone(1000)
    assert [i for i in out if isinstance(i, ev.EndGrant)] == [
        ev.EndGrant("g-a", 1000, 1, revoked=False)]


def test_a_held_grant_is_adopted_on_the_device_of_the_driver_that_holds_it() -> None:
    h = budget(drivers=("reference", "openvino"))
    h.handle(h.mk(ev.DriverHeld, name="openvino", grants=(ev.HeldGrant("g-ov", 1000, 1),)))
    out = claim(h, 1000, 1, "loaded", "g-ov", size=2)
    assert out[0] == ev.IssueGrant(1000, 1, "g-ov", "openvino")
    assert h.state.device_of(1000, 1) == "openvino"
    assert (h.state.used_on("openvino"), h.state.used_on("reference")) == (4, 0)
    # A waiting claim keeps the device it named.
    out = claim(h, 1001, 2, "waiting", device="openvino")
    assert h.state.device_of(1001, 2) == "openvino"
    # openvino is full: its adopted holder (ranked worse) is the victim, on openvino.
    assert status_of(out, 1001, 2) == LoadStatus.WAIT_FOR_UNLOAD
    assert [(i.uid, i.device) for i in out if isinstance(i, ev.AskUnload)] == [
        (1000, "openvino")]
