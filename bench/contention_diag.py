"""Where the managed camera's contended latency goes: per-thread CPU and run-queue wait.

Runs one managed contention run (alone + contended phases) and, over the contended
phase, reads every thread's /proc/PID/task/TID/schedstat (time on a CPU, time
runnable but waiting for one, timeslices) for every process the run started
(npud, the driver host and its workers, the apps), so a frame's delay can be split
into "waiting for a core" (run-queue wait of the threads on the frame's path) and
"blocked" (a lock, the GIL: neither running nor runnable). With ``--py-spy SECONDS``
it also samples the driver host's GIL holder (``py-spy record --gil --nonblocking``)
for that long at the start of the contended phase.

The per-frame breakdown (client + wake-up, parse, lock, state, ORT run, reply,
the client after the ring) joins the camera's frames with host-side timestamps
read from ``$NPU_DIAG_BURST`` (default /tmp/c15/diag/burst.jsonl): a diagnostic
patch to drivers/burst.py, not in the tree, writes them (one JSON line per burst
execution: uid, wake, t0, lock1, sub1, run0, run1, ort, lock2, exend, sent, all
perf_counter). Without that file only the per-thread table prints.

Usage: python bench/contention_diag.py [--quick] [--variant NAME] [--py-spy S]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from contention import VARIANTS

from npumanager.demo.contention import (
    ContentionRun,
    Timing,
    build_models,
    camera_cell,
    driver_config,
)
from npumanager.demo.contention_memory import descendants


def _comm(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            parts = f.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(p.decode(errors="replace") for p in parts[:6])
    for key in ("driver reference", "compile_worker", "npumanager serve"):
        if key in text:
            return key.split()[-1]
    return "app"


def snapshot(root: int) -> dict[tuple[int, int], tuple[str, str, int, int, int, int]]:
    """(pid, tid) -> (process kind, thread name, cpu ns, wait ns, slices, nice)."""
    out = {}
    for pid in descendants(root):
        kind = _cmd(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for t in tids:
            tid = int(t)
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    cpu, wait, slices = (int(x) for x in f.read().split())
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    nice = int(f.read().rpartition(")")[2].split()[16])
            except (OSError, ValueError):
                continue
            out[(pid, tid)] = (kind, _comm(pid, tid), cpu, wait, slices, nice)
    return out


class DiagRun(ContentionRun):
    def __init__(self, *a: Any, py_spy: float = 0.0, **k: Any) -> None:
        super().__init__(*a, **k)
        self.py_spy = py_spy
        self.before: dict[Any, Any] = {}
        self.after: dict[Any, Any] = {}
        self.spy_out = ""

    def phase(self, name: str, seconds: float) -> None:
        if name != "contended":
            super().phase(name, seconds)
            return
        self.before = snapshot(os.getpid())
        spy: threading.Thread | None = None
        spy_bin = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if self.py_spy and os.path.exists(spy_bin):
            hosts = [p for p in descendants(os.getpid()) if _cmd(p) == "driver"]
            if hosts:
                def run_spy() -> None:
                    r = subprocess.run(
                        [spy_bin, "record", "--gil", "--nonblocking", "--threads", "-r", "500",
                         "-d", str(int(self.py_spy)), "-f", "raw", "-o", "/tmp/c15/spy.txt",
                         "-p", str(hosts[0])], capture_output=True, text=True)
                    self.spy_out = r.stderr[-500:]
                spy = threading.Thread(target=run_spy)
                spy.start()
        super().phase(name, seconds)
        self.after = snapshot(os.getpid())
        if spy is not None:
            spy.join()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variant", default="managed")
    ap.add_argument("--py-spy", type=float, default=0.0)
    args = ap.parse_args()
    timing = Timing.quick() if args.quick else Timing()
    knobs = dict(VARIANTS[args.variant])
    bursts = bool(knobs.pop("bursts", True))
    batch_bursts = bool(knobs.pop("batch_bursts", False))
    run = DiagRun(args.variant, True, timing, build_models(), driver_config(**knobs),
                  phases=("alone", "contended"), bursts=bursts, batch_bursts=batch_bursts,
                  py_spy=args.py_spy)
    r = run.run()
    a, b = run.windows["contended"]
    span = b - a
    print(f"{args.variant}: camera alone {camera_cell(r.camera.get('alone'))}; contended "
          f"{camera_cell(r.camera.get('contended'))}; LLM {r.llm_tokens_s:.0f} tok/s, "
          f"embedder {r.embedder_items_s:.0f} items/s")
    rows = []
    for key, (kind, name, cpu, wait, slices, nice) in run.after.items():
        k0 = run.before.get(key)
        if k0 is None:
            continue
        dcpu, dwait, dsl = cpu - k0[2], wait - k0[3], slices - k0[4]
        if dcpu < 1e6 and dwait < 1e6:
            continue
        rows.append((dcpu, kind, key[0], name, nice, dwait, dsl))
    rows.sort(reverse=True)
    print(f"over the contended phase ({span:.1f} s): per thread CPU %, run-queue wait per "
          f"slice (µs), slices/s")
    print(f"{'proc':8} {'pid':>7} {'thread':18} {'nice':>4} {'cpu%':>6} {'wait%':>6} "
          f"{'wait/slice':>10} {'slices/s':>9}")
    for dcpu, kind, pid, name, nice, dwait, dsl in rows:
        print(f"{kind:8} {pid:7d} {name[:18]:18} {nice:4d} {dcpu / span / 1e7:6.1f} "
              f"{dwait / span / 1e7:6.1f} {dwait / max(dsl, 1) / 1e3:10.0f} "
              f"{dsl / span:9.0f}")
    if run.spy_out:
        print("py-spy:", run.spy_out)
    breakdown(run, a, b)
    return 0


def breakdown(run: DiagRun, a: float, b: float) -> None:
    """Join the host's per-burst-execution times (the diag patch) with the camera's frames."""
    import json

    path = os.environ.get("NPU_DIAG_BURST") or "/tmp/c15/diag/burst.jsonl"
    if not os.path.exists(path):
        return
    recs = []
    with open(path) as f:
        for line in f:
            try:
                recs.append(json.loads(line))
            except ValueError:
                pass
    cam = sorted((r for r in recs if r.get("uid") == 62001 and "wake" in r),
                 key=lambda r: r["sent"])
    sents = [r["sent"] for r in cam]
    import bisect

    rows = []
    for e in run.events.find("camera", "frame"):
        if not a <= e["t"] < b:
            continue
        end, start = e["t"], e["t"] - e["ms"] / 1000
        i = bisect.bisect_left(sents, start)
        if i >= len(cam) or cam[i]["sent"] > end:
            continue
        r = cam[i]
        comp = {"client+wake": r["wake"] - start, "parse": r["t0"] - r["wake"],
                "lock1": r["lock1"] - r["t0"], "state1": r["sub1"] - r["lock1"]}
        if "run0" in r:
            comp.update({"pre-run": r["run0"] - r["sub1"], "ort": r["ort"],
                         "run-other": r["run1"] - r["run0"] - r["ort"],
                         "lock2": r["lock2"] - r["run1"], "state2": r["exend"] - r["lock2"]})
        else:
            comp["waited"] = r["exend"] - r["sub1"]
        comp["reply"] = r["sent"] - r["exend"]
        comp["client-after"] = end - r["sent"]
        rows.append((e["ms"], comp, r.get("queued", 0)))
    if not rows:
        print("no joined frames")
        return
    rows.sort(key=lambda x: x[0])
    keys = ["client+wake", "parse", "lock1", "state1", "pre-run", "ort", "run-other", "lock2",
            "state2", "waited", "reply", "client-after"]

    def avg(sel: list[Any], k: str) -> float:
        v = [c.get(k, 0.0) for _, c, _ in sel]
        return sum(v) / len(v) * 1000

    n = len(rows)
    groups = {"p0-50": rows[: n // 2], "p50-90": rows[n // 2: int(n * 0.9)],
              "p90-99": rows[int(n * 0.9): int(n * 0.99)], "top1%": rows[int(n * 0.99):]}
    print(f"camera frames joined: {n}; mean ms per component by latency band "
          f"(queued = the state queued the frame behind other work)")
    print(f"{'band':8} {'total':>6} {'queued':>6} " + " ".join(f"{k:>11}" for k in keys))
    for g, sel in groups.items():
        if not sel:
            continue
        tot = sum(x[0] for x in sel) / len(sel)
        q = sum(x[2] for x in sel) / len(sel)
        print(f"{g:8} {tot:6.2f} {q:6.2f} " + " ".join(f"{avg(sel, k):11.2f}" for k in keys))


if __name__ == "__main__":
    raise SystemExit(main())
