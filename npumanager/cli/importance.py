"""`npu importance set UID LEVEL` (admin): the ActivityManager analog."""

from __future__ import annotations

import argparse
from typing import Any

from npumanager.cli.main import UsageError, add_runtime_dir, int_range


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("importance", help="set a uid's importance")
    add_runtime_dir(p)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    s = verbs.add_parser("set", help="set the importance of UID (admin only)")
    add_runtime_dir(s)
    s.add_argument("uid", type=int_range(0, 2**32 - 2),
                   help="the uid (or an identity shown by npu status)")
    s.add_argument("level", help="foreground, foreground_service, visible, perceptible, "
                   "service, top_sleeping, cant_save_state, cached, gone, or a number")
    s.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from npumanager.cli.fmt import importance_name
    from npumanager.client import NpuManager
    from npumanager.constants import MAX_IMPORTANCE, parse_importance

    try:
        level = parse_importance(args.level)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 0 <= level <= MAX_IMPORTANCE:
        raise UsageError(f"importance {level} is out of range 0..{MAX_IMPORTANCE} "
                         f"(100 foreground .. 1000 gone)")
    with NpuManager(args.runtime_dir) as mgr:
        mgr.set_uid_importance(args.uid, level)
    print(f"uid {args.uid}: importance {importance_name(level)}")
    return 0
