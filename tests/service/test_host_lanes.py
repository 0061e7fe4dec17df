"""service/host_lanes.py and grant_moves.py without processes: which host of a device a grant
is told to (by the request's effective class; moved with its uid's class; an adopted one where
it is held, then where the rule puts it), the acknowledgements a lane owes when it goes, and
which host a hung device's restart kills."""

from __future__ import annotations

import asyncio
from typing import Any

from npumanager.constants import ModelPriority
from npumanager.hal.exec_class import ExecClass, model_class
from npumanager.hal.types import SchedulingConfig, default_config
from npumanager.proto.v1 import driver_pb2 as pb
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


def test_a_grant_moves_with_its_uids_class() -> None:
    """Raised to FOREGROUND, a lane grant moves to the main host: told there first, then
    the lane hears it moved (and keeps it, for the app's models until they follow); its
    end goes to both. A BACKGROUND request's grant never moves."""
    main = slot()
    make_lane(main, "/x.sock")
    feed = Feed(main)
    feed.update_scheduling_configs([SchedulingConfig(uid=1000, app_priority=400)])  # cached
    feed.grant_issued(1000, 1, "g1", "ref", int(ModelPriority.NORMAL))
    feed.grant_issued(1000, 2, "g2", "ref", int(ModelPriority.BACKGROUND))
    assert (feed.grant_lane("g1"), feed.grant_lane("g2")) == ("background", "background")
    feed.pushed.clear()
    feed.update_scheduling_configs([SchedulingConfig(uid=1000, app_priority=100)])  # foreground
    assert feed.grant_lane("g1") == "" and feed.grant_lane("g2") == "background"
    assert [p for p in feed.pushed if p[1] != "hal.update_scheduling_configs"] == [
        ("ref", "hal.grant_issued", "g1"), ("ref.background", "hal.grant_moved", "g1")]
    assert feed.request_lanes() == {(1000, 1): "", (1000, 2): "background"}
    assert feed.request_move_counts() == {(1000, 1): 1} and feed.device_moves == {"ref": 1}
    feed.grant_issued(1000, 3, "g3", "ref", int(ModelPriority.NORMAL))  # a new one: main
    assert feed.grant_lane("g3") == ""
    feed.pushed.clear()
    for gid in ("g1", "g2", "g3"):
        feed.grant_ended(gid, False)
    assert [(h, m, g) for h, m, g in feed.pushed] == [
        ("ref", "hal.grant_ended", "g1"), ("ref.background", "hal.grant_ended", "g1"),
        ("ref.background", "hal.grant_ended", "g2"), ("ref", "hal.grant_ended", "g3")]
    assert feed.left_on == {} and feed.grant_moves == {} and feed.request_move_counts() == {}
    # Another uid's row changing moves nothing of this one's.
    feed.grant_issued(2000, 1, "g4", "ref", int(ModelPriority.NORMAL))  # unknown: lane
    feed.pushed.clear()
    feed.update_scheduling_configs([SchedulingConfig(uid=1001, app_priority=100)])
    assert [p for p in feed.pushed if p[1] != "hal.update_scheduling_configs"] == []


def test_a_grant_that_flips_back_is_known_to_the_host_its_app_is_on() -> None:
    """Demoted then raised again before the app followed: the main host (where the app's
    model still is) is told the grant again, which undoes the move there, and the lane
    hears it moved away; every flip is two pushes and the grant is known to the two hosts
    at most, however many flips."""
    main = slot()
    make_lane(main, "/x.sock")
    feed = Feed(main)
    fg, bg = (SchedulingConfig(uid=1000, app_priority=100),
              SchedulingConfig(uid=1000, app_priority=400))
    feed.update_scheduling_configs([fg])
    feed.grant_issued(1000, 1, "g1", "ref", int(ModelPriority.NORMAL))
    feed.pushed.clear()
    feed.update_scheduling_configs([bg])
    feed.update_scheduling_configs([fg])
    moves = [p for p in feed.pushed if p[1] != "hal.update_scheduling_configs"]
    assert moves == [("ref.background", "hal.grant_issued", "g1"),
                     ("ref", "hal.grant_moved", "g1"),
                     ("ref", "hal.grant_issued", "g1"),
                     ("ref.background", "hal.grant_moved", "g1")]
    assert feed.grant_lane("g1") == "" and feed.left_on == {"g1": "background"}
    feed.pushed.clear()
    for _ in range(500):
        feed.update_scheduling_configs([bg])
        feed.update_scheduling_configs([fg])
    assert len([p for p in feed.pushed if p[1] != "hal.update_scheduling_configs"]) == 2000
    assert feed.grant_moves == {"g1": 1002} and len(feed.left_on) == 1
    feed.pushed.clear()
    feed.grant_ended("g1", True)
    assert [(h, m) for h, m, _ in feed.pushed] == [("ref", "hal.grant_ended"),
                                                   ("ref.background", "hal.grant_ended")]


