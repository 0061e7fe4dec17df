"""`npu run MODEL.onnx`: the run-test-inference tool.

Asks npud for a grant (waits for CAN_LOAD_NOW), prepares the model on a
device with that grant, executes it with random inputs matching the model's
input shapes and dtypes, prints the outputs and the latency (p50/p99), and
reports the model unloaded.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path
from typing import Any

from npumanager.cli.fmt import nbytes
from npumanager.cli.main import UsageError, add_runtime_dir, int_range, positive_float
from npumanager.hal import MAX_PRIORITY, MIN_PRIORITY
from npumanager.words import plural


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from npumanager.cli.models import BUILTINS

    p = sub.add_parser(
        "run", help="ask npud, prepare a model, execute it, print timing",
        description="Ask npud for a grant, prepare MODEL (an .onnx file) or a built-in model on "
        "a device, execute it with random inputs, print the outputs and the latency, and report "
        "the model unloaded. Built-in models: " + ", ".join(BUILTINS) + " (--builtin list).")
    p.add_argument("model", nargs="?", default=None, help="an ONNX file")
    p.add_argument("--builtin", metavar="NAME", default=None,
                   help="run a small model built in memory instead of a file; "
                   "'list' shows them")
    p.add_argument("--save", metavar="FILE", default=None,
                   help="with --builtin: write the model to FILE (.onnx) and exit")
    add_runtime_dir(p)
    p.add_argument("--device", metavar="NAME", default=None,
                   help="device name (default: npud's first)")
    p.add_argument("--job-priority", metavar="P", default=0,
                   type=int_range(MIN_PRIORITY, MAX_PRIORITY),
                   help=f"job priority {MIN_PRIORITY}..{MAX_PRIORITY} (lower runs first)")
    p.add_argument("--repeat", metavar="N", type=int_range(1), default=10,
                   help="executions to time (>= 1; default 10)")
    p.add_argument("--steps", metavar="N", type=int_range(1), default=1,
                   help="steps per execution (>= 1)")
    p.add_argument("--size", default="0", choices=("0", "1", "2"),
                   help="ModelSize class to declare (0 <1GB, 1 1-2GB, 2 >2GB)")
    p.add_argument("--wait", metavar="S", type=positive_float, default=60.0,
                   help="seconds to wait for npud's CAN_LOAD_NOW (default 60)")
    p.add_argument("--seed", metavar="N", type=int_range(0), default=0,
                   help="seed of the random inputs (default 0): the same N, the same inputs")
    p.set_defaults(func=main)


def load_model(args: argparse.Namespace) -> tuple[bytes, dict[str, str]]:
    """The model's bytes and its step feedback, from --builtin or the MODEL file."""
    from npumanager.cli.models import BUILTINS

    if args.builtin is not None:
        if args.model is not None:
            raise UsageError("give either MODEL or --builtin NAME, not both")
        b = BUILTINS.get(args.builtin)
        if b is None:
            raise UsageError(f"no built-in model {args.builtin!r}; "
                             f"use one of: {', '.join(BUILTINS)}")
        return b.build(), dict(b.feedback)
    if args.save is not None:
        raise UsageError("--save goes with --builtin NAME")
    if args.model is None:
        raise UsageError("name an ONNX file, or run a built-in model: --builtin NAME "
                         f"({', '.join(BUILTINS)})")
    path = Path(args.model)
    if path.is_dir():
        raise UsageError(f"{path} is a directory; name an .onnx file")
    try:
        onnx = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    if not onnx:
        raise UsageError(f"{path} is empty; name an .onnx file")
    return onnx, {}


def pick_device(devices: list[Any], wanted: str | None) -> str | None:
    """--device checked against what npud serves (UsageError naming them), else npud's first
    (None: it serves none, a manager without drivers, which still answers the request)."""
    names = [d.name for d in devices]
    if wanted is None:
        return str(names[0]) if names else None
    if wanted not in names:
        raise UsageError(f"--device {wanted}: npud serves no such device "
                         f"(devices: {', '.join(names) or 'none'})")
    return wanted


def connect_device(name: str | None, runtime_dir: str | None) -> Any:
    """nn.device(name), where a driver that does not answer is named as down: npud did
    answer (it listed the device), so "is `npu serve` running?" would mislead."""
    from npumanager import nn
    from npumanager.errors import DeviceUnavailable

    if name is None:
        raise DeviceUnavailable("npud serves no device (started with --no-drivers?)")
    try:
        return nn.device(name, runtime_dir)
    except DeviceUnavailable:
        raise DeviceUnavailable(f"device {name} is down (npud lists it, its driver does not "
                                "answer); `npu status` says why") from None


def check_feedable(spec: Any) -> bool:
    """npu run feeds random tensors: an input of another kind is said in one line (a
    sequence's empty dtype was a TypeError traceback)."""
    if not spec.is_tensor:
        from npumanager.errors import InvalidArgument

        raise InvalidArgument(f"input {spec.name!r} is {spec.type}: npu run feeds random "
                              "tensors only; run this model from your own code (nn)")
    return True


