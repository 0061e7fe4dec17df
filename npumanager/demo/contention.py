"""Foreground protection, measured against running unmanaged (bench/contention.py).

The same apps (:mod:`.contention_apps`: a 30 fps camera, a voice assistant's
short bursts, a background LLM decode loop, an embedder's batches, and an app
that keeps loading a background model) run as separate processes twice in one
invocation: *unmanaged*, each with ONNX Runtime in its own process and default
settings, and *managed*, through a real npud and the reference driver in a
temporary runtime dir. Each run has three phases:

1. ``alone``: the camera by itself (the 1.3x target's reference);
2. ``contended``: camera + voice + LLM + embedder;
3. ``loading``: the same, while a background model is loaded again and again
   (camera frames that end during a load count for this phase).

Managed runs can be repeated with other driver settings (``variants``): the
ablation rows of the issue. Peak memory: :mod:`.contention_memory`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from npumanager.constants import Importance, ModelPriority, ModelSize
from npumanager.demo import contention_cpu, contention_probe, contention_verdict
from npumanager.demo.contention_apps import BenchApp, bench_app_main
from npumanager.demo.contention_memory import MemorySampler, descendants
from npumanager.demo.models import DemoModel, demo_models
from npumanager.demo.observe import AppFailed, Event, EventLog
from npumanager.demo.process import AppProcess, LineQueue, Outbox, signals_held
from npumanager.drivers import device_queue
from npumanager.words import plural

#: uids of the apps when run as root (npud tells apps apart by uid).
UIDS = {"camera": 62001, "voice": 62002, "llm": 62003, "embedder": 62004, "loader": 62005}
FRAME_BUDGET_MS = 1000 / 30


def bench_apps() -> dict[str, BenchApp]:
    """The apps; effective priorities in the driver: camera 100, voice 200, embedder
    300 + 100, LLM 300 + 100 (importance + job priority)."""
    bg = ModelPriority.BACKGROUND
    return {
        "camera": BenchApp("camera", "camera", "frames", Importance.FOREGROUND,
                           period_s=1 / 30),
        "voice": BenchApp("voice", "voice", "bursts", Importance.VISIBLE, runs=8, gap_s=0.03,
                          period_s=0.7),
        "llm": BenchApp("llm", "llm", "decode", Importance.SERVICE, bg,
                        ModelSize.BETWEEN_1GB_AND_2GB, job_priority=100, steps=16),
        "embedder": BenchApp("embedder", "embedder", "batches", Importance.SERVICE, bg,
                             job_priority=100),
        "loader": BenchApp("loader", "llm", "loads", Importance.SERVICE, bg,
                           ModelSize.BETWEEN_1GB_AND_2GB, job_priority=100),
    }


@dataclass(frozen=True)
class Timing:
    """Phase lengths. A full run's contended phase is 30 s (900 frames: its p99 is the
    9th-worst frame): at 12 s (360 frames, the 4th-worst) the p99 of the same code
    moved 2x between runs."""

    alone_s: float = 10.0
    contended_s: float = 30.0
    loading_s: float = 15.0
    settle_s: float = 1.0

    @classmethod
    def quick(cls) -> Timing:
        return cls(3.0, 6.0, 5.0, 0.6)


@dataclass
class Stats:
    """Latencies (ms) of one app in one phase."""

    ms: list[float] = field(default_factory=list)

    def pct(self, q: float) -> float:
        s = sorted(self.ms)
        return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")

    @property
    def max(self) -> float:
        return max(self.ms) if self.ms else float("nan")

    def over(self, limit_ms: float) -> int:
        return sum(1 for x in self.ms if x > limit_ms)


@dataclass
class RunResult:
    """What one run (unmanaged, or managed with one driver config) measured."""

    name: str
    camera: dict[str, Stats] = field(default_factory=dict)  # by phase
    voice: Stats = field(default_factory=Stats)  # contended + loading
    llm_tokens_s: float = float("nan")  # contended phase
    embedder_items_s: float = float("nan")
    #: The same two rates over the loading phase: what a background model's load takes
    #: from the other background apps (its CPU comes from theirs).
    llm_tokens_s_loading: float = float("nan")
    embedder_items_s_loading: float = float("nan")
    #: The embedder's batches in the contended phase, ms each (its round trip included).
    embedder_batch: Stats = field(default_factory=Stats)
    loads: Stats = field(default_factory=Stats)
    #: Where in its load each of the loading phase's slowest 5 % of frames ended: the
    #: fraction of the load's time gone (0: the app asked npud, 1: it was loaded), to
    #: tell the load's stages apart (grant, compile, the host loading the result).
    load_pos: list[float] = field(default_factory=list)
    #: Work done over the whole run (decode jobs, embedder batches), in or out of windows.
    work_done: dict[str, int] = field(default_factory=dict)
    #: The embedder's executions in flight at once (threads that delivered batches, or
    #: its pipeline's depth).
    streams: int = 0
    mem_peak_mib: float = float("nan")  # whole machine, above the idle level before the run
    rss_peak_mib: float = float("nan")  # the processes this run started, summed
    #: The slowest 5 % of the camera's frames per phase: (seconds into the phase, ms), to
    #: see whether a p99 was a few bad moments or a steady tail, and to pool runs (the
    #: p99 of up to five runs' frames together lies among them).
    worst: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: CPU in each phase: this run's processes, everyone else's, the hypervisor's steal.
    cpu: dict[str, contention_cpu.CpuUse] = field(default_factory=dict)
    #: Per phase: cores per app process, npud, driver host, other (.contention_probe).
    cpu_roles: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Per phase: cores per driver-host thread group (kernel names; managed runs).
    host_threads: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Contended phase, managed runs with the probe: device use per app.
    device: dict[str, contention_probe.DeviceUse] = field(default_factory=dict)
    #: Its driver's device.stats at the contended phase's end (bursts' recent requests).
    device_stats: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


# --- one run ----------------------------------------------------------------------------


def driver_config(**knobs: Any) -> dict[str, Any]:
    """npud's config for a managed run: one reference driver with npud's defaults but for
    ``knobs`` ([[driver]] keys), a budget that fits every app (this measures scheduling,
    not admission), no thermal sources (the driver's thermal model would heat up and send
    the background away mid-run)."""
    options = knobs.pop("options", {})
    return {
        "manager": {"unload_deadline_s": 5.0, "log_level": "warning"},
        "policy": {"max_budget": 64},
        "thermal": {"sources": []},
        "driver": [{"name": "reference", "plugin": "reference", **knobs, "options": options}],
    }


class ContentionRun:
    def __init__(self, name: str, managed: bool, timing: Timing,
                 models: dict[str, DemoModel], config: dict[str, Any] | None = None,
                 phases: tuple[str, ...] = ("alone", "contended", "loading"),
                 log: Any = None, bursts: bool = True, batch_bursts: bool = True,
                 embedder_inflight: int = 1, device_probe: bool = False,
                 app_knobs: dict[str, dict[str, Any]] | None = None,
                 device_queue: bool = False,
                 ort_config: dict[str, str] | None = None,
                 devices: dict[str, str] | None = None,
                 protect_foreground: str | None = "off") -> None:
        self.name = name
        #: npud's `--protect-foreground` (service/protection.py): "off" by default, so a
        #: row runs the keys it sets and nothing more; None: the product default ("auto").
        self.protect_foreground = protect_foreground
        #: Managed, app -> the device (``[[driver]]`` name) it uses instead of the first:
        #: apps put on a driver host of their own (bench rows loader-own-host, bg-own-host).
        self.devices = (devices or {}) if managed else {}
        #: Unmanaged apps' ONNX Runtime session config entries (default settings: none).
        self.ort_config = {} if managed else dict(ort_config or {})
        #: The one-queue device model (drivers/device_queue.py): one token for the whole
        #: run, held around every native run, by each unmanaged app's ONNX Runtime or by
        #: the managed run's driver (its ``device_queue_lock``); "" when not modelled.
        self.device_queue = device_queue
        self.queue_path = ""
        #: Per app, BenchApp fields to change in this run (e.g. the camera's burst spin,
        #: ``{"camera": {"spin_us": 1000}}``, which only a managed app uses; its thread's
        #: slice, ``slice_us``, both).
        self.app_knobs = app_knobs or {}
        #: Poll the driver's step records during the contended phase (device time per
        #: app; .contention_probe): off by default, since the polls cost the host a little.
        self.device_probe = device_probe and managed
        self.poller: contention_probe.TracePoller | None = None
        self.daemon_pid: int | None = None
        self.cpu_roles: dict[str, dict[str, float]] = {}
        self.host_threads: dict[str, dict[str, float]] = {}
        #: The managed embedder's executions in flight at once (BenchApp.inflight: above
        #: one, through the SDK's pipeline; bench row embedder-pipeline); unmanaged, the
        #: embedder is one loop of session.run (ONNX Runtime's own two intra-op threads
        #: per run).
        self.embedder_inflight = embedder_inflight if managed else 1
        #: Managed camera and voice execute through bursts (model.burst()).
        self.bursts = bursts
        #: The managed embedder's batches too (one burst instead of an RPC a batch), as an
        #: app would write a loop of executions with the SDK. Off, before bursts got
        #: cheaper (510c360), it measured no clear gain (3088 vs 2645, 3372 vs 2759, 2707
        #: vs 2833 items/s); now the embedder with the LLM decoding, same npud, 4 s each:
        #: 4076 items/s through a burst vs 2906 an RPC a batch (alone 7124 vs 4736).
        self.batch_bursts = batch_bursts
        self.managed = managed
        self.timing = timing
        self.models = models
        self.config = config or driver_config()
        self.phases = phases
        self.root = os.getuid() == 0
        self.apps = bench_apps()
        # An app that cannot connect ends the run's waits at once (AppFailed): without it,
        # each later wait ran out its 60 s and `npu demo --compare` ended in a traceback.
        self.events = EventLog(stop_on_failure=True)
        self.procs: dict[str, AppProcess] = {}
        self.windows: dict[str, tuple[float, float]] = {}
        self.cpu: dict[str, contention_cpu.CpuUse] = {}
        self.rt = ""
        self.tmp: list[str] = []
        self.say = log or (lambda msg: None)

    # --- processes ---------------------------------------------------------------

    def uid(self, name: str) -> int | None:
        return UIDS[name] if self.root else None

    def spawn(self, name: str) -> None:
        from dataclasses import replace

        app = self.apps[name]
        if name == "embedder" and self.embedder_inflight != 1:
            app = replace(app, inflight=self.embedder_inflight)
        if name in self.app_knobs:
            app = replace(app, **self.app_knobs[name])
        if name in self.devices:
            app = replace(app, device=self.devices[name])
        if not self.root:
            # One uid for every app: job priorities alone order the work in the driver.
            offset = {"camera": 0, "voice": 100, "embedder": 300, "llm": 300, "loader": 300}
            app = replace(app, job_priority=offset[name] + app.job_priority)
        model, managed, rt, bursts = self.models[app.model], self.managed, self.rt, self.bursts
        first_id = 1 + 100 * list(UIDS).index(name)
        kinds = ("frames", "bursts", "batches") if self.batch_bursts else ("frames", "bursts")

        queue, ort_config = ("", None) if managed else (self.queue_path, self.ort_config)

        def main(out: Outbox, commands: LineQueue) -> None:
            bench_app_main(app, model, managed, rt, first_id, out, commands, bursts, kinds,
                           queue, ort_config)

        log_path = os.path.join(self.tmp[0], f"{name}.log")
        with signals_held():  # a Ctrl-C now is taken once the app is on the list
            self.procs[name] = AppProcess(name, self.uid(name), main, self.events.add,
                                          log_path)

    def asks_realtime(self, app: str) -> int:
        """The SCHED_FIFO priority ``app`` runs its executing thread at (0: none)."""
        return int(self.app_knobs.get(app, {}).get("realtime", 0))

    def camera_realtime(self, after: bool = False) -> None:
        """The camera's frame thread at SCHED_FIFO (its ``realtime`` knob), once it runs:
        unmanaged, the bench sets it on the app's frame thread (its main thread) as root
        would by hand; managed, the app asked npud for it (model.burst(realtime=True)),
        and what npud granted is said (``after``: at the run's end, what the watchdog
        demoted)."""
        prio = self.asks_realtime("camera")
        if not prio or (after and not self.managed):
            return
        if not self.managed and not after:
            from npumanager.hal.rt_sched import set_fifo

            pid = self.procs["camera"].pid
            got = set_fifo(pid, prio, tgid=pid)
            self.say(f"{self.name}: camera frame thread {pid} at SCHED_FIFO {prio}: "
                     f"{'ok' if got.ok else got.why}")
            return
        self.say_grants(protection=not after)

    def say_grants(self, protection: bool = False) -> None:
        """What npud granted the apps that asked for a real-time thread, by app where
        each app has its own uid (as root), and what its watchdog demoted."""
        from npumanager.client import NpuManager

        with NpuManager(self.rt, client_name="bench") as m:
            dump = m.dump()
        rt = dump.get("realtime", {})
        mode = (dump.get("daemon") or {}).get("protection")
        demoted = ", ".join(f"{n} ({why})" for why, n in
                            sorted((rt.get("demoted_total") or {}).items())) or "none"
        granted = rt.get("granted") or []
        apps = {uid: app for app, uid in UIDS.items()} if self.root else {}
        whose = sorted({apps.get(g.get("uid"), "") for g in granted} - {""})
        self.say(f"{self.name}: npud granted SCHED_FIFO {rt.get('priority')} to "
                 f"{plural(len(granted), 'thread')}" + (f" ({', '.join(whose)})" if whose else "")
                 + f", demoted {demoted}" + (f"; {mode}" if mode and protection else ""))

    def wait_for(self, name: str, ev: str, after: float, timeout: float = 60.0) -> Event:
        got = self.events.wait(name, ev, timeout, after)
        if got is None:
            errors = self.events.find(name, "error")
            raise RuntimeError(f"{self.name}: {name} did not report {ev!r} within {timeout:g} s"
                               + (f": {errors[-1]['error']}" if errors else ""))
        return got

    @contextlib.contextmanager
    def npud(self) -> Iterator[None]:
        if not self.managed:
            yield
            return
        from npumanager.client import NpuManager
        from npumanager.testing.daemon import DaemonProcess

        state = tempfile.mkdtemp(prefix="npu-contention-state-")
        self.tmp.append(state)
        daemon = DaemonProcess(self.rt, self.config, drivers=True,
                               env={**os.environ, "NPU_STATE_DIR": state},
                               protect_foreground=self.protect_foreground)
        daemon.start()
        self.daemon_pid = daemon.pid
        try:
            admin = NpuManager(self.rt, client_name="contention-admin")
            try:
                if self.root:
                    for name, app in self.apps.items():
                        admin.set_uid_importance(UIDS[name], app.importance)
                else:
                    admin.set_uid_importance(os.getuid(), Importance.FOREGROUND)
            finally:
                admin.close()
            yield
        finally:
            daemon.stop()

    def phase(self, name: str, seconds: float) -> None:
        if name in self.phases:
            me = os.getpid()
            threads = contention_probe.HostThreads(self.rt if self.managed else "")
            a = contention_cpu.mark(descendants(me))
            t0 = time.monotonic()
            time.sleep(seconds)
            t1 = time.monotonic()
            kids = descendants(me)
            b = contention_cpu.mark(kids)
            self.cpu[name] = contention_cpu.between(a, b, t1 - t0)
            roles = contention_probe.roles_of({n: p.pid for n, p in self.procs.items()},
                                              self.daemon_pid, threads.hosts, kids,
                                              threads.names)
            self.cpu_roles[name] = contention_probe.cpu_by_role(a, b, roles, t1 - t0)
            self.host_threads[name] = threads.between(t1 - t0)
            if name == "contended" and self.poller is not None:
                self.poller.snapshot_stats()
            self.windows[name] = (t0, t1)

    def run(self) -> RunResult:
        self.tmp.append(tempfile.mkdtemp(prefix="npu-contention-"))
        os.chmod(self.tmp[0], 0o755)
        self.rt = os.path.join(self.tmp[0], "run")
        os.mkdir(self.rt, 0o755)
        if self.device_queue:
            self.queue_path = os.path.join(self.tmp[0], "device-queue")
            device_queue.create(self.queue_path)  # every app's uid and the driver's take it
            for d in self.config.get("driver", []):
                d["options"] = {**d.get("options", {}), "device_queue_lock": self.queue_path}
        mem = MemorySampler()
        result = RunResult(self.name)
        t = self.timing
        try:
            with self.npud():
                t0 = time.monotonic()
                self.spawn("camera")
                self.wait_for("camera", "frame", t0)
                self.camera_realtime()
                time.sleep(t.settle_s)  # a new session's first runs warm up
                self.phase("alone", t.alone_s)
                self.say(f"{self.name}: camera alone measured; background apps start")
                t0 = time.monotonic()
                for name in ("llm", "embedder", "voice"):
                    self.spawn(name)
                self.wait_for("llm", "decode", t0)
                self.wait_for("embedder", "batch", t0)
                self.wait_for("voice", "infer", t0)
                if self.managed and self.asks_realtime("voice"):
                    self.say_grants()  # (the voice asked at its first burst)
                time.sleep(t.settle_s)
                if self.device_probe:
                    self.poller = contention_probe.TracePoller(
                        contention_probe.driver_socket(self.rt))
                self.phase("contended", t.contended_s)
                if self.poller is not None:
                    self.poller.stop()
                if "loading" in self.phases:
                    self.say(f"{self.name}: a background model is being loaded")
                    t0 = time.monotonic()
                    self.spawn("loader")
                    self.wait_for("loader", "loading", t0)
                    self.phase("loading", t.loading_s)
                self.camera_realtime(after=True)
                self.stop_apps()
        finally:
            result.mem_peak_mib, result.rss_peak_mib = mem.stop()
            self.stop_apps()
            for d in self.tmp:
                shutil.rmtree(d, ignore_errors=True)
        self.collect(result)
        return result

    def stop_apps(self) -> None:
        for proc in self.procs.values():
            proc.send("stop")
        for proc in self.procs.values():
            proc.stop(timeout=5.0)
        self.procs.clear()

    # --- results -------------------------------------------------------------------

    def collect(self, r: RunResult) -> None:
        ev = self.events
        r.errors = [f"{e['app']}: {e['what']}: {e['error']}" for e in ev.find(ev="error")]
        r.cpu = dict(self.cpu)
        r.cpu_roles, r.host_threads = dict(self.cpu_roles), dict(self.host_threads)
        if self.poller is not None and "contended" in self.windows:
            names = {uid: n for n, uid in UIDS.items()} if self.root else {}
            r.device = self.poller.use(*self.windows["contended"], names, self.poller.stats)
            r.device_stats = self.poller.stats
            if self.poller.error:
                r.errors.append(f"probe: {self.poller.error}")
        frames = ev.find("camera", "frame")
        r.work_done = {"decode": len(ev.find("llm", "decode")),
                       "batch": len(ev.find("embedder", "batch"))}
        batches = ev.find("embedder", "batch")
        r.streams = max([len({e.get("stream", 0) for e in batches}),
                         *[int(e.get("inflight", 1)) for e in batches]])
        for name in ("alone", "contended"):
            if name in self.windows:
                a, b = self.windows[name]
                r.camera[name] = Stats([e["ms"] for e in frames if a <= e["t"] < b])
                mine = sorted(((e["t"] - a, e["ms"]) for e in frames if a <= e["t"] < b),
                              key=lambda x: -x[1])
                r.worst[name] = [(round(t, 3), ms) for t, ms in mine[:max(1, len(mine) // 20)]]
        if "loading" in self.windows:
            a, b = self.windows["loading"]
            spans = []
            start: float | None = None
            for e in ev.find("loader"):
                if e["ev"] == "loading":
                    start = e["t"]
                elif e["ev"] == "loaded" and start is not None:
                    spans.append((start, e["t"]))
                    r.loads.ms.append(e["ms"])
                    start = None
            if start is not None:
                spans.append((start, b))
            # A frame that ended while a load was under way (or within one frame of its
            # start) suffered it.
            during = [(e["ms"], e["t"], [(s, f) for s, f in spans
                                         if s <= e["t"] <= f + FRAME_BUDGET_MS / 1000])
                      for e in frames if a <= e["t"] < b]
            during = [d for d in during if d[2]]
            r.camera["loading"] = Stats([ms for ms, _, _ in during])
            during.sort(key=lambda d: -d[0])
            r.load_pos = [round(min(1.0, (t - s) / max(f - s, 1e-9)), 3)
                          for _, t, ((s, f), *_) in during[:max(1, len(during) // 20)]]
        if "contended" in self.windows:
            a, b = self.windows["contended"]
            steps = sum(e["steps"] for e in ev.find("llm", "decode") if a <= e["t"] < b)
            items = sum(e["items"] for e in ev.find("embedder", "batch") if a <= e["t"] < b)
            r.llm_tokens_s = steps / (b - a)
            r.embedder_items_s = items / (b - a)
            r.embedder_batch = Stats([e["ms"] for e in ev.find("embedder", "batch")
                                      if a <= e["t"] < b])
            lo, hi = a, self.windows.get("loading", (a, b))[1]
            r.voice = Stats([e["ms"] for e in ev.find("voice", "infer") if lo <= e["t"] < hi])
        if "loading" in self.windows:
            a, b = self.windows["loading"]
            r.llm_tokens_s_loading = sum(e["steps"] for e in ev.find("llm", "decode")
                                         if a <= e["t"] < b) / (b - a)
            r.embedder_items_s_loading = sum(e["items"] for e in ev.find("embedder", "batch")
                                             if a <= e["t"] < b) / (b - a)


# --- the table ----------------------------------------------------------------------------


def _f(x: float, digits: int = 1) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def camera_cell(s: Stats | None) -> str:
    if s is None or not s.ms:
        return "-"
    return (f"{_f(s.pct(0.5))} / {_f(s.pct(0.99))} / {_f(s.max)} ms, "
            f"{s.over(FRAME_BUDGET_MS)}/{len(s.ms)} late")


def side_by_side(results: list[RunResult]) -> list[tuple[str, ...]]:
    """Rows: what, then one cell per run."""
    rows: list[tuple[str, ...]] = [("", *[r.name for r in results])]
    for phase, label in (("alone", "camera alone p50/p99/max, >33 ms"),
                         ("contended", "camera + voice + LLM + embedder"),
                         ("loading", "camera while a bg model loads")):
        rows.append((label, *[camera_cell(r.camera.get(phase)) for r in results]))
    base = results[0].camera.get("alone")
    for phase in ("contended", "loading"):
        cells = []
        for r in results:
            own = r.camera.get("alone") or base
            s = r.camera.get(phase)
            cells.append("-" if s is None or own is None or not s.ms
                         else f"{s.pct(0.99) / own.pct(0.99):.2f}x")
        rows.append((f"camera p99 {phase} / alone (same run)", *cells))
    rows += [
        ("voice p50/p99 (ms)", *[f"{_f(r.voice.pct(0.5))} / {_f(r.voice.pct(0.99))}"
                                 for r in results]),
        ("LLM tokens/s (contended)", *[_f(r.llm_tokens_s, 0) for r in results]),
        ("embedder items/s (contended)", *[_f(r.embedder_items_s, 0) for r in results]),
        ("embedder batch p50/p90 (ms)", *[f"{_f(r.embedder_batch.pct(0.5), 2)} / "
                                          f"{_f(r.embedder_batch.pct(0.9), 2)}"
                                          for r in results]),
        ("worst 5 % loading frames by fifth of a load",
         *[" ".join(str(sum(1 for x in r.load_pos if i <= x * 5 < i + 1 or (i == 4 and x >= 1)))
                    for i in range(5)) for r in results]),
        ("bg model load p50 (ms)", *[_f(r.loads.pct(0.5), 0) for r in results]),
        ("LLM tokens/s / embedder items/s (loading)",
         *[f"{_f(r.llm_tokens_s_loading, 0)} / {_f(r.embedder_items_s_loading, 0)}"
           for r in results]),
        ("peak memory, machine (MiB over idle)", *[_f(r.mem_peak_mib, 0) for r in results]),
        ("peak RSS of the run's processes (MiB)", *[_f(r.rss_peak_mib, 0) for r in results]),
    ]
    for phase in ("alone", "contended", "loading"):
        rows.append((f"CPU {phase}: run / foreign / steal (cores)",
                     *[r.cpu[phase].cell() if phase in r.cpu else "-" for r in results]))
    rows += contention_probe.rows(results)
    return rows


def summary(r: RunResult) -> dict[str, Any]:
    """One run's numbers as plain data (bench/contention.py --json)."""
    def stats(s: Stats) -> dict[str, float]:
        return {"p50": s.pct(0.5), "p99": s.pct(0.99), "max": s.max, "n": len(s.ms)}

    return {"name": r.name, "camera": {k: stats(v) for k, v in r.camera.items()},
            "voice": stats(r.voice), "llm_tokens_s": r.llm_tokens_s,
            "embedder_items_s": r.embedder_items_s, "load_p50_ms": r.loads.pct(0.5),
            "llm_tokens_s_loading": r.llm_tokens_s_loading,
            "embedder_items_s_loading": r.embedder_items_s_loading,
            "embedder_batch": stats(r.embedder_batch), "load_pos": r.load_pos,
            "mem_peak_mib": r.mem_peak_mib, "rss_peak_mib": r.rss_peak_mib,
            "cpu": {k: vars(v) for k, v in r.cpu.items()}, "worst": r.worst,
            "cpu_roles": r.cpu_roles, "host_threads": r.host_threads,
            "device": {k: vars(v) for k, v in r.device.items()},
            "device_stats": r.device_stats,
            "errors": r.errors}


