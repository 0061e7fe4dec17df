"""An orphaned driver host (npud went away) and the npuds that adopt it, in-process over
the host's real socket, on a virtual clock: the orphan grace passes when the test
advances the clock, never with a stretch of wall-clock time.

Two corner cases of a restart (issue #10):

* the grace runs out while a new npud is adopting the host: its connection is open but
  ``hal.attach_manager`` has not arrived yet. The host released its models at the end of
  the grace; a manager that attaches after that must keep the host (it serves the new
  npud, empty), not see it exit under it. On a host serving two devices, a device whose
  grace ran out before npud 2 attached to it must not count as expired when the other
  device's grace ends;
* a host adopted twice: npud 1 dies, npud 2 adopts, npud 2 dies, npud 3 adopts. Each
  adoption reports the grants still held, the model runs throughout, and each orphaning's
  grace counts from its own drop (no timer of the first one is left to release later).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from npumanager import tensorio
from npumanager.cli.driver import exit_when_orphaned
from npumanager.drivers.host import DriverHost
from npumanager.errors import GrantRevoked, NoManagerAttached
from npumanager.hal.host_config import HostConfig
from npumanager.hal.wire import SERVICE
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.testing import VirtualClock
from npumanager.wire.client import connect_async
from npumanager.wire.conn import RpcConnection
from tests.drivers.test_host_shell import GatedDriver, settle

GRACE_S = 10.0
X = np.zeros((1, 4), np.float32)


class Orphanage:
    """One host on a virtual clock; npuds (HAL connections) come and go, one app stays."""

    def __init__(self, host: DriverHost, clock: VirtualClock, app: RpcConnection) -> None:
        self.host, self.clock, self.app = host, clock, app
        self.sock = str(host.socket_path)
        self.others: list[Orphanage] = []

    async def npud(self, *, attach: bool = True) -> RpcConnection:
        """A new npud's connection (attached unless ``attach`` is False)."""
        conn, _ = await connect_async(self.sock, SERVICE, {})
        if attach:
            await self.attach(conn)
        return conn

    @staticmethod
    async def attach(conn: RpcConnection) -> list[tuple[str, int]]:
        """``hal.attach_manager``: the (grant, uid) pairs the host says it still holds."""
        payload, _ = await conn.call("hal.attach_manager",
                                     pb.AttachManager(enforce_admission=True))
        return [(g.grant_id, g.uid) for g in pb.HeldGrants.FromString(payload).grants]

    async def gone(self, conn: RpcConnection) -> None:
        """That npud died: its connection closes and the host sees it."""
        conn.close()
        await settle()

    async def grant(self, conn: RpcConnection, gid: str) -> None:
        await conn.call("hal.grant_issued", pb.GrantIssued(uid=os.getuid(), request_id=1,
                                                           grant_id=gid))

    async def prepare(self, gid: str) -> int:
        payload, _ = await self.app.call("device.prepare_model",
                                         pb.PrepareModel(grant_id=gid, onnx=b"cheap"))
        return pb.PreparedModelMsg.FromString(payload).model_id

    async def execute(self, model_id: int) -> list[float]:
        msg = pb.Execute(model_id=model_id)
        tensorio.add_inline(msg.inputs, "x", X)
        payload, _ = await self.app.call("device.execute", msg)
        res = pb.ExecuteResult.FromString(payload)
        return [float(v) for v in np.frombuffer(res.outputs[0].data, np.float32)]

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await settle()


def run(runtime_dir: Path, state_dir: Path,
        body: Callable[[Orphanage], Awaitable[None]], devices: int = 1) -> None:
    """``devices`` > 1: as many hosts on the same loop and clock (one process serving
    several devices); the first is ``o``, the others ``o.others``."""
    async def main() -> None:
        clock = VirtualClock()
        hosts = [DriverHost(HostConfig(name=f"gated{i}", channels=1, orphan_grace_s=GRACE_S),
                            GatedDriver(), runtime_dir, state_dir, clock=clock)
                 for i in range(devices)]
        apps = []
        try:
            for host in hosts:
                await host.start()
                apps.append((await connect_async(str(host.socket_path), SERVICE))[0])
            each = [Orphanage(h, clock, a) for h, a in zip(hosts, apps, strict=True)]
            each[0].others = each[1:]
            await body(each[0])
        finally:
            for app in apps:
                app.close()
            for host in hosts:
                await host.close()

    asyncio.run(main())


async def exits(o: Orphanage) -> bool:
    """Would ``npu driver --exit-with-manager`` exit now (its watcher, run until the loop
    has nothing more to do)?"""
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(exit_when_orphaned([o.host], stop))
    await settle()
    watcher.cancel()
    return stop.is_set()


