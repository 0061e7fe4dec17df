"""AsyncNpuManager: the asyncio client of npud, and ``reserve()`` leases.

A thin adapter over the shared :class:`~npumanager.client.core.ClientCore`
(live requests, push decoding, lost connection). Everything runs on the
caller's event loop: pushes from npud arrive as handlers on the connection and
callbacks run there in order (a callback that returns a coroutine is scheduled
as a task), or on the executor given.

``async with mgr.reserve(req) as lease:`` asks, waits for CAN_LOAD_NOW,
reports the model loaded, and on leaving reports it unloaded; inside,
``await lease.unload_requested()`` returns when npud asks for the model back.
If the request ends before it is granted (cancelled, connection lost) the
``async with`` raises :class:`npumanager.errors.RequestEnded`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from npumanager.constants import LoadStatus, RequestStatus, ThermalStatus, UnloadReason
from npumanager.errors import NpuError, RequestEnded, ServiceUnavailable
from npumanager.fds import close_fds
from npumanager.hal import rt_backstop
from npumanager.paths import manager_socket
from npumanager.wire.client import connect_async
from npumanager.wire.conn import RpcConnection

from . import calls
from .core import (
    PUSHES,
    RECONNECT_WINDOW_S,
    ClientCore,
    ExecutorLike,
    hand_to_executor,
    reconnect_delays,
)
from .request import (
    DeviceSummary,
    ListenerBase,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    RealtimeInfo,
    ThermalInfo,
)

log = logging.getLogger("npumanager.client")

T = TypeVar("T")


class AsyncModelLoadStatusListener(ListenerBase):
    """The async listener: valid only for its request; ``grant_id`` once granted."""

    def __init__(self, request: ModelLoadRequest,
                 report: Callable[[str, int], Awaitable[None]]) -> None:
        super().__init__(request)
        self._report = report

    async def notify_model_loaded(self, request: ModelLoadRequest) -> None:
        self._check(request)
        await self._report("loaded", request.id)

    async def notify_model_unloaded(self, request: ModelLoadRequest) -> None:
        self._check(request)
        await self._report("unloaded", request.id)


class AsyncNpuManager:
    """An asyncio connection to npud. ``async with await AsyncNpuManager.connect():``.

    If npud crashes, a task reconnects (client/core.py) and re-registers the live
    requests; npud adopts them without callbacks."""

    def __init__(self, conn: RpcConnection, uid: int, admin: bool, *,
                 reconnect: bool = True, reconnect_window_s: float = RECONNECT_WINDOW_S,
                 path: str = "", client_name: str = "") -> None:
        self._conn = conn
        self.uid = uid
        self.admin = admin
        self._tasks: set[asyncio.Task[Any]] = set()
        self._core: ClientCore[AsyncModelLoadStatusListener] = ClientCore(
            self._deliver, functools.partial(AsyncModelLoadStatusListener, report=self._report),
            reconnect=reconnect and bool(path))
        self._path = path
        self._client_name = client_name
        self.reconnect_window_s = reconnect_window_s
        self._generation = 0
        self._closing = False
        #: Threads the current connection got at SCHED_FIFO: lowered when it ends.
        self._rt_tids: set[int] = set()
        self._bind(conn)

    def _bind(self, conn: RpcConnection) -> None:
        on_push = self._core.on_push
        for name in (*PUSHES, "goodbye"):
            conn.handlers[name] = lambda ctx, payload, name=name: on_push(name, payload, ctx.fds)

    @classmethod
    async def connect(cls, runtime_dir: str | os.PathLike[str] | None = None, *,
                      client_name: str = "", reconnect: bool = True,
                      reconnect_window_s: float = RECONNECT_WINDOW_S) -> AsyncNpuManager:
        made: list[AsyncNpuManager] = []

        def on_close(conn: RpcConnection, exc: BaseException | None) -> None:
            if made:
                made[0]._on_lost(0, exc)

        path = str(manager_socket(runtime_dir))
        name = client_name or f"pid{os.getpid()}"
        conn, hello = await connect_async(path, "manager", {}, client_name=name,
                                          on_close=on_close)
        mgr = cls(conn, hello.uid, hello.admin, reconnect=reconnect,
                  reconnect_window_s=reconnect_window_s, path=path, client_name=name)
        made.append(mgr)
        return mgr

    def _on_conn_lost(self, generation: int, conn: RpcConnection,
                      exc: BaseException | None) -> None:
        self._on_lost(generation, exc)

    def _on_lost(self, generation: int, exc: BaseException | None) -> None:
        if generation != self._generation or self._closing:
            return
        self._lower_rt()
        if self._core.connection_lost(exc):
            self._spawn(self._reconnect())

    async def _reconnect(self) -> None:
        """npud went away: reconnect on the back-off and re-register the live requests."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.reconnect_window_s
        for delay in reconnect_delays():
            if loop.time() + delay > give_up_at:
                break
            await asyncio.sleep(delay)
            if self._closing:
                return
            self._generation += 1
            gen = self._generation
            try:
                conn, _hello = await connect_async(
                    self._path, "manager", {}, client_name=self._client_name,
                    on_close=functools.partial(self._on_conn_lost, gen))
            except Exception as exc:
                log.debug("reconnecting to npud: %s", exc)
                continue
            if self._closing:
                conn.close()
                return
            old, self._conn = self._conn, conn
            old.close()
            self._bind(conn)
            reclaim = self._core.reconnected()
            try:
                if reclaim.claims:
                    await conn.call("reclaim", reclaim)
            except Exception as exc:
                log.warning("re-registering with npud failed: %s", exc)
            return
        if not self._closing:
            self._core.give_up()

    def __repr__(self) -> str:
        state = "closed" if self._conn.closed else "connected"
        return f"<AsyncNpuManager {state} uid={self.uid} | {len(self._core)} live requests>"

    async def __aenter__(self) -> AsyncNpuManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return not self._conn.closed

    # --- calls ------------------------------------------------------------

    async def _do(self, call: calls.Call[T]) -> T:
        payload, fds = await self._conn.call(call.method, call.message)
        if fds:
            close_fds(fds)
        return call.decode(payload)

    async def _report(self, method: str, request_id: int) -> None:
        # request, loaded and unloaded await the transport themselves: _do's decoding has
        # nothing to do for them, and a coroutine less is ~1 µs on every lifecycle.
        call = calls.request_ref(method, request_id)
        _, fds = await self._conn.call(call.method, call.message)
        if fds:
            close_fds(fds)
        self._core.reported(method, request_id)

    async def request_can_load_model(
        self, request: ModelLoadRequest, callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None = None,
    ) -> AsyncModelLoadStatusListener:
        live = self._core.register(request, callback, executor)
        try:
            call = calls.request(request)
            _, fds = await self._conn.call(call.method, call.message)
            if fds:
                close_fds(fds)
        except asyncio.CancelledError:
            self._core.withdraw(live)
            # The request left before the first await: npud holds it unless told otherwise.
            self._spawn(self._cancel_quietly(request))
            raise
        except BaseException:
            self._core.withdraw(live)
            raise
        return live.listener

    async def _cancel_quietly(self, request: ModelLoadRequest) -> None:
        try:
            await self.cancel_model_load(request)
        except NpuError as exc:  # it ended meanwhile, or npud is gone
            log.debug("cancelling request %d after an interrupted request: %s", request.id, exc)

    async def cancel_model_load(self, request: ModelLoadRequest) -> None:
        await self._do(calls.request_ref("cancel", request.id))

    async def set_policy(self, policy: int, bundle: Mapping[str, Any] | None = None) -> None:
        await self._do(calls.set_policy(policy, bundle))

    async def set_uid_importance(self, uid: int, importance: int) -> None:
        await self._do(calls.set_importance(uid, importance))

    async def dump(self) -> dict[str, Any]:
        return await self._do(calls.dump())

    async def story(self, uid: int, request_id: int) -> list[dict[str, Any]]:
        return await self._do(calls.story(uid, request_id))

    async def decisions(self, since: float, limit: int = 0) -> dict[str, Any]:
        return await self._do(calls.decisions(since, limit))

    async def devices(self) -> list[DeviceSummary]:
        return await self._do(calls.devices())

    async def set_thread_realtime(self, tid: int) -> RealtimeInfo:
        """As NpuManager.set_thread_realtime; ``tid`` is required (the event loop's
        thread is rarely the one meant). This process is bounded first, as there
        (hal/rt_backstop.py: call its ``install()`` from the main thread for the SIGXCPU
        lowering when this runs elsewhere)."""
        rt_backstop.prepare(tid)
        try:
            got = await self._do(calls.set_thread_realtime(tid))
        except BaseException:
            rt_backstop.refused(tid)
            raise
        self._rt_tids.add(tid)
        if self._conn.closed:
            self._lower_rt()
        return got

    def _lower_rt(self) -> None:
        """The connection that asked ended: its threads back to SCHED_OTHER (as
        NpuManager's)."""
        tids, self._rt_tids = self._rt_tids, set()
        if tids:
            rt_backstop.lower(tids)

    async def thermal_status(self) -> ThermalInfo:
        return await self._do(calls.thermal_status())

    async def override_thermal_status(self, status: ThermalStatus | int) -> ThermalInfo:
        return await self._do(calls.thermal_override(status))

    async def reset_thermal_status(self) -> ThermalInfo:
        return await self._do(calls.thermal_reset())

    def reserve(self, request: ModelLoadRequest) -> Lease:
        """``async with mgr.reserve(req) as lease:`` — see the module docstring."""
        return Lease(self, request)

    async def close(self) -> None:
        self._closing = True
        self._core.close()
        self._conn.close()
        self._lower_rt()
        for t in list(self._tasks):
            t.cancel()

    # --- pushes and callbacks (on the loop) ---------------------------------

    def _deliver(self, executor: ExecutorLike | None, fn: Callable[..., object],
                 *args: Any) -> None:
        """Run one callback: on the app's executor, or here on the loop. An async app may
        define its callbacks as coroutines: the loop runs them as tasks."""
        if executor is not None:
            try:
                hand_to_executor(executor, fn, *args)
                return
            except Exception:
                log.exception("the app's executor refused a callback; running it on the loop")
        try:
            result = fn(*args)
        except Exception:
            log.exception("an app callback raised; npumanager keeps delivering the next ones")
            return
        if result is not None and inspect.isawaitable(result):
            self._spawn(result)

    def _spawn(self, aw: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(aw)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _LeaseCallback(ModelLoadRequestCallback):
    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.granted: asyncio.Future[AsyncModelLoadStatusListener] = loop.create_future()
        self.unload: asyncio.Future[UnloadReason | None] = loop.create_future()
        self.ended: asyncio.Future[RequestStatus] = loop.create_future()
        self.last_status: LoadStatus | None = None

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        self.last_status = status
        if status == LoadStatus.CAN_LOAD_NOW and not self.granted.done():
            self.granted.set_result(listener)

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        if not self.unload.done():
            self.unload.set_result(reason)

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        if not self.ended.done():
            self.ended.set_result(status)
        if not self.unload.done():
            self.unload.set_result(None)
        if not self.granted.done():
            self.granted.set_exception(RequestEnded(
                f"request {request.id} ended {status.name} before it was granted"
                + (" (connection to npud lost?)" if status == RequestStatus.CANCELLED else ""),
                status=status,
            ))
            self.granted.exception()  # retrieved: nobody may be waiting any more


class Lease:
    """A granted, loaded model for the duration of an ``async with`` block."""

    def __init__(self, mgr: AsyncNpuManager, request: ModelLoadRequest) -> None:
        self.mgr = mgr
        self.request = request
        self.listener: AsyncModelLoadStatusListener | None = None
        self._cb: _LeaseCallback | None = None

    def __repr__(self) -> str:
        return f"<Lease request={self.request.id} grant={self.grant_id} status={self.status}>"

    @property
    def grant_id(self) -> str | None:
        return self.listener.grant_id if self.listener is not None else None

    @property
    def status(self) -> RequestStatus | None:
        """The terminal status once the request ended (REVOKED, ...), else None."""
        if self._cb is not None and self._cb.ended.done():
            return self._cb.ended.result()
        return None

    @property
    def revoked(self) -> bool:
        return self.status == RequestStatus.REVOKED

    async def unload_requested(self) -> UnloadReason | None:
        """Wait until npud asks for the model back; None if the request ended without an ask."""
        assert self._cb is not None, "use inside `async with mgr.reserve(req)`"
        return await asyncio.shield(self._cb.unload)

    async def __aenter__(self) -> Lease:
        self._cb = cb = _LeaseCallback()
        await self.mgr.request_can_load_model(self.request, cb)
        try:
            listener = await cb.granted
        except asyncio.CancelledError:
            if not cb.ended.done() and self.mgr.connected:
                try:
                    await asyncio.shield(self.mgr.cancel_model_load(self.request))
                except NpuError:
                    pass
            raise
        self.listener = listener
        await listener.notify_model_loaded(self.request)
        return self

    async def __aexit__(self, *exc: object) -> None:
        cb = self._cb
        if cb is None or cb.ended.done() or self.listener is None:
            return
        try:
            await self.listener.notify_model_unloaded(self.request)
        except ServiceUnavailable:
            pass  # npud is gone: it dropped the request already
        except NpuError as e:
            if not cb.ended.done():  # not a race with a revocation
                raise
            log.debug("unloaded after the request ended: %s", e)
