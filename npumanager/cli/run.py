"""`npu run MODEL.onnx`: the run-test-inference tool.

Asks npud for a grant (waits for CAN_LOAD_NOW), prepares the model on a
device with that grant, executes it with random inputs matching the model's
input shapes and dtypes, prints the outputs and the latency (p50/p99), and
reports the model unloaded.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

from npumanager.cli.main import add_runtime_dir


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="ask npud, prepare a model, execute it, print timing")
    p.add_argument("model", help="an ONNX file")
    add_runtime_dir(p)
    p.add_argument("--device", default=None, help="device name (default: npud's first)")
    p.add_argument("--job-priority", type=int, default=0, help="job priority 0..1000")
    p.add_argument("--repeat", type=int, default=10, help="executions to time")
    p.add_argument("--steps", type=int, default=1, help="steps per execution")
    p.add_argument("--size", type=int, default=0, choices=(0, 1, 2),
                   help="ModelSize class to declare (0 <1GB, 1 1-2GB, 2 >2GB)")
    p.add_argument("--wait", type=float, default=60.0,
                   help="seconds to wait for npud's CAN_LOAD_NOW")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=main)


def _fmt(values: Any) -> str:
    flat = values.reshape(-1)[:6]
    more = " ..." if values.size > 6 else ""
    return "[" + ", ".join(f"{v:.4g}" if values.dtype.kind == "f" else str(v)
                           for v in flat) + more + "]"


def main(args: argparse.Namespace) -> int:
    import numpy as np

    from npumanager import nn
    from npumanager.client import ModelLoadRequest, ModelLoadRequestCallback, NpuManager
    from npumanager.constants import LoadStatus, ModelSize
    from npumanager.errors import GrantRequired
    from npumanager.testing.onnx_models import random_inputs

    granted = threading.Event()
    unload_asked = threading.Event()
    box: dict[str, Any] = {}

    class Callback(ModelLoadRequestCallback):
        def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
            box["status"] = LoadStatus(status)
            if status == LoadStatus.CAN_LOAD_NOW:
                box["listener"] = listener
                granted.set()
            else:
                print(f"npud: {LoadStatus(status).name}; waiting")

        def on_request_unload_model(self, request: Any, reason: Any = None) -> None:
            print(f"npud asks to unload ({reason}); stopping")
            unload_asked.set()

        def on_model_load_request_complete(self, request: Any, status: Any) -> None:
            box["complete"] = status
            granted.set()

    onnx = open(args.model, "rb").read()  # noqa: SIM115 - read once, closed by GC at once
    request = ModelLoadRequest(id=(os.getpid() << 8) | int(time.time()) & 0xFF,
                               size=ModelSize(args.size))
    with NpuManager.connect(args.runtime_dir) as mgr:
        t0 = time.perf_counter()
        mgr.request_can_load_model(request, Callback())
        if not granted.wait(args.wait) or "listener" not in box:
            mgr.cancel_model_load(request)
            raise GrantRequired(f"npud did not grant the load within {args.wait} s "
                                f"(last status: {box.get('status')})")
        listener = box["listener"]
        grant_ms = (time.perf_counter() - t0) * 1e3
        name = args.device or next((d.name for d in nn.devices(args.runtime_dir)), "reference")
        with nn.device(name, args.runtime_dir) as dev:
            t0 = time.perf_counter()
            model = dev.prepare_model(onnx, grant=listener)
            prepare_ms = (time.perf_counter() - t0) * 1e3
            listener.notify_model_loaded(request)
            try:
                print(f"device {name} ({dev.capabilities.backend}); granted in {grant_ms:.1f} ms,"
                      f" prepared in {prepare_ms:.1f} ms, {model.memory_bytes} bytes")
                inputs = random_inputs([(t.name, t.dtype, t.shape) for t in model.inputs],
                                       args.seed)
                times: list[float] = []
                outputs: dict[str, Any] = {}
                for _ in range(max(1, args.repeat)):
                    if unload_asked.is_set():
                        break
                    t0 = time.perf_counter()
                    outputs = model.execute(inputs, job_priority=args.job_priority,
                                            steps=args.steps)
                    times.append(time.perf_counter() - t0)
            finally:
                model.release()
                listener.notify_model_unloaded(request)
    for oname, value in outputs.items():
        print(f"  {oname}: shape {tuple(value.shape)} {value.dtype} {_fmt(value)}")
    if times:
        ts = np.sort(np.array(times)) * 1e3
        p50 = ts[len(ts) // 2]
        p99 = ts[min(len(ts) - 1, int(len(ts) * 0.99))]
        print(f"{len(ts)} executions: p50 {p50:.3f} ms, p99 {p99:.3f} ms, "
              f"min {ts[0]:.3f} ms; unloaded")
    return 0
