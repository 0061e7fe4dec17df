"""`npu demo`: the full demo (:mod:`npumanager.demo`) by default; ``--manager-only`` runs
the short scripted manager scenario below, which prints what happens.

It starts npud in a temporary runtime dir (no drivers needed) and runs three
client "apps" as separate processes — a foreground camera, a background LLM
and an embedding service — that ask before loading. You see the LLM
preempted by the camera, the embedding queued and then admitted, a thermal
spike asking low-ranked holders to unload, a stubborn holder revoked at its
deadline, and the LLM coming back once there is room. Every line an app
prints is a callback it really received from npud.

As root each app runs under its own uid (50101-50103), as apps on a phone do;
as another user they share yours, and npud never preempts within one uid.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from npumanager.cli.main import UsageError, add_runtime_dir

T0 = time.monotonic()


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="show what npumanager does: preemption, pause/resume, revocation, "
        "compilation cache, thermal (starts its own npud)",
        description="Start npud with the reference driver in a temporary dir (or use a running "
        "one with --runtime-dir), run a camera, a voice assistant, an embedding service and a "
        "background LLM as separate processes, and show what npud and the driver do. Exits 0 "
        "when everything it shows happened.")
    add_runtime_dir(p)
    p.add_argument("--fast", action="store_true", help="shorter scenes (about 15 s)")
    p.add_argument("--no-color", action="store_true", help="plain text, no colours")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="write trace.json (Perfetto), timeline.png and summary.json here "
                   "(default: a new directory under /tmp, named at the end)")
    p.add_argument("--driver", default="reference", choices=["reference", "openvino", "torch"],
                   help="the driver npud starts for the apps (default reference; openvino needs "
                   "npumanager[openvino])")
    p.add_argument("--manager-only", action="store_true",
                   help="a short scripted tour of the manager alone (npud without drivers): "
                   "preemption, queueing, thermal, revocation")
    p.add_argument("--compare", action="store_true",
                   help="the same apps run unmanaged (ONNX Runtime in each process), then "
                   "managed (npud + the reference driver): camera latency and background "
                   "throughput side by side (about 40 s; --fast is not shorter)")
    p.set_defaults(func=dispatch)


def dispatch(args: argparse.Namespace) -> int:
    if args.manager_only:
        if args.runtime_dir is not None:  # it ran its own npud there: a traceback beside
            # a running one ('another npud is already serving'), else an npud in the
            # user's directory, which it also chmodded 0755
            raise UsageError("--manager-only starts its own npud (no drivers); drop "
                             "--runtime-dir")
        return main(args)
    if args.compare:
        if args.runtime_dir is not None:
            raise UsageError("--compare starts its own npud (a known config); drop --runtime-dir")
        from npumanager.demo.contention import run_compare

        return run_compare(color=False if args.no_color else None)
    from npumanager.demo import DemoOptions, run_demo

    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} exists and is not a directory")
    if args.out:  # the files are written at the end: a bad DIR is said before the run
        try:
            Path(args.out).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {args.out}: cannot create it ({exc.strerror})") from None
        if not os.access(args.out, os.W_OK | os.X_OK):
            raise UsageError(f"--out {args.out} is not writable")
    check_demo_driver(args.driver)
    return run_demo(DemoOptions(runtime_dir=args.runtime_dir, fast=args.fast,
                                color=False if args.no_color else None, out=args.out,
                                driver=args.driver))


def check_demo_driver(driver: str) -> None:
    """UsageError unless the demo can run on ``driver`` here."""
    import importlib.util

    if driver == "torch":
        raise UsageError("--driver torch: the demo's four apps run ONNX models, and the torch "
                         "driver takes torch.export programs; not available in the demo yet")
    if driver == "openvino" and importlib.util.find_spec("openvino") is None:
        raise UsageError("--driver openvino needs the openvino extra: "
                         "pip install 'npumanager[openvino]'")


def say(who: str, text: str) -> None:
    print(f"  +{time.monotonic() - T0:5.2f}s  {who:<10} {text}", flush=True)


def app(name: str, runtime_dir: str, comply: bool) -> None:
    """One demo app (runs in a forked process): obeys ('request', id, size, prio),
    ('unload', id) and ('exit',) from the demo, and narrates every callback."""
    from npumanager import (
        LoadStatus,
        ModelLoadRequest,
        ModelLoadRequestCallback,
        NpuManager,
        RequestStatus,
        UnloadReason,
    )
    from npumanager.testing import procs

    listeners: dict[int, Any] = {}
    reqs: dict[int, Any] = {}

    class Callback(ModelLoadRequestCallback):
        def on_can_load_model(self, request: Any, status: LoadStatus, listener: Any) -> None:
            listeners[request.id] = listener
            if status == LoadStatus.CAN_LOAD_NOW:
                say(name, f"request {request.id}: CAN_LOAD_NOW (grant {listener.grant_id[:8]}) "
                          f"-> loads the model, reports loaded")
                listener.notify_model_loaded(request)
            elif status == LoadStatus.WAIT_FOR_UNLOAD:
                say(name, f"request {request.id}: WAIT_FOR_UNLOAD (others are asked to make room)")
            else:
                say(name, f"request {request.id}: NOT_PRIORITIZED (queued until it fits)")

        def on_request_unload_model(self, request: Any, reason: UnloadReason) -> None:
            if comply:
                say(name, f"request {request.id}: asked to unload ({reason.name}) -> unloads")
                listeners[request.id].notify_model_unloaded(request)
            else:
                say(name, f"request {request.id}: asked to unload ({reason.name}) -> ignores it")

        def on_model_load_request_complete(self, request: Any, status: RequestStatus) -> None:
            extra = " (its grant is gone: the driver released the model)" \
                if status == RequestStatus.REVOKED else ""
            say(name, f"request {request.id}: {status.name}{extra}")

    with NpuManager(runtime_dir) as mgr:
        while True:
            cmd = procs.receive(timeout=30)
            if cmd[0] == "exit":
                time.sleep(0.05)
                return
            if cmd[0] == "request":
                _, rid, size, prio = cmd
                reqs[rid] = ModelLoadRequest(rid, size, prio)
                say(name, f"request {rid}: asks to load a {reqs[rid].size.name} model "
                          f"({reqs[rid].priority.name})")
                mgr.request_can_load_model(reqs[rid], Callback())
            elif cmd[0] == "unload":
                say(name, f"request {cmd[1]}: done with the model -> unloads")
                listeners[cmd[1]].notify_model_unloaded(reqs[cmd[1]])


def _wait(pred: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def main(args: argparse.Namespace) -> int:
    from npumanager import Importance, ModelPriority, ModelSize, NpuManager, ThermalStatus
    from npumanager.testing.daemon import DaemonProcess
    from npumanager.testing.procs import Child, spawn_as

    global T0
    T0 = time.monotonic()
    rt = Path(tempfile.mkdtemp(prefix="npu-demo-", dir="/tmp"))  # (--runtime-dir: refused)
    os.chmod(rt, 0o755)
    root = os.getuid() == 0
    uids = {"camera": 50101, "llm": 50102, "embedding": 50103}
    config = {"manager": {"unload_deadline_s": 1.0, "log_level": "warning"},
              "policy": {"name": "BUDGET", "max_budget": 4}}
    print("npu demo: three apps share one accelerator through npud "
          "(BUDGET policy: budget 4; weights <1GB 1, 1-2GB 2, >2GB 4)")
    if not root:
        print(f"  (running as uid {os.getuid()}: the apps share it, and npud never preempts "
              f"within one uid; run as root to see per-app uids)")
    children: dict[str, Child] = {}
    npud = DaemonProcess(rt, config)
    try:
        npud.start()
        say("npud", f"ready on {npud.socket_path}")
        with NpuManager(rt) as admin:
            def state(name: str, rid: int) -> str | None:
                uid = uids[name] if root else os.getuid()
                for r in admin.dump()["requests"]:
                    if r["uid"] == uid and r["request_id"] == rid:
                        return str(r["state"])
                return None

            if root:
                for name, imp in (("camera", Importance.FOREGROUND),
                                  ("llm", Importance.CACHED), ("embedding", Importance.SERVICE)):
                    admin.set_uid_importance(uids[name], imp)
                    say("admin", f"uid {uids[name]} ({name}) importance {imp.name}")
            else:
                admin.set_uid_importance(os.getuid(), Importance.FOREGROUND)
            for name in ("llm", "embedding", "camera"):
                children[name] = spawn_as(uids[name] if root else None, None, app, name,
                                          str(rt), name != "embedding", timeout=30)

            children["llm"].send(("request", 1, ModelSize.GREATER_THAN_2G,
                                  ModelPriority.BACKGROUND))
            _wait(lambda: state("llm", 1) == "loaded")
            children["embedding"].send(("request", 1, ModelSize.LESS_THAN_1GB,
                                        ModelPriority.NORMAL))
            _wait(lambda: state("embedding", 1) is not None)
            time.sleep(0.1)
            say("demo", "the user opens the camera (foreground)")
            children["camera"].send(("request", 1, ModelSize.BETWEEN_1GB_AND_2GB,
                                     ModelPriority.NORMAL))
            _wait(lambda: state("camera", 1) == "loaded")
            _wait(lambda: state("embedding", 1) == "loaded", 1.0)
            time.sleep(0.1)
            say("demo", "the device heats up: admin overrides thermal status to SEVERE "
                        "(holders ranked above PERCEPTIBLE must leave)")
            admin.override_thermal_status(ThermalStatus.SEVERE)
            _wait(lambda: state("embedding", 1) is None, 3.0)
            time.sleep(0.1)
            say("demo", "the device cools down: thermal override reset")
            admin.reset_thermal_status()
            children["llm"].send(("request", 2, ModelSize.GREATER_THAN_2G,
                                  ModelPriority.BACKGROUND))
            _wait(lambda: state("llm", 2) is not None)
            time.sleep(0.1)
            say("demo", "the user closes the camera")
            children["camera"].send(("unload", 1))
            _wait(lambda: state("llm", 2) == "loaded")
            time.sleep(0.1)
            dump = admin.dump()
            say("npud", f"state: {dump.get('summary', '')}")
            story = admin.story(uids["embedding"] if root else os.getuid(), 1)
            if story:
                say("npud", "story of the embedding's request 1 (`npu status --story`):")
                for d in story:
                    print(f"           {d['what']}  ({d['stimulus_id']})", flush=True)
            for c in children.values():
                c.send(("exit",))
            for name, c in list(children.items()):
                try:
                    c.wait(5)
                except Exception as exc:  # a demo app failing is worth a line, not a trace
                    say(name, f"ended badly: {exc}")
                del children[name]
    finally:
        for c in children.values():
            c.kill()
        npud.stop()
        shutil.rmtree(rt, ignore_errors=True)
    print("done: the foreground kept its model; background work waited, left when asked, "
          "or was revoked.")
    sys.stdout.flush()
    return 0
