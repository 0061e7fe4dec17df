"""The driver host's side of its link to npud: the ``hal.*`` calls and what npud hears back.

npud (or an admin) attaches as the manager and sets the lifecycle callback;
this owns those two connections, the scheduling configs, grant and thermal
calls it makes (each becomes an event for the state, through ``submit``), the
prepare calls waiting for a grant npud has not announced yet, and the pushes
to npud: lifecycle reports, a grant's model memory, cache results; and it
says when npud stayed away past the orphan grace. Every
``hal.*`` call is for npud and admins only (:meth:`NpudLink.admin`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from npumanager.clock import LoopClock, wake_at
from npumanager.constants import ThermalStatus
from npumanager.drivers import events as ev
from npumanager.drivers.base import Driver
from npumanager.drivers.state import DriverState, GrantCheck
from npumanager.errors import GrantRequired, InvalidArgument, PermissionDenied
from npumanager.fds import close_fds
from npumanager.hal import raise_wire, rt_wire
from npumanager.hal.host_config import HostConfig, entry_summary
from npumanager.hal.wire import configs_from_payload, work_to_msg
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.wire.conn import CallContext, Handler, RpcConnection
from npumanager.words import plural

log = logging.getLogger("npumanager.drivers.host")

_WORK_METHODS = {k: f"hal.on_work_{k.value}" for k in ev.WorkKind}


def admin(fn: Handler) -> Handler:
    """``fn`` for npud and admins only: anyone else gets PermissionDenied."""

    def guarded(ctx: CallContext, payload: bytes) -> Any:
        if not ctx.conn.admin:
            close_fds(ctx.fds)
            raise PermissionDenied(
                f"{ctx.method} is for npud and admins only (uid {ctx.peer.uid} is neither)")
        return fn(ctx, payload)

    return guarded


class NpudLink:
    def __init__(self, hc: HostConfig, driver: Driver, state: DriverState, clock: LoopClock,
                 submit: Callable[[ev.Event], object], stimulus: Callable[[str], str],
                 busy_s: Callable[[], float],
                 lock: AbstractContextManager[object] | None = None) -> None:
        self.hc = hc
        self.driver = driver
        self.state = state  # read only here (grant checks); events go through ``submit``
        #: Held while the state is read here: burst threads change it too.
        self._lock: AbstractContextManager[object] = lock or nullcontext()
        self.clock = clock
        self._submit = submit
        self._stimulus = stimulus
        self._busy_s = busy_s
        self.callback_conn: RpcConnection | None = None
        self.manager_conn: RpcConnection | None = None
        self._grant_waiters: list[asyncio.Future[None]] = []
        self._util_last: tuple[float, float] | None = None  # (now, busy_s)
        #: Set once npud went away and no manager attached again within the orphan grace
        #: (every model is released then; ``npu driver --exit-with-manager`` exits);
        #: cleared when a manager attaches.
        self.orphan_expired = asyncio.Event()
        #: npud's answers to ``ask_rt`` (tid, ok, why): drivers/rt_threads.py's.
        self.on_rt_applied: Callable[[int, bool, str], None] | None = None
        #: npud's manager connection closed (drivers/rt_threads.py lowers its threads).
        self.on_manager_gone: Callable[[], object] | None = None
        #: npud's answers to ``ask_raise`` (pid, tid, ok, why): drivers/compile_starve.py's.
        self.on_raise_applied: Callable[[int, int, bool, str], None] | None = None

    def handlers(self) -> dict[str, Handler]:
        return {
            "hal.set_scheduling_configs": admin(self._set_configs),
            "hal.update_scheduling_configs": admin(self._update_configs),
            "hal.set_callback": admin(self._set_callback),
            "hal.attach_manager": admin(self._attach_manager),
            "hal.grant_issued": admin(self._grant_issued),
            "hal.grant_ended": admin(self._grant_ended),
            "hal.grant_moved": admin(self._grant_moved),
            "hal.set_thermal_status": admin(self._set_thermal),
            "hal.get_temperature": admin(self._get_temperature),
            rt_wire.APPLIED: admin(self._rt_applied),
            raise_wire.APPLIED: admin(self._raise_applied),
        }

    def disconnected(self, conn: RpcConnection, now: float) -> list[ev.Event]:
        """The events for the state if ``conn`` was npud's callback or manager connection."""
        out: list[ev.Event] = []
        if conn is self.callback_conn:
            self.callback_conn = None
            out.append(ev.CallbackSet(stimulus_id=self._stimulus("callback-gone"), now=now,
                                      listening=False))
        if conn is self.manager_conn:
            self.manager_conn = None
            out.append(ev.ManagerGone(stimulus_id=self._stimulus("manager-gone"), now=now))
            if self.on_manager_gone is not None:
                self.on_manager_gone()
        return out

    # --- pushes to npud -------------------------------------------------------------

    def report_work(self, ins: ev.ReportWork) -> None:
        conn = self.callback_conn
        if conn is not None and not conn.closed:
            conn.push(_WORK_METHODS[ins.kind],
                      pb.WorkEvent(info=work_to_msg(ins.info), reason=ins.reason))

    def report_memory(self, ins: ev.ReportModelMemory) -> None:
        if self.manager_conn is not None:
            self.manager_conn.push("hal.model_memory",
                                   pb.ModelMemory(grant_id=ins.grant_id, nbytes=ins.nbytes,
                                                  freed=ins.freed))

    def grace_expired(self, ins: ev.GraceExpired) -> None:
        log.warning("no manager attached again within %g s: released %s",
                    self.hc.orphan_grace_s, plural(ins.models, "model"))
        self.orphan_expired.set()

    def ask_rt(self, tid: int, priority: int) -> bool:
        """Ask npud to put this process's thread ``tid`` at SCHED_FIFO ``priority`` (on the
        loop); False with no npud attached. Its answer comes as ``hal.rt_applied``."""
        conn = self.manager_conn
        if conn is None or conn.closed:
            return False
        conn.push(rt_wire.REQUEST, rt_wire.encode_request(tid, priority))
        return True

    def _rt_applied(self, ctx: CallContext, payload: bytes) -> None:
        close_fds(ctx.fds)
        tid, ok, why = rt_wire.decode_applied(payload)
        if self.on_rt_applied is not None:
            self.on_rt_applied(tid, ok, why)

    def ask_raise(self, pid: int, tid: int) -> bool:
        """Ask npud to raise this host's starved compile tree ``(pid, tid)`` to nice 0 for
        one bound (on the loop); False with no npud attached. Its answer comes as
        ``hal.raise_applied``."""
        conn = self.manager_conn
        if conn is None or conn.closed:
            return False
        conn.push(raise_wire.REQUEST, raise_wire.encode_request(pid, tid))
        return True

    def ask_watch(self, pid: int, tid: int, on: bool) -> bool:
        """Ask npud to watch (or stop watching) this host's compile tree ``(pid, tid)``
        (on the loop); False with no npud attached."""
        conn = self.manager_conn
        if conn is None or conn.closed:
            return False
        conn.push(raise_wire.WATCH, raise_wire.encode_watch(pid, tid, on))
        return True

    def _raise_applied(self, ctx: CallContext, payload: bytes) -> None:
        close_fds(ctx.fds)
        pid, tid, ok, why = raise_wire.decode_applied(payload)
        if self.on_raise_applied is not None:
            self.on_raise_applied(pid, tid, ok, why)

    def cache_result(self, result: bytes) -> None:
        """Tell npud how a cache load went (its npu_cache_loads_total metric)."""
        if self.manager_conn is not None:
            self.manager_conn.push("hal.cache_result", result)

    # --- grants -----------------------------------------------------------------------

    async def admit(self, uid: int, grant_id: str) -> str | None:
        """The grant a prepare runs under (None: admission is not enforced). npud tells
        the driver of a grant before the client, but the sockets race: an unknown grant
        is waited for up to ``grant_wait_s``, unless npud goes away meanwhile (nobody
        will send it then: NoManagerAttached at once)."""
        deadline = self.clock.now() + self.hc.grant_wait_s
        while True:
            with self._lock:
                self.state.check_attached(self.clock.now())
                check = self.state.check_grant(grant_id, uid)
            if check is GrantCheck.LIVE:
                return grant_id
            if check is GrantCheck.NOT_NEEDED:
                return None
            if self.clock.now() >= deadline:
                raise GrantRequired(
                    f"driver {self.hc.name} does not know grant {grant_id[:8]}… (not issued by "
                    f"npud, or already ended){self._lane_hint()}")
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._grant_waiters.append(fut)
            timer = wake_at(self.clock, deadline, fut)
            try:
                await fut
            finally:
                timer.cancel()

    def _lane_hint(self) -> str:
        """Where a grant this host does not know may be valid: the device's other lane
        (npud tells each grant to one of its hosts only; service/host_lanes.py)."""
        if self.hc.lane:
            return (f"; this is {self.hc.name}'s {self.hc.lane} lane, for BACKGROUND and "
                    f"OPPORTUNISTIC requests and apps whose importance is a background one: "
                    f"another request's grant is valid on drivers/{self.hc.name}.sock")
        if self.hc.background_host:
            return (f"; a BACKGROUND or OPPORTUNISTIC request's grant, or a background-"
                    f"importance app's, is valid on {self.hc.name}'s background lane only, "
                    f"drivers/{self.hc.lane_name}.background.sock (nn's prepare_model goes "
                    "there when given the request's listener or lease; its lane says which)")
        return ""

    def _grant_issued(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.GrantIssued.FromString(payload)
        self._submit(ev.GrantIssued(stimulus_id=self._stimulus("grant"), now=self.clock.now(),
                                    grant_id=msg.grant_id, uid=msg.uid,
                                    request_id=msg.request_id))
        self.wake_grant_waiters()
        return Empty()

    def wake_grant_waiters(self) -> None:
        """Prepares waiting for a grant look again (after the event that woke them is
        in the state): a grant came, or npud went away."""
        waiters, self._grant_waiters = self._grant_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _grant_ended(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.GrantEnded.FromString(payload)
        self._submit(ev.GrantEnded(stimulus_id=self._stimulus("grant-ended"),
                                   now=self.clock.now(), grant_id=msg.grant_id,
                                   revoked=msg.revoked))
        if msg.ack and not ctx.conn.closed:
            # Applied: the state released the grant's models under the host's lock, so
            # no execution or burst of them starts from here on.
            ctx.conn.push("hal.grant_end_applied", pb.GrantEnded(grant_id=msg.grant_id))
        return Empty()

    def _grant_moved(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.GrantMoved.FromString(payload)
        self._submit(ev.GrantMoved(stimulus_id=self._stimulus("grant-moved"),
                                   now=self.clock.now(), grant_id=msg.grant_id, lane=msg.lane))
        return Empty()

    # --- configs, callback, manager, thermal -------------------------------------------

    def _set_configs(self, ctx: CallContext, payload: bytes) -> Empty:
        self._submit(ev.ConfigsSet(stimulus_id=self._stimulus("configs"), now=self.clock.now(),
                                   configs=tuple(configs_from_payload(payload)), replace=True))
        return Empty()

    def _update_configs(self, ctx: CallContext, payload: bytes) -> Empty:
        self._submit(ev.ConfigsSet(stimulus_id=self._stimulus("configs"), now=self.clock.now(),
                                   configs=tuple(configs_from_payload(payload)), replace=False))
        return Empty()

    def _set_callback(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.SetCallback.FromString(payload)
        self.callback_conn = None if msg.clear else ctx.conn
        self._submit(ev.CallbackSet(stimulus_id=self._stimulus("callback"), now=self.clock.now(),
                                    listening=not msg.clear, debounce_ms=msg.debounce_ms))
        return Empty()

    def _attach_manager(self, ctx: CallContext, payload: bytes) -> pb.HeldGrants:
        msg = pb.AttachManager.FromString(payload)
        self.manager_conn = ctx.conn
        # Attached after the grace ran out (it released everything): not an orphan any
        # more, so `npu driver --exit-with-manager` keeps serving this npud.
        self.orphan_expired.clear()
        self.hc.enforce_admission = msg.enforce_admission
        self._submit(ev.ManagerAttached(stimulus_id=self._stimulus("attach"),
                                        now=self.clock.now(),
                                        enforce_admission=msg.enforce_admission))
        # A new npud after a restart adopts what we hold (the grants its clients claim).
        with self._lock:
            held = self.state.held_grants()
        # And the entry this host runs: npud names what differs from its own (a host
        # started by hand, or by an earlier npud with another config).
        return pb.HeldGrants(grants=[
            pb.HeldGrant(grant_id=g, uid=uid, request_id=rid, memory_bytes=nbytes,
                         models=models)
            for g, uid, rid, nbytes, models in held],
            host_entry_json=json.dumps(entry_summary(self.hc)))

    def _set_thermal(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.ThermalStatusMsg.FromString(payload)
        try:
            status = ThermalStatus(msg.status)
        except ValueError:
            raise InvalidArgument(f"unknown thermal status {msg.status}") from None
        self._submit(ev.ThermalSet(stimulus_id=self._stimulus("thermal"), now=self.clock.now(),
                                   status=status))
        return Empty()

    def utilization(self) -> float:
        """The channels' busy fraction since the last call."""
        now, busy = self.clock.now(), self._busy_s()
        last = self._util_last
        self._util_last = (now, busy)
        if last is None or now <= last[0]:
            return 0.0
        return min(1.0, (busy - last[1]) / (self.hc.channels * (now - last[0])))

    def _get_temperature(self, ctx: CallContext, payload: bytes) -> pb.Temperature:
        util = self.utilization()
        celsius = self.driver.temperature(self.clock.now(), util)
        return pb.Temperature(celsius=float("nan") if celsius is None else celsius,
                              utilization=util)
