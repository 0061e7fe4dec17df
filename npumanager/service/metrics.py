"""Prometheus metrics of npud (`npu serve --metrics HOST:PORT`, ``[metrics] listen``).

Counters and histograms are fed by :class:`MetricsObserver` from what npud
decided and carried out (the instructions of each event) and from what the
drivers reported (HAL work events, cache results): the pure ``ManagerState``
knows nothing about metrics. Gauges (requests per state, budget, thermal,
drivers up) are read from npud at scrape time, on npud's event loop, so a scrape
never sees a half-applied event.

npud keeps one budget per device: ``npu_budget_used`` and ``npu_budget_max``
carry one sample per device (``device`` label: its ``nn.devices()`` name); the
request counts carry the first device's label. Names are listed in API.md
("Operations").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from npumanager.constants import LoadStatus, RequestStatus, UnloadReason
from npumanager.errors import InvalidArgument
from npumanager.hal.types import EndReason
from npumanager.service import events as ev
from npumanager.service.observe import DaemonObserver

if TYPE_CHECKING:
    from npumanager.hal.types import WorkInfo
    from npumanager.service.daemon import Daemon

log = logging.getLogger("npumanager.npud")

#: API.md's request states, from the state's counts (pending and queued are waiting too).
REQUEST_STATES = {"waiting": ("pending", "queued", "waiting"), "granted": ("granted",),
                  "loaded": ("loaded",), "unload_requested": ("unload_requested",)}
COMPLETED = {RequestStatus.CANCELLED: "cancelled", RequestStatus.COMPLETE: "complete",
             RequestStatus.REVOKED: "revoked"}
#: Why a request ended without a status (``npu_requests_dropped_total``'s ``reason``).
DROPPED = ("client_gone", "malformed", "invalid", "over_limit", "error")
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
WORK_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; ``:PORT`` = all interfaces; port 0 = any
    free port, named in npud's ready line)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidArgument(f"metrics listen address {text!r} is not HOST:PORT "
                              f"(e.g. 127.0.0.1:9464)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class MetricsObserver(DaemonObserver):
    """Feeds the counters and histograms; :class:`_Gauges` reads the rest at scrape time."""

    def __init__(self, device: str, registry: CollectorRegistry | None = None) -> None:
        self.device = device
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.grants = Counter("npu_grants", "Grants issued (CAN_LOAD_NOW).", ["device"],
                              registry=r)
        self.unloads = Counter("npu_unload_requests", "Unload requests sent to holders.",
                               ["device", "reason"], registry=r)
        self.completed = Counter("npu_requests_completed", "Requests that ended.",
                                 ["device", "status"], registry=r)
        self.dropped = Counter(
            "npu_requests_dropped", "Requests dropped before npud decided their end: the "
            "client left (client_gone), or npud refused the load request (malformed, "
            "invalid, over_limit, error).", ["device", "reason"], registry=r)
        self.grant_latency = Histogram(
            "npu_grant_latency_seconds", "From a load request to its CAN_LOAD_NOW.",
            buckets=LATENCY_BUCKETS, registry=r)
        self.work = Counter("npu_work", "Bursts of work that ended on a device (HAL "
                            "on_work_ended).", ["device", "end_reason"], registry=r)
        self.work_seconds = Histogram(
            "npu_work_seconds", "Length of a burst of work on a device (HAL on_work_started "
            "to on_work_ended).", ["device"], buckets=WORK_BUCKETS, registry=r)
        self.cache_loads = Counter(
            "npu_cache_loads", "Compilation cache loads: hit, miss (compiled and cached), "
            "rejected (failed verification), fleet (a local miss loaded from the fleet tier).",
            ["driver", "result"], registry=r)
        # Start a zero for every label value a dashboard expects, so rates exist at once.
        self.grants.labels(device)
        for status in COMPLETED.values():
            self.completed.labels(device, status)
        for reason in UnloadReason:
            self.unloads.labels(device, reason.name.lower())
        for why in DROPPED:
            self.dropped.labels(device, why)
        self.daemon: Daemon | None = None
        self._asked: dict[tuple[int, int], float] = {}
        self._started: dict[tuple[str, int], float] = {}
        self._runners = {ev.SendCanLoad: self._can_load, ev.AskUnload: self._ask_unload,
                         ev.RequestEnded: self._ended, ev.RequestDropped: self._dropped}

    # --- DaemonObserver ------------------------------------------------------------

    def attach(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.registry.register(_Gauges(self))

    def on_event(self, event: ev.Event, instructions: list[ev.Instruction]) -> None:
        if isinstance(event, ev.RequestLoad):
            self._asked[(event.uid, event.request_id)] = event.now
        for ins in instructions:
            run = self._runners.get(type(ins))
            if run is not None:
                run(ins, event.now)

    def _can_load(self, ins: Any, now: float) -> None:
        if ins.status == LoadStatus.CAN_LOAD_NOW:
            self.grants.labels(self.device).inc()
            t0 = self._asked.pop((ins.uid, ins.request_id), None)
            if t0 is not None:
                self.grant_latency.observe(max(0.0, now - t0))

    def _ask_unload(self, ins: Any, now: float) -> None:
        self.unloads.labels(self.device, UnloadReason(ins.reason).name.lower()).inc()

    def _ended(self, ins: Any, now: float) -> None:
        # At the decision, not at the answer: a SendComplete deferred until the driver's
        # ack (service/ending.py) may never go out, its client gone by then.
        self._asked.pop((ins.uid, ins.request_id), None)
        status = COMPLETED.get(RequestStatus(ins.status), str(int(ins.status)))
        self.completed.labels(self.device, status).inc()

    def _dropped(self, ins: Any, now: float) -> None:
        self._asked.pop((ins.uid, ins.request_id), None)  # never granted: no latency
        self.dropped.labels(self.device, "client_gone").inc()

    def on_request_refused(self, reason: str) -> None:
        self.dropped.labels(self.device, reason).inc()

    def on_work_started(self, driver: str, info: WorkInfo) -> None:
        if self.daemon is not None:
            self._started[(driver, info.uid)] = self.daemon.clock.now()

    def on_work_ended(self, driver: str, info: WorkInfo, reason: EndReason) -> None:
        try:
            name = EndReason(reason).name.lower()
        except ValueError:
            name = str(int(reason))
        self.work.labels(driver, name).inc()
        t0 = self._started.pop((driver, info.uid), None)
        if t0 is not None and self.daemon is not None:
            self.work_seconds.labels(driver).observe(max(0.0, self.daemon.clock.now() - t0))

    def on_cache_result(self, driver: str, result: str) -> None:
        self.cache_loads.labels(driver, result).inc()

    # --- scrape-time values (on npud's loop) -------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        d = self.daemon
        assert d is not None
        dump = d.state.dump(d.clock.now())
        counts = dump.get("counts") or {}
        budget = dump.get("budget") or {}
        thermal = d.thermal_info()
        headroom = thermal.get("headroom")
        cap = budget.get("thermal_scaled")
        budgets = {str(b.get("device")): (
            float(b.get("used") or 0),
            float(b["thermal_scaled"] if b.get("thermal_scaled") is not None
                  else b.get("total") or 0)) for b in dump.get("budgets") or []}
        return {
            "budgets": budgets,
            "requests": {k: sum(int(counts.get(c, 0)) for c in parts)
                         for k, parts in REQUEST_STATES.items()},
            "budget_used": float(budget.get("used") or 0),
            "budget_max": float(cap if cap is not None else budget.get("total") or 0),
            "thermal_status": float(thermal.get("status_value",
                                                _status_value(thermal.get("status")))),
            "thermal_headroom": float("nan") if headroom is None else float(headroom),
            "drivers": {**{x.name: bool(x.available) for x in d.drivers.devices()},
                        **_lanes(d)},
            "grant_moves": dict(getattr(d.drivers, "device_moves", None) or {}),
        }


def _lanes(d: Any) -> dict[str, bool]:
    """Each background lane's host (service/host_lanes.py) as ``NAME.background``: a
    device's second host process, up or not (the device's own row is its main host's)."""
    hosts = getattr(d.drivers, "host_pids", None)
    if not callable(hosts):
        return {}
    return {f"{name}.background": bool(h["background"]["up"])
            for name, h in hosts().items() if "background" in h}


