"""`npu demo`: a real npud, four apps in their own processes, six scenes, measured.

The scenario starts npud with the reference driver in a temporary runtime
and state dir (or uses a running one with ``--runtime-dir``), forks the apps
(each under its own uid when run as root), and drives the story: a
background LLM holds the budget; the foreground camera arrives and the LLM is
asked to unload (PREEMPTED); the LLM comes back smaller, loads from its
compilation cache and its decode jobs are PAUSED/RESUMED around camera
frames; the device heats (admin thermal override), background models leave
(THERMAL) and a stubborn embedder that ignores the request is REVOKED; it
cools and the waiters come back. Every number printed is measured in this
run. Everything it started is stopped, and its temp dirs removed, on any exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from npumanager.constants import Importance, ThermalStatus
from npumanager.demo import diag
from npumanager.demo.apps import app_main
from npumanager.demo.cast import (
    BACKENDS,
    SCENES,
    DemoOptions,
    Pace,
    Run,
    app_specs,
)
from npumanager.demo.models import DemoModel, demo_models
from npumanager.demo.narrate import Narrator
from npumanager.demo.observe import AppFailed, Event, EventLog, HalObserver
from npumanager.demo.process import AppProcess, signals_held, stop_all
from npumanager.demo.render import Renderer, fmt_ms
from npumanager.demo.summary import print_summary, status_excerpt, write_outputs
from npumanager.paths import MANAGER_SOCKET
from npumanager.words import plural

#: How many times its idle-machine timeout :meth:`Scenario.expect` waits for an event.
PATIENCE = 4.0
#: Seconds after which the scenes wait no more (``--fast``, full): each wait is cut to
#: what is left, so a run where events go missing reports them and ends, its stop (a few
#: seconds at most: STOP_APPS_S, STOP_NPUD_S) included, within ~90 s / ~3 min.
TIME_UP_S = (60.0, 150.0)
#: How long the apps get, together, to stop on their own before they are killed: at the
#: demo's end (they release, report and exit), and when it is interrupted. An app reads
#: its stop between calls: 0.02-0.1 s beside twelve busy loops on the 2 CPUs, unless it is
#: in a prepare (the LLM's compile: 2.7 s there), which an interrupt need not wait for.
STOP_APPS_S = {"end": 3.0, "interrupted": 1.0}
#: npud's and then its driver host's bound, each, from SIGTERM to SIGKILL. Measured
#: beside twelve busy loops: 0.15-0.35 s for both, the host's in-flight compile killed
#: (drivers/compile_worker.py, ``kill``) rather than waited for.
STOP_NPUD_S = 3.0


class CannotUse(Exception):
    """The npud the demo was pointed at (--runtime-dir) cannot host its scenes: said
    before anything else, the demo having started nothing."""


class NotAdmin(CannotUse):
    """The demo's client is not an admin of the npud it was pointed at."""


