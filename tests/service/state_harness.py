"""Drive a ManagerState on virtual time, validating after every step.

``Harness`` wraps ``handle``: it builds events with ``now`` and a stimulus id,
calls ``validate()`` after each one, fires armed timers as virtual time
advances, and feeds every instruction to ``StreamChecker``, which fails on any
per-request instruction sequence that is not a legal lifecycle.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from npumanager.constants import (
    Importance,
    LoadStatus,
    ModelPriority,
    ModelSize,
    Policy,
    RequestStatus,
    ThermalStatus,
    UnloadReason,
)
from npumanager.hal.types import EndReason
from npumanager.service import events as ev
from npumanager.service.policy import ManagerParams
from npumanager.service.state import ManagerState

Key = tuple[int, int]


@dataclass
class Life:
    """What the checker knows about one incarnation of a request key."""

    conn: int
    #: new, waiting, granting, granted, asked, grant_ended, grant_ending (its driver has not
    #: applied the end: the app's answer waits), ended
    phase: str = "new"
    grant: str | None = None
    asked: bool = False
    revoked_grant: bool = False
    statuses: list[Any] = field(default_factory=list)
    #: The terminal state decided (RequestEnded): once, at or before the SendComplete.
    decided: RequestStatus | None = None
    #: Dropped without a status (RequestDropped: its client left before any decision).
    dropped: bool = False


class StreamChecker:
    def __init__(self) -> None:
        self.lives: dict[Key, Life] = {}
        self.ended: list[tuple[Key, Life]] = []
        self.grants_live: set[str] = set()
        #: Grants drivers reported after a restart that no request has claimed.
        self.held: set[str] = set()

    def feed(self, event: ev.Event, out: list[ev.Instruction]) -> None:
        if isinstance(event, ev.DriverHeld):
            self.held |= {g.grant_id for g in event.grants}
        if isinstance(event, ev.ClaimRequest):
            key = (event.uid, event.request_id)
            assert key not in self.lives or self.lives[key].phase == "ended", key
            if event.state == "waiting" or not event.grant_id:
                self.lives[key] = Life(conn=event.conn)
            else:
                # Adopted: its grant comes back without CAN_LOAD_NOW (no callback).
                self.lives[key] = Life(conn=event.conn, phase="claimed",
                                       asked=event.state == "unload_requested")
                self.held.discard(event.grant_id)
        if isinstance(event, ev.RequestLoad):
            key = (event.uid, event.request_id)
            assert key not in self.lives or self.lives[key].phase == "ended", key
            self.lives[key] = Life(conn=event.conn)
        for ins in out:
            self._one(ins)
        if isinstance(event, ev.ClientGone):
            for key, life in self.lives.items():
                if life.conn == event.conn and life.phase != "ended":
                    assert life.grant is None or life.phase in ("grant_ended",
                                                                "grant_ending"), (
                        f"{key}: client gone but its grant was not ended"
                    )
                    assert (life.decided is None) == life.dropped, (
                        f"{key}: client gone, decided {life.decided}, dropped {life.dropped}")
                    life.phase = "ended"
        if isinstance(event, ev.RequestLoad):
            life = self.lives[(event.uid, event.request_id)]
            assert life.statuses, f"request {event.request_id} got no answer in the same step"
        for key, life in self.lives.items():
            assert life.phase not in ("granting", "grant_ended", "claimed"), (
                f"{key}: left {life.phase}")

    def _one(self, ins: ev.Instruction) -> None:
        if isinstance(ins, ev.ArmTimer | ev.CancelTimer | ev.PushSchedulingConfigs):
            return
        if isinstance(ins, ev.SetDriverThermal | ev.RestartDriver):
            return
        assert isinstance(
            ins, ev.SendCanLoad | ev.IssueGrant | ev.AskUnload | ev.EndGrant | ev.SendComplete
            | ev.RequestEnded | ev.RequestDropped
        ), ins
        key = (ins.uid, ins.request_id)
        if isinstance(ins, ev.RequestDropped):
            life = self.lives.get(key)
            assert life is not None and life.phase != "ended", f"{ins} for no live request"
            assert life.decided is None and not life.dropped, f"{key}: {ins} after its end"
            life.dropped = True
            return
        if isinstance(ins, ev.RequestEnded):
            life = self.lives.get(key)
            assert life is not None and life.phase != "ended", f"{ins} for no live request"
            assert life.decided is None, f"{key}: its end decided twice ({ins})"
            assert not life.dropped, f"{key}: {ins} after it was dropped"
            life.decided = ins.status
            return
        if isinstance(ins, ev.EndGrant) and ins.grant_id in self.held:
            assert ins.revoked, f"{ins}: an unclaimed held grant ends revoked"
            self.held.discard(ins.grant_id)
            return
        life = self.lives.get(key)
        assert life is not None, f"{ins} for a request never made"
        assert life.phase != "ended", f"{ins} after the request ended"
        if isinstance(ins, ev.SendCanLoad | ev.AskUnload | ev.SendComplete):
            assert ins.conn == life.conn, f"{ins} to the wrong connection"
        if isinstance(ins, ev.SendCanLoad):
            life.statuses.append(ins.status)
            if ins.status == LoadStatus.CAN_LOAD_NOW:
                assert life.phase == "granting" and ins.grant_id == life.grant, (
                    f"{key}: CAN_LOAD_NOW not right after its IssueGrant"
                )
                life.phase = "granted"
            else:
                assert life.phase in ("new", "waiting"), f"{key}: {ins.status} in {life.phase}"
                assert ins.grant_id is None
                life.phase = "waiting"
        elif isinstance(ins, ev.IssueGrant) and life.phase == "claimed":
            assert ins.grant_id not in self.grants_live, "grant id reused"
            life.grant = ins.grant_id
            self.grants_live.add(ins.grant_id)
            life.phase = "granted"
        elif isinstance(ins, ev.IssueGrant):
            assert life.phase in ("new", "waiting"), f"{key}: grant issued in {life.phase}"
            assert ins.grant_id not in self.grants_live, "grant id reused"
            life.grant = ins.grant_id
            self.grants_live.add(ins.grant_id)
            life.phase = "granting"
        elif isinstance(ins, ev.AskUnload):
            assert life.phase == "granted" and not life.asked, f"{key}: AskUnload in {life.phase}"
            life.asked = True
        elif isinstance(ins, ev.EndGrant):
            assert life.phase == "granted" and ins.grant_id == life.grant, (
                f"{key}: EndGrant in {life.phase}"
            )
            self.grants_live.discard(ins.grant_id)
            life.revoked_grant = ins.revoked
            life.phase = "grant_ending" if ins.ack else "grant_ended"
        elif isinstance(ins, ev.SendComplete):
            assert life.decided == ins.status, f"{key}: {ins} without its RequestEnded"
            if life.phase == "claimed":
                assert ins.status == RequestStatus.REVOKED, f"{key}: refused claim {ins}"
                life.statuses.append(ins.status)
                life.phase = "ended"
                self.ended.append((key, life))
                return
            if life.grant is not None:
                assert life.phase in ("grant_ended", "grant_ending"), (
                    f"{key}: completed with its grant live")
                assert life.revoked_grant == (ins.status == RequestStatus.REVOKED), (
                    f"{key}: EndGrant(revoked={life.revoked_grant}) with {ins.status.name}"
                )
            else:
                assert life.phase in ("new", "waiting"), f"{key}: completed in {life.phase}"
                assert ins.status == RequestStatus.CANCELLED, f"{key}: ungranted but {ins.status}"
            if ins.status == RequestStatus.REVOKED:
                assert life.asked, f"{key}: revoked without being asked to unload"
            life.statuses.append(ins.status)
            life.phase = "ended"
            self.ended.append((key, life))

    def check_against(self, state: ManagerState) -> None:
        for key, life in self.lives.items():
            live = state.request_state(*key) is not None
            assert live == (life.phase not in ("ended", "grant_ending")), (
                f"{key}: checker {life.phase}, state {live}")
        assert self.grants_live == {g for g, _, _ in state.live_grants()}


class Harness:
    """A ManagerState on virtual time. Conn defaults to the uid (one connection per uid).

    ``drivers``: the configured drivers (each a placeholder device until it reports)."""

    def __init__(self, params: ManagerParams | None = None, *, policy: Any = None,
                 drivers: tuple[str, ...] = (), auto_ack: bool = True) -> None:
        counter = itertools.count(1)
        if policy is not None:
            params = (params or ManagerParams()).with_policy(policy)
        if drivers:
            params = replace(params or ManagerParams(), drivers=drivers)
        self.state = ManagerState(params, grant_ids=lambda: f"grant-{next(counter):04d}")
        self.now = 1000.0
        self.checker = StreamChecker()
        self.timers: dict[str, float] = {}
        self._sid = itertools.count(1)
        self.log: list[tuple[ev.Event, list[ev.Instruction]]] = []
        #: Every EndGrant(ack=True) is acknowledged by its driver at once, in the same step
        #: (the outputs of both events are returned together). False: a test acks (``ack``).
        self.auto_ack = auto_ack

    # --- plumbing
    def handle(self, event: ev.Event) -> list[ev.Instruction]:
        out = self._handle(event)
        if self.auto_ack:
            for ins in list(out):
                if isinstance(ins, ev.EndGrant) and ins.ack:
                    out += self._handle(self._ack_event(ins.grant_id, None))
        return out

    def ack(self, grant_id: str, driver: str | None = None) -> list[ev.Instruction]:
        """The driver applied the end of ``grant_id`` (``driver``: the link it came on; by
        default the grant's own driver)."""
        return self.handle(self._ack_event(grant_id, driver))

    def _ack_event(self, grant_id: str, driver: str | None) -> ev.GrantEndApplied:
        if driver is None:
            ending = self.state._ending.get(grant_id)
            driver = ending.dev.driver if ending is not None else ""
        return self.mk(ev.GrantEndApplied, grant_id=grant_id, driver=driver)

    def _handle(self, event: ev.Event) -> list[ev.Instruction]:
        out = self.state.handle(event)
        self.state.validate()
        self.checker.feed(event, out)
        self.checker.check_against(self.state)
        for ins in out:
            if isinstance(ins, ev.ArmTimer):
                self.timers[ins.key] = ins.at
            elif isinstance(ins, ev.CancelTimer):
                self.timers.pop(ins.key, None)
        self.log.append((event, out))
        return out

    def mk(self, cls: type[ev.Event], **kw: Any) -> Any:
        return cls(stimulus_id=f"s{next(self._sid)}", now=self.now, **kw)

    def advance(self, dt: float) -> list[ev.Instruction]:
        """Move time forward, firing every armed timer that comes due, in order."""
        end = self.now + dt
        out: list[ev.Instruction] = []
        while True:
            due = sorted((at, k) for k, at in self.timers.items() if at <= end)
            if not due:
                break
            at, key = due[0]
            del self.timers[key]
            self.now = max(self.now, at)
            out += self.handle(self.mk(ev.TimerFired, key=key))
        self.now = end
        return out

    # --- events
    def request(
        self,
        uid: int,
        rid: int,
        size: int = 0,
        priority: int = 0,
        conn: int | None = None,
        device: str | None = None,
    ) -> list[ev.Instruction]:
        return self.handle(
            self.mk(
                ev.RequestLoad,
                uid=uid,
                pid=uid + 10000,
                conn=uid if conn is None else conn,
                request_id=rid,
                size=ModelSize(size),
                priority=ModelPriority(priority),
                device=device,
            )
        )

    def cancel(self, uid: int, rid: int) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.CancelLoad, uid=uid, conn=uid, request_id=rid))

    def loaded(self, uid: int, rid: int) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.ModelLoaded, uid=uid, conn=uid, request_id=rid))

    def unloaded(self, uid: int, rid: int) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.ModelUnloaded, uid=uid, conn=uid, request_id=rid))

    def gone(self, conn: int) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.ClientGone, conn=conn))

    def importance(self, uid: int, importance: int) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.ImportanceChanged, uid=uid, importance=importance))

    def policy(self, policy: int, **kw: Any) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.PolicySet, policy=policy, **kw))

    def completed(self, uid: int, reason: EndReason = EndReason.COMPLETED,
                  device: str | None = None) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.WorkEnded, uid=uid, reason=reason, device=device))

    def thermal(self, status: ThermalStatus, device: str | None = None) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.ThermalChanged, status=status, device=device))

    def driver_up(self, name: str, memory: int = 0,
                  devices: dict[str, int] | None = None) -> list[ev.Instruction]:
        """Driver ``name`` up with one device (``memory``) or ``devices`` (name -> bytes)."""
        return self.handle(self.mk(ev.DriverUp, name=name, memory_bytes=memory,
                                   devices=tuple((devices or {}).items())))

    def driver_down(self, name: str) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.DriverDown, name=name))

    def memory(self, grant_id: str, nbytes: int) -> list[ev.Instruction]:
        return self.handle(self.mk(ev.ModelMemory, grant_id=grant_id, nbytes=nbytes))

    # --- reading outcomes
    def grant_of(self, uid: int, rid: int) -> str:
        for g, u, r in self.state.live_grants():
            if (u, r) == (uid, rid):
                return g
        raise AssertionError(f"({uid}, {rid}) holds no grant")

    def hold(self, uid: int, rid: int, size: int = 0, priority: int = 0,
             device: str | None = None) -> None:
        """Request and load; the request must be granted at once."""
        out = self.request(uid, rid, size, priority, device=device)
        assert status_of(out, uid, rid) == LoadStatus.CAN_LOAD_NOW, out
        self.loaded(uid, rid)

    def state_of(self, uid: int, rid: int) -> str | None:
        s = self.state.request_state(uid, rid)
        return None if s is None else s.value


