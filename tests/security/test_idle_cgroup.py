"""The host's cpu.idle cgroup (hal/idle_cgroup.py) under real uids: who may put which
thread into it, and what npud's host puts there.

npud (root) makes the group and hands its ``tasks`` and ``cgroup.procs`` to the driver's
user. The kernel lets that user move only threads of its own uid in; nobody else may write
the files at all; and nobody but root can take a thread out again (every other group is
root's). So an app can neither get its threads into the group (to slow itself? no: to
rank below nothing) nor out of it, nor move the driver's. These tests need root and a
writable cgroup-v1 cpu hierarchy with cpu.idle: elsewhere (CI, most containers) they skip
with the reason, and the host keeps its background threads at SCHED_IDLE only."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager.hal import idle_cgroup
from npumanager.testing import procs
from npumanager.testing.daemon import stop_driver_hosts
from npumanager.testing.fake_cgroup import real_cgroup_reason
from npumanager.testing.onnx_models import matmul_model
from npumanager.testing.thread_sched import children
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted
from tests.security.harness import ATTACKER, BYSTANDER, driver_pid, needs_root

_WHY_NOT = real_cgroup_reason() if os.geteuid() == 0 else "not root"
pytestmark = [needs_root, pytest.mark.skipif(_WHY_NOT is not None,
                                             reason=f"no cpu.idle cgroup: {_WHY_NOT}")]

DRIVER_UID = BYSTANDER  # an unprivileged uid standing in for the driver user


def _cpu_group_of(tid: int) -> str:
    for line in Path(f"/proc/{tid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return ""


def _remove(group: Path) -> None:
    for _ in range(200):  # forked children's threads leave when they are reaped
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


@pytest.fixture
def group() -> Iterator[Path]:
    g = idle_cgroup.create(f"sectest-{os.getpid()}", DRIVER_UID, DRIVER_UID)
    yield g
    _remove(g)


def _try_write(path: Path, text: str) -> str:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        return errno.errorcode[exc.errno or 0]
    try:
        os.write(fd, text.encode())
    except OSError as exc:
        return errno.errorcode[exc.errno or 0]
    finally:
        os.close(fd)
    return "ok"


def _as_foreign(group: Path) -> dict[str, str]:
    """As an app's uid: every way into the group, or to change it."""
    me = str(os.getpid())
    got = {name: _try_write(group / name, me) for name in ("tasks", "cgroup.procs", "cpu.idle",
                                                           "cpu.shares")}
    try:
        (group / "sub").mkdir()
        got["mkdir"] = "ok"
    except OSError as exc:
        got["mkdir"] = errno.errorcode[exc.errno or 0]
    got["in"] = _cpu_group_of(os.getpid())
    return got


def test_an_apps_uid_cannot_write_the_groups_files_or_make_groups_in_it(group: Path) -> None:
    got = procs.run_as(ATTACKER, None, _as_foreign, group, timeout=60)
    assert got["tasks"] == got["cgroup.procs"] == "EACCES", got
    assert got["cpu.idle"] == got["cpu.shares"] == "EACCES", got
    assert got["mkdir"] == "EACCES", got
    assert got["in"] != f"/{group.name}", got


def _as_driver(group: Path, foreign_pid: int, root_pid: int) -> dict[str, Any]:
    """As the driver's uid: its own thread in; an app's process, root's, and its own
    thread out again."""
    import threading

    tid = threading.get_native_id()
    got: dict[str, Any] = {"own": _try_write(group / "tasks", str(tid))}
    got["own_in"] = _cpu_group_of(tid)
    got["foreign"] = _try_write(group / "tasks", str(foreign_pid))
    got["foreign_procs"] = _try_write(group / "cgroup.procs", str(foreign_pid))
    got["root"] = _try_write(group / "tasks", str(root_pid))
    got["out"] = _try_write(group.parent / "tasks", str(tid))
    got["still_in"] = _cpu_group_of(tid)
    got["cpu.idle"] = _try_write(group / "cpu.idle", "0")
    return got


