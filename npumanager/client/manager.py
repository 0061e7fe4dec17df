"""NpuManager: the blocking client of npud (android.npumanager.NpuManager's twin).

Threads: the caller's thread sends calls; a reader thread (the transport's)
receives replies and pushes; callbacks run on one dispatch thread owned by the
manager, in the order npud sent them, and from there on the executor the app
gave (its ``submit``, or the callable itself, as Android's Executor.execute).
So a callback may call back into the manager (report loaded from
``on_can_load_model``) without deadlocking, and never runs on the caller's
thread while it holds an SDK lock.

Lost connection: every live request of this client ends with
``on_model_load_request_complete(request, RequestStatus.CANCELLED)`` (logged
as a warning naming the request), and every later call raises
``ServiceUnavailable``. npud drops the requests of a closed connection
without callbacks, so CANCELLED is what actually happened to them. Closing the
manager yourself drops its requests silently (no callbacks), as npud does.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from npumanager.constants import LoadStatus, RequestStatus, ThermalStatus, UnloadReason
from npumanager.errors import InvalidArgument
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
from npumanager.wire.client import SyncRpcClient
from npumanager.wire.conn import close_fds

from .request import (
    DeviceSummary,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelLoadStatusListener,
    ThermalInfo,
    policy_message,
)

log = logging.getLogger("npumanager.client")

ExecutorLike = Executor | Callable[[Callable[[], None]], Any]
_STOP = object()


def _run_callback(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:
        log.exception("an app callback raised; npumanager keeps delivering the next ones")


class CallbackDispatcher:
    """One thread that runs callbacks in order and hands them to each request's executor."""

    def __init__(self, name: str = "npu-callbacks") -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def post(self, executor: ExecutorLike | None, fn: Callable[[], None]) -> None:
        self._q.put((executor, fn))

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            executor, fn = item
            if executor is None:
                _run_callback(fn)
                continue
            try:
                if isinstance(executor, Executor):
                    executor.submit(_run_callback, fn)
                else:
                    executor(functools.partial(_run_callback, fn))
            except Exception:
                log.exception("the app's executor refused a callback; running it here")
                _run_callback(fn)

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then end the thread (unless called from it)."""
        self._q.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


class _Live:
    __slots__ = ("callback", "executor", "listener", "request")

    def __init__(self, request: ModelLoadRequest, callback: ModelLoadRequestCallback,
                 executor: ExecutorLike | None, listener: ModelLoadStatusListener) -> None:
        self.request = request
        self.callback = callback
        self.executor = executor
        self.listener = listener


class NpuManager:
    """A connection to npud. Use as a context manager, or call :meth:`close`."""

    def __init__(self, runtime_dir: str | os.PathLike[str] | None = None, *,
                 client_name: str = "", call_timeout: float | None = None) -> None:
        self.path = str(manager_socket(runtime_dir))
        self.call_timeout = call_timeout
        self._lock = threading.Lock()
        self._live: dict[int, _Live] = {}
        self._lost = False
        self._dispatcher = CallbackDispatcher()
        try:
            self._rpc = SyncRpcClient(
                self.path, "manager", client_name=client_name or f"pid{os.getpid()}",
                on_push=self._on_push, on_close=self._on_lost, threaded=True,
            )
        except BaseException:
            self._dispatcher.stop()
            raise
        self.uid: int = self._rpc.hello.uid
        self.admin: bool = self._rpc.hello.admin
        self.server_version: str = self._rpc.hello.server_version

    @classmethod
    def connect(cls, runtime_dir: str | os.PathLike[str] | None = None,
                **kw: Any) -> NpuManager:
        return cls(runtime_dir, **kw)

    def __repr__(self) -> str:
        state = "lost" if self._lost else ("closed" if self._rpc.closed else "connected")
        return f"<NpuManager {state} uid={self.uid} | {len(self._live)} live requests>"

    def __enter__(self) -> NpuManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- calls -----------------------------------------------------------

    def _call(self, method: str, msg: Any) -> bytes:
        payload, fds = self._rpc.call(method, msg, timeout=self.call_timeout)
        if fds:
            close_fds(fds)
        return payload

    def _report(self, method: str, request_id: int) -> None:
        self._call(method, RequestRef(request_id=request_id))

    def request_can_load_model(self, request: ModelLoadRequest,
                               callback: ModelLoadRequestCallback,
                               executor: ExecutorLike | None = None) -> ModelLoadStatusListener:
        """Ask npud whether ``request`` may load; the answer comes to ``callback``.

        Returns the request's listener (the same object the callbacks get)."""
        if not isinstance(request, ModelLoadRequest):
            raise InvalidArgument(f"expected a ModelLoadRequest, got {type(request).__name__}")
        listener = ModelLoadStatusListener(request, self._report)
        live = _Live(request, callback, executor, listener)
        with self._lock:
            if request.id in self._live:
                raise InvalidArgument(
                    f"request {request.id} is already live on this connection; "
                    f"a request may be submitted once"
                )
            # Registered before the call: npud pushes the first status before its reply.
            self._live[request.id] = live
        try:
            self._call("request", LoadRequest(request_id=request.id, size=int(request.size),
                                              priority=int(request.priority)))
        except BaseException:
            with self._lock:
                if self._live.get(request.id) is live:
                    del self._live[request.id]
            raise
        return listener

    def cancel_model_load(self, request: ModelLoadRequest) -> None:
        self._call("cancel", RequestRef(request_id=request.id))

    def set_policy(self, policy: int, bundle: Mapping[str, Any] | None = None) -> None:
        """Admin only. ``bundle``: KEY_MAX_BUDGET, KEY_MODEL_SIZE_WEIGHTS ({str(size): w})."""
        self._call("set_policy", policy_message(policy, bundle))

    def set_uid_importance(self, uid: int, importance: int) -> None:
        """Admin only: the ActivityManager analog."""
        self._call("set_importance", SetImportance(uid=uid, importance=int(importance)))

    def dump(self) -> dict[str, Any]:
        """What `npu status --json` prints."""
        reply = JsonReply.FromString(self._call("dump", Empty()))
        out: dict[str, Any] = json.loads(reply.json)
        return out

    def story(self, uid: int, request_id: int) -> list[dict[str, Any]]:
        """The decisions npud took about (uid, request id), oldest first."""
        reply = JsonReply.FromString(
            self._call("story", StoryRequest(uid=uid, request_id=request_id)))
        out: list[dict[str, Any]] = json.loads(reply.json)
        return out

    def devices(self) -> list[DeviceSummary]:
        reply = DeviceList.FromString(self._call("list_devices", Empty()))
        return [DeviceSummary.from_proto(d) for d in reply.devices]

    def thermal_status(self) -> ThermalInfo:
        return ThermalInfo.from_proto(ThermalReply.FromString(
            self._call("thermal_status", Empty())))

    def override_thermal_status(self, status: ThermalStatus | int) -> ThermalInfo:
        """Admin only (`cmd thermalservice override-status`)."""
        return ThermalInfo.from_proto(ThermalReply.FromString(
            self._call("thermal_override", ThermalOverride(status=int(status)))))

    def reset_thermal_status(self) -> ThermalInfo:
        """Admin only: back to the sensors."""
        return ThermalInfo.from_proto(ThermalReply.FromString(
            self._call("thermal_reset", Empty())))

    def close(self) -> None:
        """Close the connection; npud drops this client's requests (no callbacks)."""
        with self._lock:
            self._live.clear()
        self._rpc.close()
        self._dispatcher.stop()

    # --- pushes (reader thread) ----------------------------------------

    def _on_push(self, method: str, payload: bytes, fds: list[int]) -> None:
        if fds:
            close_fds(fds)
        if method == "on_can_load_model":
            m = CanLoad.FromString(payload)
            with self._lock:
                live = self._live.get(m.request_id)
            if live is None:
                return
            status = LoadStatus(m.status)
            if status == LoadStatus.CAN_LOAD_NOW:
                live.listener.grant_id = m.grant_id or None
            cb, req, lis = live.callback, live.request, live.listener
            self._dispatcher.post(live.executor,
                                  lambda: cb.on_can_load_model(req, status, lis))
        elif method == "on_request_unload_model":
            u = UnloadAsk.FromString(payload)
            with self._lock:
                live = self._live.get(u.request_id)
            if live is None:
                return
            reason = UnloadReason(u.reason)
            cb, req = live.callback, live.request
            self._dispatcher.post(live.executor,
                                  lambda: cb.on_request_unload_model(req, reason))
        elif method == "on_model_load_request_complete":
            c = RequestComplete.FromString(payload)
            with self._lock:
                live = self._live.pop(c.request_id, None)
            if live is None:
                return
            rstatus = RequestStatus(c.status)
            cb, req = live.callback, live.request
            self._dispatcher.post(live.executor,
                                  lambda: cb.on_model_load_request_complete(req, rstatus))
        elif method != "goodbye":
            log.debug("ignoring unknown push %r from npud", method)

    def _on_lost(self, exc: BaseException | None) -> None:
        with self._lock:
            self._lost = True
            ended = list(self._live.values())
            self._live.clear()
        for live in ended:
            log.warning(
                "connection to npud lost (%s): request %d ends CANCELLED", exc or "closed",
                live.request.id,
            )
            self._dispatcher.post(live.executor, functools.partial(
                live.callback.on_model_load_request_complete, live.request,
                RequestStatus.CANCELLED))

    @property
    def connected(self) -> bool:
        return not self._rpc.closed

