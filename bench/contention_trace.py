"""What happened during each slow managed camera frame: a kernel scheduler trace.

Runs one managed contention run (bench/contention.py's apps, npud and driver) and,
over the contended and loading phases, records every context switch and wake-up on
the machine (``perf record -a -k mono -e sched:sched_switch -e sched:sched_wakeup``;
needs root or perf_event_paranoid <= 0 for tracepoints). The trace uses
CLOCK_MONOTONIC, the clock of the camera's frame events and of the driver's burst
records (``device.stats`` b"recent": when the burst thread saw the request, its ORT
run's length, when it answered), so each frame lines up with both.

For every frame slower than ``--over`` times the camera-alone p99 (default 1.3) and,
for comparison, the same number of typical frames, it reports:

* the frame's stages: client until the driver saw it (ring + the burst thread's
  wake-up), seen until answered (of which the ORT run), answered until the client
  had it back;
* the run-queue wait of the camera app's threads and of its burst thread in the
  frame (runnable, not running: woken or preempted until switched in);
* what the two CPUs ran meanwhile, by class: the camera and its burst thread, other
  host threads at normal priority, host threads at SCHED_IDLE, the compile child,
  the other apps (all normal-priority processes), npud, and processes outside the run
  (other users', the kernel's);
* every thread's scheduling policy in the run's processes (``/proc/PID/task/TID/sched``
  read once a second), so ORT pool threads that a background session created at
  normal priority would show as normal-priority host threads with CPU time.

Usage: python bench/contention_trace.py [--quick] [--variant NAME] [--over 1.3]
[--keep DIR]. Run it under /work/notes/cpu-exclusive (the trace costs a few %).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from contention import SECOND_HOST, VARIANTS, npud_config
from trace_loop import print_loop, start_pyspy
from trace_sleeps import print_sleeps, sleeps_by_waker
from trace_stacks import host_pid, print_stacks, roles, runnable_by, start_stacks

from npumanager.demo.contention import (
    UIDS,
    ContentionRun,
    Timing,
    build_models,
    camera_cell,
)
from npumanager.demo.contention_memory import descendants
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.wire.client import SyncRpcClient

POLICY = {0: "normal", 3: "batch", 5: "idle", 1: "fifo", 2: "rr"}


def _kind(pid: int, apps: dict[int, str]) -> str:
    if pid in apps:
        return apps[pid]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
    for key, kind in (("compile_worker", "compile"), ("driver", "host"), ("serve", "npud")):
        if key in text:
            return kind
    return "run-other"


def thread_table(root: int, apps: dict[int, str]) -> dict[int, tuple[int, str, str, int, str]]:
    """tid -> (pid, process kind, policy, nice, name) for every thread under ``root``."""
    out: dict[int, tuple[int, str, str, int, str]] = {}
    for pid in descendants(root):
        kind = _kind(pid, apps)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for t in tids:
            try:
                with open(f"/proc/{pid}/task/{t}/sched") as f:
                    text = f.read()
                with open(f"/proc/{pid}/task/{t}/stat") as f:
                    stat = f.read()
                nice = int(stat.rpartition(")")[2].split()[16])
                comm = stat[stat.index("(") + 1: stat.rindex(")")]
            except (OSError, ValueError):
                continue
            m = re.search(r"^policy\s*:\s*(\d+)", text, re.M)
            pol = POLICY.get(int(m.group(1)), "?") if m else "?"
            out[int(t)] = (pid, kind, pol, nice, comm)
    return out


class TraceRun(ContentionRun):
    def __init__(self, *a: Any, keep: str, stacks: bool = False, pyspy: bool = False,
                 **k: Any) -> None:
        super().__init__(*a, **k)
        self.keep = keep
        self.stacks = stacks
        self.pyspy = pyspy
        self.gil = (0, 0)
        self.threads: dict[int, tuple[int, str, str, int, str]] = {}
        self.recent: dict[str, list[dict[str, Any]]] = {}

    def phase(self, name: str, seconds: float) -> None:
        if name not in ("contended", "loading") or name not in self.phases:
            super().phase(name, seconds)
            return
        data = os.path.join(self.keep, f"{name}.data")
        perf = subprocess.Popen(
            ["perf", "record", "-a", "-k", "mono", "-e", "sched:sched_switch",
             "-e", "sched:sched_wakeup", "-o", data],
            stdout=subprocess.DEVNULL, stderr=open(data + ".log", "w"))  # noqa: SIM115
        apps = {p.pid: n for n, p in self.procs.items()}
        stacks = None
        if self.stacks:  # (bench/trace_stacks.py: the host's and the camera's threads only)
            stacks, self.gil = start_stacks(self.keep, name, thread_table(os.getpid(), apps))
        spy = None
        if self.pyspy and name == "loading":  # (bench/trace_loop.py)
            host = host_pid(thread_table(os.getpid(), apps))
            spy = start_pyspy(self.keep, name, host, seconds) if host else None
        time.sleep(1.0)  # perf's start stalls the machine for a moment: not in the phase
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(1.0):
                self.threads.update(thread_table(os.getpid(), apps))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            super().phase(name, seconds)
        finally:
            stop.set()
            sampler.join()
            if spy is not None:
                spy.wait(30)
            for p in (perf, stacks):
                if p is not None:
                    p.send_signal(signal.SIGINT)
                    p.wait(30)
        self.recent[name] = self.burst_records()

    def burst_records(self) -> list[dict[str, Any]]:
        rpc = SyncRpcClient(str(driver_socket("reference", self.rt)), SERVICE)
        try:
            payload, _ = rpc.call("device.stats", b"recent")
        finally:
            rpc.close()
        return list(json.loads(payload)["bursts"])


_SWITCH = re.compile(r"prev_comm=.* prev_pid=(\d+) prev_prio=(\d+) prev_state=(\S+) ==> "
                     r"next_comm=.* next_pid=(\d+) next_prio=(\d+)")
_WAKE = re.compile(r"comm=.* pid=(\d+) prio=(\d+)")


def read_trace(path: str) -> tuple[list[tuple[float, int, int, int, str]],
                                   list[tuple[float, int, int]]]:
    """(switches: t, cpu, prev tid, next tid, prev state; wake-ups: t, woken tid, waker)."""
    out = subprocess.run(["perf", "script", "-i", path, "-F", "tid,cpu,time,event,trace"],
                         capture_output=True, text=True, check=False).stdout
    switches, wakes = [], []
    for line in out.splitlines():
        parts = line.split(None, 4)
        if len(parts) < 5:
            continue
        try:
            waker = int(parts[0])
            cpu = int(parts[1].strip("[]"))
            t = float(parts[2].rstrip(":"))
        except ValueError:
            continue
        ev, rest = parts[3], parts[4]
        if ev.startswith("sched:sched_switch"):
            m = _SWITCH.search(rest)
            if m:
                switches.append((t, cpu, int(m.group(1)), int(m.group(4)), m.group(3)))
        elif ev.startswith("sched:sched_wakeup"):
            m = _WAKE.search(rest)
            if m:
                wakes.append((t, int(m.group(1)), waker))
    return switches, wakes


class Timeline:
    """Per CPU: who ran when; per thread: when it waited runnable, and on which CPU it
    then ran."""

    def __init__(self, switches: list[tuple[float, int, int, int, str]],
                 wakes: list[tuple[float, int, int]]) -> None:
        self.runs: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
        self.waits: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
        on: dict[int, tuple[float, int]] = {}
        running: set[int] = set()
        ready: dict[int, float] = {}
        events: list[tuple[float, int, Any]] = [(s[0], 1, s) for s in switches]
        events += [(w[0], 0, w) for w in wakes]
        events.sort(key=lambda e: (e[0], e[1]))
        for t, kind, ev in events:
            if kind == 0:
                if ev[1] not in running:  # (a wake-up of a thread still on its CPU: none)
                    ready.setdefault(ev[1], t)
                continue
            _, cpu, prev, nxt, state = ev
            if cpu in on:
                t0, tid = on[cpu]
                self.runs[cpu].append((t0, t, tid))
            running.discard(prev)
            if prev != 0:
                if state.startswith("R"):
                    ready[prev] = t  # preempted: runnable from now
                else:
                    ready.pop(prev, None)
            if nxt in ready:
                self.waits[nxt].append((ready.pop(nxt), t, cpu))
            if nxt != 0:
                running.add(nxt)
            on[cpu] = (t, nxt)
        self.starts = {c: [r[0] for r in rs] for c, rs in self.runs.items()}

    def ran(self, a: float, b: float, cpus: list[int] | None = None) -> dict[int, float]:
        """tid -> seconds on a CPU (of ``cpus``; None: any) within [a, b] (0: idle)."""
        out: dict[int, float] = defaultdict(float)
        for cpu, rs in self.runs.items():
            if cpus is not None and cpu not in cpus:
                continue
            i = max(0, bisect.bisect_left(self.starts[cpu], a) - 1)
            while i < len(rs) and rs[i][0] < b:
                t0, t1, tid = rs[i]
                d = min(b, t1) - max(a, t0)
                if d > 0:
                    out[tid] += d
                i += 1
        return out

    def waited(self, tid: int, a: float, b: float) -> list[tuple[float, float, int]]:
        """The parts of ``tid``'s runnable waits within [a, b], with the CPU it then got."""
        return [(max(a, w0), min(b, w1), c) for w0, w1, c in self.waits.get(tid, ())
                if min(b, w1) > max(a, w0)]


