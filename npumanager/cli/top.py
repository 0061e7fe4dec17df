"""`npu top`: a live view of npud and its devices (`--once` prints one frame).

Per device: budget used, channels busy, thermal status with a sparkline of the
temperature; a table of requests (uid or unit name, request, size, priority,
state, age, memory); per uid the executions per second and p50/p99 latency
(from each driver's ``device.stats``, admin only). Refreshes every
``--interval`` seconds until Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from typing import Any

from npumanager.cli import fmt
from npumanager.cli.main import add_runtime_dir, positive_float

SPARK = "▁▂▃▄▅▆▇█"
THERMAL_STYLE = {"NONE": "green", "LIGHT": "green", "MODERATE": "yellow", "SEVERE": "orange1",
                 "CRITICAL": "red", "EMERGENCY": "bold red", "SHUTDOWN": "bold red"}
STATE_STYLE = {"loaded": "green", "granted": "cyan", "waiting": "yellow",
               "unload_requested": "magenta"}


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "top", help="live view of npud: devices, requests, per-uid rates",
        description="A live view of npud: per device the budget used, channels busy and "
        "thermal status with a sparkline; every request; per uid executions per second and "
        "p50/p99 latency. Ctrl-C quits.")
    add_runtime_dir(p)
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--interval", metavar="S", type=positive_float, default=1.0,
                   help="seconds between refreshes (default 1)")
    p.set_defaults(func=main)


def sparkline(values: list[float], lo: float | None = None, hi: float | None = None) -> str:
    """Values as block characters, scaled between ``lo`` and ``hi`` (default: their range)."""
    if not values:
        return ""
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    span = hi - lo
    if span <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[max(0, min(len(SPARK) - 1, int((v - lo) / span * len(SPARK))))]
                   for v in values)


def bar(used: float, total: float, width: int = 10) -> str:
    if total <= 0:
        return "·" * width
    n = max(0, min(width, round(used / total * width)))
    return "█" * n + "·" * (width - n)


class Sampler:
    """Collects frames: npud's dump, each driver's stats, and the temperature history."""

    def __init__(self, runtime_dir: str | None, history: int = 40) -> None:
        from npumanager.client import NpuManager

        self.mgr = NpuManager(runtime_dir)
        self.temps: dict[str, deque[float]] = {}
        self.history = history
        self._drivers: dict[str, Any] = {}

    def close(self) -> None:
        for c in self._drivers.values():
            c.close()
        self.mgr.close()

    def driver_stats(self, device: dict[str, Any]) -> dict[str, Any] | None:
        import json

        from npumanager.errors import NpuError
        from npumanager.fds import close_fds
        from npumanager.hal.wire import SERVICE
        from npumanager.wire.client import SyncRpcClient

        name, path = str(device.get("name")), str(device.get("socket_path") or "")
        if not device.get("available") or not path:
            return None
        try:
            client = self._drivers.get(name)
            if client is None:
                client = self._drivers[name] = SyncRpcClient(path, SERVICE, client_name="npu top")
            payload, fds = client.call("device.stats", b"")
            close_fds(fds)
            out: dict[str, Any] = json.loads(payload)
            return out
        except NpuError as exc:
            dead = self._drivers.pop(name, None)
            if dead is not None and "PermissionDenied" not in type(exc).__name__:
                dead.close()
            return {"error": type(exc).__name__}

    def frame(self) -> dict[str, Any]:
        dump = self.mgr.dump()
        stats = {}
        temps = (dump.get("thermal") or {}).get("temperatures") or {}
        for d in dump.get("devices") or []:
            name = str(d.get("name"))
            stats[name] = self.driver_stats(d)
            t = temps.get(name)
            if isinstance(t, (int, float)):
                self.temps.setdefault(name, deque(maxlen=self.history)).append(float(t))
        return {"dump": dump, "stats": stats,
                "temps": {k: list(v) for k, v in self.temps.items()}, "at": time.time()}


def render(frame: dict[str, Any]) -> Any:
    """One frame as a rich renderable."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    dump = frame["dump"]
    daemon = dump.get("daemon") or {}
    thermal = dump.get("thermal") or {}
    budget = dump.get("budget") or {}
    policy = dump.get("policy") or {}
    status = str(thermal.get("status", "?"))
    head = Text.assemble(
        ("npu top", "bold"),
        f"  npud {daemon.get('version', '?')} at {daemon.get('runtime_dir', '?')}  "
        f"up {fmt.duration(float(daemon.get('uptime_s', 0)))}  "
        f"{daemon.get('clients', 0)} client(s)  policy {str(policy.get('name', '?')).upper()}  "
        f"{time.strftime('%H:%M:%S', time.localtime(frame.get('at', time.time())))}")

    dev = Table(title="devices", title_justify="left", box=box.SIMPLE_HEAD, expand=False)
    for col in ("device", "budget", "channels", "thermal", "temperature"):
        dev.add_column(col, no_wrap=True)
    used, total = budget.get("used") or 0, budget.get("thermal_scaled")
    total = budget.get("total") if total is None else total
    memory = str(policy.get("name", "")).upper() == "MEMORY"
    show = fmt.nbytes if memory else fmt.cell
    budget_text = f"{bar(float(used), float(total or 0))} {show(used)}/{show(total)}"
    for d in dump.get("devices") or [{"name": "(no drivers)", "available": True}]:
        name = str(d.get("name"))
        st = (frame.get("stats") or {}).get(name)
        chans: Text | str
        if not d.get("available"):
            chans = Text("DOWN", style="bold red")
        elif st and "busy" in st:
            chans = f"{bar(st['busy'], st['channels'], 4)} {st['busy']}/{st['channels']} busy" + (
                f", {st['queued']} queued" if st.get("queued") else "")
        else:
            chans = f"{d.get('channels') or '-'}"
        temps = (frame.get("temps") or {}).get(name) or []
        spark = sparkline(temps, 30.0, 100.0)
        t_now = f"{temps[-1]:.1f} C " if temps else ""
        over = " (override)" if thermal.get("override") or thermal.get("overridden") else ""
        dev.add_row(name, budget_text, chans, Text(status + over,
                                                   style=THERMAL_STYLE.get(status, "")),
                    Text(t_now) + Text(spark, style=THERMAL_STYLE.get(status, "")))

    req = Table(title="requests", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("uid", "request", "size", "priority", "state", "age", "memory"):
        req.add_column(col, no_wrap=True)
    for r in dump.get("requests") or []:
        state = str(r.get("state", "?"))
        req.add_row(str(r.get("uid_name") or r.get("uid")), fmt.cell(r.get("request_id")),
                    fmt.size_name(r.get("size")), str(r.get("priority", "-")).lower(),
                    Text(state, style=STATE_STYLE.get(state, "")),
                    fmt.duration(r["age_s"]) if r.get("age_s") is not None else "-",
                    fmt.nbytes(r.get("real_bytes") or None))
    if dump.get("visibility") == "own":
        req.caption = f"other uids' requests: {fmt.cell(dump.get('other_requests') or 'none')}"

    per = Table(title="per uid", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("uid", "importance", "device", "exec/s", "p50", "p99", "executions"):
        per.add_column(col, no_wrap=True)
    uids = dump.get("uids") or {}
    rows = 0
    denied = False
    for name, st in sorted((frame.get("stats") or {}).items()):
        if not st or "uids" not in st:
            denied = denied or bool(st and st.get("error") == "PermissionDenied")
            continue
        for uid, u in sorted(st["uids"].items(), key=lambda kv: -kv[1].get("per_s", 0)):
            imp = (uids.get(uid) or {}).get("importance")
            per.add_row(uid, fmt.importance_name(imp) if imp is not None else "-", name,
                        f"{u.get('per_s', 0):.1f}",
                        f"{u['p50_ms']:.2f} ms" if "p50_ms" in u else "-",
                        f"{u['p99_ms']:.2f} ms" if "p99_ms" in u else "-",
                        str(u.get("executions", 0)))
            rows += 1
    if denied:
        per.caption = "per-uid rates: admins only"
    elif not rows:
        per.caption = "no executions yet"
    return Group(head, dev, req, per)


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    sampler = Sampler(args.runtime_dir)
    try:
        if args.once:
            console = Console(width=None if sys.stdout.isatty() else 120,
                              no_color=not sys.stdout.isatty(), highlight=False,
                              emoji=False)
            console.print(render(sampler.frame()))
            return 0
        console = Console(highlight=False, emoji=False)  # "ref:a:" is no emoji
        try:
            with Live(render(sampler.frame()), console=console, screen=True,
                      auto_refresh=False) as live:
                while True:
                    time.sleep(args.interval)
                    live.update(render(sampler.frame()), refresh=True)
        except KeyboardInterrupt:
            return 0
    finally:
        sampler.close()
