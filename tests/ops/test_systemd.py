"""systemd: the notify protocol on a real datagram socket (path and abstract), `npu serve`
under NOTIFY_SOCKET, journald-style logs, and the unit file through systemd-analyze."""

from __future__ import annotations

import io
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.service.logs import make_formatter, setup_logging, under_journald
from npumanager.service.notify import Notifier, socket_address
from npumanager.testing.daemon import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["path", "abstract"])
def listener(request: pytest.FixtureRequest) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket as systemd's: (socket, the NOTIFY_SOCKET value naming it)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    d = tempfile.mkdtemp(prefix="npu-notify-", dir="/tmp")
    if request.param == "path":
        value = f"{d}/notify"
        s.bind(value)
    else:
        value = f"@npu-test-{uuid.uuid4().hex}"
        s.bind("\0" + value[1:])
    s.settimeout(30)
    try:
        yield s, value
    finally:
        s.close()
        shutil.rmtree(d, ignore_errors=True)


def fields(s: socket.socket) -> dict[str, str]:
    msg = s.recv(4096).decode()
    return dict(line.split("=", 1) for line in msg.split("\n"))


def test_address_forms() -> None:
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@abc") == "\0abc"
    assert socket_address("") is None and socket_address("vsock:2:1") is None


def test_notifier_sends_datagrams(listener: tuple[socket.socket, str]) -> None:
    s, value = listener
    env = {"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "4000000"}
    n = Notifier(env)
    assert n.enabled and n.watchdog_s == 4.0
    assert "NOTIFY_SOCKET" not in env  # children (driver hosts) do not inherit it
    assert n.ready("serving x\nand more")
    got = fields(s)
    assert got["READY"] == "1" and got["STATUS"] == "serving x and more"
    assert got["MAINPID"] == str(os.getpid())
    assert n.status("2 loaded") and fields(s) == {"STATUS": "2 loaded"}
    assert n.watchdog() and fields(s) == {"WATCHDOG": "1"}
    assert n.stopping("bye") and fields(s) == {"STOPPING": "1", "STATUS": "bye"}
    n.close()


def test_no_notify_socket_is_a_no_op() -> None:
    n = Notifier({})
    assert not n.enabled and not n.ready("x") and not n.stopping()


def test_notify_to_a_vanished_socket_does_not_raise() -> None:
    n = Notifier({"NOTIFY_SOCKET": "/tmp/npu-no-such-notify-socket"})
    try:
        assert n.enabled and n.ready("x") is False
    finally:
        n.close()


@pytest.mark.slow
def test_serve_tells_systemd(listener: tuple[socket.socket, str], runtime_dir: Path) -> None:
    s, value = listener
    env = dict(os.environ, NOTIFY_SOCKET=value)
    npud = DaemonProcess(runtime_dir, env=env).start()
    try:
        got = fields(s)
        while "READY" not in got:  # STATUS lines may come first
            got = fields(s)
        assert got["MAINPID"] == str(npud.pid)
        assert f"serving {runtime_dir}/npu.sock" in got["STATUS"]
        # READY=1 means clients can connect now.
        from npumanager import NpuManager

        with NpuManager(runtime_dir) as mgr:
            assert mgr.dump()["daemon"]["pid"] == npud.pid
    finally:
        assert npud.stop() == 0
    got = fields(s)
    while "STOPPING" not in got:
        got = fields(s)
    assert "shutting down (SIGTERM)" in got["STATUS"]


def _record(level: int, msg: str = "hello", **extra: object) -> logging.LogRecord:
    r = logging.LogRecord("npumanager.npud", level, __file__, 1, msg, None, None)
    r.__dict__.update(extra)
    return r


def test_journald_lines_carry_priorities_and_no_timestamp() -> None:
    f = make_formatter("text", journal=True)
    assert f.format(_record(logging.INFO)) == "<6>info    npumanager.npud: hello"
    assert f.format(_record(logging.WARNING, driver="x")).startswith("<4>warning")
    assert f.format(_record(logging.ERROR)).startswith("<3>")
    assert f.format(_record(logging.DEBUG)).startswith("<7>")
    try:
        raise ValueError("boom")
    except ValueError:
        r = _record(logging.ERROR)
        r.exc_info = sys.exc_info()
    lines = f.format(r).split("\n")
    assert len(lines) > 2 and all(line.startswith("<3>") for line in lines)
    j = make_formatter("json", journal=True, tag="driver[reference]")
    text = j.format(_record(logging.INFO))
    assert text.startswith("<6>{") and '"ts"' not in text and '"driver[reference]"' in text
    # Outside journald: a timestamp, no priority prefix.
    plain = make_formatter("text", tag="driver[reference]").format(_record(logging.INFO))
    assert plain[0].isdigit() and "info    driver[reference] npumanager.npud: hello" in plain


def test_journal_stream_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # setup_logging replaces the root handlers: put pytest's back afterwards (a handler left
    # on this test's captured stderr made a later test's log line a "Logging error").
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    with open(tmp_path / "log", "w") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert under_journald(stream)
        setup_logging("text", "info", stream)
        logging.getLogger("npumanager.test").info("to the journal")
        stream.flush()
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")
        assert not under_journald(stream)
    assert (tmp_path / "log").read_text() == "<6>info    npumanager.test: to the journal\n"
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not under_journald(io.StringIO())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_unit_file_verifies(tmp_path: Path) -> None:
    unit = (ROOT / "packaging/systemd/npud.service").read_text()
    assert "Type=notify" in unit and "RuntimeDirectory=npu" in unit
    assert "StateDirectory=npu" in unit
    for directive in ("ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                      "NoNewPrivileges=yes", "CapabilityBoundingSet="):
        assert f"\n{directive}" in unit
    npu = Path(sys.executable).with_name("npu")
    (tmp_path / "npud.service").write_text(unit.replace("/usr/local/bin/npu", str(npu)))
    proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "npud.service")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "LimitNICE" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_unit_gives_the_hosts_the_nice_limit_for_the_compile_bound(tmp_path: Path) -> None:
    """LimitNICE=+0: RLIMIT_NICE 20, what lets a driver host raise its starved SCHED_IDLE
    compile child to nice 0 (drivers/compile_starve.py) where root lacks CAP_SYS_RESOURCE.
    systemd parses it without a warning, and would warn (ignoring it) on a value it cannot
    parse: the check above would see that."""
    unit = (ROOT / "packaging/systemd/npud.service").read_text()
    limits = [ln for ln in unit.splitlines() if ln.startswith("LimitNICE=")]
    assert limits == ["LimitNICE=+0"], limits
    npu = Path(sys.executable).with_name("npu")
    bad = unit.replace("/usr/local/bin/npu", str(npu)).replace("LimitNICE=+0", "LimitNICE=+99")
    (tmp_path / "npud.service").write_text(bad)
    proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "npud.service")],
                          capture_output=True, text=True, timeout=60)
    assert "Failed to parse resource value" in proc.stderr and "+99" in proc.stderr, (
        proc.stdout + proc.stderr)


