"""Poll turns and two paced streams' latency: first come, first served vs turns.

Anticipation's one poll slot (drivers/anticipate.py: one burst warms up and polls at a
time) goes in turns between uids whose windows overlap (drivers/poll_turns.py,
``burst_poll_turns = true``) or first come, first served (``false``). Session 12
counted the windows each stream was skipped; this measures what the streams see.

Two FOREGROUND bursts of two uids (forked, setuid: the turns are per uid) run at
``--hz`` from one CLOCK_MONOTONIC start, the second's requests ``--lag-us`` after the
first's, so their windows overlap every frame and the first's opens first (the pacing of
tests/security/test_burst_stamps.py, honest stamps). Each round runs the pair against a
driver host with turns off and one with turns on, both started at the beginning, the
order alternated round by round; a fresh burst per stream and run. Per stream and mode:
its calls' mean, p50, p90 and p99 latency (``b.execute``, the client's clock, the first
``--skip`` calls not counted: the pace is learnt over 8 intervals), and how the driver
found its requests
(``device.stats``: ``polled`` in a window, ``rung`` by the doorbell; ``busy``: windows
skipped while the other stream held the slot, ``deferred``: given up for the other's
turn). Every round's numbers are printed, then the medians over rounds and their range.

Usage (root, cpu-exclusive): python bench/poll_turns_latency.py [--rounds 4]
[--calls 300] [--hz 30] [--lag-us 100] [--model tiny|camera] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from execute_overhead import pct, start_host  # (bench/ is on sys.path)

from npumanager import nn
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from npumanager.wire.client import SyncRpcClient

US = 1e6
#: The two streams' uids (not the tests' 50001-50002 nor bench/contention.py's 62001-62004,
#: so a suite running meanwhile never counts them as its own).
UIDS = (62021, 62022)
MODES = ("first-come", "turns")


def model(name: str) -> tuple[bytes, dict[str, np.ndarray]]:
    if name == "camera":  # the contention bench's camera (bench/contention.py)
        from npumanager.demo.models import camera_model

        cam = camera_model()
        return cam.onnx, dict(cam.inputs)
    return add_model(4), {"x": np.ones((1, 4), np.float32)}


def stream(rt: str, onnx: bytes, x: dict[str, np.ndarray], calls: int, hz: float,
           lag_s: float) -> dict[str, Any]:
    """As one uid: a burst at ``hz`` from the start the bench sends, ``lag_s`` after it;
    each call's latency (s). Keeps the burst open until told, so its counters can be
    read."""
    period = 1.0 / hz
    dev = nn.device("reference", rt)
    try:
        remote = dev.prepare_model(onnx)
        lat: list[float] = []
        with remote.burst() as b:
            for _ in range(5):
                b.execute(x)
            procs.announce(("ready", b.burst_id))
            _, start_ns = procs.receive(timeout=120)
            start = start_ns / 1e9 + lag_s
            clock = time.perf_counter
            for i in range(calls):
                pause = start + i * period - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                t = clock()
                b.execute(x)
                lat.append(clock() - t)
            procs.announce("done")
            procs.receive(timeout=120)
        remote.release()
    finally:
        dev.close()
    return {"lat": lat}


def bursts(rt: Path) -> dict[int, dict[str, Any]]:
    rpc = SyncRpcClient(str(driver_socket("reference", rt)), SERVICE)
    try:
        payload, _ = rpc.call("device.stats", b"")
    finally:
        rpc.close()
    return {int(b["burst_id"]): b for b in json.loads(payload)["bursts"]}


def one_run(rt: Path, onnx: bytes, x: dict[str, np.ndarray], args: argparse.Namespace
            ) -> list[dict[str, Any]]:
    """Both streams once against the host in ``rt``: per stream its numbers."""
    kids = [procs.spawn_as(uid, None, stream, str(rt), onnx, x, args.calls, args.hz,
                           k * args.lag_us / US, timeout=args.calls / args.hz + 180)
            for k, uid in enumerate(UIDS)]
    try:
        ids = [kid.expect(lambda e: isinstance(e, tuple) and e[0] == "ready", 120)[1]
               for kid in kids]
        start = time.monotonic_ns() + 200_000_000
        for kid in kids:
            kid.send(("go", start))
        for kid in kids:
            kid.expect("done", args.calls / args.hz + 120)
        stats = bursts(rt)
        for kid in kids:
            kid.send("close")
        got = [kid.wait(60) for kid in kids]
    finally:
        for kid in kids:
            kid.kill()
    out = []
    for burst_id, res in zip(ids, got, strict=True):
        lat = res["lat"][args.skip:]
        c = stats.get(burst_id, {})
        out.append({"mean_us": statistics.fmean(lat) * US, "p50_us": pct(lat, 0.5) * US,
                    "p90_us": pct(lat, 0.9) * US, "p99_us": pct(lat, 0.99) * US,
                    "max_us": max(lat) * US, "n": len(lat),
                    **{k: c.get(k) for k in ("served", "ahead", "polled", "early", "late", "rung",
                                             "busy", "deferred", "unplanned")}})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--skip", type=int, default=20)
    ap.add_argument("--hz", type=float, default=30.0)
    ap.add_argument("--lag-us", type=float, default=100.0)
    ap.add_argument("--anticipate", type=float, default=300.0, help="driver window, µs")
    ap.add_argument("--model", default="tiny", choices=("tiny", "camera"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.getuid() != 0:
        raise SystemExit("run as root: the two streams are two uids")
    onnx, x = model(args.model)
    st = Path(tempfile.mkdtemp(prefix="npu-bench-st-", dir="/tmp"))
    runs: dict[str, list[list[dict[str, Any]]]] = {m: [] for m in MODES}
    try:
        with ExitStack() as hosts:
            rts: dict[str, Path] = {}
            for mode in MODES:
                rt = Path(tempfile.mkdtemp(prefix="npu-bench-", dir="/tmp"))
                hosts.callback(shutil.rmtree, rt, True)
                rt.chmod(0o755)  # the streams' uids reach the driver's socket through it
                start_host(hosts, st, "foreground_priority = 1000\n"
                           f"burst_anticipate_us = {args.anticipate:g}\n"
                           f"burst_poll_turns = {str(mode == 'turns').lower()}\n", None, rt)
                (rt / "drivers").chmod(0o755)
                rts[mode] = rt
            for r in range(args.rounds):
                order = MODES if r % 2 == 0 else MODES[::-1]
                for mode in order:
                    res = one_run(rts[mode], onnx, x, args)
                    runs[mode].append(res)
                    print(f"round {r + 1} {mode:10s} " + "   ".join(
                        f"{name}: mean {s['mean_us']:.0f} p50 {s['p50_us']:.0f} p90 "
                        f"{s['p90_us']:.0f} p99 {s['p99_us']:.0f} µs, polled "
                        f"{s['polled']}/{s['served']} busy {s['busy']} deferred "
                        f"{s['deferred']}" for name, s in zip(("ahead", "behind"), res,
                                                              strict=True)), flush=True)
    finally:
        shutil.rmtree(st, ignore_errors=True)
    print(f"\n{args.model} model, two uids at {args.hz:g} Hz, the second {args.lag_us:g} µs "
          f"behind, {args.calls} calls per stream and run (first {args.skip} not counted), "
          f"window {args.anticipate:g} µs, {args.rounds} rounds paired (order alternated): "
          "median over rounds [min-max], µs")
    header = ("mode", "stream", "mean", "p50", "p90", "p99", "polled/served", "busy",
              "deferred")
    rows = [header]
    for mode in MODES:
        for k, name in enumerate(("ahead", "behind")):
            per = [run[k] for run in runs[mode]]

            def span(key: str, per: list[dict[str, Any]] = per) -> str:
                vals = [float(p[key]) for p in per if p.get(key) is not None]
                if not vals:
                    return "-"
                return f"{statistics.median(vals):.0f} [{min(vals):.0f}-{max(vals):.0f}]"

            rows.append((mode, name, span("mean_us"), span("p50_us"), span("p90_us"),
                         span("p99_us"),
                         f"{span('polled')} / {span('served')}", span("busy"),
                         span("deferred")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
