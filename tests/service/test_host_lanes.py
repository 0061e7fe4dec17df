"""service/host_lanes.py without processes: which host of a device a grant is told to, the
acknowledgements a lane owes when it goes, and which host a hung device's restart kills."""

from __future__ import annotations

import asyncio
from typing import Any

from npumanager.constants import ModelPriority
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.service.driver_slots import Backoff, DriverSlot
from npumanager.service.host_lanes import HostLanes, grant_target, make_lane


def slot(name: str = "ref", **entry: Any) -> DriverSlot:
    return DriverSlot(name=name, number=0, entry=dict(entry), backoff=Backoff(0.2, 10.0),
                      info=DeviceInfo(name=name))


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def driver_up(self, info: DeviceInfo) -> None:
        self.seen.append(("up", info.name))

    def driver_down(self, name: str, reason: str) -> None:
        self.seen.append(("down", name))

    def grant_end_applied(self, driver: str, grant_id: str) -> None:
        self.seen.append(("applied", grant_id))


class Lanes(HostLanes):
    def __init__(self, *slots: DriverSlot) -> None:
        self.slots = list(slots)
        self.lanes = [s.background for s in slots if s.background is not None]
        self.events: Any = Events()


def test_background_and_opportunistic_grants_go_to_the_lane_others_to_the_main_host() -> None:
    main = slot(background={"channels": 1}, restart_backoff_s=0.5)
    lane = make_lane(main, "/rt/drivers/ref.background.sock")
    assert (lane.main, main.background, lane.lane, lane.sock_name) == (
        main, lane, "background", "ref.background")
    assert lane.entry["channels"] == 1 and lane.backoff.first == 0.5  # its own keys
    assert lane.label == "ref (background lane)"
    for priority, want in ((ModelPriority.NORMAL, main), (ModelPriority.BACKGROUND, lane),
                           (ModelPriority.OPPORTUNISTIC, lane)):
        assert grant_target(main, int(priority)) is want
    alone = slot("other")  # no lane: everything on its one host
    assert grant_target(alone, int(ModelPriority.BACKGROUND)) is alone


def test_a_lane_that_goes_applies_the_ends_it_owed_and_leaves_the_device_up() -> None:
    async def run() -> list[tuple[str, Any]]:
        main = slot()
        lane = make_lane(main, "/x.sock")
        lanes = Lanes(main)
        lane.up = True
        lane.acks = {"g1", "g2"}
        lanes._announce_down(lane, "killed")
        lanes._await_ack(lane, "g3")  # (down: nothing holds g3's models any more)
        await asyncio.sleep(0)
        seen: list[tuple[str, Any]] = lanes.events.seen
        return seen

    seen = asyncio.run(run())
    assert seen == [("applied", "g1"), ("applied", "g2"), ("applied", "g3")]  # no ("down", ..)


def test_a_hung_device_kills_the_hosts_that_owe_an_acknowledgement() -> None:
    main = slot()
    lane = make_lane(main, "/x.sock")
    main.up = lane.up = True
    assert HostLanes._hung(main) == [main]  # nobody owes one: the main host, as before
    lane.acks.add("g")
    assert HostLanes._hung(main) == [lane]
    main.acks.add("h")
    assert HostLanes._hung(main) == [main, lane]
    alone = slot("other")
    assert HostLanes._hung(alone) == [alone]


def test_npu_status_shows_both_hosts_of_a_device() -> None:
    from npumanager.cli.status import render

    def dump(hosts: dict[str, Any]) -> dict[str, Any]:
        return {"devices": [{"name": "ref", "available": True, "backend": "onnxruntime",
                             "hosts": hosts}]}

    both = render(dump({"pid": 12, "background": {"pid": 34, "up": True}}), width=400)
    assert "pid 12 + bg 34" in both
    down = render(dump({"pid": 12, "background": {"pid": 0, "up": False,
                                                  "down_reason": "exited with code -9"}}),
                  width=400)
    assert "pid 12 + bg DOWN: exited with code -9" in down
    assert "pid 12 " in render(dump({"pid": 12}), width=400) + " "  # no lane: its one pid
