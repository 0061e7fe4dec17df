"""Attack 9 (stamps): a hostile app rewrites its burst's client stamps (header bytes 44-63).

With ``burst_anticipate_us`` on, the driver learns a FOREGROUND burst's pace from the
client's clock: each request carries when its call began and when it was rung, written by
the app into memory it can rewrite at any moment (drivers/anticipate.py). A stamp later
than when the driver saw the request, more than 100 ms before it, or not after the one
before is not believed (the driver's own time stands in); the window is at most the
configured ``burst_anticipate_us`` either way. So a lying app can only misplace its own
window. Here, under real uids, the attacker:

1. stamps a pace of its own making, plausible and exactly periodic, so the driver learns
   it and plans windows by it;
2. then stamps garbage, one kind per request: zero, in the future, far in the past, all
   ones, NaN's bytes, going backwards, random;
3. then rewrites bytes 44-63 from a second thread all the time, while requests are in
   flight (each one read by the driver at an instant the attacker does not know).

Meanwhile another uid's FOREGROUND burst runs at the same pace through the real SDK, its
requests ``VICTIM_LAG_S`` after the attacker's (both pace from one CLOCK_MONOTONIC start the
test sends): the attacker's poll window opens just before the victim's, every frame. What
is checked: every answer of the other app is its own correct output; every answer of the
attacker is its own correct output, never the other's (stamps are no part of a request);
the driver's counters show every window it planned for either burst no longer than the
configured one and each poll within that plus the bounded oversleep and warm-up
allowances; windows were planned (the bound was exercised); neither stream was starved of
anticipation by the other's windows (the one poll slot goes in turns between uids,
drivers/poll_turns.py: first come, first served, the victim was skipped many windows in
a row); the device serves a third uid after. No wall-clock limits: the pace is each app's
own; counts and outputs are compared."""

from __future__ import annotations

import json
import random
import struct
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from npumanager import NpuManager
from npumanager.drivers.anticipate import MAX_OVERSLEEP_S, MAX_WARM_S
from npumanager.drivers.burst_counters import LATE, POLLED, RUNG
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.tensorio import burst as layout
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from npumanager.wire.client import SyncRpcClient
from tests.security.burst_apps import Raw
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted
from tests.security.harness import ATTACKER, BYSTANDER, assert_device_served, needs_root

pytestmark = needs_root

WINDOW_US = 300
DRIVER = [{"name": "reference", "plugin": "reference", "channels": 2,
           "burst_anticipate_us": WINDOW_US}]
#: Both apps at 30 Hz: a pace the driver learns even on a loaded machine (intervals within
#: 10 % of their median), with a window of the full configured length (at most a tenth
#: of the period).
PERIOD_S = 1 / 30
PLAUSIBLE, GARBAGE, SCRIBBLED = 40, 56, 40
VICTIM_CALLS = PLAUSIBLE + GARBAGE + SCRIBBLED
ATTACKER_BIAS, VICTIM_BIAS = 1.0, 10.0
#: The victim's requests this long after the attacker's: their windows (300 µs, a warm-up
#: before) overlap every frame, the attacker's opening first.
VICTIM_LAG_S = 100e-6
STAMPS_AT, STAMPS_END = layout.CALLED_AT, layout.HEADER  # bytes 44-63
U64 = struct.Struct("<QQ")
NAN_BYTES = struct.unpack("<Q", struct.pack("<d", float("nan")))[0]


def _garbage(kind: int, rng: random.Random, last_rung: int) -> tuple[int, int]:
    """(called, rung) of one kind, as u64 nanoseconds on CLOCK_MONOTONIC."""
    now = time.monotonic_ns()
    return [
        (0, 0),  # none
        (now + 10**10, now + 10**10),  # ten seconds in the future
        (1, 2),  # far in the past (boot)
        (2**64 - 1, 2**64 - 1),  # all ones
        (NAN_BYTES, NAN_BYTES),  # NaN's bytes
        (last_rung - 10**6, last_rung - 10**6),  # before the previous one
        (rng.getrandbits(64), rng.getrandbits(64)),  # random
    ][kind % 7]


