"""ManagerState: one budget per device (virtual time, exact instructions).

A machine with a CPU, a GPU and an NPU is three budgets: a request competes only
with the holders of its device, its victims are only that device's holders, a
grant names its device, MEMORY uses each device's own memory, and a device's own
thermal status scales only its budget.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from npumanager.constants import LoadStatus, Policy, RequestStatus, ThermalStatus, UnloadReason
from npumanager.errors import InvalidArgument
from npumanager.service import events as ev
from npumanager.service.policy import DeviceLimits, ManagerParams

from .state_harness import (
    BG,
    BGP,
    BIG,
    CACHED,
    FG,
    GIB,
    MID,
    SMALL,
    VIS,
    Harness,
    budget,
    completes,
    granted,
    status_of,
    unloads,
)

CPU, GPU, NPU = "openvino:CPU", "openvino:GPU", "openvino:NPU"
T = ThermalStatus


def three(policy: Policy = Policy.BUDGET, **kw: object) -> Harness:
    """The cast's uids on a machine whose openvino driver serves a CPU, a GPU and an NPU."""
    h = budget(policy=policy, **kw)
    h.driver_up("openvino", devices={CPU: 32 * GIB, GPU: 8 * GIB, NPU: 4 * GIB})
    return h


def test_devices_are_learned_from_the_driver_in_its_order() -> None:
    h = three()
    assert h.state.devices() == [CPU, GPU, NPU]
    assert [b["device"] for b in h.state.dump(h.now)["budgets"]] == [CPU, GPU, NPU]


def test_grant_names_its_device() -> None:
    h = three()
    out = h.request(FG, 1, BIG, device=NPU)
    assert out == [
        ev.IssueGrant(FG, 1, "grant-0001", NPU),
        ev.SendCanLoad(FG, FG, 1, LoadStatus.CAN_LOAD_NOW, "grant-0001", NPU),
    ]
    assert h.state.grant_devices() == {"grant-0001": NPU}
    assert h.state.device_of(FG, 1) == NPU


def test_request_without_a_device_goes_to_the_first() -> None:
    h = three()
    out = h.request(FG, 1)
    assert out[0] == ev.IssueGrant(FG, 1, "grant-0001", CPU)
    assert h.state.used_on(CPU) == 1 and h.state.used_on(GPU) == 0


def test_unknown_device_is_refused_naming_the_known_ones() -> None:
    h = three()
    with pytest.raises(InvalidArgument) as err:
        h.request(FG, 1, device="openvino:VPU")
    msg = str(err.value)
    assert "openvino:VPU" in msg and all(d in msg for d in (CPU, GPU, NPU))
    assert h.state.request_state(FG, 1) is None
    assert h.request(FG, 1, device=GPU)  # the id was not used up by the refusal


def test_foreground_on_the_gpu_never_unloads_background_on_the_npu() -> None:
    h = three()
    h.hold(BG, 1, BIG, device=NPU)  # 4 of the NPU's 4
    out = h.request(FG, 2, BIG, device=GPU)
    assert out == [
        ev.IssueGrant(FG, 2, "grant-0002", GPU),
        ev.SendCanLoad(FG, FG, 2, LoadStatus.CAN_LOAD_NOW, "grant-0002", GPU),
    ]
    assert h.state_of(BG, 1) == "loaded"
    # On the NPU itself the foreground does preempt it.
    out = h.request(FG, 3, BIG, device=NPU)
    assert out == [
        ev.AskUnload(BG, BG, 1, UnloadReason.PREEMPTED, NPU),
        ev.ArmTimer("unload:1004:1:0", h.now + 5.0),
        ev.SendCanLoad(FG, FG, 3, LoadStatus.WAIT_FOR_UNLOAD, None, NPU),
    ]
    out = h.unloaded(BG, 1)
    assert completes(out) == {(BG, 1): RequestStatus.COMPLETE}
    assert granted(out) == [(FG, 3)]


def test_a_full_device_queues_only_its_own_requests() -> None:
    h = three()
    h.hold(FG, 1, BIG, device=GPU)
    out = h.request(VIS, 2, SMALL, device=GPU)  # nothing worse ranked to preempt
    assert out == [ev.SendCanLoad(VIS, VIS, 2, LoadStatus.NOT_PRIORITIZED, None, GPU)]
    # A worse-ranked request on another device is not held behind the GPU's queue head.
    assert granted(h.request(CACHED, 3, BIG, device=NPU)) == [(CACHED, 3)]
    assert granted(h.request(CACHED, 4, BIG, device=CPU)) == [(CACHED, 4)]
    # Freeing the NPU does nothing for the GPU's waiter; freeing the GPU grants it.
    assert granted(h.unloaded(CACHED, 3)) == []
    assert granted(h.unloaded(FG, 1)) == [(VIS, 2)]


