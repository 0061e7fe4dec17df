"""service/host_lanes.py without processes: which host of a device a grant is told to (by
the request's effective class; kept for the grant's life; an adopted one where it is held), the
acknowledgements a lane owes when it goes, and which host a hung device's restart kills."""

from __future__ import annotations

import asyncio
from typing import Any

from npumanager.constants import ModelPriority
from npumanager.hal.exec_class import ExecClass, model_class
from npumanager.hal.types import SchedulingConfig, default_config
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.service.driver_feed import DriverFeed
from npumanager.service.driver_slots import Backoff, DriverSlot
from npumanager.service.host_lanes import HostLanes, grant_class, grant_target, make_lane


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


FG_APP = SchedulingConfig(uid=1000, app_priority=100)  # a camera: FOREGROUND importance


def test_background_and_opportunistic_grants_go_to_the_lane_others_to_the_main_host() -> None:
    main = slot(background={"channels": 1}, restart_backoff_s=0.5)
    lane = make_lane(main, "/rt/drivers/ref.background.sock")
    assert (lane.main, main.background, lane.lane, lane.sock_name) == (
        main, lane, "background", "ref.background")
    assert lane.entry["channels"] == 1 and lane.backoff.first == 0.5  # its own keys
    assert lane.label == "ref (background lane)"
    for priority, want in ((ModelPriority.NORMAL, main), (ModelPriority.BACKGROUND, lane),
                           (ModelPriority.OPPORTUNISTIC, lane)):
        assert grant_target(main, int(priority), FG_APP) is want
    alone = slot("other")  # no lane: everything on its one host
    assert grant_target(alone, int(ModelPriority.BACKGROUND), FG_APP) is alone


def test_the_effective_class_routes_a_background_importance_apps_normal_request() -> None:
    """The class the driver runs the uid's models in (app priority + clamped job priority
    0 against foreground_priority) decides, not the request's priority alone."""
    main = slot()
    lane = make_lane(main, "/x.sock")
    normal = int(ModelPriority.NORMAL)
    for app_priority, want in ((100, main), (200, main),  # FOREGROUND, VISIBLE: foreground
                               (201, lane), (300, lane), (400, lane), (1000, lane)):
        cfg = SchedulingConfig(uid=1000, app_priority=app_priority)
        assert grant_target(main, normal, cfg) is want, app_priority
    # An unknown uid is the driver's default row (1000): BACKGROUND.
    assert grant_target(main, normal, default_config(1000)) is lane
    # An [[app]] range whose floor is a background job priority: its models are BACKGROUND.
    assert grant_target(main, normal, SchedulingConfig(1000, 100, min_priority=150)) is lane
    assert grant_class(normal, SchedulingConfig(1000, 100, min_priority=100),
                       200) is ExecClass.FOREGROUND
    # The driver's own foreground_priority: a service (300) is foreground where it is 300.
    wide = slot(foreground_priority=300)
    wide_lane = make_lane(wide, "/y.sock")
    svc = SchedulingConfig(uid=1000, app_priority=300)
    assert grant_target(wide, normal, svc) is wide
    assert grant_target(wide, int(ModelPriority.BACKGROUND), svc) is wide_lane
    # The driver and npud apply one rule (hal/exec_class.py).
    for cfg in (FG_APP, svc, default_config(7), SchedulingConfig(7, 150, min_priority=60)):
        assert grant_class(normal, cfg, 200) is model_class(cfg, 200)


class Feed(DriverFeed):
    """DriverFeed's grant routing, its pushes recorded per host."""

    def __init__(self, *slots: DriverSlot) -> None:
        super().__init__()
        self.slots = list(slots)
        self.lanes = [s.background for s in slots if s.background is not None]
        self.events: Any = Events()
        self.pushed: list[tuple[str, str, str]] = []

    def _push(self, slot: DriverSlot, method: str, msg: Any) -> None:  # type: ignore[override]
        self.pushed.append((slot.sock_name, method, getattr(msg, "grant_id", "")))


def test_a_grant_keeps_its_host_when_the_uids_importance_changes() -> None:
    main = slot()
    make_lane(main, "/x.sock")
    feed = Feed(main)
    feed.update_scheduling_configs([SchedulingConfig(uid=1000, app_priority=400)])  # cached
    feed.grant_issued(1000, 1, "g1", "ref", int(ModelPriority.NORMAL))
    assert feed.grant_lane("g1") == "background"
    assert ("ref.background", "hal.grant_issued", "g1") in feed.pushed
    feed.update_scheduling_configs([SchedulingConfig(uid=1000, app_priority=100)])  # foreground
    assert feed.grant_lane("g1") == "background"  # the grant stays where it was told
    feed.grant_issued(1000, 2, "g2", "ref", int(ModelPriority.NORMAL))  # a new one: main
    assert feed.grant_lane("g2") == ""
    feed.pushed.clear()
    feed.grant_ended("g1", False)
    feed.grant_ended("g2", False)
    assert [(h, m) for h, m, _ in feed.pushed] == [("ref.background", "hal.grant_ended"),
                                                   ("ref", "hal.grant_ended")]
    # An unknown uid (no row pushed): the driver's default row, 1000: the lane.
    feed.grant_issued(2000, 1, "g3", "ref", int(ModelPriority.NORMAL))
    assert feed.grant_lane("g3") == "background"


