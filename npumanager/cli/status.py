"""`npu status`: the dumpsys of npud (policy, budget, thermal, uids, requests, devices).

The human view shows what a person needs: sizes by name, ages and "in 3.2 s"
instead of monotonic deadlines, each request's place in the queue, devices as
a table with the reason a driver is down. ``--json`` prints the raw dump.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from typing import Any

from npumanager.cli import fmt
from npumanager.cli.main import UsageError, add_runtime_dir
from npumanager.words import plural


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "status", help="show npud's state (dumpsys npu)",
        description="Policy and its parameters, budget used, thermal status and headroom, "
        "per-uid importance and priority, every request with its state and age, devices.",
    )
    add_runtime_dir(p)
    p.add_argument("--json", action="store_true", help="print the raw dump as JSON")
    p.add_argument("--story", metavar="[UID:]ID", default=None,
                   help="replay every decision npud took about one request (UID defaults "
                   "to yours)")
    p.set_defaults(func=main)


def parse_story_key(text: str, default_uid: int | None = None) -> tuple[int, int]:
    """``ID`` (the caller's uid) or ``UID:ID``."""
    uid_text, sep, rid_text = text.rpartition(":")
    try:
        uid = int(uid_text) if sep else (os.getuid() if default_uid is None else default_uid)
        rid = int(rid_text)
    except ValueError:
        raise UsageError(f"--story wants ID or UID:ID (e.g. 7 or 1000:7), not {text!r}") \
            from None
    if uid < 0 or rid < 0:
        raise UsageError(f"--story wants non-negative numbers, not {text!r}")
    if uid >= 1 << 32 or rid >= 1 << 63:  # the wire's uint32 and int64
        raise UsageError(f"--story {text}: no uid or request id is that large")
    return uid, rid


def main(args: argparse.Namespace) -> int:
    from npumanager.client import NpuManager

    story_key = parse_story_key(args.story) if args.story else None
    with NpuManager(args.runtime_dir) as mgr:
        if story_key is not None:
            uid, rid = story_key
            story = mgr.story(uid, rid)
            if not story:
                raise UsageError(unknown_story(mgr, uid, rid))
            if args.json:
                print(json.dumps(story, indent=2))
            else:
                print(render_story(uid, rid, story))
            return 0
        dump = mgr.dump()
    if args.json:
        print(json.dumps(dump, indent=2, sort_keys=False))
    else:
        sys.stdout.write(render(dump, color=sys.stdout.isatty()))
    return 0


#: The most request keys an unknown --story names.
SHOWN_KEYS = 20


def unknown_story(mgr: Any, uid: int, rid: int) -> str:
    """--story UID:ID npud has no decision about, as other lookups of a name that does not
    exist say it (a usage error, exit 2): with the ones that do. An admin is offered every
    request in npud's decision log, another user its own live requests (all the dump shows
    it by id)."""
    keys: list[tuple[int, int]] = []
    if mgr.admin:
        for d in mgr.decisions(0.0).get("decisions", []):
            key = d.get("key")
            if isinstance(key, list) and len(key) == 2 and tuple(key) not in keys:
                keys.append((int(key[0]), int(key[1])))
    else:
        for r in mgr.dump().get("requests") or []:
            if r.get("uid") == uid and (uid, r.get("request_id")) not in keys:
                keys.append((uid, int(r.get("request_id"))))
    whose = "in its log" if mgr.admin else f"of uid {uid} live"
    if not keys:
        known = f"npud has no request {whose}"
    else:
        shown = ", ".join(f"{u}:{i}" for u, i in keys[-SHOWN_KEYS:])
        more = (f" (the last {SHOWN_KEYS} of {len(keys)})" if len(keys) > SHOWN_KEYS else "")
        known = f"requests {whose}: {shown}{more}"
    return (f"--story {uid}:{rid}: npud has no decision about request {rid} of uid {uid} "
            f"(never made, or aged out of its log); {known}")


def render_story(uid: int, rid: int, story: list[dict[str, Any]]) -> str:
    t0 = float(story[0].get("at", 0.0))
    lines = [f"request {rid} of uid {uid}:"]
    for d in story:
        details = "  ".join(f"{k} {fmt.cell(v)}" for k, v in (d.get("details") or {}).items())
        lines.append(f"  +{float(d.get('at', 0.0)) - t0:8.3f} s  {d.get('what')}"
                     f"{'  (' + details + ')' if details else ''}")
    return "\n".join(lines)


def _policy_line(policy: dict[str, Any]) -> str:
    name = str(policy.get("name", "?")).upper()
    parts = [name]
    if name == "BUDGET":
        parts.append(f"budget {policy.get('max_budget')}")
        parts.append(f"weights {fmt.per_size(policy.get('weights'))}")
    elif name == "MEMORY":
        mb = policy.get("memory_budget_bytes")
        parts.append(f"budget {fmt.nbytes(mb) if mb else 'the drivers memory'}")
    return "  ".join(parts)


def _budget_line(budget: dict[str, Any], policy: dict[str, Any]) -> str:
    memory = str(policy.get("name", "")).upper() == "MEMORY"
    show = fmt.nbytes if memory else fmt.cell
    used, total, cap = budget.get("used"), budget.get("total"), budget.get("thermal_scaled")
    line = f"{show(used)} of {show(total)} used"
    if budget.get("unloading"):
        line += f" ({show(budget['unloading'])} being unloaded)"
    if cap is not None and cap != total:
        line += f"; thermal limit {show(cap)}"
    elif cap is None:
        line += "; no limit"
    return line


def _device_thermal(b: dict[str, Any]) -> str:
    """A device's thermal status where it is not NONE (its own or the machine's), and
    whether its driver is down."""
    th = b.get("thermal") or {}
    out = f"; thermal {th['status']}" if th.get("status") not in (None, "NONE") else ""
    return out + ("" if b.get("up", True) or b.get("placeholder") else "; driver down")


def _thermal_line(thermal: dict[str, Any], *, per_device: bool = False) -> str:
    """The machine's thermal status; the budget scale only with one device (with several,
    each device's line says its own: it may follow a sensor of its own)."""
    line = str(thermal.get("status", "?"))
    if thermal.get("override") or thermal.get("overridden"):
        line += f" (admin override; sensors say {thermal.get('computed_status', '?')})"
    t = thermal.get("temperature_c")
    if isinstance(t, (int, float)):
        line += f"  {t:.1f} C"
    h = thermal.get("headroom")
    if isinstance(h, (int, float)) and h == h:
        line += f"  headroom {h:.2f}"
    scale = thermal.get("budget_scale")
    if not per_device and isinstance(scale, (int, float)) and scale != 1:
        line += f"  budget x{scale:g}"
    return line


def _count(n: Any, noun: str) -> str:
    """A count from the dump in words ("1 client", "3 clients"); a value that is not a
    count as it came."""
    return plural(n, noun) if isinstance(n, int) else f"{fmt.cell(n)} {noun}"


def _counts_line(counts: dict[str, Any]) -> str:
    order = ("loaded", "granted", "unload_requested", "waiting", "queued", "pending")
    parts = [f"{counts[k]} {k.replace('_', ' ')}" for k in order if counts.get(k)]
    return ", ".join(parts) or "none"


def _others_line(others: Any) -> str:
    """Other uids' requests as a non-admin sees them: counts per state."""
    if not others:
        return "none"
    if isinstance(others, dict):
        return ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in others.items() if v) or "none"
    return fmt.cell(others)


