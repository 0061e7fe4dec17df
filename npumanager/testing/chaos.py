"""`npu chaos`: npud, the reference driver and N apps under faults, checked from outside.

It starts npud (its own runtime and state dirs) with the reference driver, and N app
processes (under uids 50001.. when run as root) that make random requests, cancel them,
prepare models, execute single and multi-step jobs, unload, and die. Meanwhile it
restarts npud, alternately after a SIGKILL (a crash) and a SIGTERM (a clean restart: npud
must exit 0 and leave its driver host running for the new npud to adopt), SIGKILLs the
driver (npud restarts it; sometimes npud is SIGTERMed while that replacement starts),
SIGSTOPs apps past their unload deadline and the driver for a moment (the ends of grants
then wait for its ack), moves the thermal status (admin override) and apps' importance.
Every tick it checks, from outside:

* the budget: the holders npud reports that are not being unloaded fit the (thermally
  scaled) budget;
* liveness: every live request belongs to an app process that is alive;
* ended grants: none waits for its driver's ack longer than ``grant_end_ack_s`` plus the
  driver's longest restart back-off (npud then restarts the driver and applies the end);
* no traceback in npud's or the driver's log;

and at the end the fd count and RSS of npud and the driver against the start. The report
also gives what the apps saw: the share of executes that succeeded and the longest gap
between two successful executes of one app across the restarts, and where the run's logs
are (npud.log: npud and its driver hosts; stats/: the apps'), kept on a violation.

This module runs the faults; an app is :mod:`.chaos_app`, the checks and the report they
fill are :mod:`.chaos_checks`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from npumanager.testing.chaos_app import app_main
from npumanager.testing.chaos_checks import (
    APP_UID0,
    Report,
    check_tick,
    ending_bound_s,
    read_availability,
)
from npumanager.testing.daemon import driver_hosts, process_running
from npumanager.testing.procs import spawn_as

# --- the harness -----------------------------------------------------------------


def _proc_stats(pid: int) -> dict[str, int]:
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return {"fds": fds, "rss_kb": rss}
    except (OSError, StopIteration, ValueError):
        return {}


def _driver_pid(rt: Path) -> int | None:
    """The newest driver host on ``rt`` (an orphaned older one may still be exiting)."""
    found: list[tuple[int, int]] = []
    for pid in driver_hosts(rt):
        try:
            with open(f"/proc/{pid}/stat") as f:
                started = int(f.read().rsplit(")", 1)[1].split()[19])
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
        found.append((started, pid))
    return max(found)[1] if found else None


class Npud:
    """npud as a subprocess logging to one file (its drivers inherit it)."""

    def __init__(self, rt: Path, state: Path, config: Path, log: Path) -> None:
        self.rt, self.state, self.config, self.log = rt, state, config, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0, waiting: Callable[[], None] = lambda: None
              ) -> None:
        """Start npud and wait for its ready line, calling ``waiting`` every 50 ms
        meanwhile (the harness's due SIGCONTs: a start takes seconds on a loaded
        machine, and a process stopped for a moment must not stay stopped for it)."""
        start_size = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "npumanager", "serve", "--runtime-dir", str(self.rt),
                 "--state-dir", str(self.state), "--config", str(self.config),
                 # The keys its config sets and nothing more (testing/daemon.py says why).
                 "--protect-foreground", "off"],
                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log, "rb") as f:
                f.seek(start_size)
                if b"npud ready" in f.read():
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"npud did not start; see {self.log}")
            waiting()
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> str | None:
        """SIGTERM, as `systemctl restart` does; what went wrong, if anything."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.terminate()
        try:
            rc = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "npud did not exit within 20 s of SIGTERM"
        return None if rc == 0 else f"npud exited with {rc} on SIGTERM"


