"""What ``background_lower = "run"`` costs a step: the two policy switches around each run.

On one thread armed as the driver's step workers are (drivers/lowering.py), times
``lower(); restore()`` alone (SCHED_IDLE and back; nice and back), and a real ONNX Runtime
run of a small model (the camera's conv net from the contention bench's models, and a
64x64 matmul) with and without the switches around it, alternated in rounds within one
invocation. Reports the median per round and the spread over rounds, in µs. Needs the
right to leave SCHED_IDLE (root, or RLIMIT_NICE 20). Usage: python bench/lower_switch.py
[--rounds 7] [--n 2000]. Run it under /work/notes/cpu-exclusive.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnxruntime as ort

from npumanager.drivers import lowering
from npumanager.testing.onnx_models import matmul_model


def session(onnx: bytes) -> Any:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(onnx, sess_options=so, providers=["CPUExecutionProvider"])


def per_call_us(fn: Any, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def measure(rounds: int, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    cases: dict[str, Any] = {}
    idle = lowering.RunLowering("idle", 19)
    nice = lowering.RunLowering("nice", 19)

    def switch_idle() -> None:
        idle.lower()
        idle.restore()

    def switch_nice() -> None:
        nice.lower()
        nice.restore()

    cases["switch SCHED_IDLE<->normal"] = switch_idle
    cases["switch nice 19<->0"] = switch_nice
    from npumanager.demo.contention import build_models

    cam = build_models()["camera"]
    s_cam = session(cam.onnx)
    x_cam = dict(cam.inputs)
    s_mm = session(matmul_model(dim=64, depth=1))
    i = s_mm.get_inputs()[0]
    x_mm = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)}
    for label, s, x in (("camera net", s_cam, x_cam), ("64x64 matmul", s_mm, x_mm)):
        def plain(s: Any = s, x: Any = x) -> None:
            s.run(None, x)

        def switched(s: Any = s, x: Any = x) -> None:
            idle.lower()
            try:
                s.run(None, x)
            finally:
                idle.restore()

        cases[f"{label} run"] = plain
        cases[f"{label} run, switched"] = switched
    for fn in cases.values():
        per_call_us(fn, max(1, n // 10))  # warm up
    names = list(cases)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            k = n if "switch " in name else max(1, n // 4)
            out.setdefault(name, []).append(per_call_us(cases[name], k))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    got: dict[str, list[float]] = {}
    t = threading.Thread(target=lambda: got.update(measure(args.rounds, args.n)))
    t.start()
    t.join()
    print(f"µs per call, {args.rounds} rounds (order alternated): median [min - max]")
    for name, xs in got.items():
        print(f"  {name:34} {statistics.median(xs):8.2f} [{min(xs):.2f} - {max(xs):.2f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