NICE, RT = "CapabilityBoundingSet=~CAP_SYS_(NICE|RESOURCE)", "RestrictRealtime="


def _report(unit_path: Path) -> dict[str, bool]:
    """`systemd-analyze security --offline=yes` of a unit: each check's name to whether the
    unit takes that away (its drop-ins beside it included)."""
    proc = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit_path)],
                          capture_output=True, text=True, timeout=60)
    rows = {}
    for ln in proc.stdout.splitlines():
        parts = ln.split()
        if len(parts) > 1 and parts[0] in ("✓", "✗"):
            rows[parts[1]] = parts[0] == "✓"
    assert rows, proc.stdout + proc.stderr
    return rows


def _verify(unit_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", str(unit_path)],
                          capture_output=True, text=True, timeout=60)


def _others(rows: dict[str, bool]) -> dict[str, bool]:
    return {k: v for k, v in rows.items() if k not in (NICE, RT)}


def _beside(unit_path: Path, name: str, text: str) -> dict[str, bool]:
    """Drop-in ``name`` beside the unit, which systemd reads without a complaint: the
    unit's security report with it."""
    (unit_path.parent / "npud.service.d").mkdir(exist_ok=True)
    (unit_path.parent / "npud.service.d" / name).write_text(text)
    proc = _verify(unit_path)
    assert proc.returncode == 0 and name.split(".")[0] not in proc.stderr, proc.stderr
    return _report(unit_path)


