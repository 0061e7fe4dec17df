"""AsyncNpuManager: the asyncio client of npud, and ``reserve()`` leases.

Everything runs on the caller's event loop: pushes from npud arrive as
handlers on the connection and callbacks run there in order (a callback that
returns a coroutine is scheduled as a task), or on the executor given.

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
import json
import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from npumanager.constants import LoadStatus, RequestStatus, ThermalStatus, UnloadReason
from npumanager.errors import InvalidArgument, NpuError, RequestEnded, ServiceUnavailable
from npumanager.paths import manager_socket
from npumanager.proto.v1.manager_pb2 import (
    CanLoad,
    DeviceList,
    JsonReply,
    LoadRequest,
    RequestComplete,
    RequestRef,
    SetImportance,
    StoryRequest,
    ThermalOverride,
    ThermalReply,
    UnloadAsk,
)
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.wire.client import connect_async
from npumanager.wire.conn import CallContext, RpcConnection, close_fds

from .manager import ExecutorLike
from .request import (
    DeviceSummary,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ThermalInfo,
    policy_message,
)

log = logging.getLogger("npumanager.client")
_CALLBACK_RAISED = "an app callback raised; npumanager keeps delivering the next ones"

# Wire numbers to enums by dict: an Enum call is ~0.7 µs on every push.
_LOAD_STATUS = {int(s): s for s in LoadStatus}
_REQUEST_STATUS = {int(s): s for s in RequestStatus}
_UNLOAD_REASON = {int(s): s for s in UnloadReason}


class AsyncModelLoadStatusListener:
    """The async listener: valid only for its request; ``grant_id`` once granted."""

    def __init__(self, request: ModelLoadRequest, mgr: AsyncNpuManager) -> None:
        self.request = request
        self.grant_id: str | None = None
        self._mgr = mgr

    def __repr__(self) -> str:
        return f"<AsyncModelLoadStatusListener request={self.request.id} grant={self.grant_id}>"

    def _check(self, request: ModelLoadRequest) -> None:
        if request is not self.request and request != self.request:
            raise InvalidArgument(
                f"this listener belongs to request {self.request.id}, not {request!r}"
            )

    async def notify_model_loaded(self, request: ModelLoadRequest) -> None:
        self._check(request)
        _payload, fds = await self._mgr._conn.call("loaded", RequestRef(request_id=request.id))
        if fds:
            close_fds(fds)

    async def notify_model_unloaded(self, request: ModelLoadRequest) -> None:
        self._check(request)
        _payload, fds = await self._mgr._conn.call("unloaded", RequestRef(request_id=request.id))
        if fds:
            close_fds(fds)


class _Live:
    __slots__ = ("callback", "executor", "listener", "request")

    def __init__(self, request: ModelLoadRequest, callback: ModelLoadRequestCallback,
                 executor: ExecutorLike | None,
                 listener: AsyncModelLoadStatusListener) -> None:
        self.request = request
        self.callback = callback
        self.executor = executor
        self.listener = listener


class AsyncNpuManager:
    """An asyncio connection to npud. ``async with await AsyncNpuManager.connect():``."""

    def __init__(self, conn: RpcConnection, uid: int, admin: bool) -> None:
        self._conn = conn
        self.uid = uid
        self.admin = admin
        self._live: dict[int, _Live] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    @classmethod
    async def connect(cls, runtime_dir: str | os.PathLike[str] | None = None, *,
                      client_name: str = "") -> AsyncNpuManager:
        holder: list[AsyncNpuManager] = []

        def on_close(conn: RpcConnection, exc: BaseException | None) -> None:
            if holder:
                holder[0]._on_lost(exc)

        handlers: dict[str, object] = {}
        conn, hello = await connect_async(
            str(manager_socket(runtime_dir)), "manager", handlers,
            client_name=client_name or f"pid{os.getpid()}", on_close=on_close,
        )
        mgr = cls(conn, hello.uid, hello.admin)
        holder.append(mgr)
        # The handler table is the connection's own dict; fill it now that mgr exists.
        conn.handlers.update({
            "on_can_load_model": mgr._push_can_load,
            "on_request_unload_model": mgr._push_unload,
            "on_model_load_request_complete": mgr._push_complete,
        })
        return mgr

    def __repr__(self) -> str:
        state = "closed" if self._conn.closed else "connected"
        return f"<AsyncNpuManager {state} uid={self.uid} | {len(self._live)} live requests>"

    async def __aenter__(self) -> AsyncNpuManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return not self._conn.closed

    # --- calls ------------------------------------------------------------

    async def _call(self, method: str, msg: Any) -> bytes:
        payload, fds = await self._conn.call(method, msg)
        if fds:
            close_fds(fds)
        return payload

    async def request_can_load_model(
        self, request: ModelLoadRequest, callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None = None,
    ) -> AsyncModelLoadStatusListener:
        if not isinstance(request, ModelLoadRequest):
            raise InvalidArgument(f"expected a ModelLoadRequest, got {type(request).__name__}")
        if request.id in self._live:
            raise InvalidArgument(
                f"request {request.id} is already live on this connection; "
                f"a request may be submitted once"
            )
        listener = AsyncModelLoadStatusListener(request, self)
        live = _Live(request, callback, executor, listener)
        self._live[request.id] = live  # npud pushes the first status before its reply
        try:
            _payload, fds = await self._conn.call("request", LoadRequest(
                request_id=request.id, size=int(request.size), priority=int(request.priority)))
            if fds:
                close_fds(fds)
        except BaseException:
            if self._live.get(request.id) is live:
                del self._live[request.id]
            raise
        return listener

    async def cancel_model_load(self, request: ModelLoadRequest) -> None:
        await self._call("cancel", RequestRef(request_id=request.id))

    async def set_policy(self, policy: int, bundle: Mapping[str, Any] | None = None) -> None:
        await self._call("set_policy", policy_message(policy, bundle))

    async def set_uid_importance(self, uid: int, importance: int) -> None:
        await self._call("set_importance", SetImportance(uid=uid, importance=int(importance)))

    async def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(JsonReply.FromString(
            await self._call("dump", Empty())).json)
        return out

    async def story(self, uid: int, request_id: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = json.loads(JsonReply.FromString(await self._call(
            "story", StoryRequest(uid=uid, request_id=request_id))).json)
        return out

    async def devices(self) -> list[DeviceSummary]:
        reply = DeviceList.FromString(await self._call("list_devices", Empty()))
        return [DeviceSummary.from_proto(d) for d in reply.devices]

    async def thermal_status(self) -> ThermalInfo:
        return ThermalInfo.from_proto(ThermalReply.FromString(
            await self._call("thermal_status", Empty())))

    async def override_thermal_status(self, status: ThermalStatus | int) -> ThermalInfo:
        return ThermalInfo.from_proto(ThermalReply.FromString(
            await self._call("thermal_override", ThermalOverride(status=int(status)))))

    async def reset_thermal_status(self) -> ThermalInfo:
        return ThermalInfo.from_proto(ThermalReply.FromString(
            await self._call("thermal_reset", Empty())))

    def reserve(self, request: ModelLoadRequest) -> Lease:
        """``async with mgr.reserve(req) as lease:`` — see the module docstring."""
        return Lease(self, request)

    async def close(self) -> None:
        self._closing = True
        self._live.clear()
        self._conn.close()
        for t in list(self._tasks):
            t.cancel()

    # --- pushes (on the loop) --------------------------------------------

    def _deliver(self, live: _Live, fn: Callable[[], Any]) -> None:
        if live.executor is not None:
            executor = live.executor
            if isinstance(executor, Executor):
                executor.submit(fn)
            else:
                executor(fn)
            return
        try:
            result = fn()
        except Exception:
            log.exception(_CALLBACK_RAISED)
            return
        if result is not None:
            self._inline_result(result)

    def _inline_result(self, result: Any) -> None:
        """A callback run on the loop returned something: schedule it if awaitable."""
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # The three push handlers call the app's callback directly when it runs on the loop
    # (no executor): the same order and error handling as _deliver, without a closure.

    def _push_can_load(self, ctx: CallContext, payload: bytes) -> None:
        m = CanLoad.FromString(payload)
        live = self._live.get(m.request_id)
        if live is None:
            return
        status = _LOAD_STATUS[m.status]
        if status is LoadStatus.CAN_LOAD_NOW:
            live.listener.grant_id = m.grant_id or None
        if live.executor is not None:
            self._deliver(live, functools.partial(
                live.callback.on_can_load_model, live.request, status, live.listener))
            return
        try:
            # An async app may define its callbacks as coroutines (scheduled as tasks).
            fn: Callable[..., Any] = live.callback.on_can_load_model
            result = fn(live.request, status, live.listener)
        except Exception:
            log.exception(_CALLBACK_RAISED)
            return
        if result is not None:
            self._inline_result(result)

    def _push_unload(self, ctx: CallContext, payload: bytes) -> None:
        u = UnloadAsk.FromString(payload)
        live = self._live.get(u.request_id)
        if live is None:
            return
        reason = _UNLOAD_REASON.get(u.reason) or UnloadReason(u.reason)
        cb, req = live.callback, live.request
        if live.executor is not None:
            self._deliver(live, lambda: cb.on_request_unload_model(req, reason))
            return
        try:
            fn: Callable[..., Any] = cb.on_request_unload_model
            result = fn(req, reason)
        except Exception:
            log.exception(_CALLBACK_RAISED)
            return
        if result is not None:
            self._inline_result(result)

    def _push_complete(self, ctx: CallContext, payload: bytes) -> None:
        c = RequestComplete.FromString(payload)
        live = self._live.pop(c.request_id, None)
        if live is None:
            return
        status = _REQUEST_STATUS.get(c.status) or RequestStatus(c.status)
        cb, req = live.callback, live.request
        if live.executor is not None:
            self._deliver(live, lambda: cb.on_model_load_request_complete(req, status))
            return
        try:
            fn: Callable[..., Any] = cb.on_model_load_request_complete
            result = fn(req, status)
        except Exception:
            log.exception(_CALLBACK_RAISED)
            return
        if result is not None:
            self._inline_result(result)

    def _on_lost(self, exc: BaseException | None) -> None:
        if self._closing:
            return
        ended = list(self._live.values())
        self._live.clear()
        for live in ended:
            log.warning("connection to npud lost (%s): request %d ends CANCELLED",
                        exc or "closed", live.request.id)
            self._deliver(live, functools.partial(
                live.callback.on_model_load_request_complete, live.request,
                RequestStatus.CANCELLED))


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
