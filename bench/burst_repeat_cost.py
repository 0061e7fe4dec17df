"""What a BACKGROUND burst repeat costs the burst's thread per batch, beside ONNX Runtime's run.

The lane's embedder (bench/contention.py rows ``rt+app+bg-host+here-normal*``) is bound
by its burst's thread, serially: most of its requests are in the header already when
the thread finishes the previous one (bench/README.md "The second host tuned for throughput"),
so every µs of Python the thread spends per batch is throughput. This drives that path
alone: a reference host with ``background_burst_here = "normal"`` (the step run on the
burst's own thread), the client's work BACKGROUND (a direct connection's priority), the
contention bench's embedder model, back-to-back burst executions of the same request.

Per round, in one invocation, order rotated (each configuration takes each place in turn;
``--rounds`` a multiple of 6 with ``--against``, of 2 without, gives each place the same
number of rounds): ``ort`` (the same model compiled by the
reference driver in this process, its run back to back: the baseline), ``burst`` (this
tree's host) and, with ``--against DIR``, ``burst@DIR`` (a host run from that tree, the
client side this tree's). Per configuration, µs per batch: the client's call (p50), the
burst thread's cycle (p50 of one request's ``seen`` to the next's, over requests that were
in the header already, ``ahead``: the thread's own pace), ONNX Runtime's run in it
(``ort``, the driver's ``run_us``) and the rest of the cycle (``python``: cycle - ort,
the Python around the run and the system calls), and the driver's stage medians
(burst_counters ``STAGES``: ``run`` is the step's, the run and what wraps it; ``end`` the
step's end recorded; ``after`` the loop hand-over, the ring drained, the next execution
made). The ratio:
cycle / ``ort``'s call, the bare run in this process.

Usage: python bench/burst_repeat_cost.py [--calls 2000] [--rounds 3] [--against DIR]
[--config 'key = value'...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from burst_paced import driver_recent
from execute_overhead import start_host

from npumanager.demo.models import demo_models
from npumanager.drivers import burst_counters as bc
from npumanager.drivers.base import CompileOptions
from npumanager.drivers.reference import ReferenceDriver

_FIRST = 11  # where a recent entry's stages begin (burst_counters)
LANE = 'background_burst_here = "normal"\n'


def med(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else math.nan


def burst_round(dev: Any, rt: Path, x: dict[str, Any], calls: int) -> dict[str, float]:
    """``calls`` back-to-back executions on a fresh burst: the client's and the driver's
    figures (µs, medians)."""
    out: dict[str, float] = {}
    with dev.burst() as b:
        for _ in range(20):
            b.execute(x)
        clock = time.perf_counter
        lat = []
        for _ in range(calls):
            t = clock()
            b.execute(x)
            lat.append(clock() - t)
        rec = driver_recent(rt, b.burst_id)
    recent = [r for r in rec["recent"] if r[0] is not None][-calls:]
    out["call"] = med(lat) * 1e6
    cycles = [(b2[0] - a[0]) * 1e6 for a, b2 in pairwise(recent)
              if b2[1] == bc.AHEAD]
    out["cycle"] = med(cycles)
    out["ahead"] = 100.0 * len(cycles) / max(1, len(recent) - 1)
    out["ort"] = med([r[8] for r in recent])  # ONNX Runtime's run (run_us)
    for i, s in enumerate(bc.STAGES):
        out[s] = med([r[_FIRST + i] for r in recent if r[_FIRST + i] is not None])
    out["python"] = out["cycle"] - out["ort"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", type=Path)
    ap.add_argument("--config", action="append", default=[],
                    help="more [[driver]] keys for every host (e.g. 'background_one_pass = true')")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cfg = LANE + "".join(c + "\n" for c in args.config)
    embed = demo_models()["embedder"]
    x = dict(embed.inputs)
    st = Path(tempfile.mkdtemp(prefix="npu-bench-st-", dir="/tmp"))
    got: dict[str, list[dict[str, float]]] = {}
    try:
        with ExitStack() as stack:
            hosts = [("burst", None)]
            if args.against is not None:
                hosts.append((f"burst@{args.against.name}", args.against))
            devs = {}
            for label, tree in hosts:
                rt = Path(tempfile.mkdtemp(prefix="npu-bench-", dir="/tmp"))
                stack.callback(shutil.rmtree, rt, True)
                dev, _pid = start_host(stack, st, cfg, tree, rt)
                devs[label] = (dev.prepare_model(embed.onnx), rt)
            local = ReferenceDriver({}).compile(embed.onnx, CompileOptions())
            labels = ["ort", *devs]
            for r in range(args.rounds):
                # Rotated, each turn of rotations reversed: every configuration takes every
                # place in turn (alternating the order alone kept the middle one in the
                # middle, and that place measured ~30 µs a batch slower, same tree both:
                # bench/README.md "The second host tuned for throughput", pipe23).
                k = r % len(labels)
                order = labels[k:] + labels[:k]
                if (r // len(labels)) % 2:
                    order.reverse()
                for label in order:
                    if label == "ort":
                        for _ in range(20):
                            local.run(x)
                        clock = time.perf_counter
                        lat = []
                        for _ in range(args.calls):
                            t = clock()
                            local.run(x)
                            lat.append(clock() - t)
                        row = {"call": med(lat) * 1e6}
                    else:
                        model, rt = devs[label]
                        row = burst_round(model, rt, x, args.calls)
                    got.setdefault(label, []).append(row)
                    print(f"  round {r + 1} {label}: " + " ".join(
                        f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    finally:
        shutil.rmtree(st, True)
    cols = ["call", "cycle", "ort", "python", "run", "ahead", "end", "after", "admit", "lock",
            "copy", "lock2", "answer", "ring"]
    print(f"\nembedder (384x6, batch 8), BACKGROUND burst repeats, background_burst_here = "
          f"normal; {args.rounds} rounds x {args.calls} back-to-back calls, order "
          "rotated; µs per batch, median of the rounds' medians [min-max of the rounds]")
    base = [row["call"] for row in got["ort"]]
    for label, rows in got.items():
        cells = []
        for c in cols:
            vs = [row[c] for row in rows if c in row and not math.isnan(row[c])]
            if vs:
                cells.append(f"{c} {statistics.median(vs):.1f} [{min(vs):.1f}-{max(vs):.1f}]")
        if label != "ort":
            ratios = [row["cycle"] / b for row, b in zip(rows, base, strict=True)]
            cells.append(f"cycle/ort {statistics.median(ratios):.2f}x "
                         f"[{min(ratios):.2f}-{max(ratios):.2f}]")
        print(f"  {label}: " + "; ".join(cells))
    if args.json is not None:
        args.json.write_text(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
