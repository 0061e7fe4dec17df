"""A foreground stream (a camera's frames, a voice assistant's short bursts) that asks npud
before loading its model and asks for a real-time thread for its executions.

    npu serve --runtime-dir /tmp/npu &                  # npud + the reference driver
    python examples/foreground_app.py --runtime-dir /tmp/npu [--fps 30] [--seconds 3]

It asks to load its model, prepares it when npud says CAN_LOAD_NOW, then runs one
execution per frame at --fps through ``model.burst(realtime=True)`` until --seconds pass or
npud asks for the accelerator back, releases the model, and prints every callback, what npud
answered to the real-time ask and the executions' latency. Against an npud with no device
(`npu serve --no-drivers`) it holds the grant for --seconds without running anything.

Why a stream asks. Under foreground protection (npud's default where it can put threads at
SCHED_FIFO, e.g. as root; `npu status` says `protect: on`) the driver serves a FOREGROUND or
VISIBLE app's executions on a host thread at SCHED_FIFO. An app thread left at normal
priority then waits behind that thread on its own CPU: the contention bench's voice
assistant (VISIBLE) took 0.8 / 2.5 ms p50 / p99 without asking, 0.5 / 0.8 ms asking
(bench/README.md). So a camera and a voice assistant both ask.

What npud grants: the thread that executes the burst, at SCHED_FIFO `[manager]
app_rt_priority` (2 under protection), to a FOREGROUND uid, or a VISIBLE one where
`app_rt_importance = 200` (protection sets it), at most `app_rt_max_threads` (2) threads per
uid, bounded by RLIMIT_RTTIME and a CPU watchdog (a thread over `app_rt_max_cpu_ms` in a
second is put back to normal and its uid waits `app_rt_cooldown_s`); the grant ends with the
burst, or when the uid becomes less important. It refuses with a typed error, and the stream
goes on at normal priority: a less important uid (PermissionDenied), an npud without
real-time threads (RealtimeUnavailable: protection off and `app_rt_priority` unset, or npud
lacking CAP_SYS_NICE), a uid over its thread count or in its cooldown (LimitExceeded). npud
knows a uid's importance from `npu importance set UID visible` (admin), an `[[app]]` entry
or `[importance]` rules; a uid with none is a background app to npud (root is FOREGROUND).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

import numpy as np

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelSize,
    NpuManager,
    RequestStatus,
    UnloadReason,
    nn,
)

#: One frame of 16 kHz audio, 25 ms (a voice assistant's; a camera's would be an image).
FRAME = 400


def frame_model() -> bytes:
    """y = relu(conv1d(x)), x float32 [1, 1, FRAME]: 8 filters of 16 taps, stride 8."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((8, 1, 16)).astype(np.float32) / 4
    out = (FRAME - 16) // 8 + 1
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], strides=[8]),
         helper.make_node("Relu", ["c"], ["y"])],
        "frames", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, FRAME])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, out])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


class StreamApp(ModelLoadRequestCallback):
    """Remembers the grant; flags npud's unload request so the stream stops and releases."""

    def __init__(self) -> None:
        self.listener: Any = None
        self.granted = threading.Event()
        self.unload = threading.Event()
        self.done = threading.Event()

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        print(f"npud: {status.name}")
        if status == LoadStatus.CAN_LOAD_NOW:
            self.listener = listener
            self.granted.set()

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        print(f"npud asks us to unload ({reason.name}); stopping the stream")
        self.unload.set()

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        print(f"request ended: {status.name}")
        self.done.set()


def realtime_said(burst: Any) -> str:
    """What npud answered to the burst's real-time ask (made at its first execution)."""
    if burst.realtime_granted:
        prio = os.sched_getparam(0).sched_priority  # (0: this thread, the one it granted)
        return f"real-time thread: granted by npud (SCHED_FIFO {prio})"
    err = burst.realtime_error
    why = f"{type(err).__name__}: {err}" if err is not None else "not answered"
    return f"real-time thread: refused, the stream goes on at normal priority ({why})"


def stream(model: Any, fps: float, seconds: float, stop: threading.Event) -> list[float]:
    """One execution per frame at ``fps`` for ``seconds`` (or until ``stop``); their ms."""
    x = np.zeros((1, 1, FRAME), np.float32)
    times: list[float] = []
    period = 1.0 / fps
    with model.burst(realtime=True) as b:  # the asking thread is the one that executes
        due = time.monotonic()
        end = due + seconds
        while time.monotonic() < end and not stop.is_set():
            t0 = time.perf_counter()
            b.execute({"x": x})
            times.append((time.perf_counter() - t0) * 1000)
            if len(times) == 1:
                print(realtime_said(b))
            due += period
            time.sleep(max(0.0, due - time.monotonic()))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime-dir", default=None)
    ap.add_argument("--device", default=None, help="device name (default: npud's first)")
    ap.add_argument("--fps", type=float, default=30.0, help="executions per second")
    ap.add_argument("--seconds", type=float, default=3.0, help="how long to stream")
    args = ap.parse_args()
    if not args.fps > 0:
        ap.error(f"--fps: {args.fps:g} is not above 0")
    devices = nn.devices(args.runtime_dir)  # first: without npud, create nothing
    device = next((d for d in devices if d.name == args.device), None) if args.device \
        else (devices[0] if devices else None)
    if args.device and device is None:
        raise SystemExit(f"no device {args.device!r}; npud serves: "
                         + (", ".join(d.name for d in devices) or "none"))
    request = ModelLoadRequest(100, ModelSize.LESS_THAN_1GB,
                               device=device.name if device else None)
    app = StreamApp()
    with NpuManager(args.runtime_dir) as mgr:
        mgr.request_can_load_model(request, app)  # callbacks on the SDK's thread
        if not app.granted.wait(30):
            raise SystemExit("npud did not let us load within 30 s")
        try:
            if device is None:
                print("npud serves no device (--no-drivers?): holding the grant "
                      f"{args.seconds:g} s without running")
                app.listener.notify_model_loaded(request)
                app.unload.wait(args.seconds)
            else:
                model = device.prepare_model(frame_model(), grant=app.listener)
                app.listener.notify_model_loaded(request)
                try:
                    times = sorted(stream(model, args.fps, args.seconds, app.unload))
                finally:
                    model.release()
                if times:
                    print(f"{len(times)} executions at {args.fps:g}/s on {device.name}: "
                          f"p50 {times[len(times) // 2]:.2f} ms, "
                          f"p99 {times[min(len(times) - 1, int(len(times) * 0.99))]:.2f} ms")
        finally:
            app.listener.notify_model_unloaded(request)
            # npud answers COMPLETE once the driver has let the model go: wait for it.
            app.done.wait(5)
    if device is not None:
        device.close()


if __name__ == "__main__":
    from npumanager.errors import NpuError

    try:
        main()
    except NpuError as exc:  # npud absent or refusing: a sentence, not a traceback
        raise SystemExit(f"{__file__.rsplit('/', 1)[-1]}: {type(exc).__name__}: {exc}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
