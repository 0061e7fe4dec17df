"""`npu importance set UID LEVEL` (admin): the ActivityManager analog."""

from __future__ import annotations

import argparse
from typing import Any

from npumanager.cli.main import add_runtime_dir


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("importance", help="set a uid's importance")
    add_runtime_dir(p)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    s = verbs.add_parser("set", help="set the importance of UID (admin only)")
    add_runtime_dir(s)
    s.add_argument("uid", type=int)
    s.add_argument("level", help="foreground, foreground_service, visible, perceptible, "
                   "service, top_sleeping, cant_save_state, cached, gone, or a number")
    s.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from npumanager.client import NpuManager
    from npumanager.constants import parse_importance

    try:
        level = parse_importance(args.level)
    except ValueError as exc:
        raise SystemExit(f"npu importance: {exc}") from None
    with NpuManager(args.runtime_dir) as mgr:
        mgr.set_uid_importance(args.uid, level)
    print(f"uid {args.uid}: importance {level}")
    return 0
