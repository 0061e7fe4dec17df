"""Real-time grants to a driver host started by hand (service/hand_ties.py, service/host_rt.py)
against a hostile host, under real uids. The test plays npud (root) with npud's code: it
connects to a stand-in host's socket as npud's supervisor does, ties it, and grants through
the same path as npud's ``hal.request_rt`` handler. A root host tied to its socket's
listener gets its thread at FIFO under every check npud's own hosts get; a listener of
another uid (an app's, the driver's user's), one that became another uid after it listened,
one that exited (its pid taken again, even by root), and a host whose RLIMIT_RTTIME is not
bounded get nothing. A non-admin uid cannot even serve npud's drivers dir, and npud keeps
serving."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.clock import MonotonicClock
from npumanager.hal import rt_sched as rt
from npumanager.service import hand_ties as ht
from npumanager.service.host_rt import HostRtGrants
from npumanager.testing import procs
from npumanager.wire.unix import peer_credentials
from tests.hal.test_rt_sched import needs_fifo
from tests.security.conftest import StartDaemon
from tests.security.harness import ATTACKER, assert_device_served, driver_pid, needs_root
from tests.security.test_host_rt_adopted import _spawn_at, _stop
from tests.security.test_host_rt_grants import DRIVER_USER

pytestmark = [needs_root, needs_fifo, pytest.mark.fifo]


def listener(path: str, bounded: bool, become: int | None, relisten: bool,
             fork_away: bool) -> None:
    """A stand-in host started by hand: RLIMIT_RTTIME bounded as `npu driver` bounds it
    (unless not ``bounded``), its socket bound and listened on at ``path`` as the uid it
    starts as; then, with ``become``, that uid, keeping the socket (``relisten``: listens
    again, which makes it the process the socket's credentials name). ``fork_away``: hands
    the socket to a child that becomes ATTACKER, announces the child's pid and exits.
    Announces its pid and a parked thread's id; parks until told to stop."""
    if bounded:
        assert rt.bound_own_rttime() == ""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o666)
    sock.listen(8)
    if fork_away:
        child = os.fork()
        if child == 0:  # (holds the listener: connections still reach "the host")
            try:
                os.setgroups([])
                os.setgid(ATTACKER)
                os.setuid(ATTACKER)
                time.sleep(60)
            finally:
                os._exit(0)
        procs.announce(("holder", child))
        return
    if become is not None:
        os.setgroups([])
        os.setgid(become)
        os.setuid(become)
        if relisten:
            sock.listen(8)
    with parked_thread() as tid:
        procs.announce(("tids", os.getpid(), tid))
        procs.receive(60)


@contextlib.contextmanager
def parked_thread() -> Iterator[int]:
    """A thread of this process blocked until the block ends (a FIFO policy on it costs
    no CPU); its id."""
    stop = threading.Event()
    tids: list[int] = []
    t = threading.Thread(target=lambda: (tids.append(threading.get_native_id()),
                                         stop.wait(60)))
    t.start()
    try:
        while not tids:
            time.sleep(0.01)
        yield tids[0]
    finally:
        stop.set()
        t.join(10)


@pytest.fixture
def sock_dir(state_dir: Path) -> Path:
    """A directory every uid may bind in (each test's own, under /tmp: pytest's tmp_path
    is not traversable by other uids), standing for npud's drivers dir: what a listener
    of another uid could do if it could bind there."""
    d = state_dir / "drivers"
    d.mkdir()
    os.chmod(state_dir, 0o755)
    os.chmod(d, 0o1777)
    return d


def _start(uid: int | None, path: Path, bounded: bool = True, become: int | None = None,
           relisten: bool = False) -> tuple[procs.Child, int]:
    child = procs.spawn_as(uid, uid, listener, str(path), bounded, become, relisten, False,
                           timeout=120)
    _, pid, tid = child.expect(lambda e: e[0] == "tids")
    assert pid == child.pid
    return child, tid


@contextlib.contextmanager
def _npud_connects(path: Path) -> Iterator[socket.socket]:
    """npud's end of a connection to the host's socket (supervisor: connect_async)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        yield s
    finally:
        s.close()


def _tie(path: Path) -> ht.HandTie | str:
    with _npud_connects(path) as s:
        return ht.tie(s, peer_credentials(s))


def _grant(tie: ht.HandTie | str, pid: int, tid: int) -> rt.RtSet:
    """What npud's hal.request_rt handler does for a thread of a host started by hand."""
    return HostRtGrants(MonotonicClock()).grant(ht.grantable(tie, pid), tid, 1, 1)


