"""`npu top`: a live view of npud and its devices (`--once` prints one frame).

Per device: budget used, channels busy, thermal status with a sparkline of the
temperature, its host process's pid; a device with a background lane ([[driver]]
background_host) gets a second row for the lane's host (its channels busy, its pid or
why it is down); a table of requests (uid or unit name, request, size, priority,
state, age, memory, and with a lane the host its grant is valid on); per uid and host
the executions per second and p50/p99 latency (from each host's ``device.stats``,
admin only). Refreshes every ``--interval`` seconds until Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from npumanager.cli import fmt
from npumanager.cli.main import add_runtime_dir, positive_float
from npumanager.words import plural

SPARK = "▁▂▃▄▅▆▇█"
#: How a device's background lane ([[driver]] background_host) is named in the tables.
LANE_LABEL = "bg lane"
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

        self.runtime_dir = runtime_dir
        self.mgr: Any = NpuManager(runtime_dir)
        self.temps: dict[str, deque[float]] = {}
        self.history = history
        self._drivers: dict[str, Any] = {}
        self.last: Any = None

    def close(self) -> None:
        for c in self._drivers.values():
            c.close()
        if self.mgr is not None:
            self.mgr.close()

    def view(self) -> Any:
        """The next frame rendered; while npud does not answer (stopped, restarting: the
        README's `systemctl restart npud` is a non-event for apps), a line saying so above
        the last frame, and a new connection tried at each refresh. The live view used to
        end there ("ServiceUnavailable: not connected to the manager service")."""
        from rich.console import Group
        from rich.text import Text

        from npumanager.client import NpuManager
        from npumanager.errors import ServiceUnavailable

        try:
            if self.mgr is None:
                self.mgr = NpuManager(self.runtime_dir)
            self.last = render(self.frame())
            return self.last
        except ServiceUnavailable as exc:
            if self.mgr is not None:
                self.mgr.close()
                self.mgr = None
            for c in self._drivers.values():
                c.close()
            self._drivers.clear()
            said = Text(f"{time.strftime('%H:%M:%S')} npud is not answering: {exc} Trying "
                        "again at each refresh; Ctrl-C quits.", style="bold red")
            return Group(said, self.last) if self.last is not None else said

    def driver_stats(self, device: dict[str, Any], lane: str = "") -> dict[str, Any] | None:
        """``device``'s host's ``device.stats`` (``lane``: its background lane's host)."""
        import json

        from npumanager.errors import NpuError
        from npumanager.fds import close_fds
        from npumanager.hal.wire import SERVICE
        from npumanager.paths import lane_name, lane_socket
        from npumanager.wire.client import SyncRpcClient

        path = str(device.get("socket_path") or "")
        name = lane_name(str(device.get("name")), lane)
        if not device.get("available") or not path:
            return None
        if lane:
            if not ((device.get("hosts") or {}).get(lane) or {}).get("up"):
                return None
            path = str(lane_socket(path, lane))
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
        from npumanager.paths import BACKGROUND_LANE

        dump = self.mgr.dump()
        stats = {}
        lanes = {}
        temps = (dump.get("thermal") or {}).get("temperatures") or {}
        for d in dump.get("devices") or []:
            name = str(d.get("name"))
            stats[name] = self.driver_stats(d)
            if BACKGROUND_LANE in (d.get("hosts") or {}):
                lanes[name] = self.driver_stats(d, BACKGROUND_LANE)
            t = temps.get(name)
            if isinstance(t, (int, float)):
                self.temps.setdefault(name, deque(maxlen=self.history)).append(float(t))
        return {"dump": dump, "stats": stats, "lane_stats": lanes,
                "temps": {k: list(v) for k, v in self.temps.items()}, "at": time.time()}


def channels(available: bool, st: dict[str, Any] | None, configured: Any) -> Any:
    """A host's channels cell: busy of its channels (and queued) from its stats, DOWN."""
    from rich.text import Text

    if not available:
        return Text("DOWN", style="bold red")
    if st and "busy" in st:
        return f"{bar(st['busy'], st['channels'], 4)} {st['busy']}/{st['channels']} busy" + (
            f", {st['queued']} queued" if st.get("queued") else "")
    return f"{configured or '-'}"


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
        f"{plural(int(daemon.get('clients', 0)), 'client')}  "
        f"policy {str(policy.get('name', '?')).upper()}  "
        f"{time.strftime('%H:%M:%S', time.localtime(frame.get('at', time.time())))}")

    dev = Table(title="devices", title_justify="left", box=box.SIMPLE_HEAD, expand=False)
    for col in ("device", "budget", "channels", "thermal", "temperature", "host"):
        dev.add_column(col, no_wrap=True)
    used, total = budget.get("used") or 0, budget.get("thermal_scaled")
    total = budget.get("total") if total is None else total
    memory = str(policy.get("name", "")).upper() == "MEMORY"
    show = fmt.nbytes if memory else fmt.cell
    budget_text = f"{bar(float(used), float(total or 0))} {show(used)}/{show(total)}"
    for d in dump.get("devices") or [{"name": "(no drivers)", "available": True}]:
        name = str(d.get("name"))
        st = (frame.get("stats") or {}).get(name)
        hosts = d.get("hosts") or {}
        temps = (frame.get("temps") or {}).get(name) or []
        spark = sparkline(temps, 30.0, 100.0)
        t_now = f"{temps[-1]:.1f} C " if temps else ""
        over = " (override)" if thermal.get("override") or thermal.get("overridden") else ""
        dev.add_row(name, budget_text, channels(bool(d.get("available")), st,
                                                d.get("channels")),
                    Text(status + over, style=THERMAL_STYLE.get(status, "")),
                    Text(t_now) + Text(spark, style=THERMAL_STYLE.get(status, "")),
                    f"pid {hosts['pid']}" if hosts.get("pid") else "-")
        lane = hosts.get("background")
        if isinstance(lane, dict):
            # The device's second host process (service/host_lanes.py): same budget and
            # thermal status, its own channels and pid.
            up = bool(d.get("available") and lane.get("up"))
            dev.add_row(f" └ {LANE_LABEL}", "", channels(
                up, (frame.get("lane_stats") or {}).get(name), None), "", "",
                f"pid {lane.get('pid')}" if up else Text(
                    f"DOWN: {lane.get('down_reason') or 'starting'}", style="bold red"))

    req = Table(title="requests", title_justify="left", box=box.SIMPLE_HEAD)
    # With a background lane: the host each grant is valid on (npud's choice, by the
    # request's effective class: service/host_lanes.grant_target).
    with_lane = any(isinstance((d.get("hosts") or {}).get("background"), dict)
                    for d in dump.get("devices") or [])
    for col in ("uid", "request", "size", "priority", "state", "age", "memory",
                *(("host",) if with_lane else ())):
        req.add_column(col, no_wrap=True)
    for r in dump.get("requests") or []:
        state = str(r.get("state", "?"))
        where = LANE_LABEL if r.get("lane") else "main" if "lane" in r else "-"
        if r.get("moves"):  # its grant followed its uid's class (service/grant_moves.py)
            where += f" (moved {r['moves']}x)"
        host = () if not with_lane else (where,)
        req.add_row(str(r.get("uid_name") or r.get("uid")), fmt.cell(r.get("request_id")),
                    fmt.size_name(r.get("size")), str(r.get("priority", "-")).lower(),
                    Text(state, style=STATE_STYLE.get(state, "")),
                    fmt.duration(r["age_s"]) if r.get("age_s") is not None else "-",
                    fmt.nbytes(r.get("real_bytes") or None), *host)
    if dump.get("visibility") == "own":
        req.caption = f"other uids' requests: {fmt.cell(dump.get('other_requests') or 'none')}"

    per = Table(title="per uid", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("uid", "importance", "device", "exec/s", "p50", "p99", "executions"):
        per.add_column(col, no_wrap=True)
    uids = dump.get("uids") or {}
    rows = 0
    denied = False
    hosts_stats = [(name, st) for name, st in (frame.get("stats") or {}).items()]
    hosts_stats += [(f"{name} {LANE_LABEL}", st)
                    for name, st in (frame.get("lane_stats") or {}).items()]
    for name, st in sorted(hosts_stats):
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


def _tables(view: Any) -> Iterator[Any]:
    """The tables of a view (a line of text wraps where a table's columns are cut)."""
    from rich.console import Group
    from rich.table import Table

    if isinstance(view, Table):
        yield view
    elif isinstance(view, Group):
        for r in view.renderables:
            yield from _tables(r)


def fitted(console: Any, view: Any) -> Any:
    """``view``, with a line above it where the terminal is too small for it: rich crops a
    table's columns to the width ('de…', 're…', a column dropped) and the live screen cuts
    the rows below its height (the requests and per-uid tables) without a word."""
    from rich.console import Group
    from rich.text import Text

    width, height = console.size
    wide = console.options.update(width=1000)
    need_w = max((console.measure(t, options=wide).maximum for t in _tables(view)), default=0)
    lines = len(console.render_lines(view, console.options.update(width=max(width, need_w)),
                                     pad=False))
    if need_w <= width and lines <= height:
        return view
    need = f"{max(need_w, width)}x{max(lines + 1, height)}"
    note = Text(f"terminal {width}x{height}: this view needs {need}, columns or rows are cut; "
                f"widen it, or `npu top --once | less -S`", style="bold yellow")
    return Group(note, view)


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
            first = render(sampler.frame())  # npud absent at the start: one line, exit 1
            sampler.last = first
            with Live(fitted(console, first), console=console, screen=True,
                      auto_refresh=False) as live:
                while True:
                    time.sleep(args.interval)
                    live.update(fitted(console, sampler.view()), refresh=True)
        except KeyboardInterrupt:
            return 0
    finally:
        sampler.close()
