"""npud's driver supervisor: spawn, watch, restart and talk to the driver hosts.

It implements :class:`DriverControl` for the daemon. Each configured driver
runs as its own process (``python -m npumanager driver NAME``, the Android HAL
service analog). Its death is noticed at once (process exit and connection
close, whichever comes first) and it is restarted with exponential back-off.
On every (re)connect npud attaches as the manager, pushes the full
scheduling table, registers itself as the one HAL callback, and re-sends live
grants and the thermal status. While a driver is down its clients get
DeviceUnavailable from the runtime; npud keeps serving.

What npud tells the drivers (the table, the grants, the thermal status: pushed as they
change, replayed on every attach) is :mod:`.driver_feed`; this module owns the host
processes and their connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from npumanager.clock import LoopClock, wait_first, wait_for
from npumanager.config import Config
from npumanager.errors import ServiceUnavailable, UnsafePath
from npumanager.hal import raise_wire, rt_wire
from npumanager.hal.host_config import device_entries
from npumanager.hal.wire import SERVICE
from npumanager.paths import BACKGROUND_LANE, default_state_dir, ensure_drivers_dir, lane_name
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.service import hand_ties, host_entries, host_records
from npumanager.service.driver_feed import DriverFeed
from npumanager.service.driver_launch import DriverLaunch, driver_user, prepare_launch
from npumanager.service.driver_link import DriverEvents, event_handlers
from npumanager.service.driver_slots import Backoff, DriverSlot, host_listens, wait_settled
from npumanager.service.events import HeldGrant
from npumanager.service.host_compile_watch import HostCompileWatch
from npumanager.service.host_lanes import make_lane
from npumanager.service.host_process import HostProcess
from npumanager.service.host_raise import HostRaises, bound_of
from npumanager.service.host_rt import HostRtGrants
from npumanager.wire.client import connect_async
from npumanager.wire.conn import RpcConnection

log = logging.getLogger("npumanager.service.supervisor")


class DriverSupervisor(DriverFeed):
    def __init__(self, cfg: Config, runtime_dir: Path, events: DriverEvents, clock: LoopClock,
                 *, state_dir: Path | None = None, startup_wait_s: float = 20.0,
                 detach_wait_s: float = 15.0) -> None:
        self.cfg = cfg
        self.runtime_dir = Path(runtime_dir)
        self.events = events
        self.clock = clock
        self.state_dir = state_dir
        self.startup_wait_s = startup_wait_s
        #: How long a detach waits for hosts still starting to attach (under systemd's
        #: TimeoutStopSec=30s in packaging/systemd/npud.service).
        self.detach_wait_s = detach_wait_s
        self.enforce_admission = bool(cfg.section("manager").get("enforce_admission", True))
        self.poll_s = float(cfg.section("thermal").get("poll_interval_s", 1.0))
        super().__init__()  # the table, grants and thermal status (driver_feed.py)
        self.stopping = False
        #: A restart-safe stop (:meth:`detach`): attached hosts are left running, orphaned.
        self.detaching = False
        self.slots: list[DriverSlot] = []
        #: Second host processes of devices with ``background_host`` (service/host_lanes.py).
        self.lanes: list[DriverSlot] = []
        #: Driver hosts' burst threads npud put at SCHED_FIFO (service/host_rt.py).
        self.rt_grants = HostRtGrants(clock)
        #: Driver hosts' starved compiles npud raised to nice 0 (service/host_raise.py).
        self.raises = HostRaises(clock)
        #: Driver hosts' in-process compiles npud watches for them (host_compile_watch.py).
        self.compile_watch = HostCompileWatch(clock, self.raises)
        hosts: dict[str, DriverSlot] = {}
        for i, entry in enumerate(device_entries(cfg)):
            name = str(entry["name"])
            slot = DriverSlot(
                name=name, number=i, entry=entry,
                backoff=Backoff(float(entry.get("restart_backoff_s", 0.2)),
                                float(entry.get("restart_backoff_max_s", 10.0))),
                info=DeviceInfo(name=name, socket_path=str(self._socket(name)),
                                available=False, device_number=i),
            )
            host = str(entry.get("host") or "")
            if host and host in hosts:
                slot.leader = hosts[host]
                slot.leader.group.append(slot)
            else:
                slot.group = [slot]
                if host:
                    hosts[host] = slot
            self.slots.append(slot)
            if entry.get("background_host"):  # (device_entries: never with ``host``)
                lane_sock = self._socket(lane_name(name, BACKGROUND_LANE))
                self.lanes.append(make_lane(slot, str(lane_sock)))

    def __repr__(self) -> str:
        up = sum(s.up for s in self.slots)
        return f"<DriverSupervisor {up}/{len(self.slots)} drivers up | {len(self.grants)} grants>"

    def _socket(self, name: str) -> Path:
        return self.runtime_dir / "drivers" / f"{name}.sock"

    def _slot_socket(self, slot: DriverSlot) -> Path:
        """The socket of ``slot``'s host: its device's, or its background lane's."""
        return self._socket(slot.sock_name)

    def _record(self, slot: DriverSlot) -> Path:
        """npud's record of the host it started for ``slot`` (service/host_records.py)."""
        return host_records.record_path(self._slot_socket(slot))


    # --- DriverControl ------------------------------------------------------------

    async def start(self) -> None:
        ensure_drivers_dir(self.runtime_dir)
        for slot in self.all_slots():
            run = self._supervise(slot) if slot.leader is None else self._follow(slot)
            slot.task = asyncio.get_running_loop().create_task(run)
        # npud is ready once its drivers are (or failed to come up in time).
        waits = [asyncio.ensure_future(s.ready.wait()) for s in self.all_slots()]
        if waits:
            all_ready = asyncio.ensure_future(asyncio.wait(waits))
            await wait_first(self.clock, {all_ready}, self.startup_wait_s)
            for t in [all_ready, *waits]:
                t.cancel()

    async def stop(self) -> None:
        self.stopping = True
        for lane in self.lanes:
            self._say_lane_up(lane)  # held for a main host still starting (_say_up)
        self.rt_grants.stop()
        self.compile_watch.stop()
        for slot in self.all_slots():
            if slot.task is not None:
                slot.task.cancel()
        for slot in self.all_slots():
            if slot.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await slot.task
            await self._terminate(slot)

    async def detach(self) -> None:
        """Let go of the drivers without stopping them (npud's SIGTERM: a restart).

        Each attached host sees npud's connection close, exactly as when npud dies: it
        keeps its loaded models running for ``orphan_grace_s``, loads nothing new, and
        is adopted by the next npud that attaches in time (else it releases them all and
        exits). Nothing is revoked or ended here.

        A host still starting (a restart right after a driver crash: the replacement is
        importing its backend) is waited for, up to ``detach_wait_s``, and attached, so
        that it too is left running: stopped, it would hold nothing, but the next npud
        would start its backend from scratch, and an attached host is the one kind that
        runs the orphan grace and exits if no npud comes back. One that does not come up
        in time is stopped (it holds nothing)."""
        self.detaching = True  # from here no host is started or restarted
        await wait_settled(self.clock, self.all_slots(), self.detach_wait_s)
        await self.stop()

    def devices(self) -> list[DeviceInfo]:
        return [s.info for s in self.slots]

    def restart(self, driver: str, reason: str) -> None:
        """Kill the host serving ``driver`` now (SIGKILL: a hung host may not handle
        SIGTERM); its watch sees it exit, reports it down and restarts it with back-off.
        A device with a background lane: the host(s) owing an acknowledgement."""
        slot = self.driver_of(driver)
        if slot is None or not slot.up:
            return
        for hung in self._hung(slot):
            self._kill(hung.leader or hung, reason)

    def temperatures(self) -> dict[str, float]:
        return {s.name: s.temperature for s in self.slots
                if s.up and s.temperature is not None}

    async def poll_temperatures(self) -> None:
        """Ask every up driver for its temperature now (the watch loop does this every
        ``[thermal] poll_interval_s``)."""
        for slot in self.slots:
            if slot.up and slot.conn is not None:
                await self._poll_temperature(slot, slot.conn)

    async def wait_applied(self) -> None:
        """Return once every up driver has handled everything pushed to it so far: a
        round trip on each connection (a driver handles a connection's frames in order)."""
        for slot in self.all_slots():
            if slot.up and slot.conn is not None and not slot.conn.closed:
                with contextlib.suppress(Exception):
                    await slot.conn.call("device.get_number_of_cache_files_needed", Empty())

    def down_reasons(self) -> dict[str, str]:
        """Why each driver that is not up is down (for `npu status`)."""
        return {s.name: s.last_exit or "starting" for s in self.slots if not s.up}

    # --- internals -------------------------------------------------------------------

    def _command(self, slot: DriverSlot, launch: DriverLaunch) -> list[str]:
        from npumanager.hal.host_config import HostConfig

        hcs = [HostConfig.from_config(self.cfg, s.name, slot.lane) for s in slot.group]
        for hc in hcs:
            hc.enforce_admission = self.enforce_admission
            hc.background_cgroup_dir = str(launch.bg_group or "")
        # One device: its config; several: the list, in the order of the sockets.
        encoded = (json.dumps(dataclasses.asdict(hcs[0])) if len(hcs) == 1
                   else json.dumps([dataclasses.asdict(hc) for hc in hcs]))
        # -P: the host's working directory never lands on sys.path.
        return [sys.executable, "-P", "-m", "npumanager", "driver", hcs[0].host_name,
                "--runtime-dir", str(self.runtime_dir),
                "--host-config-json", encoded,
                "--exit-with-manager", "--launcher-pid", str(os.getpid()),
                "--state-dir", str(self._state_root()), *launch.args()]

    def _state_root(self) -> Path:
        return Path(self.state_dir) if self.state_dir is not None else default_state_dir()

    def _wants_cgroup(self, slot: DriverSlot) -> bool:
        """Whether the host's background threads get a cpu.idle group (hal/idle_cgroup.py):
        ``background_cgroup = "auto"`` with ``background_sched = "idle"``."""
        from npumanager.hal.host_config import HostConfig

        hc = HostConfig.from_config(self.cfg, slot.group[0].name, slot.lane)
        return hc.background_cgroup == "auto" and hc.background_sched == "idle"

    def _launch(self, slot: DriverSlot) -> DriverLaunch:
        """The user, directories and listening socket of the host's next start
        (service/driver_launch.py); RuntimeError with the reason if they cannot be had."""
        mgr = self.cfg.section("manager")
        try:
            user = driver_user(str(mgr.get("driver_user", "")))
            names: str | list[str] = (slot.sock_name if len(slot.group) == 1
                                      else [s.name for s in slot.group])
            return prepare_launch(names, user, self._state_root(), self.runtime_dir,
                                  int(mgr.get("socket_mode", 0o666)),
                                  background_cgroup=self._wants_cgroup(slot))
        except LookupError as exc:
            slot.last_exit = str(exc)
            raise RuntimeError(slot.last_exit) from None
        except (UnsafePath, OSError) as exc:
            # One line that says what to change (shown in `npu status`).
            how = "--state-dir" if self.state_dir is not None else "NPU_STATE_DIR"
            slot.last_exit = (f"cannot create its state dir: "
                              f"{getattr(exc, 'strerror', None) or exc}; set {how} to a "
                              "directory npud may use")
            raise RuntimeError(slot.last_exit) from None

    async def _supervise(self, slot: DriverSlot) -> None:
        clock = self.clock
        adopt = True
        # An orphaned host releases everything and exits after its grace: until then a
        # live one that does not answer is attached again, never replaced.
        grace = float(self.cfg.section("manager").get("orphan_grace_s", 10.0))
        patience_until = clock.now() + grace + 5.0
        while not (self.stopping or self.detaching):  # a detach starts nothing new
            started = clock.now()
            try:
                if adopt:
                    adopt = False
                    # An earlier npud's host may still serve (orphaned, its models running
                    # for the grace): attach to it rather than start a second one.
                    if await self._attach_existing(slot):
                        continue
                    if slot.unanswered and clock.now() < patience_until:
                        # Too slow on a loaded machine, but alive: a second host on its
                        # socket path would leave it serving its loaded models where npud
                        # can neither see nor count them. Attach again after the back-off.
                        adopt = True
                        raise RuntimeError(f"{slot.unanswered}; attaching again")
                await self._run_once(slot)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                slot.last_exit = str(exc)  # logged once below, with the restart delay
            finally:
                was_up = slot.up
                slot.host_ready.clear()
                self._mark_down(slot)
                await self._terminate(slot, attached=was_up)
                slot.settled.set()
                if was_up and not self.stopping:
                    self._announce_down(slot, slot.last_exit or "driver exited")
            slot.ready.set()  # it tried; npud's start does not wait for a broken driver
            if self.stopping or self.detaching:
                self._say_lane_up(slot)
                return
            delay = slot.backoff.next_delay(clock.now() - started)
            log.warning("driver %s is down (%s); restarting in %.1f s", slot.label,
                        slot.last_exit, delay)
            self._say_lane_up(slot)  # its lane's line, held for this start (_say_up)
            await clock.sleep(delay)

    async def _run_once(self, slot: DriverSlot) -> None:
        slot.starts += 1
        launch = self._launch(slot)
        try:
            proc = await HostProcess.spawn(self._command(slot, launch), **launch.spawn_kwargs())
        except BaseException:
            launch.close()
            launch.remove_socket()
            raise
        launch.close()  # the host holds the listening socket now
        slot.launch = launch
        slot.proc = proc
        why = host_records.write(self._record(slot), proc.pid, launch.user.uid)
        if why:
            log.warning("driver %s: no record of its host (%s): an npud that adopts it "
                        "after a restart grants its threads no real-time priority",
                        slot.name, why)
        slot.settled.clear()  # starting: a detach waits for it to attach (see detach)
        exited = asyncio.ensure_future(proc.wait())
        try:
            await self._wait_ready(slot, proc, exited)
            self._host_serves(slot)
            closed = asyncio.Event()

            def on_close(conn: RpcConnection, exc: BaseException | None) -> None:
                closed.set()

            conn, _ = await connect_async(str(self._slot_socket(slot)), SERVICE,
                                          self._handlers(slot), client_name="npud",
                                          on_close=on_close)
            slot.conn = conn
            await self._handshake(slot, conn)
            slot.up = True
            slot.last_exit = ""  # kept until now: `npu status` shows why it was down
            slot.up_since = self.clock.now()
            slot.info.available = True
            self._say_up(slot, "driver %s is up (pid %d, %s)", slot.label, proc.pid,
                         slot.info.version)
            self._announce_up(slot)
            slot.ready.set()
            slot.settled.set()
            await self._watch(slot, conn, exited, closed)
        finally:
            if not exited.done():
                exited.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await exited

    def _host_serves(self, slot: DriverSlot) -> None:
        """The leader's process serves every device's socket: its other devices attach."""
        slot.generation += 1
        slot.host_ready.set()

    async def _follow(self, slot: DriverSlot) -> None:
        """A device of a host its leader starts: attach to its socket whenever that host
        serves, until the connection closes; the leader restarts the process."""
        leader = slot.leader
        assert leader is not None
        clock = self.clock
        while not self.stopping:
            while not leader.host_ready.is_set():
                slot.last_exit = leader.last_exit or "starting"
                if leader.ready.is_set():
                    slot.ready.set()  # its host tried: npud's start does not wait longer
                wait = asyncio.ensure_future(leader.host_ready.wait())
                try:
                    await wait_first(clock, {wait}, 0.2)
                finally:
                    wait.cancel()
                if self.stopping:
                    return
            generation, started = leader.generation, clock.now()
            try:
                if not await self._attach_existing(slot, adopt=False):
                    slot.last_exit = f"its host ({leader.name}) does not serve it"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                slot.last_exit = str(exc)
            finally:
                was_up = slot.up
                self._mark_down(slot)
                if was_up and not self.stopping:
                    self.events.driver_down(slot.name, slot.last_exit or "driver exited")
            slot.ready.set()
            if self.stopping:
                return
            if leader.generation == generation and leader.host_ready.is_set():
                await clock.sleep(slot.backoff.next_delay(clock.now() - started))

    async def _attach_existing(self, slot: DriverSlot, *, adopt: bool = True) -> bool:
        """Attach to a host already serving the socket; False when there is none. Returns
        (True) once that host's connection closed: the caller then starts a new one.
        ``adopt``: the host is one an earlier npud started, ours to stop once it closes
        (False for a device whose host its leader slot started)."""
        path = self._slot_socket(slot)
        slot.unanswered = ""
        if not path.exists():
            return False
        closed = asyncio.Event()

        def on_close(conn: RpcConnection, exc: BaseException | None) -> None:
            closed.set()

        try:
            conn, _ = await connect_async(str(path), SERVICE, self._handlers(slot),
                                          client_name="npud", on_close=on_close,
                                          connect_timeout=1.0, hello_timeout=2.0)
        except Exception as exc:
            if adopt and host_listens(path):
                slot.unanswered = f"the host at {path} did not answer npud in time ({exc})"
            return False  # else a stale socket file: start our own host
        slot.conn = conn
        try:
            await self._handshake(slot, conn)
        except Exception as exc:
            conn.close()
            slot.conn = None
            if (adopt and isinstance(exc, (ServiceUnavailable, TimeoutError))
                    and host_listens(path)):
                slot.unanswered = f"the host at {path} did not answer npud in time ({exc})"
                return False
            log.warning("driver %s at %s did not accept npud (%s); starting a new one",
                        slot.name, path, exc)
            return False
        slot.up = True
        slot.last_exit = ""
        slot.up_since = self.clock.now()
        slot.info.available = True
        if adopt:
            slot.adopted_pid = conn.peer.pid
            hand_ties.release(slot.adopted_record)
            slot.adopted_record = tie = hand_ties.tie_adopted(
                self._record(slot), conn.sock, conn.peer, self.cfg.section("manager"),
                slot.entry)
            self._say_up(slot, "driver %s adopted (pid %d, %s)", slot.label, conn.peer.pid,
                         "an earlier npud started it"
                         if isinstance(tie, host_records.HostRecord)
                         else "started by hand: tied to its socket's listener by "
                         f"{tie.how}" if isinstance(tie, hand_ties.HandTie) else tie)
            if len(slot.group) > 1:
                self._host_serves(slot)
        else:
            self._say_up(slot, "driver %s is up (pid %d, %s)", slot.label, conn.peer.pid,
                         slot.info.version)
        self._announce_up(slot)
        slot.ready.set()
        never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await self._watch(slot, conn, never, closed)
        return True

    async def _wait_ready(self, slot: DriverSlot, proc: HostProcess,
                          exited: asyncio.Future[int]) -> None:
        line_task = asyncio.ensure_future(proc.stdout.readline())
        both: set[asyncio.Future[Any]] = {line_task, exited}
        done = await wait_first(self.clock, both, 60.0)
        first = line_task.result() if line_task in done else b""
        if b"ready" in first:
            return
        line_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await line_task
        if first.strip():
            # The host's one-line reason (e.g. "driver X failed: cannot create its state dir").
            slot.last_exit = first.decode(errors="replace").strip().removeprefix(
                f"driver {slot.name}: ")
        elif exited.done():
            slot.last_exit = f"exited with code {exited.result()} before it was ready"
        else:
            slot.last_exit = "did not become ready"
        raise RuntimeError(slot.last_exit)

    async def _handshake(self, slot: DriverSlot, conn: RpcConnection) -> None:
        payload, _ = await conn.call("hal.attach_manager",
                                     pb.AttachManager(enforce_admission=self.enforce_admission))
        reply = pb.HeldGrants.FromString(payload)
        if (slot.leader or slot).proc is None:  # a host this npud did not start
            self._compare_entry(slot, reply.host_entry_json, conn.peer.pid)
        held = [HeldGrant(g.grant_id, g.uid, g.request_id, g.memory_bytes)
                for g in reply.grants]
        self.note_held(slot, [g.grant_id for g in held])
        hook = getattr(self.events, "driver_held", None)
        if held and hook is not None:
            # Before npud serves clients (start waits for its drivers): their claims meet
            # what the driver holds (service/adoption.py).
            hook(slot.name, held)
        await self._replay(slot, conn)
        payload, _ = await conn.call("device.capabilities", Empty())
        caps = pb.Capabilities.FromString(payload)
        slot.info = DeviceInfo(
            name=slot.name, version=caps.version, socket_path=str(self._slot_socket(slot)),
            channels=caps.channels, memory_bytes=caps.memory_bytes, available=False,
            model_cache_files=caps.model_cache_files, data_cache_files=caps.data_cache_files,
            backend=caps.backend, device_number=slot.number,
        )

    def _compare_entry(self, slot: DriverSlot, reported: str, pid: int) -> None:
        """Name the keys in which a host npud did not start runs another entry than npud
        would run it with (service/host_entries.py)."""
        slot.entry_differs = host_entries.differences(self.cfg, slot.name, slot.lane, reported)
        if slot.entry_differs:
            protection = str(getattr(self.events, "protection", "") or "")
            why = host_entries.fix(slot.entry_differs, (slot.leader or slot).entry.get(
                "host") or slot.name, slot.lane, protection)
            log.warning("%s", host_entries.warning(slot.label, pid, slot.entry_differs, why))

    async def _watch(self, slot: DriverSlot, conn: RpcConnection, exited: asyncio.Future[int],
                     closed: asyncio.Event) -> None:
        closed_wait = asyncio.ensure_future(closed.wait())
        try:
            while True:
                done = await wait_first(self.clock, {exited, closed_wait}, self.poll_s)
                if exited in done:
                    slot.last_exit = f"exited with code {exited.result()}"
                    return
                if closed_wait in done:
                    # Usually the process is dying too: name its exit status if it comes
                    # at once (a kill), else report the closed connection.
                    await wait_first(self.clock, {exited}, 0.2)
                    slot.last_exit = (f"exited with code {exited.result()}" if exited.done()
                                      else "its connection closed")
                    return
                await self._poll_temperature(slot, conn)
        finally:
            closed_wait.cancel()

    async def _poll_temperature(self, slot: DriverSlot, conn: RpcConnection) -> None:
        try:
            payload, _ = await wait_for(self.clock, conn.call("hal.get_temperature", Empty()),
                                        self.poll_s)
        except Exception:
            return
        t = pb.Temperature.FromString(payload).celsius
        slot.temperature = None if t != t else t

    def _handlers(self, slot: DriverSlot) -> dict[str, object]:
        def host_pid(by_hand: bool = False) -> int | str:
            # The process this npud spawned for the slot's host (its leader's), alive; or
            # the one it adopted, while it is still the host an earlier npud recorded, or
            # (``by_hand``: real-time grants only) one started by hand that npud tied to
            # its socket's listener (service/hand_ties.py).
            leader = slot.leader or slot
            proc = leader.proc
            if proc is not None:
                return proc.pid if proc.returncode is None else "its host exited"
            tie = leader.adopted_record
            if leader.adopted_pid > 0 and (by_hand or not isinstance(tie, hand_ties.HandTie)):
                return hand_ties.grantable(tie, leader.adopted_pid)
            return "not a host this npud started or adopted"

        configured = int(slot.entry.get("foreground_rt_priority", 0) or 0)
        bound = bound_of((slot.leader or slot).entry)
        return {**self._lane_handlers(slot, event_handlers(slot.name, self.events)),
                rt_wire.REQUEST: self.rt_grants.handler(lambda: host_pid(by_hand=True),
                                                        configured),
                raise_wire.REQUEST: self.raises.handler(host_pid, bound),
                raise_wire.WATCH: self.compile_watch.handler(host_pid, bound)}

    def _mark_down(self, slot: DriverSlot) -> None:
        slot.up = False
        slot.entry_differs = []  # (of the host that was up)
        slot.temperature = None
        slot.info.available = False
        if slot.conn is not None:
            slot.conn.close()
            slot.conn = None

    async def _terminate(self, slot: DriverSlot, attached: bool = False) -> None:
        if self.detaching and attached:
            self._leave_running(slot)
            return
        pid, slot.adopted_pid = slot.adopted_pid, 0
        hand_ties.release(slot.adopted_record)
        slot.adopted_record = ""
        if pid > 0 or slot.proc is not None:
            host_records.remove(self._record(slot))  # (this npud stops the host it names)
        if pid > 0:
            with contextlib.suppress(OSError):  # gone already, or not ours to signal
                os.kill(pid, signal.SIGTERM)
        proc, slot.proc = slot.proc, None
        launch, slot.launch = slot.launch, None
        try:
            await self._stop_process(proc)
        finally:
            if launch is not None:
                launch.remove_socket()

    @staticmethod
    def _leave_running(slot: DriverSlot) -> None:
        """Forget an attached host without signalling it; its socket file stays, for the
        next npud to find and attach to."""
        slot.adopted_pid = 0  # (its record stays, for the next npud)
        hand_ties.release(slot.adopted_record)
        slot.adopted_record = ""
        slot.launch = None  # npud's copy of the listener is closed already (_run_once)
        proc, slot.proc = slot.proc, None
        if proc is not None:
            proc.disown()

    async def _stop_process(self, proc: HostProcess | None) -> None:
        if proc is None:
            return
        if proc.returncode is None:
            proc.terminate()
            try:
                await wait_for(self.clock, proc.wait(), 10.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        proc.close_stdout()

