"""NpuManager: the blocking client of npud (android.npumanager.NpuManager's twin).

A thin adapter over the shared :class:`~npumanager.client.core.ClientCore`
(live requests, push decoding, lost connection), which it feeds from the
transport's reader thread.

Threads: the caller's thread sends calls; a reader thread (the transport's)
receives replies and pushes; callbacks run on one dispatch thread owned by the
manager, in the order npud sent them, and from there on the executor the app
gave (its ``submit``, or the callable itself, as Android's Executor.execute).
So a callback may call back into the manager (report loaded from
``on_can_load_model``) without deadlocking, and never runs on the caller's
thread while it holds an SDK lock.

Lost connection: if npud crashed or restarted, a background thread reconnects (50 ms
doubling to 1 s, for ``reconnect_window_s``) and re-registers the live
requests; npud adopts them, so an adopted request sees no callback at all
(client/core.py). If npud said goodbye (a final stop), reconnecting is off
(``reconnect=False``) or the window passes, every live request of this client
ends with ``on_model_load_request_complete(request, RequestStatus.CANCELLED)``
(logged as a warning naming the request), and later calls raise
``ServiceUnavailable``. Closing the manager yourself drops its requests
silently (no callbacks), as npud does.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from npumanager.constants import ThermalStatus
from npumanager.fds import close_fds
from npumanager.hal import rt_backstop
from npumanager.paths import manager_socket
from npumanager.wire.client import SyncRpcClient

from . import calls
from .core import (
    RECONNECT_WINDOW_S,
    ClientCore,
    ExecutorLike,
    Phase,
    hand_to_executor,
    reconnect_delays,
    run_callback,
)
from .request import (
    DeviceSummary,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelLoadStatusListener,
    RealtimeInfo,
    ThermalInfo,
)

__all__ = ["CallbackDispatcher", "ExecutorLike", "NpuManager"]

log = logging.getLogger("npumanager.client")

T = TypeVar("T")
_STOP = object()


class CallbackDispatcher:
    """One thread that runs callbacks in order and hands them to each request's executor."""

    def __init__(self, name: str = "npu-callbacks") -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def post(self, executor: ExecutorLike | None, fn: Callable[..., object], *args: Any) -> None:
        self._q.put((executor, fn, args))

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            executor, fn, args = item
            if executor is None:
                run_callback(fn, *args)
                continue
            try:
                hand_to_executor(executor, fn, *args)
            except Exception:
                log.exception("the app's executor refused a callback; running it here")
                run_callback(fn, *args)

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then end the thread (unless called from it)."""
        self._q.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


class NpuManager:
    """A connection to npud. Use as a context manager, or call :meth:`close`."""

    def __init__(self, runtime_dir: str | os.PathLike[str] | None = None, *,
                 client_name: str = "", call_timeout: float | None = None,
                 reconnect: bool = True,
                 reconnect_window_s: float = RECONNECT_WINDOW_S) -> None:
        self.path = str(manager_socket(runtime_dir))
        self._dispatcher = CallbackDispatcher()
        # The core is single-threaded; the caller's thread and the reader thread take turns.
        self._lock = threading.Lock()
        self._core: ClientCore[ModelLoadStatusListener] = ClientCore(
            self._dispatcher.post, functools.partial(ModelLoadStatusListener, report=self._report),
            reconnect=reconnect)
        self._client_name = client_name or f"pid{os.getpid()}"
        self._call_timeout = call_timeout
        self.reconnect_window_s = reconnect_window_s
        #: Which connection is current: a close reported by an older one is ignored.
        self._generation = 0
        self._closing = False
        #: Threads the current connection got at SCHED_FIFO: lowered when it ends.
        self._rt_tids: set[int] = set()
        try:
            self._rpc = self._open()
        except BaseException:
            # A connection refused during the handshake (LimitExceeded) reported its
            # close already: this manager never existed, nothing may reconnect it.
            self._closing = True
            self._dispatcher.stop()
            raise
        #: Seconds a call waits for npud's answer (the transport's default for npud if None).
        self.call_timeout: float = self._rpc.call_timeout
        self.uid: int = self._rpc.hello.uid
        self.admin: bool = self._rpc.hello.admin
        self.server_version: str = self._rpc.hello.server_version

    def _open(self) -> SyncRpcClient:
        gen = self._generation
        return SyncRpcClient(
            self.path, "manager", client_name=self._client_name,
            on_push=self._on_push, on_close=lambda exc: self._on_lost(gen, exc),
            threaded=True, call_timeout=self._call_timeout,
        )

    @classmethod
    def connect(cls, runtime_dir: str | os.PathLike[str] | None = None,
                **kw: Any) -> NpuManager:
        return cls(runtime_dir, **kw)

    def __repr__(self) -> str:
        phase = self._core.phase
        state = "closed" if phase is Phase.CONNECTED and self._rpc.closed else phase.value
        return f"<NpuManager {state} uid={self.uid} | {len(self._core)} live requests>"

    def __enter__(self) -> NpuManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return not self._rpc.closed

    @property
    def phase(self) -> str:
        """connected, reconnecting (npud went away; live requests kept), lost or closed."""
        return self._core.phase.value

    # --- calls -----------------------------------------------------------

    def _do(self, call: calls.Call[T]) -> T:
        payload, fds = self._rpc.call(call.method, call.message)
        if fds:
            close_fds(fds)
        return call.decode(payload)

    def _report(self, method: str, request_id: int) -> None:
        self._do(calls.request_ref(method, request_id))
        with self._lock:
            self._core.reported(method, request_id)

    def request_can_load_model(self, request: ModelLoadRequest,
                               callback: ModelLoadRequestCallback,
                               executor: ExecutorLike | None = None) -> ModelLoadStatusListener:
        """Ask npud whether ``request`` may load; the answer comes to ``callback``.

        Returns the request's listener (the same object the callbacks get)."""
        with self._lock:
            live = self._core.register(request, callback, executor)
        try:
            self._do(calls.request(request))
        except BaseException:
            with self._lock:
                self._core.withdraw(live)
            raise
        return live.listener

    def cancel_model_load(self, request: ModelLoadRequest) -> None:
        self._do(calls.request_ref("cancel", request.id))

    def set_policy(self, policy: int, bundle: Mapping[str, Any] | None = None) -> None:
        """Admin only. ``bundle``: KEY_MAX_BUDGET, KEY_MODEL_SIZE_WEIGHTS ({str(size): w})."""
        self._do(calls.set_policy(policy, bundle))

    def set_uid_importance(self, uid: int, importance: int) -> None:
        """Admin only: the ActivityManager analog."""
        self._do(calls.set_importance(uid, importance))

    def dump(self) -> dict[str, Any]:
        """What `npu status --json` prints."""
        return self._do(calls.dump())

    def story(self, uid: int, request_id: int) -> list[dict[str, Any]]:
        """The decisions npud took about (uid, request id), oldest first."""
        return self._do(calls.story(uid, request_id))

    def decisions(self, since: float, limit: int = 0) -> dict[str, Any]:
        """Admin: npud's decisions at or after ``since`` (CLOCK_MONOTONIC), oldest first:
        ``{"decisions": [...], "truncated": bool, "lost": bool}`` (one page of at most
        ``limit``; ``lost`` when the bounded log already dropped some of them)."""
        return self._do(calls.decisions(since, limit))

    def devices(self) -> list[DeviceSummary]:
        return self._do(calls.devices())

    def set_thread_realtime(self, tid: int | None = None) -> RealtimeInfo:
        """Put one of this process's own threads (``tid``; default: the calling thread)
        at SCHED_FIFO, as Android's SchedulingPolicyService.requestPriority: for
        FOREGROUND apps when npud's ``[manager] app_rt_priority`` is set. npud checks the
        thread is this process's and this uid's, the uid's importance, and at most
        ``app_rt_max_threads`` per uid; it demotes the thread when it uses more than
        ``max_cpu_ms`` of CPU in a window, when the uid stops being FOREGROUND, or when
        this connection closes. Before it asks, this process bounds its own real-time
        threads so that the bound holds without npud (RLIMIT_RTTIME: SIGXCPU lowers them
        after 50 ms at FIFO without blocking, the kernel kills the process at 500 ms;
        hal/rt_backstop.py), and when this connection ends (npud gone, or closed) it
        lowers the thread itself. Refusals: PermissionDenied, LimitExceeded, InvalidArgument,
        RealtimeUnavailable (off, the kernel refused, or this process cannot be
        bounded)."""
        tid = threading.get_native_id() if tid is None else tid
        rt_backstop.prepare(tid)  # (bounds this process first: hal/rt_backstop.py)
        try:
            got = self._do(calls.set_thread_realtime(tid))
        except BaseException:
            rt_backstop.refused(tid)
            raise
        with self._lock:
            self._rt_tids.add(tid)
        if self._rpc.closed:  # (lost meanwhile: the loss may have lowered the others only)
            self._lower_rt()
        return got

    def _lower_rt(self) -> None:
        """The connection that asked ended: its threads back to SCHED_OTHER (npud gone
        leaves no watchdog over them; npud alive demotes them as well)."""
        with self._lock:
            tids, self._rt_tids = self._rt_tids, set()
        if tids:
            rt_backstop.lower(tids)

    def thermal_status(self) -> ThermalInfo:
        return self._do(calls.thermal_status())

    def override_thermal_status(self, status: ThermalStatus | int) -> ThermalInfo:
        """Admin only (`cmd thermalservice override-status`)."""
        return self._do(calls.thermal_override(status))

    def reset_thermal_status(self) -> ThermalInfo:
        """Admin only: back to the sensors."""
        return self._do(calls.thermal_reset())

    def close(self) -> None:
        """Close the connection; npud drops this client's requests (no callbacks)."""
        with self._lock:
            self._closing = True
            self._core.close()
        self._rpc.close()
        self._lower_rt()
        self._dispatcher.stop()

    # --- the transport's reader thread ---------------------------------------------

    def _on_push(self, method: str, payload: bytes, fds: list[int]) -> None:
        with self._lock:
            self._core.on_push(method, payload, fds)

    def _on_lost(self, generation: int, exc: BaseException | None) -> None:
        if generation == self._generation and not self._closing:
            self._lower_rt()  # (its grants are gone: a new connection does not renew them)
        with self._lock:
            if generation != self._generation or self._closing or not hasattr(self, "_rpc"):
                return  # a stale connection, a closed manager, or one still being made
            again = self._core.connection_lost(exc)
        if again:
            threading.Thread(target=self._reconnect, name="npu-reconnect", daemon=True).start()

    def _reconnect(self) -> None:
        """npud went away: reconnect on the back-off and re-register the live requests."""
        give_up_at = time.monotonic() + self.reconnect_window_s
        for delay in reconnect_delays():
            if time.monotonic() + delay > give_up_at:
                break
            time.sleep(delay)
            with self._lock:
                if self._closing:
                    return
                self._generation += 1
            try:
                rpc = self._open()
            except Exception as exc:
                log.debug("reconnecting to npud: %s", exc)
                continue
            with self._lock:
                if self._closing:
                    rpc.close()
                    return
                old, self._rpc = self._rpc, rpc
                reclaim = self._core.reconnected()
            old.close()  # releases its socket; its close report is stale (generation)
            try:
                if reclaim.claims:
                    rpc.call("reclaim", reclaim)
            except Exception as exc:
                # The new connection failed at once: its close starts another round.
                log.warning("re-registering with npud failed: %s", exc)
            return
        with self._lock:
            if not self._closing:
                self._core.give_up()
