"""A burst at a stream's pace, one configuration at a time: where the time goes.

bench/execute_overhead.py interleaves every mode round by round (fair against machine
noise), so each paced phase starts after seconds of other work and a driver that
learns a stream's pace (drivers/anticipate.py) has to learn it again each time. Here
each configuration is one uninterrupted paced loop, as a camera or an audio app
runs: ``--calls`` executions at ``--hz``, the first ``--skip`` not counted (the pace
is learnt over 8 intervals). Each call is laid next to what the burst's thread did
for it (``device.stats``'s per-request times, drivers/burst_counters.py; both sides
read CLOCK_MONOTONIC), so every call splits into:

- to seen: from the client's call to the driver's thread seeing the request (the
  client's own code, the doorbell's wake-up or the poll);
- served: from seen to the answer written and rung (admission, the run, the end);
- back: from the answer to the client's return (its wake-up, or its spin, and the
  outputs).

Configurations (``--configs``, comma-separated, run in that order):

- ``inproc``: ONNX Runtime in-process (the baseline);
- ``plain``: ``model.execute`` through the driver's socket (no burst);
- ``inproc-warm``: the same, with one run ``--warm-ahead`` µs before each tick (what a
  warm-up buys in-process);
- ``burst``: a burst, driver and client as by default;
- ``burst-spin``: the client spins ``--spin`` µs before it blocks;
- ``ant``: the driver anticipates (``burst_anticipate_us = --anticipate``);
- ``ant-spin``: both.

The driver counts the work FOREGROUND (``foreground_priority = 1000``: as a camera's
under npud). Usage: python bench/burst_paced.py [--model tiny|gru] [--hz 30]
[--calls 300] [--configs inproc,burst,ant-spin] [--spin 400] [--anticipate 300]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from execute_overhead import pct, process_cpu, start_host  # (bench/ is on sys.path)

from npumanager.drivers.base import CompileOptions
from npumanager.drivers.burst_counters import HOW
from npumanager.drivers.reference import ReferenceDriver
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.testing.onnx_models import add_model, gru_step_model
from npumanager.wire.client import SyncRpcClient

US = 1e6


def model(name: str) -> tuple[bytes, dict[str, np.ndarray]]:
    if name == "tiny":
        return add_model(4), {"x": np.ones((1, 4), np.float32)}
    if name == "camera":  # the contention bench's camera (bench/contention.py)
        from npumanager.demo.models import camera_model

        cam = camera_model()
        return cam.onnx, dict(cam.inputs)
    rng = np.random.default_rng(0)
    return gru_step_model(), {"frame": rng.standard_normal((1, 512)).astype(np.float32),
                              "h": np.zeros((1, 1, 128), np.float32)}


def paced_loop(fn: Callable[[], object], n: int, hz: float,
               before: Callable[[], object] | None = None, ahead_s: float = 0.0
               ) -> list[tuple[float, float]]:
    """``n`` calls, one per tick (sleep until it; a late call restarts the ticks); with
    ``before``, that is called ``ahead_s`` before each tick first. (start, end) of each."""
    out = []
    clock, sleep = time.perf_counter, time.sleep
    period = 1.0 / hz
    tick = clock() + period
    for _ in range(n):
        if before is not None:
            wait = tick - ahead_s - clock()
            if wait > 0:
                sleep(wait)
            before()
        wait = tick - clock()
        if wait > 0:
            sleep(wait)
        t = clock()
        fn()
        end = clock()
        out.append((t, end))
        tick += period
        if tick < end:
            tick = end
    return out


def driver_recent(rt: Path, burst_id: int) -> dict[str, Any]:
    """The burst's counters and its last requests' times (``device.stats`` b"recent")."""
    rpc = SyncRpcClient(str(driver_socket("reference", rt)), SERVICE)
    try:
        payload, _ = rpc.call("device.stats", b"recent")
    finally:
        rpc.close()
    for b in json.loads(payload)["bursts"]:
        if b["burst_id"] == burst_id:
            return dict(b)
    raise SystemExit(f"burst {burst_id} is not in device.stats")


class TimedSock:
    """The client's doorbell socket, noting when each ring went out and for which request
    (the client's own part of "to seen" ends there)."""

    def __init__(self, sock: Any, burst: Any) -> None:
        self._s = sock
        self._b = burst
        self.sent: dict[int, float] = {}

    def send(self, data: bytes, *flags: int) -> int:
        self.sent[self._b._seq] = time.perf_counter()
        return int(self._s.send(data, *flags))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


def q(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{pct(xs, 0.5) * US:.0f}/{pct(xs, 0.9) * US:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", choices=("tiny", "gru"))
    ap.add_argument("--hz", type=float, default=30.0)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--skip", type=int, default=20)
    ap.add_argument("--configs", default="inproc,inproc-warm,burst,burst-spin,ant,ant-spin")
    ap.add_argument("--spin", type=float, default=400.0, help="client spin, µs")
    ap.add_argument("--anticipate", type=float, default=300.0, help="driver window, µs")
    ap.add_argument("--warm-ahead", type=float, default=500.0, help="inproc-warm, µs")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    onnx, x = model(args.model)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    fg = "foreground_priority = 1000\n"
    rows: list[tuple[str, ...]] = []
    doc: dict[str, Any] = {}
    st = Path(tempfile.mkdtemp(prefix="npu-bench-st-", dir="/tmp"))
    try:
        local = ReferenceDriver({}).compile(onnx, CompileOptions())
        with ExitStack() as hosts:
            rts = {}
            devs = {}
            for label, text in (("plain", fg),
                                ("ant", fg + f"burst_anticipate_us = {args.anticipate:g}\n")):
                if any(c.startswith(label if label == "ant" else ("burst", "plain"))
                       for c in configs):
                    rt = Path(tempfile.mkdtemp(prefix="npu-bench-", dir="/tmp"))
                    hosts.callback(shutil.rmtree, rt, True)
                    devs[label] = start_host(hosts, st, text, None, rt)
                    rts[label] = rt
            for cfg in configs:
                spin = args.spin if cfg.endswith("-spin") else 0.0
                host = "ant" if cfg.startswith("ant") else "plain"
                calls: list[tuple[float, float]]
                rec: dict[str, Any] | None = None
                seqs: list[int] = []  # each burst call's request number (pairs it below)
                if cfg == "plain":  # model.execute through the driver's socket
                    (dev, pid) = devs["plain"]
                    remote = dev.prepare_model(onnx)
                    try:
                        for _ in range(5):
                            remote.execute(x)
                        c0, d0 = process_cpu(), process_cpu(pid)
                        calls = paced_loop(lambda r=remote: r.execute(x), args.calls, args.hz)
                        cpu = ((process_cpu() - c0) / args.calls,
                               (process_cpu(pid) - d0) / args.calls)
                    finally:
                        remote.release()
                elif cfg.startswith("inproc"):
                    fn: Callable[[], object] = lambda: local.run(x)  # noqa: E731
                    for _ in range(5):
                        fn()
                    before = fn if cfg == "inproc-warm" else None
                    c0 = process_cpu()
                    calls = paced_loop(fn, args.calls, args.hz, before, args.warm_ahead / US)
                    cpu = ((process_cpu() - c0) / args.calls, 0.0)
                else:
                    (dev, pid) = devs[host]
                    remote = dev.prepare_model(onnx)
                    try:
                        with remote.burst(spin_us=spin) as b:
                            for _ in range(5):
                                b.execute(x)
                            ts = TimedSock(b._sock, b)
                            b._sock = ts  # type: ignore[assignment]

                            def call(b: Any = b, seqs: list[int] = seqs) -> None:
                                b.execute(x)
                                seqs.append(b._seq)

                            c0, d0 = process_cpu(), process_cpu(pid)
                            calls = paced_loop(call, args.calls, args.hz)
                            cpu = ((process_cpu() - c0) / args.calls,
                                   (process_cpu(pid) - d0) / args.calls)
                            rec = driver_recent(rts[host], b.burst_id)
                    finally:
                        remote.release()
                kept = calls[args.skip:]
                lat = [e - s for s, e in kept]
                row = {"p50_us": pct(lat, 0.5) * US, "p99_us": pct(lat, 0.99) * US,
                       "client_cpu_us": cpu[0] * US, "driver_cpu_us": cpu[1] * US}
                stages = ("-", "-", "-")
                extra = ""
                rows_extra = ("-", "-")
                run: list[float] = []
                if rec is not None:
                    # Each call paired with the driver's record of the same request number
                    # (counting would pair the wrong ones after a skipped or extra record).
                    by_seq = {int(r[10]): r for r in rec.pop("recent")}
                    pairs = [(r, s, e, ts.sent.get(n)) for (s, e), n in
                             zip(kept, seqs[args.skip:], strict=True)
                             if (r := by_seq.get(n)) is not None]
                    if pairs:
                        recent = [p[0] for p in pairs]
                        to_seen = [r[0] - s for r, s, _, _ in pairs]
                        served = [r[7] - r[0] for r in recent]
                        back = [e - r[7] for r, _, e, _ in pairs]
                        stages = (q(to_seen), q(served), q(back))
                        how = [HOW[int(r[1])] for r in recent]
                        counts = {h: how.count(h) for h in HOW if how.count(h)}
                        # Where the request came relative to the window's predicted due time,
                        # and how long before the call the warm-up ended and polling began.
                        off = [r[0] - r[2] for r in recent if r[2] is not None]
                        warm_end = [s - r[5] for r, s, _, _ in pairs if r[5] is not None]
                        poll_for = [s - r[6] for r, s, _, _ in pairs if r[6] is not None]
                        rang = [(r, s, t) for r, s, _, t in pairs if t is not None]
                        rows_extra = (q([t - s for _, s, t in rang]),
                                      q([r[0] - t for r, _, t in rang]))
                        run = [r[8] / US for r in recent]
                        woke = [r[3] - r[9] for r in recent
                                if r[3] is not None and r[9] is not None]
                        extra = (f"paired {len(pairs)}/{len(kept)}; how {counts}; seen-due "
                                 f"{q(off)}; woke-wake_at {q(woke)}; call-after-warm "
                                 f"{q(warm_end)}; call-after-poll-start {q(poll_for)}")
                        row |= {"how": counts, "seen_minus_due_us": q(off),
                                "paired": len(pairs)}
                    row["counters"] = rec
                    if not extra:
                        extra = f"(no driver record matches a call of {len(kept)})"
                doc[cfg] = row
                rows.append((cfg, f"{row['p50_us']:.0f}", f"{row['p99_us']:.0f}", *stages,
                             *rows_extra, q(run),
                             f"{row['client_cpu_us']:.0f}", f"{row['driver_cpu_us']:.0f}"))
                if extra:
                    print(f"{cfg}: {extra}", flush=True)
                    c = rec or {}
                    print(f"  counters: served {c.get('served')} warms {c.get('warms')} "
                          f"expired {c.get('expired')} unplanned {c.get('unplanned')} "
                          f"busy {c.get('busy')} seen-due p50/p90 {c.get('offset_p50_us')}/"
                          f"{c.get('offset_p90_us')} µs", flush=True)
            local.release()
    finally:
        shutil.rmtree(st, ignore_errors=True)
    print(f"\n{args.model} at {args.hz:g} Hz, {args.calls} calls per configuration "
          f"(first {args.skip} not counted), one configuration at a time; spin "
          f"{args.spin:g} µs, anticipate {args.anticipate:g} µs; µs, stages p50/p90")
    header = ("config", "p50", "p99", "to seen", "served", "back", "call-ring", "ring-seen",
              "run", "client cpu", "driver cpu")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
