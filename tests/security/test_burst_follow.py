"""Attack 9 (follow-on poll): a hostile BACKGROUND app lies in its burst's ring stamps to
steer the poll ``background_follow_us`` makes after each BACKGROUND answer.

The poll (drivers/follow.py) is CPU of the driver's that nobody asked for: its length
is worked out from the stream's last gaps between an answer and the client's next ring,
and the client writes the ring's stamp (header bytes 44-63) into memory it can rewrite at
any moment. A stamp outside answer..seen is not believed (the time the driver saw the
request stands in), each poll is at most the configured window from its answer, and there
is at most one poll per answer. Here, under real uids, an attacker runs back to back with
garbage stamps (test_burst_stamps's kinds: zero, future, past, all ones, NaN's bytes,
backwards, random), then with a second thread scribbling the stamps all the time, while
another uid's BACKGROUND burst runs back to back through the SDK on the same host. What is
checked: every answer of either app is its own correct output; the driver's counters show
polls were made for the attacker (the bound was exercised) and never more than one per
answer, none caught more requests than polls were made; the device serves a third uid
after."""

from __future__ import annotations

import random
import struct
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from npumanager import NpuManager
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from tests.security.burst_apps import Raw
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted
from tests.security.harness import ATTACKER, BYSTANDER, assert_device_served, needs_root
from tests.security.test_burst_stamps import STAMPS_AT, STAMPS_END, _garbage, recent_bursts

pytestmark = needs_root

DRIVER = [{"name": "reference", "plugin": "reference", "channels": 2,
           "inline_run_us": 0, "background_burst_here": "normal",
           "background_follow_us": 5000}]
GARBAGE, SCRIBBLED, HONEST = 120, 120, 240
ATTACKER_BIAS, VICTIM_BIAS = 1.0, 10.0
U64 = struct.Struct("<QQ")


def attacker(rt: str) -> dict[str, Any]:
    """Back-to-back requests of its own burst, its stamps garbage, then scribbled."""
    rng = random.Random(11)
    got: dict[str, Any] = {"wrong": []}
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(4, ATTACKER_BIAS), grant=grant)
        r = Raw(model.burst())
        x_at, out_at = r.slot(0), r.slot(1)
        req = r.request(x_at, out_at)
        stop = threading.Event()

        def scribble() -> None:
            while not stop.is_set():
                r.buf[STAMPS_AT:STAMPS_END] = rng.randbytes(STAMPS_END - STAMPS_AT)
                time.sleep(0.0001)

        scribbler = threading.Thread(target=scribble)
        procs.announce("ready")
        procs.receive(timeout=120)
        last_rung = time.monotonic_ns()
        try:
            for i in range(GARBAGE + SCRIBBLED):
                if i == GARBAGE:
                    scribbler.start()
                if i < GARBAGE:
                    called, rung = _garbage(i, rng, last_rung)
                    U64.pack_into(r.buf, STAMPS_AT, called, rung)
                    last_rung = rung
                x = np.arange(i, i + 4, dtype=np.float32).reshape(1, 4)
                r.put(x_at, x)
                r.fill(out_at)
                status, result = r.call(req)
                out = (r.outputs(result) if status == "OK"
                       else r.get(out_at) if status == "SAME" else result)
                if out != (x + ATTACKER_BIAS).ravel().tolist():
                    got["wrong"].append((i, status, out))
        finally:
            stop.set()
            if scribbler.is_alive():
                scribbler.join(30)
        procs.announce("done")
        procs.receive(timeout=120)  # the test read the driver's counters meanwhile
        r.b.close()
    return got


def victim(rt: str) -> dict[str, Any]:
    """Another uid's BACKGROUND burst through the SDK, back to back (honest stamps)."""
    got: dict[str, Any] = {"wrong": [], "served": 0}
    with granted(rt, request_id=2) as (dev, grant):
        model = dev.prepare_model(add_model(4, VICTIM_BIAS), grant=grant)
        with model.burst() as b:
            procs.announce("ready")
            procs.receive(timeout=120)
            for i in range(HONEST):
                x = np.arange(100 + i, 104 + i, dtype=np.float32).reshape(1, 4)
                y = b.execute({"x": x})["y"]
                if np.array_equal(y, x + VICTIM_BIAS):
                    got["served"] += 1
                else:
                    got["wrong"].append((i, y.tolist()))
            procs.announce("done")
            procs.receive(timeout=120)
    return got


def test_lying_ring_stamps_bound_only_the_attackers_own_polls(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True, driver=DRIVER)
    rt = str(runtime_dir)
    with NpuManager(rt) as admin:
        for uid in (ATTACKER, BYSTANDER):
            admin.set_uid_importance(uid, 400)  # a service: its executions BACKGROUND
    bad = procs.spawn_as(ATTACKER, None, attacker, rt, timeout=300)
    good = procs.spawn_as(BYSTANDER, None, victim, rt, timeout=300)
    try:
        bad.expect("ready", 120)
        good.expect("ready", 120)
        bad.send("go")
        good.send("go")
        bad.expect("done", 240)
        good.expect("done", 240)
        bursts = recent_bursts(rt, GARBAGE + SCRIBBLED)  # both still open
        bad.send("bye")
        good.send("bye")
        mine = bad.wait(120)
        theirs = good.wait(120)
    finally:
        bad.kill()
        good.kill()

    assert theirs == {"wrong": [], "served": HONEST}, theirs
    assert mine == {"wrong": []}, mine
    by_uid = {b["uid"]: b for b in bursts}
    assert set(by_uid) == {ATTACKER, BYSTANDER}, bursts
    for uid, b in by_uid.items():
        assert not b["foreground"], b
        # At most one poll per answer; a poll catches at most the request it waited for.
        assert b["follows"] <= b["served"], (uid, b)
        assert b["followed"] + b["follow_expired"] <= b["follows"] + 1, (uid, b)
    assert by_uid[ATTACKER]["served"] >= GARBAGE + SCRIBBLED  # (and its opening one)
    assert by_uid[ATTACKER]["follows"] >= 1, by_uid[ATTACKER]  # (the bound was exercised)
    assert_device_served(runtime_dir)