REQUEST_COLUMNS = ("uid", "id", "state", "size", "priority", "rank", "holds", "grant", "age",
                   "queue", "unload")


def _request_row(r: dict[str, Any], queue_pos: dict[tuple[int, int], int]) -> list[str]:
    key = (r.get("uid"), r.get("request_id"))
    pos = queue_pos.get(key)  # type: ignore[arg-type]
    unload = "-"
    if r.get("unload_reason"):
        unload = str(r["unload_reason"])
        if r.get("unload_deadline_in_s") is not None:
            unload += f", revoke {fmt.due_in(r['unload_deadline_in_s'])}"
    state = str(r.get("state", "?"))
    if r.get("parked"):
        state += " (parked)"
    holds = fmt.cell(r.get("charge"))
    if r.get("real_bytes"):
        holds += f" ({fmt.nbytes(r['real_bytes'])})"
    grant = fmt.cell(r.get("grant"))
    lane, moves = r.get("lane"), r.get("moves")
    # Valid on its device's background lane (service/host_lanes.py); moved between the
    # device's hosts as its uid's class changed (service/grant_moves.py).
    moved = f"moved {moves}x" if moves else ""
    if lane:
        grant += f" ({lane} lane" + (f"; {moved})" if moved else ")")
    elif moved:
        grant += f" (main host; {moved})"
    return [str(r.get("uid_name") or r.get("uid")), fmt.cell(r.get("request_id")), state,
            fmt.size_name(r.get("size")), str(r.get("priority", "-")).lower(),
            fmt.cell(r.get("rank")), holds, grant,
            fmt.duration(r["age_s"]) if r.get("age_s") is not None else "-",
            f"#{pos}" if pos else "-", unload]


