"""Issue #10's two open corners: a driver host device whose link to npud had not attached
when npud went away. In-process over the host's real socket, on a virtual clock (the
harness of test_orphan_adopt.py); ``host.launcher_gone()`` is what ``npu driver
--exit-with-manager`` calls once the npud that started it (its parent, ``--launcher-pid``)
has exited (tests/drivers/test_orphan_launcher.py runs that with real processes).

* (a) npud gets SIGTERM while one device of a two-device host has not attached yet: the
  attached device's grace starts when npud's connection closes, the other's heard nothing
  and never started, so the host lingered with no npud for ever;
* (b) npud is SIGKILLed between the host's ready line and its attach: no device ever had
  a manager, nothing started a grace, the host lingered.

Both must end as an orphan does: the next npud that attaches within the grace adopts the
host (the models it acknowledged keep running), else the host releases everything and
exits after its grace.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from npumanager.cli.driver import exit_when_orphaned
from npumanager.errors import NoManagerAttached
from tests.drivers.test_orphan_adopt import GRACE_S, Orphanage, exits, run


async def watcher(*orphans: Orphanage) -> tuple[asyncio.Event, asyncio.Future[None]]:
    stop = asyncio.Event()
    return stop, asyncio.ensure_future(exit_when_orphaned([o.host for o in orphans], stop))


def test_a_device_that_had_not_attached_at_sigterm_runs_its_grace_too(
        runtime_dir: Path, state_dir: Path) -> None:
    """(a) with no next npud: A's grace from npud's hang-up, B's from npud's exit; the
    host exits once both are over, and A's model runs until then."""
    async def body(o: Orphanage) -> None:
        b = o.others[0]
        first_a = await o.npud()  # npud linked to A; B's link had not attached yet
        await o.grant(first_a, "g1")
        model = await o.prepare("g1")
        stop, watch = await watcher(o, b)
        await o.gone(first_a)  # SIGTERM: npud detaches, its connections close
        o.host.launcher_gone()  # and it exits
        b.host.launcher_gone()
        await o.advance(GRACE_S - 1.0)
        assert not stop.is_set()
        assert await o.execute(model) == [1.0] * 4, "acknowledged: it runs through the grace"
        with pytest.raises(NoManagerAttached):
            await b.prepare("g2")
        await o.advance(1.1)
        assert stop.is_set(), "both graces are over: the host must not linger"
        watch.cancel()
        decisions = [d.what for d in b.host.state.decisions() if d.subject == "driver gated1"]
        assert decisions == ["npud gone before it attached", "orphan grace over"]

    run(runtime_dir, state_dir, body, devices=2)


def test_the_next_npud_adopts_both_devices_within_the_grace(
        runtime_dir: Path, state_dir: Path) -> None:
    """(a) with a next npud: it attaches to both devices (B for the first time), A says it
    still holds g1, the model keeps running, and no grace is left to end either later."""
    async def body(o: Orphanage) -> None:
        b = o.others[0]
        first_a = await o.npud()
        await o.grant(first_a, "g1")
        model = await o.prepare("g1")
        await o.gone(first_a)
        o.host.launcher_gone()
        b.host.launcher_gone()
        await o.advance(GRACE_S - 1.0)
        second_a = await o.npud(attach=False)
        assert await o.attach(second_a) == [("g1", os.getuid())]
        second_b = await b.npud()
        await b.grant(second_b, "g2")
        assert await b.execute(await b.prepare("g2")) == [1.0] * 4
        await o.advance(5 * GRACE_S)
        assert await o.execute(model) == [1.0] * 4
        assert not await exits(o) and o.host.state.orphaned_at is None
        assert b.host.state.orphaned_at is None

    run(runtime_dir, state_dir, body, devices=2)


def test_a_host_npud_never_attached_to_exits_after_its_grace(
        runtime_dir: Path, state_dir: Path) -> None:
    """(b): npud died before it attached. Until npud's exit the host waits for it however
    long that takes (a loaded machine); from then on it runs the grace: it loads nothing,
    and exits at its end."""
    async def body(o: Orphanage) -> None:
        stop, watch = await watcher(o)
        await o.advance(5 * GRACE_S)
        assert not stop.is_set(), "its npud is alive, only slow: the host waits"
        o.host.launcher_gone()
        with pytest.raises(NoManagerAttached, match="went away"):
            await o.prepare("g1")
        await o.advance(GRACE_S - 0.1)
        assert not stop.is_set()
        await o.advance(0.2)
        assert stop.is_set(), "no npud came: the host must not linger"
        watch.cancel()

    run(runtime_dir, state_dir, body)


def test_a_next_npud_adopts_a_host_that_never_had_one(
        runtime_dir: Path, state_dir: Path) -> None:
    """(b) with a next npud: it attaches within the grace, which ends; the host serves it
    and stays (a later hang-up runs an ordinary grace)."""
    async def body(o: Orphanage) -> None:
        o.host.launcher_gone()
        await o.advance(GRACE_S / 2)
        second = await o.npud(attach=False)
        assert await o.attach(second) == []
        await o.grant(second, "g1")
        model = await o.prepare("g1")
        await o.advance(5 * GRACE_S)
        assert await o.execute(model) == [1.0] * 4 and not await exits(o)
        decisions = [d.what for d in o.host.state.decisions() if d.subject == "driver gated0"]
        assert decisions == ["npud gone before it attached", "manager back"]

    run(runtime_dir, state_dir, body)


def test_the_launcher_exit_changes_nothing_for_an_attached_device(
        runtime_dir: Path, state_dir: Path) -> None:
    """npud's exit may be seen before its connection's close (two file descriptors): an
    attached device waits for the close, whose grace then counts as always; a device whose
    grace already runs keeps that grace, not a new one from the exit."""
    async def body(o: Orphanage) -> None:
        b = o.others[0]
        first_a, first_b = await o.npud(), await b.npud()
        await o.grant(first_a, "g1")
        model = await o.prepare("g1")
        await b.gone(first_b)  # B's grace runs from here
        await o.advance(GRACE_S - 1.0)
        o.host.launcher_gone()
        b.host.launcher_gone()
        assert o.host.state.orphaned_at is None, "A still has its manager"
        stop, watch = await watcher(o, b)
        await o.advance(1.1)
        assert b.host.orphan_expired.is_set(), "B's grace counted from its own hang-up"
        await o.gone(first_a)
        await o.advance(GRACE_S - 0.5)
        assert await o.execute(model) == [1.0] * 4 and not stop.is_set()
        await o.advance(0.6)
        assert stop.is_set()
        watch.cancel()

    run(runtime_dir, state_dir, body, devices=2)
