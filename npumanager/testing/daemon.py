"""Run a real npud (`python -m npumanager serve`) as a subprocess, for tests and demos.

``with DaemonProcess(runtime_dir, config={...}) as npud:`` writes the config
(a dict or TOML text) next to the runtime dir, starts npud, waits for its
``ready`` line (or raises with its output if it exits or is slow), and on
exit stops it with SIGTERM and collects its logs (``npud.output``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from npumanager.paths import manager_socket
from npumanager.testing import driver_host


def to_toml(data: Mapping[str, Any]) -> str:
    """A minimal TOML writer for test configs (tables, arrays of tables, scalars, lists)."""
    lines: list[str] = []

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, Mapping):
            return "{ " + ", ".join(f'"{k}" = {scalar(x)}' for k, x in v.items()) + " }"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        raise TypeError(f"cannot write {v!r} as TOML")

    for name, value in data.items():
        if isinstance(value, Mapping):
            lines.append(f"[{name}]")
            lines.extend(f"{k} = {scalar(v)}" for k, v in value.items())
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], Mapping):
            for entry in value:
                lines.append(f"[[{name}]]")
                lines.extend(f"{k} = {scalar(v)}" for k, v in entry.items())
        else:
            raise TypeError(f"top-level {name!r} must be a table or an array of tables")
        lines.append("")
    return "\n".join(lines)


def with_background_sched(config: Mapping[str, Any] | str | None,
                          sched: str | None) -> Mapping[str, Any] | str | None:
    """``config`` with ``background_sched = sched`` in each [[driver]] entry that does
    not set its own (the default entries when it lists none); unchanged when ``sched``
    is None (see :data:`driver_host.BACKGROUND_SCHED`)."""
    if sched is None:
        return config
    from npumanager.config import Config

    data: dict[str, Any] = (dict(tomllib.loads(config)) if isinstance(config, str)
                            else dict(config or {}))
    entries = data.get("driver") or [{"name": d["name"], "plugin": d["plugin"]}
                                     for d in Config().drivers()]
    data["driver"] = [{"background_sched": sched, **d} for d in entries]
    return data


class DaemonProcess:
    """A real npud in a subprocess. ``drivers=False`` passes ``--no-drivers``;
    ``protect_foreground`` (default "off") is passed as ``--protect-foreground``."""

    def __init__(
        self,
        runtime_dir: str | os.PathLike[str],
        config: Mapping[str, Any] | str | None = None,
        *,
        drivers: bool = False,
        ready_timeout: float = 60.0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        die_with_parent: bool = False,
        protect_foreground: str | None = "off",
    ) -> None:
        self.runtime_dir = Path(runtime_dir)
        #: SIGTERM npud when the thread that started it ends (a SIGKILLed demo): only for
        #: a caller that starts it from its main thread and never hands it on.
        self.die_with_parent = die_with_parent
        #: `npu serve --protect-foreground`: "off" by default, so a test's npud runs the
        #: keys it sets and nothing more (the suite runs as root with CAP_SYS_NICE, where
        #: the product default, "auto", would start FIFO threads and a second host for
        #: every test); None passes nothing (the config's, else the default).
        self.protect_foreground = protect_foreground
        self.config = config
        self.drivers = drivers
        #: Generous: with drivers, npud is ready once its hosts are (each imports its
        #: backend, ONNX Runtime for the reference driver), which on a machine kept busy
        #: by the rest of a test suite takes many times what it takes alone.
        self.ready_timeout = ready_timeout
        self.extra_args = list(extra_args)
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.ready_line: str | None = None
        self.returncode: int | None = None
        self._ready = threading.Event()
        self._new_line = threading.Condition()
        self._reader: threading.Thread | None = None
        self._config_path: str | None = None

    def __repr__(self) -> str:
        state = "running" if self.proc and self.proc.poll() is None else "stopped"
        return f"<DaemonProcess {state} at {self.runtime_dir}>"

    @property
    def socket_path(self) -> Path:
        return manager_socket(self.runtime_dir)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_output(self, text: str | Callable[[str], object], timeout: float = 10.0,
                        count: int = 1) -> bool:
        """True once npud has printed ``count`` lines containing ``text`` (or lines it
        accepts, if callable), woken by each new line its output reader gets (no polling);
        False after ``timeout`` seconds."""
        match = text if callable(text) else (lambda ln: text in ln)
        with self._new_line:
            return self._new_line.wait_for(
                lambda: sum(bool(match(ln)) for ln in self.lines) >= count, timeout)

    def count_output(self, text: str | Callable[[str], object]) -> int:
        """How many lines npud has printed that contain ``text`` (or that it accepts)."""
        match = text if callable(text) else (lambda ln: text in ln)
        with self._new_line:
            return sum(bool(match(ln)) for ln in self.lines)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> DaemonProcess:
        args = [sys.executable, "-m", "npumanager", "serve", "--runtime-dir",
                str(self.runtime_dir)]
        config = self.config
        if self.drivers:
            config = with_background_sched(config, driver_host.BACKGROUND_SCHED)
        if config is not None:
            text = config if isinstance(config, str) else to_toml(config)
            fd, path = tempfile.mkstemp(prefix="npud-", suffix=".toml", dir="/tmp")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            self._config_path = path
            args += ["--config", path]
        if not self.drivers:
            args.append("--no-drivers")
        if self.protect_foreground is not None:
            args += ["--protect-foreground", self.protect_foreground]
        args += self.extra_args
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, env=env, bufsize=1,
            preexec_fn=_term_with_parent if self.die_with_parent else None,
        )
        self._reader = threading.Thread(target=self._read, name="npud-output", daemon=True)
        self._reader.start()
        # The reader sets _ready at npud's ready line, or when its output ends (it exited).
        if not self._ready.wait(self.ready_timeout):
            self.stop()
            raise TimeoutError(
                f"npud not ready within {self.ready_timeout} s:\n{self.output}")
        if self.ready_line is None:
            self.proc.wait(10)
            self._reader.join(2)
            self._cleanup()
            raise RuntimeError(
                f"npud exited with {self.proc.returncode} before it was ready:\n{self.output}")
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            self._read_lines(self.proc.stdout)
        except (ValueError, OSError):
            # stop() closed the pipe under us: a driver host npud left behind (orphaned,
            # serving out its grace) still held npud's stderr, so it never reached EOF.
            pass
        self._ready.set()  # npud's output ended: it exited

    def _read_lines(self, stream: Any) -> None:
        for line in stream:
            line = line.rstrip("\n")
            with self._new_line:
                self.lines.append(line)
                self._new_line.notify_all()
            # npud's own line ("npud ready on ..."), not a log line that mentions "ready".
            if self.ready_line is None and line.startswith("npud ready"):
                self.ready_line = line
                self._ready.set()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0, *, keep_drivers: bool = False) -> int:
        """SIGTERM, wait (SIGKILL after ``timeout``); returns the exit status.

        A SIGTERM'd npud leaves its driver hosts running for their orphan grace (a
        restart: the next npud adopts them). ``keep_drivers`` leaves them so; by default
        this is a final stop: the hosts serving this runtime dir are stopped too.

        The hosts write to npud's output (their stderr is npud's): with ``keep_drivers``
        it is still read, and only a final ``stop()`` closes it."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if keep_drivers:
            self.returncode = self.proc.returncode
            return self.returncode
        stop_driver_hosts(self.runtime_dir, timeout)
        if self._reader is not None:
            self._reader.join(min(5.0, timeout))
        self.returncode = self.proc.returncode
        self._cleanup()
        return self.returncode

    def _cleanup(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        if self._config_path is not None:
            try:
                os.unlink(self._config_path)
            except FileNotFoundError:
                pass
            self._config_path = None

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent's starting thread ends."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


def driver_hosts(runtime_dir: str | os.PathLike[str]) -> list[int]:
    """The pids of the driver hosts serving ``runtime_dir`` (``npu driver NAME
    --runtime-dir DIR``), whoever started them: npud's children, or orphans a stopped
    npud left behind. Processes whose command line cannot be read are skipped."""
    want = os.fsencode(str(runtime_dir))
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"npumanager" not in argv or b"driver" not in argv:
            continue
        at = argv.index(b"driver")
        if at > 0 and argv[at - 1] == b"npumanager" and any(
                a == b"--runtime-dir" and b == want for a, b in itertools.pairwise(argv)):
            pids.append(int(entry))
    return pids


def stop_driver_hosts(runtime_dir: str | os.PathLike[str], timeout: float = 10.0) -> int:
    """SIGTERM the driver hosts serving ``runtime_dir`` and wait for them to go (SIGKILL
    after ``timeout``); returns how many there were."""
    import time

    pids = driver_hosts(runtime_dir)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    left = pids
    while left:
        left = [p for p in left if process_running(p)]
        if not left:
            break
        if time.monotonic() > deadline:
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    return len(pids)


def process_running(pid: int) -> bool:
    """``pid`` runs (it is not gone, nor a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"
