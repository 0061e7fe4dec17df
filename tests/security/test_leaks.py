"""Attack 8 (manager side): one uid reading what another runs from `npu status`.

A non-admin's dump holds its own requests in full and the other uids' requests
only as counts per state: no other uid, request id, pid or grant-id prefix.
Admins see everything."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from npumanager import NpuManager
from npumanager.cli.main import main as npu
from npumanager.errors import PermissionDenied
from npumanager.testing import procs
from tests.security.conftest import StartDaemon
from tests.security.harness import (
    ATTACKER,
    BYSTANDER,
    assert_served,
    holding_app,
    needs_root,
)

pytestmark = needs_root


def snoop(runtime_dir: str) -> dict[str, Any]:
    """As the attacker: the dump, `npu status` and `npu status --json` output, and what
    reading the bystander's story gives."""
    with NpuManager(runtime_dir) as mgr:
        dump = mgr.dump()
        try:
            story: Any = mgr.story(BYSTANDER, 7)
        except PermissionDenied as exc:
            story = f"PermissionDenied: {exc}"
        own_story = mgr.story(ATTACKER, 1)
        try:
            log: Any = mgr.decisions(0.0)
        except PermissionDenied as exc:
            log = f"PermissionDenied: {exc}"
    outs = []
    for extra in ([], ["--json"]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = npu(["status", "--runtime-dir", runtime_dir, *extra])
        outs.append((rc, buf.getvalue()))
    return {"dump": dump, "story": story, "own_story": own_story, "status": outs,
            "decisions": log}


def test_non_admin_sees_own_requests_and_only_counts_of_others(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(policy={"name": "STATUS_QUO"})
    victim = procs.spawn_as(BYSTANDER, None, holding_app, str(runtime_dir), [7, 8])
    mine = procs.spawn_as(ATTACKER, None, holding_app, str(runtime_dir), [1])
    try:
        victim.expect("holding")  # both hold their grants before we look
        mine.expect("holding")
        with NpuManager(runtime_dir) as admin:
            assert sorted((r["uid"], r["state"]) for r in admin.dump()["requests"]) == [
                (ATTACKER, "loaded"), (BYSTANDER, "loaded"), (BYSTANDER, "loaded")]
            seen = procs.run_as(ATTACKER, None, snoop, str(runtime_dir))
            full = admin.dump()
        victim.send("done")
        mine.send("done")
        victim_grants = victim.wait()
        mine.wait()
    finally:
        victim.kill()
        mine.kill()

    dump = seen["dump"]
    # The whole decision log (what `npu trace` reads) is for admins only.
    assert seen["decisions"].startswith("PermissionDenied: the decision log is for admins")
    assert dump["visibility"] == "own"
    assert [(r["uid"], r["request_id"]) for r in dump["requests"]] == [(ATTACKER, 1)]
    assert dump["other_requests"] == {"loaded": 2}
    assert list(dump["uids"]) == [str(ATTACKER)]
    assert all(k[0] == ATTACKER for k in dump["queue"] + dump["parked"])
    text = json.dumps(dump)
    assert str(BYSTANDER) not in text
    for grant in victim_grants.values():
        assert grant[:8] not in text
    assert str(seen["story"]).startswith("PermissionDenied"), seen["story"]
    assert seen["own_story"], "the attacker may read its own request's story"
    (rc, table), (rc_json, raw) = seen["status"]
    assert rc == 0 and rc_json == 0
    assert "other uids' requests: 2 loaded" in table
    assert str(BYSTANDER) not in table and str(BYSTANDER) not in raw
    # The admin's view is complete.
    assert full["visibility"] == "all"
    assert sorted((r["uid"], r["request_id"]) for r in full["requests"]) == [
        (ATTACKER, 1), (BYSTANDER, 7), (BYSTANDER, 8)]
    assert_served(runtime_dir)


def test_admin_status_renders_every_request(start_npud: StartDaemon, runtime_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    start_npud(policy={"name": "STATUS_QUO"})
    victim = procs.spawn_as(BYSTANDER, None, holding_app, str(runtime_dir), [7])
    try:
        victim.expect("holding")
        assert npu(["status", "--runtime-dir", str(runtime_dir)]) == 0
        out = capsys.readouterr().out
        assert str(BYSTANDER) in out and "other uids' requests" not in out
        victim.send("done")
        victim.wait()
    finally:
        victim.kill()