def _sleep_until_told() -> None:
    procs.announce("up")
    procs.receive(timeout=120)


def test_the_driver_uid_moves_only_its_own_threads_and_none_out(group: Path) -> None:
    app = procs.spawn_as(ATTACKER, None, _sleep_until_told, timeout=120)
    try:
        app.expect("up", 60)
        got = procs.run_as(DRIVER_UID, None, _as_driver, group, app.pid, os.getpid(),
                           timeout=60)
        app_group = _cpu_group_of(app.pid)
        app.send("stop")
        app.wait(60)
    finally:
        app.kill()
    where = f"/{group.name}"
    assert got["own"] == "ok" and got["own_in"] == where, got
    # The kernel checks the writer's uid against the thread's: an app's, root's: refused.
    assert got["foreign"] == got["foreign_procs"] == got["root"] == "EACCES", got
    assert app_group != where and _cpu_group_of(os.getpid()) != where
    # Out again only through root's tasks file: refused; it stays idle.
    assert got["out"] == "EACCES" and got["still_in"] == where, got
    assert got["cpu.idle"] == "EACCES", got
    assert (group / "cpu.idle").read_text().strip() == "1"


def _background_app(rt: str) -> dict[str, Any]:
    """A background app (an unknown uid): prepare a model, run it a few times."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(matmul_model(dim=64, depth=2), grant=grant)
        for _ in range(5):
            model.execute({"x": np.ones((16, 64), np.float32)})
        tids = [int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")]
        procs.announce("ran")
        procs.receive(timeout=120)
        return {"tids": tids}


def _comm(tid: int) -> str:
    try:
        return Path(f"/proc/{tid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.alone  # (its background app runs in the idle group: last to get a CPU)
def test_npuds_host_puts_its_background_threads_in_the_group_and_nothing_else(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(drivers=True, driver=[{"name": "reference", "plugin": "reference",
                                             "background_sched": "idle",
                                             "background_cgroup": "auto"}])
    root = idle_cgroup.v1_cpu_root(Path("/proc/self/mounts").read_text())
    assert root is not None
    group = root / idle_cgroup.group_name("reference", npud.pid)
    assert (group / "cpu.idle").read_text().strip() == "1"
    host = driver_pid(runtime_dir)
    host_uid = os.stat(f"/proc/{host}").st_uid
    assert host_uid != 0
    for name in idle_cgroup.HANDED_OVER:
        st = os.stat(group / name)
        assert (st.st_uid, st.st_mode & 0o777) == (host_uid, 0o644), name
    st = os.stat(group)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o755)  # only root makes groups in it
    app = procs.spawn_as(ATTACKER, None, _background_app, str(runtime_dir), timeout=180)
    try:
        app.expect("ran", 150)
        members = [int(t) for t in (group / "tasks").read_text().split()]
        host_threads = {int(t) for t in os.listdir(f"/proc/{host}/task")}
        child_threads = {int(t) for c in children(host)
                         for t in os.listdir(f"/proc/{c}/task")}
        app.send("done")
        got = app.wait(60)
    finally:
        app.kill()
    assert not set(members) & set(got["tids"])  # never an app's
    assert members and set(members) <= host_threads | child_threads, members
    in_host = [t for t in members if t in host_threads]
    # Of the host, only its lowered background threads (steps, loads).
    assert in_host and all(_comm(t).startswith("npu-bg") and not _comm(t).startswith("npu-bgb")
                           for t in in_host), [_comm(t) for t in in_host]
    assert host not in members  # its main thread (the event loop) stays out
    # npud's SIGTERM leaves its host running (adopted by the next npud, in its group);
    # once the host is gone, the next npud to make a group removes the empty one.
    npud.stop()
    stop_driver_hosts(runtime_dir, timeout=30)
    assert group.exists()
    for _ in range(200):
        idle_cgroup.remove_stale(root)
        if not group.exists():
            break
        time.sleep(0.05)
    assert not group.exists()
