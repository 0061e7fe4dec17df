"""Where a background load's CPU goes: user vs kernel time, and what the kernel time is.

Runs one managed contention run (bench/contention.py's apps, npud and driver; a
variant's keys with ``--variant``) through its loading phase only (the camera, voice,
LLM and embedder, and the app loading a BACKGROUND model again and again) and reports:

* CPU per thread group of the run's processes over the phase (``/proc/PID/task/TID/stat``
  marks at its start and end): user and system cores, minor page faults per second. The
  driver host's threads by kernel name (``npu-bgcompile``: a background model's session
  build; ``npu-bg``: step workers), the compile child's (``child:``), the apps' and npud's;
* what the kernel time of the load work is: a machine-wide ``perf record -g`` of
  ``cpu-clock`` at ~1 kHz over the phase, each kernel-mode sample of the compile child
  and the session build put down to what entered the kernel (a page fault, a syscall by
  name, an interrupt) and the innermost function (``clear_page_erms``: a fresh page
  zeroed; ``unmap_page_range``: an ``munmap``);
* the load's stages, per load from the same samples' timestamps (CLOCK_MONOTONIC, the
  loader's events' clock): the grant (the loader app's wait for npud's answer), until the
  compile child's first sample, the child's compile (first to last sample), the host's
  session build (to the build thread's last sample), and the rest until the app had it.

Why: in the loading phase's slow camera frames a normal-priority thread waits runnable
for a CPU that a SCHED_IDLE thread holds (bench/README.md: "What the camera's path sleeps on");
this kernel is PREEMPT_NONE, so a SCHED_IDLE thread in kernel mode keeps its CPU until
it returns to user mode or reaches a cond_resched: its kernel time is where the camera
can wait up to a tick. Run under /work/notes/cpu-exclusive (perf costs a few %).
Usage: python bench/load_cpu.py [--variant NAME] [--loading-s 15] [--no-perf]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from contention import SECOND_HOST, VARIANTS, npud_config

from npumanager.demo import contention_probe
from npumanager.demo.contention import ContentionRun, Timing, build_models, camera_cell
from npumanager.demo.contention_memory import descendants

#: What entered the kernel, by the outermost of these in a kernel call chain.
ENTRIES = (
    ("exc_page_fault", "page fault"),
    ("asm_sysvec_", "interrupt"),
    ("asm_common_interrupt", "interrupt"),
    ("ret_from_fork", "kernel thread"),
)
_SYS = re.compile(r"__(?:x64|do)_sys_(\w+)")


def kernel_entry(frames: list[str]) -> str:
    """What a kernel-mode sample's call chain (innermost first) entered the kernel for:
    ``page fault``, ``sys NAME`` (the function ``do_syscall_64`` called; ``+fault``
    where a page fault is inside the syscall: a copy into fresh memory), ``interrupt``,
    or ``other``."""
    fault = any(f == "handle_mm_fault" for f in frames)
    if "do_syscall_64" in frames:
        i = frames.index("do_syscall_64")
        name = frames[i - 1] if i > 0 else "?"
        m = _SYS.match(name)
        return f"sys {m.group(1) if m else name}" + ("+fault" if fault else "")
    for f in reversed(frames):
        for key, what in ENTRIES:
            if f.startswith(key):
                return what
    return "other"


def thread_stat(pid: int) -> dict[int, tuple[str, int, int, int]]:
    """tid -> (comm, utime, stime, minflt) of each thread of ``pid``
    (demo/contention_probe.thread_stats, which the bench's CPU probe reads too)."""
    return contention_probe.thread_stats(pid)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class LoadCpuRun(ContentionRun):
    """The contention run with the loading phase marked and (optionally) sampled."""

    def __init__(self, *a: Any, keep: str, perf: bool = True, **k: Any) -> None:
        super().__init__(*a, **k)
        self.keep, self.perf = keep, perf
        #: tid -> (group label, kernel name) of every thread seen during the phase.
        self.labels: dict[int, tuple[str, str]] = {}
        self.marks: list[dict[int, tuple[str, int, int, int]]] = []
        self.seconds = 0.0

    def label_threads(self) -> list[int]:
        apps = {p.pid: n for n, p in self.procs.items()}
        pids = descendants(os.getpid())
        for pid in pids:
            cmd = _cmdline(pid)
            kind = apps.get(pid) or ("child" if "compile_worker" in cmd else "host"
                                     if " driver " in cmd else "npud" if " serve" in cmd
                                     else "other")
            for tid, (comm, *_) in thread_stat(pid).items():
                name = re.sub(r"[_-]?\d+$", "", comm) or comm
                group = name if kind == "host" else f"{kind}:{name}" if kind == "child" else kind
                self.labels.setdefault(tid, (group, comm))
        return pids

    def mark(self, pids: list[int]) -> dict[int, tuple[str, int, int, int]]:
        out: dict[int, tuple[str, int, int, int]] = {}
        for pid in pids:
            out.update(thread_stat(pid))
        return out

    def phase(self, name: str, seconds: float) -> None:
        if name != "loading":
            super().phase(name, seconds)
            return
        perf = None
        if self.perf:
            data = os.path.join(self.keep, "loading.data")
            perf = subprocess.Popen(
                ["perf", "record", "-a", "-g", "-k", "mono", "-F", "997", "-e", "cpu-clock",
                 "-o", data], stdout=subprocess.DEVNULL,
                stderr=open(data + ".log", "w"))  # noqa: SIM115
            time.sleep(1.0)  # perf's start stalls the machine for a moment: not in the phase
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                self.label_threads()

        a = self.mark(self.label_threads())
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        try:
            super().phase(name, seconds)
        finally:
            self.seconds = time.monotonic() - t0
            stop.set()
            sampler.join()
            self.marks = [a, self.mark(self.label_threads())]
            if perf is not None:
                perf.send_signal(signal.SIGINT)
                perf.wait(60)


def cpu_table(run: LoadCpuRun) -> list[str]:
    a, b = run.marks
    tick = os.sysconf("SC_CLK_TCK") * max(run.seconds, 1e-9)
    by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for tid, (_, u, s, f) in b.items():
        u0, s0, f0 = a[tid][1:] if tid in a else (0, 0, 0)
        g = by[run.labels.get(tid, ("?", ""))[0]]
        g[0] += (u - u0) / tick
        g[1] += (s - s0) / tick
        g[2] += (f - f0) / run.seconds
    lines = [f"{'thread group':28} {'user':>6} {'system':>6} {'sys %':>6} {'minflt/s':>9}"]
    for g, (u, s, f) in sorted(by.items(), key=lambda x: -(x[1][0] + x[1][1])):
        if u + s >= 0.005:
            lines.append(f"{g:28} {u:6.3f} {s:6.3f} {100 * s / max(u + s, 1e-9):5.0f}% "
                         f"{f:9.0f}")
    return lines


def read_samples(data: str) -> list[tuple[int, float, bool, list[str]]]:
    """(tid, time, kernel mode, call chain innermost first) of each perf sample."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "tid,time,ip,sym"],
                         capture_output=True, text=True, check=False).stdout
    samples: list[tuple[int, float, bool, list[str]]] = []
    for block in out.split("\n\n"):
        lines = [ln for ln in block.strip("\n").split("\n") if ln.strip()]
        if not lines:
            continue
        head = lines[0].split()
        try:
            tid, t = int(head[0]), float(head[1].rstrip(":"))
        except (ValueError, IndexError):
            continue
        frames, kernel = [], False
        for i, ln in enumerate(lines[1:]):
            parts = ln.split(None, 1)
            if i == 0:
                kernel = parts[0].startswith("ffffffff")
            if parts[0].startswith("ffffffff"):
                frames.append(parts[1].split("+")[0] if len(parts) > 1 else "?")
        samples.append((tid, t, kernel, frames))
    return samples


def kernel_table(run: LoadCpuRun, samples: list[tuple[int, float, bool, list[str]]]
                 ) -> list[str]:
    """The load work's kernel samples by what entered the kernel, with the innermost
    functions of each."""
    lines = []
    for who in ("child", "npu-bgcompile", "loader"):
        tids = {t for t, (g, _) in run.labels.items()
                if g.startswith(who + ":") or g == who}
        mine = [s for s in samples if s[0] in tids]
        kern = [s for s in mine if s[2]]
        if not mine:
            continue
        lines.append(f"{who}: {len(mine)} samples, {len(kern)} in the kernel "
                     f"({100 * len(kern) / len(mine):.0f} %)")
        entries: Counter[str] = Counter()
        leaves: dict[str, Counter[str]] = defaultdict(Counter)
        for _, _, _, frames in kern:
            e = kernel_entry(frames)
            entries[e] += 1
            leaves[e][frames[0] if frames else "?"] += 1
        for e, n in entries.most_common(8):
            top = ", ".join(f"{f} {c}" for f, c in leaves[e].most_common(3))
            lines.append(f"  {e:24} {n:6} ({100 * n / len(mine):4.1f} % of its samples): {top}")
    return lines


def stage_table(run: LoadCpuRun, samples: list[tuple[int, float, bool, list[str]]]
                ) -> list[str]:
    child = {t for t, (g, _) in run.labels.items() if g.startswith("child:")}
    build = {t for t, (g, _) in run.labels.items() if g == "npu-bgcompile"}
    times: dict[str, list[float]] = {"child": [], "build": []}
    for tid, t, _, _ in samples:
        if tid in child:
            times["child"].append(t)
        elif tid in build:
            times["build"].append(t)
    for v in times.values():
        v.sort()
    spans, start = [], None
    for e in run.events.find("loader"):
        if e["ev"] == "loading":
            start = e["t"]
        elif e["ev"] == "loaded" and start is not None:
            spans.append((start, e["t"], float(e.get("grant_ms") or 0.0) / 1000))
            start = None
    rows: dict[str, list[float]] = defaultdict(list)
    for a, b, grant in spans:
        c = [t for t in times["child"] if a <= t <= b]
        h = [t for t in times["build"] if a <= t <= b]
        if not c:
            continue
        first, last = c[0], c[-1]
        built = max([t for t in h if t > last] or [last])
        rows["grant"].append(grant)
        rows["grant to the child's first sample"].append(first - a - grant)
        rows["child compile (first to last sample)"].append(last - first)
        rows["host session build (to its last sample)"].append(built - last)
        rows["until the app had it"].append(b - built)
        rows["whole load"].append(b - a)
    if not rows:
        return ["no load with compile-child samples"]
    lines = [f"{len(rows['whole load'])} loads; ms, median (min-max):"]
    for k, v in rows.items():
        lines.append(f"  {k:42} {1e3 * statistics.median(v):7.1f} "
                     f"({1e3 * min(v):.1f}-{1e3 * max(v):.1f})")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", default="managed")
    ap.add_argument("--loading-s", type=float, default=15.0)
    ap.add_argument("--no-perf", action="store_true", help="only the /proc marks")
    ap.add_argument("--keep", default="")
    args = ap.parse_args()
    knobs = dict(VARIANTS[args.variant])
    for k in ("bursts", "batch_bursts", "embedder_inflight", "camera_spin_us"):
        knobs.pop(k, None)
    # The protected rows (default-auto, rt+app+bg-host+*) as bench/contention.py runs them:
    # npud's --protect-foreground, the camera's FIFO thread asked of npud.
    protect = knobs.pop("protect_foreground", "off")
    cam_rt = int(knobs.pop("camera_realtime", 0))
    devices = {app: SECOND_HOST for app in knobs.get("own_host", [])}
    keep = args.keep or tempfile.mkdtemp(prefix="npu-loadcpu-")
    os.makedirs(keep, exist_ok=True)
    timing = dataclasses.replace(Timing(), loading_s=args.loading_s)
    cfg = npud_config(knobs)
    if cam_rt and protect == "off":
        cfg["manager"]["app_rt_priority"] = cam_rt
    run = LoadCpuRun(args.variant, True, timing, build_models(), cfg,
                     phases=("loading",), devices=devices, keep=keep, perf=not args.no_perf,
                     protect_foreground=protect,
                     app_knobs={"camera": {"realtime": cam_rt}} if cam_rt else None)
    r = run.run()
    for e in r.errors:
        print(f"error: {e}")
    print(f"{args.variant}: loading phase {run.seconds:.1f} s, camera "
          f"{camera_cell(r.camera.get('loading'))}, load p50 {r.loads.pct(0.5):.0f} ms "
          f"({len(r.loads.ms)} loads)")
    # What the load costs the other background apps: their rates over the same phase.
    print(f"  while loading: LLM {r.llm_tokens_s_loading:.0f} tokens/s, embedder "
          f"{r.embedder_items_s_loading:.0f} items/s")
    print("\n".join(cpu_table(run)))
    if not args.no_perf:
        samples = read_samples(os.path.join(keep, "loading.data"))
        print("\n".join(kernel_table(run, samples)))
        print("\n".join(stage_table(run, samples)))
    return 1 if r.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