def render(dump: dict[str, Any], *, color: bool = False, width: int = 120) -> str:
    """The human view of a dump, as text (rich tables; colours only for a terminal)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = io.StringIO()
    console = Console(file=out, no_color=not color, color_system="auto" if color else None,
                      width=width, soft_wrap=False, force_terminal=color,
                      highlight=False, emoji=False)
    daemon = dump.get("daemon") or {}
    thermal = dump.get("thermal") or {}
    policy = dump.get("policy") or {}
    budget = dump.get("budget") or {}
    params = dump.get("params") or {}

    console.print(
        f"npud {daemon.get('version', '?')}  pid {daemon.get('pid')} (uid {daemon.get('uid')})  "
        f"up {fmt.duration(float(daemon.get('uptime_s', 0)))}  "
        f"{_count(daemon.get('clients', 0), 'client')}"
        + (f"  {_count(daemon['internal_errors'], 'internal error')}"
           if daemon.get("internal_errors") else ""))
    budgets = [b for b in dump.get("budgets") or [] if isinstance(b, dict)]
    if len(budgets) > 1:  # one budget per device: a line each
        budget_rows = [("budget" if i == 0 else "", f"{b.get('device')}: "
                        + _budget_line(b, policy) + _device_thermal(b))
                       for i, b in enumerate(budgets)]
    else:
        budget_rows = [("budget", _budget_line(budget, policy))]
    rows = [("policy", _policy_line(policy)), *budget_rows,
            ("thermal", _thermal_line(thermal, per_device=len(budgets) > 1)),
            ("requests", _counts_line(dump.get("counts") or {}))]
    if params:
        wait = params.get("max_queue_wait_s")
        rows.append(("limits",
                     f"unload deadline {fmt.duration(params.get('unload_deadline_s', 0))}, "
                     f"queue wait {fmt.duration(wait) if wait else 'unlimited'}, "
                     f"{_count(params.get('max_requests_per_uid'), 'live request')} per uid"))
    if daemon.get("protection"):  # (service/protection.py: what npud's start resolved)
        rows.append(("protect", str(daemon["protection"]).removeprefix(
            "foreground protection: ")))
    settings = daemon.get("settings") or {}
    if settings.get("error"):
        rows.append(("settings", f"PROBLEM: {settings['error']}"))
    elif settings.get("persisted"):
        rows.append(("settings", f"admin settings kept in {settings.get('path')}"))
    for label, text in rows:
        console.print(f"{label + ':' if label else '':9s} {text}")

    queue_pos = {(k[0], k[1]): i + 1 for i, k in enumerate(dump.get("queue") or [])
                 if isinstance(k, (list, tuple)) and len(k) == 2}
    requests = [r for r in dump.get("requests") or [] if isinstance(r, dict)]
    # A non-admin's dump holds only its own requests, the others as counts per state.
    own_only = dump.get("visibility", "all") == "own"
    if requests:
        title = ("your requests (not an admin: other uids' are counted below)" if own_only
                 else "requests")
        t = Table(title=title, title_justify="left", box=box.SIMPLE)
        for col in REQUEST_COLUMNS:
            t.add_column(col, no_wrap=True)
        for r in requests:
            t.add_row(*_request_row(r, queue_pos))
        console.print(t)
    if own_only:
        console.print(f"other uids' requests: {_others_line(dump.get('other_requests'))}")

    uids = dump.get("uids") or {}
    if uids:
        t = Table(title="uids", title_justify="left", box=box.SIMPLE)
        for col in ("uid", "importance", "app priority", "live requests", "last completed"):
            t.add_column(col)
        for uid, u in uids.items():
            t.add_row(str(u.get("name") or uid), fmt.importance_name(u.get("importance")),
                      fmt.cell(u.get("app_priority")), fmt.cell(u.get("requests")),
                      fmt.ago(u.get("last_completed_ago_s")))
        console.print(t)

    devices = dump.get("devices") or []
    drivers = dump.get("drivers") or {}
    if devices:
        t = Table(title="devices", title_justify="left", box=box.SIMPLE)
        for col in ("name", "state", "backend", "version", "channels", "memory"):
            t.add_column(col)
        t.add_column("hosts", overflow="fold")  # (a reason may hold a path: whole, folded)
        for d in devices:
            if d.get("available"):
                state = "up"
            else:
                state = "DOWN" + (f": {d['down_reason']}" if d.get("down_reason") else "")
            t.add_row(str(d.get("name")), state, fmt.cell(d.get("backend") or None),
                      fmt.cell(d.get("version") or None), fmt.cell(d.get("channels") or None),
                      fmt.nbytes(d.get("memory_bytes") or None), _hosts(d.get("hosts")))
        console.print(t)
    elif drivers:
        console.print("drivers: " + ", ".join(
            f"{n} {'up' if v.get('up') else 'DOWN'}" for n, v in drivers.items()))
    else:
        console.print("devices: none (npud runs without drivers)")
    return out.getvalue()


def _hosts(hosts: Any) -> str:
    """A device's host processes: ``pid 12``, with a background lane ``pid 12 + bg 34``
    (``bg DOWN: why`` while it is not up); each with the keys it runs otherwise than npud
    would, where it does; the main one with why npud grants its burst threads no FIFO,
    where it adopted it and cannot (``no FIFO: why``)."""
    if not isinstance(hosts, dict):
        return "-"
    main = f"pid {hosts['pid']}" if hosts.get("pid") else "-"
    main += _differs(hosts)
    if hosts.get("no_rt"):  # (an adopted host npud cannot tie: service/hand_ties.py)
        main += f" (no FIFO: {hosts['no_rt']})"
    bg = hosts.get("background")
    if not isinstance(bg, dict):
        return main
    if not bg.get("up"):
        return f"{main} + bg DOWN: {bg.get('down_reason') or 'starting'}"
    return f"{main} + bg {bg.get('pid')}{_differs(bg)}"


def _differs(host: dict[str, Any]) -> str:
    """`` (other entry: KEY, KEY)`` for a host npud did not start that runs another entry
    than npud would (service/host_entries.py; npud's log says more)."""
    keys = host.get("entry_differs")
    if not isinstance(keys, list) or not keys:
        return ""
    return f" (other entry: {', '.join(map(str, keys))})"
