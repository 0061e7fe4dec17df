"""One app of `npu chaos` (:mod:`.chaos`), in its own process under its own uid: random
requests, cancels, prepares, single and multi-step executes, unloads, and sometimes death;
each execute's outcome is appended to its stats file (read by
:func:`.chaos_checks.read_availability`)."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any


def app_main(rt: str, seed: int, stats: str, until: float) -> None:
    import numpy as np

    from npumanager import nn
    from npumanager.client import ModelLoadRequest, ModelLoadRequestCallback, NpuManager
    from npumanager.constants import LoadStatus, ModelPriority, ModelSize
    from npumanager.errors import DeviceUnavailable, NpuError, UnknownRequest
    from npumanager.testing.onnx_models import add_model

    rng = random.Random(seed)
    out = open(stats, "a", buffering=1)  # noqa: SIM115  # lives as long as the process
    onnx = add_model()
    x = np.ones((1, 4), np.float32)

    class Cb(ModelLoadRequestCallback):
        def __init__(self) -> None:
            self.granted = threading.Event()
            self.unload = threading.Event()
            self.ended = threading.Event()
            self.listener: Any = None

        def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
            if status == LoadStatus.CAN_LOAD_NOW:
                self.listener = listener
                self.granted.set()

        def on_request_unload_model(self, request: Any, reason: Any) -> None:
            self.unload.set()

        def on_model_load_request_complete(self, request: Any, status: Any) -> None:
            self.ended.set()

    def connected() -> tuple[Any, Any]:
        while True:  # npud or the driver may be restarting
            try:
                return NpuManager(rt), nn.device("reference", rt)
            except NpuError:
                if time.time() >= until:
                    os._exit(0)
                time.sleep(0.2)

    mgr, dev = connected()
    rid = 0
    abandoned: list[Any] = []  # cancels that failed (npud away): retried every cycle
    while time.time() < until:
        for req in list(abandoned):
            try:
                mgr.cancel_model_load(req)
                abandoned.remove(req)
            except UnknownRequest:
                abandoned.remove(req)  # it ended meanwhile
            except NpuError:
                break
        if mgr.phase == "lost":
            mgr.close()  # npud stayed away past the reconnect window: start over
            mgr, dev = connected()
        rid += 1
        req = ModelLoadRequest(rid, ModelSize(rng.choice((0, 0, 1, 2))),
                               ModelPriority(rng.choice((0, 0, 1000, 2000))))
        cb = Cb()
        try:
            mgr.request_can_load_model(req, cb)
        except NpuError:
            time.sleep(0.2)
            continue
        if not cb.granted.wait(rng.uniform(0.5, 3.0)):
            try:
                mgr.cancel_model_load(req)
            except UnknownRequest:
                pass
            except NpuError:
                abandoned.append(req)
            continue
        model = None
        out.write(f"{time.time():.4f} g\n")  # granted: from here the app wants to execute
        ends = time.time() + rng.uniform(0.5, 4.0)
        while time.time() < ends and not cb.unload.is_set() and not cb.ended.is_set():
            if model is None:
                try:
                    model = dev.prepare_model(onnx, grant=cb.listener)
                    cb.listener.notify_model_loaded(req)
                except NpuError as exc:
                    # Not an execute: the driver is restarting, or orphaned (it loads
                    # nothing new until npud is back). Try again shortly.
                    out.write(f"{time.time():.4f} p {type(exc).__name__}\n")
                    time.sleep(0.2)
                    continue
            try:
                steps = rng.choice((1, 1, 1, 5))
                model.execute({"x": x}, steps=steps, feedback={"y": "x"} if steps > 1 else None)
                out.write(f"{time.time():.4f} 1\n")
            except DeviceUnavailable:
                out.write(f"{time.time():.4f} 0 DeviceUnavailable\n")
                model = None  # the driver restarted: prepare again under the same grant
                time.sleep(0.05)
            except NpuError as exc:
                out.write(f"{time.time():.4f} 0 {type(exc).__name__}\n")
                time.sleep(0.05)
                if cb.ended.is_set():
                    break
            if rng.random() < 0.002:
                os._exit(3)  # an app dies holding its model
            time.sleep(0.02)
        if model is not None:
            try:
                model.release()
            except NpuError:
                pass
        try:
            if not cb.ended.is_set():
                cb.listener.notify_model_unloaded(req)
        except NpuError:
            pass
