"""The driver host process: one driver plugin behind DIR/drivers/NAME.sock.

It owns the per-connection state (prepared models, shared-memory pools,
running work), the grants npud issued (enforced admission), the scheduler and
the worker threads that run the backend. ``hal.*`` methods are for npud and
admins only; ``device.*`` methods serve any uid, decided per call from its
kernel-verified uid. Preparing (grants, compile, cache) lives in
:mod:`npumanager.drivers.prepare`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npumanager import tensorio
from npumanager.clock import Clock, MonotonicClock
from npumanager.constants import ThermalStatus
from npumanager.drivers.base import Driver, PreparedModel
from npumanager.drivers.exec_stats import ExecStats
from npumanager.drivers.execution import (
    ClientConn,
    Execution,
    ExecutionMixin,
    ModelEntry,
)
from npumanager.drivers.scheduler import Job, Scheduler
from npumanager.errors import (
    GrantRevoked,
    InvalidArgument,
    PermissionDenied,
)
from npumanager.fds import close_fds
from npumanager.hal.host_config import HostConfig
from npumanager.hal.types import HAL_VERSION, EndReason
from npumanager.hal.wire import SERVICE, configs_from_payload, work_to_msg
from npumanager.paths import ensure_drivers_dir
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.wire.conn import CallContext, Handler, RpcConnection
from npumanager.wire.server import RpcServer, resolve_group

log = logging.getLogger("npumanager.drivers.host")

_TOMBSTONES = 4096


@dataclass(eq=False)
class Grant:
    grant_id: str
    uid: int
    request_id: int
    models: set[int] = field(default_factory=set)




class DriverHost(ExecutionMixin):
    def __init__(
        self,
        hc: HostConfig,
        driver: Driver,
        runtime_dir: Path,
        state_dir: Path,
        *,
        cache_counts: tuple[int, int] = (0, 0),
        clock: Clock | None = None,
    ) -> None:
        self.hc = hc
        self.driver = driver
        self.runtime_dir = runtime_dir
        self.state_dir = state_dir
        self.cache_counts = cache_counts
        self.clock: Clock = clock or MonotonicClock()
        self.scheduler = Scheduler(hc.channels, self.clock, self, thermal_cutoff=hc.thermal_cutoff)
        self.scheduler.events_enabled = False  # until npud (or an admin) sets the callback
        self.socket_path = runtime_dir / "drivers" / f"{hc.name}.sock"
        self.models: dict[int, ModelEntry] = {}
        self.grants: dict[str, Grant] = {}
        self.ended_grants: OrderedDict[str, bool] = OrderedDict()
        self.tombstones: OrderedDict[int, str] = OrderedDict()
        self.callback_conn: RpcConnection | None = None
        self.clients: dict[RpcConnection, ClientConn] = {}
        self.exec_stats = ExecStats()
        self.manager_conn: RpcConnection | None = None
        self._next_model = 1
        self._next_pool = 1
        self._busy_s = 0.0
        self._util_last: tuple[float, float] | None = None  # (monotonic now, busy_s)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._submitting: Any = None  # the Execution being submitted (inline fast path)
        self._inline_now: Job | None = None
        self._grant_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers = ThreadPoolExecutor(hc.channels, thread_name_prefix=f"npu-{hc.name}-ch")
        self.compile_pool = ThreadPoolExecutor(2, thread_name_prefix=f"npu-{hc.name}-compile")
        self.cache_pool = ThreadPoolExecutor(1, thread_name_prefix=f"npu-{hc.name}-cache")
        self.server: RpcServer | None = None
        from npumanager.drivers.prepare import Preparer

        self.preparer = Preparer(self)

    def __repr__(self) -> str:
        return (f"<DriverHost {self.hc.name}: {len(self.models)} models, {len(self.grants)} "
                f"grants | {self.scheduler!r}>")

    # --- lifecycle -----------------------------------------------------------------

    def handlers(self) -> dict[str, Handler]:
        p = self.preparer
        return {
            "hal.set_scheduling_configs": self._admin(self._set_configs),
            "hal.update_scheduling_configs": self._admin(self._update_configs),
            "hal.set_callback": self._admin(self._set_callback),
            "hal.attach_manager": self._admin(self._attach_manager),
            "hal.grant_issued": self._admin(self._grant_issued),
            "hal.grant_ended": self._admin(self._grant_ended),
            "hal.set_thermal_status": self._admin(self._set_thermal),
            "hal.get_temperature": self._admin(self._get_temperature),
            "device.capabilities": self._capabilities,
            "device.get_number_of_cache_files_needed": self._cache_files_needed,
            "device.prepare_model": p.prepare_model,
            "device.prepare_model_from_cache": p.prepare_model_from_cache,
            "device.register_pool": self._register_pool,
            "device.unregister_pool": self._unregister_pool,
            "device.execute": self._execute,
            "device.cancel": self._cancel,
            "device.release": self._release,
            # Other uids' execution rates: for npud and admins (`npu top`).
            "device.stats": self._admin(self._stats),
            "device.trace": self._admin(self._trace),
        }

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._grant_event = asyncio.Event()
        #: Set when the npud that attached goes away (see ``npu driver --exit-with-manager``).
        self.manager_lost = asyncio.Event()
        ensure_drivers_dir(self.runtime_dir)
        self.server = RpcServer(
            str(self.socket_path), SERVICE, self.handlers(), mode=self.hc.socket_mode,
            max_frame=self.hc.max_frame, admin_gid=resolve_group(self.hc.admin_group),
            on_disconnect=self._disconnected,
            # Only these take fds: fds sent with any other call close the connection
            # (a handler that ignores them would pin them for good).
            fd_methods=frozenset({"device.prepare_model", "device.prepare_model_from_cache",
                                  "device.register_pool"}),
        )
        await self.server.start()

    async def close(self) -> None:
        for job in self.scheduler.jobs():
            self.scheduler.cancel(job, EndReason.CANCELLED_SYSTEM)
        if self.server is not None:
            await self.server.close(goodbye=f"driver {self.hc.name} is shutting down")
        if self._timer is not None:
            self._timer.cancel()
        self._workers.shutdown(wait=True, cancel_futures=True)
        self.compile_pool.shutdown(wait=True, cancel_futures=True)
        self.preparer.close()
        self.cache_pool.shutdown(wait=True, cancel_futures=True)
        for entry in list(self.models.values()):
            entry.prepared.release()
        self.models.clear()
        self.driver.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "host not started"
        return self._loop

    def _admin(self, fn: Handler) -> Handler:
        def guarded(ctx: CallContext, payload: bytes) -> Any:
            if not ctx.conn.admin:
                close_fds(ctx.fds)
                raise PermissionDenied(
                    f"{ctx.method} is for npud and admins only (uid {ctx.peer.uid} is neither)"
                )
            return fn(ctx, payload)

        return guarded

    def _disconnected(self, conn: RpcConnection, exc: BaseException | None) -> None:
        if conn is self.callback_conn:
            self.callback_conn = None
            self.scheduler.events_enabled = False
        if conn is self.manager_conn:
            self.manager_conn = None
            self.manager_lost.set()
        client = self.clients.pop(conn, None)
        if client is not None:
            for job in list(client.jobs):
                self.scheduler.cancel(job, EndReason.CANCELLED_USER)
            for model_id in list(client.models):
                self._drop_model(model_id, None)
            for pool in client.pools.values():
                pool.close()
            client.pools.clear()
        self._arm()

    # --- timers (debounce windows) ----------------------------------------------------

    def _arm(self) -> None:
        """Keep one timer at or before the earliest debounce deadline.

        A timer already armed no later than the deadline is kept: it fires, reports
        what is due and re-arms. So a stream of work arms about one timer per window
        instead of one per execution (deadlines of a uid only move later)."""
        deadline = self.scheduler.next_deadline()
        if deadline is None or self._loop is None:
            return
        if self._timer is not None and self._timer_at is not None \
                and self._timer_at <= deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_later(max(0.0, deadline - self.clock.now()),
                                            self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.scheduler.fire_due()
        self._arm()

    # --- SchedulerSink (the rest is in ExecutionMixin) --------------------------

    def work_event(self, kind: str, info: Any, reason: int) -> None:
        conn = self.callback_conn
        if conn is not None and not conn.closed:
            conn.push(f"hal.on_work_{kind}", pb.WorkEvent(info=work_to_msg(info), reason=reason))


    # --- hal.* ---------------------------------------------------------------------

    def _set_configs(self, ctx: CallContext, payload: bytes) -> Empty:
        self.scheduler.set_configs(configs_from_payload(payload))
        return Empty()

    def _update_configs(self, ctx: CallContext, payload: bytes) -> Empty:
        self.scheduler.update_configs(configs_from_payload(payload))
        return Empty()

    def _set_callback(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.SetCallback.FromString(payload)
        if msg.clear:
            self.callback_conn = None
        else:
            self.callback_conn = ctx.conn
            self.scheduler.set_debounce_ms(msg.debounce_ms)
        self.scheduler.events_enabled = self.callback_conn is not None
        return Empty()

    def _attach_manager(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.AttachManager.FromString(payload)
        self.manager_conn = ctx.conn
        self.hc.enforce_admission = msg.enforce_admission
        return Empty()

    def _grant_issued(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.GrantIssued.FromString(payload)
        if msg.grant_id and msg.grant_id not in self.grants:
            self.grants[msg.grant_id] = Grant(msg.grant_id, msg.uid, msg.request_id)
            self.ended_grants.pop(msg.grant_id, None)
        if self._grant_event is not None:
            self._grant_event.set()
            self._grant_event = asyncio.Event()
        return Empty()

    def _grant_ended(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.GrantEnded.FromString(payload)
        self.end_grant(msg.grant_id, msg.revoked)
        return Empty()

    def end_grant(self, grant_id: str, revoked: bool) -> None:
        grant = self.grants.pop(grant_id, None)
        self.ended_grants[grant_id] = revoked
        while len(self.ended_grants) > _TOMBSTONES:
            self.ended_grants.popitem(last=False)
        if grant is None:
            return
        why = (f"grant {grant_id[:8]}… was revoked by npud; the model was released"
               if revoked else f"grant {grant_id[:8]}… has ended; the model was released")
        for model_id in list(grant.models):
            self._drop_model(model_id, why)
        self._arm()

    def _set_thermal(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.ThermalStatusMsg.FromString(payload)
        try:
            status = ThermalStatus(msg.status)
        except ValueError:
            raise InvalidArgument(f"unknown thermal status {msg.status}") from None
        self.scheduler.set_thermal(status)
        self._arm()
        return Empty()

    def utilization(self) -> float:
        now, busy = time.monotonic(), self._busy_s
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

    # --- device.* --------------------------------------------------------------

    def capabilities_msg(self) -> pb.Capabilities:
        caps = self.driver.capabilities()
        return pb.Capabilities(
            name=self.hc.name, version=str(self.driver.version), backend=caps.backend,
            channels=self.hc.channels, memory_bytes=caps.memory_bytes,
            model_cache_files=self.cache_counts[0], data_cache_files=self.cache_counts[1],
            hal_version=HAL_VERSION, inline_limit=self.hc.inline_limit,
            enforce_admission=self.hc.enforce_admission,
        )

    def _capabilities(self, ctx: CallContext, payload: bytes) -> pb.Capabilities:
        return self.capabilities_msg()

    def _stats(self, ctx: CallContext, payload: bytes) -> bytes:
        """JSON: channels busy and per-uid executions/s and p50/p99 latency (`npu top`)."""
        import json

        sched = self.scheduler
        return json.dumps({"channels": sched.channels,
                           "busy": sched.channels - len(sched._free),
                           "queued": len(sched._queue),
                           **self.exec_stats.snapshot()}).encode()

    def _trace(self, ctx: CallContext, payload: bytes) -> bytes:
        """JSON: execution steps after the cursor in the payload (`npu trace record`); each
        poll keeps step recording on for a few more seconds."""
        import json

        try:
            cursor = int(bytes(payload[:20]).decode() or 0)
        except ValueError:
            raise InvalidArgument("device.trace takes a cursor (a decimal number)") from None
        return json.dumps(self.exec_stats.steps_since(cursor)).encode()

    def _cache_files_needed(self, ctx: CallContext, payload: bytes) -> pb.CacheFilesNeeded:
        return pb.CacheFilesNeeded(n_model=self.cache_counts[0], n_data=self.cache_counts[1])

    def add_model(self, conn: RpcConnection, prepared: PreparedModel, grant: Grant | None
                  ) -> ModelEntry:
        model_id = self._next_model
        self._next_model += 1
        entry = ModelEntry(model_id, prepared, conn.peer.uid, conn,
                           grant.grant_id if grant else None,
                           input_names=frozenset(i.name for i in prepared.inputs),
                           output_names=frozenset(o.name for o in prepared.outputs))
        self.models[model_id] = entry
        self._client(conn).models.add(model_id)
        if grant is not None:
            grant.models.add(model_id)
        if self.manager_conn is not None and grant is not None:
            self.manager_conn.push(
                "hal.model_memory",
                pb.ModelMemory(grant_id=grant.grant_id, nbytes=prepared.memory_bytes),
            )
        return entry

    def _drop_model(self, model_id: int, revoked_why: str | None) -> None:
        entry = self.models.pop(model_id, None)
        if entry is None:
            return
        self._client(entry.conn).models.discard(model_id)
        if entry.grant_id is not None and entry.grant_id in self.grants:
            self.grants[entry.grant_id].models.discard(model_id)
        reason = EndReason.CANCELLED_USER
        if revoked_why is not None:
            self.tombstones[model_id] = revoked_why
            while len(self.tombstones) > _TOMBSTONES:
                self.tombstones.popitem(last=False)
            reason = EndReason.CANCELLED_SYSTEM
        for job in list(entry.jobs):
            ex: Execution = job.payload
            ex.revoked = revoked_why
            self.scheduler.cancel(job, reason)
        entry.prepared.release()

    def model_for(self, ctx: CallContext, model_id: int) -> ModelEntry:
        entry = self.models.get(model_id)
        if entry is None or entry.conn is not ctx.conn:
            why = self.tombstones.get(model_id)
            if why is not None and model_id in self._client(ctx.conn).models | {model_id}:
                raise GrantRevoked(why)
            raise InvalidArgument(f"no prepared model {model_id} on this connection")
        return entry

    def _register_pool(self, ctx: CallContext, payload: bytes) -> pb.PoolId:
        msg = pb.RegisterPool.FromString(payload)
        fds, ctx.fds = ctx.fds, []
        try:
            if len(fds) != 1:
                raise InvalidArgument(f"register_pool takes one memfd, got {len(fds)} fds")
            pool = tensorio.MappedPool(fds[0], msg.size)
        finally:
            close_fds(fds)
        pool_id = self._next_pool
        self._next_pool += 1
        self._client(ctx.conn).pools[pool_id] = pool
        return pb.PoolId(pool_id=pool_id)

    def _unregister_pool(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.PoolId.FromString(payload)
        pool = self._client(ctx.conn).pools.pop(msg.pool_id, None)
        if pool is not None:
            pool.close()
        return Empty()


    def _release(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.Release.FromString(payload)
        if msg.model_id in self._client(ctx.conn).models:
            self._drop_model(msg.model_id, None)
        self._arm()
        return Empty()
