"""The demo's apps: what each one does inside its own process.

Every app is an ordinary npumanager client: it asks npud before loading
(``request_can_load_model``), prepares its model on the device with the grant
it got, caching the compilation in its own directory, runs its work, and
answers unload requests by releasing the model and reporting it unloaded
(unless it is the stubborn one, which ignores them and finds out at its next
execute that the grant was revoked). It reports what happened and what it
measured to the demo as events (see :class:`~npumanager.demo.process.Outbox`).

Kinds of work:
- ``frames``: one execution per frame at a fixed frame rate (a camera);
- ``decode``: multi-step jobs (``steps=N``, outputs fed back as inputs), back to
  back, like an LLM decode loop;
- ``periodic``: one execution every ``period_s`` (an embedding service);
- ``burst``: ``runs`` executions, then release and exit (a voice query).

Streams (``stream=True``: the camera and the voice query) execute through a
burst (``model.burst()``): a shared-memory channel set up once after prepare,
one wake-up each way per frame; the driver schedules them as any execution.
"""

from __future__ import annotations

import hashlib
import os
import queue
import time
from dataclasses import dataclass
from typing import Any

from npumanager.constants import (
    Importance,
    LoadStatus,
    ModelPriority,
    ModelSize,
    RequestStatus,
    UnloadReason,
)
from npumanager.demo.models import DemoModel
from npumanager.demo.process import LineQueue, Outbox
from npumanager.errors import GrantRevoked, NpuError


@dataclass(frozen=True)
class AppSpec:
    """One app of the demo: who it is, what it asks for, how it behaves."""

    name: str
    uid: int | None  # None: the demo's own uid (not root)
    importance: Importance
    size: ModelSize
    priority: ModelPriority
    kind: str  # frames | decode | periodic | burst
    period_s: float = 0.0  # frames: 1/fps; periodic: interval
    steps: int = 1  # decode: steps per job
    runs: int = 1  # burst: executions before leaving
    comply: bool = True  # release when npud asks
    retry_size: ModelSize | None = None  # size class asked for after complying
    retry_after_s: float = 0.0  # back-off before asking again after an unload
    exit_on_revoke: bool = False  # a revoked service exits (its supervisor restarts it)
    job_priority: int = 0  # added to the app priority in the driver (lower runs first)
    first_id: int = 1  # npud keys requests by (uid, id): apps sharing a uid need their own ids
    device: str = "reference"
    stream: bool = False  # execute through a burst (model.burst()): a stream at its own pace


