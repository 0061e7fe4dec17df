"""A local foreground app for the Ray tests, run as its own process under another uid.

``python -m tests.ray.fg_app RUNTIME_DIR``: asks npud for a small model (NORMAL
priority), prepares and runs it once granted, and prints one JSON line per
step ({"event": ..., "t": wall clock}); it releases its model when a line
``release`` arrives on stdin, then exits.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import numpy as np

from npumanager import ModelLoadRequest, ModelLoadRequestCallback, NpuManager, nn
from npumanager.constants import LoadStatus, ModelSize
from npumanager.testing.onnx_models import add_model

_out = threading.Lock()


def say(event: str, **info: Any) -> None:
    line = json.dumps({"event": event, "t": time.time(), **info}) + "\n"
    with _out:  # callbacks print from npud's dispatch thread too: one line at a time
        sys.stdout.write(line)
        sys.stdout.flush()


def main(runtime_dir: str) -> int:
    granted = threading.Event()
    holder: dict[str, Any] = {}

    class Cb(ModelLoadRequestCallback):
        def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                              listener: Any) -> None:
            say("status", status=LoadStatus(status).name)
            if status == LoadStatus.CAN_LOAD_NOW:
                holder["listener"] = listener
                granted.set()

    with NpuManager(runtime_dir, client_name="foreground-app") as mgr:
        req = ModelLoadRequest(1, ModelSize.LESS_THAN_1GB)
        t0 = time.monotonic()
        say("requested", uid=mgr.uid)
        mgr.request_can_load_model(req, Cb())
        if not granted.wait(30):
            say("no_grant")
            return 1
        waited = time.monotonic() - t0
        model = nn.device("reference", runtime_dir).prepare_model(
            add_model(4), grant=holder["listener"])
        out = model.execute({"x": np.ones((1, 4), np.float32)})
        holder["listener"].notify_model_loaded(req)
        say("loaded", waited_ms=round(waited * 1000, 1), y=out["y"].tolist())
        line = sys.stdin.readline()
        model.release()
        holder["listener"].notify_model_unloaded(req)
        say("released", why=line.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
