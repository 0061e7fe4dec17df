"""ManagerState's invariants (``validate``) and its JSON snapshot (``dump``).

Kept apart from the state machine so the rules in :mod:`.state` read on
their own; both functions only read the state.

The invariants, precisely (every budget, queue and holder set is one device's):

1. Every live request is in exactly one place: a holder (GRANTED, LOADED,
   UNLOAD_REQUESTED) with exactly one live grant, or a waiter (QUEUED,
   WAITING) either in the rank queue (eligible) or parked (not eligible now);
   never PENDING between events. Every index agrees with the request table.
2. The running sums equal the holders' charges, and each charge is what the
   active policy charges for it.
3. The budget: the charges of holders *not* asked to unload never exceed the
   (thermally scaled) budget; holders asked to unload may still hold until
   they report unloaded or their unload deadline revokes them. (Grants are
   issued only when they fit next to every holder, so that is the only excess
   possible.) Under MEMORY the budget here includes drivers that are down and
   restarting, whose holders keep their grants.
4. Thermal: every holder ranked worse than the status's keep-rank has been
   asked to unload; every parked waiter is really ineligible.
5. Liveness: the head of the queue does not fit (else it would be granted).
6. Every holder asked to unload has a deadline timer; every timer names a
   live request.
7. The last ``handle`` emitted nothing for a request after its SendComplete.
8. Devices: every request's device is in the device table; a device's holders,
   queue and parked waiters are exactly its requests in those states; every
   device's budget runs under the policy in force and the worse of the
   machine's thermal status and its own; names are unique, ``first`` is the
   first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from npumanager.constants import LoadStatus
from npumanager.service import ending
from npumanager.service import policy as pol
from npumanager.service.events import (
    AskUnload,
    EndGrant,
    IssueGrant,
    SendCanLoad,
    SendComplete,
)
from npumanager.service.ranking import RequestState

if TYPE_CHECKING:
    from npumanager.service.state import ManagerState

_EXPECTED_STATUS = {
    RequestState.QUEUED: LoadStatus.NOT_PRIORITIZED,
    RequestState.WAITING: LoadStatus.WAIT_FOR_UNLOAD,
    RequestState.GRANTED: LoadStatus.CAN_LOAD_NOW,
    RequestState.LOADED: LoadStatus.CAN_LOAD_NOW,
    RequestState.UNLOAD_REQUESTED: LoadStatus.CAN_LOAD_NOW,
}


def validate_state(s: ManagerState) -> None:
    t = s._table
    reqs = t.requests
    devs = s._devices
    assert devs.first is next(iter(devs)), "the first device is not the table's first"
    for name, dev in devs.by_name.items():
        assert dev.name == name, f"device {dev.name} filed as {name}"
        assert dev.budget.settings is s._settings, f"{name}: budget under another policy"
        assert dev.budget.thermal == max(s._devices.thermal, dev.own_thermal), (
            f"{name}: thermal {dev.budget.thermal.name}, machine {s._devices.thermal.name}, "
            f"own {dev.own_thermal.name}")
        for key, h in dev.holders.items():
            assert h.dev is dev and h.key == key and h.state.holds, f"{key}: stray holder of {name}"
        for key, r in dev.parked.items():
            assert r.dev is dev and r.parked, f"{key}: stray parked waiter of {name}"
    assert sum(len(d.holders) for d in devs) == len(t.holders), "per-device holders disagree"
    # 1. one place each, indexes agree
    for key, r in reqs.items():
        assert r.key == key, f"{key}: stored under the wrong key {r.key}"
        assert devs.by_name.get(r.dev.name) is r.dev, f"{key}: its device {r.dev.name} is unknown"
        b = r.dev.budget
        assert r.state is not RequestState.PENDING, f"{key}: left PENDING after an event"
        assert key in t.by_conn.get(r.conn, ()), f"{key}: missing from conn {r.conn} index"
        assert key in t.by_uid.get(r.uid, ()), f"{key}: missing from uid index"
        assert r.request_id in t.submitted.get(r.conn, ()), f"{key}: not marked submitted"
        assert r.last_status == _EXPECTED_STATUS[r.state], (
            f"{key}: state {r.state.value} but last answer {r.last_status}"
        )
        if r.state.holds:
            assert key in t.holders, f"{key}: holds but is not in the holder index"
            assert r.dev.holders.get(key) is r, f"{key}: not among {r.dev.name}'s holders"
            assert r.grant_id is not None and t.grants.get(r.grant_id) == key, (
                f"{key}: holder without its live grant"
            )
            assert not r.in_queue and not r.parked, f"{key}: holder still waiting"
        else:
            assert key not in t.holders, f"{key}: waiter in the holder index"
            assert r.grant_id is None, f"{key}: waiter with a grant"
            assert r.in_queue != r.parked, (
                f"{key}: waiter queued={r.in_queue} parked={r.parked} (must be exactly one)"
            )
            assert r.parked == (key in r.dev.parked), f"{key}: parked flag disagrees with index"
        limit = pol.rank_allowed(r.rank, b.keep)
        assert r.rank == s.importance(r.uid) + int(r.priority), f"{key}: stale rank {r.rank}"
        if r.state.holds and not limit:
            assert r.state is RequestState.UNLOAD_REQUESTED, (
                f"{key}: rank {r.rank} above thermal keep-rank {b.keep} still holding"
            )
        if r.in_queue:
            assert b.eligible(r), f"{key}: ineligible request in the queue"
        if r.parked:
            assert not b.eligible(r), f"{key}: eligible request left parked"
        if r.state is RequestState.UNLOAD_REQUESTED:
            assert r.unload_timer is not None and r.unload_deadline is not None, (
                f"{key}: asked to unload without a deadline timer"
            )
        else:
            assert r.unload_timer is None, f"{key}: unload timer outside UNLOAD_REQUESTED"
        if r.wait_timer is not None:
            assert r.state.waits, f"{key}: queue-wait timer on a holder"
    for index_name, index in (("conn", t.by_conn), ("uid", t.by_uid)):
        for k, keys in index.items():
            assert keys, f"empty {index_name} index entry {k}"
            for key in keys:
                assert key in reqs, f"{index_name} index names dead request {key}"
    for uid, keys in t.by_uid.items():
        assert len(keys) <= s.params.max_requests_per_uid, f"uid {uid}: over its request limit"
    assert set(t.holders) <= set(reqs), "holder index names dead requests"
    assert len(t.grants) == len(t.holders), (
        f"{len(t.grants)} live grants for {len(t.holders)} holders"
    )
    for g, key in t.grants.items():
        assert key in t.holders and t.holders[key].grant_id == g, f"grant {g[:8]} has no holder"
    waiting = sum(1 for r in reqs.values() if r.state.waits)
    queued = 0
    for dev in devs:
        b = dev.budget
        for key in dev.parked:
            assert key in reqs, f"parked index names dead request {key}"
        dev.queue.check()
        for r in dev.queue.ordered():
            assert r.dev is dev, f"{r.key} of {r.dev.name} queued on {dev.name}"
        queued += len(dev.queue) + len(dev.parked)
        # 2. sums and charges
        # Ended grants whose driver has not applied the end still hold, being freed.
        still = ending.sums(s, dev)
        used = sum(h.charge for h in dev.holders.values()) + still
        freeing = sum(h.charge for h in dev.holders.values()
                      if h.state is RequestState.UNLOAD_REQUESTED) + still
        assert (used, freeing) == (b.used, b.freeing), (
            f"{dev.name}: budget sums drifted: used {b.used} (really {used}), freeing "
            f"{b.freeing} ({freeing})"
        )
        for h in dev.holders.values():
            assert h.charge == b.charge(h), (
                f"{h.key}: charged {h.charge}, policy says {b.charge(h)}")
        # 3. the budget
        if b.hold_cap is not None:
            assert used - freeing <= b.hold_cap, (
                f"{dev.name}: budget exceeded: {used - freeing} held (not unloading) > "
                f"{b.hold_cap}"
            )
        # 5. liveness
        head = dev.queue.peek()
        if head is not None and not s._held:  # while adopting, waiters wait for claims
            assert not b.fits(b.charge(head)), (
                f"{dev.name}: queue head {head.key} fits but was not granted")
    assert waiting == queued, "waiters are not all queued or parked"
    for g, e in s._ending.items():
        assert g not in t.grants and e.req.key not in t.holders, f"grant {g[:8]} live and ending"
        assert e.req.charge == e.dev.budget.charge(e.req), f"ending {g[:8]}: stale charge"
    # 6. timers
    for name, key in t.timers.items():
        assert key in reqs, f"timer {name} names dead request {key}"
        r = reqs[key]
        assert name in (r.unload_timer, r.wait_timer), f"timer {name} not owned by {key}"
    # 7. nothing after a terminal answer
    ended: set[tuple[int, int]] = set()
    for ins in s._last_out:
        if isinstance(ins, SendComplete | SendCanLoad | AskUnload | IssueGrant | EndGrant):
            key = (ins.uid, ins.request_id)
            assert key not in ended, f"{ins} after the terminal answer of {key}"
            if isinstance(ins, SendComplete):
                ended.add(key)


def dump_state(s: ManagerState, now: float) -> dict[str, Any]:
    t = s._table
    devs = list(s._devices)
    first = s._devices.first
    queues = {d.name: [list(r.key) for r in d.queue.ordered()] for d in devs}
    uids = set(s._importance) | set(s._last_completed) | set(t.by_uid)
    requests = []
    for r in sorted(t.requests.values(), key=lambda r: r.seq):
        requests.append(
            {
                "uid": r.uid,
                "request_id": r.request_id,
                "device": r.dev.name,
                "conn": r.conn,
                "pid": r.pid,
                "state": r.state.value,
                "size": r.size.name,
                "priority": r.priority.name,
                "rank": r.rank,
                "grant": r.grant_id[:8] if r.grant_id else None,
                "age_s": round(now - r.created, 3),
                "charge": r.charge if r.state.holds else r.dev.budget.charge(r),
                "real_bytes": r.real_bytes,
                "loaded": r.loaded,
                "unload_reason": r.unload_reason.name if r.unload_reason is not None else None,
                "unload_deadline_in_s": (
                    round(r.unload_deadline - now, 3) if r.unload_deadline is not None else None
                ),
                "parked": r.parked,
            }
        )
    budgets = []
    for d in devs:
        sections = d.budget.dump()
        budgets.append({
            "device": d.name,
            "driver": d.driver or None,
            "up": d.budget.up,
            "placeholder": d.placeholder,
            "memory_bytes": d.budget.memory_bytes,
            **sections["budget"],
            "limits": d.budget.limits.as_dict() if d.budget.limits is not None else {},
            "thermal": {**sections["thermal"], "own_status": d.own_thermal.name},
            "holders": len(d.holders),
            "waiting": len(d.queue) + len(d.parked),
        })
    drivers: dict[str, dict[str, Any]] = {}
    for d in devs:
        if d.driver:
            e = drivers.setdefault(d.driver, {"memory_bytes": 0, "up": False, "devices": []})
            e["memory_bytes"] += d.budget.memory_bytes
            e["up"] = e["up"] or d.budget.up
            e["devices"].append(d.name)
    first_sections = first.budget.dump()
    return {
        "policy": s._settings.as_dict(),
        # The first device's budget (the one budget of a one-device machine); every
        # device's is in "budgets".
        "budget": {"device": first.name, **first_sections["budget"]},
        "budgets": budgets,
        "thermal": {**first_sections["thermal"], "status": s._devices.thermal.name,
                    "devices": {d.name: d.budget.thermal.name for d in devs}},
        "uids": {
            str(u): {
                "importance": s.importance(u),
                "app_priority": s.app_priority(u),
                "last_completed": s._last_completed.get(u),
                "last_completed_ago_s": (
                    round(now - s._last_completed[u], 3) if u in s._last_completed else None
                ),
                "requests": t.count_of_uid(u),
            }
            for u in sorted(uids)
        },
        "requests": requests,
        # Service order per device, the devices in order.
        "queue": [k for d in devs for k in queues[d.name]],
        "queues": queues,
        "parked": [list(r.key) for d in devs
                   for r in sorted(d.parked.values(), key=lambda r: r.seq)],
        "counts": s._table.counts(),
        "drivers": drivers,
        # Ended grants whose driver has not applied the end yet (their memory is not free).
        "ending": ending.dump(s, now),
        "params": {
            "unload_deadline_s": s.params.unload_deadline_s,
            "grant_end_ack_s": s.params.grant_end_ack_s,
            "max_queue_wait_s": s.params.max_queue_wait_s,
            "max_requests_per_uid": s.params.max_requests_per_uid,
            "default_importance": s.params.default_importance,
        },
        "summary": repr(s),
    }
