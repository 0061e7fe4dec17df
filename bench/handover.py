"""Handover latency through a real npud and its reference driver: a holder reports
unloaded and the next waiter is granted.

    python bench/handover.py [--rounds N] [--pairs P]

One app holds the whole budget (a GREATER_THAN_2G request, weight 4 of 4) and a second
request of it waits (NOT_PRIORITIZED). The holder reports unloaded; measured per round:
``complete`` = from the unloaded call to the holder's COMPLETE callback, ``handover`` =
to the waiter's CAN_LOAD_NOW (each through the SDK's callback thread). Two shapes:
the app released its model first (the usual order: the driver has nothing left to free
at the end of the grant), and the model still prepared when the grant ends (what a
revocation looks like: the driver releases the ONNX Runtime session then).

Same-run baseline: npud with ``grant_end_ack_s = 0`` (the end sent to the driver and
forgotten: COMPLETE and the next grant at once, the old behaviour) next to the default
(COMPLETE and the next grant once the driver acknowledged the end), alternating npuds
``--pairs`` times so both see the same machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelSize,
    NpuManager,
    RequestStatus,
    nn,
)
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model


class Stamp(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.granted = threading.Event()
        self.completed = threading.Event()
        self.listener: Any = None
        self.t_granted = 0.0
        self.t_completed = 0.0

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        if status == LoadStatus.CAN_LOAD_NOW:
            self.t_granted = time.perf_counter()
            self.listener = listener
            self.granted.set()

    def on_model_load_request_complete(self, request: Any, status: Any) -> None:
        if status == RequestStatus.COMPLETE:
            self.t_completed = time.perf_counter()
            self.completed.set()


def rounds(rt: Path, n: int, keep_model: bool) -> tuple[list[float], list[float]]:
    big = ModelSize.GREATER_THAN_2G
    onnx = add_model()
    complete: list[float] = []
    handover: list[float] = []
    with NpuManager(rt, client_name="bench") as mgr:
        dev = nn.device("reference", rt)
        try:
            rid = 1
            holder = Stamp()
            hreq = ModelLoadRequest(id=rid, size=big)
            mgr.request_can_load_model(hreq, holder)
            assert holder.granted.wait(30)
            for i in range(n + 5):
                model = dev.prepare_model(onnx, grant=holder.listener)
                holder.listener.notify_model_loaded(hreq)
                rid += 1
                waiter = Stamp()
                wreq = ModelLoadRequest(id=rid, size=big)
                mgr.request_can_load_model(wreq, waiter)
                if not keep_model:
                    model.release()
                t0 = time.perf_counter()
                holder.listener.notify_model_unloaded(hreq)
                assert holder.completed.wait(30) and waiter.granted.wait(30)
                if i >= 5:  # warm-up
                    complete.append(holder.t_completed - t0)
                    handover.append(waiter.t_granted - t0)
                holder, hreq = waiter, wreq
            holder.listener.notify_model_unloaded(hreq)
            holder.completed.wait(30)
        finally:
            dev.close()
    return complete, handover


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200, help="handovers per npud and shape")
    ap.add_argument("--pairs", type=int, default=2, help="baseline/ack npud pairs")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="npu-bench-", dir="/tmp"))
    os.chmod(tmp, 0o755)
    results: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    try:
        for pair in range(args.pairs):
            for name, ack_s in (("fire and forget (ack 0)", 0.0), ("ack (default)", 10.0)):
                cfg = {"manager": {"log_level": "warning", "grant_end_ack_s": ack_s},
                       "policy": {"name": "BUDGET", "max_budget": 4}}
                env = dict(os.environ, NPU_STATE_DIR=str(tmp / f"st{pair}{ack_s}"))
                with DaemonProcess(tmp / f"rt{pair}{ack_s}", cfg, drivers=True, env=env,
                                   ready_timeout=60) as npud:
                    for shape, keep in (("released first", False), ("model kept", True)):
                        c, h = rounds(npud.runtime_dir, args.rounds, keep)
                        acc = results.setdefault((shape, name), ([], []))
                        acc[0].extend(c)
                        acc[1].extend(h)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"handover through npud + reference driver ({os.cpu_count()} CPUs, "
          f"{args.pairs} x {args.rounds} rounds per row; ms)")
    print("| shape | npud | complete p50 | complete p99 | handover p50 | handover p99 | "
          "handover mean |")
    print("|---|---|---|---|---|---|---|")
    for (shape, name), (c, h) in results.items():
        print(f"| {shape} | {name} | {pct(c, .5) * 1e3:.2f} | {pct(c, .99) * 1e3:.2f} | "
              f"{pct(h, .5) * 1e3:.2f} | {pct(h, .99) * 1e3:.2f} | "
              f"{statistics.fmean(h) * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
