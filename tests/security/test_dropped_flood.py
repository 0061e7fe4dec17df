"""Attack: a hostile uid floods npud with load requests it must refuse.

The attacker holds as many live requests as its uid may (``max_requests_per_uid``), then
sends, over a raw connection and as fast as npud answers, rounds of load requests npud
refuses before deciding anything: payloads that are no LoadRequest (``malformed``), a size
or priority npud does not know (``invalid``), and well-formed requests past its uid's
bound (``over_limit``). What is checked, under real uids:

* every one is answered with its typed error, and ``npu_requests_dropped_total`` counts
  exactly those, by reason (none as ``error`` or ``client_gone``);
* another uid is served during the flood and after it;
* npud's memory and fds stay bounded: after a warm-up flood, at least ``FLOOD_ROUNDS``
  more rounds leave its RSS within ``RSS_GROWTH_MB`` (under 140 bytes a refusal) and its
  fd count where it was (a refusal keeps nothing; measured over 15000: RSS 48.4 -> 47.7
  MiB, fds 16 -> 16)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

from npumanager import ModelLoadRequest, NpuManager
from npumanager.errors import InvalidArgument, LimitExceeded
from npumanager.paths import manager_socket
from npumanager.proto.v1.manager_pb2 import LoadRequest
from npumanager.service.metrics import DROPPED
from npumanager.testing import procs
from npumanager.wire.client import SyncRpcClient
from tests.ops.test_metrics import scrape, value
from tests.security.conftest import StartDaemon
from tests.security.harness import (
    ATTACKER,
    Lifecycle,
    assert_served,
    needs_root,
    wait_for_fds_at_most,
)

pytestmark = needs_root

MAX_REQUESTS = 3
WARM_ROUNDS, FLOOD_ROUNDS = 500, 5000
RSS_GROWTH_MB = 2.0
DEVICE = "none"  # npud without drivers labels its request counts so
#: Payloads no LoadRequest parses from (protobuf DecodeError): a field number past the
#: limit, a truncated varint, a length past the end, wire type 7, an 11-byte varint.
MALFORMED = [b"\xff\xff\xff\xff", b"\x08", b"\x0a\x05ab", b"\x0f\x01",
             b"\x08" + b"\x80" * 10 + b"\x01"]


def flood(rt: str) -> dict[str, Any]:
    """As the attacker: hold the uid's requests, flood (warm-up, then the measured
    rounds); what each refusal was, per phase."""
    seen: Counter[str] = Counter()
    wrong: list[str] = []
    ids = iter(range(1000, 10**9))

    def send(raw: SyncRpcClient, kind: str, payload: bytes | LoadRequest) -> None:
        try:
            raw.call("request", payload)
            wrong.append(f"{kind}: accepted")
        except LimitExceeded:
            seen["over_limit" if kind == "over_limit" else f"{kind}?LimitExceeded"] += 1
        except InvalidArgument as exc:
            ok = kind in ("malformed", "invalid") and (
                (kind == "malformed") == str(exc).startswith("malformed"))
            seen[kind if ok else f"{kind}?{exc}"] += 1

    def rounds(raw: SyncRpcClient, n: int) -> None:
        for i in range(n):
            send(raw, "malformed", MALFORMED[i % len(MALFORMED)])
            bad = (LoadRequest(request_id=next(ids), size=99) if i % 2 else
                   LoadRequest(request_id=next(ids), priority=77))
            send(raw, "invalid", bad)
            send(raw, "over_limit", LoadRequest(request_id=next(ids)))

    with NpuManager(rt) as mgr:
        for i in range(MAX_REQUESTS):
            mgr.request_can_load_model(ModelLoadRequest(id=i + 1), Lifecycle())
        raw = SyncRpcClient(str(manager_socket(rt)), "manager")
        try:
            rounds(raw, WARM_ROUNDS)
            procs.announce(("warm", dict(seen), list(wrong)))
            procs.receive(timeout=120)
            stop = threading.Event()
            threading.Thread(target=lambda: (procs.receive(timeout=300), stop.set()),
                             daemon=True).start()
            rounds(raw, 10)
            procs.announce(("flooding",))
            n = 10
            while n < FLOOD_ROUNDS or not stop.is_set():  # until the bystander was served
                rounds(raw, 10)
                n += 10
            procs.announce(("flooded", n, dict(seen), list(wrong)))
            procs.receive(timeout=120)
        finally:
            raw.close()
    return {"seen": dict(seen), "wrong": wrong}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def dropped(npud: Any) -> dict[str, float]:
    samples = scrape(npud)
    return {r: value(samples, "npu_requests_dropped_total", device=DEVICE, reason=r)
            for r in DROPPED}


def test_a_flood_of_refused_load_requests_is_counted_and_bounded(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(manager={"max_requests_per_uid": MAX_REQUESTS},
                      policy={"name": "BUDGET", "max_budget": 8},
                      metrics={"listen": "127.0.0.1:0"})
    rt = str(runtime_dir)
    attacker = procs.spawn_as(ATTACKER, None, flood, rt, timeout=600)
    try:
        _, warm, wrong = attacker.expect(lambda e: e[0] == "warm", 300)
        assert not wrong, wrong
        assert warm == {"malformed": WARM_ROUNDS, "invalid": WARM_ROUNDS,
                        "over_limit": WARM_ROUNDS}, warm
        assert dropped(npud) == {**dict.fromkeys(DROPPED, 0.0),
                                 **{k: float(n) for k, n in warm.items()}}
        fds0, rss0 = wait_for_fds_at_most(npud.pid, 10**6, 0), rss_mb(npud.pid)
        attacker.send("go")
        attacker.expect(lambda e: e[0] == "flooding", 300)
        assert_served(runtime_dir)  # during the flood
        attacker.send("stop")
        _, n, seen, wrong = attacker.expect(lambda e: e[0] == "flooded", 300)
        fds1, rss1 = wait_for_fds_at_most(npud.pid, fds0, 30), rss_mb(npud.pid)
        flooded = dropped(npud)
        attacker.send("bye")
        out = attacker.wait(120)
    finally:
        attacker.kill()
    total = WARM_ROUNDS + n
    assert not wrong and out["seen"] == seen == dict.fromkeys(
        ("malformed", "invalid", "over_limit"), total), (seen, wrong)
    # Counted once each, by reason; nothing else was dropped...
    want = {**dict.fromkeys(DROPPED, 0.0), "malformed": total, "invalid": total,
            "over_limit": total}
    assert flooded == want, flooded
    # ...until the attacker left holding its live requests: they never got a status.
    assert dropped(npud) == {**want, "client_gone": float(MAX_REQUESTS)}
    # Bounded: the refusals kept nothing (the bystander's connection closed meanwhile).
    assert fds1 <= fds0, (fds0, fds1)
    assert rss1 - rss0 < RSS_GROWTH_MB, (rss0, rss1)
    assert_served(runtime_dir, request_id=2)
    print(f"npud after {3 * n} refusals: RSS {rss0:.1f} -> {rss1:.1f} MiB, "
          f"fds {fds0} -> {fds1}")
