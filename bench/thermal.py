"""Thermal reaction time: from a thermal status change to the unload requests reaching clients.

Three paths, measured in the same run:

1. in-process (baseline): write a sensor file of a fake sysfs tree ->
   ``ThermalMonitor.poll()`` -> ``ManagerState.handle(ThermalChanged)`` ->
   the AskUnload instructions. No sockets, no poll wait.
2. override: an admin ``override_thermal_status(SEVERE)`` call to a real npud
   (``npu serve`` in a subprocess) -> ``on_request_unload_model(THERMAL)``
   callbacks in N client connections. Timed until the LAST client has its
   callback (and the first, for reference).
3. sensor: a real npud polling a fake sysfs tree every ``--poll-interval``;
   the bench writes the zone's temp file (at a random phase of the poll
   cycle) and times from the moment the new value is in place (after the
   atomic rename: the write stands in for the kernel) until the last client's
   callback. This includes the wait
   for the next poll, so the target is p99 <= 10 ms + the poll interval; the
   table also shows the time past the poll interval.

Each client holds one BACKGROUND model (rank 1100 > PERCEPTIBLE), so SEVERE
asks every one of them to unload with reason THERMAL. Between trials the
clients report unloaded, the status returns to NONE and they load again.

    python bench/thermal.py [--clients 8] [--trials 40] [--poll-interval 0.1]
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from npumanager.client import ModelLoadRequest, ModelLoadRequestCallback, NpuManager
from npumanager.config import Config
from npumanager.constants import (
    LoadStatus,
    ModelPriority,
    Policy,
    RequestStatus,
    ThermalStatus,
    UnloadReason,
)
from npumanager.service import events as ev
from npumanager.service.policy import ManagerParams
from npumanager.service.state import ManagerState
from npumanager.testing import VirtualClock
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.fake_sysfs import FakeSysfs, Zone
from npumanager.thermal.monitor import ThermalMonitor

HOT_C, COOL_C = 85.0, 40.0
TARGET_MS = 10.0


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def row(name: str, xs: list[float], note: str = "") -> str:
    ms = [x * 1000 for x in xs]
    return (
        f"{name:<44} {len(ms):>4} {statistics.median(ms):>9.3f} {pct(ms, 99):>9.3f} "
        f"{max(ms):>9.3f}  {note}"
    )


# --- 1. in-process baseline ---------------------------------------------------------


def bench_in_process(root: Path, clients: int, trials: int) -> list[float]:
    fs = FakeSysfs(root)
    zone = fs.add_zone("soc", COOL_C)
    clock = VirtualClock()
    section = dict(Config().section("thermal"))
    section.update(sources=["sysfs"], sysfs_root=str(root))
    monitor = ThermalMonitor(section, clock, lambda: {})
    state = ManagerState(ManagerParams().with_policy(int(Policy.STATUS_QUO)))
    n = 0

    def handle(cls: type[ev.Event], **kw: Any) -> list[ev.Instruction]:
        nonlocal n
        n += 1
        return state.handle(cls(stimulus_id=f"b{n}", now=clock.now(), **kw))

    uids = [2000 + i for i in range(clients)]
    for uid in uids:
        handle(ev.ImportanceChanged, uid=uid, importance=300)
    out: list[float] = []
    for trial in range(trials):
        for uid in uids:
            handle(ev.RequestLoad, uid=uid, pid=uid, conn=uid, request_id=trial,
                   priority=ModelPriority.NORMAL)  # fmt: skip
            handle(ev.ModelLoaded, uid=uid, conn=uid, request_id=trial)
        clock.advance(0.001)
        fs.set_temp(zone, HOT_C)
        t0 = time.monotonic()  # the sensor reads hot from here (the write is the kernel's job)
        status = monitor.poll()
        asked = [i for i in handle(ev.ThermalChanged, status=status) if isinstance(i, ev.AskUnload)]
        out.append(time.monotonic() - t0)
        assert len(asked) == clients and status == ThermalStatus.SEVERE, (status, asked)
        for uid in uids:
            handle(ev.ModelUnloaded, uid=uid, conn=uid, request_id=trial)
        fs.set_temp(zone, COOL_C)
        clock.advance(0.001)
        handle(ev.ThermalChanged, status=monitor.poll())
    return out


# --- 2 and 3: a real npud ----------------------------------------------------------------


class Client(ModelLoadRequestCallback):
    """One connection holding one BACKGROUND model; records when the unload ask arrives."""

    def __init__(self, runtime_dir: Path, index: int, on_ask: Callable[[], None]) -> None:
        self.mgr = NpuManager(runtime_dir)
        self.on_ask = on_ask
        # Requests are keyed by (uid, id) and every client here is the same uid: distinct ids.
        self.next_id = index * 1_000_000 + 1
        self.req: ModelLoadRequest | None = None
        self.listener: Any = None
        self.granted = threading.Event()
        self.done = threading.Event()
        self.asked_at: float | None = None

    def load(self) -> None:
        self.granted.clear()
        self.done.clear()
        self.asked_at = None
        self.req = ModelLoadRequest(id=self.next_id, priority=ModelPriority.BACKGROUND)
        self.next_id += 1
        self.listener = self.mgr.request_can_load_model(self.req, self)

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        if status == LoadStatus.CAN_LOAD_NOW:
            self.granted.set()

    def on_request_unload_model(self, request: Any, reason: Any) -> None:
        self.asked_at = time.monotonic()
        assert reason == UnloadReason.THERMAL, reason
        self.on_ask()

    def on_model_load_request_complete(self, request: Any, status: Any) -> None:
        assert status == RequestStatus.COMPLETE, status
        self.done.set()

    def finish_loaded(self) -> None:
        assert self.req is not None
        self.listener.notify_model_loaded(self.req)

    def unload(self) -> None:
        assert self.req is not None
        self.listener.notify_model_unloaded(self.req)
        if not self.done.wait(5):
            raise TimeoutError("no COMPLETE after unload")


class Fleet:
    def __init__(self, runtime_dir: Path, n: int) -> None:
        self.all_asked = threading.Event()
        self._lock = threading.Lock()
        self._count = 0
        self.n = n
        self.clients = [Client(runtime_dir, i, self._asked) for i in range(n)]

    def _asked(self) -> None:
        with self._lock:
            self._count += 1
            if self._count == self.n:
                self.all_asked.set()

    def load_all(self) -> None:
        self._count = 0
        self.all_asked.clear()
        for c in self.clients:
            c.load()
        for c in self.clients:
            if not c.granted.wait(10):
                raise TimeoutError("a client was not granted")
            c.finish_loaded()

    def wait_asked(self, t0: float) -> tuple[float, float]:
        if not self.all_asked.wait(10):
            raise TimeoutError(f"only {self._count}/{self.n} clients were asked to unload")
        times = [c.asked_at for c in self.clients if c.asked_at is not None]
        return min(times) - t0, max(times) - t0

    def since_decision(self, admin: NpuManager) -> float:
        """Last callback minus the moment npud decided (its decision log's ``at``: the
        ThermalChanged event's time, taken right after the poll that saw the heat). npud's
        clock and ours are both CLOCK_MONOTONIC, so they compare across processes."""
        c = self.clients[0]
        assert c.req is not None
        story = admin.story(admin.uid, c.req.id)
        at = [d["at"] for d in story if d["what"] == "asked to unload"][-1]
        last = max(x.asked_at for x in self.clients if x.asked_at is not None)
        return float(last - at)

    def unload_all(self) -> None:
        for c in self.clients:
            c.unload()

    def close(self) -> None:
        for c in self.clients:
            c.mgr.close()


def wait_status(admin: NpuManager, status: ThermalStatus, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while admin.thermal_status().status != status:
        if time.monotonic() > deadline:
            raise TimeoutError(f"npud did not reach {status.name}")
        time.sleep(0.002)


def bench_daemon(
    root: Path, runtime_dir: Path, clients: int, trials: int, poll_s: float
) -> dict[str, list[float]]:
    fs = FakeSysfs(root)
    zone: Zone = fs.add_zone("soc", COOL_C)
    config = {
        "policy": {"name": "STATUS_QUO"},
        "thermal": {"sources": ["sysfs"], "sysfs_root": str(root), "poll_interval_s": poll_s},
    }
    keys = ("ov_first", "ov_last", "s_first", "s_last", "s_after_poll")
    res: dict[str, list[float]] = {k: [] for k in keys}
    with DaemonProcess(runtime_dir, config=config) as npud, NpuManager(runtime_dir) as admin:
        fleet = Fleet(runtime_dir, clients)
        try:
            for _ in range(trials):  # override path
                fleet.load_all()
                t0 = time.monotonic()
                admin.override_thermal_status(ThermalStatus.SEVERE)
                first, last = fleet.wait_asked(t0)
                res["ov_first"].append(first)
                res["ov_last"].append(last)
                fleet.unload_all()
                admin.reset_thermal_status()
            for _ in range(trials):  # sensor path
                fleet.load_all()
                time.sleep(random.uniform(0, poll_s))  # a random phase of the poll cycle
                fs.set_temp(zone, HOT_C)  # atomic rename: the sensor reads hot from here on
                t0 = time.monotonic()
                first, last = fleet.wait_asked(t0)
                res["s_first"].append(first)
                res["s_last"].append(last)
                res["s_after_poll"].append(fleet.since_decision(admin))
                fleet.unload_all()
                fs.set_temp(zone, COOL_C)
                wait_status(admin, ThermalStatus.NONE)
        finally:
            fleet.close()
        if npud.proc is not None and npud.proc.poll() is not None:
            raise RuntimeError(f"npud died:\n{npud.output}")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--poll-interval", type=float, default=0.1, help="npud's sensor poll (s)")
    ap.add_argument("--quick", action="store_true", help="5 trials, 4 clients")
    args = ap.parse_args(argv)
    if args.quick:
        args.trials, args.clients = 5, 4
    # The monitor logs every status change; hundreds of trials would flood stderr.
    logging.getLogger("npumanager.thermal").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="npu-bt-", dir="/tmp") as tmp:
        base = Path(tmp)
        rt = base / "rt"
        rt.mkdir()
        rt.chmod(0o755)
        inproc = bench_in_process(base / "sysfs-a", args.clients, max(args.trials, 200))
        d = bench_daemon(base / "sysfs-b", rt, args.clients, args.trials, args.poll_interval)
    poll_ms = args.poll_interval * 1000
    print(f"thermal reaction: {args.clients} clients each holding a BACKGROUND model; "
          f"SEVERE asks all to unload (THERMAL)")  # fmt: skip
    print(f"{'path':<44} {'n':>4} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    print(row("in-process: file -> poll -> state (baseline)", inproc))
    print(row("override -> first client callback", d["ov_first"]))
    ov_ok = pct(d["ov_last"], 99) * 1000 <= TARGET_MS
    print(row("override -> last client callback", d["ov_last"],
              f"target p99 <= {TARGET_MS:.0f} ms: {'ok' if ov_ok else 'MISSED'}"))  # fmt: skip
    print(row("sensor file -> first client callback", d["s_first"], f"poll {poll_ms:.0f} ms"))
    s_ok = pct(d["s_last"], 99) * 1000 <= TARGET_MS + poll_ms
    verdict = "ok" if s_ok else "MISSED"
    print(row("sensor file -> last client callback", d["s_last"],
              f"target p99 <= {TARGET_MS:.0f} + {poll_ms:.0f} ms: {verdict}"))  # fmt: skip
    after_ok = pct(d["s_after_poll"], 99) * 1000 <= TARGET_MS
    print(row("poll saw it -> last client callback", d["s_after_poll"],
              f"target p99 <= {TARGET_MS:.0f} ms: {'ok' if after_ok else 'MISSED'}"))  # fmt: skip
    ratio = statistics.median(d["ov_last"]) / statistics.median(inproc)
    print(f"override path / in-process baseline (p50): {ratio:.1f}x")
    return 0 if ov_ok and s_ok and after_ok else 1


if __name__ == "__main__":
    sys.exit(main())
