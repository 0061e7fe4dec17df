"""npud's async shell around the pure :class:`ManagerState`.

The state decides; this module acts. Every stimulus (an RPC from a client, a
connection closing, a timer, a driver event, a thermal reading) becomes an
event with a stimulus id and ``now`` from the daemon's clock; the state returns
instructions and :meth:`Daemon.submit` carries them out in order: grants go to
the drivers BEFORE the CAN_LOAD_NOW push that names them, timers are armed on
the event loop, scheduling-table updates and thermal status go to the drivers.

A bug in the state or in carrying out one instruction is logged and never
kills the daemon: the caller gets ``InternalError`` and everyone else keeps
being served. Drivers are reached only through :class:`DriverControl`
(:func:`make_driver_control` builds the supervisor when one is configured).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from npumanager.clock import LoopClock, MonotonicClock, Timer
from npumanager.config import Config
from npumanager.constants import LoadStatus, RequestStatus, ThermalStatus, UnloadReason
from npumanager.errors import InternalError, NpuError, ServiceError
from npumanager.hal.types import EndReason, WorkInfo
from npumanager.paths import (
    ensure_runtime_dir,
    manager_socket,
)
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.proto.v1.manager_pb2 import CanLoad, RequestComplete, UnloadAsk
from npumanager.service import events as ev
from npumanager.service.admin_settings import SettingsKeeper
from npumanager.service.driver_link import DriverControl, DriverEvents, NoDrivers
from npumanager.service.integrations import Integrations
from npumanager.service.logs import DECISIONS, decision
from npumanager.service.observe import call as observe
from npumanager.service.policy import ManagerParams
from npumanager.service.rt_apps import AppRealtime
from npumanager.service.rt_privilege import fifo_problems
from npumanager.service.state import ManagerState
from npumanager.service.supervisor import DriverSupervisor
from npumanager.version import __version__
from npumanager.wire.conn import RpcConnection
from npumanager.wire.server import RpcServer, resolve_group
from npumanager.words import plural

log = logging.getLogger("npumanager.npud")

PUSH_CAN_LOAD = "on_can_load_model"
PUSH_UNLOAD = "on_request_unload_model"
PUSH_COMPLETE = "on_model_load_request_complete"


def drivers_enabled(cfg: Config) -> bool:
    """``[manager] drivers = false`` (or ``npu serve --no-drivers``) runs a pure manager."""
    return bool(cfg.section("manager").get("drivers", True)) and bool(cfg.drivers())


def make_driver_control(
    cfg: Config, runtime_dir: Path, events: DriverEvents, clock: LoopClock,
    state_dir: Path | None = None,
) -> DriverControl:
    """The one place npud builds its driver supervisor: a :class:`DriverSupervisor` when
    drivers are enabled, else :class:`NoDrivers` (a pure manager)."""
    if not drivers_enabled(cfg):
        return NoDrivers()
    return DriverSupervisor(cfg, runtime_dir, events, clock, state_dir=state_dir)


@dataclass(eq=False, slots=True)
class ManagerClient:
    """npud's state of one client connection."""

    cid: int
    #: The key its requests are filed under: its uid, or its app's key (unit identity).
    key: int
    conn: RpcConnection
    #: It made a request: its death is reported to the state (ClientGone).
    seen: bool = False