def peers(wakes: list[tuple[float, int, int]], woken_by: set[int]) -> dict[int, int]:
    """tid -> how often a thread of ``woken_by`` woke it."""
    out: dict[int, int] = defaultdict(int)
    for _, tid, waker in wakes:
        if waker in woken_by:
            out[tid] += 1
    return out


def saved(run: TraceRun, alone_p99: float) -> dict[str, Any]:
    """What the analysis needs, as kept in ``DIR/run.json`` (``--analyse DIR`` reads it)."""
    return {"windows": run.windows, "alone_p99": alone_p99, "recent": run.recent,
            "threads": {str(t): v for t, v in run.threads.items()},
            "frames": [(e["t"] - e["ms"] / 1000, e["t"], e["ms"])
                       for e in run.events.find("camera", "frame")],
            "loads": load_spans(run.events.find("loader")), "gil": run.gil}


def load_spans(events: list[Any]) -> list[tuple[float, float]]:
    """(asked, loaded) of each of the loader app's loads."""
    spans, start = [], None
    for e in events:
        if e["ev"] == "loading":
            start = e["t"]
        elif e["ev"] == "loaded" and start is not None:
            spans.append((start, e["t"]))
            start = None
    return spans


def load_stages(tl: Timeline, spans: list[tuple[float, float]], child: set[int],
                host_load: set[int]) -> list[tuple[float, float, float, float, float]]:
    """Per load: (asked, child's first CPU, child's last CPU, host loader's last CPU,
    loaded). Before the child: the app's memfd write, npud's grant, the host's receipt;
    between its first and last CPU: the child's compile; after: the host reads the
    artifacts and builds its own ONNX Runtime session (a bgcompile thread)."""
    out = []
    for a, b in spans:
        cr = sorted((t0, t1) for cpu in tl.runs for t0, t1, tid in tl.runs[cpu]
                    if tid in child and t1 > a and t0 < b)
        hr = sorted((t0, t1) for cpu in tl.runs for t0, t1, tid in tl.runs[cpu]
                    if tid in host_load and t1 > a and t0 < b)
        first = cr[0][0] if cr else a
        last = cr[-1][1] if cr else a
        host_end = max([t1 for _, t1 in hr if t1 > last] or [last])
        out.append((a, max(a, first), max(a, last), min(b, host_end), b))
    return out