def test_a_manager_that_attaches_as_the_grace_runs_out_keeps_the_host(
        runtime_dir: Path, state_dir: Path) -> None:
    """npud 2 connected before the grace ran out and attaches after it: the host released
    its models (nobody attached in time) but serves npud 2 from then on instead of
    exiting under it (npud 2 would see its adopted host close and start another)."""
    async def body(o: Orphanage) -> None:
        first = await o.npud()
        await o.grant(first, "g1")
        model = await o.prepare("g1")
        await o.gone(first)
        second = await o.npud(attach=False)  # adopting: connected, not attached yet
        await o.advance(GRACE_S + 0.1)
        assert await exits(o), "alone past its grace, the host exits"
        with pytest.raises(GrantRevoked, match="no manager attached again"):
            await o.execute(model)
        assert await o.attach(second) == [], "everything was released at the grace's end"
        assert not await exits(o), "a manager is attached: the host stays"
        await o.grant(second, "g2")
        assert await o.execute(await o.prepare("g2")) == [1.0] * 4
        # Orphaned again later, it runs a grace of its own and exits after that.
        await o.gone(second)
        assert not await exits(o)
        await o.advance(GRACE_S + 0.1)
        assert await exits(o)

    run(runtime_dir, state_dir, body)


def test_a_two_device_host_stays_while_one_device_has_a_manager_again(
        runtime_dir: Path, state_dir: Path) -> None:
    """One host process serves two devices (one npud links to both). Device A's grace
    ran out and npud 2 then attached to A; B's grace runs out after that: the watcher,
    waiting all along, must not count A's stale expiry and exit under npud 2."""
    async def body(o: Orphanage) -> None:
        b = o.others[0]
        first_a, first_b = await o.npud(), await b.npud()
        await o.gone(first_a)
        await o.advance(1.0)
        await b.gone(first_b)
        stop = asyncio.Event()
        watcher = asyncio.ensure_future(exit_when_orphaned([o.host, b.host], stop))
        await o.advance(GRACE_S - 0.5)  # A's grace is over, B's is not
        assert not stop.is_set()
        second_a = await o.npud()  # npud 2 attaches to A after its grace
        await o.advance(1.0)  # B's grace is over
        assert not stop.is_set(), "the host exits under npud 2"
        await o.gone(second_a)  # orphaned again: A's own grace, then the host exits
        await o.advance(GRACE_S + 0.1)
        assert stop.is_set()
        watcher.cancel()

    run(runtime_dir, state_dir, body, devices=2)


def test_a_host_adopted_twice_keeps_its_model_and_each_grace_counts_from_its_own_drop(
        runtime_dir: Path, state_dir: Path) -> None:
    async def body(o: Orphanage) -> None:
        first = await o.npud()
        await o.grant(first, "g1")
        model = await o.prepare("g1")
        await o.gone(first)
        await o.advance(GRACE_S - 1.0)
        second = await o.npud()  # adoption 1
        assert await o.execute(model) == [1.0] * 4
        await o.advance(GRACE_S - 1.0)
        await o.gone(second)
        await o.advance(GRACE_S - 1.0)  # 3 graces since the first drop, < 1 since this
        assert await o.execute(model) == [1.0] * 4, "the second orphaning's own grace"
        with pytest.raises(NoManagerAttached):
            await o.prepare("g1")
        third = await o.npud()  # adoption 2
        assert await o.attach(third) == [("g1", os.getuid())]  # (attached again: idempotent)
        await o.advance(5 * GRACE_S)
        assert await o.execute(model) == [1.0] * 4, "no grace left running to release it"
        assert not await exits(o)
        decisions = [d.what for d in o.host.state.decisions() if d.subject == "driver gated0"]
        assert decisions == ["manager gone", "manager back"] * 2

    run(runtime_dir, state_dir, body)


def test_a_second_npud_that_attaches_while_the_first_connection_lingers_stays_attached(
        runtime_dir: Path, state_dir: Path) -> None:
    """Adopted while the old npud's connection is still open (a hung npud whose socket
    closes only later): the old connection's close is not the new manager's."""
    async def body(o: Orphanage) -> None:
        first = await o.npud()
        await o.grant(first, "g1")
        model = await o.prepare("g1")
        second = await o.npud()
        await o.gone(first)
        await o.advance(5 * GRACE_S)
        assert o.host.state.orphaned_at is None
        assert await o.execute(model) == [1.0] * 4
        await o.grant(second, "g2")
        assert await o.prepare("g2") > 0
        assert not await exits(o)

    run(runtime_dir, state_dir, body)
