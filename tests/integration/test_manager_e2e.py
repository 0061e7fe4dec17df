"""The manager's behaviours end to end: a real npud, client apps as separate processes
under distinct uids, over the real socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from npumanager import Importance, ModelPriority, ModelSize, NpuManager, Policy
from npumanager.constants import KEY_MAX_BUDGET, KEY_MODEL_SIZE_WEIGHTS
from npumanager.errors import InvalidArgument, PermissionDenied
from npumanager.testing.procs import run_as, spawn_as

from .apps import call_as_app, scripted_app
from .conftest import BG, FG, THIRD, StartDaemon, request_state

BIG = int(ModelSize.GREATER_THAN_2G)
MID = int(ModelSize.BETWEEN_1GB_AND_2GB)
SMALL = int(ModelSize.LESS_THAN_1GB)
NORMAL = int(ModelPriority.NORMAL)
OPPORTUNISTIC = int(ModelPriority.OPPORTUNISTIC)

GRANTED = ("can", 1, "CAN_LOAD_NOW")
QUEUED = ("can", 1, "NOT_PRIORITIZED")
WAITING = ("can", 1, "WAIT_FOR_UNLOAD")
COMPLETE = ("complete", 1, "COMPLETE")


def _importances(admin: NpuManager, **by_uid: Importance) -> None:
    for uid, imp in by_uid.items():
        admin.set_uid_importance(int(uid.lstrip("u")), imp)


def test_foreground_preempts_loaded_background_holder(admin: NpuManager, runtime_dir: Path
                                                      ) -> None:
    _importances(admin, u50001=Importance.FOREGROUND, u50002=Importance.CACHED)
    with spawn_as(BG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)]) as bg:
        bg.expect(("loaded", 1))
        with spawn_as(FG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)],
                      until="exit") as fg:
            fg.expect(("loaded", 1))
            fg.send(("exit",))
            fg_events = fg.wait()
        bg_events = bg.wait()
    assert bg_events == [GRANTED, ("unload", 1, "PREEMPTED"), COMPLETE]
    assert fg_events == [WAITING, GRANTED]


def test_granted_but_not_loaded_victim_is_asked_to_unload(admin: NpuManager, runtime_dir: Path
                                                          ) -> None:
    _importances(admin, u50001=Importance.FOREGROUND, u50002=Importance.CACHED)
    with spawn_as(BG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)],
                  report_loaded=False) as bg:
        bg.expect(("can", 1, "CAN_LOAD_NOW"))
        with spawn_as(FG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)],
                      until="exit") as fg:
            fg.expect(("loaded", 1))
            fg.send(("exit",))
            fg_events = fg.wait()
        bg_events = bg.wait()
    # Asked like a loaded holder (never silently cancelled); unloads without ever loading.
    assert bg_events == [GRANTED, ("unload", 1, "PREEMPTED"), COMPLETE]
    assert fg_events == [WAITING, GRANTED]


def test_queued_requests_are_never_victims_and_are_served_in_rank_order(
        admin: NpuManager, runtime_dir: Path) -> None:
    _importances(admin, u50001=Importance.FOREGROUND, u50002=Importance.SERVICE,
                 u50003=Importance.VISIBLE)
    with spawn_as(FG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)], until="exit") as fg:
        fg.expect(("loaded", 1))
        with spawn_as(BG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)],
                      until="exit") as bg:
            bg.expect(("can", 1, "NOT_PRIORITIZED"))
            with spawn_as(THIRD, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)],
                          until="exit") as third:
                third.expect(("can", 1, "NOT_PRIORITIZED"))
                fg.send(("unload", 1))
                third.expect(("loaded", 1))  # VISIBLE before SERVICE
                assert request_state(admin, BG, 1) == "queued"
                third.send(("unload", 1))
                bg.expect(("loaded", 1))
                third.send(("exit",))
                third_events = third.wait()
            bg.send(("unload", 1))
            bg.send(("exit",))
            bg_events = bg.wait()
        fg.send(("exit",))
        fg.wait()
    assert third_events == [QUEUED, GRANTED, COMPLETE]
    # The queued SERVICE request was never a victim of the better-ranked newcomer.
    assert bg_events == [QUEUED, GRANTED, COMPLETE]


def test_not_prioritized_request_is_queued_then_granted(admin: NpuManager, runtime_dir: Path
                                                        ) -> None:
    _importances(admin, u50001=Importance.FOREGROUND, u50002=Importance.CACHED)
    with spawn_as(FG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)], until="exit") as fg:
        fg.expect(("loaded", 1))
        with spawn_as(BG, None, scripted_app, runtime_dir, [(1, SMALL, NORMAL)],
                      until="exit") as bg:
            bg.expect(("can", 1, "NOT_PRIORITIZED"))
            fg.send(("unload", 1))
            bg.expect(("loaded", 1))
            bg.send(("exit",))
            bg_events = bg.wait()
        fg.send(("exit",))
        fg_events = fg.wait()
    assert bg_events == [QUEUED, GRANTED]
    assert fg_events == [GRANTED, COMPLETE]


def test_importance_drop_makes_the_holder_a_victim(admin: NpuManager, runtime_dir: Path) -> None:
    _importances(admin, u50001=Importance.VISIBLE, u50002=Importance.FOREGROUND)
    with spawn_as(BG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)]) as bg:
        bg.expect(("loaded", 1))
        with spawn_as(FG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)],
                      until="exit") as fg:
            fg.expect(("can", 1, "NOT_PRIORITIZED"))
            admin.set_uid_importance(BG, Importance.CACHED)  # the app went to the background
            fg.expect(("loaded", 1))
            fg.send(("exit",))
            fg_events = fg.wait()
        bg_events = bg.wait()
    assert bg_events == [GRANTED, ("unload", 1, "PREEMPTED"), COMPLETE]
    assert fg_events == [QUEUED, WAITING, GRANTED]


def test_holder_death_lets_the_waiter_in(admin: NpuManager, runtime_dir: Path) -> None:
    _importances(admin, u50001=Importance.FOREGROUND, u50002=Importance.CACHED)
    with spawn_as(FG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)], until="exit") as fg:
        fg.expect(("loaded", 1))
        with spawn_as(BG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)],
                      until="exit") as bg:
            bg.expect(("can", 1, "NOT_PRIORITIZED"))
            fg.kill()  # SIGKILL: the connection closing is the death notification
            bg.expect(("loaded", 1))
            assert request_state(admin, FG, 1) is None
            bg.send(("exit",))
            bg_events = bg.wait()
    assert bg_events == [QUEUED, GRANTED]


def test_turn_taking_one_holder_at_a_time(admin: NpuManager, runtime_dir: Path) -> None:
    admin.set_policy(Policy.TURN_TAKING)
    with spawn_as(FG, None, scripted_app, runtime_dir, [(1, SMALL, NORMAL)], until="exit") as a:
        a.expect(("loaded", 1))
        with spawn_as(BG, None, scripted_app, runtime_dir, [(1, SMALL, NORMAL)],
                      until="exit") as b:
            b.expect(("can", 1, "NOT_PRIORITIZED"))
            a.send(("unload", 1))
            b.expect(("loaded", 1))
            b.send(("exit",))
            b_events = b.wait()
        a.send(("exit",))
        a_events = a.wait()
    assert a_events == [GRANTED, COMPLETE]
    assert b_events == [QUEUED, GRANTED]


def test_weights_decide_what_fits(admin: NpuManager, runtime_dir: Path) -> None:
    admin.set_policy(Policy.BUDGET, {KEY_MAX_BUDGET: 4, KEY_MODEL_SIZE_WEIGHTS: {"2": 2}})
    _importances(admin, u50001=Importance.FOREGROUND, u50002=Importance.FOREGROUND,
                 u50003=Importance.FOREGROUND)
    with spawn_as(FG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)], until="exit") as a, \
            spawn_as(BG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)],
                     until="exit") as b:
        a.expect(("loaded", 1))
        b.expect(("loaded", 1))  # 2 + 2 fits in 4
        with spawn_as(THIRD, None, scripted_app, runtime_dir, [(1, SMALL, NORMAL)],
                      until="exit") as third:
            third.expect(QUEUED)
            dump = admin.dump()
            third.send(("exit",))
            events = third.wait()
        a.send(("exit",))
        b.send(("exit",))
        a.wait()
        b.wait()
    assert events == [QUEUED]  # 1 more does not fit, and equal ranks do not preempt
    assert dump["budget"]["used"] == 4


BAD_POLICIES: list[tuple[int, dict[str, object] | None]] = [
    (Policy.BUDGET, {KEY_MAX_BUDGET: 0}),
    (Policy.BUDGET, {KEY_MAX_BUDGET: -3}),
    (Policy.BUDGET, {KEY_MODEL_SIZE_WEIGHTS: {"2": 0}}),
    (Policy.BUDGET, {KEY_MODEL_SIZE_WEIGHTS: {"1": -1}}),
    (Policy.BUDGET, {KEY_MODEL_SIZE_WEIGHTS: {"7": 1}}),
    (99, None),
    (-1, None),
    (Policy.BUDGET, {"bogus": 1}),
    (Policy.BUDGET, {KEY_MAX_BUDGET: "four"}),
]


def test_bad_policies_are_invalid_arguments_and_change_nothing(admin: NpuManager) -> None:
    before = admin.dump()["policy"]
    for policy, bundle in BAD_POLICIES:
        with pytest.raises(InvalidArgument):
            admin.set_policy(policy, bundle)
    assert admin.dump()["policy"] == before
    admin.set_policy(Policy.BUDGET, {KEY_MAX_BUDGET: 8, KEY_MODEL_SIZE_WEIGHTS: {"0": 2}})
    assert admin.dump()["policy"] != before


def test_non_admin_is_refused(npud: object, runtime_dir: Path) -> None:
    for method, args in [("set_policy", (Policy.STATUS_QUO, None)),
                         ("set_uid_importance", (FG, Importance.FOREGROUND)),
                         ("override_thermal_status", (3,)),
                         ("reset_thermal_status", ())]:
        with pytest.raises(PermissionDenied):
            run_as(FG, None, call_as_app, runtime_dir, method, *args)
    # Reading is for everyone.
    assert "requests" in run_as(FG, None, call_as_app, runtime_dir, "dump")


def test_same_id_from_two_uids_is_two_requests(admin: NpuManager, runtime_dir: Path) -> None:
    with spawn_as(FG, None, scripted_app, runtime_dir, [(7, SMALL, NORMAL)], until="exit") as a, \
            spawn_as(BG, None, scripted_app, runtime_dir, [(7, SMALL, NORMAL)],
                     until="exit") as b:
        a.expect(("loaded", 7))
        b.expect(("loaded", 7))
        keys = sorted((r["uid"], r["request_id"]) for r in admin.dump()["requests"])
        a.send(("exit",))
        b.send(("exit",))
        assert a.wait() == [("can", 7, "CAN_LOAD_NOW")]
        assert b.wait() == [("can", 7, "CAN_LOAD_NOW")]
    assert keys == [(FG, 7), (BG, 7)]


def test_reused_id_is_refused(admin: NpuManager, runtime_dir: Path) -> None:
    with spawn_as(FG, None, scripted_app, runtime_dir, [(1, SMALL, NORMAL)], until="exit") as a:
        a.expect(("loaded", 1))
        a.send(("unload", 1))
        a.expect(("complete", 1, "COMPLETE"))
        a.send(("request", (1, SMALL, NORMAL)))  # same id again on this connection
        a.send(("exit",))
        events = a.wait()
    assert events == [GRANTED, COMPLETE, ("error", 1, "InvalidArgument")]


def test_opportunistic_never_preempts_and_is_the_first_victim(admin: NpuManager,
                                                              runtime_dir: Path) -> None:
    _importances(admin, u50001=Importance.CACHED, u50002=Importance.FOREGROUND,
                 u50003=Importance.CACHED)
    with spawn_as(FG, None, scripted_app, runtime_dir, [(1, MID, NORMAL)], until="exit") as low:
        low.expect(("loaded", 1))
        # A foreground app's opportunistic load does not push the cached app out...
        with spawn_as(BG, None, scripted_app, runtime_dir, [(1, BIG, OPPORTUNISTIC)],
                      until="exit") as opp:
            opp.expect(("can", 1, "NOT_PRIORITIZED"))
            assert request_state(admin, FG, 1) == "loaded"
            opp.send(("cancel", 1))
            opp.send(("request", (2, SMALL, OPPORTUNISTIC)))
            opp.expect(("loaded", 2))  # 2 + 1 fits
            # ...and is the first victim when a normal request needs room.
            with spawn_as(THIRD, None, scripted_app, runtime_dir, [(1, MID, NORMAL)],
                          until="exit") as normal:
                normal.expect(("loaded", 1))
                normal.send(("exit",))
                normal_events = normal.wait()
            opp.send(("exit",))
            opp_events = opp.wait()
        low.send(("exit",))
        low_events = low.wait()
    assert low_events == [GRANTED]
    assert ("unload", 2, "PREEMPTED") in opp_events
    assert opp_events[:2] == [QUEUED, ("complete", 1, "CANCELLED")]
    assert normal_events == [WAITING, GRANTED]


@pytest.mark.slow
def test_stubborn_holder_is_revoked_after_the_deadline(start_npud: StartDaemon,
                                                       runtime_dir: Path) -> None:
    start_npud({"unload_deadline_s": 0.3})
    with NpuManager(runtime_dir) as admin:
        _importances(admin, u50001=Importance.FOREGROUND, u50002=Importance.CACHED)
        with spawn_as(BG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)],
                      comply=False) as bg:
            bg.expect(("loaded", 1))
            with spawn_as(FG, None, scripted_app, runtime_dir, [(1, BIG, NORMAL)],
                          until="exit") as fg:
                fg.expect(("loaded", 1))
                fg.send(("exit",))
                fg_events = fg.wait()
            bg_events = bg.wait()
        story = admin.story(BG, 1)
    assert bg_events == [GRANTED, ("unload", 1, "PREEMPTED"), ("complete", 1, "REVOKED")]
    assert fg_events == [WAITING, GRANTED]
    assert any("revok" in d["what"].lower() for d in story)
