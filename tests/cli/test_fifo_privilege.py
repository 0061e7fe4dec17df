"""The protection's SCHED_FIFO keys where npud cannot serve them (service/rt_privilege.py):
`npu serve --check-config` and npud's start say what is set, what will happen and the fix.
The checks run in real processes that lack CAP_SYS_NICE: root with it dropped from the
bounding set (capsh), and a non-root uid."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npumanager.config import Config
from npumanager.service.rt_privilege import (
    CAP_SYS_NICE,
    DROP_IN,
    Privilege,
    fifo_probe,
    fifo_problems,
    has_cap,
    refusal_cause,
    rt_keys,
)

ROOT_NO_NICE = Privilege(cap_sys_nice=False, euid=0, rtprio=0)
PROTECTION = """\
[manager]
app_rt_priority = 2

[[driver]]
name = "reference"
plugin = "reference"
foreground_rt_priority = 1
background_host = true

[driver.background]
foreground_rt_priority = 3
"""
NPU = str(Path(sys.executable).with_name("npu"))
needs_capsh = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("capsh") is None
    or not has_cap(CAP_SYS_NICE), reason="needs root with CAP_SYS_NICE and capsh")


def config(where: Path, body: str = PROTECTION) -> Path:
    """The config file in ``where`` (a runtime dir under /tmp: other uids can read it)."""
    path = where / "npud.toml"
    path.write_text(body)
    os.chmod(path, 0o644)
    return path


def test_what_each_key_needs_and_says(tmp_path: Path) -> None:
    cfg = Config.load(config(tmp_path))  # (read as root)
    assert rt_keys(cfg) == (2, [
        ("[[driver]] 'reference' foreground_rt_priority = 1", 1),
        ("[[driver]] 'reference' [driver.background] foreground_rt_priority = 3", 3)])
    lines = fifo_problems(cfg, ROOT_NO_NICE)
    assert len(lines) == 3, lines
    assert lines[0].startswith("[manager] app_rt_priority = 2 is set, but this process lacks "
                               "CAP_SYS_NICE"), lines
    assert "refused (RealtimeUnavailable)" in lines[0]
    assert lines[1].startswith("[[driver]] 'reference' foreground_rt_priority = 1 is set")
    assert "burst thread" in lines[1] and "at normal priority" in lines[1]
    assert all(DROP_IN in ln and "CAP_SYS_NICE" in ln for ln in lines)
    # With the capability: nothing to say.
    assert fifo_problems(cfg, Privilege(True, 0, 0)) == []
    # Not root: the hosts are npud's own uid and inherit its RLIMIT_RTPRIO, which the
    # kernel checks on the target thread: enough for priorities up to it; an app's thread
    # is another uid's either way.
    mid = fifo_problems(cfg, Privilege(False, 1000, 2))
    assert [ln.split(" is set")[0] for ln in mid] == [
        "[manager] app_rt_priority = 2",
        "[[driver]] 'reference' [driver.background] foreground_rt_priority = 3"]
    assert "RLIMIT_RTPRIO 2 is below 3" in mid[1]
    # --no-drivers: no host threads to set.
    assert len(fifo_problems(cfg, ROOT_NO_NICE, use_drivers=False)) == 1
    # The keys off (the defaults): nothing.
    assert fifo_problems(Config.load(None), ROOT_NO_NICE) == []
    # The capability, but the kernel refuses FIFO all the same (seccomp, a cgroup without
    # a real-time budget): every key, with that cause and its fix.
    blocked = fifo_problems(cfg, Privilege(True, 0, 0, refused="sched_setscheduler: "
                                                                 "Operation not permitted"))
    assert len(blocked) == 3, blocked
    assert all("refuses SCHED_FIFO to this process although it has CAP_SYS_NICE" in ln
               and "RestrictRealtime=no" in ln for ln in blocked), blocked
    # Not root with a limit but refused: the hosts too.
    assert len(fifo_problems(cfg, Privilege(False, 1000, 5, refused="EPERM"))) == 3


def test_a_refusal_names_its_cause(tmp_path: Path) -> None:
    """What npud's refusals say (an app's RealtimeUnavailable, the hosts' warning) by the
    capability this process holds."""
    status = tmp_path / "status"
    status.write_text("CapEff:\t000001fffe7fffff\n")
    assert refusal_cause(str(status)).startswith("npud lacks CAP_SYS_NICE (under systemd: ")
    status.write_text("CapEff:\t000001ffffffffff\n")
    held = refusal_cause(str(status))
    assert "has CAP_SYS_NICE" in held and "RestrictRealtime=yes" in held and DROP_IN in held


def test_the_probe_takes_fifo_only_where_the_process_may() -> None:
    """fifo_probe in this process: '' with CAP_SYS_NICE (root here), and the thread it
    used is gone; the probe is also what Privilege reads."""
    import threading

    before = threading.active_count()
    why = fifo_probe()
    assert threading.active_count() == before
    if has_cap(CAP_SYS_NICE):
        assert why == "" and Privilege.of_this_process().refused == ""
    else:
        assert "not permitted" in why


def test_the_effective_capability_is_read_from_proc(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t000001fffe7fffff\n")
    assert not has_cap(CAP_SYS_NICE, str(status)) and has_cap(CAP_SYS_NICE - 1, str(status))
    status.write_text("Name:\tx\nCapEff:\t0000000000800000\n")
    assert has_cap(CAP_SYS_NICE, str(status))
    assert not has_cap(CAP_SYS_NICE, str(tmp_path / "missing"))


def check_config(cfg: Path, runtime_dir: Path, prefix: list[str], *extra: str
                 ) -> subprocess.CompletedProcess[str]:
    argv = [NPU, "serve", "--check-config", str(cfg), "--runtime-dir", str(runtime_dir / "rt"),
            *extra]
    if prefix[:1] == ["capsh"]:  # (capsh runs bash: the command goes in as -c)
        argv = [*prefix, "-c", "exec " + " ".join(argv)]
    else:
        argv = [*prefix, *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@needs_capsh
def test_check_config_as_root_without_cap_sys_nice_says_what_and_how(
        runtime_dir: Path) -> None:
    cfg = config(runtime_dir)
    dropped = check_config(cfg, runtime_dir, ["capsh", "--drop=cap_sys_nice", "--"])
    assert dropped.returncode == 0, dropped.stderr
    notes = [ln for ln in dropped.stdout.splitlines() if ln.startswith("note: ")]
    assert len(notes) == 3, dropped.stdout
    assert notes[0].startswith("note: [manager] app_rt_priority = 2 is set, but this process "
                               "lacks CAP_SYS_NICE"), notes
    assert "RealtimeUnavailable" in notes[0] and DROP_IN in notes[0]
    assert "normal priority" in notes[1] and "systemctl daemon-reload" in notes[1]
    # The same check with the capability: the systemd caveat only.
    held = check_config(cfg, runtime_dir, [])
    assert held.returncode == 0, held.stderr
    notes = [ln for ln in held.stdout.splitlines() if ln.startswith("note: ")]
    assert len(notes) == 1 and "this one has both" in notes[0] and DROP_IN in notes[0], notes


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv")
def test_check_config_as_another_uid_says_it_too(runtime_dir: Path) -> None:
    """A non-root uid (no capabilities, RLIMIT_RTPRIO 0 here): both kinds of key."""
    cfg = config(runtime_dir)
    run = check_config(cfg, runtime_dir, ["setpriv", "--reuid=50001", "--regid=50001",
                                          "--clear-groups"])
    assert run.returncode == 0, run.stdout + run.stderr
    notes = [ln for ln in run.stdout.splitlines() if ln.startswith("note: ")]
    assert [n.split(" is set")[0] for n in notes] == [
        "note: [manager] app_rt_priority = 2",
        "note: [[driver]] 'reference' foreground_rt_priority = 1",
        "note: [[driver]] 'reference' [driver.background] foreground_rt_priority = 3"], notes
    assert "RLIMIT_RTPRIO 0 is below 1" in notes[1], notes


def ask_realtime(rt: str) -> str:
    """As an app (a forked child of root's: FOREGROUND to npud): its own thread to FIFO."""
    from npumanager import NpuManager
    from npumanager.errors import NpuError

    with NpuManager(rt, client_name="fifo-app") as mgr:
        try:
            mgr.set_thread_realtime()
        except NpuError as exc:
            return f"{type(exc).__name__}: {exc}"
    return "granted"


def serve_and_ask(prefix: list[str], cfg: Path, runtime_dir: Path, state_dir: Path
                  ) -> tuple[str, str]:
    """`npu serve --no-drivers` under ``prefix`` until ready; an app's request for a FIFO
    thread; SIGTERM. (npud's log, the app's answer)"""
    from npumanager.testing import procs

    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    argv = [NPU, "serve", "--config", str(cfg), "--runtime-dir", str(runtime_dir),
            "--no-drivers"]
    if prefix[:1] == ["capsh"]:
        argv = [*prefix, "-c", "exec " + " ".join(argv)]
    else:
        argv = [*prefix, *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    lines: list[str] = []
    answer = ""
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "npud ready" in line:
                break
        assert any("npud ready" in ln for ln in lines), "".join(lines)
        answer = procs.run_as(None, None, ask_realtime, str(runtime_dir), timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        lines.append(out or "")
    return "".join(lines), answer


@needs_capsh
def test_npud_without_cap_sys_nice_logs_it_at_start(tmp_path: Path, runtime_dir: Path,
                                                    state_dir: Path) -> None:
    log, answer = serve_and_ask(["capsh", "--drop=cap_sys_nice", "--"], config(tmp_path),
                                runtime_dir, state_dir)
    assert "[manager] app_rt_priority = 2 is set, but this process lacks CAP_SYS_NICE" in log, log
    assert "RealtimeUnavailable" in log and DROP_IN in log, log
    # --no-drivers: no host threads, so no host key is named.
    assert "foreground_rt_priority = 1 is set" not in log, log
    # What the app is told: the kernel refused, npud lacks the capability, the fix.
    assert answer.startswith("RealtimeUnavailable: the kernel refused SCHED_FIFO"), answer
    assert "npud lacks CAP_SYS_NICE (under systemd: " in answer and DROP_IN in answer, answer

#: A seccomp filter (classic BPF) that refuses sched_setscheduler and sched_setattr with
#: EPERM, the effect of systemd's RestrictRealtime=yes on a SCHED_FIFO request, applied by a
#: wrapper that then execs its argv (x86_64 syscall numbers; the arch is checked).
SECCOMP_WRAPPER = """
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4  # (a pointer is 64 bits)
def ins(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)
prog = b"".join([
    ins(0x20, 0, 0, 4),             # ld arch
    ins(0x15, 1, 0, 0xC000003E),    # jeq x86_64: next, else allow
    ins(0x06, 0, 0, 0x7FFF0000),
    ins(0x20, 0, 0, 0),             # ld nr
    ins(0x15, 2, 0, 144),           # sched_setscheduler
    ins(0x15, 1, 0, 314),           # sched_setattr
    ins(0x06, 0, 0, 0x7FFF0000),    # allow
    ins(0x06, 0, 0, 0x00050001),    # errno EPERM
])
buf = ctypes.create_string_buffer(prog)
fprog = struct.pack("HxxxxxxQ", len(prog) // 8, ctypes.addressof(buf))
fbuf = ctypes.create_string_buffer(fprog)
assert libc.prctl(38, 1, 0, 0, 0) == 0                        # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.addressof(fbuf), 0, 0) == 0   # PR_SET_SECCOMP, FILTER
os.execv(sys.argv[1], sys.argv[1:])
"""


@pytest.mark.skipif(os.uname().machine != "x86_64" or os.geteuid() != 0
                    or not has_cap(CAP_SYS_NICE), reason="needs root with CAP_SYS_NICE, x86_64")
def test_check_config_with_the_capability_under_a_realtime_filter_names_it(
        runtime_dir: Path) -> None:
    """CAP_SYS_NICE held, but sched_setscheduler refused as RestrictRealtime=yes does: the
    check tries FIFO on a thread of its own, and says the kernel refuses it and why."""
    cfg = config(runtime_dir)
    run = check_config(cfg, runtime_dir, [sys.executable, "-c", SECCOMP_WRAPPER])
    assert run.returncode == 0, run.stdout + run.stderr
    notes = [ln for ln in run.stdout.splitlines() if ln.startswith("note: ")]
    assert len(notes) == 3, run.stdout
    for note in notes:
        assert "although it has CAP_SYS_NICE (sched_setscheduler: Operation not permitted" \
            in note, note
        assert "RestrictRealtime=no" in note and DROP_IN in note, note


@pytest.mark.skipif(os.uname().machine != "x86_64" or os.geteuid() != 0
                    or not has_cap(CAP_SYS_NICE), reason="needs root with CAP_SYS_NICE, x86_64")
def test_npud_with_the_capability_under_a_realtime_filter_says_what_refuses(
        tmp_path: Path, runtime_dir: Path, state_dir: Path) -> None:
    """npud as a unit with the capability and RestrictRealtime=yes would run it (an older
    copy of the shipped unit with CapabilityBoundingSet=CAP_SYS_NICE added alone): its start
    names the filter, and so does an app's refusal."""
    log, answer = serve_and_ask([sys.executable, "-c", SECCOMP_WRAPPER], config(tmp_path),
                                runtime_dir, state_dir)
    assert "[manager] app_rt_priority = 2 is set, but the kernel refuses SCHED_FIFO to this " \
        "process although it has CAP_SYS_NICE" in log, log
    assert answer.startswith("RealtimeUnavailable: the kernel refused SCHED_FIFO"), answer
    assert "npud has CAP_SYS_NICE, so a seccomp filter refuses it (systemd's " \
        "RestrictRealtime=yes" in answer, answer