def run_chaos(duration: float, apps: int = 4, seed: int = 1, *,
              workdir: Path | None = None, keep: bool = False) -> Report:
    """The run, in ``workdir`` (kept) or a new temporary directory (removed after a clean
    run unless ``keep``); the report names it."""
    import shutil

    root = Path(workdir) if workdir is not None else Path(
        tempfile.mkdtemp(prefix="npu-chaos-", dir="/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    report = Report(log_dir=str(root))
    try:
        _run(root, report, duration, apps, seed)
    finally:
        # What the run found, beside its logs (kept on a violation): a failed test's
        # output may be gone by the time someone reads the logs.
        (root / "report.txt").write_text(report.render() + "\n")
        if workdir is None and not keep and not report.violations and report.duration_s:
            shutil.rmtree(root, ignore_errors=True)
            report.log_dir = ""
    return report


def _run(root: Path, report: Report, duration: float, apps: int, seed: int) -> None:
    from npumanager.client import NpuManager
    from npumanager.config import Config
    from npumanager.constants import ThermalStatus
    from npumanager.testing.daemon import stop_driver_hosts, to_toml

    rng = random.Random(seed)
    rt, state, stats = root / "rt", root / "state", root / "stats"
    rt.mkdir(mode=0o755, exist_ok=True)
    os.chmod(root, 0o755)
    state.mkdir(mode=0o700, exist_ok=True)
    stats.mkdir(mode=0o777, exist_ok=True)
    os.chmod(stats, 0o777)
    config = root / "npud.toml"
    unload_deadline = 1.0
    config.write_text(to_toml({"manager": {"unload_deadline_s": unload_deadline,
                                           "adopt_grace_s": 2.0}}))
    bound = ending_bound_s(Config.load(config))  # a grant's wait for its driver's ack
    log = root / "npud.log"
    npud = Npud(rt, state, config, log)
    npud.start()
    as_root = os.getuid() == 0
    t0 = time.time()
    until = t0 + duration
    children: dict[int, Any] = {}

    def spawn(i: int) -> None:
        uid = APP_UID0 + i if as_root else None
        children[i] = spawn_as(uid, uid, app_main, str(rt), seed * 1000 + i + report.ticks,
                               str(stats / f"app{i}.txt"), until, timeout=duration + 60)
        report.count("app started")

    if as_root:
        # Apps as a desktop has them: a foreground one, visible, service, cached.
        with NpuManager(rt, reconnect=False) as mgr:
            for i in range(apps):
                mgr.set_uid_importance(APP_UID0 + i, (100, 200, 300, 400)[i % 4])
    for i in range(apps):
        spawn(i)
    time.sleep(1.0)
    report.start = {"npud": _proc_stats(npud.proc.pid if npud.proc else 0)}
    drv = _driver_pid(rt)
    if drv is not None:
        report.start["driver"] = _proc_stats(drv)
    stopped: dict[int, float] = {}
    #: A driver host SIGSTOPped: its pid -> until when (at most one).
    held_driver: dict[int, float] = {}

    def resume_due() -> None:
        """SIGCONT the stopped driver host and apps whose time is up: every tick, and
        while npud restarts. A start blocks the loop for seconds on a loaded machine, and
        a driver stopped for 0.3-2 s stayed stopped through it: in session 12's failed
        run (its logs kept) an app holding a grant executed last at 11:59:10.8 and next
        at 23.5, the moment the loop went on; npud was SIGKILLed meanwhile, its successor
        started with the host DOWN (its hello timed out), and the host logged the old
        npud's exit only at 23.5 (within ms every other time)."""
        now = time.time()
        for pid, at in list(held_driver.items()):
            if now >= at:
                _cont(pid)
                del held_driver[pid]
        for i, at in list(stopped.items()):
            if now >= at:
                try:
                    os.kill(children[i].pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                del stopped[i]

    next_npud_kill = time.time() + rng.uniform(3.0, 8.0)
    first_kill = rng.randrange(2)  # then they alternate: a short run sees both
    next_driver_kill = time.time() + rng.uniform(8.0, 20.0)
    unknown_since: dict[str, float] = {}
    while time.time() < until - 1.0:
        time.sleep(0.25)
        report.ticks += 1
        # Faults: npud and driver kills on their own schedules, the rest by chance.
        now = time.time()
        if now >= next_npud_kill:
            if (report.npud_restarts + first_kill) % 2 == 0:
                npud.kill()
                report.count("npud SIGKILL")
            else:
                _sigterm(npud, _driver_pid(rt), report)
            time.sleep(rng.uniform(0.0, 1.0))
            npud.start(waiting=resume_due)
            report.npud_restarts += 1
            next_npud_kill = time.time() + rng.uniform(6.0, 12.0)
        elif now >= next_driver_kill:
            pid = _driver_pid(rt)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                report.count("driver SIGKILL")
                # Sometimes a restart right then, while npud's replacement host is still
                # starting (the race behind a "stopped its driver host" violation).
                new = _replacement(rt, pid) if rng.random() < 0.3 else None
                if new is not None:
                    report.count("npud SIGTERM while its driver host starts")
                    _sigterm(npud, new, report)
                    npud.start(waiting=resume_due)
                    report.npud_restarts += 1
            next_driver_kill = now + rng.uniform(10.0, 25.0)
        r = rng.random()
        if r < 0.04 and len(stopped) < apps - 1:
            i = rng.randrange(apps)
            if i not in stopped and children[i].pid:
                try:
                    os.kill(children[i].pid, signal.SIGSTOP)
                    stopped[i] = time.time() + unload_deadline + rng.uniform(0.5, 1.5)
                    report.count("app SIGSTOP")
                except ProcessLookupError:
                    pass
        elif r < 0.10:
            _admin(rt, report, rng, apps, NpuManager, ThermalStatus)
        elif r < 0.12 and not held_driver:
            # The driver stalls (SIGSTOP) for a moment: the ends of grants npud decides
            # meanwhile wait for its ack (the "ending" check above bounds that wait).
            pid = _driver_pid(rt)
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGSTOP)
                    held_driver[pid] = time.time() + rng.uniform(0.3, 2.0)
                    report.count("driver SIGSTOP")
                except ProcessLookupError:
                    pass
        resume_due()
        for i, child in list(children.items()):
            if i not in stopped and _dead(child.pid):
                report.count("app died")
                spawn(i)
        check_tick(rt, report, children, unknown_since, bound)
    for pid in held_driver:
        _cont(pid)
    for i in stopped:
        try:
            os.kill(children[i].pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    time.sleep(1.5)
    report.end = {"npud": _proc_stats(npud.proc.pid if npud.proc else 0)}
    drv = _driver_pid(rt)
    if drv is not None:
        report.end["driver"] = _proc_stats(drv)
    for child in children.values():
        child.kill()
    failed = npud.stop()
    if failed:
        report.violations.append(failed)
    # The run is over, not restarting: its driver hosts go too (else they would serve out
    # their orphan grace, writing to the log read below).
    stop_driver_hosts(rt)
    report.duration_s = time.time() - t0
    read_availability(stats, report)
    text = log.read_text(errors="replace")
    for sign in ("Traceback", "Task was destroyed", "Exception ignored"):
        if sign in text:
            report.violations.append(f"{text.count(sign)} x {sign!r} in {log}")
    for proc in ("npud", "driver"):
        s, e = report.start.get(proc, {}), report.end.get(proc, {})
        if s and e and e["fds"] > s["fds"] + 32:
            report.violations.append(f"{proc} fds grew {s['fds']} -> {e['fds']}")


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass  # killed meanwhile (a driver SIGKILL, or npud restarted it)


def _sigterm(npud: Npud, host: int | None, report: Report) -> None:
    """A clean restart's stop: npud exits 0 and its driver host outlives it (adopted)."""
    failed = npud.stop()
    report.count("npud SIGTERM")
    if failed:
        report.violations.append(failed)
    if host is not None and not process_running(host):
        report.violations.append(f"npud's SIGTERM stopped its driver host {host}"
                                 + _host_story(npud.log, host))


def _replacement(rt: Path, killed: int, timeout: float = 3.0) -> int | None:
    """The host npud starts after ``killed``, as soon as it exists (still starting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = _driver_pid(rt)
        if new is not None and new != killed:
            return new
        time.sleep(0.005)
    return None


def _host_story(log: Path, pid: int) -> str:
    """What npud's log says of host ``pid``: attached ("is up"/"adopted") or not."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    said = [line.split(" ", 1)[0] + " " + line.rsplit(": ", 1)[-1]
            for line in text.splitlines() if f"(pid {pid}," in line]
    return (f" (npud's log: {'; '.join(said[:3])})" if said
            else " (npud's log never names it: it had not attached)")


def _dead(pid: int) -> bool:
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def _admin(rt: Path, report: Report, rng: random.Random, apps: int, mgr_cls: Any,
           thermal: Any) -> None:
    try:
        with mgr_cls(rt, reconnect=False) as mgr:
            if rng.random() < 0.5:
                # Mostly mild, sometimes SEVERE (background holders asked to leave).
                status = rng.choice((None, None, None, 1, 2, 3))
                if status is None:
                    mgr.reset_thermal_status()
                else:
                    mgr.override_thermal_status(thermal(status))
                report.count("thermal change")
            else:
                uid = APP_UID0 + rng.randrange(apps) if os.getuid() == 0 else os.getuid()
                mgr.set_uid_importance(uid, rng.choice((100, 200, 300, 400)))
                report.count("importance change")
    except Exception:
        report.count("admin call failed (npud away)")