def _status_value(name: Any) -> int:
    from npumanager.constants import ThermalStatus

    try:
        return int(ThermalStatus[str(name)])
    except KeyError:
        return 0


class _Gauges:
    """A custom collector: gauges read from npud on its own loop at scrape time."""

    def __init__(self, obs: MetricsObserver) -> None:
        self.obs = obs
        assert obs.daemon is not None
        self.loop = asyncio.get_running_loop()

    def describe(self) -> list[Any]:
        return []  # no values read at registration time

    def _read(self) -> dict[str, Any] | None:
        if self._on_loop():  # scraped from npud's own loop (in-process tests)
            return self.obs.snapshot()
        fut: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(self.obs.snapshot())
            except Exception as exc:
                fut.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(run)
            return fut.result(timeout=5.0)
        except Exception:
            log.exception("metrics: reading npud's state failed")
            return None

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def collect(self) -> Iterator[Metric]:
        snap = self._read()
        if snap is None:
            return
        dev = self.obs.device
        g = GaugeMetricFamily("npu_requests", "Live requests by state.",
                              labels=["device", "state"])
        for state, n in snap["requests"].items():
            g.add_metric([dev, state], n)
        yield g
        # One budget per device; a state with none reported yet shows the first's.
        budgets = snap["budgets"] or {dev: (snap["budget_used"], snap["budget_max"])}
        g = GaugeMetricFamily("npu_budget_used", "Budget held by granted and loaded "
                              "requests.", labels=["device"])
        for name, (used, _) in budgets.items():
            g.add_metric([name], used)
        yield g
        g = GaugeMetricFamily("npu_budget_max", "The budget, after thermal scaling.",
                              labels=["device"])
        for name, (_, top) in budgets.items():
            g.add_metric([name], top)
        yield g
        yield GaugeMetricFamily("npu_thermal_status", "Thermal status, 0 NONE .. 6 SHUTDOWN.",
                                value=snap["thermal_status"])
        yield GaugeMetricFamily("npu_thermal_headroom", "Thermal headroom (1.0 = SEVERE).",
                                value=snap["thermal_headroom"])
        g = GaugeMetricFamily("npu_driver_up", "1 while the driver host is up.",
                              labels=["driver"])
        for name, up in snap["drivers"].items():
            g.add_metric([name], 1.0 if up else 0.0)
        yield g
        # Counted by DriverFeed, where the moves are decided (service/grant_moves.py): a
        # counter read at scrape time, like the gauges.
        c = CounterMetricFamily("npu_grant_moves", "Live grants moved to the other host of "
                                "their device as their uid's class changed.",
                                labels=["device"])
        for name, n in snap["grant_moves"].items():
            c.add_metric([name], n)
        yield c


class MetricsServer(DaemonObserver):
    """The HTTP endpoint: started when npud is ready, stopped when npud stops."""

    def __init__(self, obs: MetricsObserver, host: str, port: int) -> None:
        self.obs = obs
        self.host = host
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def attach(self, daemon: Daemon) -> None:
        # Before npud is ready. `npu serve` checked the address; one taken since is logged
        # in a line and npud serves on without the endpoint (its ready line says none).
        try:
            self.start()
        except OSError as exc:
            log.error("metrics: cannot listen on %s:%d (%s); serving without metrics",
                      self.host, self.port, exc.strerror or exc)

    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(self.port, self.host,
                                                       registry=self.obs.registry)
        self.port = int(self._server.server_address[1])
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def metrics_observers(listen: str, device: str) -> list[DaemonObserver]:
    """The observers `npu serve` installs for ``--metrics``/``[metrics] listen``."""
    host, port = parse_listen(listen)
    obs = MetricsObserver(device)
    return [obs, MetricsServer(obs, host, port)]