def format_rows(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def verdicts(unmanaged: RunResult, managed: RunResult) -> list[str]:
    """The targets' verdicts on one pair of runs (.contention_verdict)."""
    return contention_verdict.lines(contention_verdict.ratios(unmanaged, managed))


def voice_note(unmanaged: RunResult, managed: RunResult) -> str:
    """The voice assistant's latency managed against unmanaged, for the narration beside
    the camera's verdicts (#15 sets the voice no target)."""
    u, m = unmanaged.voice, managed.voice
    if not u.ms or not m.ms:
        return "voice assistant: not measured in both runs"
    return (f"voice assistant p50 / p99: managed {_f(m.pct(0.5), 2)} / {_f(m.pct(0.99), 2)} "
            f"ms, unmanaged {_f(u.pct(0.5), 2)} / {_f(u.pct(0.99), 2)} ms "
            f"({m.pct(0.5) / u.pct(0.5):.2f}x / {m.pct(0.99) / u.pct(0.99):.2f}x; no target)")


def build_models() -> dict[str, DemoModel]:
    return demo_models()


#: `npu demo --compare`'s managed run: what each app asks of npud, as the bench's
#: `default-auto` row has them (bench/contention.py; tests/demo/test_contention.py holds
#: the two to each other). The camera (FOREGROUND) and the voice assistant (VISIBLE) ask
#: for their executing thread at SCHED_FIFO (model.burst(realtime=True)): foreground
#: protection serves both on a FIFO host thread, and an app thread left at normal
#: priority waits behind it on its CPU (voice29: the voice's p50 / p99 0.8 / 2.5 ms
#: without the ask, 0.5-0.6 / 0.8-1.0 with it). Where protection resolved off, npud
#: refuses the ask, logged once (nn/realtime.py), and the apps go on without.
COMPARE_APP_KNOBS: dict[str, dict[str, Any]] = {"camera": {"realtime": 2},
                                                "voice": {"realtime": 2}}


def compare_runs() -> list[tuple[str, bool, str, dict[str, dict[str, Any]] | None]]:
    """`npu demo --compare`'s two runs: (name, managed, what the scene says, app knobs)."""
    return [
        ("unmanaged", False, "Each app runs ONNX Runtime in its own process with the "
         "default settings and loads whenever it likes, as apps do today.", None),
        ("managed", True, "The same apps ask npud before loading and run on the "
         "reference driver (a real npud in a temporary dir, its defaults: foreground "
         "protection \"auto\", on where npud can put threads at SCHED_FIFO, e.g. as "
         "root). The camera and the voice assistant ask for a real-time thread "
         "(model.burst(realtime=True)), as a camera or audio app would; where npud "
         "cannot give it, they go on without.", COMPARE_APP_KNOBS)]


def run_compare(color: bool | None = None, fast: bool = True) -> int:
    """`npu demo --compare`: the two runs with the demo's renderer; 0 if both ran."""
    from npumanager.demo.render import Renderer

    out = Renderer(color=color)
    out.title("npumanager demo: the same apps unmanaged, then managed",
              "A camera at 30 fps, a voice assistant, a background LLM, an embedder and an app "
              "loading a\nbackground model, each its own process. Every number is measured "
              "in this run.")
    timing = Timing.quick() if fast else Timing()
    models = build_models()
    results = []
    for n, (name, managed, why, knobs) in enumerate(compare_runs(), start=1):
        out.scene(n, 2, f"{name}: camera alone, then with the background apps, then while a "
                  "background model loads", why)
        # Managed as npud runs by default (protect_foreground unset: "auto").
        try:
            results.append(ContentionRun(name, managed, timing, models,
                                         log=lambda m: out.event("demo", m), app_knobs=knobs,
                                         protect_foreground=None).run())
        except (AppFailed, RuntimeError) as exc:  # (the run has stopped what it started)
            print(f"npu demo --compare: the {name} run: {exc}; stopped (nothing it started "
                  "is left running)", file=sys.stderr, flush=True)
            return 1
    rows = side_by_side(results)
    out.table("Camera latency p50 / p99 / max and frames over 33 ms; voice latency; "
              "background throughput", list(rows[0]), [list(r) for r in rows[1:]])
    for line in [*verdicts(results[0], results[1]), voice_note(results[0], results[1])]:
        out.note(line, "")
    errors = [e for r in results for e in r.errors]
    for e in errors:
        out.warn(e)
    return 1 if errors else 0
