"""ManagerState: the MEMORY policy, drivers' memory and real model sizes (virtual time)."""

from __future__ import annotations

from npumanager.constants import (
    LoadStatus,
    Policy,
    UnloadReason,
)

from .state_harness import (
    BIG,
    CACHED,
    FG,
    GIB,
    MID,
    SMALL,
    VIS,
    budget,
    granted,
    memory,
    status_of,
    unloads,
)

# --- memory policy ---------------------------------------------------------------------

def test_memory_policy_budget_from_drivers() -> None:
    h = memory()
    assert h.state.budget_total == 8 * GIB
    h.hold(VIS, 1, BIG)  # 4 GiB declared
    h.hold(VIS, 2, MID)  # 2 GiB
    h.hold(VIS, 3, MID)  # 2 GiB: 8 of 8
    assert status_of(h.request(VIS, 4, SMALL), VIS, 4) == LoadStatus.NOT_PRIORITIZED
    assert h.state.budget_used == 8 * GIB


def test_memory_policy_charges_real_size() -> None:
    h = memory()
    h.hold(CACHED, 1, SMALL)  # declared < 1 GiB
    h.hold(VIS, 2, SMALL)
    out = h.memory(h.grant_of(CACHED, 1), 7 * GIB + 1)  # it lied: really 7 GiB and more
    assert unloads(out) == {(CACHED, 1): UnloadReason.MEMORY_PRESSURE}
    assert h.state.budget_used == 8 * GIB + 1
    # Until it leaves, nobody else fits.
    assert status_of(h.request(FG, 3, SMALL), FG, 3) == LoadStatus.WAIT_FOR_UNLOAD
    assert granted(h.unloaded(CACHED, 1)) == [(FG, 3)]


def test_memory_policy_smaller_real_size_still_charged_declared() -> None:
    h = memory()
    h.hold(VIS, 1, BIG)
    h.memory(h.grant_of(VIS, 1), 100)
    assert h.state.budget_used == 4 * GIB


def test_memory_policy_fixed_budget() -> None:
    h = memory()
    h.policy(int(Policy.MEMORY), memory_budget_bytes=2 * GIB)
    assert h.state.budget_total == 2 * GIB
    h.hold(VIS, 1, MID)
    assert status_of(h.request(VIS, 2, SMALL), VIS, 2) == LoadStatus.NOT_PRIORITIZED


def test_memory_for_an_ended_grant_is_ignored() -> None:
    h = memory()
    assert h.memory("no-such-grant", GIB) == []


def test_driver_down_keeps_grants_and_waits_new_requests() -> None:
    h = memory()
    h.hold(VIS, 1, BIG)
    out = h.driver_down("reference")
    assert unloads(out) == {} and h.state_of(VIS, 1) == "loaded"
    assert status_of(h.request(FG, 2, SMALL), FG, 2) == LoadStatus.NOT_PRIORITIZED
    out = h.driver_up("reference", 8 * GIB)
    assert granted(out) == [(FG, 2)]


def test_driver_reporting_less_memory_sheds() -> None:
    h = memory()
    h.hold(FG, 1, BIG)
    h.hold(CACHED, 2, BIG)
    out = h.driver_up("reference", 4 * GIB)
    assert unloads(out) == {(CACHED, 2): UnloadReason.MEMORY_PRESSURE}


def test_memory_policy_without_drivers_waits() -> None:
    h = budget(policy=Policy.MEMORY)
    assert status_of(h.request(FG, 1), FG, 1) == LoadStatus.NOT_PRIORITIZED
    assert granted(h.driver_up("npu0", GIB)) == [(FG, 1)]
