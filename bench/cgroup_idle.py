"""Micro-test: how long a normal thread that wakes every frame waits for its CPU beside
background spinners, per way of lowering the spinners (issue #15).

A "camera" process wakes every ``--period-ms`` (33), burns ``--burn-ms`` (1) of CPU and
sleeps to its next deadline; its lateness (wake-up time less the deadline) is the wait the
kernel made it do. Beside it, one busy-loop process per CPU (the background steps) runs:

* ``none``: no spinners (the floor);
* ``idle-root``: SCHED_IDLE spinners in the root cpu cgroup (the driver's default so far);
* ``cg-idle``: normal-policy spinners in a top-level cgroup with ``cpu.idle = 1``;
* ``cg-idle+sched-idle``: SCHED_IDLE spinners in that cgroup (what the driver now does);
* ``nested``: SCHED_IDLE spinners in a ``cpu.idle`` group nested in a normal group (the
  idle-ness is compared at the level where both sides meet: here the normal group).

Variants are interleaved over ``--rounds``. The spinners' CPU share shows the background
still gets the idle time. Needs root and the cgroup-v1 cpu controller with ``cpu.idle``
(``--root``); run under /work/notes/cpu-exclusive.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CAMERA = r"""
import json, sys, time
period, burn, n = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
late = []
t = time.monotonic() + period
for _ in range(n):
    now = time.monotonic()
    if t > now:
        time.sleep(t - now)
    late.append(time.monotonic() - t)
    end = time.monotonic() + burn
    while time.monotonic() < end:
        pass
    t += period
print(json.dumps(late))
"""

# --pingpong: the camera sends each frame to a "driver" process (normal priority too),
# which burns ``burn`` and answers with the time it answered; what is measured is the
# camera's wait from that answer to running again (the stall bench/contention_trace.py
# found: the app's thread runnable behind a background step right after the answer).
PINGPONG = r"""
import json, os, struct, sys, time
period, burn, n = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
req_r, req_w = os.pipe()
ans_r, ans_w = os.pipe()
if os.fork() == 0:
    os.close(req_w)
    os.close(ans_r)
    while True:
        if not os.read(req_r, 8):
            os._exit(0)
        end = time.monotonic() + burn / 2
        while time.monotonic() < end:
            pass
        os.write(ans_w, struct.pack("d", time.monotonic()))
os.close(req_r)
os.close(ans_w)
late = []
t = time.monotonic() + period
for _ in range(n):
    now = time.monotonic()
    if t > now:
        time.sleep(t - now)
    end = time.monotonic() + burn / 2
    while time.monotonic() < end:
        pass
    os.write(req_w, b"frame...")
    answered = struct.unpack("d", os.read(ans_r, 8))[0]
    late.append(time.monotonic() - answered)
    t += period
os.close(req_w)
os.wait()
print(json.dumps(late))
"""

SPIN = "while True: pass"

VARIANTS = ("none", "idle-root", "cg-idle", "cg-idle+sched-idle", "nested")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_s() -> float:
    """CPU time the whole machine spent busy (every CPU, all but idle and iowait)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def make_group(root: Path, name: str, idle: bool) -> Path:
    g = root / name
    g.mkdir(exist_ok=True)
    (g / "cpu.idle").write_text("1" if idle else "0")
    return g


def run_variant(variant: str, root: Path, args: argparse.Namespace) -> dict[str, float]:
    tag = f"npubench-{os.getpid()}"
    groups: list[Path] = []
    target: Path | None = None
    if variant in ("cg-idle", "cg-idle+sched-idle"):
        target = make_group(root, tag + "-idle", True)
        groups = [target]
    elif variant == "nested":
        outer = make_group(root, tag + "-outer", False)
        target = make_group(outer, "idle", True)
        groups = [target, outer]
    spinners: list[subprocess.Popen[bytes]] = []
    if variant != "none":
        for _ in range(os.cpu_count() or 1):
            p = subprocess.Popen([sys.executable, "-c", SPIN])
            if variant != "cg-idle":
                os.sched_setscheduler(p.pid, os.SCHED_IDLE, os.sched_param(0))
            if target is not None:
                (target / "tasks").write_text(str(p.pid))
            spinners.append(p)
    frames = int(args.seconds * 1000 / args.period_ms)
    t0 = time.monotonic()
    c0 = [cpu_s(p.pid) for p in spinners]
    b0 = busy_s()
    out = subprocess.run([sys.executable, "-c", PINGPONG if args.pingpong else CAMERA,
                          str(args.period_ms / 1e3),
                          str(args.burn_ms / 1e3), str(frames)],
                         check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - t0
    spin = sum(cpu_s(p.pid) - c for p, c in zip(spinners, c0, strict=True)) / wall
    # Everyone else's CPU (the camera's own ~3 % included): a run another user disturbed.
    other = (busy_s() - b0) / wall - spin
    for p in spinners:
        p.kill()
        p.wait()
    for g in groups:
        for _ in range(50):
            try:
                g.rmdir()
                break
            except OSError:
                time.sleep(0.05)
    late = sorted(x * 1e3 for x in json.loads(out))
    n = len(late)
    return {"frames": n, "p50": late[n // 2], "p99": late[min(n - 1, int(n * 0.99))],
            "max": late[-1], "over_1ms": sum(1 for x in late if x > 1.0),
            "spinner_cores": spin, "other_cores": other}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/sys/fs/cgroup/cpu")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--period-ms", type=float, default=33.0)
    ap.add_argument("--burn-ms", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default=",".join(VARIANTS))
    ap.add_argument("--pingpong", action="store_true",
                    help="measure the camera's wait after a driver process answers it")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = Path(args.root)
    if not (root / "cpu.idle").exists() and not any(root.glob("*/cpu.idle")):
        sys.exit(f"no cpu.idle under {root}: needs the cgroup cpu controller with cpu.idle")
    only = [v for v in args.only.split(",") if v]
    results: dict[str, list[dict[str, float]]] = {v: [] for v in only}
    for _ in range(args.rounds):
        for v in only:
            results[v].append(run_variant(v, root, args))
    if args.json:
        print(json.dumps(results))
        return
    print(f"kernel {os.uname().release}, {os.cpu_count()} CPUs, camera every "
          f"{args.period_ms:g} ms burning {args.burn_ms:g} ms, {args.seconds:g} s x "
          f"{args.rounds} rounds; " + ("its wait from the driver's answer to running (ms)"
                                       if args.pingpong else "lateness of its wake-up (ms)"))
    print(f"{'spinners':22} {'frames':>6} {'p50':>6} {'p99':>6} {'max':>6} {'>1ms':>5} "
          f"{'spin cores':>10} {'others':>6}")
    for v, rs in results.items():
        for r in rs:
            print(f"{v:22} {r['frames']:6d} {r['p50']:6.3f} {r['p99']:6.3f} {r['max']:6.3f} "
                  f"{r['over_1ms']:5d} {r['spinner_cores']:10.2f} {r['other_cores']:6.2f}")


if __name__ == "__main__":
    main()