def stage_of(t: float, stages: list[tuple[float, float, float, float, float]]) -> str:
    for a, first, last, host_end, b in stages:
        if a <= t <= b + 0.034:
            if t < first:
                return "1 request (memfd, grant)"
            if t <= last:
                return "2 child compile"
            if t <= host_end:
                return "3 host session"
            return "4 after the host (loaded)" if t <= b else "5 release"
    return "0 no load"


def analyse(keep: str, data: dict[str, Any], phase: str, over: float) -> None:
    path = os.path.join(keep, f"{phase}.data")
    if not os.path.exists(path) or phase not in data["windows"]:
        print(f"{phase}: no trace")
        return
    switches, wakes = read_trace(path)
    tl = Timeline(switches, wakes)
    threads = {int(t): tuple(v) for t, v in data["threads"].items()}
    alone_p99 = float(data["alone_p99"])
    cam_pid = next((p for p, n in {t[0]: t[1] for t in threads.values()}.items()
                    if n == "camera"), None)
    cam_tids = {t for t, v in threads.items() if v[1] == "camera"}
    host_tids = {t for t, v in threads.items() if v[1] == "host"}
    woken = peers(wakes, cam_tids)
    burst_tid = max((t for t in woken if t in host_tids), key=lambda t: woken[t], default=None)
    # The camera's frame thread: the one its burst thread wakes most (the answer).
    back = peers(wakes, {burst_tid} if burst_tid else set())
    cam_tid = max((t for t in back if t in cam_tids), key=lambda t: back[t], default=None)
    a, b = data["windows"][phase]
    frames = [f for f in data["frames"] if a <= f[1] < b]
    recs = [r for x in data["recent"].get(phase, []) if x.get("uid") == UIDS["camera"]
            for r in x.get("recent", [])]
    recs.sort(key=lambda r: r[0])
    seen = [r[0] for r in recs]

    role = roles(threads, host_tids, wakes)

    def classify(tid: int) -> str:
        if tid == 0:
            return "idle"
        if tid == burst_tid:
            return "cam-burst"
        v = threads.get(tid)
        if v is None:
            return "outside"
        kind, pol = v[1], v[2]
        if kind == "host":
            if "bgcompile" in (v[4] if len(v) > 4 else "") or "bgload" in str(v[4]):
                return f"host-bgcompile-{pol}"
            if str(v[4]).startswith("npu-bg_"):
                # A step worker: its policy sampled once a second says little where it
                # switches around each run (background_lower = "run").
                return "host-bgstep"
            return f"host-{pol}"
        if kind == "compile":
            return f"compile-{pol}"
        return kind if kind in ("camera", "npud") else f"app-{kind}"

    limit = over * alone_p99
    slow = [f for f in frames if f[2] > limit]
    typical = sorted(frames, key=lambda f: f[2])[len(frames) // 4: len(frames) * 3 // 4]
    step = max(1, len(typical) // max(1, len(slow) or 10))
    groups = {"slow": slow, "typical": typical[::step]}
    print(f"\n== {phase}: {len(frames)} frames, {len(slow)} over {over}x the alone p99 "
          f"({limit:.2f} ms); camera pid {cam_pid}, its burst thread {burst_tid}; "
          f"{len(switches)} switches traced")
    cols = ["to-seen", "client", "wake", "gil/lock", "served", "ort", "back", "wait-cam",
            "wait-burst"]
    # When the camera's thread rang its burst thread (a wake-up of the one by the other)
    # and when the burst thread then got a CPU: "to-seen" splits into the client's own
    # code before the ring, the burst thread's wake-up, and from its switch-in until it
    # saw the request (neither running-queue wait: the GIL or the host's lock).
    rings = sorted(t for t, tid, waker in wakes if tid == burst_tid and waker == cam_tid)
    ins = sorted((w0, w1) for w0, w1, _ in tl.waits.get(burst_tid or -1, ()))
    ins_at = [w[0] for w in ins]
    child = {t for t, v in threads.items() if v[1] == "compile"}
    host_load = {t for t in host_tids if "bgcompile" in str(threads[t][4])
                 or "bgload" in str(threads[t][4])}
    stages = load_stages(tl, [tuple(x) for x in data.get("loads", [])], child, host_load) \
        if phase == "loading" else []
    if stages:
        def med(xs: list[float]) -> float:
            return sorted(xs)[len(xs) // 2] * 1e3 if xs else float("nan")
        print(f"loads: {len(stages)}; stage medians (ms): request "
              f"{med([f - a for a, f, _, _, _ in stages]):.1f}, child compile "
              f"{med([la - f for _, f, la, _, _ in stages]):.1f}, host session "
              f"{med([h - la for _, _, la, h, _ in stages]):.1f}, after the host "
              f"{med([b - h for _, _, _, h, b in stages]):.1f}, whole "
              f"{med([b - a for a, _, _, _, b in stages]):.1f}")
    slow_stage: list[str] = []
    holders: dict[str, float] = {}  # runnable-wait of host threads while the burst was blocked
    classes: set[str] = set()
    table: dict[str, list[dict[str, float]]] = {}
    worst: list[tuple[dict[str, float], dict[tuple[str, int], float]]] = []
    for g, sel in groups.items():
        rows = []
        blockers: list[dict[tuple[str, int], float]] = []
        for s, e, ms in sel:
            row: dict[str, float] = {"ms": ms}
            if g == "slow" and stages:
                slow_stage.append(stage_of(e, stages))
            who: dict[tuple[str, int], float] = {}
            blockers.append(who)
            i = bisect.bisect_left(seen, s)
            if i < len(recs) and recs[i][0] <= e:
                r = recs[i]
                k = bisect.bisect_left(rings, s)
                if k < len(rings) and rings[k] <= r[0]:
                    j = bisect.bisect_left(ins_at, rings[k])
                    switched = ins[j][1] if j < len(ins) and ins[j][1] <= r[0] else rings[k]
                    row.update({"client": (rings[k] - s) * 1e3,
                                "wake": (switched - rings[k]) * 1e3,
                                "gil/lock": (r[0] - switched) * 1e3})
                    if r[0] - switched > 0.0005:
                        # Who held what the burst thread waited for: the host's threads
                        # that ran, or waited runnable (a GIL holder preempted), then.
                        for t2 in host_tids - {burst_tid}:
                            ran = tl.ran(switched, r[0]).get(t2, 0.0)
                            waited = sum(w1 - w0 for w0, w1, _ in tl.waited(t2, switched, r[0]))
                            if ran + waited > 0.0001:
                                idle = "-idle" if threads[t2][2] == "idle" else ""
                                name = threads[t2][4] if len(threads[t2]) > 4 else t2
                                label = f"gil:{name}{idle}"
                                who[(label, t2)] = (ran + waited) * 1e3
                                holders[label] = holders.get(label, 0.0) + waited * 1e3
                row.update({"to-seen": (r[0] - s) * 1e3, "served": (r[7] - r[0]) * 1e3,
                            "ort": r[8] / 1e3, "back": (e - r[7]) * 1e3})
            for label, tid in (("wait-cam", cam_tid), ("wait-burst", burst_tid)):
                row[label] = 0.0
                for w0, w1, cpu in tl.waited(tid, s, e) if tid else []:
                    row[label] += (w1 - w0) * 1e3
                    # Who had the CPU the waiting thread then got, while it waited.
                    for t2, d in tl.ran(w0, w1, [cpu]).items():
                        c = "blk:" + classify(t2)
                        classes.add(c)
                        row[c] = row.get(c, 0.0) + d * 1e3
                        who[(label, t2)] = who.get((label, t2), 0.0) + d * 1e3
            for tid, d in tl.ran(s, e).items():
                c = "cpu:" + classify(tid)
                classes.add(c)
                row[c] = row.get(c, 0.0) + d * 1e3
            rows.append(row)
        table[g] = rows
        if g == "slow":
            worst = list(zip(rows, blockers, strict=True))
    keys = ["ms", *cols, *sorted(classes)]
    print("mean ms per frame (cpu:X = CPU time class X had on either core during the frame; "
          "blk:X = X ran on the CPU the camera's frame thread or its burst thread waited "
          "for)")
    print(f"{'frames':8} {'n':>4} " + " ".join(f"{k[:13]:>13}" for k in keys))
    for g, rows in table.items():
        if not rows:
            continue
        vals = [sum(r.get(k, 0.0) for r in rows) / len(rows) for k in keys]
        print(f"{g:8} {len(rows):4d} " + " ".join(f"{v:13.2f}" for v in vals))
    for label, tid in (("frame thread", cam_tid), ("burst thread", burst_tid)):
        print(f"  {label} {tid}: {threads.get(tid) if tid else None}")
    causes(worst, table.get("typical", []), slow_stage)
    if burst_tid:
        spans = []
        for s, e, _ms in slow:
            i = bisect.bisect_left(seen, s)
            spans.append((s, recs[i][0] if i < len(recs) and recs[i][0] <= e else e))
        print_sleeps(sleeps_by_waker(switches, wakes, burst_tid, spans, threads))

        def answered_of(s: float, e: float) -> float | None:
            i = bisect.bisect_left(seen, s)
            return recs[i][7] if i < len(recs) and recs[i][0] <= e else None

        print_stacks(keep, phase, tuple(data.get("gil", (0, 0))), burst_tid, cam_tid,
                     host_pid(threads), slow, groups["typical"], answered_of, role,
                     runnable_by(tl, host_tids, role, classify))
        print_loop(keep, phase, host_pid(threads), role)
    if holders:
        print("while the burst thread was blocked (GIL or lock), host threads waited "
              "runnable (a holder preempted?): " + ", ".join(
                  f"{k[4:]} {v:.2f} ms" for k, v in sorted(holders.items(), key=lambda x: -x[1])))
    print("slowest frames:")
    for r, who in sorted(worst, key=lambda x: -x[0]["ms"])[:12]:
        print("  " + ", ".join(f"{k} {r[k]:.2f}" for k in keys if r.get(k)))
        top = sorted(who.items(), key=lambda x: -x[1])[:3]
        if top:
            print("    waited behind: " + "; ".join(
                f"{label.split(':', 1)[0].replace('wait-', '')} behind {t} "
                f"{threads.get(t, ('', 'outside'))[1:]} {ms:.2f} ms"
                for (label, t), ms in top))


def causes(worst: list[tuple[dict[str, float], dict[tuple[str, int], float]]],
           typical: list[dict[str, float]], stage: list[str] | None = None) -> None:
    """Each slow frame's excess over a typical frame, put down to one cause: the class
    of thread the camera's thread and its burst thread waited behind longest, a slow
    ORT run (its excess over the typical run), or, when neither explains half of the
    excess, "unexplained" (blocked, not runnable: a lock, the GIL, a page fault)."""
    if not worst or not typical:
        return
    base = sorted(r["ms"] for r in typical)[len(typical) // 2]
    ort = sorted(r.get("ort", 0.0) for r in typical)[len(typical) // 2]
    count: dict[str, int] = defaultdict(int)
    excess: dict[str, float] = defaultdict(float)
    by_stage: dict[tuple[str, str], list[float]] = defaultdict(list)
    for n, (r, _) in enumerate(worst):
        over = r["ms"] - base
        parts = {k[4:]: v for k, v in r.items() if k.startswith("blk:")}
        parts["slow ORT run"] = max(0.0, r.get("ort", ort) - ort)
        parts["client before the ring"] = max(0.0, r.get("client", 0.0) - 0.1)
        parts["gil/lock in the host"] = r.get("gil/lock", 0.0)
        top = max(parts, key=lambda k: parts[k])
        cause = top if parts[top] >= over / 2 else "unexplained"
        count[cause] += 1
        excess[cause] += over
        if stage:
            by_stage[(stage[n], cause)].append(over)
    print(f"slow frames by cause (excess over the typical {base:.2f} ms frame):")
    for c in sorted(count, key=lambda c: -excess[c]):
        print(f"  {c:16} {count[c]:4d} frames, {excess[c]:7.1f} ms excess in all")
    if by_stage:
        print("slow frames by the load's stage at the frame's end, and cause:")
        for (st, c), xs in sorted(by_stage.items(), key=lambda x: (x[0][0], -sum(x[1]))):
            print(f"  {st:26} {c:28} {len(xs):4d} frames, {sum(xs):7.1f} ms excess")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variant", default="managed")
    ap.add_argument("--over", type=float, default=1.3)
    ap.add_argument("--keep", default="")
    ap.add_argument("--stacks", action="store_true",
                    help="kernel stacks of the host's and the camera's sleeps "
                         "(bench/trace_stacks.py)")
    ap.add_argument("--pyspy", action="store_true",
                    help="py-spy samples of the host's GIL holders while models load "
                         "(bench/trace_loop.py)")
    ap.add_argument("--loading-s", type=float, default=0.0,
                    help="the loading phase's length (0: the timing's)")
    ap.add_argument("--analyse", default="", metavar="DIR",
                    help="analyse a kept run again (no new run)")
    args = ap.parse_args()
    if args.analyse:
        with open(os.path.join(args.analyse, "run.json")) as f:
            data = json.load(f)
        for phase in ("contended", "loading"):
            analyse(args.analyse, data, phase, args.over)
        return 0
    timing = Timing.quick() if args.quick else Timing()
    if args.loading_s:
        timing = dataclasses.replace(timing, loading_s=args.loading_s)
    knobs = dict(VARIANTS[args.variant])
    bursts = bool(knobs.pop("bursts", True))
    batch_bursts = bool(knobs.pop("batch_bursts", True))
    inflight = int(knobs.pop("embedder_inflight", 1))
    # The camera app's own thread's slice (rows slice-*+app, app-slice).
    cam_slice = int(knobs.pop("camera_slice_us", 0))
    # Rows with apps on a second driver host (own_host): the same devices as contention.py.
    devices = {app: SECOND_HOST for app in knobs.get("own_host", [])}
    keep = args.keep or tempfile.mkdtemp(prefix="npu-trace-")
    os.makedirs(keep, exist_ok=True)
    run = TraceRun(args.variant, True, timing, build_models(), npud_config(knobs),
                   bursts=bursts, batch_bursts=batch_bursts, embedder_inflight=inflight,
                   devices=devices, keep=keep, stacks=args.stacks, pyspy=args.pyspy,
                   app_knobs={"camera": {"slice_us": cam_slice}} if cam_slice else None)
    r = run.run()
    alone = r.camera["alone"]
    print(f"{args.variant}: camera alone {camera_cell(alone)}; contended "
          f"{camera_cell(r.camera.get('contended'))}; loading "
          f"{camera_cell(r.camera.get('loading'))}; LLM {r.llm_tokens_s:.0f} tok/s, "
          f"embedder {r.embedder_items_s:.0f} items/s; traces in {keep}")
    by: dict[tuple[str, str], list[int]] = defaultdict(list)
    for tid, (_, kind, pol, nice, _name) in sorted(run.threads.items()):
        by[(kind, f"{pol}/nice {nice}")].append(tid)
    print("threads by process and policy:")
    for (kind, pol), tids in sorted(by.items()):
        print(f"  {kind:10} {pol:16} {len(tids)}")
    data = saved(run, alone.pct(0.99))
    with open(os.path.join(keep, "run.json"), "w") as f:
        json.dump(data, f)
    for phase in ("contended", "loading"):
        analyse(keep, data, phase, args.over)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
