"""Grants that ended in npud but whose driver has not yet said it applied the end.

A grant ends (the holder reported unloaded, was revoked at its unload deadline,
cancelled, or its client died). npud tells the device's driver (``EndGrant``,
``hal.grant_ended``) and the driver releases the grant's models and refuses its
bursts. Until the driver has done that, those models can still run: if npud
answered the app (COMPLETE) and counted the memory free at once, an execution or
a burst rung right after COMPLETE could still run, and the memory could already
be granted to someone else (an accounting window). So, while the device's driver
is up, an ended grant is *ending*:

* it still counts against its device's budget, as memory being freed
  (``Budget.freeing``: a waiter's victims are not asked twice for it);
* the app's terminal answer (COMPLETE, REVOKED, CANCELLED) waits;
* the driver acknowledges (``GrantEndApplied``, after it released the models and
  revoked the grant's bursts): the memory is free, the app gets its answer, the
  next waiter is granted;
* the driver goes down (``DriverDown``: its process is gone, and its models with
  it): the same;
* the driver does not acknowledge within ``grant_end_ack_s``: it is treated as hung —
  ``RestartDriver`` (the supervisor kills it, npud's clients of it get
  ``DeviceUnavailable`` until it is back, other holders keep their grants as after
  any driver crash), then the end is applied as if acknowledged.

A device whose driver is not up (none configured, a pure manager; or restarting)
has nothing to wait for: the end applies at once, as before.

Friends of :class:`~.state.ManagerState` (like :mod:`.capacity`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npumanager.constants import RequestStatus
from npumanager.service.events import (
    ArmTimer,
    CancelTimer,
    EndGrant,
    GrantEndApplied,
    RestartDriver,
    SendComplete,
    TimerFired,
)
from npumanager.service.ranking import ManagedRequest

if TYPE_CHECKING:
    from npumanager.service.devices import Device
    from npumanager.service.state import ManagerState

TIMER_PREFIX = "ack:"


@dataclass(slots=True, eq=False)
class Ending:
    """One ended grant waiting for its driver."""

    grant_id: str
    req: ManagedRequest  # no longer live: kept for its key, connection, device and charge
    status: RequestStatus | None  # the app's answer; None: its client is gone
    since: float
    deadline: float

    @property
    def timer(self) -> str:
        return TIMER_PREFIX + self.grant_id

    @property
    def dev(self) -> Device:
        return self.req.dev


def begin(s: ManagerState, req: ManagedRequest, grant_id: str,
          status: RequestStatus | None, *, unloading: bool) -> bool:
    """``req``'s grant just ended (it left the holders). True: its driver must apply the end
    first, and this tracks it (EndGrant asking for an acknowledgement, the timer, the
    charge kept as being freed); False: nothing to wait for (the caller frees the charge
    and answers now)."""
    dev = req.dev
    wait = s.params.grant_end_ack_s
    if wait <= 0 or not dev.budget.up:
        return False
    now = s._now()
    e = Ending(grant_id, req, status, now, now + wait)
    s._ending[grant_id] = e
    if not unloading:
        dev.budget.unloading(req.charge)  # still held, but being freed
    s._emit(EndGrant(grant_id, req.uid, req.request_id,
                     revoked=status is RequestStatus.REVOKED, ack=True))
    s._emit(ArmTimer(e.timer, e.deadline))
    return True


def _apply(s: ManagerState, e: Ending, how: str) -> None:
    """The end is applied in the driver: free the charge, answer the app."""
    del s._ending[e.grant_id]
    req = e.req
    dev = req.dev
    dev.budget.release(req.charge, unloading=True)
    # (Its "complete"/"revoked"/"cancelled" decision was logged when the grant ended.)
    s._decide(req.key, how, grant=e.grant_id[:8],
              waited_ms=round((s._now() - e.since) * 1000, 3),
              answered=e.status.name if e.status is not None else None)
    if e.status is not None:
        s._emit(SendComplete(req.conn, req.uid, req.request_id, e.status, dev.name))


def on_applied(s: ManagerState, ev: GrantEndApplied) -> None:
    e = s._ending.get(ev.grant_id)
    if e is None:
        return  # applied already (its driver went down, or a late acknowledgement)
    if e.dev.driver != ev.driver:
        return  # another driver cannot vouch that this grant's models are gone
    s._emit(CancelTimer(e.timer))
    _apply(s, e, "grant end applied by the driver")
    s._pump(e.dev)


def on_timer(s: ManagerState, ev: TimerFired) -> None:
    grant_id = ev.key[len(TIMER_PREFIX):]
    e = s._ending.get(grant_id)
    if e is None:
        return  # applied meanwhile: a late timer does nothing
    if ev.now < e.deadline:
        s._emit(ArmTimer(e.timer, e.deadline))  # fired early: wait on
        return
    driver = e.dev.driver
    why = (f"driver {driver} did not acknowledge the end of grant {grant_id[:8]}… within "
           f"{s.params.grant_end_ack_s:g} s: restarting it")
    s._decide(e.req.key, "grant end not acknowledged", driver=driver,
              after_s=s.params.grant_end_ack_s)
    s._emit(RestartDriver(driver, why))
    # Killed, it holds nothing: every end waiting on it is applied (their timers cancelled).
    devs = [d for d in s._devices if d.driver == driver]
    for other in sorted(_of(s, devs), key=lambda x: x.since):
        if other is not e:
            s._emit(CancelTimer(other.timer))
        _apply(s, other, "grant end applied (driver restarted)")
    for dev in devs:
        s._pump(dev)


def driver_gone(s: ManagerState, devs: list[Device]) -> None:
    """The driver serving ``devs`` is down (its process is gone): every end waiting on it
    is applied. The caller rebalances those devices."""
    for e in sorted(_of(s, devs), key=lambda x: x.since):
        s._emit(CancelTimer(e.timer))
        _apply(s, e, "grant end applied (driver down)")


def client_gone(s: ManagerState, conn: int) -> None:
    """The client connection ``conn`` closed: its ending grants answer nobody."""
    for e in s._ending.values():
        if e.req.conn == conn:
            e.status = None


def recharge(s: ManagerState, dev: Device) -> None:
    """After the policy changed and ``dev``'s sums were reset: re-add its ending grants."""
    budget = dev.budget
    for e in _of(s, [dev]):
        e.req.charge = budget.charge(e.req)
        budget.hold(e.req.charge)
        budget.unloading(e.req.charge)


def _of(s: ManagerState, devs: list[Device]) -> list[Ending]:
    return [e for e in s._ending.values() if e.dev in devs]


def sums(s: ManagerState, dev: Device) -> int:
    """What ``dev``'s ending grants still hold (all of it being freed)."""
    return sum(e.req.charge for e in _of(s, [dev]))


def dump(s: ManagerState, now: float) -> list[dict[str, Any]]:
    return [{"grant": e.grant_id[:8], "uid": e.req.uid, "request_id": e.req.request_id,
             "device": e.dev.name, "charge": e.req.charge,
             "answer": e.status.name if e.status is not None else None,
             "waiting_s": round(now - e.since, 3), "deadline_in_s": round(e.deadline - now, 3)}
            for e in sorted(s._ending.values(), key=lambda x: x.since)]