def test_a_moved_grants_end_is_applied_once_both_hosts_acknowledged() -> None:
    async def run() -> list[tuple[str, Any]]:
        main = slot()
        lane = make_lane(main, "/x.sock")
        lanes = Lanes(main)
        main.up = lane.up = True
        main.acks, lane.acks = {"g1"}, {"g1"}
        handlers = lanes._lane_handlers(main, {"hal.grant_end_applied": lambda c, p: (
            lanes.events.grant_end_applied("ref", pb.GrantEnded.FromString(p).grant_id))})
        lane_handlers = lanes._lane_handlers(lane, {"hal.grant_end_applied": lambda c, p: (
            lanes.events.grant_end_applied("ref", pb.GrantEnded.FromString(p).grant_id))})
        ack = pb.GrantEnded(grant_id="g1").SerializeToString()
        handlers["hal.grant_end_applied"](None, ack)
        assert lanes.events.seen == []  # the lane still owes its part
        lane_handlers["hal.grant_end_applied"](None, ack)
        # A lane that goes down while owing one: applied for it once the main host's came.
        main.acks, lane.acks = {"g2"}, {"g2"}
        lane.up = False
        lanes._announce_down(lane, "killed")
        await asyncio.sleep(0)
        assert lanes.events.seen == [("applied", "g1")]
        handlers["hal.grant_end_applied"](None, pb.GrantEnded(grant_id="g2").SerializeToString())
        seen: list[tuple[str, Any]] = lanes.events.seen
        return seen

    assert asyncio.run(run()) == [("applied", "g1"), ("applied", "g2")]


def test_npu_status_and_top_show_a_grants_moves() -> None:
    from npumanager.cli.status import render

    dump = {"devices": [{"name": "ref", "available": True, "backend": "onnxruntime",
                         "hosts": {"pid": 12, "background": {"pid": 34, "up": True}}}],
            "requests": [
                {"uid": 7, "request_id": 1, "state": "loaded", "grant": "aaaa1111",
                 "lane": "background", "moves": 2},
                {"uid": 7, "request_id": 2, "state": "loaded", "grant": "bbbb2222",
                 "lane": "", "moves": 1},
                {"uid": 7, "request_id": 3, "state": "loaded", "grant": "cccc3333",
                 "lane": "background"}],
            "grant_moves": 3}
    text = render(dump, width=400)
    assert "aaaa1111 (background lane; moved 2x)" in text, text
    assert "bbbb2222 (main host; moved 1x)" in text, text
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
    # Told to the host holding it, then moved where the rule puts it now (the app's model
    # keeps serving there until it follows: service/grant_moves.py).
    assert (feed.grant_lane("g1"), feed.grant_lane("g2")) == ("", "background")
    assert [(h, m, g) for h, m, g in feed.pushed if "grant" in m] == [
        ("ref.background", "hal.grant_issued", "g1"), ("ref", "hal.grant_issued", "g1"),
        ("ref.background", "hal.grant_moved", "g1"),
        ("ref", "hal.grant_issued", "g2"), ("ref.background", "hal.grant_issued", "g2"),
        ("ref", "hal.grant_moved", "g2")]
    assert feed.held_lanes == {}  # used once: a later grant with the rule again
    # Held by both hosts (it had moved, its app not yet followed): told to the first, the
    # other hears it moved away, and its end goes to both.
    feed.note_held(main, ["g3"])
    feed.note_held(lane, ["g3"])
    feed.pushed.clear()
    feed.grant_issued(1000, 3, "g3", "ref", int(ModelPriority.NORMAL))  # rule: main
    assert [(h, m) for h, m, g in feed.pushed] == [("ref", "hal.grant_issued"),
                                                   ("ref.background", "hal.grant_moved")]
    feed.pushed.clear()
    feed.grant_ended("g3", False)
    assert [(h, m) for h, m, g in feed.pushed] == [("ref", "hal.grant_ended"),
                                                   ("ref.background", "hal.grant_ended")]
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