def status_of(out: list[ev.Instruction], uid: int, rid: int) -> LoadStatus | None:
    """The last load status sent to (uid, rid) in ``out``."""
    found = None
    for ins in out:
        if isinstance(ins, ev.SendCanLoad) and (ins.uid, ins.request_id) == (uid, rid):
            found = ins.status
    return found


def completes(out: list[ev.Instruction]) -> dict[Key, RequestStatus]:
    return {(i.uid, i.request_id): i.status for i in out if isinstance(i, ev.SendComplete)}


def unloads(out: list[ev.Instruction]) -> dict[Key, UnloadReason]:
    return {(i.uid, i.request_id): i.reason for i in out if isinstance(i, ev.AskUnload)}


def granted(out: list[ev.Instruction]) -> list[Key]:
    return [
        (i.uid, i.request_id)
        for i in out
        if isinstance(i, ev.SendCanLoad) and i.status == LoadStatus.CAN_LOAD_NOW
    ]


def for_key(out: list[ev.Instruction], uid: int, rid: int) -> list[ev.Instruction]:
    return [
        i for i in out if getattr(i, "uid", None) == uid and getattr(i, "request_id", None) == rid
    ]


# --- a cast of apps, by importance --------------------------------------------------------

FG, FGS, VIS, BG, CACHED = 1001, 1002, 1003, 1004, 1005
BIG, MID, SMALL = 2, 1, 0
BGP, OPP = int(ModelPriority.BACKGROUND), int(ModelPriority.OPPORTUNISTIC)


def budget(**kw: Any) -> Harness:
    """A harness (BUDGET unless ``policy=``) whose uids have the cast's importances."""
    h = Harness(kw.pop("params", None), policy=kw.pop("policy", Policy.BUDGET),
                drivers=kw.pop("drivers", ()))
    for uid, imp in (
        (FG, Importance.FOREGROUND),
        (FGS, Importance.FOREGROUND_SERVICE),
        (VIS, Importance.VISIBLE),
        (BG, Importance.SERVICE),
        (CACHED, Importance.CACHED),
    ):
        h.importance(uid, int(imp))
    return h


GIB = 1 << 30


def memory() -> Harness:
    h = budget(policy=Policy.MEMORY)
    h.driver_up("reference", 8 * GIB)
    return h