def test_npu_status_says_where_a_grant_would_go_now_that_its_class_changed() -> None:
    """A grant keeps its host; request_moves names those the rule would now put on the
    other host (the dump's "lane_now"), and only those, for as long as they live."""
    main = slot()
    make_lane(main, "/x.sock")
    feed = Feed(main, slot("other"))  # "other": no lane, never a move
    feed.update_scheduling_configs([SchedulingConfig(uid=1000, app_priority=400),
                                    SchedulingConfig(uid=1001, app_priority=100)])
    feed.grant_issued(1000, 1, "g1", "ref", int(ModelPriority.NORMAL))  # lane
    feed.grant_issued(1001, 1, "g2", "ref", int(ModelPriority.NORMAL))  # main
    feed.grant_issued(1001, 2, "g3", "ref", int(ModelPriority.BACKGROUND))  # lane, stays
    feed.grant_issued(1000, 3, "g4", "other", int(ModelPriority.NORMAL))
    assert feed.request_moves() == {}
    feed.update_scheduling_configs([SchedulingConfig(uid=1000, app_priority=100),  # raised
                                    SchedulingConfig(uid=1001, app_priority=400)])  # demoted
    assert feed.request_moves() == {(1000, 1): "", (1001, 1): "background"}
    # An adopted grant held where the rule no longer puts it: the same.
    feed.note_held(main, ["g5"])
    feed.grant_issued(1001, 5, "g5", "ref", int(ModelPriority.NORMAL))
    assert feed.request_moves()[(1001, 5)] == "background"
    for gid in ("g1", "g2", "g5"):
        feed.grant_ended(gid, False)
    assert feed.request_moves() == {} and set(feed.grants) == {"g3", "g4"}

    from npumanager.cli.status import render

    dump = {"devices": [{"name": "ref", "available": True, "backend": "onnxruntime",
                         "hosts": {"pid": 12, "background": {"pid": 34, "up": True}}}],
            "requests": [
                {"uid": 7, "request_id": 1, "state": "loaded", "grant": "aaaa1111",
                 "lane": "background", "lane_now": ""},
                {"uid": 7, "request_id": 2, "state": "loaded", "grant": "bbbb2222",
                 "lane": "", "lane_now": "background"},
                {"uid": 7, "request_id": 3, "state": "loaded", "grant": "cccc3333",
                 "lane": "background"}]}
    text = render(dump, width=400)
    assert "aaaa1111 (background lane; main host on its next request)" in text, text
    assert "bbbb2222 (background lane on its next request)" in text, text
    assert "cccc3333 (background lane)" in text, text


def test_an_adopted_grant_goes_to_the_host_that_holds_it_not_to_the_rule() -> None:
    main = slot()
    lane = make_lane(main, "/x.sock")
    feed = Feed(main)
    feed.update_scheduling_configs([SchedulingConfig(uid=1000, app_priority=100)])
    # A restarted npud: the lane attached holding g1 (granted when the uid was background),
    # the main host holding g2 (a BACKGROUND request's, say, before lanes were routed so).
    feed.note_held(lane, ["g1"])
    feed.note_held(main, ["g2"])
    feed.grant_issued(1000, 1, "g1", "ref", int(ModelPriority.NORMAL))  # rule: main
    feed.grant_issued(1000, 2, "g2", "ref", int(ModelPriority.BACKGROUND))  # rule: lane
    assert (feed.grant_lane("g1"), feed.grant_lane("g2")) == ("background", "")
    assert [(h, g) for h, m, g in feed.pushed if m == "hal.grant_issued"] == [
        ("ref.background", "g1"), ("ref", "g2")]
    assert feed.held_lanes == {}  # used once: a later grant with the rule again
    # A held grant no client claimed is revoked: forgotten with it.
    feed.note_held(lane, ["g9"])
    feed.grant_ended("g9", True)
    assert feed.held_lanes == {}


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
    # Each granted request's grant says the lane it is valid on (the dump's "lane").
    reqs = {**dump({"pid": 12, "background": {"pid": 34, "up": True}}), "requests": [
        {"uid": 7, "request_id": 1, "state": "loaded", "grant": "aaaa1111", "lane": ""},
        {"uid": 7, "request_id": 2, "state": "loaded", "grant": "bbbb2222",
         "lane": "background"}]}
    text = render(reqs, width=400)
    assert "aaaa1111 " in text and "aaaa1111 (" not in text, text
    assert "bbbb2222 (background lane)" in text, text