def _describe(value: Any) -> str:
    """An output as ONNX Runtime gives it: a tensor's shape, dtype and first values; a
    sequence, a map or an absent optional by what it is (they have no shape)."""
    if value is None:
        return "None (an absent optional)"
    if isinstance(value, list):
        return f"a sequence of {len(value)}"
    if isinstance(value, dict):
        return f"a map of {len(value)}"
    return f"shape {tuple(value.shape)} {value.dtype} {_fmt(value)}"


def _fmt(values: Any) -> str:
    flat = values.reshape(-1)[:6]
    more = " ..." if values.size > 6 else ""
    return "[" + ", ".join(f"{v:.4g}" if values.dtype.kind == "f" else str(v)
                           for v in flat) + more + "]"


def main(args: argparse.Namespace) -> int:
    import numpy as np

    from npumanager import nn
    from npumanager.client import ModelLoadRequest, ModelLoadRequestCallback, NpuManager
    from npumanager.constants import LoadStatus, ModelSize, RequestStatus
    from npumanager.errors import GrantRequired
    from npumanager.testing.onnx_models import random_inputs

    granted = threading.Event()
    unload_asked = threading.Event()
    box: dict[str, Any] = {}

    class Callback(ModelLoadRequestCallback):
        def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
            box["status"] = LoadStatus(status)
            if status == LoadStatus.CAN_LOAD_NOW:
                box["listener"] = listener
                granted.set()
            else:
                print(f"npud: {LoadStatus(status).name}; waiting")

        def on_request_unload_model(self, request: Any, reason: Any = None) -> None:
            name = getattr(reason, "name", reason)
            print(f"npud asks to unload ({name}); stopping")
            unload_asked.set()

        def on_model_load_request_complete(self, request: Any, status: Any) -> None:
            box["complete"] = status
            granted.set()

    if args.builtin == "list":
        from npumanager.cli.models import listing

        print("built-in models (npu run --builtin NAME):\n" + listing())
        return 0
    onnx, feedback = load_model(args)
    if args.save is not None:
        try:  # a place it cannot write is a usage error, as every output's is (README)
            Path(args.save).write_bytes(onnx)
        except OSError as exc:
            raise UsageError(f"--save {args.save}: cannot write it ({exc.strerror})") from None
        print(f"wrote {args.builtin} to {args.save} ({nbytes(len(onnx))})")
        return 0
    name = pick_device(nn.devices(args.runtime_dir), args.device)
    # The grant is valid on its device only: ask for the one the model will be prepared on.
    request = ModelLoadRequest(id=(os.getpid() << 8) | int(time.time()) & 0xFF,
                               size=ModelSize(int(args.size)), device=name)
    cut = ""  # why the executions stopped before --repeat ("": they did not)
    with NpuManager.connect(args.runtime_dir) as mgr:
        t0 = time.perf_counter()
        mgr.request_can_load_model(request, Callback())
        if not granted.wait(args.wait) or "listener" not in box:
            last = box.get("status")
            why = (f"the request ended {RequestStatus(box['complete']).name}"
                   if "complete" in box else
                   f"last answer {last.name}" if last is not None else "no answer")
            mgr.cancel_model_load(request)
            raise GrantRequired(f"npud did not grant the load within {args.wait:g} s ({why})")
        listener = box["listener"]
        grant_ms = (time.perf_counter() - t0) * 1e3
        with connect_device(name, args.runtime_dir) as dev:
            t0 = time.perf_counter()
            model = dev.prepare_model(onnx, grant=listener)
            prepare_ms = (time.perf_counter() - t0) * 1e3
            listener.notify_model_loaded(request)
            times: list[float] = []
            outputs: dict[str, Any] = {}
            try:
                try:
                    print(f"device {name} ({dev.capabilities.backend}); granted in "
                          f"{grant_ms:.1f} ms, prepared in {prepare_ms:.1f} ms, "
                          f"{nbytes(model.memory_bytes)} of device memory", flush=True)
                    inputs = random_inputs([(t.name, t.dtype, t.shape) for t in model.inputs
                                            if check_feedable(t)], args.seed)
                    for _ in range(max(1, args.repeat)):
                        if unload_asked.is_set():
                            cut = "npud asked for the model back"
                            break
                        t0 = time.perf_counter()
                        outputs = model.execute(inputs, job_priority=args.job_priority,
                                                steps=args.steps,
                                                feedback=feedback if args.steps > 1 else None)
                        times.append(time.perf_counter() - t0)
                except KeyboardInterrupt:  # what ran is still worth its line; exit 130
                    cut = "interrupted"
            finally:
                model.release()
                listener.notify_model_unloaded(request)
    for oname, value in outputs.items():
        print(f"  {oname}: {_describe(value)}")
    if times:
        ts = np.sort(np.array(times)) * 1e3
        p50 = ts[len(ts) // 2]
        p99 = ts[min(len(ts) - 1, int(len(ts) * 0.99))]
        of = f" of {args.repeat} ({cut})" if cut else ""
        print(f"{plural(len(ts), 'execution')}{of}: p50 {p50:.3f} ms, p99 {p99:.3f} ms, "
              f"min {ts[0]:.3f} ms; unloaded")
    elif cut:
        print(f"no execution ({cut}); unloaded")
    return 130 if cut == "interrupted" else 0