class App:
    """The app's main loop. Callbacks and commands arrive on one queue, so the loop is
    the only thread touching the model and the manager's listener."""

    def __init__(self, spec: AppSpec, model: DemoModel, runtime_dir: str, cache_dir: str,
                 out: Outbox) -> None:
        from npumanager import nn
        from npumanager.client import NpuManager

        self.spec = spec
        self.model_def = model
        self.out = out
        self.cache_dir = cache_dir
        self.token = hashlib.sha256(f"npumanager-demo/{model.name}".encode()).digest()
        self.inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.mgr = NpuManager(runtime_dir, client_name=spec.name)
        self.device = nn.Device(spec.device, runtime_dir)
        self.next_id = spec.first_id
        self.request: Any = None
        self.listener: Any = None
        self.model: Any = None
        self.burst: Any = None
        self.asked_at = 0.0
        self.unload_asked_at: float | None = None
        self.retry_at: float | None = None
        self.next_work = 0.0
        self.stopping = False
        self.exit_at: float | None = None
        self.ended: set[int] = set()
        self.runs_done = 0

    # --- callbacks (dispatch thread) -> the loop's queue -------------------------

    def _callback(self) -> Any:
        from npumanager.client import ModelLoadRequestCallback

        app = self

        class Cb(ModelLoadRequestCallback):
            def on_can_load_model(self, request: Any, status: LoadStatus, listener: Any) -> None:
                app.inbox.put(("can", (request, status, listener)))

            def on_request_unload_model(self, request: Any, reason: UnloadReason) -> None:
                app.inbox.put(("unload", (request, reason)))

            def on_model_load_request_complete(self, request: Any,
                                               status: RequestStatus) -> None:
                app.inbox.put(("complete", (request, status)))

        return Cb()

    # --- the loop ------------------------------------------------------------------

    def ask(self, size: ModelSize) -> None:
        from npumanager.client import ModelLoadRequest

        self.request = ModelLoadRequest(self.next_id, size, self.spec.priority)
        self.next_id += 1
        self.listener = None
        self.asked_at = time.monotonic()
        self.out.emit("request", id=self.request.id, size=size.name,
                      priority=self.spec.priority.name)
        self.mgr.request_can_load_model(self.request, self._callback())

    def run(self, commands: LineQueue) -> None:
        commands.start(lambda item: self.inbox.put(("cmd", item)))
        self.ask(self.spec.size)
        try:
            while not self.stopping:
                self.step()
        finally:
            self.leave()

    def step(self) -> None:
        now = time.monotonic()
        if self.exit_at is not None and (now >= self.exit_at or (
                self.request is not None and self.request.id in self.ended)):
            self.stopping = True
            return
        if self.retry_at is not None and now >= self.retry_at:
            self.retry_at = None
            self.ask(self.spec.retry_size or self.spec.size)
        wait = 0.05
        if self.model is not None:
            wait = max(0.0, self.next_work - now)
        elif self.retry_at is not None:
            wait = max(0.0, min(wait, self.retry_at - now))
        try:
            kind, payload = self.inbox.get(timeout=wait) if wait > 0 else self.inbox.get_nowait()
        except queue.Empty:
            if self.model is not None and time.monotonic() >= self.next_work:
                self.work()
            return
        getattr(self, f"on_{kind}")(payload)

    def on_cmd(self, item: dict[str, Any]) -> None:
        if item.get("cmd") == "stop":
            self.stopping = True

    def on_can(self, payload: tuple[Any, LoadStatus, Any]) -> None:
        request, status, listener = payload
        if request != self.request:
            return
        ms = (time.monotonic() - self.asked_at) * 1000
        self.out.emit("can_load", id=request.id, status=status.name, ms=round(ms, 2))
        if status != LoadStatus.CAN_LOAD_NOW:
            return
        self.listener = listener
        t0 = time.perf_counter()
        try:
            self.model = self.device.prepare_model(self.model_def.onnx, grant=listener,
                                                   cache_dir=self.cache_dir, token=self.token)
        except Exception as exc:
            self.out.emit("error", what="prepare", error=f"{type(exc).__name__}: {exc}")
            if isinstance(exc, GrantRevoked):  # a slow prepare outlived its grant
                self.after_revoke()
            return
        ms = (time.perf_counter() - t0) * 1000
        if self.spec.stream:
            try:
                self.burst = self.model.burst()
            except Exception as exc:  # executions go the plain way then
                self.out.emit("error", what="burst", error=f"{type(exc).__name__}: {exc}")
        self.out.emit("prepared", id=request.id, ms=round(ms, 1), model=self.model_def.name,
                      from_cache=bool(self.model.loaded_from_cache),
                      cache_written=bool(self.model.cache_written),
                      memory_bytes=int(self.model.memory_bytes),
                      burst=self.burst is not None)
        listener.notify_model_loaded(request)
        self.next_work = time.monotonic()

    def on_unload(self, payload: tuple[Any, UnloadReason]) -> None:
        request, reason = payload
        if request != self.request:
            return
        self.unload_asked_at = time.monotonic()
        self.out.emit("unload_asked", id=request.id, reason=reason.name,
                      comply=self.spec.comply)
        if not self.spec.comply:
            return  # the stubborn app keeps its model and carries on
        had = self.model is not None
        self.release()
        if self.listener is not None:
            try:
                self.listener.notify_model_unloaded(request)
            except NpuError:  # revoked meanwhile (a slow prepare): the request has ended
                had = False
        if had:
            ms = (time.monotonic() - self.unload_asked_at) * 1000
            self.out.emit("unloaded", id=request.id, ms=round(ms, 2))
        self.retry_at = time.monotonic() + self.spec.retry_after_s

    def on_complete(self, payload: tuple[Any, RequestStatus]) -> None:
        request, status = payload
        self.ended.add(request.id)
        self.out.emit("complete", id=request.id, status=status.name)

    def release(self) -> None:
        if self.burst is not None:
            self.burst.close()
            self.burst = None
        if self.model is not None:
            self.model.release()
            self.model = None

    def after_revoke(self) -> None:
        if self.spec.exit_on_revoke:
            # Exit once npud's REVOKED callback is in (the driver may tell us first).
            self.exit_at = time.monotonic() + 1.0
        else:
            self.retry_at = time.monotonic() + self.spec.retry_after_s

    def work(self) -> None:
        spec, m = self.spec, self.model_def
        t0 = time.perf_counter()
        try:
            if spec.kind == "decode":
                outs = self.model.execute(m.inputs, job_priority=spec.job_priority,
                                          steps=spec.steps, feedback=m.feedback)
            else:
                runner = self.burst if self.burst is not None else self.model
                outs = runner.execute(m.inputs, job_priority=spec.job_priority)
        except GrantRevoked as exc:
            self.out.emit("execute_revoked", error=str(exc))
            self.release()
            self.after_revoke()
            return
        except NpuError as exc:
            self.out.emit("error", what="execute", error=f"{type(exc).__name__}: {exc}")
            self.release()
            self.stopping = True
            return
        ms = (time.perf_counter() - t0) * 1000
        now = time.monotonic()
        if spec.kind == "decode":
            steps = int(outs["pos_out"].reshape(-1)[0]) if "pos_out" in outs else spec.steps
            self.out.emit("decode", steps=steps, ms=round(ms, 2))
            self.next_work = now
        elif spec.kind == "frames":
            self.out.emit("frame", ms=round(ms, 3))
            # Next frame on the frame clock; a late frame is not made up for.
            self.next_work = max(self.next_work + spec.period_s, now)
        else:
            self.out.emit("infer", ms=round(ms, 2))
            self.next_work = now + spec.period_s
            self.runs_done += 1
            if spec.kind == "burst" and self.runs_done >= spec.runs:
                self.stopping = True

    def leave(self) -> None:
        """Release, report, close: what a well-behaved app does on exit."""
        try:
            had = self.model is not None
            self.release()
            if self.request is not None and self.listener is not None and had:
                self.listener.notify_model_unloaded(self.request)
        except Exception:
            pass
        finally:
            self.out.emit("exit")
            self.device.close()
            self.mgr.close()


def app_main(spec: AppSpec, model: DemoModel, runtime_dir: str, cache_dir: str,
             out: Outbox, commands: LineQueue) -> None:
    """Entry point in the forked child (already running as the app's uid)."""
    os.umask(0o077)  # cache files are the app's own (NNAPI: mode 0600)
    try:
        app = App(spec, model, runtime_dir, cache_dir, out)
    except Exception as exc:
        out.emit("error", what="connect", error=f"{type(exc).__name__}: {exc}")
        return
    try:
        app.run(commands)
    except Exception as exc:
        out.emit("error", what="run", error=f"{type(exc).__name__}: {exc}")
        raise
