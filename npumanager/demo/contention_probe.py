"""Where the device and the CPU went in a contention run, per app (bench/contention.py).

The background target (managed throughput >= 80 % of unmanaged) needs to know
*why* an app gets less: whether the driver gives it less device time than the
other background app, whether its executions wait queued, or whether its
process or the driver host lacks CPU. So each phase also records:

- **CPU per role** (cores): each app's process, npud, the driver host, and
  anything else this run started (the compile child), from the same
  ``/proc/PID/stat`` marks as :mod:`.contention_cpu` (no extra sampling during
  the phase);
- **CPU per driver-host thread group** (cores): its threads by kernel name
  (``npu-bg_N`` background step workers, burst threads, the event loop), so a
  background step's CPU is told apart from the serving around it;
- **device time per app** (managed runs, ``device=True``): every execution step
  the driver ran (``device.trace``, polled about once a second by an admin
  client), summed per uid: steps, seconds of the device busy for that app, mean
  step, and the per-uid latency from arrival to end (``device.stats``, the
  host's last 10 s) against the mean step: the rest is waiting.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from npumanager.demo.contention_cpu import CpuMark


def thread_stats(pid: int) -> dict[int, tuple[str, int, int, int]]:
    """tid -> (kernel name, utime, stime, minor faults) of each thread of ``pid`` from
    /proc (clock ticks; a thread that ends while read is left out)."""
    out: dict[int, tuple[str, int, int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        rest = stat.rpartition(")")[2].split()
        out[int(tid)] = (comm, int(rest[11]), int(rest[12]), int(rest[7]))
    return out


def thread_jiffies(pid: int) -> dict[str, int]:
    """utime + stime of each thread of ``pid`` grouped by its kernel name with a
    trailing ``_N`` or number dropped (``npu-bg_0`` and ``npu-bg_1`` -> ``npu-bg``)."""
    out: dict[str, int] = {}
    for comm, utime, stime, _ in thread_stats(pid).values():
        name = re.sub(r"[_-]?\d+$", "", comm) or comm
        out[name] = out.get(name, 0) + utime + stime
    return out


def roles_of(apps: Mapping[str, int], npud: int | None, hosts: list[int],
             pids: list[int], names: Mapping[int, str] | None = None) -> dict[int, str]:
    """pid -> role: an app's name, ``npud``, ``driver`` (a driver host; ``driver NAME``
    for each where ``names`` gives more than one host a name), or ``other`` (what else
    the run started: compile children, helpers)."""
    roles = {pid: "other" for pid in pids}
    several = names is not None and len(hosts) > 1
    for pid in hosts:
        roles[pid] = f"driver {names[pid]}" if several and names and pid in names else "driver"
    if npud is not None:
        roles[npud] = "npud"
    for name, pid in apps.items():
        roles[pid] = name
    return roles


def cpu_by_role(a: CpuMark, b: CpuMark, roles: Mapping[int, str],
                seconds: float) -> dict[str, float]:
    """Cores per role between two marks (the pids of ``b``; a pid new since ``a``
    counts from zero, as :func:`.contention_cpu.between` does)."""
    out: dict[str, float] = {}
    scale = a.tick / max(seconds, 1e-9)
    for pid, j in b.ours.items():
        role = roles.get(pid)
        if role is None:
            continue  # the bench process itself
        out[role] = out.get(role, 0.0) + max(0, j - a.ours.get(pid, 0)) * scale
    hosts = [v for k, v in out.items() if k.startswith("driver ")]
    if hosts:  # several hosts: their sum too, as one host's row
        out["driver"] = sum(hosts)
    return {k: round(v, 3) for k, v in sorted(out.items())}


def host_name(pid: int) -> str:
    """The driver name a host serves, from its command line (``... driver NAME ...``);
    ``NAME.background`` for a device's background lane (its host config says the lane:
    service/host_lanes.py), whose command line names the same driver."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        name = argv[argv.index(b"driver") + 1].decode()
    except (OSError, ValueError, IndexError):
        return str(pid)
    return name + ".background" if any(b'"lane": "background"' in a for a in argv) else name


class HostThreads:
    """The driver hosts serving ``runtime_dir`` ("": none) and their threads' CPU from
    now; :meth:`between` gives cores per thread group since."""

    def __init__(self, runtime_dir: str) -> None:
        from npumanager.testing.daemon import driver_hosts

        self.hosts = driver_hosts(runtime_dir) if runtime_dir else []
        #: pid -> the ``[[driver]]`` name it serves (``npu driver NAME``).
        self.names = {pid: host_name(pid) for pid in self.hosts}
        self._a = {pid: thread_jiffies(pid) for pid in self.hosts}

    def between(self, seconds: float) -> dict[str, float]:
        scale = 1 / os.sysconf("SC_CLK_TCK") / max(seconds, 1e-9)
        out: dict[str, float] = {}
        for pid, a in self._a.items():
            # Several hosts: each one's groups under its name (``reference-bg/npu-bg``).
            pre = f"{self.names[pid]}/" if len(self._a) > 1 else ""
            for k, v in thread_jiffies(pid).items():
                if v - a.get(k, 0) > 0:
                    out[pre + k] = round(out.get(pre + k, 0.0) + (v - a.get(k, 0)) * scale, 3)
        return dict(sorted(out.items()))


