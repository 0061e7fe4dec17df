"""What `npu chaos` (:mod:`.chaos`) checks from outside while it runs, and the report it
fills: npud's dump against the driver's own list of grants (the budget, stale grants,
grants waiting for the driver's ack past their bound), live requests of dead apps, and
from the apps' stats files their inference availability."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from npumanager.config import Config

APP_UID0 = 50001


@dataclass
class Report:
    duration_s: float = 0.0
    ticks: int = 0
    events: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    start: dict[str, dict[str, int]] = field(default_factory=dict)
    end: dict[str, dict[str, int]] = field(default_factory=dict)
    executes: int = 0
    executes_ok: int = 0
    longest_gap_s: float = 0.0
    npud_restarts: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    prepare_failures: dict[str, int] = field(default_factory=dict)
    #: The run's directory (npud.log, stats/, rt/, state/); "" once removed.
    log_dir: str = ""

    def count(self, what: str) -> None:
        self.events[what] = self.events.get(what, 0) + 1

    def render(self) -> str:
        share = self.executes_ok / self.executes if self.executes else 0.0
        lines = [
            f"chaos run: {self.duration_s:.1f} s, {self.ticks} checks",
            "events: " + ", ".join(f"{k} {v}" for k, v in sorted(self.events.items())),
            f"violations: {len(self.violations)}",
            *(f"  - {v}" for v in self.violations[:20]),
        ]
        for proc in ("npud", "driver"):
            s, e = self.start.get(proc, {}), self.end.get(proc, {})
            lines.append(f"{proc}: fds {s.get('fds', '?')} -> {e.get('fds', '?')}, "
                         f"RSS {s.get('rss_kb', 0) // 1024} -> {e.get('rss_kb', 0) // 1024} MiB")
        lines.append(f"apps: {self.executes_ok}/{self.executes} executes succeeded "
                     f"({share:.1%}); longest gap without a successful execute while an app held "
                     f"a grant {self.longest_gap_s:.2f} s")
        if self.failures:
            lines.append("failed executes: " + ", ".join(
                f"{k} {v}" for k, v in sorted(self.failures.items())))
        if self.prepare_failures:
            lines.append("failed prepares (retried): " + ", ".join(
                f"{k} {v}" for k, v in sorted(self.prepare_failures.items())))
        lines.append(f"logs: {self.log_dir}/npud.log (npud and its driver hosts), "
                     f"{self.log_dir}/stats/ (the apps' executes)" if self.log_dir else
                     "logs: removed (a clean run; --keep or --log-dir DIR keeps them)")
        return "\n".join(lines)


#: What a check may see beyond the bound: npud's loop, busy, fires the ack timer a little
#: after it is due, and the dump is read between two of its turns.
ENDING_SLACK_S = 2.0


def ending_bound_s(config: Config) -> float:
    """How long npud may keep an ended grant waiting for its driver's ack (service/ending.py):
    ``grant_end_ack_s`` (then it restarts the driver and applies the end) plus the longest
    restart back-off of its drivers."""
    backoff = max((float(d.get("restart_backoff_max_s", 0.0)) for d in config.drivers()),
                  default=0.0)
    return float(config.section("manager").get("grant_end_ack_s", 10.0)) + backoff


def ending_problems(dump: dict[str, Any], bound_s: float) -> list[tuple[str, str]]:
    """(grant, what is wrong) for each grant npud's ``dump`` shows waiting for its driver's
    ack longer than ``bound_s``: npud neither had the ack nor restarted the driver."""
    out = []
    for e in dump.get("ending") or []:
        waiting = float(e.get("waiting_s") or 0.0)
        if waiting > bound_s:
            out.append((str(e.get("grant")),
                        f"grant {e.get('grant')} of uid {e.get('uid')} (request "
                        f"{e.get('request_id')}) waiting for its driver's ack for "
                        f"{waiting:.1f} s > {bound_s:g} s"))
    return out


def check_tick(rt: Path, report: Report, children: dict[int, Any],
               unknown_since: dict[str, float], ending_bound: float | None = None) -> None:
    """The invariants, from outside: npud's dump and the driver's own list of grants;
    ``ending_bound``: how long a grant may wait for its driver's ack (:func:`ending_bound_s`)."""
    from npumanager.client import NpuManager

    try:
        with NpuManager(rt, reconnect=False) as mgr:
            dump = mgr.dump()
    except Exception:
        report.count("check skipped (npud away)")
        return
    ending = {str(e.get("grant")) for e in dump.get("ending") or []}
    if ending_bound is not None:
        for g in ending:
            if unknown_since.setdefault("ending seen " + g, 0.0) == 0.0:
                unknown_since["ending seen " + g] = 1.0
                report.count("grant waiting for its driver's ack")
        for g, what in ending_problems(dump, ending_bound + ENDING_SLACK_S):
            if "ending " + g not in unknown_since:
                unknown_since["ending " + g] = time.time()  # report once
                report.violations.append(what)
    held_by_driver = _driver_held(rt)
    cap = dump.get("budget", {}).get("thermal_scaled")
    requests = dump.get("requests", [])
    by_grant = {r.get("grant"): r for r in requests if r.get("grant")}
    # The budget as the driver sees it: grants with a model loaded, charged as npud
    # charges them; holders npud asked to unload may still hold until their deadline.
    if held_by_driver is not None and cap is not None:
        used = sum(int(by_grant[h["grant"]].get("charge") or 0) for h in held_by_driver
                   if h["models"] and h["grant"] in by_grant
                   and by_grant[h["grant"]].get("state") != "unload_requested")
        if used > cap:
            report.violations.append(f"budget exceeded on the driver: {used} > {cap}")
        # A grant the driver holds that npud does not know, past the adoption window and
        # an unload deadline: a stale grant.
        now = time.time()
        for h in held_by_driver:
            # (An ended grant the driver has not applied yet is known to npud: ``ending``,
            # bounded above.)
            if h["grant"] in by_grant or str(h["grant"])[:8] in ending:
                unknown_since.pop(h["grant"], None)
                continue
            first = unknown_since.setdefault(h["grant"], now)
            if now - first > 6.0:
                report.violations.append(f"stale grant {h['grant']} of uid {h['uid']} in the "
                                         f"driver for {now - first:.1f} s")
                unknown_since[h["grant"]] = now + 3600  # report once
    if os.getuid() == 0:
        # Every live request has a live client: npud drops a dead app's requests when its
        # connection closes (the app's uid names its process: one app per uid).
        alive = {APP_UID0 + i for i, c in children.items() if not _dead_quiet(c.pid)}
        now = time.time()
        seen = set()
        for r in requests:
            uid = r.get("uid")
            if uid is not None and uid >= APP_UID0 and uid not in alive:
                key = f"{uid}:{r.get('request_id')}"
                seen.add(key)
                first = unknown_since.setdefault("dead " + key, now)
                if now - first > 5.0:
                    report.violations.append(f"request {key} of a dead app still live "
                                             f"after {now - first:.1f} s")
                    unknown_since["dead " + key] = now + 3600
        for k in [k for k in unknown_since if k.startswith("dead ") and k[5:] not in seen]:
            del unknown_since[k]


