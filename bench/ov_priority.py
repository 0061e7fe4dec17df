"""OpenVINO: does a background job's band reach the CPU? Foreground latency under load.

OpenVINO runs inference on its own stream threads, created when a model is compiled
or imported; a thread inherits its creator's nice value. The openvino driver runs a
BACKGROUND job's steps on a variant of the model made on the host's lowered
background thread (drivers/openvino.py, OvModel.begin_step), so that variant's stream
threads run at nice 10. This bench measures what that buys, in one run, in process
(the driver and its models; no npud: the mechanism, not the IPC):

* ``fg alone``: a foreground model (small conv net) run at ~30 Hz on a normal thread;
* ``+ bg, one variant`` (the baseline, as before run-time bands): a background model
  (matmul stack) run back to back from a nice-10 thread, on the variant it was
  prepared with (made on a normal thread: its OpenVINO threads at nice 0);
* ``+ bg, LOW band variant``: the same, each step announced with ``begin_step(600,
  True)``: the background variant, made on the nice-10 thread.

Columns: foreground p50/p99/max ms and background steps/s. Run under the exclusive CPU
lock: ``/work/notes/cpu-exclusive .venv/bin/python bench/ov_priority.py [--seconds S]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npumanager.drivers.base import CompileOptions
from npumanager.drivers.openvino import OpenVinoDriver
from npumanager.testing.backend_models import conv_net_onnx
from npumanager.testing.onnx_models import matmul_model

BG_NICE = 10


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def run_phase(drv: OpenVinoDriver, fg: Any, fg_inputs: dict[str, Any], bg_bytes: bytes | None,
              bands: bool, seconds: float, bg_shape: tuple[int, int]) -> dict[str, float]:
    stop = threading.Event()
    bg_steps = [0]
    ready = threading.Event()

    def background() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BG_NICE)
        assert bg_bytes is not None
        # Prepared as the host prepares a model whose class is not known to be background
        # (on a normal thread): its own variant's threads are at nice 0.
        model = prepared["bg"]
        x = {"x": np.ones(bg_shape, np.float32)}
        if bands:
            model.begin_step(600, True)  # makes the LOW variant here, at nice 10
        ready.set()
        while not stop.is_set():
            if bands:
                model.begin_step(600, True)
            model.run(x)
            bg_steps[0] += 1

    prepared: dict[str, Any] = {}
    t: threading.Thread | None = None
    if bg_bytes is not None:
        prepared["bg"] = drv.compile(bg_bytes, CompileOptions())
        t = threading.Thread(target=background)
        t.start()
        ready.wait(60)
        time.sleep(0.5)
    lat: list[float] = []
    t_end = time.perf_counter() + seconds
    bg0, t0 = bg_steps[0], time.perf_counter()
    while time.perf_counter() < t_end:
        start = time.perf_counter()
        fg.begin_step(100, False)
        fg.run(fg_inputs)
        lat.append((time.perf_counter() - start) * 1e3)
        time.sleep(max(0.0, 1 / 30 - (time.perf_counter() - start)))
    elapsed = time.perf_counter() - t0
    bg_rate = (bg_steps[0] - bg0) / elapsed
    stop.set()
    if t is not None:
        t.join()
        prepared["bg"].release()
    return {"p50": _pct(lat, 50), "p99": _pct(lat, 99), "max": max(lat), "n": len(lat),
            "bg_steps_s": bg_rate}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="per phase (default 20)")
    ap.add_argument("--rounds", type=int, default=2, help="phase order repeated (default 2)")
    ap.add_argument("--bg-dim", type=int, default=512, help="bg matmul width (default 512)")
    ap.add_argument("--bg-batch", type=int, default=64, help="bg batch (default 64)")
    args = ap.parse_args()
    drv = OpenVinoDriver({"devices": ["CPU"]})
    conv = conv_net_onnx(seed=3)
    fg = drv.compile(conv.data, CompileOptions(priority=110))
    bg_bytes = matmul_model(dim=args.bg_dim, depth=8, batch=args.bg_batch)
    bg_shape = (args.bg_batch, args.bg_dim)
    for _ in range(20):
        fg.run(conv.inputs)
    phases = [("fg alone", None, False), ("+ bg, one variant (baseline)", bg_bytes, False),
              ("+ bg, LOW band variant", bg_bytes, True)]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in phases}
    for _ in range(args.rounds):
        for name, bg, bands in phases:
            results[name].append(run_phase(drv, fg, conv.inputs, bg, bands, args.seconds,
                                           bg_shape))
    print(f"OpenVINO CPU, {os.cpu_count()} CPUs, {args.rounds} x {args.seconds:g} s per phase; "
          f"fg conv net at 30 Hz, bg matmul {args.bg_batch}x{args.bg_dim} x8 back to back "
          f"(thread nice {BG_NICE})")
    print("| phase | fg p50 ms | fg p99 ms | fg max ms | bg steps/s |")
    print("|---|---|---|---|---|")
    for name, rows in results.items():
        def med(k: str, rows: list[dict[str, float]] = rows) -> float:
            return float(np.median([r[k] for r in rows]))
        bg = "-" if name == "fg alone" else f"{med('bg_steps_s'):.1f}"
        print(f"| {name} | {med('p50'):.2f} | {med('p99'):.2f} | {med('max'):.2f} | {bg} |")
    drv.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
