"""Preemption: how long a foreground job waits while background multi-step jobs saturate
every channel of the reference driver.

Background: one multi-step job per channel (job priority 1000, a MatMul step of a
few ms, thousands of steps) keeps all channels busy. Foreground: a small model
submitted with job priority 0 at random phases of the background steps. The
driver gives the channel to the foreground at the next step boundary (the
background job is PAUSED, then RESUMED).

Measured per foreground call: in the driver, from its on_work_requested to its
on_work_started (receipt times of the HAL pushes, which travel in order on one
socket); on the client, the extra latency = latency under load minus the same
call's p50 on an idle driver (same run). Target: p99 wait <= one background
step (p99, measured while saturated) + 1 ms. Also printed, as
the unmanaged baseline: the wait if the foreground had no priority over the
background (it queues behind a whole background job: its remaining steps).
The driver gets one channel fewer than the machine has cores (``--channels``), so
the host's event loop and this client have a core. Usage: python
bench/preemption.py [--calls N] [--step-dim D] [--channels C]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npumanager import nn
from npumanager.errors import WorkCancelled
from npumanager.hal import ISchedulingCallback, StartReason, WorkInfo, connect_scheduling
from npumanager.testing.driver_host import running_driver
from npumanager.testing.onnx_models import add_model, step_model


def pct(ts: list[float], q: float) -> float:
    s = sorted(ts)
    return s[min(len(s) - 1, int(len(s) * q))]


class Stamps(ISchedulingCallback):
    """Receipt times of the foreground's requested/started pushes (same socket, in order)."""

    def __init__(self) -> None:
        self.requested: dict[int, float] = {}
        self.started: dict[int, float] = {}

    def on_work_requested(self, info: WorkInfo) -> None:
        if info.job_priority == 0:
            self.requested[info.id] = time.perf_counter()

    def on_work_started(self, info: WorkInfo, reason: StartReason) -> None:
        if info.job_priority == 0 and reason == StartReason.INITIAL:
            self.started[info.id] = time.perf_counter()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--step-dim", type=int, default=384, help="MatMul size of a bg step")
    ap.add_argument("--bg-steps", type=int, default=1_000_000)
    # One core stays free for the host's event loop and this client: with every core
    # busy in ONNX Runtime, the wait measures the OS scheduler, not the driver's.
    ap.add_argument("--channels", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    args = ap.parse_args()
    rt = Path(tempfile.mkdtemp(prefix="npu-bench-", dir="/tmp"))
    st = Path(tempfile.mkdtemp(prefix="npu-bench-st-", dir="/tmp"))
    try:
        with running_driver("reference", rt, st,
                            args=["--no-enforce-admission", "--channels", str(args.channels)]):
            bg_dev = nn.device("reference", rt)
            fg_dev = nn.device("reference", rt)
            channels = bg_dev.capabilities.channels
            hal = connect_scheduling("reference", rt)
            stamps = Stamps()
            bg = bg_dev.prepare_model(step_model(4, work_dim=args.step_dim, work_depth=2))
            fg = fg_dev.prepare_model(add_model(4))
            x = {"x": np.ones((1, 4), np.float32)}
            state = {"state": np.zeros((1, 4), np.float32)}
            feedback = {"state_out": "state"}
            # Same-run baselines on the idle driver.
            for _ in range(50):
                fg.execute(x)
            idle = []
            for _ in range(300):
                t = time.perf_counter()
                fg.execute(x)
                idle.append(time.perf_counter() - t)
            fg_idle = pct(idle, 0.5)
            steps_probe = 40
            step_times = []
            for _ in range(5):
                t = time.perf_counter()
                bg.execute(state, steps=steps_probe, feedback=feedback)
                step_times.append((time.perf_counter() - t) / steps_probe)
            # Saturate every channel.
            stop_errors: list[BaseException] = []

            def background() -> None:
                try:
                    bg.execute(state, job_priority=1000, steps=args.bg_steps, feedback=feedback)
                except WorkCancelled:
                    pass
                except BaseException as exc:
                    stop_errors.append(exc)

            threads = [threading.Thread(target=background) for _ in range(channels)]
            for th in threads:
                th.start()
            time.sleep(0.3)
            t_bg0 = time.perf_counter()
            waits = []
            rng = random.Random(0)
            mean_step = sum(step_times) / len(step_times)
            # Phase 1: the client's view (no HAL listener in this process: its reader
            # thread would compete for the GIL with the measured call).
            for _ in range(args.calls):
                time.sleep(rng.uniform(0, 2 * mean_step))
                t = time.perf_counter()
                fg.execute(x, job_priority=0)
                waits.append(max(0.0, time.perf_counter() - t - fg_idle))
            # Phase 2: the driver's view, from its lifecycle events.
            hal.set_callback(stamps, 0)
            for _ in range(args.calls):
                time.sleep(rng.uniform(0, 2 * mean_step))
                fg.execute(x, job_priority=0)
            loaded_s = time.perf_counter() - t_bg0
            hal.set_callback(None)
            hal.close()
            bg.cancel()
            for th in threads:
                th.join(30)
            # Under load, a background step is also slower: measure it while saturated.
            done = threading.Event()
            loaded_steps: list[float] = []

            def probe() -> None:
                while not done.is_set():
                    t = time.perf_counter()
                    bg.execute(state, steps=steps_probe, feedback=feedback)
                    loaded_steps.append((time.perf_counter() - t) / steps_probe)

            probes = [threading.Thread(target=probe) for _ in range(channels)]
            for th in probes:
                th.start()
            time.sleep(1.5)
            done.set()
            for th in probes:
                th.join(60)
            bg.release()
            fg.release()
            bg_dev.close()
            fg_dev.close()
        if stop_errors:
            raise stop_errors[0]
        ms = 1e3
        step_p99 = max(pct(step_times, 0.99), pct(loaded_steps, 0.99))
        target = step_p99 + 1e-3
        p50, p99, worst = pct(waits, 0.5), pct(waits, 0.99), max(waits)
        drv = [stamps.started[i] - stamps.requested[i] for i in stamps.started
               if i in stamps.requested]
        print(f"\npreemption: {channels} channels saturated by background jobs "
              f"({args.calls} foreground calls over {loaded_s:.1f} s; load "
              f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs)")
        rows = [
            ("foreground on idle driver (p50)", f"{fg_idle * ms:.3f} ms", ""),
            ("background step (idle p50 / saturated p99)",
             f"{pct(step_times, 0.5) * ms:.3f} / {pct(loaded_steps, 0.99) * ms:.3f} ms", ""),
            ("driver: requested -> started, p50", f"{pct(drv, 0.5) * ms:.3f} ms", ""),
            ("driver: requested -> started, p90", f"{pct(drv, 0.9) * ms:.3f} ms", ""),
            ("driver: requested -> started, p99", f"{pct(drv, 0.99) * ms:.3f} ms",
             f"target <= {target * ms:.3f} ms (one step + 1 ms): "
             f"{'PASS' if pct(drv, 0.99) <= target else 'FAIL'}"),
            ("client: extra latency vs idle, p50", f"{p50 * ms:.3f} ms", ""),
            ("client: extra latency vs idle, p90", f"{pct(waits, 0.9) * ms:.3f} ms", ""),
            ("client: extra latency vs idle, p99", f"{p99 * ms:.3f} ms",
             f"target <= {target * ms:.3f} ms: {'PASS' if p99 <= target else 'FAIL'}"),
            ("client: extra latency vs idle, max", f"{worst * ms:.3f} ms", ""),
            ("client p99 wait / step p99", f"{p99 / step_p99:.2f}", ""),
            ("unmanaged baseline: wait behind a whole bg job",
             f"{args.bg_steps * pct(step_times, 0.5):.0f} s",
             "(FIFO without step preemption: its remaining steps)"),
        ]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        for r in rows:
            print(f"{r[0].ljust(w0)}  {r[1].ljust(w1)}  {r[2]}")
    finally:
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(st, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