def _driver_held(rt: Path) -> list[dict[str, Any]] | None:
    from npumanager.errors import NpuError
    from npumanager.hal.wire import SERVICE
    from npumanager.wire.client import SyncRpcClient

    try:
        client = SyncRpcClient(str(rt / "drivers" / "reference.sock"), SERVICE,
                               client_name="npu chaos", call_timeout=5.0)
    except NpuError:
        return None
    try:
        payload, _fds = client.call("device.stats", b"")
        held: list[dict[str, Any]] = json.loads(payload).get("held", [])
        return held
    except (NpuError, ValueError):
        return None
    finally:
        client.close()


def _dead_quiet(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True


def read_availability(stats: Path, report: Report) -> None:
    for f in stats.glob("app*.txt"):
        last_ok: float | None = None
        for line in f.read_text().splitlines():
            parts = line.split()
            try:
                t, ok = float(parts[0]), parts[1] == "1"
            except (ValueError, IndexError):
                continue
            if parts[1] == "p":
                why = parts[2] if len(parts) > 2 else "?"
                report.prepare_failures[why] = report.prepare_failures.get(why, 0) + 1
                continue
            if parts[1] == "g":
                # A new grant: the gap that counts is between executes the app wanted to
                # run (while it held a grant), not the time it spent waiting for one.
                last_ok = t
                continue
            report.executes += 1
            if not ok:
                why = parts[2] if len(parts) > 2 else "?"
                report.failures[why] = report.failures.get(why, 0) + 1
            if ok:
                report.executes_ok += 1
                if last_ok is not None:
                    report.longest_gap_s = max(report.longest_gap_s, t - last_ok)
                last_ok = t