def test_victims_are_only_holders_of_the_waiters_device() -> None:
    h = three()
    h.hold(CACHED, 1, BIG, device=CPU)
    h.hold(CACHED, 2, MID, device=NPU)
    h.hold(BG, 3, MID, device=NPU)
    out = h.request(FG, 4, BIG, device=NPU)
    assert unloads(out) == {(CACHED, 2): UnloadReason.PREEMPTED, (BG, 3): UnloadReason.PREEMPTED}
    assert all(i.device == NPU for i in out if isinstance(i, ev.AskUnload))
    assert h.state_of(CACHED, 1) == "loaded"


def test_fairness_turns_are_taken_per_device() -> None:
    h = three(policy=Policy.TURN_TAKING)
    h.importance(VIS + 10, 200)  # a peer of VIS's rank
    h.hold(VIS, 1, device=GPU)
    h.hold(VIS, 2, device=NPU)
    assert status_of(h.request(VIS + 10, 3, device=GPU), VIS + 10, 3) \
        == LoadStatus.NOT_PRIORITIZED
    # VIS's work on the NPU completed: no peer waits there, nobody is asked.
    assert unloads(h.completed(VIS, device=NPU)) == {}
    # Its work on the GPU completed while a peer waits on the GPU: its GPU turn is over.
    out = h.completed(VIS, device=GPU)
    assert unloads(out) == {(VIS, 1): UnloadReason.FAIRNESS}
    assert h.state_of(VIS, 2) == "loaded"


def test_memory_policy_uses_each_devices_own_memory() -> None:
    h = three(policy=Policy.MEMORY)
    assert [h.state.total_on(d) for d in (CPU, GPU, NPU)] == [32 * GIB, 8 * GIB, 4 * GIB]
    h.hold(VIS, 1, BIG, device=NPU)  # 4 GiB declared: the NPU is full
    assert status_of(h.request(VIS, 2, SMALL, device=NPU), VIS, 2) \
        == LoadStatus.NOT_PRIORITIZED
    assert granted(h.request(VIS, 3, BIG, device=GPU)) == [(VIS, 3)]
    # A model larger than declared on the GPU sheds on the GPU only.
    h.hold(CACHED, 4, BIG, device=GPU)
    out = h.memory(h.grant_of(VIS, 3), 6 * GIB)
    assert unloads(out) == {(CACHED, 4): UnloadReason.MEMORY_PRESSURE}
    assert h.state_of(VIS, 1) == "loaded"


def test_driver_down_holds_new_grants_on_its_devices_only() -> None:
    h = budget(policy=Policy.MEMORY)
    h.driver_up("openvino", devices={CPU: 8 * GIB, NPU: 4 * GIB})
    h.driver_up("reference", 8 * GIB)
    h.hold(VIS, 1, BIG, device=NPU)
    out = h.driver_down("openvino")
    assert unloads(out) == {} and h.state_of(VIS, 1) == "loaded"
    assert status_of(h.request(FG, 2, device=CPU), FG, 2) == LoadStatus.NOT_PRIORITIZED
    assert granted(h.request(FG, 3, device="reference")) == [(FG, 3)]
    out = h.driver_up("openvino", devices={CPU: 8 * GIB, NPU: 4 * GIB})
    assert granted(out) == [(FG, 2)]


def test_a_device_its_driver_stops_reporting_is_down() -> None:
    h = budget(policy=Policy.MEMORY)
    h.driver_up("openvino", devices={CPU: 8 * GIB, NPU: 4 * GIB})
    h.driver_up("openvino", devices={CPU: 8 * GIB})
    assert h.state.devices() == [CPU, NPU]
    assert h.state.total_on(NPU) == 0
    assert status_of(h.request(FG, 1, device=NPU), FG, 1) == LoadStatus.NOT_PRIORITIZED


def test_device_thermal_scales_only_that_device() -> None:
    h = three()
    h.hold(BG, 1, MID, device=GPU)
    h.hold(BG, 2, MID, device=NPU)
    out = h.thermal(T.SEVERE, device=NPU)
    assert ev.SetDriverThermal(T.SEVERE, NPU) in out
    assert unloads(out) == {(BG, 2): UnloadReason.THERMAL}  # rank 300 > 230, NPU only
    assert h.state.device_thermal(NPU) is T.SEVERE
    assert h.state.device_thermal(GPU) is T.NONE
    assert (h.state.total_on(NPU), h.state.total_on(GPU)) == (2, 4)
    assert h.state.thermal_status is T.NONE


