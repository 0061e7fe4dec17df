"""`npu bench [NAME ...]`: run the benchmarks in the source tree's bench/ directory;
`npu bench NAME OPTIONS...` hands OPTIONS to that one.

Each benchmark is a standalone script that prints a table with a baseline
measured in the same run; this command finds and runs them in turn.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from npumanager.cli.main import UsageError, add_runtime_dir
from npumanager.words import nouns


def bench_dir() -> Path | None:
    here = Path(__file__).resolve().parents[2] / "bench"
    return here if here.is_dir() else None


def available() -> list[str]:
    d = bench_dir()
    if d is None:
        return []
    return sorted(p.stem for p in d.glob("*.py") if not p.name.startswith("_"))


def _run(args: argparse.Namespace) -> int:
    d = bench_dir()
    if d is None:
        print("npu bench: the bench/ directory ships with the source tree; run from a checkout",
              file=sys.stderr)
        return 1
    names = args.names or available()
    unknown = [n for n in names if n not in available()]
    if unknown:
        raise UsageError(f"unknown {nouns(len(unknown), 'benchmark')} {', '.join(unknown)}; "
                         f"available: {', '.join(available())}")
    if args.runtime_dir is not None:
        # Each benchmark measures against an npud of its own, started in a fresh temp dir
        # with a known config: a shared, busy npud would measure the other workloads.
        print(f"npu bench: the benchmarks start their own npud; {args.runtime_dir} is not "
              f"used", file=sys.stderr)
    if args.passed_on and len(names) != 1:
        raise UsageError(f"{' '.join(args.passed_on)}: options go to one benchmark; name it "
                         "(npu bench contention --repeat 3)")
    rc = 0
    for name in names:
        print(f"== bench/{name}.py ==", flush=True)
        rc |= subprocess.call([sys.executable, str(d / f"{name}.py"), *args.passed_on])
    return rc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="run the benchmarks (each prints a table with its baseline)",
                       usage="npu bench [-h] [--runtime-dir DIR] [names ...] [OPTIONS of one]",
                       epilog="Options after one name go to that benchmark: npu bench "
                       "contention --repeat 3 (python bench/NAME.py --help lists them).")
    p.add_argument("names", nargs="*",
                   help=f"benchmarks to run (default: all): {', '.join(available())}")
    add_runtime_dir(p)
    # Options after the name go to that benchmark (npu bench contention --repeat 3 --only
    # unmanaged,default-auto), as `python bench/NAME.py ...` takes them.
    p.set_defaults(func=_run, passed_on=[])
