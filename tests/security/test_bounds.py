"""Per-uid bounds that live in npud: connections and live requests.

A uid at its bound gets a typed ``LimitExceeded`` at once (never a hang or a
silent drop), and every other uid keeps being served while it sits there."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from npumanager import ModelLoadRequest, NpuManager
from npumanager.errors import LimitExceeded
from npumanager.testing import procs
from tests.security.conftest import StartDaemon
from tests.security.harness import (
    ATTACKER,
    BYSTANDER,
    Lifecycle,
    assert_served,
    needs_root,
    served,
)

pytestmark = needs_root



def hog_connections(runtime_dir: str, n: int) -> dict[str, Any]:
    """Open connections until refused; then, still holding them, report; then free one
    and connect again."""
    held = [NpuManager(runtime_dir) for _ in range(n)]
    t0 = time.monotonic()
    try:
        NpuManager(runtime_dir).close()
        refused = "not refused"
    except LimitExceeded as exc:
        refused = f"LimitExceeded: {exc}"
    took = time.monotonic() - t0
    procs.receive(timeout=30)  # the test checks the bystander meanwhile
    held.pop().close()
    with NpuManager(runtime_dir) as again:
        reconnected = again.uid
    for m in held:
        m.close()
    return {"refused": refused, "took": took, "reconnected": reconnected}


def test_connections_per_uid_are_bounded_with_a_typed_error(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(manager={"max_connections_per_uid": 4})
    hog = procs.spawn_as(ATTACKER, None, hog_connections, str(runtime_dir), 4)
    try:
        assert npud.wait_for_output("refusing another"), "the attacker never reached its bound"
        procs.run_as(BYSTANDER, None, served, str(runtime_dir), 1)  # served meanwhile
        hog.send("go on")
        out = hog.wait()
    finally:
        hog.kill()
    assert out["refused"].startswith("LimitExceeded: uid 50001 already has 4 connections"), out
    assert out["took"] < 5, "the refusal must come at once"
    assert out["reconnected"] == ATTACKER
    assert npud.output.count("refusing another") == 1
    assert_served(runtime_dir)


def hog_requests(runtime_dir: str, n: int) -> dict[str, Any]:
    with NpuManager(runtime_dir) as mgr:
        cbs = [Lifecycle() for _ in range(n)]
        for i, cb in enumerate(cbs):
            mgr.request_can_load_model(ModelLoadRequest(id=i + 1), cb)
        try:
            mgr.request_can_load_model(ModelLoadRequest(id=n + 1), Lifecycle())
            refused = "not refused"
        except LimitExceeded as exc:
            refused = f"LimitExceeded: {exc}"
        procs.announce("at the bound")  # the refusal answered: npud holds the n before it
        procs.receive(timeout=30)
        mgr.cancel_model_load(ModelLoadRequest(id=1))
        cbs[0].wait_for("CANCELLED")
        mgr.request_can_load_model(ModelLoadRequest(id=n + 1), Lifecycle())  # room again
        return {"refused": refused, "seen": [cb.seen[:1] for cb in cbs]}


def test_live_requests_per_uid_are_bounded_with_a_typed_error(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(manager={"max_requests_per_uid": 3}, policy={"name": "BUDGET", "max_budget": 8})
    hog = procs.spawn_as(ATTACKER, None, hog_requests, str(runtime_dir), 3)
    try:
        hog.expect("at the bound")
        with NpuManager(runtime_dir) as admin:
            assert sum(r["uid"] == ATTACKER for r in admin.dump()["requests"]) == 3
        procs.run_as(BYSTANDER, None, served, str(runtime_dir), 1)
        hog.send("go on")
        out = hog.wait()
    finally:
        hog.kill()
    assert out["refused"] == "LimitExceeded: uid 50001 already has 3 live requests", out
    assert_served(runtime_dir, request_id=2)
