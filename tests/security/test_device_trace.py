"""Attack: the driver's execution-step trace (``device.trace``, `npu trace record`).

Its replies hold every uid's steps (uid, feature, job, timing), and each poll keeps step
recording on. Since ux30 a reply holds at most ``MAX_REPLY_STEPS`` steps and says whether
``more`` follow (a reply of every step since the cursor outgrew the 1 MiB frame). Another
uid is refused (PermissionDenied) before its payload is read; an admin's cursor that is
not a number is InvalidArgument, and one that is negative or beyond the ring gets a bounded
reply; the device serves another uid throughout."""

from __future__ import annotations

import json
from pathlib import Path

from npumanager.drivers.exec_stats import MAX_REPLY_STEPS
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from npumanager.wire.client import SyncRpcClient
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import X, granted, outcome
from tests.security.harness import ATTACKER, BYSTANDER, assert_device_served, needs_root

pytestmark = needs_root


def call_trace(rt: str, cursors: list[bytes]) -> list[str]:
    """``device.trace`` with each cursor: what each got (its reply's size and keys)."""
    rpc = SyncRpcClient(str(driver_socket("reference", rt)), SERVICE, client_name="snoop")
    try:
        def one(c: bytes) -> str:
            payload, _ = rpc.call("device.trace", c)
            got = json.loads(payload)
            return f"{len(got['steps'])} steps, more {got['more']}, cursor {got['cursor']}"
        return [outcome(lambda c=c: one(c)) for c in cursors]  # type: ignore[misc]
    finally:
        rpc.close()


def execute(rt: str, n: int) -> int:
    """As a well-behaved app: ``n`` executions of a small model (a step each)."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(4, 1.0), grant=grant)
        for _ in range(n):
            model.execute({"x": X})
        model.release()
    return n


def test_another_uid_cannot_read_or_start_the_step_trace(start_npud: StartDaemon,
                                                          runtime_dir: Path) -> None:
    start_npud(drivers=True)
    rt = str(runtime_dir)
    got = procs.run_as(ATTACKER, None, call_trace, rt, [b"0", b"-1", b"x" * 20], timeout=60)
    assert all(g.startswith("PermissionDenied: device.trace is for npud and admins only")
               for g in got), got
    # As root (an admin): more steps than a reply holds come a page at a time.
    call_trace(rt, [b"0"])  # (recording on)
    procs.run_as(BYSTANDER, None, execute, rt, MAX_REPLY_STEPS + 100, timeout=300)
    first = call_trace(rt, [b"0"])[0]
    assert first.startswith(f"ok: {MAX_REPLY_STEPS} steps, more True"), first
    rest = call_trace(rt, [first.split()[-1].encode()])[0]
    assert rest.startswith("ok: ") and "more False" in rest, rest
    assert int(rest.split()[1]) >= 100, rest
    # A cursor that is not a number is a typed error; a negative one or
    # one far beyond the ring answers with at most a page; the host serves on.
    mine = call_trace(rt, [b"x" * 20, b"-1", b"99999999999999999999", b""])
    assert mine[0].startswith("InvalidArgument: device.trace takes a cursor"), mine
    for g in mine[1:]:
        assert g.startswith("ok: "), mine
        assert int(g.split()[1]) <= MAX_REPLY_STEPS, mine
    assert_device_served(runtime_dir)
