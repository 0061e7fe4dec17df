"""Drivers run unprivileged: npud alone stays root.

Whatever an app makes a driver do, it does it as ``[manager] driver_user`` (``npu`` when
it exists, else ``nobody``): no supplementary groups, PR_SET_NO_NEW_PRIVS, not dumpable,
in an empty working directory of its own, with a private state dir (0700, its user's)
that npud made. ``drivers/`` and the driver's socket stay npud's (npud binds the socket and
hands it over), so the driver's user cannot replace a socket. Sharing a user with other
daemons (``nobody``) makes none of them the driver's admin or able to read its memory."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path
from typing import Any

from npumanager.errors import PermissionDenied
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.testing import procs
from npumanager.wire.client import SyncRpcClient
from tests.security.conftest import StartDaemon
from tests.security.harness import (
    ATTACKER,
    assert_device_served,
    driver_pid,
    needs_root,
)

pytestmark = needs_root


def expected_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("npu")
    except KeyError:
        return pwd.getpwnam("nobody")


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def proc_limits(pid: int) -> dict[str, tuple[str, str]]:
    """/proc/PID/limits: each limit's name to its (soft, hard)."""
    with open(f"/proc/{pid}/limits") as f:
        lines = f.read().splitlines()[1:]
    # Columns: the name (words), the soft and hard limits, and maybe a unit.
    return {ln[:26].strip(): (ln[26:47].strip(), ln[47:68].strip()) for ln in lines}


def test_the_driver_runs_unprivileged_in_an_empty_dir_with_no_new_privs(
        start_npud: StartDaemon, runtime_dir: Path, state_dir: Path) -> None:
    npud = start_npud(drivers=True)
    user = expected_user()
    pid = driver_pid(runtime_dir)
    st = proc_status(pid)
    assert st["Uid"].split() == [str(user.pw_uid)] * 4, st["Uid"]
    assert st["Gid"].split() == [str(user.pw_gid)] * 4, st["Gid"]
    assert st["Groups"] == "" and st["NoNewPrivs"] == "1", st
    assert os.stat(f"/proc/{pid}/environ").st_uid == 0, "dumpable: it would be its user's"
    assert proc_status(npud.pid)["Uid"].split()[0] == "0"
    # No SCHED_FIFO of its own (RLIMIT_RTPRIO 0 soft and hard: only npud, after its
    # checks, puts a host thread there), and a FIFO thread killed after 500 ms unblocked.
    limits = proc_limits(pid)
    assert limits["Max realtime priority"] == ("0", "0"), limits
    assert limits["Max realtime timeout"][1] == "500000", limits
    private = state_dir / "drivers" / "reference"
    cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    assert cwd == private / "cwd" and os.listdir(cwd) == []
    for path, owner, mode in ((cwd, user.pw_uid, 0o500), (private, user.pw_uid, 0o700),
                              (private.parent, 0, 0o711), (runtime_dir / "drivers", 0, 0o755)):
        s = os.lstat(path)
        assert (s.st_uid, stat.S_IMODE(s.st_mode)) == (owner, mode), path
    sock = os.lstat(driver_socket("reference", runtime_dir))
    assert stat.S_ISSOCK(sock.st_mode) and sock.st_uid == 0
    # The cache map lives in the private dir, the driver's own.
    assert (private / "cache").exists() is False or os.stat(private / "cache").st_uid \
        == user.pw_uid
    assert_device_served(runtime_dir)


def as_driver_user(runtime_dir: str, pid: int) -> dict[str, Any]:
    """What another process of the driver's own user can do to it."""
    out: dict[str, Any] = {}
    rpc = SyncRpcClient(str(driver_socket("reference", runtime_dir)), SERVICE)
    try:
        rpc.call("hal.set_scheduling_configs", pb.SchedulingConfigs())
        out["hal"] = "accepted"
    except PermissionDenied as exc:
        out["hal"] = f"PermissionDenied: {exc}"
    finally:
        rpc.close()
    for what in ("environ", "mem"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                f.read(16)
            out[what] = "read"
        except OSError as exc:
            out[what] = type(exc).__name__
    return out


def test_another_process_of_the_drivers_user_is_neither_admin_nor_able_to_read_it(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    user = expected_user()
    pid = driver_pid(runtime_dir)
    got = procs.run_as(user.pw_uid, user.pw_gid, as_driver_user, str(runtime_dir), pid)
    assert got["hal"].startswith("PermissionDenied: hal.set_scheduling_configs is for npud "
                                 "and admins only"), got
    assert got["environ"] == "PermissionError" and got["mem"] == "PermissionError", got
    assert_device_served(runtime_dir)


def look_into(path: str) -> str:
    try:
        os.listdir(path)
        return "listed"
    except PermissionError:
        return "PermissionError"


def test_other_users_cannot_look_into_the_drivers_state(
        start_npud: StartDaemon, runtime_dir: Path, state_dir: Path) -> None:
    start_npud(drivers=True)
    private = state_dir / "drivers" / "reference"
    assert procs.run_as(ATTACKER, None, look_into, str(private)) == "PermissionError"
    assert procs.run_as(ATTACKER, None, look_into, str(private.parent)) == "PermissionError"
    assert procs.run_as(ATTACKER, None, look_into, str(state_dir)) == "PermissionError"
    assert_device_served(runtime_dir)
