"""A foreground app (think: camera) that asks npud before loading its model.

    npu serve --runtime-dir /tmp/npu --no-drivers &      # in another terminal
    python examples/foreground_app.py --runtime-dir /tmp/npu

It asks to load a 1-2 GB model, loads it when npud says CAN_LOAD_NOW (the
grant id is what `nn.Device.prepare_model(grant=listener)` would send to the
driver), runs for a while, unloads when asked or when done, and prints every
callback it gets.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelSize,
    NpuManager,
    RequestStatus,
    UnloadReason,
)


class CameraModel(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.listener: Any = None
        self.done = threading.Event()

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        print(f"npud: {status.name}")
        if status == LoadStatus.CAN_LOAD_NOW:
            self.listener = listener
            print(f"loading the model under grant {listener.grant_id[:8]}...")
            listener.notify_model_loaded(request)

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        print(f"npud asks us to unload ({reason.name}); unloading")
        self.listener.notify_model_unloaded(request)

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        print(f"request ended: {status.name}")
        self.done.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime-dir", default=None)
    ap.add_argument("--seconds", type=float, default=3.0, help="how long to keep the model")
    args = ap.parse_args()
    request = ModelLoadRequest.Builder(100).set_size(ModelSize.BETWEEN_1GB_AND_2GB).build()
    callback = CameraModel()
    with NpuManager(args.runtime_dir) as mgr:
        mgr.request_can_load_model(request, callback)  # callbacks on the SDK's thread
        deadline = time.monotonic() + args.seconds
        while not callback.done.wait(0.1) and time.monotonic() < deadline:
            pass
        if not callback.done.is_set() and callback.listener is not None:
            print("done with the model; unloading")
            callback.listener.notify_model_unloaded(request)
            callback.done.wait(5)


if __name__ == "__main__":
    from npumanager.errors import NpuError

    try:
        main()
    except NpuError as exc:  # npud absent or refusing: a sentence, not a traceback
        raise SystemExit(f"{__file__.rsplit('/', 1)[-1]}: {type(exc).__name__}: {exc}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
