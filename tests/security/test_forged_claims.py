"""A forged reclaim: an app tells npud "I held grant X" after no restart at all.

``reclaim`` exists so that apps re-register after npud restarts, and a grant no driver holds
is only the client's word. The attacker claims a loaded request with a made-up grant while
the bystander holds the whole budget: the claim ends REVOKED, nobody is asked to unload for
it, and the bystander is still served."""

from __future__ import annotations

from pathlib import Path

from npumanager import NpuManager
from npumanager.proto.v1.manager_pb2 import Claim, Reclaim
from npumanager.testing import procs
from tests.security.conftest import StartDaemon
from tests.security.harness import ATTACKER, BYSTANDER, assert_served, holding_app, needs_root

pytestmark = needs_root


def forge(runtime_dir: str) -> list[tuple[str, str]]:
    """As the attacker: claim a loaded request under a grant npud never issued."""
    with NpuManager(runtime_dir) as mgr:
        claim = Claim(request_id=1, size=0, priority=0, state="loaded", grant_id="f" * 32)
        mgr._rpc.call("reclaim", Reclaim(claims=[claim]))
        mgr.dump()  # answered after the claim was handled
        return [(d["what"], str(d.get("details", ""))) for d in mgr.story(ATTACKER, 1)]


def test_a_forged_claim_neither_takes_the_budget_nor_unloads_others(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud()
    victim = procs.spawn_as(BYSTANDER, None, holding_app, str(runtime_dir), [7, 8, 9, 10])
    try:
        victim.expect("holding")  # 4 small models: the default budget of 4 is full
        story = procs.run_as(ATTACKER, None, forge, str(runtime_dir), timeout=30)
        with NpuManager(runtime_dir) as admin:
            requests = admin.dump()["requests"]
        assert sorted((r["uid"], r["state"]) for r in requests) == [(BYSTANDER, "loaded")] * 4
        assert story[-1][0] == "not adopted" and "no room" in story[-1][1], story
        victim.send("done")
        victim.wait()
    finally:
        victim.kill()
    assert_served(runtime_dir)


def bad_fields(runtime_dir: str) -> list[str]:
    """As the attacker: a request naming a device that does not exist (long), and a claim in a
    state no client can be in. Each gets its typed error; the connection stays usable."""
    from npumanager import ModelLoadRequest
    from npumanager.errors import InvalidArgument
    from tests.security.harness import Lifecycle

    seen = []
    with NpuManager(runtime_dir) as mgr:
        try:
            mgr.request_can_load_model(ModelLoadRequest(id=2, device="x" * 60_000), Lifecycle())
        except InvalidArgument as exc:
            seen.append(f"InvalidArgument: {str(exc)[:40]}")
        mgr._rpc.call("reclaim", Reclaim(claims=[Claim(request_id=3, state="owner-of-npud")]))
        seen += [d["what"] for d in mgr.story(ATTACKER, 3)]
    return seen


def test_unknown_devices_and_claim_states_get_typed_errors(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud()
    seen = procs.run_as(ATTACKER, None, bad_fields, str(runtime_dir), timeout=30)
    assert seen[0].startswith("InvalidArgument"), seen
    assert seen[-1] == "not adopted", seen
    assert_served(runtime_dir)