class Daemon:
    """npud: the RPC server, the ManagerState, timers, drivers, thermal and importance."""

    def __init__(
        self,
        cfg: Config,
        runtime_dir: Path,
        *,
        clock: LoopClock | None = None,
        drivers: DriverControl | None = None,
        state: ManagerState | None = None,
        use_drivers: bool = True,
        state_dir: Path | None = None,
        driver_state_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.runtime_dir = Path(runtime_dir)
        self.clock: LoopClock = clock if clock is not None else MonotonicClock()
        if drivers is not None:
            self.drivers: DriverControl = drivers
        elif use_drivers:
            # The hosts get --state-dir only when npud got one; else they find theirs
            # as npud does ($NPU_STATE_DIR, ...), and say so when it is unusable.
            self.drivers = make_driver_control(cfg, self.runtime_dir, self, self.clock,
                                               driver_state_dir)
        else:
            self.drivers = NoDrivers()
        if state is None:
            # Each configured driver stands for its first device until it reports its own.
            params = replace(ManagerParams.from_config(cfg),
                             drivers=tuple(d.name for d in self.drivers.devices()))
            state = ManagerState(params)
        self.state = state
        self.conns: dict[int, RpcConnection] = {}
        self.clients: dict[RpcConnection, ManagerClient] = {}
        self._next_conn = itertools.count(1)
        self._stimuli = itertools.count(1)
        self._timers: dict[str, tuple[float, Timer]] = {}
        self.server: RpcServer | None = None
        self.stopping = False
        self.started_at = time.time()
        self.internal_errors = 0
        #: Thermal monitor, process importance, [[app]] table (when installed).
        self.extras = Integrations(self)
        #: Real-time threads granted to FOREGROUND apps and their watchdog (rt_apps.py).
        self.realtime = AppRealtime(self)
        #: Metrics, systemd notify, traces (service/observe.py); empty = no cost.
        self.observers: list[Any] = []
        self._runners = self._make_runners()
        #: What foreground protection is in force (service/protection.py; `npu serve` sets
        #: it, "" for an npud built without it).
        self.protection = ""
        #: Admin settings kept across restarts (service/admin_settings.py).
        self.settings = SettingsKeeper(self, state_dir)

    def __repr__(self) -> str:
        return f"<npud at {self.runtime_dir}: {len(self.conns)} clients | {self.state!r}>"

    # --- events in ----------------------------------------------------------

    def stimulus(self, kind: str) -> str:
        return f"{kind}-{next(self._stimuli)}"

    def submit(self, event: ev.Event) -> list[ev.Instruction]:
        """Feed one event to the state and carry out what it decides, in order.

        Caller mistakes (``NpuError``) propagate unchanged with the state
        untouched; a bug is logged and becomes ``InternalError``."""
        try:
            instructions: list[ev.Instruction] = self.state.handle(event)
        except NpuError:
            raise
        except Exception as exc:
            self.internal_errors += 1
            log.exception("state failed on %s (%s)", event.stimulus_id, type(event).__name__)
            self._check_state()
            raise InternalError(
                f"npud failed handling {type(event).__name__} ({event.stimulus_id}); "
                f"the error is logged and npud keeps serving"
            ) from exc
        self.execute(instructions)
        if self.observers:
            observe(self.observers, "on_event", event, instructions)
        return instructions

    def _check_state(self) -> None:
        try:
            self.state.validate()
        except Exception:
            log.exception("state invariants broken after an internal error")

    def submit_quietly(self, event: ev.Event) -> None:
        """For stimuli nobody answers (timers, disconnects, driver events): log failures."""
        try:
            self.submit(event)
        except NpuError as exc:
            log.warning("%s (%s) refused: %s", type(event).__name__, event.stimulus_id, exc)

    # --- instructions out ---------------------------------------------------

    def execute(self, instructions: list[ev.Instruction]) -> None:
        run = self._runners
        for ins in instructions:
            try:
                run[type(ins)](ins)
            except KeyError:
                log.error("unknown instruction %r ignored", ins)
            except Exception:
                self.internal_errors += 1
                log.exception("carrying out %r failed; continuing with the rest", ins)

    def _make_runners(self) -> dict[type, Callable[[Any], None]]:
        """One function per instruction type (a dict lookup, not an isinstance chain).

        Decisions are logged only when the decision logger is on: building the
        fields costs more than the push on the hot path."""
        say = DECISIONS.isEnabledFor(logging.INFO)
        conns = self.conns
        drivers = self.drivers
        # The host a grant is valid on (a device with a background lane has two:
        # service/host_lanes.py); drivers without lanes have no such call.
        lane_of = getattr(drivers, "grant_lane", None)

        def can_load(ins: ev.SendCanLoad) -> None:
            if say:
                decision("granted" if ins.status == LoadStatus.CAN_LOAD_NOW else "load answered",
                         uid=ins.uid, request_id=ins.request_id,
                         status=LoadStatus(ins.status).name)
            conn = conns.get(ins.conn)
            if conn is not None:
                lane = lane_of(ins.grant_id) if lane_of is not None and ins.grant_id else ""
                conn.push(PUSH_CAN_LOAD, CanLoad(request_id=ins.request_id,
                                                 status=int(ins.status),
                                                 grant_id=ins.grant_id or "", lane=lane))

        def issue_grant(ins: ev.IssueGrant) -> None:
            drivers.grant_issued(ins.uid, ins.request_id, ins.grant_id, ins.device,
                                 ins.priority)

        def complete(ins: ev.SendComplete) -> None:
            if say:
                decision("request ended", uid=ins.uid, request_id=ins.request_id,
                         status=RequestStatus(ins.status).name)
            conn = conns.get(ins.conn)
            if conn is not None:
                conn.push(PUSH_COMPLETE, RequestComplete(request_id=ins.request_id,
                                                         status=int(ins.status)))

        def end_grant(ins: ev.EndGrant) -> None:
            if say:
                decision("grant revoked" if ins.revoked else "grant ended", uid=ins.uid,
                         request_id=ins.request_id)
            drivers.grant_ended(ins.grant_id, ins.revoked, ack=ins.ack)

        def restart_driver(ins: ev.RestartDriver) -> None:
            log.error("%s", ins.reason, extra={"driver": ins.driver})
            drivers.restart(ins.driver, ins.reason)

        def ask_unload(ins: ev.AskUnload) -> None:
            decision("unload asked", uid=ins.uid, request_id=ins.request_id,
                     reason=UnloadReason(ins.reason).name)
            conn = conns.get(ins.conn)
            if conn is not None:
                conn.push(PUSH_UNLOAD, UnloadAsk(request_id=ins.request_id,
                                                 reason=int(ins.reason)))

        def push_configs(ins: ev.PushSchedulingConfigs) -> None:
            decision("scheduling configs pushed", uids=[e.uid for e in ins.entries])
            drivers.update_scheduling_configs(self.extras.merge_configs(ins.entries))

        def driver_thermal(ins: ev.SetDriverThermal) -> None:
            decision("driver thermal status", status=ThermalStatus(ins.status).name,
                     device=ins.device or "all")
            drivers.set_thermal_status(ins.status, ins.device)

        return {
            ev.SendCanLoad: can_load,
            ev.IssueGrant: issue_grant,
            ev.SendComplete: complete,
            ev.RequestEnded: lambda ins: None,  # for observers (metrics): nothing to do
            ev.RequestDropped: lambda ins: None,
            ev.EndGrant: end_grant,
            ev.RestartDriver: restart_driver,
            ev.AskUnload: ask_unload,
            ev.ArmTimer: lambda ins: self._arm(ins.key, ins.at),
            ev.CancelTimer: lambda ins: self._disarm(ins.key),
            ev.PushSchedulingConfigs: push_configs,
            ev.SetDriverThermal: driver_thermal,
        }

    # --- timers -------------------------------------------------------------

    def _arm(self, key: str, at: float) -> None:
        """Timers run on the daemon's clock: the loop's in production, a test's virtual
        one (fired as the test advances it) in tests."""
        self._disarm(key)
        self._timers[key] = (at, self.clock.call_at(at, lambda: self._timer_due(key)))

    def _disarm(self, key: str) -> None:
        entry = self._timers.pop(key, None)
        if entry is not None:
            entry[1].cancel()

    def _timer_due(self, key: str) -> None:
        if self._timers.pop(key, None) is not None:
            self.submit_quietly(ev.TimerFired(
                stimulus_id=self.stimulus("timer"), now=self.clock.now(), key=key))

    @property
    def armed_timers(self) -> dict[str, float]:
        return {k: at for k, (at, _h) in self._timers.items()}

    # --- connections --------------------------------------------------------

    def _on_connect(self, conn: RpcConnection) -> None:
        cid = next(self._next_conn)
        # The key requests are filed under: the uid, or the app's systemd unit.
        key = self.extras.identity(conn.peer.uid, conn.peer.pid)
        self.clients[conn] = ManagerClient(cid, key, conn)
        self.conns[cid] = conn

    def _on_disconnect(self, conn: RpcConnection, exc: BaseException | None) -> None:
        client = self.clients.pop(conn, None)
        if client is None:
            return
        self.conns.pop(client.cid, None)
        self.realtime.conn_closed(client.cid)
        if self.stopping:
            return
        if client.seen:
            self.submit_quietly(ev.ClientGone(stimulus_id=self.stimulus("gone"),
                                              now=self.clock.now(), conn=client.cid))
        if not any(c.key == client.key for c in self.clients.values()):
            self.extras.client_gone(client.key)

    # --- DriverEvents (called by the supervisor on this loop) -------------

    def driver_up(self, info: DeviceInfo) -> None:
        log.info("driver %s up", info.name, extra={"driver": info.name})
        if self.observers:
            observe(self.observers, "on_driver", info.name, True, "")
        self.submit_quietly(ev.DriverUp(stimulus_id=self.stimulus("driver-up"),
                                        now=self.clock.now(), name=info.name,
                                        memory_bytes=int(info.memory_bytes)))

    def driver_down(self, name: str, reason: str) -> None:
        log.warning("driver %s down: %s", name, reason, extra={"driver": name})
        if self.observers:
            observe(self.observers, "on_driver", name, False, reason)
        self.submit_quietly(ev.DriverDown(stimulus_id=self.stimulus("driver-down"),
                                          now=self.clock.now(), name=name))

    def driver_held(self, name: str, grants: list[ev.HeldGrant]) -> None:
        """A driver an earlier npud started lists the grants it holds (adoption)."""
        log.info("driver %s holds %s from before npud restarted", name,
                 plural(len(grants), "grant"),
                 extra={"driver": name})
        self.submit_quietly(ev.DriverHeld(stimulus_id=self.stimulus("driver-held"),
                                          now=self.clock.now(), name=name,
                                          grants=tuple(grants)))

    def work_started(self, driver: str, info: WorkInfo) -> None:
        if self.observers:
            observe(self.observers, "on_work_started", driver, info)

    def cache_result(self, driver: str, result: str) -> None:
        if self.observers:
            observe(self.observers, "on_cache_result", driver, result)

    def work_ended(self, driver: str, info: WorkInfo, reason: EndReason) -> None:
        if self.observers:
            observe(self.observers, "on_work_ended", driver, info, reason)
        self.submit_quietly(ev.WorkEnded(stimulus_id=self.stimulus("work-ended"),
                                         now=self.clock.now(), uid=info.original_uid,
                                         reason=reason, device=self._device_of(driver, info)))

    def _device_of(self, driver: str, info: WorkInfo) -> str | None:
        """The device a driver's work ran on (its ``device_number`` in ``nn.devices()``),
        if npud knows it; None: the uid's holders on every device count."""
        names = self.state.devices()
        n = info.device_number
        if 0 <= n < len(names) and (names[n] == driver or names[n].startswith(driver + ":")):
            return names[n]
        return driver if driver in names else None

    def grant_end_applied(self, driver: str, grant_id: str) -> None:
        """``driver`` released the models of an ended grant (service/ending.py)."""
        self.submit_quietly(ev.GrantEndApplied(stimulus_id=self.stimulus("grant-end-applied"),
                                               now=self.clock.now(), grant_id=grant_id,
                                               driver=driver))

    def model_memory(self, driver: str, grant_id: str, nbytes: int) -> None:
        self.submit_quietly(ev.ModelMemory(stimulus_id=self.stimulus("model-memory"),
                                           now=self.clock.now(), grant_id=grant_id,
                                           nbytes=nbytes))

    def model_freed(self, driver: str, grant_id: str, nbytes: int) -> None:
        """A model of a moved grant was released on the host it moved away from."""
        self.submit_quietly(ev.ModelMemory(stimulus_id=self.stimulus("model-freed"),
                                           now=self.clock.now(), grant_id=grant_id,
                                           nbytes=nbytes, freed=True))

    # --- optional inputs (see integrations.py) -----------------------------

    def client_seen(self, client: ManagerClient) -> None:
        client.seen = True
        self.extras.client_seen(client)

    def thermal_info(self) -> dict[str, Any]:
        return self.extras.thermal_info()

    def thermal_override(self, status: ThermalStatus | None) -> None:
        self.extras.thermal_override(status)

    # --- dumpsys ------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        now = self.clock.now()
        out: dict[str, Any] = dict(self.state.dump(now))
        out["daemon"] = {
            "version": __version__,
            "pid": os.getpid(),
            "uid": os.getuid(),
            "runtime_dir": str(self.runtime_dir),
            "uptime_s": round(time.time() - self.started_at, 3),
            "clients": len(self.conns),
            "internal_errors": self.internal_errors,
            "accept_failures": self.server.accept_failures if self.server is not None else 0,
            "timers": len(self._timers),
            "components": self.extras.wired(),
            "settings": self.settings.info(),
        }
        if self.protection:
            out["daemon"]["protection"] = self.protection
        out["thermal"] = {**out.get("thermal", {}), **self.thermal_info()}
        out["realtime"] = self.realtime.watch.info()
        down = getattr(self.drivers, "down_reasons", None)
        reasons: dict[str, str] = down() if callable(down) else {}
        pids = getattr(self.drivers, "host_pids", None)  # (service/host_lanes.py)
        hosts: dict[str, dict[str, Any]] = pids() if callable(pids) else {}
        out["devices"] = [device_dict(d, reasons.get(d.name), hosts.get(d.name))
                          for d in self.drivers.devices()]
        lanes = getattr(self.drivers, "request_lanes", None)  # (service/host_lanes.py)
        if callable(lanes):
            # Which host a granted request's grant is valid on ("": its device's main one).
            of = lanes()
            counts = getattr(self.drivers, "request_move_counts", None)
            moves: dict[tuple[int, int], int] = counts() if callable(counts) else {}
            for r in out.get("requests") or []:
                key = (r.get("uid"), r.get("request_id"))
                lane = of.get(key)
                if lane is not None:
                    r["lane"] = lane
                if key in moves:  # its grant followed its uid's class (service/grant_moves)
                    r["moves"] = moves[key]
            out["grant_moves"] = sum(getattr(self.drivers, "device_moves", {}).values())
        return out

    # --- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        from npumanager.service.server import manager_handlers

        mcfg = self.cfg.section("manager")
        ensure_runtime_dir(self.runtime_dir)
        refuse_if_serving(manager_socket(self.runtime_dir))
        self.server = RpcServer(
            str(manager_socket(self.runtime_dir)),
            "manager",
            manager_handlers(self),
            mode=int(mcfg.get("socket_mode", 0o666)),
            max_frame=int(mcfg.get("max_frame", 1 << 20)),
            max_connections_per_uid=int(mcfg.get("max_connections_per_uid", 64)),
            admin_gid=resolve_group(mcfg.get("admin_group") or None),
            hello_timeout=float(mcfg.get("hello_timeout_s", 5.0)),
            # No manager method takes fds: any fd a client sends closes its connection.
            max_fds_in_flight=0,
            on_connect=self._on_connect,
            on_disconnect=self._on_disconnect,
        )
        # The protection's FIFO keys set where npud cannot serve them (service/rt_privilege.py).
        for line in fifo_problems(self.cfg, use_drivers=not isinstance(self.drivers, NoDrivers)):
            log.warning("%s", line)
        self.extras.check()  # a config npud would refuse, refused before any host starts
        await self.drivers.start()
        self.extras.setup()
        self.settings.restore()
        await self.server.start()
        log.info("npud %s serving %s", __version__, self.server.path)

    async def stop(self, reason: str = "npud is shutting down", *, detach: bool = False) -> None:
        """Stop serving. By default a final stop: clients hear ``reason`` (their live
        requests end CANCELLED) and the driver hosts are stopped.

        ``detach`` (`npu serve` on SIGTERM/SIGINT: ``systemctl restart``, an upgrade) is a
        restart as seen by everyone else: npud stops accepting and closes its connections
        without a goodbye and without ending a grant, so clients keep their live requests
        and reconnect, and drivers keep their loaded models for ``orphan_grace_s`` (loading
        nothing new) for the next npud to adopt, as after a crash. With no next npud the
        hosts release their models and exit after the grace. Admin settings are on disk
        already (saved at each change); requests are rebuilt from both sides."""
        self.stopping = True
        self.extras.stop()
        self.realtime.stop()
        for key in list(self._timers):
            self._disarm(key)
        if self.server is not None:
            await self.server.close(None if detach else reason)
        try:
            await (self.drivers.detach() if detach else self.drivers.stop())
        except Exception:
            log.exception("%s drivers failed", "detaching" if detach else "stopping")
        log.info("npud stopped%s", " (drivers left running for the next npud to adopt)"
                 if detach else "")


def refuse_if_serving(path: Path) -> None:
    """Binding would silently steal the socket of a live npud: refuse instead, naming its
    pid (`npu serve` asks before it logs or starts anything: a second one printed its
    protection line and 'npud stopped' first)."""
    import socket

    from npumanager.wire.unix import peer_credentials

    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
        pid = peer_credentials(probe).pid
    except OSError:
        return  # a stale socket file: replacing it is right
    finally:
        probe.close()
    raise ServiceError(f"another npud (pid {pid}) is already serving {path}; stop it first, "
                       f"or give this one another --runtime-dir")


def device_dict(d: DeviceInfo, down_reason: str | None = None,
                hosts: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {
        "name": d.name, "version": d.version, "backend": d.backend,
        "socket_path": d.socket_path, "channels": d.channels, "memory_bytes": d.memory_bytes,
        "available": d.available, "model_cache_files": d.model_cache_files,
        "data_cache_files": d.data_cache_files, "device_number": d.device_number,
    }
    if down_reason and not d.available:
        out["down_reason"] = down_reason
    if hosts:
        out["hosts"] = hosts  # its host processes' pids: main, and a background lane's
    return out


def to_json(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, sort_keys=False)


def _json_default(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if hasattr(o, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(o)
    return str(o)