def _refused(tie: ht.HandTie | str, pid: int, tid: int, said: str) -> None:
    """npud's grant refused, saying ``said``; the thread left as it was."""
    no = _grant(tie, pid, tid)
    assert not no.ok and said in no.why, no.why
    assert not rt.sched_of(tid).fifo  # type: ignore[union-attr]


def test_a_root_host_by_hand_tied_to_its_listener_gets_its_thread_and_no_other(
        sock_dir: Path) -> None:
    path = sock_dir / "reference.sock"
    child, tid = _start(None, path)
    other, other_tid = _start(None, sock_dir / "other.sock")  # root too, not this host
    try:
        tie = _tie(path)
        assert isinstance(tie, ht.HandTie) and tie.pid == child.pid, tie
        assert tie.how == "SO_PEERPIDFD"  # (this kernel has it: 6.5 and later)
        got = _grant(tie, child.pid, tid)
        assert got.ok, got.why
        assert rt.sched_of(tid) == rt.ThreadSched(os.SCHED_FIFO, 1, True)
        # Every other check holds as for a host npud started: another process's thread
        # (another root process's, npud's own), another pid than the one tied.
        for t in (other_tid, os.getpid(), 1):
            no = _grant(tie, child.pid, t)
            assert not no.ok and "not a thread of host process" in no.why, (t, no)
        assert not rt.sched_of(other_tid).fifo  # type: ignore[union-attr]
        _refused(tie, other.pid, other_tid, "is not the one tied")
    finally:
        _stop(child)
        _stop(other)
    # The host gone: its tie grants nothing; once npud lets go, nothing either.
    no = _grant(tie, child.pid, tid)
    assert not no.ok and "has exited" in no.why, no.why
    ht.release(tie)
    assert tie.pidfd == -1 and "let go" in str(ht.grantable(tie, child.pid))


def test_a_listener_of_another_uid_is_refused(sock_dir: Path) -> None:
    # An app's process, and one of the driver's user (npud's own hosts run as it), each
    # listening where it could bind: the socket's credentials name them.
    for uid in (ATTACKER, DRIVER_USER):
        path = sock_dir / f"{uid}.sock"
        child, tid = _start(uid, path)
        try:
            no = _tie(path)
            assert no == f"its socket's listener (pid {child.pid}) runs as uid {uid}, not root"
            _refused(no, child.pid, tid, "not root")
        finally:
            _stop(child)
    # Root bound and listened, then became the app's uid: listening again makes the socket
    # name it; keeping the socket without that, the process it names is not root now.
    for relisten, said in ((True, f"runs as uid {ATTACKER}, not root"),
                           (False, "does not run as root")):
        path = sock_dir / f"became-{relisten}.sock"
        child, tid = _start(None, path, become=ATTACKER, relisten=relisten)
        try:
            no = _tie(path)
            assert isinstance(no, str) and said in no, no
            _refused(no, child.pid, tid, said)
        finally:
            _stop(child)


def test_a_root_host_that_became_another_uid_after_the_tie_gets_nothing(
        sock_dir: Path) -> None:
    """Checked again at each grant: the tied process must still be root."""
    path = sock_dir / "reference.sock"
    child = procs.spawn_as(None, None, _becomes_attacker_when_told, str(path), timeout=120)
    try:
        _, tid = child.expect(lambda e: e[0] == "tid")
        tie = _tie(path)
        assert isinstance(tie, ht.HandTie), tie
        child.send("become")
        child.expect(lambda e: e == "became")
        _refused(tie, child.pid, tid, "does not run as root")
    finally:
        _stop(child)
        ht.release(tie)


def _becomes_attacker_when_told(path: str) -> None:
    assert rt.bound_own_rttime() == ""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(8)
    with parked_thread() as tid:
        procs.announce(("tid", tid))
        assert procs.receive(60) == "become"
        os.setresgid(ATTACKER, ATTACKER, ATTACKER)  # (every thread: glibc's setxid)
        os.setresuid(ATTACKER, ATTACKER, ATTACKER)
        procs.announce("became")
        procs.receive(60)


