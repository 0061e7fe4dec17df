"""One model held under the node's npud on behalf of a long-lived server (a Ray actor).

:class:`ModelHolder` asks npud for a grant, prepares the model through
:mod:`npumanager.nn`, serves executions, and honours unload requests: it stops
taking new executions, lets the running ones finish (bounded, inside npud's
unload deadline), releases the model and reports it unloaded. Then, as the
owner chose, it asks again and waits for a new grant (``on_unload="wait"``),
or it leaves (``"restart"``): ``on_leave`` is called, which in a Ray actor
ends the worker process so Ray restarts the actor, on another node if this
one still has no room (see :mod:`npumanager.ray.actor`).

Threads: npud's callbacks only enqueue; one worker thread owns every state
transition (grant -> prepare -> loaded -> unload -> release), so a slow
prepare never holds up npud's dispatch thread and no two transitions race.
Executions run on the caller's threads and only read the state under a
condition variable.

Every transition is an event (``holder.events``, and one JSON line each in
``events_path`` when set, so a timeline survives the process: Ray restarts
start new processes).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from npumanager.client import ModelLoadRequest, ModelLoadRequestCallback, NpuManager
from npumanager.constants import (
    LoadStatus,
    ModelPriority,
    ModelSize,
    RequestStatus,
    UnloadReason,
)
from npumanager.errors import DeviceUnavailable, InvalidArgument, NpuError, PermissionDenied

log = logging.getLogger("npumanager.ray")

ON_UNLOAD = ("wait", "restart")
ModelSource = str | os.PathLike[str] | bytes | Callable[[], bytes]


@dataclass(frozen=True)
class HolderConfig:
    """How a held model is requested, prepared and given back (``npu_actor``'s arguments)."""

    model: ModelSource
    device: str = "reference"
    size: ModelSize = ModelSize.LESS_THAN_1GB
    #: Model priority of the request; BACKGROUND by default, so local foreground apps win.
    priority: ModelPriority = ModelPriority.BACKGROUND
    #: The uid's importance to set at start (admin only; None leaves it as npud has it).
    importance: int | None = None
    #: After an unload: "wait" for a new grant here, or "restart" (leave the node).
    on_unload: str = "restart"
    cache_dir: str | None = None
    token: bytes | None = None
    #: How long a start waits for the first grant. "restart": then leave the node;
    #: "wait": carry on, calls wait for the grant (None = start waits for ever).
    grant_timeout_s: float | None = 10.0
    #: How long a call waits for the model while it is away (then DeviceUnavailable).
    call_wait_s: float = 30.0
    #: How long an unload waits for running executions (keep it under npud's unload deadline).
    drain_s: float = 3.0
    events_path: str | None = None

    def __post_init__(self) -> None:
        if self.on_unload not in ON_UNLOAD:
            raise InvalidArgument(f"on_unload must be one of {ON_UNLOAD}, not "
                                  f"{self.on_unload!r}")
        if self.token is not None and len(self.token) != 32:
            raise InvalidArgument("token must be 32 bytes")
        object.__setattr__(self, "size", ModelSize(self.size))
        object.__setattr__(self, "priority", ModelPriority(self.priority))


def _model_bytes(src: ModelSource) -> bytes:
    if callable(src):
        return bytes(src())
    if isinstance(src, bytes | bytearray):
        return bytes(src)
    with open(src, "rb") as f:
        return f.read()


class _Callback(ModelLoadRequestCallback):
    def __init__(self, post: Callable[[tuple[Any, ...]], None]) -> None:
        self.post = post

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        self.post(("status", request, LoadStatus(status), listener))

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        self.post(("unload", request, UnloadReason(reason)))

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        self.post(("ended", request, RequestStatus(status)))


class ModelHolder:
    """Holds one model under npud's arbitration (see the module docstring)."""

    def __init__(self, cfg: HolderConfig, runtime_dir: str | os.PathLike[str] | None = None,
                 *, node: str = "", on_leave: Callable[[str], None] | None = None) -> None:
        from npumanager import nn

        self.cfg = cfg
        self.runtime_dir = runtime_dir
        self.node = node
        self.on_leave = on_leave
        self.events: list[dict[str, Any]] = []
        self.state = "starting"
        self.grants = 0
        self._onnx = _model_bytes(cfg.model)
        self._cond = threading.Condition()
        self._inflight = 0
        self._model: Any = None
        self._listener: Any = None
        self._request: ModelLoadRequest | None = None
        self._ids = itertools.count(1)
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._closed = False
        self._mgr = NpuManager(runtime_dir, client_name=f"ray-actor-{os.getpid()}")
        self._device = nn.Device(cfg.device, runtime_dir)
        self._callback = _Callback(self._queue.put)
        self._event("started", runtime_dir=str(runtime_dir or ""), uid=self._mgr.uid,
                    priority=self.cfg.priority.name, on_unload=cfg.on_unload)
        if cfg.importance is not None:
            try:
                self._mgr.set_uid_importance(self._mgr.uid, int(cfg.importance))
            except PermissionDenied as exc:
                self._event("importance_not_set", why=str(exc))
        self._worker = threading.Thread(target=self._run, name="npu-holder", daemon=True)
        self._worker.start()

    def __repr__(self) -> str:
        return (f"<ModelHolder {self.cfg.device} on {self.node or 'this node'}: {self.state}, "
                f"{self.grants} grants, {self._inflight} running>")

    # --- the owner's side -----------------------------------------------------------

    def start(self) -> bool:
        """Ask for the first grant; True once the model is ready within grant_timeout_s.

        With ``on_unload="restart"`` a start that gets no grant in time leaves the node."""
        self._ask()
        ready = self.wait_ready(self.cfg.grant_timeout_s)
        if not ready and self.cfg.on_unload == "restart":
            self._queue.put(("leave", f"no grant on this node within "
                                      f"{self.cfg.grant_timeout_s} s"))
        return ready

    def wait_ready(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.state in ("ready", "left", "closed"),
                                       timeout) and self.state == "ready"

    def wait_state(self, states: set[str], timeout: float | None) -> bool:
        """Whether the holder reached one of ``states`` within ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self.state in states, timeout)

    def execute(self, inputs: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
        """Run the model; waits (call_wait_s) while it is away, then DeviceUnavailable."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.state in ("ready", "left", "closed"),
                                       self.cfg.call_wait_s) or self.state != "ready":
                raise DeviceUnavailable(f"the model is not loaded on {self.node or 'this node'}"
                                        f" ({self.state}: npud has not granted it)")
            self._inflight += 1
            model = self._model
        try:
            out: dict[str, Any] = model.execute(inputs, **kw)
            return out
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    @property
    def model(self) -> Any:
        """The prepared :class:`npumanager.nn.Model` while ready, else None."""
        return self._model

    def status(self) -> dict[str, Any]:
        with self._cond:
            return {"node": self.node, "state": self.state, "grants": self.grants,
                    "pid": os.getpid(), "events": list(self.events)}

    def close(self) -> None:
        """Release the model, report it unloaded and leave npud (no on_leave)."""
        self._queue.put(("close",))
        self._worker.join(10)

    # --- the worker thread ------------------------------------------------------------

    def _event(self, kind: str, **info: Any) -> None:
        ev = {"t": time.time(), "node": self.node, "pid": os.getpid(), "event": kind, **info}
        with self._cond:
            self.events.append(ev)
        log.info("npu actor on %s: %s %s", self.node or "this node", kind,
                 " ".join(f"{k}={v}" for k, v in info.items()))
        path = self.cfg.events_path or os.environ.get("NPU_RAY_EVENTS")
        if path:
            try:
                with open(path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(ev) + "\n")
            except OSError as exc:
                log.warning("cannot append to %s: %s", path, exc)

    def _set(self, state: str) -> None:
        with self._cond:
            self.state = state
            self._cond.notify_all()

    def _ask(self) -> None:
        req = ModelLoadRequest(next(self._ids), self.cfg.size, self.cfg.priority)
        self._request = req
        # Logged first: npud's answer may reach the worker before the call returns.
        self._event("requested", request=req.id, size=req.size.name)
        self._mgr.request_can_load_model(req, self._callback)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if self._handle(item):
                    return
            except Exception:
                log.exception("npu actor: handling %s failed", item[0])

    def _handle(self, item: tuple[Any, ...]) -> bool:
        """One transition; True when the worker is done."""
        kind = item[0]
        if kind == "close":
            self._give_back("closed")
            self._closed = True
            self._set("closed")
            self._mgr.close()
            self._device.close()
            return True
        if kind == "leave":
            return self._leave(item[1])
        if self.state in ("left", "closed"):
            return False
        request: ModelLoadRequest = item[1]
        if request is not self._request:
            return False  # about an earlier request of ours that already ended
        if kind == "status":
            status, listener = item[2], item[3]
            self._event("status", request=request.id, status=status.name)
            if status == LoadStatus.CAN_LOAD_NOW and self.state in ("starting", "waiting"):
                self._load(request, listener)
        elif kind == "unload":
            self._event("unload_requested", request=request.id, reason=item[2].name)
            why = f"unload requested ({item[2].name})"
            self._give_back(why)
            return self._after_unload(why)
        elif kind == "ended":
            status = item[2]
            self._event("request_ended", request=request.id, status=status.name)
            if self._model is not None or self.state in ("starting", "waiting"):
                why = f"request ended {status.name}"
                self._give_back(why, report=False)
                return self._after_unload(why)
        return False

    def _load(self, request: ModelLoadRequest, listener: Any) -> None:
        self.grants += 1
        self._set("loading")
        t0 = time.perf_counter()
        try:
            model = self._device.prepare_model(self._onnx, grant=listener,
                                               cache_dir=self.cfg.cache_dir, token=self.cfg.token)
        except NpuError as exc:
            self._event("prepare_failed", request=request.id, error=f"{type(exc).__name__}: {exc}")
            self._set("waiting")  # npud's unload or end of the request follows
            return
        with self._cond:
            self._model, self._listener = model, listener
        try:
            listener.notify_model_loaded(request)
        except NpuError as exc:
            self._event("report_failed", error=str(exc))
        self._event("loaded", request=request.id, prepare_ms=round(
            (time.perf_counter() - t0) * 1000, 1), from_cache=bool(model.loaded_from_cache))
        self._set("ready")

    def _give_back(self, why: str, report: bool = True) -> None:
        """Stop new executions, drain running ones (bounded), release, report unloaded."""
        self._set("unloading")
        with self._cond:
            drained = self._cond.wait_for(lambda: self._inflight == 0, self.cfg.drain_s)
            model, listener, self._model, self._listener = self._model, self._listener, None, None
        if model is not None:
            model.release()
            if report and listener is not None and self._request is not None:
                try:
                    listener.notify_model_unloaded(self._request)
                except NpuError as exc:
                    self._event("report_failed", error=str(exc))
            self._event("released", why=why, drained=drained)

    def _after_unload(self, why: str) -> bool:
        if self.cfg.on_unload == "restart":
            return self._leave(why)
        self._set("waiting")
        while not self._closed:
            try:
                if not self._mgr.connected:
                    self._mgr.close()
                    self._mgr = NpuManager(self.runtime_dir,
                                           client_name=f"ray-actor-{os.getpid()}")
                self._ask()
                return False
            except NpuError as exc:
                self._event("npud_unavailable", error=str(exc))
                time.sleep(1.0)
        return True

    def _leave(self, why: str) -> bool:
        if self.state in ("left", "closed"):
            return True
        self._give_back(why)
        self._event("leaving", why=why)
        self._set("left")
        self._mgr.close()
        self._device.close()
        if self.on_leave is not None:
            self.on_leave(why)
        return True


__all__ = ["ON_UNLOAD", "HolderConfig", "ModelHolder"]