class Scenario:
    def __init__(self, opts: DemoOptions, out: Renderer) -> None:
        self.opts = opts
        self.out = out
        self.pace = Pace.for_mode(opts.fast)
        self.root = os.getuid() == 0
        self.own_npud = opts.runtime_dir is None
        # An app that cannot connect stops the demo (its scenes would wait for it in vain,
        # a minute and more before the summary said what was wrong).
        self.log = EventLog(stop_on_failure=True)
        self.log.listeners.append(Narrator(out, self.log).show)
        self.run_rec = Run()
        self.hal: HalObserver | None = None
        self._hal_conn: Any = None
        self.npud: Any = None
        self.admin: Any = None
        self.apps: dict[str, AppProcess] = {}
        self.tmp: list[str] = []
        #: On someone else's npud (--runtime-dir): importances as they were before the demo.
        self.saved_importance: dict[int, int] = {}
        self.tracer: Any = None
        self.models: dict[str, DemoModel] = {}
        self.driver = opts.driver
        self.specs = {name: dataclasses.replace(spec, device=self.driver)
                      for name, spec in app_specs(self.root, self.pace).items()}
        self.rt = ""
        self.cache_root = ""
        self.time_up = time.monotonic() + TIME_UP_S[0 if opts.fast else 1]
        #: Set by the first Ctrl-C / SIGTERM (:meth:`on_stop_signal`) or when the run ends:
        #: from then on a stop signal is ignored, so a second Ctrl-C cannot cut the stop
        #: short (leaving apps, npud or temp dirs behind); each of its waits is bounded.
        self.stopping = False
        #: When the demo was interrupted (its stop's start), else None.
        self.t_stop: float | None = None

    # --- helpers ---------------------------------------------------------------

    def expect(self, app: str | None, ev: str, what: str, timeout: float, after: float = 0.0,
               **match: Any) -> Event | None:
        """Wait for an event; a miss is recorded and reported, never a hang. ``timeout`` is
        what the event takes on an idle machine with room to spare; the wait is
        PATIENCE times that, so that a loaded machine shows the scene late rather than
        reporting it missing (a background LLM compile took 34 s of a 30 s wait with
        the test suite on both cores), and never past the demo's TIME_UP_S. An event that
        comes returns at once."""
        left = self.time_up - time.monotonic()
        timeout = max(0.0, min(timeout * PATIENCE, left))
        got = self.log.wait(app, ev, timeout, after,
                            (lambda e: all(e.get(k) == v for k, v in match.items()))
                            if match else None)
        if got is None:
            self.run_rec.failures.append(what)
            why = " (the demo's time is up)" if timeout >= left else ""
            self.out.warn(f"expected within {timeout:.0f} s{why}, did not happen: {what}")
        return got

    def spawn(self, name: str) -> AppProcess:
        spec, model = self.specs[name], self.models[name]
        cache_dir = os.path.join(self.cache_root, name)
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        if spec.uid is not None:
            os.chown(cache_dir, spec.uid, spec.uid)
        rt = self.rt

        def main(outbox: Any, commands: Any) -> None:
            app_main(spec, model, rt, cache_dir, outbox, commands)

        with signals_held():  # a Ctrl-C now is taken once the app is on the list
            proc = AppProcess(name, spec.uid, main, self.log.add,
                              os.path.join(self.cache_root, f"{name}.log"))
            self.apps[name] = proc
        return proc

    def set_importance(self, name: str) -> None:
        spec = self.specs[name]
        if spec.uid is None:
            return
        self.remember_importance(spec.uid)
        self.admin.set_uid_importance(spec.uid, spec.importance)
        self.out.event("admin", f"set_uid_importance({spec.uid}, {spec.importance.name}) "
                       f"for {name}: app priority {int(spec.importance)}")

    def remember_importance(self, uid: int) -> None:
        """Before changing a uid's importance on a running npud, note what it was."""
        if self.own_npud or uid in self.saved_importance:
            return
        dump = self.admin.dump()
        before = (dump.get("uids") or {}).get(str(uid), {}).get("importance")
        if not isinstance(before, int):  # nobody set it: npud's default applies
            before = (dump.get("params") or {}).get("default_importance")
        if isinstance(before, int):
            self.saved_importance[uid] = before

    def restore_importance(self) -> None:
        for uid, level in self.saved_importance.items():
            try:
                self.admin.set_uid_importance(uid, level)
            except Exception as exc:  # a note, not a trace: the demo is over
                self.out.warn(f"could not restore uid {uid}'s importance {level}: {exc}")
        self.saved_importance.clear()

    def set_own_importance(self) -> None:
        """Not root: every app is this uid; make it FOREGROUND (allowed as npud's own uid)."""
        from npumanager.errors import NpuError

        try:
            self.remember_importance(os.getuid())
            self.admin.set_uid_importance(os.getuid(), Importance.FOREGROUND)
        except NpuError as exc:
            self.out.warn(f"cannot set this uid's importance: {type(exc).__name__}: {exc}")
            return
        self.out.event("admin", f"set_uid_importance({os.getuid()}, FOREGROUND) for every app "
                       "(one uid); job priorities order their work in the driver")

    def show_story(self, name: str) -> None:
        """npud's decision log about the app's first request (`npu status --story UID:ID`)."""
        spec = self.specs[name]
        uid = spec.uid if spec.uid is not None else os.getuid()
        story = self.admin.story(uid, spec.first_id)
        if not story:
            return
        self.out.note(f"npu status --story {uid}:{spec.first_id}", "")
        t0 = float(story[0].get("at", 0.0))
        for d in story:
            self.out.note(f"  +{float(d.get('at', 0.0)) - t0:6.3f}s  {d.get('what')}  "
                          f"({d.get('stimulus_id')})", "")

    def budget_line(self) -> None:
        dump = self.admin.dump()
        for line in status_excerpt(dump, {s.uid: n for n, s in self.specs.items()
                                          if s.uid is not None}):
            self.out.note(line, "")

    def pause(self, s: float) -> None:
        if s > 0:
            self.log.hold(s)

    # --- setup ----------------------------------------------------------------------

    def start(self) -> None:
        if not self.own_npud:
            # What a user needs first on someone's npud is whether the demo can run there:
            # it said so (ServiceUnavailable, NotAdmin) only after its title, scene 1 and the
            # models' build, and an npud without the apps' device, or a socket their uids
            # cannot reach, showed as a minute of scenes whose events never came.
            self.use_running_npud()
        backend = BACKENDS.get(self.driver, self.driver)
        self.out.title(
            "npumanager demo",
            (f"npud + the {backend}" if self.own_npud else
             f"the npud in {self.rt} (device {self.driver})")
            + ", four apps in their own\nprocesses" + (" and uids" if self.root else "")
            + ". Every number below is measured in this run.")
        if self.own_npud:
            self.out.scene(1, SCENES, f"npud starts with the {self.driver} driver",
                           "A temporary runtime dir and state dir; npud supervises the driver "
                           "host; apps find devices through nn.devices().")
        else:
            self.out.scene(1, SCENES, "The running npud and its devices",
                           "Apps find devices through nn.devices().")
        self.cache_root = tempfile.mkdtemp(prefix="npu-demo-apps-")
        os.chmod(self.cache_root, 0o755)
        self.tmp.append(self.cache_root)
        t0 = time.perf_counter()
        self.models = demo_models(self.opts.fast)
        self.out.event("demo", f"built 4 ONNX models with onnx.helper in "
                       f"{fmt_ms((time.perf_counter() - t0) * 1000)} "
                       f"(llm {self.models['llm'].weight_bytes / 2**20:.0f} MiB of weights)")
        if self.own_npud:
            from npumanager.client import NpuManager

            self.start_npud()
            self.admin = NpuManager(self.rt, client_name="demo-admin")
        else:
            self.out.event("demo", f"using the running npud in {self.rt}")
        self.show_devices()
        if not self.root:
            self.run_rec.skipped.append("preemption between apps (npud preempts holders of "
                                        "other uids only; run as root for one uid per app)")
            self.out.warn("not root: every app runs under your uid. npud preempts only holders "
                          "of OTHER uids, so the preemption scenes will not happen; run as "
                          "root (sudo) for the full demo.")
        self.attach_hal()
        self.start_trace()

    def use_running_npud(self) -> None:
        """Connect to the npud of --runtime-dir as the demo's admin and check it can host the
        scenes: its admin rights, the device the apps run on, a socket the apps' uids can
        reach. ServiceUnavailable or :class:`CannotUse` otherwise."""
        from npumanager import nn
        from npumanager.client import NpuManager

        assert self.opts.runtime_dir is not None
        self.rt = self.opts.runtime_dir
        self.admin = NpuManager(self.rt, client_name="demo-admin")
        if not self.admin.admin:
            raise NotAdmin(f"the demo sets importances and overrides the thermal status, "
                           f"which needs admin rights on the npud in {self.rt} (root, npud's "
                           f"own uid or its admin group); uid {self.admin.uid} has none")
        names = [d.name for d in nn.devices(self.rt)]
        if self.driver not in names:
            raise CannotUse(f"the demo's apps run on device {self.driver!r} (--driver); the "
                            f"npud in {self.rt} serves {', '.join(names) or 'no device'}: "
                            f"drop --runtime-dir and the demo starts an npud of its own")
        uids = sorted({s.uid for s in self.specs.values() if s.uid is not None})
        blocked = unreachable_by_others(os.path.join(self.rt, MANAGER_SOCKET))
        if uids and blocked:
            raise CannotUse(f"the demo's apps run as uids {', '.join(map(str, uids))}, and "
                            f"{blocked}: they could not reach npud; chmod o+x it, or drop "
                            f"--runtime-dir and the demo starts an npud of its own")

    def start_npud(self) -> None:
        from npumanager.testing.daemon import DaemonProcess

        self.rt = tempfile.mkdtemp(prefix="npu-demo-run-")
        os.chmod(self.rt, 0o755)
        self.tmp.append(self.rt)
        state = tempfile.mkdtemp(prefix="npu-demo-state-")
        self.tmp.append(state)
        config = {
            # A short unload deadline so the stubborn app is revoked within the demo.
            "manager": {"unload_deadline_s": self.pace.unload_deadline_s,
                        "log_level": "warning"},
            # One execution channel, like a small NPU: foreground frames and background
            # decode steps really compete for it.
            # Background work at normal CPU priority: the default (SCHED_IDLE) runs it only
            # on an idle core, and on a busy machine (a test suite on both cores) the LLM's
            # compile got 1 s of CPU in 125 s and the scenes waited for it in vain.
            "driver": [{"name": self.driver, "plugin": self.driver, "channels": 1,
                        "background_sched": "normal"}],
        }
        t0 = time.perf_counter()
        # die_with_parent: a SIGKILLed demo (its apps die with it) leaves no npud behind.
        # Foreground protection off ("auto" is npud's default): the scenes show one channel
        # shared, and with "auto" as root the LLM's decode runs in the background lane, so
        # it is never paused for a camera frame (`npu demo` as root with auto, cpu-exclusive:
        # 24.8 s, exit 1, "did not happen: llm decode PAUSED for camera frames"; off: 24.7 s,
        # exit 0). bench/contention.py's default-auto row measures the default instead.
        self.npud = DaemonProcess(self.rt, config, drivers=True, die_with_parent=True,
                                  env={**os.environ, "NPU_STATE_DIR": state},
                                  protect_foreground="off")
        self.npud.start()
        self.out.event("npud", f"ready in {fmt_ms((time.perf_counter() - t0) * 1000)}: "
                       f"{self.npud.ready_line}")
        self.out.note(f"policy BUDGET (budget 4; weights <1GB=1, 1-2GB=2, >2GB=4), unload "
                      f"deadline {self.pace.unload_deadline_s:g} s, 1 execution channel, "
                      "background work at normal CPU priority, foreground protection off "
                      "(one shared queue, as on a small NPU; `npu demo --compare` runs "
                      "npud's default)")

    def show_devices(self) -> None:
        from npumanager import nn

        for dev in nn.devices(self.rt):
            c = dev.capabilities
            self.out.event("npud", f"device {c.name} {c.version}: {c.backend}, "
                           f"{plural(c.channels, 'channel')}, {c.memory_bytes / 2**30:.1f} GiB, "
                           f"cache files "
                           f"{c.model_cache_files}+{c.data_cache_files}, admission "
                           f"{'enforced' if c.enforce_admission else 'open'}")
            dev.close()

    def start_trace(self) -> None:
        """Record the run (npud's decisions, budget, thermal, every execution step) for
        trace.json, timeline.png and summary.json."""
        if self.opts.out == "":
            return
        from npumanager.errors import NpuError
        from npumanager.trace.recorder import TraceRecorder

        try:
            self.tracer = TraceRecorder(self.rt)
        except NpuError as exc:
            self.out.warn(f"no trace: {exc}")
            return
        for name, spec in self.specs.items():
            if spec.uid is not None:
                self.tracer.rec.uid_names[str(spec.uid)] = f"{name} (uid {spec.uid})"
        if not self.root:
            self.tracer.rec.uid_names[str(os.getuid())] = f"every app (uid {os.getuid()})"
        self.tracer.start()

    def write_outputs(self) -> None:
        tracer, self.tracer = self.tracer, None
        if tracer is not None:
            write_outputs(tracer.stop(), self.opts, self.run_rec, self.root, self.out)

    def attach_hal(self) -> None:
        from npumanager.hal import connect_scheduling

        if not self.own_npud:
            self.run_rec.skipped.append("HAL work events (the driver has one callback slot, "
                                        "npud's; the demo takes it only from its own npud)")
            return
        try:
            self._hal_conn = connect_scheduling(self.driver, self.rt)
            self.hal = HalObserver()
            self._hal_conn.set_callback(self.hal)
        except Exception as exc:
            self.out.warn(f"cannot watch HAL work events: {type(exc).__name__}: {exc}")
            self.hal = None
            return
        self.out.event("HAL", "the demo holds the driver's IScheduling callback to watch work "
                       "events (npud's fairness rule sees none meanwhile)")

    # --- the scenes -------------------------------------------------------------------

    def scene_llm(self) -> None:
        if self.root:
            self.out.scene(2, SCENES, "A background LLM holds the whole budget",
                           "The LLM asks for a >2GB model (weight 4 = the whole budget) at "
                           "BACKGROUND priority and runs multi-step decode jobs.")
            for name in ("camera", "embedder", "voice", "llm"):
                self.set_importance(name)
        else:
            self.out.scene(2, SCENES, "A background LLM decodes",
                           "The LLM asks for a 1-2GB model (weight 2 of the budget 4) at "
                           "BACKGROUND priority and runs multi-step decode jobs.")
            self.set_own_importance()
        t = time.monotonic()
        self.spawn("llm")
        self.expect("llm", "decode", "llm prepared and decoding", 30, t)
        self.pause(self.pace.llm_alone_s)
        self.budget_line()

    def scene_camera(self) -> None:
        self.out.scene(3, SCENES, "The camera opens in the foreground",
                       "FOREGROUND (100) outranks the LLM's SERVICE (300) + BACKGROUND (1000): "
                       "npud asks the LLM to unload and grants the camera once it has."
                       if self.root else
                       "Every app shares your uid, so npud does not preempt the LLM; the "
                       "camera's <1GB model fits next to it.")
        self.pause(self.pace.between_s)
        t = time.monotonic()
        self.spawn("camera")
        if self.root:
            self.expect("llm", "unload_asked", "llm asked to unload (PREEMPTED)", 10, t,
                        reason="PREEMPTED")
            self.expect("llm", "unloaded", "llm reported unloaded", 10, t)
        if self.expect("camera", "frame", "camera granted and streaming", 15, t):
            time.sleep(0.2)  # the first runs of a new session warm up; not the steady state
            self.run_rec.begin("camera alone" if self.root else "camera + llm decoding")
        if self.root:
            self.expect("llm", "request", "llm asks again after its back-off", 15, t + 0.01)
            self.run_rec.end()
        else:
            self.pause(self.pace.llm_backoff_s)

    def scene_contention(self) -> None:
        self.out.scene(4, SCENES, "Background decode yields to foreground frames",
                       ("The LLM comes back with a 1-2GB footprint (short context); on"
                        if self.root else "On")
                       + " the one channel the driver PAUSES its decode job between steps for "
                       "every frame and RESUMES it after.")
        t = time.monotonic()
        t_dec = t
        if self.root:
            prep = self.expect("llm", "prepared", "llm prepared again", 15, t)
            if prep is not None and not prep["from_cache"]:
                self.run_rec.failures.append("llm's second prepare loaded from cache")
            if self.expect("llm", "decode", "llm decoding next to the camera", 10, t):
                self.run_rec.begin("camera + llm decoding")
            t_dec = time.monotonic()
        self.pause(self.pace.contention_s / 2)
        self.out.event("demo", "the embedder service starts; it fits: 1+2+1 = 4")
        self.run_rec.end()
        t = time.monotonic()
        self.spawn("embedder")
        if self.expect("embedder", "infer", "embedder running", 15, t):
            self.run_rec.begin("camera + llm + embedder")
        self.pause(self.pace.contention_s / 2)
        self.show_hal(t_dec)
        self.budget_line()

    def show_hal(self, t0: float) -> None:
        if self.hal is None:
            return
        uid = self.specs["llm"].uid
        paused = self.hal.count(uid, "ended", "PAUSED", t0)
        resumed = self.hal.count(uid, "started", "RESUMED", t0)
        self.out.event("HAL", f"llm's decode work: {paused} x on_work_ended(PAUSED), "
                       f"{resumed} x on_work_started(RESUMED) next to the camera")
        ex = self.hal.pause_example(uid, t0)
        if ex is not None:
            p, r = ex
            self.out.note(f"e.g. work {p.work_id} (effective priority {p.effective_priority}) "
                          f"paused at {self.out.elapsed(p.t):.3f}s, resumed "
                          f"{(r.t - p.t) * 1000:.1f} ms later")
        if self.root and paused == 0:
            self.run_rec.failures.append("llm decode PAUSED for camera frames")

    def scene_thermal(self) -> None:
        deadline = self.admin.dump().get("params", {}).get("unload_deadline_s")
        self.out.scene(5, SCENES, "The device heats up",
                       "Admin thermal override SEVERE (as `npu thermal override severe`): "
                       "holders ranked above PERCEPTIBLE (230) must leave; the embedder "
                       "ignores the request and is revoked at the unload deadline"
                       + (f" ({deadline:g} s)." if isinstance(deadline, int | float) else "."))
        self.pause(self.pace.between_s)
        t = time.monotonic()
        self.out.event("admin", "override_thermal_status(SEVERE)", t, "bold red")
        info = self.admin.override_thermal_status(ThermalStatus.SEVERE)
        self.run_rec.end()
        if info.status != ThermalStatus.SEVERE:
            self.run_rec.failures.append(f"thermal status SEVERE (got {info.status.name})")
        self.expect("llm", "unload_asked", "llm asked to unload (THERMAL)", 10, t,
                    reason="THERMAL")
        self.expect("embedder", "unload_asked", "embedder asked to unload (THERMAL)", 10, t,
                    reason="THERMAL")
        self.expect("embedder", "complete", "embedder REVOKED at the deadline",
                    self.pace.unload_deadline_s + 10, t, status="REVOKED")
        self.expect("embedder", "execute_revoked", "embedder's execute raised GrantRevoked",
                    10, t)
        self.show_story("embedder")
        self.expect("llm", "can_load", "llm waits while SEVERE", 10, t + 0.01)
        self.out.event("demo", "a voice query arrives (VISIBLE, 200 <= 230: allowed while "
                       "SEVERE)")
        t = time.monotonic()
        self.spawn("voice")
        if self.expect("voice", "exit", "voice query answered", 20, t):
            self.run_rec.begin("camera alone, SEVERE")
        self.pause(self.pace.severe_s)
        self.budget_line()

    def scene_cool(self) -> None:
        self.out.scene(6, SCENES, "It cools down",
                       "Override reset: back to the sensors (the driver's thermal model). "
                       "Waiters get their grants; the restarted embedder loads from cache.")
        t = time.monotonic()
        temps = self.admin.dump().get("thermal", {}).get("temperatures", {})
        temp = ", ".join(f"{k} {v:.1f} C" for k, v in temps.items() if v is not None)
        self.out.event("admin", "reset_thermal_status()"
                       + (f": the sensors say {temp}" if temp else ""), t, "bold green")
        info = self.admin.reset_thermal_status()
        self.run_rec.end()
        self.out.event("npud", f"thermal status {info.status.name}")
        self.expect("llm", "prepared", "llm back after the cool-down", 15, t)
        self.out.event("demo", "the embedder service is restarted (a new process)")
        old = self.apps.pop("embedder", None)
        if old is not None:
            old.kill()
        t2 = time.monotonic()
        self.spawn("embedder")
        self.expect("embedder", "prepared", "embedder's second start", 15, t2)
        if self.expect("embedder", "infer", "embedder running again", 10, t2):
            self.run_rec.begin("camera + llm + embedder, cooled")
        self.pause(self.pace.cool_s)
        self.run_rec.end()

    # --- run ---------------------------------------------------------------------------

    def stop_apps(self, timeout: float = STOP_APPS_S["end"]) -> None:
        stop_all(list(self.apps.values()), timeout)
        self.apps.clear()

    def on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT / SIGTERM: the first one stops the demo, later ones are ignored."""
        if self.stopping:
            return
        self.stopping = True
        raise KeyboardInterrupt

    def cleanup(self, interrupted: bool = False) -> None:
        self.stopping = True
        if self.tracer is not None:  # interrupted: stop recording, write nothing
            with contextlib.suppress(Exception):
                self.tracer.abandon()
            self.tracer = None
        with contextlib.suppress(Exception):
            self.stop_apps(STOP_APPS_S["interrupted" if interrupted else "end"])
        for proc in list(self.apps.values()):
            with contextlib.suppress(Exception):
                proc.kill()
        if self._hal_conn is not None:
            with contextlib.suppress(Exception):
                self._hal_conn.close()
        if self.admin is not None:
            with contextlib.suppress(Exception):
                if not self.own_npud:
                    self.admin.reset_thermal_status()
            with contextlib.suppress(Exception):
                self.restore_importance()
            with contextlib.suppress(Exception):
                self.admin.close()
        if self.npud is not None:
            with contextlib.suppress(Exception):
                self.npud.stop(STOP_NPUD_S)
        for d in self.tmp:
            shutil.rmtree(d, ignore_errors=True)

    def run(self) -> int:
        t0 = time.monotonic()
        undo_diag = diag.install(lambda: diag.logs(self.npud, self.apps, self.cache_root))
        try:
            self.start()
            self.scene_llm()
            self.scene_camera()
            self.scene_contention()
            self.scene_thermal()
            self.scene_cool()
            self.stop_apps()
            print_summary(self.out, self.log, self.run_rec, self.hal, self.specs,
                          time.monotonic() - t0, own_npud=self.own_npud)
            self.write_outputs()
        except AppFailed:
            self.log.mute()  # the others' reports as it stops them are not the story
            raise
        except KeyboardInterrupt:
            # Said at once: the stop takes up to a few seconds. What the apps report
            # meanwhile (npud and the driver going away under them) is not the demo's story.
            self.t_stop = time.monotonic()
            self.log.mute()
            self.out.warn("interrupted: stopping the apps"
                          + (", npud and its driver host" if self.own_npud else "")
                          + " and removing the temp dirs")
            raise
        finally:
            self.cleanup(interrupted=self.t_stop is not None)
            undo_diag()
        if self.run_rec.failures and self.root:
            return 1
        return 0


def unreachable_by_others(sock: str) -> str:
    """Why a process of an unrelated uid could not connect to ``sock`` ("" if it could): a
    directory on the way others may not pass, or a socket they may not write."""
    path = os.path.abspath(sock)
    for d in reversed([path, *(str(p) for p in Path(path).parents)]):
        try:
            mode = os.stat(d).st_mode
        except OSError:
            continue
        if d == path:
            if not mode & 0o002:
                return f"the socket {d} is mode {stat.S_IMODE(mode):04o} (others may not write)"
        elif not mode & 0o001:
            return f"{d} is mode {stat.S_IMODE(mode):04o} (others may not pass)"
    return ""


def run_demo(opts: DemoOptions) -> int:
    """Run the demo; 0 when everything it shows happened, 1 if something did not."""
    out = Renderer(color=opts.color)
    scenario = Scenario(opts, out)
    old = {sig: signal.signal(sig, scenario.on_stop_signal)
           for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return scenario.run()
    except KeyboardInterrupt:
        took = time.monotonic() - (scenario.t_stop or time.monotonic())
        out.warn(f"stopped in {took:.1f} s: nothing it started is left running, its temp "
                 "dirs are removed")
        return 130
    except CannotUse as exc:
        print(f"npu demo: {exc}", file=sys.stderr, flush=True)
        return 1  # refused by npud, or an npud it cannot use: a failure, not a usage error
    except AppFailed as exc:
        spec = scenario.specs.get(exc.app)
        who = f"{exc.app} (uid {spec.uid})" if spec is not None and spec.uid is not None \
            else exc.app
        print(f"npu demo: its app {who} could not connect: {exc.error}; stopped (nothing "
              "it started is left running)", file=sys.stderr, flush=True)
        return 1
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
