"""An ended grant's memory is free, and its app answered, only once its driver applied the
end (service/ending.py), on virtual time: the driver's acknowledgement is an event, its
absence a timer."""

from __future__ import annotations

from dataclasses import replace

from npumanager.constants import LoadStatus, ModelSize, Policy, RequestStatus, UnloadReason
from npumanager.service import events as ev
from npumanager.service.policy import ManagerParams
from tests.service.state_harness import Harness

BIG = int(ModelSize.GREATER_THAN_2G)  # weight 4: the whole default budget
FG, BG = 100, 400  # importance: foreground, cached


def of(out: list[ev.Instruction], cls: type) -> list:  # type: ignore[type-arg]
    return [i for i in out if isinstance(i, cls)]


def grants_of(out: list[ev.Instruction]) -> list[tuple[int, int]]:
    return [(i.uid, i.request_id) for i in of(out, ev.IssueGrant)]


def two_apps(ack_s: float = 10.0) -> Harness:
    """uid 2 (cached) holds the whole budget on a driver that is up; uid 1 (foreground)
    asks for it too: uid 2 is asked to unload."""
    h = Harness(replace(ManagerParams(), grant_end_ack_s=ack_s), policy=Policy.BUDGET,
                drivers=("reference",), auto_ack=False)
    h.driver_up("reference")
    h.importance(1, FG)
    h.importance(2, BG)
    h.request(2, 1, size=BIG)
    h.loaded(2, 1)
    out = h.request(1, 1, size=BIG)
    assert of(out, ev.AskUnload)[0].reason == UnloadReason.PREEMPTED
    return h


def test_memory_is_not_granted_again_before_the_driver_applied_the_end() -> None:
    h = two_apps()
    out = h.unloaded(2, 1)
    # The driver is told (asked to acknowledge); the app is not answered yet, and the
    # memory is not free: the foreground waiter is not granted.
    [end] = of(out, ev.EndGrant)
    assert end.ack and not end.revoked
    assert of(out, ev.SendComplete) == [] and grants_of(out) == []
    assert h.state.request_state(1, 1) is not None and h.state.budget_used == 4
    assert [e["uid"] for e in h.state.dump(h.now)["ending"]] == [2]
    h.advance(9.9)  # nothing happens while the driver has time left
    assert h.state.budget_used == 4
    out = h.ack(end.grant_id)
    # Acknowledged: the app hears COMPLETE, then the waiter is granted, in that order.
    assert [type(i) for i in out if not isinstance(i, ev.CancelTimer)] == [
        ev.SendComplete, ev.IssueGrant, ev.SendCanLoad]
    assert of(out, ev.SendComplete)[0].status == RequestStatus.COMPLETE
    assert grants_of(out) == [(1, 1)]
    assert h.state.dump(h.now)["ending"] == []
    assert h.ack(end.grant_id) == []  # a late, repeated acknowledgement does nothing


def test_only_the_grants_own_driver_can_acknowledge_its_end() -> None:
    h = two_apps()
    [end] = of(h.unloaded(2, 1), ev.EndGrant)
    assert h.ack(end.grant_id, driver="other") == []  # not the driver that holds it
    assert h.state.budget_used == 4 and [e["uid"] for e in h.state.dump(h.now)["ending"]] == [2]
    out = h.ack(end.grant_id)
    assert grants_of(out) == [(1, 1)]


def test_a_revoked_grant_is_answered_revoked_after_the_ack() -> None:
    h = two_apps()
    out = h.advance(5.0)  # uid 2 never reports unloaded: the unload deadline passes
    [end] = of(out, ev.EndGrant)
    assert end.revoked and end.ack and of(out, ev.SendComplete) == []
    out = h.ack(end.grant_id)
    assert [c.status for c in of(out, ev.SendComplete)] == [RequestStatus.REVOKED]
    assert grants_of(out) == [(1, 1)]