def test_machine_thermal_applies_to_every_device_and_a_hotter_device_stays_hotter() -> None:
    h = three()
    h.thermal(T.CRITICAL, device=NPU)
    out = h.thermal(T.MODERATE)
    assert ev.SetDriverThermal(T.MODERATE) in out
    assert [h.state.device_thermal(d) for d in (CPU, GPU, NPU)] == [
        T.MODERATE, T.MODERATE, T.CRITICAL]
    h.thermal(T.NONE, device=NPU)
    assert h.state.device_thermal(NPU) is T.MODERATE  # the machine's status still holds


def test_device_ceiling_overrides_the_global_budget() -> None:
    params = replace(ManagerParams(), device_limits={NPU: DeviceLimits(max_budget=1)})
    h = three(params=params)
    assert [h.state.total_on(d) for d in (CPU, GPU, NPU)] == [4, 4, 1]
    h.hold(VIS, 1, device=NPU)
    assert status_of(h.request(VIS, 2, device=NPU), VIS, 2) == LoadStatus.NOT_PRIORITIZED
    h.policy(int(Policy.BUDGET), max_budget=8)  # the ceiling is the hardware's: it stays
    assert [h.state.total_on(d) for d in (CPU, GPU, NPU)] == [8, 8, 1]


def test_policy_change_recharges_and_sheds_per_device() -> None:
    h = three()
    h.hold(FG, 1, MID, device=GPU)
    h.hold(CACHED, 2, MID, device=GPU)
    h.hold(CACHED, 3, MID, device=NPU)
    out = h.policy(int(Policy.BUDGET), max_budget=2)
    assert unloads(out) == {(CACHED, 2): UnloadReason.POLICY_CHANGED}


def test_placeholder_devices_stand_for_drivers_until_they_report() -> None:
    h = budget(drivers=("reference", "openvino"))
    assert h.state.devices() == ["reference", "openvino"]
    out = h.request(FG, 1)  # before any driver is up: the first driver's first device
    assert out[0] == ev.IssueGrant(FG, 1, "grant-0001", "reference")
    h.request(VIS, 2, device="openvino")
    h.driver_up("openvino", devices={CPU: GIB, NPU: GIB})
    h.driver_up("reference", devices={"reference:cpu0": GIB, "reference:cpu1": GIB})
    assert h.state.devices() == ["reference:cpu0", "reference:cpu1", CPU, NPU]
    assert h.state.device_of(FG, 1) == "reference:cpu0"
    assert h.state.device_of(VIS, 2) == CPU
    assert h.state.grant_devices()["grant-0001"] == "reference:cpu0"


def test_a_device_name_of_another_driver_is_refused() -> None:
    h = three()
    with pytest.raises(InvalidArgument, match="openvino"):
        h.driver_up("torch", devices={"torch:cpu": GIB, CPU: GIB})
    assert h.state.devices() == [CPU, GPU, NPU]


def test_background_prefetch_on_one_device_yields_only_there() -> None:
    h = three()
    h.hold(FG, 1, BIG, BGP, device=GPU)  # foreground app's background prefetch (rank 1100)
    out = h.request(VIS, 2, BIG, device=CPU)
    assert granted(out) == [(VIS, 2)] and h.state_of(FG, 1) == "loaded"
    out = h.request(VIS, 3, BIG, device=GPU)
    assert unloads(out) == {(FG, 1): UnloadReason.PREEMPTED}


def test_dump_and_repr_show_every_budget() -> None:
    h = three()
    h.hold(FG, 1, BIG, device=NPU)
    h.hold(VIS, 2, SMALL, device=GPU)
    d = h.state.dump(h.now)
    by = {b["device"]: b for b in d["budgets"]}
    assert (by[NPU]["used"], by[GPU]["used"], by[CPU]["used"]) == (4, 1, 0)
    assert by[NPU]["driver"] == "openvino" and by[NPU]["up"] is True
    assert d["budget"]["device"] == CPU  # the first device, as before
    assert {r["device"] for r in d["requests"]} == {NPU, GPU}
    assert f"{NPU} 4/4 used" in repr(h.state)
    story = h.state.story(FG, 1)
    assert story[0].details["device"] == NPU
