"""`npu chaos --duration S [--apps N] [--seed S]`: npud, the reference driver and N apps
under faults, checked from outside (see :mod:`npumanager.testing.chaos`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from npumanager.cli.main import UsageError, add_runtime_dir, int_range, positive_float


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "chaos", help="run npud, the reference driver and apps under faults; check; report",
        description="Start npud with the reference driver and N app processes (under their "
        "own uids as root) that request, cancel, prepare, execute, unload and die, while "
        "npud is SIGKILLed or SIGTERMed and restarted, the driver SIGKILLed, apps "
        "stopped past their unload deadline and thermal status and importance move; "
        "check the invariants from outside and print a report, which names the directory "
        "with the run's logs. Exit 1 on any violation.")
    p.add_argument("--duration", type=duration, default=60.0, metavar="T",
                   help="how long to run: seconds, or with a unit: 90s, 10m, 1h "
                   "(default 60)")
    p.add_argument("--apps", type=int_range(1, 64), default=4, metavar="N",
                   help="app processes (default 4)")
    p.add_argument("--seed", type=int, default=1, metavar="S", help="random seed (default 1)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--log-dir", type=Path, default=None, metavar="DIR",
                   help="run in DIR and keep it: npud.log (npud and its driver hosts), "
                   "stats/ (each app's executes), rt/, state/ (default: a new temporary "
                   "directory, removed after a clean run, kept and named on a violation)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary directory after a clean run too")
    add_runtime_dir(p)  # every command takes it; this one says why it has no use for one
    p.set_defaults(func=main)


def duration(text: str) -> float:
    """Seconds: ``600``, ``600s``, ``10m``, ``1h`` (the issue's ``--duration 10m``)."""
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(text[-1:].lower())
    seconds = positive_float(text[:-1] if scale else text) * (scale or 1.0)
    return seconds


duration.__name__ = "duration"


def main(args: argparse.Namespace) -> int:
    from npumanager.testing.chaos import run_chaos

    if args.runtime_dir is not None:
        raise UsageError("npu chaos starts its own npud, which it SIGKILLs and restarts, in "
                         "DIR/rt of --log-dir DIR (default: a temporary dir); drop "
                         "--runtime-dir")
    report = run_chaos(args.duration, args.apps, args.seed, workdir=args.log_dir,
                       keep=args.keep)
    if args.json:
        print(json.dumps(report.__dict__, indent=1))
    else:
        print(report.render())
    return 1 if report.violations else 0
