"""What a move between a device's two hosts costs a stream that keeps running
(nn/burst_handover.py): a real npud with a background lane, an app (uid 50013) streaming
one burst of a small model, the admin flipping the app's importance (FOREGROUND /
CACHED) ``--flips`` times, each flip waited for until the model moved.

Each execution's time is recorded with the model's move count after it and whether a
move was pending (its grant moved, the copy not yet switched to). Frames fall in:

- ``switch``: the frame before the one that first ran on the new host, it, and the two
  after (a frame that came during the switch waited for it);
- ``pending``: the other frames while a move was pending (the copy prepared on a thread
  beside the stream, the standby opened);
- ``quiet``: the rest (no move), the same stream in the same run: the baseline.

Two streams, one after the other: ``b2b`` (back to back) and ``paced`` (``--hz``, a
camera's). The tree measured is the one ``npumanager`` imports (PYTHONPATH): run it with
another tree's path to compare (a tree whose back-to-back burst never moves while it
streams prints so). Usage (cpu-exclusive):

    PYTHONPATH=$PWD python bench/move_stall.py [--flips 6] [--hz 30] [--modes b2b,paced]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

import npumanager
from npumanager import ModelLoadRequest, NpuManager, nn
from npumanager.constants import Importance
from npumanager.testing import procs
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model

APP_UID = 50013
TOKEN = bytes(range(32))
CONFIG: dict[str, Any] = {
    "manager": {"unload_deadline_s": 1.0},
    "policy": {"name": "BUDGET", "max_budget": 4},
    "driver": [{"name": "reference", "plugin": "reference", "channels": 2,
                "grant_wait_s": 0.2, "background_host": True,
                "background": {"channels": 1}}]}


class Lifecycle:
    def __init__(self) -> None:
        self.granted = threading.Event()
        self.listener: Any = None

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        self.listener = listener
        self.granted.set()

    def on_model_load_request_complete(self, request: Any, status: Any) -> None:
        pass


def app(runtime_dir: str, cache_dir: str, mode: str, hz: float, flips: int
        ) -> list[tuple[int, int, bool]]:
    """The stream: (execution ns, moves after it, a move pending) per frame."""
    frames: list[tuple[int, int, bool]] = []
    with NpuManager(runtime_dir, client_name="move-stall") as mgr:
        cb = Lifecycle()
        mgr.request_can_load_model(ModelLoadRequest(1), cb)
        assert cb.granted.wait(30)
        dev = nn.device("reference", runtime_dir)
        try:
            model = dev.prepare_model(add_model(), grant=cb.listener, cache_dir=cache_dir,
                                      token=TOKEN)
            x = np.ones((1, 4), np.float32)
            period = 1 / hz if mode == "paced" else 0.0
            moves = 0
            with model.burst() as b:
                procs.announce("streaming")
                nxt = time.monotonic()
                while moves < flips:
                    t0 = time.perf_counter_ns()
                    b.execute({"x": x})
                    dt = time.perf_counter_ns() - t0
                    follow = model._follow
                    pending = follow is not None and follow.target is not None
                    frames.append((dt, model.moves, pending))
                    if model.moves != moves:
                        moves = model.moves
                        procs.announce(("moved", moves))
                    if period:
                        nxt += period
                        time.sleep(max(0.0, nxt - time.monotonic()))
                    if len(frames) % 64 == 0:
                        try:
                            if procs.receive(timeout=1e-4) == "stop":
                                break
                        except TimeoutError:
                            pass
            model.release()
        finally:
            dev.close()
    return frames


def stats(name: str, us: list[float]) -> str:
    if not us:
        return f"{name:8s}      0 frames"
    a = np.array(us)
    return (f"{name:8s} {len(a):6d} frames  p50 {np.percentile(a, 50):7.0f}  p99 "
            f"{np.percentile(a, 99):7.0f}  max {a.max():7.0f} µs")


def report(mode: str, frames: list[tuple[int, int, bool]], skip: int) -> None:
    switch: set[int] = set()
    for i in range(1, len(frames)):
        if frames[i][1] != frames[i - 1][1]:
            switch.update(range(i - 1, i + 3))
    groups: dict[str, list[float]] = {"switch": [], "pending": [], "quiet": []}
    for i, (dt, _, pending) in enumerate(frames):
        if i < skip:
            continue
        key = "switch" if i in switch else "pending" if pending else "quiet"
        groups[key].append(dt / 1e3)
    moved = frames[-1][1] if frames else 0
    if os.environ.get("MOVE_STALL_DEBUG"):
        for i in range(1, len(frames)):
            if frames[i][1] != frames[i - 1][1]:
                print("   ", [round(f[0] / 1e3) for f in frames[max(0, i - 4):i + 6]])
    print(f"{mode}: {moved} moves while streaming")
    for name, us in groups.items():
        print("  " + stats(name, us))


def run_mode(runtime_dir: Path, cache_dir: str, mode: str, hz: float, flips: int,
             wait_s: float) -> None:
    with NpuManager(str(runtime_dir)) as admin:
        admin.set_uid_importance(APP_UID, Importance.CACHED)
        child = procs.spawn_as(APP_UID, None, app, str(runtime_dir), cache_dir, mode, hz,
                               flips, timeout=600)
        try:
            child.expect("streaming", 120)
            time.sleep(1.0)  # quiet frames first
            for i in range(flips):
                imp = Importance.FOREGROUND if i % 2 == 0 else Importance.CACHED
                admin.set_uid_importance(APP_UID, imp)
                try:
                    child.expect(("moved", i + 1), wait_s)
                except AssertionError:  # (not announced in time)
                    print(f"{mode}: flip {i + 1} did not move the stream within {wait_s} s")
                    child.send("stop")
                    break
                time.sleep(0.7)  # quiet frames between moves
            frames: list[tuple[int, int, bool]] = child.wait(120)
        finally:
            child.kill()
    report(mode, frames, skip=20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flips", type=int, default=6)
    ap.add_argument("--hz", type=float, default=30.0)
    ap.add_argument("--modes", default="b2b,paced")
    ap.add_argument("--wait", type=float, default=15.0, help="s a flip may take to move")
    args = ap.parse_args()
    if os.getuid() != 0:
        sys.exit("run as root (the app runs as another uid, whose importance npud sets)")
    print(f"tree: {Path(npumanager.__file__).resolve().parents[1]}")
    runtime_dir = Path(tempfile.mkdtemp(prefix="npu-move-stall-", dir="/tmp"))
    cache_dir = tempfile.mkdtemp(prefix="npu-move-stall-cache-", dir="/tmp")
    os.chown(cache_dir, APP_UID, APP_UID)
    state_dir = tempfile.mkdtemp(prefix="npu-move-stall-state-", dir="/tmp")
    env = dict(os.environ, NPU_STATE_DIR=state_dir)
    try:
        with DaemonProcess(runtime_dir, CONFIG, drivers=True, env=env, ready_timeout=60):
            for mode in args.modes.split(","):
                run_mode(runtime_dir, cache_dir, mode, args.hz, args.flips, args.wait)
    finally:
        for d in (runtime_dir, cache_dir, state_dir):
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