def _bad_value_named(unit_path: Path, name: str, text: str, value: str) -> None:
    """systemd reads drop-in ``name``: verify names a value in it that it cannot parse."""
    (unit_path.parent / "npud.service.d" / name).write_text(
        text.replace(f"RestrictRealtime={value}", "RestrictRealtime=maybe"))
    proc = _verify(unit_path)
    assert name in proc.stderr and "maybe" in proc.stderr, proc.stderr


def _drop_in(name: str) -> str:
    return (ROOT / "packaging/systemd/npud.service.d" / name).read_text()


def _directives(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_unit_keeps_realtime_for_the_protection_and_no_realtime_takes_it_away(
        tmp_path: Path) -> None:
    """The shipped unit leaves npud CAP_SYS_NICE and real-time scheduling (protect_foreground
    = "auto", the default, resolves on under it); the no-realtime.conf drop-in beside it
    (systemd reads it: verify names a bad value in it) takes exactly those two away."""
    unit = (ROOT / "packaging/systemd/npud.service").read_text()
    assert "\nRestrictRealtime=no\n" in unit
    # ... which only npud, with the capability, can use: no process of the unit enters
    # SCHED_FIFO by itself (RLIMIT_RTPRIO 0; verify would name a value it cannot parse).
    assert "\nLimitRTPRIO=0\n" in unit
    bounding = [ln for ln in unit.splitlines() if ln.startswith("CapabilityBoundingSet=")]
    assert bounding == ["CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_KILL CAP_CHOWN "
                        "CAP_FOWNER CAP_SYS_NICE"], bounding
    drop_in = _drop_in("no-realtime.conf")
    assert _directives(drop_in) == ["[Service]", "CapabilityBoundingSet=~CAP_SYS_NICE",
                                    "RestrictRealtime=yes"], drop_in
    npu = Path(sys.executable).with_name("npu")
    (tmp_path / "npud.service").write_text(unit.replace("/usr/local/bin/npu", str(npu)))
    shipped = _report(tmp_path / "npud.service")
    assert (shipped[NICE], shipped[RT]) == (False, False)
    hardened = _beside(tmp_path / "npud.service", "no-realtime.conf", drop_in)
    assert (hardened[NICE], hardened[RT]) == (True, True)
    assert _others(hardened) == _others(shipped)
    _bad_value_named(tmp_path / "npud.service", "no-realtime.conf", drop_in, "yes")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_protection_drop_in_gives_an_older_unit_realtime_and_nothing_else(
        tmp_path: Path) -> None:
    """protect-foreground.conf (README "Running npud under systemd"), beside a copy of the
    unit from before it kept CAP_SYS_NICE and real-time scheduling: the offline security
    report shows both given back, the rest unchanged; beside the shipped unit it changes
    nothing. systemd reads it: verify names a bad value in it."""
    unit = (ROOT / "packaging/systemd/npud.service").read_text()
    drop_in = _drop_in("protect-foreground.conf")
    assert _directives(drop_in) == ["[Service]", "CapabilityBoundingSet=CAP_SYS_NICE",
                                    "RestrictRealtime=no"], drop_in
    npu = Path(sys.executable).with_name("npu")
    unit = unit.replace("/usr/local/bin/npu", str(npu))
    older = unit.replace(" CAP_SYS_NICE\n", "\n").replace("RestrictRealtime=no",
                                                           "RestrictRealtime=yes")
    assert older != unit
    for text, before in ((older, (True, True)), (unit, (False, False))):
        (tmp_path / "npud.service").write_text(text)
        shutil.rmtree(tmp_path / "npud.service.d", ignore_errors=True)
        without = _report(tmp_path / "npud.service")
        assert (without[NICE], without[RT]) == before
        with_it = _beside(tmp_path / "npud.service", "protect-foreground.conf", drop_in)
        assert (with_it[NICE], with_it[RT]) == (False, False)
        assert _others(with_it) == _others(without)
    _bad_value_named(tmp_path / "npud.service", "protect-foreground.conf", drop_in, "no")
