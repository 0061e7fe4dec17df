"""Adoption after an npud restart: ManagerState rebuilt from what drivers and clients report.

A new npud knows nothing; the world it manages kept running (ARCHITECTURE
"Restart without losing the world"). Both sides report, and this module
reconciles, inside the pure state machine (events in, instructions out):

* ``DriverHeld``: a driver that was orphaned reports the grants it still holds
  (uid, request, grant, memory). They wait in ``held`` for their client.
* ``ClaimRequest``: a reconnected client re-registers a live request (id,
  size, priority, what it knew: waiting, granted, loaded, unload requested, and
  its grant). A waiting claim is a new request. A claim whose grant a driver
  holds for that (uid, request) is *adopted*: it becomes a holder again (loaded,
  or still asked to unload, with a fresh deadline), and the client sees no
  callback at all. A claim with a grant no driver knows is adopted as granted
  but not loaded (the model is gone with its driver; the grant goes back to the
  drivers so the app may prepare again). A claim that cannot be adopted (the
  grant belongs to another request, or is claimed twice, or the uid is at its
  bound) ends ``REVOKED``, the reason in its story.
* The adoption window (``[manager] adopt_grace_s``): a held grant no client
  claimed by then is revoked in the driver. While held grants are unclaimed,
  nothing new is granted: their memory is still in use on the device, so a new
  grant could overrun the budget as the drivers see it.

Adopting may leave the budget over its cap (a smaller budget configured, a
thermal override restored): the usual policy then asks the worst holders to
unload (POLICY_CHANGED). These are friends of :class:`ManagerState`: they use
its transitions rather than keep a second copy of them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from npumanager.constants import (
    LoadStatus,
    ModelPriority,
    ModelSize,
    RequestStatus,
    UnloadReason,
)
from npumanager.errors import NpuError
from npumanager.service.events import (
    CLAIM_STATES,
    CancelTimer,
    ClaimRequest,
    DriverHeld,
    EndGrant,
    HeldGrant,
    IssueGrant,
    RequestEnded,
    RequestLoad,
    SendComplete,
    TimerFired,
)
from npumanager.service.ranking import ManagedRequest, RequestState

if TYPE_CHECKING:
    from npumanager.service.devices import Device
    from npumanager.service.state import ManagerState

#: The timer key of the adoption window.
ADOPT_TIMER = "adopt"

_G, _L, _U = RequestState.GRANTED, RequestState.LOADED, RequestState.UNLOAD_REQUESTED


def on_driver_held(s: ManagerState, e: DriverHeld) -> None:
    """A driver attached and listed the grants it holds: wait for their clients."""
    # A held grant is valid on the reporting driver's device (its first, when it has several).
    owned = s._devices.of_driver(e.name)
    device = owned[0].name if owned else s._devices.get(None).name
    fresh = [replace(g, device=device) for g in e.grants
             if g.grant_id and g.grant_id not in s._table.grants]
    for g in fresh:
        s._held[g.grant_id] = g
    s._decide(None, "driver holds grants", name=e.name, grants=len(e.grants),
              unclaimed=len(fresh))
    for g in fresh:
        s._decide((g.uid, g.request_id), "held by driver after restart", name=e.name,
                  grant=g.grant_id[:8], nbytes=g.nbytes)
    if s._held and s._adopt_until is None:
        s._adopt_until = e.now + s.params.adopt_grace_s
        s._emit_arm(ADOPT_TIMER, s._adopt_until)


def on_claim(s: ManagerState, e: ClaimRequest) -> None:
    """A reconnected client re-registers one live request."""
    if e.state not in CLAIM_STATES:
        _refuse(s, e, f"unknown claimed state {e.state!r}")
        return
    if e.state == "waiting" or not e.grant_id:
        s._decide((e.uid, e.request_id), "re-registered after npud restart", state=e.state)
        try:
            s._on_request(RequestLoad(stimulus_id=e.stimulus_id, now=e.now, uid=e.uid,
                                      pid=e.pid, conn=e.conn, request_id=e.request_id,
                                      size=e.size, priority=e.priority, device=e.device))
        except NpuError as exc:
            _refuse(s, e, str(exc))
        _settle(s)
        return
    try:
        s._table.check_new(e.uid, e.conn, e.request_id)
        held_dev = s._held[e.grant_id].device if e.grant_id in s._held else None
        dev = s._devices.get(held_dev or e.device)
        size = ModelSize(e.size)
        priority = ModelPriority(e.priority)
    except (NpuError, ValueError) as exc:
        _refuse(s, e, str(exc), grant_id=e.grant_id)
        return
    held = s._held.get(e.grant_id)
    if held is not None and (held.uid, held.request_id) != (e.uid, e.request_id):
        _refuse(s, e, f"the driver holds grant {e.grant_id[:8]} for uid {held.uid}'s "
                f"request {held.request_id}, not this one")
        return
    if held is None and e.grant_id in s._table.grants:
        _refuse(s, e, f"grant {e.grant_id[:8]} is already held by request "
                f"{s._table.grants[e.grant_id]}")
        return
    s._held.pop(e.grant_id, None)
    _adopt(s, e, size, priority, held, dev)
    _settle(s)


def _adopt(s: ManagerState, e: ClaimRequest, size: ModelSize, priority: ModelPriority,
           held: HeldGrant | None, dev: Device) -> None:
    key = (e.uid, e.request_id)
    req = ManagedRequest(key, e.conn, e.pid, size, priority, e.now, next(s._seq),
                         s.importance(e.uid) + int(priority), dev)
    if held is not None:
        req.real_bytes = held.nbytes
    budget = dev.budget
    charge = budget.charge(req)
    if held is None and not _would_grant_now(dev, req, charge):
        # No driver vouches for this grant, so only the client's word says it existed:
        # anyone can send that word. It may not jump the queue or push the budget over
        # its cap (the policy would then ask *other* apps to unload for it).
        _refuse(s, e, f"no driver holds grant {e.grant_id[:8]} and {dev.name} has no room "
                "for it now: request again")
        return
    s._table.add(req)
    s._table.add_holder(req, e.grant_id)
    dev.holders[key] = req
    req.grant_id = e.grant_id
    req.last_status = LoadStatus.CAN_LOAD_NOW
    loaded = held is not None and e.state != "granted"
    req.loaded = loaded
    req.charge = charge
    budget.hold(req.charge)
    req.state = _L if loaded else _G
    # The drivers learn (again) that this grant is live: a restarted one never had it,
    # and npud's supervisor re-sends it to drivers that come up later.
    s._emit(IssueGrant(e.uid, e.request_id, e.grant_id, dev.name, int(priority)))
    s._decide(key, "adopted", grant=e.grant_id[:8], state=req.state.value,
              held_by_driver=held is not None, claimed=e.state, charge=req.charge,
              used=budget.used, device=dev.name)
    if e.state == "unload_requested" and req.state is _L:
        # It was asked before the restart and is unloading: keep asking, with a fresh
        # deadline, but no second callback (the app already has the first).
        reason = e.unload_reason if e.unload_reason is not None else UnloadReason.PREEMPTED
        s._ask_unload(req, reason, tell=False)
    s._enforce(dev, UnloadReason.POLICY_CHANGED)


def _would_grant_now(dev: Device, req: ManagedRequest, charge: int) -> bool:
    """Whether a new request like ``req`` would be granted at once: nobody waits ahead of
    it and it fits the budget under the thermal status."""
    return dev.queue.peek() is None and dev.budget.fits(charge) and dev.budget.eligible(
        req, charge)


def _refuse(s: ManagerState, e: ClaimRequest, why: str, grant_id: str | None = None) -> None:
    """The claim cannot be adopted: the client's request ends REVOKED, the reason in its
    story. A grant only the claimant named is ended in the drivers too."""
    key = (e.uid, e.request_id)
    s._decide(key, "not adopted", reason=why, claimed=e.state)
    gid = grant_id if grant_id is not None else e.grant_id
    if gid and gid in s._held and (s._held[gid].uid, s._held[gid].request_id) == key:
        del s._held[gid]
        s._emit(EndGrant(gid, e.uid, e.request_id, revoked=True))
    s._emit(RequestEnded(e.uid, e.request_id, RequestStatus.REVOKED, e.device or ""))
    s._emit(SendComplete(e.conn, e.uid, e.request_id, RequestStatus.REVOKED,
                         e.device or ""))
    _settle(s)


def _settle(s: ManagerState) -> None:
    """Every held grant is accounted for: close the window and let waiters in."""
    if not s._held and s._adopt_until is not None:
        s._adopt_until = None
        s._emit(CancelTimer(ADOPT_TIMER))
        s._decide(None, "adoption complete")
        _pump_all(s)


def _pump_all(s: ManagerState) -> None:
    for dev in s._devices:
        s._pump(dev)


def on_adopt_timer(s: ManagerState, e: TimerFired) -> None:
    """The window closed: grants no client claimed are revoked in their driver."""
    if s._adopt_until is None:
        return
    if e.now < s._adopt_until:
        s._emit_arm(ADOPT_TIMER, s._adopt_until)
        return
    for gid, g in sorted(s._held.items()):
        s._decide((g.uid, g.request_id), "unclaimed grant revoked", grant=gid[:8],
                  after_s=s.params.adopt_grace_s)
        s._emit(EndGrant(gid, g.uid, g.request_id, revoked=True))
    s._held.clear()
    s._adopt_until = None
    s._decide(None, "adoption complete")
    _pump_all(s)
