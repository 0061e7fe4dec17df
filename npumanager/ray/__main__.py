"""``python -m npumanager.ray resources [--runtime-dir DIR] [--slots N]``: this node's
custom resources as JSON, for ``ray start --resources "$(...)"``."""

from __future__ import annotations

import argparse
import json
import sys

from npumanager.errors import NpuError
from npumanager.ray.resources import node_resources


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npumanager.ray")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resources", help="this node's npu resources as JSON (for ray start)")
    r.add_argument("--runtime-dir", default=None, help="npud's runtime dir")
    r.add_argument("--slots", type=int, default=1, help="NPU actors Ray may place per device")
    args = p.parse_args(argv)
    try:
        print(json.dumps(node_resources(args.runtime_dir, slots=args.slots)))
    except NpuError as exc:
        print(f"npumanager.ray: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
