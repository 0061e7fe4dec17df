"""The contention comparison's apps: one work loop, run unmanaged or through npud.

Each app runs in its own process (:class:`~npumanager.demo.process.AppProcess`)
with one of two engines:

- :class:`OrtEngine`, *unmanaged*: what an app does today. It creates its own
  ONNX Runtime session with the default settings (ORT's own intra-op thread
  pool, sized to the machine) whenever it likes, and runs a decode loop as a
  Python loop of ``session.run`` calls.
- :class:`NpuEngine`, *managed*: the same app as an npumanager client. It asks
  npud before loading (``request_can_load_model``), prepares on the device
  under the grant it got, runs multi-step jobs in the driver (``steps=N``,
  outputs fed back) with its job priority, and releases and reports unloaded.
  Sequences of single executions (frames, bursts, the embedder's batches when
  the run says so) go through one burst.

The work loop (:func:`work_loop`) is the same for both, so the only difference
between the two runs is who schedules the work. Kinds of work:

- ``frames``: one execution per frame on a fixed frame clock (a camera);
- ``bursts``: ``runs`` executions ``gap_s`` apart, every ``period_s`` (a voice
  assistant answering short queries);
- ``decode``: multi-step jobs back to back (a background LLM);
- ``batches``: single executions back to back (an embedding service's batches);
- ``loads``: prepare the model, release it, again (an app starting a background
  model; no compilation cache on either side, so every load compiles).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from npumanager.constants import Importance, LoadStatus, ModelPriority, ModelSize
from npumanager.demo.models import DemoModel
from npumanager.demo.process import LineQueue, Outbox


@dataclass(frozen=True)
class BenchApp:
    """One app of the comparison."""

    name: str
    model: str  # key into demo_models()
    kind: str  # frames | bursts | decode | batches | loads
    importance: Importance
    priority: ModelPriority = ModelPriority.NORMAL
    size: ModelSize = ModelSize.LESS_THAN_1GB
    job_priority: int = 0
    period_s: float = 0.0
    gap_s: float = 0.0
    runs: int = 1
    steps: int = 1
    #: batches: executions kept in flight at once, so the next batch is queued in the
    #: driver while one runs: managed, through the SDK's pipeline (model.pipeline());
    #: unmanaged, threads of the app sharing its session.
    inflight: int = 1
    #: Managed, a streaming app opens its burst with this client spin
    #: (``model.burst(spin_us=...)``; 0: it blocks for the answer at once; None: the
    #: SDK's adaptive spin, nn/burst_spin.py). The camera
    #: does not spin: 1.5 and 3 ms spins (bench rows camera-spin*) gave it no lower p99
    #: and a higher p50 (1.0-1.2 vs 0.7-1.0 ms alone, three quick runs): the driver's
    #: burst thread is woken onto the spinning client's CPU (bench/README.md: Bursts).
    spin_us: float | None = 0.0
    #: The EEVDF slice of the app's executing thread, µs (0: the kernel's): managed,
    #: through ``model.burst(slice_us=...)``; unmanaged, the app sets its own thread's
    #: (hal/sched_slice.py) so that both sides are offered the same (bench rows
    #: slice-*+app and unmanaged-slice).
    slice_us: int = 0
    #: The SCHED_FIFO priority of the app's executing thread (0: none): managed, npud's
    #: ``[manager] app_rt_priority`` granted through ``model.burst(realtime=True)``;
    #: unmanaged, set by the bench as root on the app's frame thread, as an admin would
    #: by hand (bench rows app-rt, rt+app and their baseline unmanaged-rt).
    realtime: int = 0
    #: Managed, the device the app asks npud for and prepares on (``[[driver]]`` name):
    #: bench rows loader-own-host and bg-own-host put apps on a second driver host.
    device: str = "reference"


class Engine(Protocol):
    def load(self, model: DemoModel) -> Any: ...

    def run(self, handle: Any, inputs: dict[str, np.ndarray], steps: int,
            feedback: dict[str, str]) -> dict[str, Any]: ...

    def release(self, handle: Any) -> None: ...

    def another(self, handle: Any) -> Any: ...

    def release_another(self, handle: Any) -> None: ...

    def close(self) -> None: ...


class OrtEngine:
    """Unmanaged: ONNX Runtime in the app's own process, default session options.
    ``device_queue``: the one-queue device emulation's token file (run ``unmanaged-1q``;
    drivers/device_queue.py), held around each ``session.run`` as a vendor driver's one
    queue would serialize the apps' jobs. ``session_config``: ONNX Runtime session options
    to set: dotted keys as config entries, others as SessionOptions attributes (runs
    ``unmanaged-1q-1t``: one intra-op thread; ``unmanaged-1q-nospin``: no spinning)."""

    def __init__(self, device_queue: str = "",
                 session_config: dict[str, str] | None = None) -> None:
        from npumanager.drivers.device_queue import DeviceQueue

        self.queue = DeviceQueue(device_queue) if device_queue else None
        self.session_config = session_config or {}

    def load(self, model: DemoModel) -> Any:
        import onnxruntime as ort

        so = None
        if self.session_config:
            so = ort.SessionOptions()
            for key, value in self.session_config.items():
                if "." in key:  # a config entry (session.intra_op.allow_spinning)
                    so.add_session_config_entry(key, value)
                else:  # an attribute (intra_op_num_threads)
                    setattr(so, key, type(getattr(so, key))(value))
        session = ort.InferenceSession(model.onnx, sess_options=so,
                                       providers=["CPUExecutionProvider"])
        return session, [o.name for o in session.get_outputs()]

    def run(self, handle: Any, inputs: dict[str, np.ndarray], steps: int,
            feedback: dict[str, str]) -> dict[str, Any]:
        session, names = handle
        outs: dict[str, Any] = {}
        queue = self.queue
        for _ in range(steps):
            if queue is None:
                outs = dict(zip(names, session.run(names, inputs), strict=True))
            else:
                with queue:
                    outs = dict(zip(names, session.run(names, inputs), strict=True))
            if feedback:
                inputs = {**inputs, **{i: outs[o] for o, i in feedback.items()}}
        return outs

    def release(self, handle: Any) -> None:
        pass  # the session goes with its last reference

    def another(self, handle: Any) -> Any:
        return handle  # InferenceSession.run may be called from several threads

    def release_another(self, handle: Any) -> None:
        pass

    def close(self) -> None:
        if self.queue is not None:
            self.queue.close()


class NpuEngine:
    """Managed: ask npud, prepare under the grant, execute in the driver."""

    def __init__(self, app: BenchApp, runtime_dir: str, first_id: int,
                 stream: bool = False) -> None:
        from npumanager import nn
        from npumanager.client import NpuManager

        self.app = app
        #: Sequences of single executions go through a burst (model.burst(), set up once
        #: after prepare), as `npu demo`'s camera and voice do (the caller decides which).
        self.stream = stream
        self.mgr = NpuManager(runtime_dir, client_name=app.name)
        self.dev = nn.Device(app.device, runtime_dir)
        self.next_id = first_id
        #: When the last load's grant came (time.monotonic(); the loader's "loaded" event
        #: reports the wait for it as grant_ms: a load's first stage).
        self.granted_at = 0.0

    def load(self, model: DemoModel) -> Any:
        from npumanager.client import ModelLoadRequest, ModelLoadRequestCallback

        granted = threading.Event()
        got: list[Any] = []

        class Cb(ModelLoadRequestCallback):
            def on_can_load_model(self, request: Any, status: LoadStatus,
                                  listener: Any) -> None:
                if status == LoadStatus.CAN_LOAD_NOW:
                    got.append(listener)
                    granted.set()

        req = ModelLoadRequest(self.next_id, self.app.size, self.app.priority,
                               device=self.app.device)
        self.next_id += 1
        self.mgr.request_can_load_model(req, Cb())
        if not granted.wait(30):
            raise TimeoutError(f"{self.app.name}: no grant from npud within 30 s")
        self.granted_at = time.monotonic()
        listener = got[0]
        prepared = self.dev.prepare_model(model.onnx, grant=listener)
        listener.notify_model_loaded(req)
        burst = self._burst(prepared)
        return req, listener, prepared, burst

    def _burst(self, prepared: Any) -> Any:
        if not self.stream:
            return None
        return prepared.burst(spin_us=self.app.spin_us, slice_us=self.app.slice_us,
                              realtime=bool(self.app.realtime))

    def run(self, handle: Any, inputs: dict[str, np.ndarray], steps: int,
            feedback: dict[str, str]) -> dict[str, Any]:
        prepared, burst = handle[2], handle[3]
        if burst is not None and steps == 1:
            return burst.execute(inputs, job_priority=self.app.job_priority)  # type: ignore[no-any-return]
        if steps > 1:
            outs: dict[str, Any] = prepared.execute(inputs, job_priority=self.app.job_priority,
                                                    steps=steps, feedback=feedback)
        else:
            outs = prepared.execute(inputs, job_priority=self.app.job_priority)
        return outs

    def release(self, handle: Any) -> None:
        req, listener, prepared, burst = handle
        if burst is not None:
            burst.close()
        prepared.release()
        listener.notify_model_unloaded(req)

    def another(self, handle: Any) -> Any:
        """The same model with a stream of its own (a burst, when the app streams)."""
        req, listener, prepared, _ = handle
        return req, listener, prepared, self._burst(prepared)

    def release_another(self, handle: Any) -> None:
        if handle[3] is not None:
            handle[3].close()

    def close(self) -> None:
        self.dev.close()
        self.mgr.close()


def work_loop(app: BenchApp, model: DemoModel, engine: Engine, out: Outbox,
              stop: threading.Event) -> None:
    """Load (timed), then work until ``stop``; every unit of work is one event."""
    if app.kind == "loads":
        while not stop.is_set():
            t0, asked = time.perf_counter(), time.monotonic()
            out.emit("loading")
            handle = engine.load(model)
            granted = getattr(engine, "granted_at", 0.0)
            out.emit("loaded", ms=round((time.perf_counter() - t0) * 1000, 2),
                     grant_ms=round((granted - asked) * 1000, 2) if granted else None)
            engine.release(handle)
            stop.wait(0.05)
        return
    t0 = time.perf_counter()
    handle = engine.load(model)
    out.emit("ready", ms=round((time.perf_counter() - t0) * 1000, 1))
    inputs, feedback = model.inputs, model.feedback
    try:
        if app.kind == "frames":
            if app.slice_us and isinstance(engine, OrtEngine):
                from npumanager.hal.sched_slice import set_this_thread

                set_this_thread(app.slice_us, "slice_us")
            next_at = time.monotonic()
            while not stop.is_set():
                t = time.perf_counter()
                engine.run(handle, inputs, 1, {})
                out.emit("frame", ms=round((time.perf_counter() - t) * 1000, 3))
                # The next frame on the frame clock; a late frame is not made up for.
                next_at = max(next_at + app.period_s, time.monotonic())
                stop.wait(max(0.0, next_at - time.monotonic()))
        elif app.kind == "bursts":
            while not stop.is_set():
                for _ in range(app.runs):
                    t = time.perf_counter()
                    engine.run(handle, inputs, 1, {})
                    out.emit("infer", ms=round((time.perf_counter() - t) * 1000, 3))
                    if stop.wait(app.gap_s):
                        break
                stop.wait(app.period_s)
        elif app.kind == "decode":
            while not stop.is_set():
                t = time.perf_counter()
                outs = engine.run(handle, inputs, app.steps, feedback)
                steps = int(outs["pos_out"].reshape(-1)[0]) if "pos_out" in outs else app.steps
                out.emit("decode", steps=steps, ms=round((time.perf_counter() - t) * 1000, 2))
        elif (app.kind == "batches" and app.inflight > 1 and isinstance(engine, NpuEngine)
              and engine.stream):
            _pipelined(app, handle[2], inputs, out, stop)
        elif app.kind == "batches":
            n = next(iter(inputs.values())).shape[0]

            def batches(h: Any, stream: int) -> None:
                while not stop.is_set():
                    t = time.perf_counter()
                    engine.run(h, inputs, 1, {})
                    out.emit("batch", items=n, ms=round((time.perf_counter() - t) * 1000, 3),
                             stream=stream)

            more = [engine.another(handle) for _ in range(app.inflight - 1)]
            threads = [threading.Thread(target=batches, args=(h, i), daemon=True)
                       for i, h in enumerate(more, start=1)]
            for th in threads:
                th.start()
            try:
                batches(handle, 0)
            finally:
                for th, h in zip(threads, more, strict=True):
                    th.join()
                    engine.release_another(h)
        else:
            raise ValueError(f"unknown kind of work {app.kind!r}")
    finally:
        engine.release(handle)


def _pipelined(app: BenchApp, prepared: Any, inputs: dict[str, np.ndarray], out: Outbox,
               stop: threading.Event) -> None:
    """Batches back to back, ``app.inflight`` in flight (the SDK's pipeline); each
    batch's ``ms`` is the time since the previous result (what throughput sees)."""
    n = next(iter(inputs.values())).shape[0]

    def feed() -> Any:
        while not stop.is_set():
            yield inputs

    with prepared.pipeline(depth=app.inflight, job_priority=app.job_priority) as p:
        t = time.perf_counter()
        for _ in p.map(feed()):
            now = time.perf_counter()
            out.emit("batch", items=n, ms=round((now - t) * 1000, 3), inflight=app.inflight)
            t = now


def bench_app_main(app: BenchApp, model: DemoModel, managed: bool, runtime_dir: str,
                   first_id: int, out: Outbox, commands: LineQueue,
                   bursts: bool = True,
                   burst_kinds: tuple[str, ...] = ("frames", "bursts"),
                   device_queue: str = "",
                   session_config: dict[str, str] | None = None) -> None:
    """Entry point in the forked child (already running as the app's uid). ``bursts``:
    a managed app whose kind of work is in ``burst_kinds`` (by default those at their own
    pace: frames, bursts) executes through a burst. ``device_queue``: an unmanaged app's
    runs hold this one-queue device token (managed, the driver holds it);
    ``session_config``: an unmanaged app's ONNX Runtime session config entries."""
    stop = threading.Event()
    commands.start(lambda item: stop.set() if item.get("cmd") == "stop" else None)
    try:
        stream = bursts and app.kind in burst_kinds
        engine: Engine = (NpuEngine(app, runtime_dir, first_id, stream) if managed
                          else OrtEngine(device_queue, session_config))
    except Exception as exc:
        out.emit("error", what="connect", error=f"{type(exc).__name__}: {exc}")
        return
    try:
        work_loop(app, model, engine, out, stop)
    except Exception as exc:
        out.emit("error", what="run", error=f"{type(exc).__name__}: {exc}")
    finally:
        try:
            engine.close()
        finally:
            out.emit("exit", pid=os.getpid())
