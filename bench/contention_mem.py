"""Where the contention run's peak memory goes: the machine's and each process's.

Runs bench/contention.py's runs (``--only``, default unmanaged and managed) with a
memory sampler that, at every new peak of the machine's memory in use
(``MemTotal - MemAvailable``, sampled every 25 ms as the bench does), also records
/proc/meminfo's AnonPages and Shmem (memfds, /dev/shm: not reclaimable, so counted as
used) and each process's proportional set size split into anonymous, file and shmem
pages (``/proc/PID/smaps_rollup``), by role: the apps, npud, the driver host, its
compile child. It prints the breakdown at each run's peak and the peak per phase.

Usage: python bench/contention_mem.py [--quick] [--only unmanaged,managed,VARIANT]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from contention import VARIANTS

from npumanager.demo import contention as cmod
from npumanager.demo import contention_memory as cmem
from npumanager.demo.contention import ContentionRun, Timing, build_models, driver_config

MiB = 2**20


def meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            out[key] = int(rest.split()[0]) * 1024
    return out


def role(pid: int, apps: dict[int, str]) -> str:
    if pid in apps:
        return apps[pid]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
    for key, kind in (("compile_worker", "compile child"), (" driver ", "driver host"),
                      ("serve", "npud")):
        if key in text:
            return kind
    return "other"


def pss(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


class Sampler(cmem.MemorySampler):
    """The bench's sampler, plus a breakdown at each new peak (at most every 100 ms)."""

    current: ContentionRun | None = None

    def __init__(self) -> None:
        base = meminfo()
        self.base_info = base
        self.breakdown: dict[str, Any] = {}
        self.phase_peak: dict[str, float] = {}
        self._last = 0.0
        super().__init__()

    def _run(self) -> None:
        me, n = os.getpid(), 0
        while not self._stop.wait(0.025):
            used = cmem._mem_used()
            run = Sampler.current
            phase = "start"
            if run is not None:
                now = time.monotonic()
                for name, (a, b) in run.windows.items():
                    if a <= now:
                        phase = name if now < b else f"after {name}"
            self.phase_peak[phase] = max(self.phase_peak.get(phase, 0.0),
                                         (used - self.base) / MiB)
            if used > self.peak:
                self.peak = used
                if time.monotonic() - self._last > 0.1:
                    self._last = time.monotonic()
                    self.breakdown = self.snapshot(me, run, phase)
            n += 1
            if n % 10 == 0:
                self.rss_peak = max(self.rss_peak,
                                    sum(cmem._rss(p) for p in cmem.descendants(me)))

    def snapshot(self, me: int, run: ContentionRun | None, phase: str) -> dict[str, Any]:
        info = meminfo()
        apps = {p.pid: n for n, p in run.procs.items()} if run is not None else {}
        roles: dict[str, dict[str, int]] = {}
        for pid in cmem.descendants(me):
            r = role(pid, apps)
            got = roles.setdefault(r, {})
            for k, v in pss(pid).items():
                got[k] = got.get(k, 0) + v
        return {"phase": phase, "used": (cmem._mem_used() - self.base) / MiB,
                "anon": (info["AnonPages"] - self.base_info["AnonPages"]) / MiB,
                "shmem": (info["Shmem"] - self.base_info["Shmem"]) / MiB, "roles": roles}


class MemRun(ContentionRun):
    def run(self) -> Any:
        Sampler.current = self
        return super().run()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="unmanaged,managed")
    args = ap.parse_args()
    timing = Timing.quick() if args.quick else Timing()
    models = build_models()
    samplers: list[Sampler] = []

    def make() -> Sampler:
        s = Sampler()
        samplers.append(s)
        return s

    cmod.MemorySampler = make  # type: ignore[assignment,misc]
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        managed = name != "unmanaged"
        knobs = dict(VARIANTS.get(name, {}))
        for k in ("bursts", "batch_bursts", "embedder_inflight"):
            knobs.pop(k, None)
        r = MemRun(name, managed, timing, models, driver_config(**knobs) if managed else None
                   ).run()
        s = samplers[-1]
        b = s.breakdown
        print(f"\n{name}: peak {r.mem_peak_mib:.0f} MiB over idle (RSS sum {r.rss_peak_mib:.0f})"
              f"; at the peak ({b.get('phase')}): anon +{b.get('anon', 0):.0f}, shmem "
              f"+{b.get('shmem', 0):.0f} MiB")
        print("  peak per phase: " + ", ".join(f"{k} {v:.0f}" for k, v in s.phase_peak.items()))
        print(f"  {'role':14} {'Pss':>6} {'anon':>6} {'file':>6} {'shmem':>6} {'Rss':>6} (MiB)")
        for r_, v in sorted(b.get("roles", {}).items(), key=lambda x: -x[1].get("Pss", 0)):
            print(f"  {r_:14} " + " ".join(f"{v.get(k, 0) / MiB:6.0f}" for k in (
                "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Rss")))
        for e in r.errors:
            print(f"  error: {e}")
    threading.Event().wait(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
