"""ManagerState: npud's decisions as a pure, synchronous state machine.

``handle(event) -> list[Instruction]`` (types in :mod:`.events`). No I/O and
no clock reads: time is ``event.now``; grant ids come from an injected
callable. An event the caller got wrong raises an ``npumanager.errors``
exception before anything changes.

This module holds the lifecycle: what each event does to which request, and
the transitions with the instructions they emit. Its parts live next to it:
the live requests and their indexes (:mod:`.table`), request records and the
rank queue (:mod:`.ranking`), the devices with a budget, a queue and holders
each (:mod:`.devices`), a budget and its thermal capacity (:mod:`.budget`), who
is asked to unload (:mod:`.victims`), the events that change a device's capacity
(:mod:`.capacity`), the decision log and stories
(:mod:`.decisions`), the invariants and the dump (:mod:`.state_checks`).

One budget per device. A request names its device (None: the first); it
competes only with that device's holders and waiters, its victims are only that
device's holders, and its grant is valid for that device only (``IssueGrant``
names it). The policy and its weights are global; each device's budget follows
its own memory (MEMORY), its own ceilings (``[policy.devices]``) and its own
thermal status (the worse of the machine's and its driver's thermal model).
Everything below about "the budget", "the queue" and "holders" is per device.

How it decides (ARCHITECTURE "The manager", with these precise choices):

* A request's rank is importance(uid) + model priority (NORMAL 0, BACKGROUND
  1000, OPPORTUNISTIC 2000); lower ranks first, ties first come first served.
* Only holders (GRANTED, LOADED, UNLOAD_REQUESTED) count against the budget,
  and only GRANTED/LOADED holders are victims. A grant is issued only when it
  fits next to every holder, those already asked to unload included, so the
  budget is never exceeded; holders asked to unload still count until they
  report unloaded or are revoked at the unload deadline.
* Waiters that may be granted now sit in a rank-ordered queue. Service is
  strictly in rank order (head of line): a request is never granted while a
  better-ranked (or equal-ranked, earlier) eligible waiter waits, so a big
  request at the head is not starved by a stream of smaller, later or worse
  ranked ones. Only the head may ask victims to unload. Waiters that cannot be
  granted whatever happens to the queue — thermally held back, or larger than
  the whole (scaled) budget — are *parked* instead and do not block others;
  they rejoin the queue when the thermal status, policy or budget changes.
* Victims of the head: holders of other uids from the least important rank
  up, never one more important than the head; an equal-rank holder yields
  only if the head's uid completed work less recently. Among equal ranks the
  uid that completed work most recently goes first, then the newest request.
  Victims are asked only if, with the holders already unloading, they free
  enough; else the head gets NOT_PRIORITIZED and stays queued.
* The thermal governor (every policy): the budget is scaled per status; from
  ``opportunistic_wait_from`` (MODERATE) new OPPORTUNISTIC requests are
  parked; holders ranked worse than the status's keep-rank are asked to unload
  (THERMAL), worst first; requests ranked worse wait parked.
* Shrinking the budget (policy change, thermal, a driver reporting less
  memory, a model larger than declared under MEMORY) asks the worst-ranked
  holders of any uid to unload until the rest fits (POLICY_CHANGED, THERMAL,
  MEMORY_PRESSURE). A driver going down shrinks the MEMORY budget for new
  grants only: its holders keep their grants while it restarts.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from typing import Any

from npumanager.constants import (
    LoadStatus,
    ModelPriority,
    ModelSize,
    RequestStatus,
    UnloadReason,
)
from npumanager.errors import InvalidArgument
from npumanager.hal.types import EndReason
from npumanager.service import adoption, capacity, ending
from npumanager.service.decisions import DecisionLog
from npumanager.service.devices import Device, DeviceTable
from npumanager.service.events import (
    ArmTimer,
    AskUnload,
    CancelLoad,
    CancelTimer,
    ClaimRequest,
    ClientGone,
    DriverDown,
    DriverHeld,
    DriverUp,
    EndGrant,
    Event,
    GrantEndApplied,
    HeldGrant,
    ImportanceChanged,
    Instruction,
    IssueGrant,
    ModelLoaded,
    ModelMemory,
    ModelUnloaded,
    PolicySet,
    RequestDropped,
    RequestEnded,
    RequestKey,
    RequestLoad,
    SendCanLoad,
    SendComplete,
    ThermalChanged,
    TimerFired,
    WorkEnded,
)
from npumanager.service.policy import ManagerParams, PolicySettings
from npumanager.service.ranking import ManagedRequest, RequestState
from npumanager.service.state_reads import StateReads
from npumanager.service.table import RequestTable
from npumanager.service.victims import holders_to_shed, preemption_victims

__all__ = ["ManagerParams", "ManagerState", "RequestState"]

_Q, _W = RequestState.QUEUED, RequestState.WAITING
_G, _L, _U = RequestState.GRANTED, RequestState.LOADED, RequestState.UNLOAD_REQUESTED
# Identity sets (RequestState is a plain Enum: its hash is a Python call, ``in`` a frozenset
# of them costs more than a tuple scan of identities).
_HOLDS = (_G, _L, _U)


def _default_grant_ids() -> str:
    return secrets.token_hex(16)


def _by_seq(req: ManagedRequest) -> int:
    return req.seq


# Enum names by dict (an IntEnum hashes as its int): ``.name`` is a property call.
_SIZE_NAMES = {m: m.name for m in ModelSize}
_PRIORITY_NAMES = {m: m.name for m in ModelPriority}
_ENDED = {m: m.name.lower() for m in RequestStatus}


class ManagerState(StateReads):
    """The manager's whole state; see the module docstring for the rules.

    What it owns, by part: the live requests and their indexes
    (:class:`~.table.RequestTable`), the devices (:class:`~.devices.DeviceTable`), each with
    its waiters in rank order (:class:`~.ranking.RankQueue`) or parked, its holders and its
    budget with its thermal capacity (:class:`~.budget.Budget`), the uids' importance and
    last completed work, and the decision log (:class:`~.decisions.DecisionLog`).
    """

    def __init__(
        self,
        params: ManagerParams | None = None,
        *,
        grant_ids: Callable[[], str] = _default_grant_ids,
    ) -> None:
        self.params = params or ManagerParams()
        self._grant_ids = grant_ids
        self._table = RequestTable(self.params.max_requests_per_uid)
        self._devices = DeviceTable(self.params)
        self._settings: PolicySettings = self.params.policy
        self._importance: dict[int, int] = {}
        self._last_completed: dict[int, float] = {}
        self._seq = itertools.count()
        self._log = DecisionLog(self.params.decision_log_size)
        self._record = self._log.record
        self._out: list[Instruction] = []
        self._last_out: list[Instruction] = []
        self._ev: Event | None = None
        #: Grants drivers hold that no client claimed yet, and when the window to claim
        #: them closes (:mod:`.adoption`); while any wait, nothing new is granted.
        self._held: dict[str, HeldGrant] = {}
        self._adopt_until: float | None = None
        #: Ended grants whose driver has not applied the end yet (:mod:`.ending`).
        self._ending: dict[str, ending.Ending] = {}

    # --- events ---------------------------------------------------------------

    def handle(self, event: Event) -> list[Instruction]:
        """Apply one event; return the instructions to carry out, in order."""
        method = self._HANDLERS.get(type(event))
        if method is None:
            raise InvalidArgument(f"ManagerState cannot handle {type(event).__name__}")
        self._ev = event
        self._out = []
        method(self, event)
        out, self._out = self._out, []
        self._last_out = out
        return out

    def _on_request(self, ev: RequestLoad) -> None:
        self._table.check_new(ev.uid, ev.conn, ev.request_id)
        dev = self._devices.get(ev.device)  # InvalidArgument naming the known devices
        try:
            size = ev.size if type(ev.size) is ModelSize else ModelSize(ev.size)
            priority = (
                ev.priority if type(ev.priority) is ModelPriority else ModelPriority(ev.priority)
            )
        except ValueError as exc:
            raise InvalidArgument(f"bad model load request: {exc}") from None
        key = (ev.uid, ev.request_id)
        req = ManagedRequest(
            key, ev.conn, ev.pid, size, priority, ev.now, next(self._seq),
            self.importance(ev.uid) + int(priority), dev,
        )  # fmt: skip
        self._table.add(req)
        self._decide(key, "requested", size=_SIZE_NAMES[size],
                     priority=_PRIORITY_NAMES[priority], rank=req.rank, device=dev.name)
        budget = dev.budget
        charge = budget.charge(req)
        if not budget.eligible(req, charge):
            req.dev.park(req)
            self._set_waiting(req, _Q)
        else:
            queue = dev.queue
            head = queue.peek()
            if self._held or (head is not None and head.rank <= req.rank):
                # Never granted past a better (or equal, earlier) waiter: it queues behind.
                queue.push(req)
                self._set_waiting(req, _Q)
            elif budget.fits(charge):
                self._grant(req, charge)  # the hot path: O(1) whatever waits behind it
                return
            else:
                queue.push(req)  # the new head: it may ask victims
                self._seek_victims(req)
        if req.state.waits and self.params.max_queue_wait_s > 0:
            self._arm(req, "wait", ev.now + self.params.max_queue_wait_s)

    def _on_cancel(self, ev: CancelLoad) -> None:
        req = self._table.get(ev.uid, ev.request_id)
        self._finish(req, RequestStatus.CANCELLED)
        self._pump(req.dev)

    def _on_loaded(self, ev: ModelLoaded) -> None:
        req = self._table.get(ev.uid, ev.request_id)
        if req.state not in _HOLDS:
            raise InvalidArgument(f"request {ev.request_id} was not granted; it cannot be loaded")
        if req.state is _G:
            req.state = _L
        if not req.loaded:
            req.loaded = True
            self._decide(req.key, "loaded")

    def _on_unloaded(self, ev: ModelUnloaded) -> None:
        req = self._table.get(ev.uid, ev.request_id)
        if req.state not in _HOLDS:
            raise InvalidArgument(f"request {ev.request_id} was not granted; it cannot be unloaded")
        self._finish(req, RequestStatus.COMPLETE)
        self._pump(req.dev)

    def _on_client_gone(self, ev: ClientGone) -> None:
        table = self._table
        touched: set[Device] = set()
        for key in table.of_conn(ev.conn):
            req = table.requests[key]
            touched.add(req.dev)
            self._finish(req, None)
        table.forget_conn(ev.conn)
        ending.client_gone(self, ev.conn)
        for dev in self._devices:
            if dev in touched:
                self._pump(dev)

    def _on_work_ended(self, ev: WorkEnded) -> None:
        if ev.reason != EndReason.COMPLETED:
            return
        self._last_completed[ev.uid] = ev.now
        only = None if ev.device is None else self._devices.by_name.get(ev.device)
        asked: set[Device] = set()
        for key in self._table.of_uid(ev.uid):
            h = self._table.requests[key]
            if (h.state in (_G, _L) and (only is None or h.dev is only)
                    and h.dev.queue.peer_waiting(h.rank, ev.uid)):
                self._ask_unload(h, UnloadReason.FAIRNESS)
                asked.add(h.dev)
        for dev in self._devices:
            if dev in asked:
                self._pump(dev)  # the head may now wait for this unload (WAIT_FOR_UNLOAD)

    def _on_timer(self, ev: TimerFired) -> None:
        if ev.key == adoption.ADOPT_TIMER:
            adoption.on_adopt_timer(self, ev)
            return
        if ev.key.startswith(ending.TIMER_PREFIX):
            ending.on_timer(self, ev)
            return
        key = self._table.timers.get(ev.key)
        if key is None:
            return  # cancelled or already settled: a late timer does nothing
        req = self._table.requests[key]
        if ev.key == req.unload_timer:
            assert req.unload_deadline is not None
            if ev.now < req.unload_deadline:
                self._emit(ArmTimer(ev.key, req.unload_deadline))  # fired early: wait on
                return
            del self._table.timers[ev.key]
            req.unload_timer = None
            self._decide(key, "unload deadline passed")
            self._finish(req, RequestStatus.REVOKED)
        else:
            at = req.created + self.params.max_queue_wait_s
            if ev.now < at:
                self._emit(ArmTimer(ev.key, at))
                return
            del self._table.timers[ev.key]
            req.wait_timer = None
            self._decide(key, "max queue wait passed")
            self._finish(req, RequestStatus.CANCELLED)
        self._pump(req.dev)

    _HANDLERS: dict[type[Event], Callable[[ManagerState, Any], None]] = {
        RequestLoad: _on_request,
        CancelLoad: _on_cancel,
        ModelLoaded: _on_loaded,
        ModelUnloaded: _on_unloaded,
        ClientGone: _on_client_gone,
        ImportanceChanged: capacity.on_importance,
        PolicySet: capacity.on_policy,
        WorkEnded: _on_work_ended,
        ThermalChanged: capacity.on_thermal,
        TimerFired: _on_timer,
        DriverUp: capacity.on_driver_up,
        DriverDown: capacity.on_driver_down,
        ModelMemory: capacity.on_model_memory,
        DriverHeld: adoption.on_driver_held,
        ClaimRequest: adoption.on_claim,
        GrantEndApplied: ending.on_applied,
    }

    # --- the rules --------------------------------------------------------------

    def _pump(self, dev: Device) -> None:
        """Grant ``dev``'s queue head while it fits; a head that does not fit may ask victims."""
        if self._held:
            return  # adopting after a restart: held grants may still be claimed
        budget = dev.budget
        queue = dev.queue
        while (head := queue.peek()) is not None:
            if budget.fits(budget.charge(head)):
                self._grant(head)
                continue
            self._seek_victims(head)
            return

    def _seek_victims(self, req: ManagedRequest) -> None:
        """The head does not fit: ask victims on its device to make room (WAIT_FOR_UNLOAD),
        if enough can."""
        dev = req.dev
        chosen = preemption_victims(req, dev.holders.values(), dev.budget, self._last_completed)
        if chosen is None:
            self._set_waiting(req, _Q)  # not enough: ask nobody
            return
        for h in chosen:
            self._ask_unload(h, UnloadReason.PREEMPTED)
        self._set_waiting(req, _W)

    def _enforce(self, dev: Device, reason: UnloadReason) -> None:
        """Ask ``dev``'s holders to unload until its thermal rank limit and budget hold."""
        for h, why in holders_to_shed(dev.holders.values(), dev.budget, self._last_completed,
                                      reason):
            self._ask_unload(h, why)

    def _rebalance(self, devs: list[Device], reason: UnloadReason) -> None:
        """After a device's budget, the policy or a thermal status changed: shed, re-sort
        waiters, grant — on each of ``devs``."""
        for dev in devs:
            self._enforce(dev, reason)
            budget = dev.budget
            waiters = [*dev.queue.ordered(), *dev.parked.values()]
            for req in sorted(waiters, key=_by_seq):
                if budget.eligible(req) != req.in_queue:
                    req.dev.unplace(req)
                    req.dev.place(req)
            self._pump(dev)

    # --- transitions ------------------------------------------------------------

    def _grant(self, req: ManagedRequest, charge: int | None = None) -> None:
        state = req.state
        if state is _Q or state is _W:
            req.dev.unplace(req)
        if req.wait_timer is not None:
            self._cancel_timer(req, "wait")
        grant_id = self._grant_ids()
        self._table.add_holder(req, grant_id)
        dev = req.dev
        dev.holders[req.key] = req
        req.grant_id = grant_id
        req.state = _G
        budget = dev.budget
        req.charge = budget.charge(req) if charge is None else charge
        budget.hold(req.charge)
        uid, rid = req.key
        out = self._out
        out.append(IssueGrant(uid, rid, grant_id, dev.name, int(req.priority)))
        out.append(SendCanLoad(req.conn, uid, rid, LoadStatus.CAN_LOAD_NOW, grant_id, dev.name))
        req.last_status = LoadStatus.CAN_LOAD_NOW
        self._decide(req.key, "granted", grant=grant_id[:8], charge=req.charge,
                     used=budget.used)

    def _set_waiting(self, req: ManagedRequest, state: RequestState) -> None:
        req.state = state
        status = LoadStatus.NOT_PRIORITIZED if state is _Q else LoadStatus.WAIT_FOR_UNLOAD
        if req.last_status != status:
            req.last_status = status
            self._emit(SendCanLoad(req.conn, req.uid, req.request_id, status, None,
                                   req.dev.name))
            self._decide(req.key, status.name.lower(), rank=req.rank, parked=req.parked)

    def _ask_unload(self, h: ManagedRequest, reason: UnloadReason, *, tell: bool = True
                    ) -> None:
        assert h.state in (_G, _L), f"{h.key} asked to unload in state {h.state}"
        h.state = _U
        h.unload_reason = reason
        h.dev.budget.unloading(h.charge)
        at = self._now() + self.params.unload_deadline_s
        h.unload_deadline = at
        if tell:
            self._emit(AskUnload(h.conn, h.uid, h.request_id, reason, h.dev.name))
        self._arm(h, "unload", at)
        self._decide(h.key, "asked to unload", reason=reason.name, deadline=at)

    def _finish(self, req: ManagedRequest, status: RequestStatus | None) -> None:
        """End a request: COMPLETE, CANCELLED, REVOKED, or ``None`` (its client is gone: silent)."""
        if req.wait_timer is not None:
            self._cancel_timer(req, "wait")
        if req.unload_timer is not None:
            self._cancel_timer(req, "unload")
        state = req.state
        if state is _Q or state is _W:
            req.dev.unplace(req)
        uid, rid = req.key
        dev = req.dev
        deferred = False
        if state in _HOLDS:
            grant_id = self._table.remove_holder(req)
            del dev.holders[req.key]
            # While its driver is up, the memory is free and the app answered only once the
            # driver applied the end (service/ending.py).
            deferred = ending.begin(self, req, grant_id, status, unloading=state is _U)
            if not deferred:
                dev.budget.release(req.charge, unloading=state is _U)
                self._emit(EndGrant(grant_id, uid, rid,
                                    revoked=status is RequestStatus.REVOKED))
        if status is not None:
            # Counted at the decision: the answer may wait for the driver's ack, and its
            # client may be gone by then (service/ending.py).
            self._emit(RequestEnded(uid, rid, status, dev.name))
            if not deferred:
                self._emit(SendComplete(req.conn, uid, rid, status, dev.name))
        else:  # its client left first: nobody to answer, but counted (metrics)
            self._emit(RequestDropped(uid, rid, dev.name))
        self._table.remove(req)
        what = _ENDED[status] if status is not None else "dropped (client gone)"
        if deferred:  # the answer goes out once the driver applied the end (ending.py)
            self._decide(req.key, what, was=state.value, answer_after="the driver's ack")
        else:
            self._decide(req.key, what, was=state.value)

    def _arm(self, req: ManagedRequest, kind: str, at: float) -> None:
        name = f"{kind}:{req.uid}:{req.request_id}:{req.seq}"
        setattr(req, f"{kind}_timer", name)
        self._table.timers[name] = req.key
        self._emit(ArmTimer(name, at))

    def _cancel_timer(self, req: ManagedRequest, kind: str) -> None:
        name: str | None = getattr(req, f"{kind}_timer")
        if name is not None:
            setattr(req, f"{kind}_timer", None)
            del self._table.timers[name]
            self._emit(CancelTimer(name))

    # --- plumbing ---------------------------------------------------------------

    def _now(self) -> float:
        assert self._ev is not None
        return self._ev.now

    def _emit(self, ins: Instruction) -> None:
        self._out.append(ins)

    def _emit_arm(self, key: str, at: float) -> None:
        self._emit(ArmTimer(key, at))

    def _decide(self, key: RequestKey | None, what: str, **details: object) -> None:
        ev = self._ev
        assert ev is not None
        self._record((ev.now, ev.stimulus_id, key, what, details))

    # --- introspection ---------------------------------------------------------

    def validate(self) -> None:
        """Check every invariant; raise AssertionError naming the first one broken."""
        from npumanager.service.state_checks import validate_state

        validate_state(self)

    def dump(self, now: float) -> dict[str, Any]:
        """A JSON-able snapshot (what ``npu status --json`` prints); ``now`` gives ages."""
        from npumanager.service.state_checks import dump_state

        return dump_state(self, now)

    def __repr__(self) -> str:
        c = self._table.counts()
        parts = [f"{c['loaded']} loaded", f"{c['granted']} granted"]
        if c["unload_requested"]:
            parts.append(f"{c['unload_requested']} unloading")
        parts.append(f"{c['queued'] + c['waiting']} waiting")
        return f"policy={self._settings.name} {self._devices.describe()} | " + ", ".join(parts)
