"""`npu thermal status|override LEVEL|reset` (override/reset: admin)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from npumanager.cli.main import UsageError, add_runtime_dir


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("thermal", help="thermal status and override")
    add_runtime_dir(p)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    st = verbs.add_parser("status", help="thermal status, sensors and headroom")
    add_runtime_dir(st)
    st.add_argument("--json", action="store_true")
    ov = verbs.add_parser("override", help="force a thermal status (admin only)")
    add_runtime_dir(ov)
    ov.add_argument("level", help="none, light, moderate, severe, critical, emergency, "
                    "shutdown (any case) or 0-6")
    ov.add_argument("--json", action="store_true")
    rs = verbs.add_parser("reset", help="drop the override: back to the sensors (admin only)")
    add_runtime_dir(rs)
    rs.add_argument("--json", action="store_true")
    p.set_defaults(func=main)
    for q in (st, ov, rs):
        q.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from npumanager.client import NpuManager, ThermalInfo
    from npumanager.constants import parse_thermal_status

    level = None
    if args.verb == "override":  # a typo is reported before anything is asked of npud
        try:
            level = parse_thermal_status(args.level)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    with NpuManager(args.runtime_dir) as mgr:
        info: ThermalInfo
        if level is not None:
            info = mgr.override_thermal_status(level)
        elif args.verb == "reset":
            info = mgr.reset_thermal_status()
        else:
            info = mgr.thermal_status()
    if getattr(args, "json", False):
        print(json.dumps({"status": info.status.name, "overridden": info.overridden,
                          "headroom": info.headroom, **info.details}, indent=2))
        return 0
    print(render(info))
    return 0


def render(info: Any) -> str:
    from npumanager.thermal.render import render_thermal

    if info.details.get("thresholds_c") is not None:
        return str(render_thermal({**info.details, "status": info.status.name}))
    head = f"thermal status: {info.status.name}" + (" (override)" if info.overridden else "")
    if info.headroom is not None:
        head += f"   headroom: {info.headroom:.2f} (1.00 = SEVERE)"
    return head
