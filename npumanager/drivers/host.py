"""The driver host process: the async shell around :class:`DriverState`.

The state decides; this module acts. It serves DIR/drivers/NAME.sock: every
call (``hal.*`` for npud and admins, ``device.*`` for any uid, decided per
call from its kernel-verified uid), every closed connection, finished step and
timer becomes an event with ``now`` from the host's clock; the state returns
instructions and :meth:`DriverHost._carry_out` does them in order: start a
step on a worker thread or inline, answer an execute, push a lifecycle report
to the HAL callback, release a model, close a pool, arm the timer.

What lives here and not in the state: the things with I/O or memory behind
them, keyed by the ids the state hands out — prepared models
(:mod:`.prepare`), executions and their tensors (:mod:`.steps`), mapped pools,
the connections.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from npumanager import tensorio
from npumanager.clock import LoopClock, MonotonicClock, Timer, wake_at
from npumanager.constants import ThermalStatus
from npumanager.drivers import events as ev
from npumanager.drivers.base import Driver
from npumanager.drivers.classes import ExecClass
from npumanager.drivers.exec_stats import ExecStats
from npumanager.drivers.messages import (
    ClientConn,
    decode_inputs,
    job_error,
    params_from,
    prepared_reply,
    set_output_area,
)
from npumanager.drivers.prepare import Prepared, Preparer
from npumanager.drivers.state import DriverState, GrantCheck
from npumanager.drivers.steps import Execution, Reply, StepRunner
from npumanager.errors import (
    GeneralFailure,
    GrantRequired,
    InvalidArgument,
    NpuError,
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

_COMPLETED = EndReason.COMPLETED
_WORK_METHODS = {k: f"hal.on_work_{k.value}" for k in ev.WorkKind}


class DriverHost:
    def __init__(
        self,
        hc: HostConfig,
        driver: Driver,
        runtime_dir: Path,
        state_dir: Path,
        *,
        cache_counts: tuple[int, int] = (0, 0),
        clock: LoopClock | None = None,
    ) -> None:
        self.hc = hc
        self.driver = driver
        self.runtime_dir = runtime_dir
        self.cache_counts = cache_counts
        self.clock: LoopClock = clock or MonotonicClock()
        self.state = DriverState(params_from(hc))
        self.socket_path = runtime_dir / "drivers" / f"{hc.name}.sock"
        self.preparer = Preparer(hc, driver, cache_counts, state_dir)
        self.exec_stats = ExecStats()
        self.runner = StepRunner(hc.name, hc.channels, inline_limit=hc.inline_limit,
                                 max_frame=hc.max_frame, stats=self.exec_stats,
                                 background_sched=hc.background_sched,
                                 background_nice=hc.background_nice)
        self.server: RpcServer | None = None
        self.callback_conn: RpcConnection | None = None
        self.manager_conn: RpcConnection | None = None
        self._clients: dict[RpcConnection, ClientConn] = {}
        self._prepared: dict[int, Any] = {}  # model id -> PreparedModel
        self._pools: dict[int, tuple[ClientConn, tensorio.MappedPool]] = {}  # by pool id
        self._executions: dict[int, Execution] = {}  # ticket -> execution
        self._timers: dict[str, Timer] = {}
        self._grant_waiters: list[asyncio.Future[None]] = []
        self._cids = itertools.count(1)
        self._tickets = itertools.count(1)
        self._stimuli = itertools.count(1)
        self._current = 0  # the ticket whose execute call is being handled
        self._inline_now: ev.RunStep | None = None
        self._util_last: tuple[float, float] | None = None  # (now, busy_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runners: dict[type, Callable[[Any], None]] = {
            ev.RunStep: self._run_step,
            ev.AbortStep: self._abort_step,
            ev.FinishJob: self._finish_job,
            ev.ReportWork: self._report_work,
            ev.ReleaseModel: self._release_model,
            ev.ReportModelMemory: self._report_memory,
            ev.ModelReady: lambda ins: None,  # read by the prepare call that caused it
            ev.PoolReady: lambda ins: None,  # read by the register call that caused it
            ev.ClosePool: self._close_pool,
            ev.ArmTimer: self._arm_timer,
            ev.CancelTimer: self._cancel_timer,
            ev.GraceExpired: self._grace_expired,
        }
        self._prepare_ids = itertools.count(1)
        #: Set once npud went away and no manager attached again within the orphan grace
        #: (every model is released then; ``npu driver --exit-with-manager`` exits).
        self.orphan_expired = asyncio.Event()

    def __repr__(self) -> str:
        return f"<DriverHost {self.hc.name}: {len(self._clients)} connections | {self.state!r}>"

    # --- lifecycle -----------------------------------------------------------------

    def handlers(self) -> dict[str, Handler]:
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
            "device.prepare_model": self._prepare_model,
            "device.prepare_model_from_cache": self._prepare_from_cache,
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
        ensure_drivers_dir(self.runtime_dir)
        self.server = RpcServer(
            str(self.socket_path), SERVICE, self.handlers(), mode=self.hc.socket_mode,
            max_frame=self.hc.max_frame, admin_gid=resolve_group(self.hc.admin_group),
            on_connect=self._connected, on_disconnect=self._disconnected,
            # Only these take fds: fds sent with any other call close the connection
            # (a handler that ignores them would pin them for good).
            fd_methods=frozenset({"device.prepare_model", "device.prepare_model_from_cache",
                                  "device.register_pool"}),
        )
        await self.server.start()

    async def close(self) -> None:
        if self.server is not None:
            # Every connection closes: its work is cancelled, its models released.
            await self.server.close(goodbye=f"driver {self.hc.name} is shutting down")
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self.runner.close()
        self.preparer.close()
        for prepared in self._prepared.values():
            prepared.release()
        self._prepared.clear()
        self.driver.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "host not started"
        return self._loop

    # --- events in -------------------------------------------------------------------

    def _stimulus(self, kind: str) -> str:
        return f"{kind}-{next(self._stimuli)}"

    def _submit(self, event: ev.Event) -> list[ev.Instruction]:
        """Feed the state; carry out what it decides. A refused event raises (the caller
        gets the error); nothing changed."""
        out = self.state.handle(event)
        self._carry_out(out)
        return out

    def _submit_quietly(self, event: ev.Event) -> None:
        """For stimuli nobody answers (steps, timers, disconnects): a failure is logged."""
        try:
            self._submit(event)
        except NpuError as exc:
            log.warning("%s (%s) refused: %s", type(event).__name__, event.stimulus_id, exc)
        except Exception:
            log.exception("the driver state failed on %s", event)

    def _connected(self, conn: RpcConnection) -> None:
        client = ClientConn(next(self._cids), conn)
        self._clients[conn] = client
        self._submit_quietly(ev.ClientConnected(
            stimulus_id=self._stimulus("connect"), now=self.clock.now(), conn=client.cid,
            uid=conn.peer.uid, pid=max(conn.peer.pid, 0)))

    def _disconnected(self, conn: RpcConnection, exc: BaseException | None) -> None:
        now = self.clock.now()
        if conn is self.callback_conn:
            self.callback_conn = None
            self._submit_quietly(ev.CallbackSet(stimulus_id=self._stimulus("callback-gone"),
                                                now=now, listening=False))
        if conn is self.manager_conn:
            self.manager_conn = None
            self._submit_quietly(ev.ManagerGone(stimulus_id=self._stimulus("manager-gone"),
                                                now=now))
            if self.state.orphaned_at is not None:
                log.warning("npud went away: loading nothing new; %d loaded model(s) keep "
                            "running for %g s unless a manager attaches again",
                            len(self.state.model_ids()), self.hc.orphan_grace_s)
        client = self._clients.pop(conn, None)
        if client is not None:
            self._submit_quietly(ev.ClientGone(stimulus_id=self._stimulus("gone"), now=now,
                                               conn=client.cid))

    def _on_timer(self, key: str) -> None:
        self._timers.pop(key, None)
        self._submit_quietly(ev.TimerFired(stimulus_id=self._stimulus("timer"),
                                           now=self.clock.now(), key=key))

    def _step_finished(self, ticket: int, error: str | None, run_us: float) -> None:
        self._submit_quietly(ev.StepFinished(stimulus_id=self._stimulus("step"),
                                             now=self.clock.now(), ticket=ticket,
                                             run_us=run_us, error=error))

    def _from_worker(self, ticket: int) -> Callable[[str | None, float], None]:
        def done(error: str | None, run_us: float) -> None:
            try:
                self.loop.call_soon_threadsafe(self._step_finished, ticket, error, run_us)
            except RuntimeError:
                pass  # the loop is gone (shutdown): nobody waits for this step

        return done

    # --- instructions out ------------------------------------------------------------

    def _carry_out(self, out: list[ev.Instruction]) -> None:
        runners = self._runners
        for ins in out:
            try:
                runners[type(ins)](ins)
            except Exception:
                log.exception("carrying out %r failed; continuing with the rest", ins)

    def _run_step(self, ins: ev.RunStep) -> None:
        ex = self._executions.get(ins.ticket)
        if ex is None:
            return
        if not ins.inline:
            self.runner.start(ex, ins, self._from_worker(ins.ticket))
        elif ins.ticket == self._current:
            self._inline_now = ins  # the execute call runs it once the state has answered
        else:
            # Not from inside another call: after the replies already decided go out.
            self.loop.call_soon(self._run_inline, ins)

    def _run_inline(self, ins: ev.RunStep) -> None:
        ex = self._executions.get(ins.ticket)
        if ex is not None:
            error, run_us = self.runner.run(ex, ins)
            self._step_finished(ins.ticket, error, run_us)

    def _abort_step(self, ins: ev.AbortStep) -> None:
        ex = self._executions.get(ins.ticket)
        if ex is not None and ex.prepared is not None:
            ex.prepared.abort()

    def _finish_job(self, ins: ev.FinishJob) -> None:
        ex = self._executions.pop(ins.ticket, None)
        if ex is None:
            return
        outcome: Reply | BaseException
        result = ex.result
        if ins.reason is _COMPLETED and result is not None:
            result[0].work_id = ins.work_id
            result[0].steps_run = ins.steps_run
            outcome = result
            self.exec_stats.record(ex.uid, time.perf_counter() - ex.t0)
        else:
            if result is not None:
                close_fds(result[1])
            outcome = job_error(ins)
        fut = ex.future
        if fut is None:
            ex.outcome = outcome  # the execute call itself answers
        elif fut.done():  # its caller is gone
            if isinstance(outcome, tuple):
                close_fds(outcome[1])
        elif isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)

    def _report_work(self, ins: ev.ReportWork) -> None:
        conn = self.callback_conn
        if conn is not None and not conn.closed:
            conn.push(_WORK_METHODS[ins.kind],
                      pb.WorkEvent(info=work_to_msg(ins.info), reason=ins.reason))

    def _release_model(self, ins: ev.ReleaseModel) -> None:
        prepared = self._prepared.pop(ins.model_id, None)
        if prepared is not None:
            prepared.release()

    def _report_memory(self, ins: ev.ReportModelMemory) -> None:
        if self.manager_conn is not None:
            self.manager_conn.push("hal.model_memory",
                                   pb.ModelMemory(grant_id=ins.grant_id, nbytes=ins.nbytes))

    def _close_pool(self, ins: ev.ClosePool) -> None:
        owned = self._pools.pop(ins.pool_id, None)
        if owned is not None:
            client, pool = owned
            del client.pools[ins.pool_id]
            pool.close()

    def _grace_expired(self, ins: ev.GraceExpired) -> None:
        log.warning("no manager attached again within %g s: released %d model(s)",
                    self.hc.orphan_grace_s, ins.models)
        self.orphan_expired.set()

    def _arm_timer(self, ins: ev.ArmTimer) -> None:
        self._cancel_timer(ev.CancelTimer(ins.key))
        key = ins.key
        self._timers[key] = self.clock.call_at(ins.at, lambda: self._on_timer(key))

    def _cancel_timer(self, ins: ev.CancelTimer) -> None:
        timer = self._timers.pop(ins.key, None)
        if timer is not None:
            timer.cancel()

    # --- hal.* ---------------------------------------------------------------------

    def _admin(self, fn: Handler) -> Handler:
        def guarded(ctx: CallContext, payload: bytes) -> Any:
            if not ctx.conn.admin:
                close_fds(ctx.fds)
                raise PermissionDenied(
                    f"{ctx.method} is for npud and admins only (uid {ctx.peer.uid} is neither)")
            return fn(ctx, payload)

        return guarded

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
        self.hc.enforce_admission = msg.enforce_admission
        self._submit(ev.ManagerAttached(stimulus_id=self._stimulus("attach"),
                                        now=self.clock.now(),
                                        enforce_admission=msg.enforce_admission))
        # A new npud after a restart adopts what we hold (the grants its clients claim).
        return pb.HeldGrants(grants=[
            pb.HeldGrant(grant_id=g, uid=uid, request_id=rid, memory_bytes=nbytes,
                         models=models)
            for g, uid, rid, nbytes, models in self.state.held_grants()])

    def _grant_issued(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.GrantIssued.FromString(payload)
        self._submit(ev.GrantIssued(stimulus_id=self._stimulus("grant"), now=self.clock.now(),
                                    grant_id=msg.grant_id, uid=msg.uid,
                                    request_id=msg.request_id))
        waiters, self._grant_waiters = self._grant_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        return Empty()

    def _grant_ended(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.GrantEnded.FromString(payload)
        self._submit(ev.GrantEnded(stimulus_id=self._stimulus("grant-ended"),
                                   now=self.clock.now(), grant_id=msg.grant_id,
                                   revoked=msg.revoked))
        return Empty()

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
        now, busy = self.clock.now(), self.runner.busy_s
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

    # --- device.*: capabilities, prepare, release --------------------------------------

    def capabilities_msg(self) -> pb.Capabilities:
        caps = self.driver.capabilities()
        return pb.Capabilities(
            name=self.hc.name, version=str(self.driver.version), backend=caps.backend,
            channels=self.hc.channels, memory_bytes=caps.memory_bytes,
            model_cache_files=self.cache_counts[0], data_cache_files=self.cache_counts[1],
            hal_version=HAL_VERSION, inline_limit=self.hc.inline_limit,
            enforce_admission=self.state.enforce_admission,
        )

    def _capabilities(self, ctx: CallContext, payload: bytes) -> pb.Capabilities:
        return self.capabilities_msg()

    def _stats(self, ctx: CallContext, payload: bytes) -> bytes:
        """JSON: channels busy and per-uid executions/s and p50/p99 latency (`npu top`)."""
        channels, busy, queued = self.state.load()
        # The grants held and their models' memory: checked from outside by `npu chaos`.
        held = [{"grant": g[:8], "uid": uid, "request_id": rid, "bytes": nbytes,
                 "models": models}
                for g, uid, rid, nbytes, models in self.state.held_grants()]
        return json.dumps({"channels": channels, "busy": busy, "queued": queued,
                           "held": held, **self.exec_stats.snapshot()}).encode()

    def _trace(self, ctx: CallContext, payload: bytes) -> bytes:
        """JSON: execution steps after the cursor in the payload (`npu trace record`); each
        poll keeps step recording on for a few more seconds."""
        try:
            cursor = int(bytes(payload[:20]).decode() or 0)
        except ValueError:
            raise InvalidArgument("device.trace takes a cursor (a decimal number)") from None
        return json.dumps(self.exec_stats.steps_since(cursor)).encode()

    def _cache_files_needed(self, ctx: CallContext, payload: bytes) -> pb.CacheFilesNeeded:
        return pb.CacheFilesNeeded(n_model=self.cache_counts[0], n_data=self.cache_counts[1])

    async def _admit(self, ctx: CallContext, grant_id: str) -> str | None:
        """The grant a prepare runs under (None: admission is not enforced). npud tells
        the driver of a grant before the client, but the sockets race: an unknown grant
        is waited for up to ``grant_wait_s``."""
        deadline = self.clock.now() + self.hc.grant_wait_s
        while True:
            check = self.state.check_grant(grant_id, ctx.peer.uid)
            if check is GrantCheck.LIVE:
                return grant_id
            if check is GrantCheck.NOT_NEEDED:
                return None
            if self.clock.now() >= deadline:
                raise GrantRequired(
                    f"driver {self.hc.name} does not know grant {grant_id[:8]}… (not issued by "
                    "npud, or already ended)")
            fut: asyncio.Future[None] = self.loop.create_future()
            self._grant_waiters.append(fut)
            timer = wake_at(self.clock, deadline, fut)
            try:
                await fut
            finally:
                timer.cancel()

    def _begin_prepare(self, ctx: CallContext, fds: list[int], inline_bytes: int) -> int:
        """Charge the bytes this prepare will read (every fd by its size, sparse or not) to
        the caller's uid; refused at a bound or while no manager is attached."""
        nbytes = inline_bytes
        for fd in fds:
            try:
                nbytes += os.fstat(fd).st_size
            except OSError:
                pass
        client = self._clients.get(ctx.conn)
        if client is None:
            raise InvalidArgument("the connection closed")
        prepare_id = next(self._prepare_ids)
        self._submit(ev.PrepareBegun(stimulus_id=self._stimulus("prepare"), now=self.clock.now(),
                                     conn=client.cid, prepare_id=prepare_id, nbytes=nbytes))
        return prepare_id

    def _end_prepare(self, prepare_id: int) -> None:
        if prepare_id:
            self._submit_quietly(ev.PrepareEnded(stimulus_id=self._stimulus("prepared"),
                                                 now=self.clock.now(), prepare_id=prepare_id))

    def _background(self, ctx: CallContext) -> bool:
        """Whether the caller's models are BACKGROUND (their compile and threads)."""
        return self.state.model_class(ctx.peer.uid) is ExecClass.BACKGROUND

    async def _prepare_model(self, ctx: CallContext, payload: bytes) -> pb.PreparedModelMsg:
        fds, ctx.fds = ctx.fds, []
        prepare_id = 0
        try:
            msg = pb.PrepareModel.FromString(payload)
            self.preparer.check_prepare(msg, fds)
            n_cache = msg.n_model_cache + msg.n_data_cache  # written, not read
            prepare_id = self._begin_prepare(ctx, fds[n_cache:], len(msg.onnx))
            grant = await self._admit(ctx, msg.grant_id)
            done = await self.preparer.prepare_model(msg, fds, ctx.peer.uid,
                                                     background=self._background(ctx))
            return self._model_ready(ctx, done, grant, prepare_id)
        finally:
            close_fds(fds)
            self._end_prepare(prepare_id)

    async def _prepare_from_cache(self, ctx: CallContext, payload: bytes
                                  ) -> pb.PreparedModelMsg:
        fds, ctx.fds = ctx.fds, []
        prepare_id = 0
        try:
            try:
                msg = pb.PrepareModelFromCache.FromString(payload)
                self.preparer.check_from_cache(msg, fds)
                prepare_id = self._begin_prepare(ctx, fds, 0)
                grant = await self._admit(ctx, msg.grant_id)
                done = await self.preparer.prepare_from_cache(
                    msg, fds, ctx.peer.uid, background=self._background(ctx))
            except (GeneralFailure, InvalidArgument):
                self._cache_result(b"rejected")  # the client falls back to a full compile
                raise
            finally:
                close_fds(fds)
            return self._model_ready(ctx, done, grant, prepare_id)
        finally:
            self._end_prepare(prepare_id)

    def _cache_result(self, result: bytes) -> None:
        """Tell npud how a cache load went (its npu_cache_loads_total metric)."""
        if self.manager_conn is not None:
            self.manager_conn.push("hal.cache_result", result)

    def _model_ready(self, ctx: CallContext, done: Prepared, grant: str | None,
                     prepare_id: int = 0) -> pb.PreparedModelMsg:
        prepared = done.model
        client = self._clients.get(ctx.conn)
        try:
            if client is None:
                raise InvalidArgument("the connection closed while the model was prepared")
            out = self.state.handle(ev.ModelPrepared(
                stimulus_id=self._stimulus("prepared"), now=self.clock.now(), conn=client.cid,
                grant_id=grant, memory_bytes=prepared.memory_bytes,
                inputs=frozenset(i.name for i in prepared.inputs),
                outputs=frozenset(o.name for o in prepared.outputs),
                input_specs=tuple(prepared.inputs), prepare_id=prepare_id))
        except BaseException:
            prepared.release()
            raise
        (model_id,) = [i.model_id for i in out if isinstance(i, ev.ModelReady)]
        self._prepared[model_id] = prepared
        self._carry_out(out)
        if done.from_cache or done.cache_written:  # a compile that filled the cache: a miss
            self._cache_result(b"hit" if done.from_cache else b"miss")
        return prepared_reply(model_id, done)

    def _release(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.Release.FromString(payload)
        client = self._clients.get(ctx.conn)
        if client is not None:
            self._submit(ev.ModelReleased(stimulus_id=self._stimulus("release"),
                                          now=self.clock.now(), conn=client.cid,
                                          model_id=msg.model_id))
        return Empty()

    # --- device.*: pools -------------------------------------------------------------

    def _register_pool(self, ctx: CallContext, payload: bytes) -> pb.PoolId:
        msg = pb.RegisterPool.FromString(payload)
        fds, ctx.fds = ctx.fds, []
        try:
            if len(fds) != 1:
                raise InvalidArgument(f"register_pool takes one memfd, got {len(fds)} fds")
            pool = tensorio.MappedPool(fds[0], msg.size)
            # Charged by the memfd's size, which sealing fixes: a sparse pool costs its
            # sender nothing but can make the driver touch every page of it.
            size = os.fstat(fds[0]).st_size
        finally:
            close_fds(fds)
        client = self._clients[ctx.conn]
        try:
            out = self.state.handle(ev.PoolRegistered(stimulus_id=self._stimulus("pool"),
                                                      now=self.clock.now(), conn=client.cid,
                                                      size=size))
        except BaseException:
            pool.close()
            raise
        (pool_id,) = [i.pool_id for i in out if isinstance(i, ev.PoolReady)]
        client.pools[pool_id] = pool
        self._pools[pool_id] = (client, pool)
        self._carry_out(out)
        return pb.PoolId(pool_id=pool_id)

    def _unregister_pool(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.PoolId.FromString(payload)
        client = self._clients[ctx.conn]
        self._submit(ev.PoolUnregistered(stimulus_id=self._stimulus("pool-gone"),
                                         now=self.clock.now(), conn=client.cid,
                                         pool_id=msg.pool_id))
        return Empty()

    # --- device.execute / device.cancel -------------------------------------------------

    def _execute(self, ctx: CallContext, payload: bytes) -> Reply | Awaitable[Reply]:
        """Answered at once when the job ran inline (a cheap model), else when the job's
        future resolves."""
        t0 = time.perf_counter()
        if ctx.fds:
            close_fds(ctx.fds)
        msg = pb.Execute.FromString(payload)
        client = self._clients[ctx.conn]
        inputs = decode_inputs(msg, client.pools)
        steps = max(1, msg.steps)
        feedback = tuple(msg.feedback.items()) if steps > 1 else ()
        ticket = next(self._tickets)
        original_uid = msg.original_uid if msg.has_original_uid else None
        feature_id = msg.feature_id if msg.has_feature_id else None
        ex = Execution(ticket, self._prepared.get(msg.model_id), inputs, dict(feedback),
                       ctx.conn.peer.uid if original_uid is None else original_uid,
                       feature_id, t0)
        if msg.out_pool_id:
            set_output_area(ex, msg, client.pools)
        event = ev.ExecuteRequested(
            stimulus_id=f"execute-{ticket}", now=self.clock.now(), conn=client.cid,
            ticket=ticket, model_id=msg.model_id, inputs=tuple(inputs), values=inputs,
            steps=steps,
            feedback=feedback, job_priority=msg.job_priority,
            original_uid=original_uid, feature_id=feature_id, group_id=msg.group_id or None,
            exec_id=msg.exec_id,
        )
        self._executions[ticket] = ex
        try:
            out = self.state.handle(event)
        except BaseException:
            del self._executions[ticket]
            raise
        self._current = ticket
        self._carry_out(out)
        self._current = 0
        inline, self._inline_now = self._inline_now, None
        if inline is not None:
            # The fast path: a cheap model on a free channel runs right here, and the
            # reply leaves without a future, a task or a thread hand-off.
            error, run_us = self.runner.run(ex, inline)
            self._step_finished(ticket, error, run_us)
        outcome = ex.outcome
        if outcome is not None:
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        fut: asyncio.Future[Reply] = self.loop.create_future()
        ex.future = fut
        return fut

    def _cancel(self, ctx: CallContext, payload: bytes) -> Empty:
        msg = pb.Cancel.FromString(payload)
        client = self._clients[ctx.conn]
        self._submit(ev.CancelRequested(stimulus_id=self._stimulus("cancel"),
                                        now=self.clock.now(), conn=client.cid,
                                        model_id=msg.model_id, exec_id=msg.exec_id))
        return Empty()

