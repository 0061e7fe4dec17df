"""A model's open bursts handed over to the host its grant moved to
(nn/burst_handover.py), under real uids: the hand-over gives an app nothing it could not
get itself.

* Its standby channels are its own bursts on the new host: an app at its per-uid burst
  limit there is refused the standby (its stream stays served where it is), and never
  holds more than the limit;
* an app that opens and closes bursts as fast as it can while the admin flips its
  importance (each flip a move) leaves neither host holding its channels, models or fds
  once it closed them, and a FOREGROUND app's stream on the main host all along gets
  every answer right, none failed."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from npumanager import NpuManager, nn
from npumanager.constants import Importance
from npumanager.drivers.burst import MAX_BURSTS_PER_CONN, MAX_BURSTS_PER_UID
from npumanager.errors import NpuError
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from tests.nn.test_background_lane import stats
from tests.nn.test_burst_handover import Stream
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import X, granted, wait_until
from tests.security.harness import (
    ATTACKER,
    BYSTANDER,
    fd_count,
    needs_root,
    wait_for_fds_at_most,
)
from tests.security.test_grant_moves import DRIVER, background_app, socks

pytestmark = needs_root


def bursts_of(uid: int, sock: Path) -> int:
    return sum(b["uid"] == uid for b in stats(sock)["bursts"])


def models_of(uid: int, sock: Path) -> int:
    return sum(g["models"] for g in stats(sock)["held"] if g["uid"] == uid)


def at_the_limit_app(runtime_dir: str) -> dict[str, Any]:
    """Once raised: its uid's whole burst limit on the main host taken by models of its
    own there (one connection per Device), then its lane stream; what it got."""
    got: dict[str, Any] = {}
    with granted(runtime_dir) as (dev, listener):
        model = dev.prepare_model(add_model(), grant=listener)
        burst = model.burst()
        procs.announce("loaded")
        assert procs.receive(timeout=60) == "raised"
        devs = [nn.device("reference", runtime_dir)
                for _ in range(MAX_BURSTS_PER_UID // MAX_BURSTS_PER_CONN)]
        fillers = [d.prepare_here(add_model(), listener.grant_id) for d in devs]
        fill = [m.burst() for m in fillers for _ in range(MAX_BURSTS_PER_CONN)]
        stream = Stream(burst)
        stream.start()
        wait_until(lambda: model._follow is not None and model._follow.ready is not None,
                   60, "the copy on the main host")
        time.sleep(1.5)  # (a try and its retry, both refused)
        got["while at the limit"] = (model.lane, model.moves)
        procs.announce("at the limit")
        assert procs.receive(timeout=60) == "free"
        for b in fill:
            b.close()
        for m in fillers:
            m.release()
        for d in devs:
            d.close()
        wait_until(lambda: model.lane == "", 30, "the stream moved")
        got["moved"] = (model.lane, model.moves, burst.closed)
        got["stream"] = stream.report()
        burst.close()
        model.release()
    return got


def test_a_standby_counts_against_the_apps_own_burst_limit(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    main, lane = socks(runtime_dir)
    with background_app(start_npud, runtime_dir, ATTACKER, at_the_limit_app) as (
            npud, admin, app):
        app.expect("loaded", 60)
        admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
        app.send("raised")
        app.expect("at the limit", 90)
        # The limit, not one more: the standby was refused, the stream still on the lane.
        assert (bursts_of(ATTACKER, main), bursts_of(ATTACKER, lane)) == (
            MAX_BURSTS_PER_UID, 1)
        app.send("free")
        got: dict[str, Any] = app.wait(90)
        assert (bursts_of(ATTACKER, main), bursts_of(ATTACKER, lane)) == (0, 0)
    assert got["while at the limit"] == ("background", 0), got
    assert got["moved"] == ("", 1, False), got
    assert got["stream"]["failed"] == [] and got["stream"]["wrong"] == 0, got
    assert "Traceback" not in npud.output


def bystander_app(runtime_dir: str) -> dict[str, Any]:
    """A FOREGROUND app streaming one burst on the main host until told."""
    with granted(runtime_dir) as (dev, listener):
        model = dev.prepare_model(add_model(), grant=listener)
        stream = Stream(model.burst())
        stream.start()
        procs.announce("streaming")
        assert procs.receive(timeout=120) == "stop"
        got = stream.report()
        got["lane"], got["moves"] = model.lane, model.moves
        stream.burst.close()
        model.release()
    return got


def spamming_app(runtime_dir: str) -> dict[str, Any]:
    """A stream plus a thread opening and closing bursts as fast as it can, while its
    importance flips; everything closed at the end."""
    got: dict[str, Any] = {"spam": 0, "spam failed": 0}
    with granted(runtime_dir) as (dev, listener):
        model = dev.prepare_model(add_model(), grant=listener)
        stream = Stream(model.burst())
        stream.start()
        stop = threading.Event()

        def spam() -> None:
            while not stop.is_set():
                try:
                    with model.burst() as b:
                        b.execute({"x": X})
                    got["spam"] += 1
                except NpuError:
                    got["spam failed"] += 1

        th = threading.Thread(target=spam, daemon=True)
        th.start()
        procs.announce("spamming")
        assert procs.receive(timeout=120) == "stop"
        stop.set()
        th.join(30)
        got["stream"] = stream.report()
        got["moves"] = model.moves
        stream.burst.close()
        model.release()
        procs.announce("closed")
        assert procs.receive(timeout=60) == "leave"
    return got


def test_burst_spam_during_its_own_moves_leaves_nothing_held_and_no_one_hurt(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    main, lane = socks(runtime_dir)
    npud = start_npud(drivers=True, driver=DRIVER)
    with NpuManager(str(runtime_dir)) as admin:
        admin.set_uid_importance(BYSTANDER, Importance.FOREGROUND)
        bystander = procs.spawn_as(BYSTANDER, None, bystander_app, str(runtime_dir),
                                   timeout=240)
        try:
            bystander.expect("streaming", 60)
            admin.set_uid_importance(ATTACKER, Importance.CACHED)
            attacker = procs.spawn_as(ATTACKER, None, spamming_app, str(runtime_dir),
                                      timeout=240)
            try:
                attacker.expect("spamming", 60)
                # (counted with the attacker in: a host's first prepare of its kind starts
                # what stays, its compile child)
                pids = [stats(main)["pid"], stats(lane)["pid"]]
                base = [fd_count(p) for p in pids]
                most_bursts = most_models = 0
                for i in range(30):
                    admin.set_uid_importance(
                        ATTACKER, Importance.FOREGROUND if i % 2 == 0 else Importance.CACHED)
                    time.sleep(0.1)
                    most_bursts = max(most_bursts, bursts_of(ATTACKER, main),
                                      bursts_of(ATTACKER, lane))
                    most_models = max(most_models, models_of(ATTACKER, main),
                                      models_of(ATTACKER, lane))
                attacker.send("stop")
                attacker.expect("closed", 60)
                # Nothing of the attacker's left in either host once it closed it all.
                wait_until(lambda: (bursts_of(ATTACKER, main), bursts_of(ATTACKER, lane))
                           == (0, 0), 30, "no burst of the attacker held")
                attacker.send("leave")
                got: dict[str, Any] = attacker.wait(60)
            finally:
                attacker.kill()
            wait_until(lambda: (models_of(ATTACKER, main), models_of(ATTACKER, lane))
                       == (0, 0), 30, "no model of the attacker held")
            fds = [wait_for_fds_at_most(p, b, 30) for p, b in zip(pids, base, strict=True)]
            bystander.send("stop")
            seen: dict[str, Any] = bystander.wait(60)
        finally:
            bystander.kill()
    assert all(n <= b for n, b in zip(fds, base, strict=True)), (fds, base)
    # At most the stream's burst, a spammed one and their standbys: no pile-up per flip.
    assert most_bursts <= 4 and most_models <= 2, (most_bursts, most_models)
    assert got["stream"]["failed"] == [] and got["stream"]["wrong"] == 0, got
    # (Its bursts opened and closed under the hand-over make its checks fail: it moves
    # when its set of bursts holds still, or not at all; either way it is served.)
    assert got["spam"] > 0 and got["spam failed"] == 0, got
    assert seen["failed"] == [] and seen["wrong"] == 0 and seen["runs"] > 100, seen
    assert (seen["lane"], seen["moves"]) == ("", 0), seen
    assert "Traceback" not in npud.output
