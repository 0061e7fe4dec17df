"""Start a real driver host process for tests and benchmarks (``npu driver NAME``)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from npumanager.errors import ServiceUnavailable

#: The CPU class driver hosts started by these helpers (and DaemonProcess's npud) give
#: BACKGROUND work when the test names none: ``None`` keeps the product's default
#: (``background_sched = "idle"``); a test suite sets ``"normal"`` (tests/conftest.py)
#: so that only the tests about CPU classes, which name one, run work at SCHED_IDLE. A
#: test driver host serves root as an unknown (BACKGROUND) uid, and on a machine kept
#: busy by the rest of the suite a SCHED_IDLE thread can wait tens of seconds for a
#: core, holding the host's GIL meanwhile (its hello then times out).
BACKGROUND_SCHED: str | None = None


class DriverProcess:
    def __init__(self, proc: subprocess.Popen[bytes], name: str, socket_path: Path) -> None:
        self.proc = proc
        self.name = name
        self.socket_path = socket_path
        self.ready_line = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 30.0) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        while b"ready" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServiceUnavailable(f"driver {self.name} did not become ready")
            r, _, _ = select.select([self.proc.stdout], [], [], left)
            if not r:
                continue
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise ServiceUnavailable(
                    f"driver {self.name} exited with {self.proc.wait()} before it was ready"
                )
            buf += chunk
        self.ready_line = buf.decode(errors="replace").strip()

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def driver_command(name: str, runtime_dir: Path, state_dir: Path | None = None,
                   config: Path | None = None, args: Sequence[str] = ()) -> list[str]:
    """`npu driver NAME` started by hand. Foreground protection "off" unless ``args`` name
    one, as DaemonProcess's npud: a test's host runs its file's keys, not the set "auto"
    gives as root (service/protection.resolve_hand_started)."""
    cmd = [sys.executable, "-m", "npumanager", "driver", name, "--runtime-dir", str(runtime_dir)]
    if not any(a.startswith("--protect-foreground") for a in args):
        cmd += ["--protect-foreground", "off"]
    if state_dir is not None:
        cmd += ["--state-dir", str(state_dir)]
    if config is not None:
        cmd += ["--config", str(config)]
    if BACKGROUND_SCHED is not None and not any(
            a.startswith("--background-sched") for a in args) and not _names_sched(config):
        cmd += ["--background-sched", BACKGROUND_SCHED]
    return cmd + list(args)


def _names_sched(config: Path | None) -> bool:
    """Does the test's config file set background_sched itself?"""
    return config is not None and "background_sched" in config.read_text()


@contextmanager
def running_driver(name: str, runtime_dir: Path, state_dir: Path | None = None,
                   config: Path | None = None, args: Sequence[str] = (),
                   timeout: float = 30.0) -> Iterator[DriverProcess]:
    """A driver host subprocess, ready when the block starts, stopped when it ends."""
    (runtime_dir / "drivers").mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        driver_command(name, runtime_dir, state_dir, config, args),
        stdout=subprocess.PIPE, stderr=None, stdin=subprocess.DEVNULL,
    )
    dp = DriverProcess(proc, name, runtime_dir / "drivers" / f"{name}.sock")
    try:
        dp.wait_ready(timeout)
        yield dp
    finally:
        dp.stop()


#: The stand-in npud of :func:`launched_host`: starts the host as npud does (its child,
#: ``--exit-with-manager --launcher-pid``), prints the host's pid once it is ready, and
#: never attaches; the test then SIGKILLs it.
_LAUNCHER = """
import os, subprocess, sys, time
cmd = sys.argv[1:] + ["--exit-with-manager", "--launcher-pid", str(os.getpid())]
host = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
line = host.stdout.readline()
print(host.pid if b"ready" in line else -1, flush=True)
time.sleep(3600)
"""


@contextmanager
def launched_host(name: str, runtime_dir: Path, state_dir: Path, config: Path,
                  timeout: float = 60.0) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A driver host started the way npud starts one, by a stand-in npud that never
    attaches: (the stand-in, the host's pid). SIGKILL the stand-in and the host is in
    issue #10's corner (b): npud died between the host's ready line and its attach. The
    block's end kills both if they are still there."""
    (runtime_dir / "drivers").mkdir(parents=True, exist_ok=True)
    cmd = driver_command(name, runtime_dir, state_dir, config)
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, *cmd],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    host_pid = -1
    try:
        assert launcher.stdout is not None
        r, _, _ = select.select([launcher.stdout], [], [], timeout)
        if r:
            line = launcher.stdout.readline().strip()
            host_pid = int(line) if line else -1
        if host_pid <= 0:
            raise ServiceUnavailable(f"driver {name} did not become ready under its "
                                     "stand-in npud")
        yield launcher, host_pid
    finally:
        for pid in (launcher.pid, host_pid):
            if pid > 0:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        launcher.wait()
        if launcher.stdout is not None:
            launcher.stdout.close()


def wait_exit(pid: int, timeout: float) -> bool:
    """Did process ``pid`` (not necessarily a child) exit within ``timeout`` seconds?"""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        r, _, _ = select.select([fd], [], [], timeout)
        return bool(r)
    finally:
        os.close(fd)
