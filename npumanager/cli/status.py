"""`npu status`: the dumpsys of npud (policy, budget, thermal, uids, requests, devices)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from npumanager.cli.main import add_runtime_dir


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "status", help="show npud's state (dumpsys npu)",
        description="Policy and its parameters, budget used, thermal status and headroom, "
        "per-uid importance and priority, every request with its state and age, devices.",
    )
    add_runtime_dir(p)
    p.add_argument("--json", action="store_true", help="print the raw dump as JSON")
    p.add_argument("--story", metavar="UID:ID", default=None,
                   help="replay every decision npud took about one request")
    p.set_defaults(func=main)


def parse_story_key(text: str) -> tuple[int, int]:
    try:
        uid, rid = text.split(":", 1)
        return int(uid), int(rid)
    except ValueError:
        raise SystemExit(f"npu status: --story wants UID:ID (e.g. 1000:7), not {text!r}") from None


def main(args: argparse.Namespace) -> int:
    from npumanager.client import NpuManager

    with NpuManager(args.runtime_dir) as mgr:
        if args.story:
            uid, rid = parse_story_key(args.story)
            story = mgr.story(uid, rid)
            if args.json:
                print(json.dumps(story, indent=2))
            else:
                print(render_story(uid, rid, story))
            return 0
        dump = mgr.dump()
    if args.json:
        print(json.dumps(dump, indent=2, sort_keys=False))
    else:
        render(dump)
    return 0


def render_story(uid: int, rid: int, story: list[dict[str, Any]]) -> str:
    if not story:
        return f"no decisions about request {rid} of uid {uid} (unknown, or aged out of the log)"
    t0 = float(story[0].get("at", 0.0))
    lines = [f"request {rid} of uid {uid}:"]
    for d in story:
        details = " ".join(f"{k}={v}" for k, v in (d.get("details") or {}).items())
        lines.append(f"  +{float(d.get('at', 0.0)) - t0:8.3f}s  {d.get('what')}"
                     f"  ({d.get('stimulus_id')}){'  ' + details if details else ''}")
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return "-" if v is None else str(v)


def _ago(v: Any) -> str:
    """Seconds since something happened, as a person reads it ("never" if it did not)."""
    return "never" if v is None else f"{float(v):.1f} s ago"


def _bytes(v: Any) -> str:
    if not isinstance(v, int):
        return _cell(v)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v} B"


def _importance_name(v: Any) -> str:
    from npumanager.constants import Importance

    try:
        return f"{Importance(int(v)).name.lower()} ({int(v)})"
    except (TypeError, ValueError):
        return _cell(v)


def _kv(d: Any) -> str:
    if not isinstance(d, dict):
        return _cell(d)
    return "  ".join(f"{k}={_cell(v)}" for k, v in d.items())


REQUEST_COLUMNS = [
    ("uid", "uid"), ("request_id", "id"), ("state", "state"), ("size", "size"),
    ("priority", "priority"), ("rank", "rank"), ("charge", "charge"), ("grant", "grant"),
    ("age_s", "age s"), ("unload_reason", "unload reason"),
    ("unload_deadline_in_s", "revoke in s"),
]


def render(dump: dict[str, Any]) -> None:
    """Rich tables on a terminal, the same tables as plain text otherwise."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    tty = sys.stdout.isatty()
    console = Console(no_color=not tty, width=None if tty else 140, soft_wrap=False)
    rest = dict(dump)
    daemon = rest.pop("daemon", {})
    thermal = rest.pop("thermal", {})
    devices = rest.pop("devices", [])
    policy = rest.pop("policy", {})
    budget = rest.pop("budget", {})
    uids = rest.pop("uids", {})
    requests = rest.pop("requests", [])
    summary = rest.pop("summary", None)
    # A non-admin's dump holds only its own requests, the others as counts per state.
    own_only = rest.pop("visibility", "all") == "own"
    other_requests = rest.pop("other_requests", {})

    console.print(
        f"npud {daemon.get('version', '?')}  pid {daemon.get('pid')}  uid {daemon.get('uid')}  "
        f"up {float(daemon.get('uptime_s', 0)):.0f} s  clients {daemon.get('clients')}  "
        f"internal errors {daemon.get('internal_errors')}"
    )
    if summary:
        console.print(f"state:   {summary}")
    console.print(f"policy:  {_kv(policy)}")
    console.print(f"budget:  {_kv(budget)}")
    headroom = thermal.get("headroom")
    hr = (f"  headroom {headroom:.2f}" if isinstance(headroom, (int, float))
          and headroom == headroom else "")
    over = " (admin override)" if thermal.get("overridden") or thermal.get("override") else ""
    console.print(f"thermal: {thermal.get('status', '?')}{over}{hr}"
                  + (f"  budget x{thermal['budget_scale']}" if "budget_scale" in thermal
                     else ""))
    for k, v in rest.items():
        console.print(f"{k + ':':8s} {_kv(v)}")

    t = Table(title="uids", box=box.SIMPLE)
    for col in ("uid", "importance", "app priority", "live requests", "last completed"):
        t.add_column(col)
    for uid, u in uids.items():
        t.add_row(str(uid), _importance_name(u.get("importance")), _cell(u.get("app_priority")),
                  _cell(u.get("requests")), _ago(u.get("last_completed_ago_s")))
    console.print(t)

    title = "your requests (not an admin: other uids' are counted below)" if own_only \
        else "requests"
    t = Table(title=title, box=box.SIMPLE)
    for _key, title in REQUEST_COLUMNS:
        t.add_column(title, no_wrap=True)
    for r in requests:
        t.add_row(*(_cell(r.get(key)) for key, _title in REQUEST_COLUMNS))
    console.print(t)
    if own_only:
        counts = ", ".join(f"{n} {state}" for state, n in other_requests.items()) or "none"
        console.print(f"other uids' requests: {counts}")

    if devices:
        t = Table(title="devices", box=box.SIMPLE)
        for col in ("name", "available", "backend", "version", "channels", "memory"):
            t.add_column(col)
        for d in devices:
            t.add_row(*(_cell(d.get(c)) for c in ("name", "available", "backend", "version",
                                                  "channels")), _bytes(d.get("memory_bytes")))
        console.print(t)
    else:
        console.print("devices: none")
