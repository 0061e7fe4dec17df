"""Entry point of `npu`: each subcommand lives in its own module with ``register``.

Subcommand modules import heavy dependencies (onnxruntime, rich) inside their
functions so `npu status` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from npumanager.errors import NpuError
from npumanager.version import __version__

# Module names under npumanager.cli, in the order `npu --help` lists them.
COMMANDS = [
    "serve", "status", "policy", "importance", "thermal", "cache",
    "driver", "run", "demo", "bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu",
        description="npumanager: arbitrate an NPU between the ML workloads of a machine.",
    )
    parser.add_argument("--version", action="version", version=f"npumanager {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"npumanager.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"npumanager.cli.{name}":
                continue  # not built yet
            raise
        mod.register(sub)
    return parser


def add_runtime_dir(p: argparse.ArgumentParser) -> None:
    """Every command takes --runtime-dir (default: $NPU_RUNTIME_DIR, then the platform's)."""
    p.add_argument(
        "--runtime-dir",
        default=None,
        help="directory of npu.sock and drivers/ (default: $NPU_RUNTIME_DIR, /run/npu as root, "
        "else $XDG_RUNTIME_DIR/npu)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except NpuError as exc:
        print(f"npu {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)