def test_a_listener_that_exited_is_refused_even_with_its_pid_taken_again(
        sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root listened and exited, its socket kept by a child that became the app's uid
    (connections still reach it): the socket names the exited process. Its pid taken
    again, by root or by the app: SO_PEERPIDFD still names the process that exited. A
    kernel without SO_PEERPIDFD opens the pid, and ties it only if it runs as root."""
    path = sock_dir / "reference.sock"
    first = procs.spawn_as(None, None, listener, str(path), True, None, False, True,
                           timeout=120)
    _, holder = first.expect(lambda e: e[0] == "holder")
    pid = first.pid
    try:
        first.wait(30)  # (reaped: its pid is free)
        with _npud_connects(path) as s:
            peer = peer_credentials(s)
            assert (peer.pid, peer.uid) == (pid, 0)
            assert ht.tie(s, peer) == f"process {pid} has exited"
            for uid in (None, ATTACKER):  # root first: the strongest impostor
                again = _spawn_at(pid, uid=uid, fn=_parked)
                if again is None:
                    pytest.skip(f"could not get pid {pid} again (other processes took it)")
                impostor, (tid,) = again
                try:
                    no = ht.tie(s, peer)
                    assert no == f"process {pid} has exited", no
                    _refused(no, pid, tid, "has exited")
                    # A kernel older than 6.5 (no SO_PEERPIDFD: ENOPROTOOPT) opens the
                    # pid: the app's process is refused; a root one is tied, and gains
                    # nothing it could not take itself (service/hand_ties.py).
                    monkeypatch.setattr(ht, "SO_PEERPIDFD", 0x7FFF)
                    old = ht.tie(s, peer)
                    if uid == ATTACKER:
                        assert isinstance(old, str) and "does not run as root" in old, old
                        _refused(old, pid, tid, "does not run as root")
                    else:
                        assert isinstance(old, ht.HandTie) and old.how == "pidfd_open", old
                        ht.release(old)
                    monkeypatch.undo()
                finally:
                    _stop(impostor)
    finally:
        first.kill()
        with contextlib.suppress(OSError):
            os.kill(holder, 9)


def _parked() -> None:
    """A stand-in that stays the uid it starts as (root's: the strongest impostor)."""
    with parked_thread() as tid:
        procs.announce(("tids", [tid]))
        procs.receive(60)


def test_a_root_host_by_hand_without_the_rttime_bound_gets_nothing(sock_dir: Path) -> None:
    path = sock_dir / "reference.sock"
    child, tid = _start(None, path, bounded=False)
    try:
        tie = _tie(path)
        assert isinstance(tie, ht.HandTie), tie
        assert rt.rttime_limits(child.pid) == (None, None)
        _refused(tie, child.pid, tid, "RLIMIT_RTTIME hard limit is unlimited")
    finally:
        _stop(child)
        ht.release(tie)


def test_a_non_admin_cannot_serve_npuds_drivers_dir_and_npud_serves_on(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    """`npu driver` by hand as an app's uid, where no host serves yet (the socket path is
    free): npud's drivers dir is root's, so it is refused with the user to run it as; npud
    then starts its own host there and serves."""
    drivers = runtime_dir / "drivers"
    drivers.mkdir(mode=0o755)
    state = runtime_dir / "attacker-state"  # (its own: the host needs one it may write)
    state.mkdir()
    os.chown(state, ATTACKER, ATTACKER)
    cfg = runtime_dir / "npud.toml"
    cfg.write_text('[[driver]]\nname = "reference"\nplugin = "reference"\n')
    out = procs.run_as(ATTACKER, ATTACKER, _npu_driver_by_hand, str(runtime_dir), str(state),
                       str(cfg), timeout=120)
    assert out[0] == 1, out
    assert (f"driver reference: {drivers} belongs to uid 0 (npud's: the npud serving "
            f"{runtime_dir} runs as it), not to this user (uid {ATTACKER}): start `npu "
            "driver` as uid 0 (e.g. with sudo)") in out[1], out[1]
    assert not (drivers / "reference.sock").exists()
    start_npud(drivers=True)
    assert driver_pid(runtime_dir) > 0
    assert_device_served(runtime_dir)


def _npu_driver_by_hand(rt_dir: str, state: str, cfg: str) -> tuple[int, str]:
    import sys

    p = subprocess.run([sys.executable, "-m", "npumanager", "driver", "reference",
                        "--runtime-dir", rt_dir, "--state-dir", state, "--config", cfg,
                        "--protect-foreground", "off"], capture_output=True, text=True,
                       timeout=90)
    return p.returncode, p.stderr
