"""`npu policy set NAME [--max-budget N] [--weight SIZE=W ...]` (admin)."""

from __future__ import annotations

import argparse
from typing import Any

from npumanager.cli.main import UsageError, add_runtime_dir, int_range

#: The wire's int64 (npud said 'InvalidArgument: maxBudget N is out of range', exit 1, in
#: the protobuf's key name, for what is a bad flag value).
INT64_MAX = (1 << 63) - 1


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("policy", help="change npud's admission policy")
    add_runtime_dir(p)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    s = verbs.add_parser("set", help="set the policy (admin only)")
    add_runtime_dir(s)
    s.add_argument("name", help="status_quo, turn_taking, budget or memory (or 0-3)")
    s.add_argument("--max-budget", metavar="N", type=int_range(1, INT64_MAX),
                   default=None, help="BUDGET: the budget (> 0)")
    s.add_argument("--weight", action="append", default=[], metavar="SIZE=W",
                   help="BUDGET: weight of a size class (0 <1GB, 1 1-2GB, 2 >2GB); repeatable")
    s.add_argument("--memory-budget-bytes", metavar="BYTES", type=int_range(0, INT64_MAX),
                   default=None,
                   help="MEMORY: the budget in bytes (default: the drivers' memory)")
    s.set_defaults(func=main)


def parse_policy(text: str) -> int:
    from npumanager.constants import Policy

    try:
        return int(text)
    except ValueError:
        pass
    try:
        return int(Policy[text.strip().upper().replace("-", "_")])
    except KeyError:
        names = ", ".join(m.name.lower() for m in Policy)
        raise UsageError(f"unknown policy {text!r}; use one of {names}") from None


def main(args: argparse.Namespace) -> int:
    from npumanager.cli.fmt import nbytes, per_size
    from npumanager.client import KEY_MEMORY_BUDGET_BYTES, NpuManager
    from npumanager.constants import KEY_MAX_BUDGET, KEY_MODEL_SIZE_WEIGHTS, Policy

    policy = parse_policy(args.name)
    bundle: dict[str, Any] = {}
    if args.max_budget is not None:
        bundle[KEY_MAX_BUDGET] = args.max_budget
    if args.memory_budget_bytes is not None:
        bundle[KEY_MEMORY_BUDGET_BYTES] = args.memory_budget_bytes
    if args.weight:
        weights: dict[str, int] = {}
        for w in args.weight:
            size, sep, value = w.partition("=")
            try:
                if not sep:
                    raise ValueError
                size = str(int(size))
                weights[size] = int(value)
            except ValueError:
                raise UsageError(f"--weight wants SIZE=W (e.g. 2=4), not {w!r}") from None
            if size not in ("0", "1", "2") or not 1 <= int(value) <= INT64_MAX:
                raise UsageError(f"--weight {w!r}: SIZE is 0, 1 or 2 and W is >= 1")
        bundle[KEY_MODEL_SIZE_WEIGHTS] = weights
    with NpuManager(args.runtime_dir) as mgr:
        mgr.set_policy(policy, bundle or None)
    try:
        name = Policy(policy).name
    except ValueError:
        name = str(policy)
    said = [f"max budget {args.max_budget}"] if args.max_budget is not None else []
    if args.memory_budget_bytes is not None:
        said.append(f"memory budget {nbytes(args.memory_budget_bytes)}")
    if args.weight:
        said.append(f"weights {per_size(bundle[KEY_MODEL_SIZE_WEIGHTS])}")
    print(f"policy set to {name}" + (f" ({', '.join(said)})" if said else ""))
    return 0