def test_a_driver_that_never_acknowledges_is_restarted_and_the_end_applied() -> None:
    h = two_apps(ack_s=2.0)
    [end] = of(h.unloaded(2, 1), ev.EndGrant)
    out = h.advance(1.99)
    assert out == [] and h.state.budget_used == 4
    out = h.advance(0.01)
    # Hung: restarted (killed first), then the end counts as applied.
    assert [type(i) for i in out] == [ev.RestartDriver, ev.SendComplete, ev.IssueGrant,
                                      ev.SendCanLoad]
    assert of(out, ev.RestartDriver)[0].driver == "reference"
    assert "did not acknowledge" in of(out, ev.RestartDriver)[0].reason
    assert grants_of(out) == [(1, 1)]
    story = [d.what for d in h.state.story(2, 1)]
    assert story[-3:] == ["complete", "grant end not acknowledged",
                          "grant end applied (driver restarted)"]
    assert h.ack(end.grant_id) == []  # the dead driver's late word changes nothing


def test_a_driver_going_down_applies_the_end_of_its_grants() -> None:
    h = two_apps()
    h.unloaded(2, 1)
    out = h.driver_down("reference")
    # Its process is gone, and the grant's models with it: COMPLETE now, no restart asked.
    assert [c.status for c in of(out, ev.SendComplete)] == [RequestStatus.COMPLETE]
    assert of(out, ev.RestartDriver) == []


def test_without_a_driver_up_the_end_applies_at_once() -> None:
    h = Harness(policy=Policy.BUDGET, auto_ack=False)  # no driver: a pure manager
    h.request(1, 1, size=BIG)
    out = h.unloaded(1, 1)
    assert [type(i) for i in out] == [ev.EndGrant, ev.RequestEnded, ev.SendComplete]
    assert not of(out, ev.EndGrant)[0].ack


def test_ack_zero_is_fire_and_forget() -> None:
    h = two_apps(ack_s=0.0)
    out = h.unloaded(2, 1)
    assert not of(out, ev.EndGrant)[0].ack
    assert of(out, ev.SendComplete) and grants_of(out) == [(1, 1)]


def test_a_client_gone_while_its_grant_ends_gets_no_answer() -> None:
    h = two_apps()
    [end] = of(h.unloaded(2, 1), ev.EndGrant)
    h.gone(2)
    assert h.state.budget_used == 4  # still held by the driver
    out = h.ack(end.grant_id)
    assert of(out, ev.SendComplete) == [] and grants_of(out) == [(1, 1)]


def test_an_ending_grant_counts_as_being_freed_so_nobody_else_is_asked() -> None:
    """A third app arriving while the end is pending does not make npud ask more victims:
    the ending grant's memory is already on its way out."""
    h = two_apps()
    h.importance(3, BG)
    h.request(3, 1, size=int(ModelSize.LESS_THAN_1GB))
    h.unloaded(2, 1)
    assert h.state.dump(h.now)["budget"]["unloading"] == 4
    out = h.request(4, 1, size=BIG)
    assert of(out, ev.AskUnload) == []
    out = h.policy(Policy.BUDGET, max_budget=8)  # re-charged under a new policy: still held
    assert h.state.dump(h.now)["budget"]["used"] >= 4


def test_cancel_of_a_granted_request_waits_for_the_driver_too() -> None:
    h = Harness(policy=Policy.BUDGET, drivers=("reference",), auto_ack=False)
    h.driver_up("reference")
    h.request(1, 1, size=BIG)
    out = h.request(1, 2, size=BIG)
    assert of(out, ev.SendCanLoad)[0].status != LoadStatus.CAN_LOAD_NOW
    out = h.cancel(1, 1)
    assert [c for c in of(out, ev.SendComplete)] == [] and grants_of(out) == []
    out = h.ack(of(out, ev.EndGrant)[0].grant_id)
    assert [c.status for c in of(out, ev.SendComplete)] == [RequestStatus.CANCELLED]
    assert grants_of(out) == [(1, 2)]