def attacker(rt: str) -> dict[str, Any]:
    """A FOREGROUND burst driven by hand at 30 Hz; its stamps as the module says. Returns
    each call's status and output, the inputs' index with it."""
    rng = random.Random(7)
    got: dict[str, Any] = {"answers": []}
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(4, ATTACKER_BIAS), grant=grant)
        r = Raw(model.burst())
        x_at, out_at = r.slot(0), r.slot(1)
        req = r.request(x_at, out_at)
        stop = threading.Event()

        def scribble() -> None:
            while not stop.is_set():
                r.buf[STAMPS_AT:STAMPS_END] = rng.randbytes(STAMPS_END - STAMPS_AT)
                time.sleep(0.0002)

        scribbler = threading.Thread(target=scribble)
        procs.announce("ready")
        _, start = procs.receive(timeout=120)  # both apps go together, from one start
        last_rung = start
        try:
            for i in range(PLAUSIBLE + GARBAGE + SCRIBBLED):
                due = start + round(i * PERIOD_S * 1e9)
                pause = (due - time.monotonic_ns()) / 1e9
                if pause > 0:
                    time.sleep(pause)
                if i == PLAUSIBLE + GARBAGE:
                    scribbler.start()
                if i < PLAUSIBLE:  # a pace of its own: exactly periodic, believable
                    called = rung = due
                elif i < PLAUSIBLE + GARBAGE:
                    called, rung = _garbage(i, rng, last_rung)
                else:
                    called = rung = 0  # the scribbler's bytes are what the driver reads
                if i < PLAUSIBLE + GARBAGE:
                    U64.pack_into(r.buf, STAMPS_AT, called, rung)
                    r.buf[STAMPS_AT + 16:STAMPS_END] = b"\xff" * (STAMPS_END - STAMPS_AT - 16)
                last_rung = rung
                x = np.arange(i, i + 4, dtype=np.float32).reshape(1, 4)
                r.put(x_at, x)
                r.fill(out_at)
                status, result = r.call(req)
                if status == "OK":
                    out = r.outputs(result)
                elif status == "SAME":
                    out = r.get(out_at)
                else:
                    out = result  # a typed error's message
                got["answers"].append((i, status, out))
        finally:
            stop.set()
            if scribbler.is_alive():
                scribbler.join(30)
        procs.announce("done")
        procs.receive(timeout=120)  # the test read the driver's counters meanwhile
        r.b.close()
    return got


def paced(rt: str, slots: list[int], bias: float, request_id: int = 2,
          lag_s: float = VICTIM_LAG_S) -> dict[str, Any]:
    """A FOREGROUND burst through the SDK (honest stamps), one request at each of ``slots``
    (periods of PERIOD_S from the start the test sends, plus ``lag_s``); each answer
    checked against its input plus ``bias``."""
    got: dict[str, Any] = {"wrong": [], "served": 0}
    with granted(rt, request_id=request_id) as (dev, grant):
        model = dev.prepare_model(add_model(4, bias), grant=grant)
        with model.burst() as b:
            b.execute({"x": np.zeros((1, 4), np.float32)})  # opened
            procs.announce("ready")
            _, start_ns = procs.receive(timeout=120)
            start = start_ns / 1e9 + lag_s
            for i in slots:
                pause = start + i * PERIOD_S - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                x = np.arange(100 + i, 104 + i, dtype=np.float32).reshape(1, 4)
                y = b.execute({"x": x})["y"]
                if np.array_equal(y, x + bias):
                    got["served"] += 1
                else:
                    got["wrong"].append((i, y.tolist()))
            procs.announce("done")
            procs.receive(timeout=120)
    return got


def victim(rt: str) -> dict[str, Any]:
    """Another uid's FOREGROUND burst at 30 Hz, just after the attacker's requests."""
    return paced(rt, list(range(VICTIM_CALLS)), VICTIM_BIAS)


def recent_bursts(rt: str, served: int = 0) -> list[dict[str, Any]]:
    """device.stats's open bursts with their last requests' times, as root sees them;
    read again (up to 10 s) until each has counted ``served`` requests: a burst's thread
    counts a request after it answered it (off the answer's path), so a read right after
    the app's last answer may come before that count."""
    deadline = time.monotonic() + 10.0
    while True:
        rpc = SyncRpcClient(str(driver_socket("reference", rt)), SERVICE)
        try:
            payload, _ = rpc.call("device.stats", b"recent")
            bursts = list(json.loads(payload)["bursts"])
        finally:
            rpc.close()
        if all(b["served"] >= served for b in bursts) or time.monotonic() > deadline:
            return bursts
        time.sleep(0.01)


