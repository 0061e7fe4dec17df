"""Run one ONNX model on the NPU the npumanager way: ask, prepare (cached), execute, release.

    npu serve --runtime-dir /tmp/npu &                  # npud + the reference driver
    python examples/run_model.py --runtime-dir /tmp/npu
    python examples/run_model.py --runtime-dir /tmp/npu     # again: loads from the cache

Without ``--model`` it builds a small MatMul model with onnx.helper. The
compilation cache lives in ``--cache-dir`` (default: a directory under
/tmp); the token names this model, so the second run prepares from cache
(``model.loaded_from_cache``) instead of compiling.
"""

from __future__ import annotations

import argparse
import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    NpuManager,
    RequestStatus,
    UnloadReason,
    nn,
)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def small_model(dim: int = 256) -> bytes:
    """y = tanh(x @ W), x and y float32 [1, dim]."""
    from onnx import TensorProto, helper, numpy_helper

    w = (np.random.default_rng(0).standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
        "example", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


class Callback(ModelLoadRequestCallback):
    """Remembers the grant; flags an unload request so the main thread can release."""

    def __init__(self) -> None:
        self.granted = threading.Event()
        self.unload = threading.Event()
        self.ended = threading.Event()
        self.listener: Any = None
        self.status: LoadStatus | None = None

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        print(f"npud: {status.name}")
        self.status = status
        if status == LoadStatus.CAN_LOAD_NOW:
            self.listener = listener
            self.granted.set()

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        print(f"npud asks us to unload ({reason.name})")
        self.unload.set()

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        print(f"request ended: {status.name}")
        self.ended.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime-dir", default=None)
    ap.add_argument("--model", default=None, help="an .onnx file (default: a built-in model)")
    ap.add_argument("--device", default=None, help="device name (default: the first one)")
    ap.add_argument("--cache-dir", default="/tmp/npu-example-cache")
    ap.add_argument("--repeat", type=positive_int, default=10)
    args = ap.parse_args()

    onnx = Path(args.model).read_bytes() if args.model else small_model()
    # A 32-byte token that identifies this model (NNAPI: the app's cache token).
    token = hashlib.sha256(onnx).digest()
    devices = nn.devices(args.runtime_dir)  # first: without npud, create nothing
    device = next((d for d in devices if d.name == args.device), None) if args.device \
        else (devices[0] if devices else None)
    if device is None:
        names = ", ".join(d.name for d in devices)
        raise SystemExit(f"no device {args.device!r}; npud serves: {names}" if names else
                         "npud serves no device (started with --no-drivers?)")
    # Kept on purpose (not a temp dir): the second run prepares from this cache.
    cache_dir = Path(args.cache_dir)
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    print(f"device {device.name} {device.version}")

    # Size LESS_THAN_1GB, priority NORMAL; the grant is valid on this device only.
    request = ModelLoadRequest(1, device=device.name)
    cb = Callback()
    with NpuManager(args.runtime_dir) as mgr:
        mgr.request_can_load_model(request, cb)
        if not cb.granted.wait(30):
            raise SystemExit(f"npud did not let us load within 30 s (last: {cb.status})")
        t0 = time.perf_counter()
        model = device.prepare_model(onnx, grant=cb.listener, cache_dir=cache_dir, token=token)
        how = "from the compilation cache" if model.loaded_from_cache else "compiled"
        print(f"prepared in {(time.perf_counter() - t0) * 1000:.1f} ms ({how})")
        cb.listener.notify_model_loaded(request)
        try:
            inputs = {spec.name: np.ones([d if d > 0 else 1 for d in spec.shape], spec.dtype)
                      for spec in model.inputs}
            times = []
            for _ in range(args.repeat):
                if cb.unload.is_set():
                    break  # npud wants the accelerator back: stop and release
                t0 = time.perf_counter()
                outputs = model.execute(inputs)
                times.append((time.perf_counter() - t0) * 1000)
            for name, value in outputs.items():
                print(f"{name}: shape {value.shape}, first values {value.ravel()[:4]}")
            if times:
                print(f"{len(times)} executions, median {sorted(times)[len(times) // 2]:.2f} ms")
        finally:
            model.release()
            cb.listener.notify_model_unloaded(request)
            # npud answers COMPLETE once the driver has let the model go: wait for it
            # (a few ms) rather than leave with the answer on its way.
            cb.ended.wait(5)
    device.close()


if __name__ == "__main__":
    from npumanager.errors import NpuError

    try:
        main()
    except NpuError as exc:  # npud absent or refusing: a sentence, not a traceback
        raise SystemExit(f"{__file__.rsplit('/', 1)[-1]}: {type(exc).__name__}: {exc}") from None
    except OSError as exc:  # --model or --cache-dir: missing, a directory, not writable
        raise SystemExit(f"{__file__.rsplit('/', 1)[-1]}: {exc.strerror}: {exc.filename}") \
            from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