@dataclass
class DeviceUse:
    """One app's execution steps in a phase."""

    steps: int = 0
    busy_s: float = 0.0
    #: From device.stats at the phase's end: the app's executions' p50 latency (ms),
    #: arrival to end (their queueing and the host's serving included).
    latency_p50_ms: float = float("nan")
    #: The window's length (s).
    seconds: float = 1.0
    #: The 90th percentile of its steps' run time (ms): a step slowed by sharing a CPU.
    p90_ms: float = float("nan")

    def cell(self) -> str:
        if not self.steps:
            return "-"
        seconds = self.seconds
        mean = self.busy_s / self.steps * 1e3
        return (f"{self.busy_s / max(seconds, 1e-9):.2f} dev / {self.steps / seconds:.0f} "
                f"steps/s / {mean:.2f} ms (p90 {self.p90_ms:.2f}), lat {self.latency_p50_ms:.2f}")


@dataclass
class TracePoller:
    """Polls a driver host's ``device.trace`` (which keeps its step recording on) and
    keeps every step; :meth:`use` sums them per uid over a window."""

    socket_path: str
    interval_s: float = 1.0
    steps: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._cursor = 0
        self._client: Any = None
        self.poll()  # (recording starts with the first poll: before the phase does)
        self._thread = threading.Thread(target=self._run, name="contention-trace",
                                        daemon=True)
        self._thread.start()

    def _call(self, method: str, payload: bytes) -> Any:
        from npumanager.fds import close_fds
        from npumanager.hal.wire import SERVICE
        from npumanager.wire.client import SyncRpcClient

        if self._client is None:
            self._client = SyncRpcClient(self.socket_path, SERVICE,
                                         client_name="contention probe")
        got, fds = self._client.call(method, payload)
        close_fds(fds)
        return json.loads(got)

    def poll(self) -> None:
        try:
            got = self._call("device.trace", str(self._cursor).encode())
        except Exception as exc:  # the probe must not end the run
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self._cursor = int(got["cursor"])
        self.steps.extend(got["steps"])

    def snapshot_stats(self) -> None:
        with contextlib.suppress(Exception):
            self.stats = self._call("device.stats", b"recent")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.poll()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()

    def use(self, a: float, b: float, names: Mapping[int, str],
            stats: Mapping[str, Any] | None = None) -> dict[str, DeviceUse]:
        return device_use(self.steps, a, b, names, stats)


def device_use(steps: list[dict[str, Any]], a: float, b: float, names: Mapping[int, str],
               stats: Mapping[str, Any] | None = None) -> dict[str, DeviceUse]:
    """Per app (by uid through ``names``; an unknown uid by number) the steps that
    started in [a, b) (device.trace's records), with its latency from ``stats``
    (device.stats)."""
    out: dict[str, DeviceUse] = {}
    durs: dict[str, list[float]] = {}
    for s in steps:
        if a <= float(s["start"]) < b:
            name = names.get(int(s["uid"]), str(s["uid"]))
            u = out.setdefault(name, DeviceUse(seconds=b - a))
            u.steps += 1
            u.busy_s += float(s["dur"])
            durs.setdefault(name, []).append(float(s["dur"]))
    for name, ds in durs.items():
        ds.sort()
        out[name].p90_ms = ds[min(len(ds) - 1, int(len(ds) * 0.9))] * 1e3
    uids = (stats or {}).get("uids") or {}
    for uid, entry in uids.items():
        name = names.get(int(uid), str(uid))
        if name in out and "p50_ms" in entry:
            out[name].latency_p50_ms = float(entry["p50_ms"])
    return out


def driver_socket(runtime_dir: str, timeout: float = 20.0, device: str | None = None) -> str:
    """The reference driver's socket (the first listed, or ``device``'s), from npud's dump
    (admin)."""
    from npumanager.client import NpuManager

    deadline = time.monotonic() + timeout
    mgr = NpuManager(runtime_dir, client_name="contention probe")
    try:
        while True:
            for d in mgr.dump().get("devices") or []:
                if d.get("available") and d.get("socket_path") \
                        and device in (None, d.get("name")):
                    return str(d["socket_path"])
            if time.monotonic() > deadline:
                raise RuntimeError("no driver listed by npud")
            time.sleep(0.2)
    finally:
        mgr.close()


APPS = ("camera", "voice", "llm", "embedder", "loader")


def rows(results: list[Any]) -> list[tuple[str, ...]]:
    """The table's rows for what this module measured (RunResults)."""
    out: list[tuple[str, ...]] = []
    for phase in ("contended", "loading"):
        hosts = sorted({k for r in results for k in r.cpu_roles.get(phase, {})
                        if k.startswith("driver ")})
        for role in (*APPS, "npud", "driver", *hosts, "other"):
            cells = [f"{r.cpu_roles[phase][role]:.2f}" if role in r.cpu_roles.get(phase, {})
                     else "-" for r in results]
            if any(c != "-" for c in cells):
                out.append((f"CPU {phase}: {role} (cores)", *cells))
        groups = sorted({g for r in results for g in r.host_threads.get(phase, {})})
        for g in groups:
            cells = [f"{r.host_threads[phase][g]:.2f}" if g in r.host_threads.get(phase, {})
                     else "-" for r in results]
            out.append((f"CPU {phase}: driver thread {g}", *cells))
    names = [n for n in APPS if any(n in r.device for r in results)]
    for n in names:
        cells = []
        for r in results:
            use = r.device.get(n)
            cells.append("-" if use is None else use.cell())
        out.append((f"device {n}: busy / steps/s / mean step, latency p50 (ms)", *cells))
    return out