def race(start_npud: StartDaemon, runtime_dir: Path, attack: Any, *args: Any,
         served: int = VICTIM_CALLS) -> tuple[Any, Any, list[dict[str, Any]]]:
    """npud with DRIVER, both uids FOREGROUND; ``attack(rt, *args)`` as ATTACKER and the
    victim as BYSTANDER, both from one start; (the attacker's result, the victim's, both
    bursts' counters once each has served ``served``)."""
    start_npud(drivers=True, driver=DRIVER)
    rt = str(runtime_dir)
    with NpuManager(rt) as admin:
        for uid in (ATTACKER, BYSTANDER):
            admin.set_uid_importance(uid, 100)  # FOREGROUND: their bursts anticipated
    bad = procs.spawn_as(ATTACKER, None, attack, rt, *args, timeout=300)
    good = procs.spawn_as(BYSTANDER, None, victim, rt, timeout=300)
    try:
        bad.expect("ready", 120)
        good.expect("ready", 120)
        start = time.monotonic_ns() + 200_000_000  # (CLOCK_MONOTONIC: one clock for all)
        bad.send(("go", start))
        good.send(("go", start))
        bad.expect("done", 240)
        good.expect("done", 240)
        bursts = recent_bursts(rt, served)  # both still open
        bad.send("bye")
        good.send("bye")
        mine = bad.wait(120)
        theirs = good.wait(120)
    finally:
        bad.kill()
        good.kill()
    return mine, theirs, bursts


def planned_windows(bursts: list[dict[str, Any]]) -> dict[int, int]:
    """Per uid, the windows the driver planned for its burst, each checked: at most the
    configured one, its poll within that plus the bounded oversleep and warm-up
    allowances, and no more than the requests served."""
    window = WINDOW_US / 1e6
    by_uid = {b["uid"]: b for b in bursts}
    assert set(by_uid) == {ATTACKER, BYSTANDER}, bursts
    planned = {}
    for uid, b in by_uid.items():
        rows = b["recent"]
        windows = [(r[-4], r[-3], r[6]) for r in rows if r[-4] is not None]
        planned[uid] = len(windows)
        for opens, until, poll0 in windows:
            assert until - opens <= window + 1e-9, (uid, opens, until)
            if poll0 is not None:
                assert until - poll0 <= window + MAX_OVERSLEEP_S + MAX_WARM_S + 1e-9, (
                    uid, poll0, until)
        assert b["served"] >= len(rows)
    return planned


def test_garbage_stamps_misplace_only_the_attackers_window(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    mine, theirs, bursts = race(start_npud, runtime_dir, attacker)
    # The other app: every answer its own, correct.
    assert theirs == {"wrong": [], "served": VICTIM_CALLS}, theirs
    # The attacker: its own correct outputs, or a typed error; never the other's.
    # (Stamps are no part of the request: no error was due, and none came.)
    answers = mine["answers"]
    assert len(answers) == PLAUSIBLE + GARBAGE + SCRIBBLED, answers
    for i, status, out in answers:
        x = np.arange(i, i + 4, dtype=np.float32)
        assert status in ("OK", "SAME") and out == (x + ATTACKER_BIAS).tolist(), (
            i, status, out)

    # The driver's counters: every window planned at most the configured one, every poll
    # within it plus the bounded allowances for oversleep and warm-up; and windows were
    # planned for the attacker's burst (the bound was exercised, not vacuous).
    planned = planned_windows(bursts)
    by_uid = {b["uid"]: b for b in bursts}
    assert planned[ATTACKER] >= 1, (planned, by_uid[ATTACKER])
    # Neither uid's stream starved of anticipation by the other's (drivers/poll_turns.py):
    # both paced from the same "go", their windows overlap, and the one poll slot goes in
    # turns. First come, first served, one was skipped many windows in a row.
    turns = {uid: poll_turns(b) for uid, b in by_uid.items()}
    for uid, (took, skipped, run) in turns.items():
        assert took >= 1 and took >= skipped / 3 and run <= MAX_SKIPPED_RUN, (uid, turns)
    assert_device_served(runtime_dir)


#: The most windows in a row one stream may reach and not poll in. Turns alternate (runs
#: of 1-2 measured in five runs); first come, first served the victim's runs reached 5, 5,
#: 3 and 14 in four runs. (A holder the machine preempts can overrun its window, and a
#: window planned late is not yet there to give way to: some slack.)
MAX_SKIPPED_RUN = 3


def poll_turns(burst: dict[str, Any]) -> tuple[int, int, int]:
    """(windows polled in, windows skipped: the slot held or given up for another uid,
    the longest run of skipped ones) from a burst's recent requests: a window planned
    and the slot held (``polled``, ``late``), or planned and the request found by its
    doorbell (``rung``)."""
    took = skipped = run = longest = 0
    for r in burst["recent"]:
        how = r[1]
        if how in (POLLED, LATE):  # it held the slot (the window caught it, or ended)
            took, run = took + 1, 0
        elif how == RUNG and r[-4] is not None:  # a window planned, the slot not taken
            skipped, run = skipped + 1, run + 1
            longest = max(longest, run)
    # (The counters may hold one more: the wait in progress when they were read, skipped
    # after the last request, whose request never comes.)
    assert 0 <= burst["busy"] + burst.get("deferred", 0) - skipped <= 1, burst
    return took, skipped, longest
